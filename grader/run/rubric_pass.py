"""The rubric format's first pass: one rubric per distinct (input, reference), before any row
is checked (README, "Rubrics"; :mod:`grader.judge.rubric`).

A reference's rubric comes, in this order of precedence, from the row's own ``facts`` /
``conclusions`` / ``terms`` columns, from ``--rubric FILE``, from the rubric file an earlier run
wrote beside the results (same model and rubric prompt), or else from the judge. Everything is
read and checked before the model loads; only references without a rubric are sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grader.io.dataset import Dataset, DatasetError, Item
from grader.io.rubric_file import LISTS, read_rubric_file, rubric_key, rubric_path, write_rubric_file
from grader.judge.judges import SeedJudge
from grader.judge.prompts import RenderError, render_messages
from grader.judge.rubric import RUBRIC_PASS, draft_schema, make_rubric, parse_draft
from grader.run.executor import Executor
from grader.run.request import GradeRequest
from grader.run.rows import Job
from grader.status import Status


def _columns(item: Item, path: str) -> dict[str, list[str]] | None:
    """The row's own rubric columns (lists of strings, or such a list as JSON text: CSV), or
    None when it has none."""
    found: dict[str, list[str]] = {}
    for name in LISTS:
        value = item.fields.get(name)
        if value is None:
            continue
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                value = None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DatasetError(path, item.line, f"{name} must be a list of strings (a rubric column)")
        found[name] = value
    return found or None


def prepare_rubrics(
    request: GradeRequest,
    dataset: Dataset,
    judge: SeedJudge,
    executor: Executor,
    start_engine: Callable[[], None],
    *,
    output: Path | None = None,
) -> dict[str, Any]:
    """Fill ``judge.rubrics`` for every row's reference, drafting the missing ones.

    Args:
        start_engine: loads the executor's backend (called only when a rubric is drafted).
        output: where the rubrics go [default: beside the results; none with --rubric].

    Returns what the run manifest says of the rubrics.
    """
    assert judge.rubric_prompt is not None
    given = read_rubric_file(request.rubric) if request.rubric else None
    target = output or (None if given is not None else rubric_path(request.output))
    earlier: dict[str, dict[str, Any]] = {}
    if target is not None and target.exists() and not request.overwrite:
        earlier = read_rubric_file(target)
    model, prompt_sha = str(request.model), judge.rubric_prompt.sha256
    lines: dict[str, dict[str, Any]] = {}
    drafts: dict[str, Item] = {}
    sources = dict.fromkeys(("data", "file", "resumed", "model"), 0)
    for item in dataset:
        if judge.missing(item) or item.invalid:
            continue
        input_text, reference = item.fields.get("input"), str(item.fields["reference"])
        key = rubric_key(input_text, reference)
        if key in lines or key in drafts:
            continue
        about = {"key": key, "input": input_text, "reference": reference}
        columns = _columns(item, dataset.name)
        if columns is not None:
            lines[key] = about | make_rubric(key, columns, reference, "data").as_dict()
            sources["data"] += 1
        elif given is not None:
            if key not in given:
                raise DatasetError(
                    str(request.rubric), None,
                    f"no rubric for the reference of {dataset.name}:{item.line} (key {key}): add "
                    "it, or write the file with `grader rubric`")
            lines[key] = given[key] | make_rubric(key, given[key], reference, "file").as_dict()
            sources["file"] += 1
        elif key in earlier and (earlier[key].get("source") != "model" or (
                earlier[key].get("model") == model and earlier[key].get("prompt_sha256") == prompt_sha)):
            lines[key] = earlier[key] | make_rubric(
                key, earlier[key], reference, earlier[key].get("source", "model")).as_dict()
            sources["resumed"] += 1
        else:
            drafts[key] = item
    output_tokens = 0
    if drafts:
        jobs = []
        for index, (key, item) in enumerate(drafts.items()):
            fields = {"input": item.fields.get("input") or "",
                      "reference": str(item.fields["reference"]), RUBRIC_PASS: True}
            try:
                messages = render_messages(judge.rubric_prompt, fields, checklist=False)
            except RenderError as exc:
                raise DatasetError(dataset.name, item.line, str(exc)) from None
            jobs.append((Job(Item(key, index, item.line, fields), messages, draft_schema()), key))
        start_engine()
        for graded in executor.grade([jobs]):
            for index, record in graded:
                key, item = jobs[index][1], jobs[index][0].item
                output_tokens += (record.get("usage") or {}).get("output_tokens") or 0
                if record["status"] != Status.OK:
                    judge.rubrics[key] = (Status(record["status"]), record.get("error") or "failed")
                    continue
                parsed = parse_draft(record["raw_output"], record["finish_reason"])
                if isinstance(parsed, tuple):
                    judge.rubrics[key] = parsed
                    continue
                reference = item.fields["reference"]
                lines[key] = ({"key": key, "input": drafts[key].fields.get("input"),
                               "reference": reference}
                              | make_rubric(key, parsed, reference, "model").as_dict()
                              | {"model": model, "prompt_sha256": prompt_sha})
                sources["model"] += 1
    for key, line in lines.items():
        judge.rubrics[key] = {k: line[k] for k in (
            "key", "facts", "conclusions", "terms", "ungrounded", "dropped", "source")}
    if target is not None:
        # the lines of this data's references, earlier ones this data no longer has kept too
        write_rubric_file(target, [*lines.values(), *(v for k, v in earlier.items() if k not in lines)])
    return {
        "path": str(target or request.rubric),
        "references": len(lines) + sum(1 for k in drafts if k not in lines),
        "written_by_judge": sources["model"],
        "from_data": sources["data"],
        "from_file": sources["file"],
        "resumed": sources["resumed"],
        "failed": sum(1 for k in drafts if k not in lines),
        "ungrounded_items": sum(len(line.get("ungrounded") or []) for line in lines.values()),
        "output_tokens": output_tokens,
    }


def preview_jobs(path: str, items: list[Item], judge: SeedJudge) -> list[Job]:
    """``grader render`` in the rubric format: the check prompt of a row whose data has its
    rubric columns, else the first prompt its reference would see, the rubric pass's."""
    from grader.run.rows import prepare_jobs

    assert judge.rubric_prompt is not None
    jobs = []
    for item in items:
        columns = None if judge.missing(item) or item.invalid else _columns(item, path)
        if judge.missing(item) or item.invalid or columns is not None:
            if columns is not None:
                key = rubric_key(item.fields.get("input"), item.fields["reference"])
                judge.rubrics[key] = make_rubric(key, columns, str(item.fields["reference"]),
                                                 "data").as_dict()
            jobs += prepare_jobs(path, [item], judge)
            continue
        fields = {"input": item.fields.get("input") or "", "reference": str(item.fields["reference"])}
        try:
            jobs.append(Job(item, render_messages(judge.rubric_prompt, fields, checklist=False)))
        except RenderError as exc:
            raise DatasetError(path, item.line, str(exc)) from None
    return jobs


def run_rubric(request: GradeRequest, output: Path, executor: Executor | None = None, *,
               backend_factory: Callable[..., Any] | None = None) -> dict[str, Any]:
    """``grader rubric``: write the rubric file of ``request.data`` to ``output``."""
    import contextlib

    from grader.run.executor import LocalExecutor
    from grader.run.request import RunPlan, judge_for

    judge = judge_for(request)
    if not isinstance(judge, SeedJudge) or judge.answer_format != "rubric":
        raise ValueError("a rubric is written for the seed judge's rubric format")
    executor = executor or LocalExecutor(backend_factory)
    with contextlib.ExitStack() as opened:
        dataset = opened.enter_context(Dataset(request.data, mapping=request.mapping,
                                               id_column=request.id_column, limit=request.limit))
        opened.callback(executor.close)
        executor.open()
        backend_name = request.backend
        if backend_name == "auto":
            backend_name, _ = executor.choose_backend("auto")
        plan = RunPlan(request, backend_name, judge)

        def start() -> None:
            executor.start(plan)

        return prepare_rubrics(request, dataset, judge, executor, start, output=output)
