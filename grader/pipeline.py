"""grade(items, backend) -> records, chunk by chunk; and the rescore path, which needs no model."""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from grader.backends import Backend, Completion, Message
from grader.config import SamplingConfig, TransformersConfig
from grader.dataset import DatasetError, Item, read_items
from grader.records import Record, failed_record, judged_record, missing_context_record
from grader.results import ResultsWriter, read_records, summarize, summary_path, write_summary
from grader.status import Status
from grader.templates import Prompt, RenderError, load_prompt, render_messages
from grader.verdict import max_answer_chars, verdict_schema


@dataclass
class Job:
    """A row ready for the judge: its item and its rendered conversation (None: not sent)."""

    item: Item
    messages: list[Message] | None


def prepare_jobs(
    path: str, items: Sequence[Item], prompt: Prompt, *, checklist: bool
) -> list[Job]:
    """Render every row up front, so a template that does not fit the data fails before any model work."""
    jobs = []
    for item in items:
        if item.missing:
            jobs.append(Job(item, None))
            continue
        try:
            jobs.append(Job(item, render_messages(prompt, item.fields, checklist=checklist)))
        except RenderError as exc:
            raise DatasetError(path, item.line, str(exc)) from None
    return jobs


def _completion_record(item_id: Any, completion: Completion) -> Record:
    usage = {"prompt_tokens": completion.prompt_tokens, "output_tokens": completion.output_tokens}
    if completion.finish_reason == "error":
        return failed_record(
            item_id,
            Status.ENGINE_ERROR,
            completion.error or "the engine failed this row",
            raw_output=completion.text or None,
            finish_reason=completion.finish_reason,
            usage=usage,
        )
    return judged_record(item_id, completion.text, completion.finish_reason, usage=usage)


def grade_jobs(jobs: Sequence[Job], backend: Backend, chunk_size: int) -> Iterator[list[Record]]:
    """Grade rows in chunks of ``chunk_size``; yields each chunk's records in input order.

    An exception from the backend marks that chunk's rows ``engine_error`` and the run goes on.
    """
    for start in range(0, len(jobs), chunk_size):
        chunk = jobs[start : start + chunk_size]
        records: list[Record | None] = [None] * len(chunk)
        sent = []
        for position, job in enumerate(chunk):
            if job.messages is None:
                records[position] = missing_context_record(job.item.id, job.item.missing)
            else:
                sent.append(position)
        if sent:
            try:
                completions = backend.generate([chunk[p].messages for p in sent])  # type: ignore[misc]
                if len(completions) != len(sent):
                    raise RuntimeError(
                        f"backend returned {len(completions)} completions for {len(sent)} prompts"
                    )
            except Exception as exc:  # one failing chunk must not cost the run
                error = f"{type(exc).__name__}: {exc}"
                for p in sent:
                    records[p] = failed_record(chunk[p].item.id, Status.ENGINE_ERROR, error)
            else:
                for p, completion in zip(sent, completions):
                    records[p] = _completion_record(chunk[p].item.id, completion)
        yield records  # type: ignore[misc]


@dataclass
class GradeRequest:
    """Everything ``grader grade`` was asked to do."""

    data: str
    output: Path
    model: str
    backend: str = "transformers"
    prompt: str = "seed"
    mapping: dict[str, str] = field(default_factory=dict)
    id_column: str | None = None
    checklist: bool = True
    limit: int | None = None
    chunk_size: int | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    transformers: TransformersConfig = field(default_factory=TransformersConfig)


def _versions() -> dict[str, str | None]:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in ("grader", "torch", "transformers", "xgrammar", "vllm", "pydantic", "jinja2"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _sha256_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _progress(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="row", desc="grading", file=sys.stderr, dynamic_ncols=True)


def run_grade(
    request: GradeRequest, *, backend_factory: Callable[..., Backend] | None = None
) -> dict[str, Any]:
    """Read, render, grade and write; returns the summary (also written beside the results).

    ``backend_factory`` replaces :func:`grader.backends.load_backend` (tests pass a fake).
    """
    started = _now()
    prompt = load_prompt(request.prompt)
    items = read_items(request.data, mapping=request.mapping, id_column=request.id_column)
    if request.limit is not None:
        items = items[: request.limit]
    jobs = prepare_jobs(request.data, items, prompt, checklist=request.checklist)

    schema = verdict_schema(request.checklist)
    max_tokens = request.sampling.max_tokens or max_answer_chars(request.checklist)
    if backend_factory is None:
        from grader.backends import load_backend as backend_factory
    options: dict[str, Any] = {"schema": schema, "sampling": request.sampling, "max_tokens": max_tokens}
    if request.backend == "transformers":
        options["config"] = request.transformers
    backend = backend_factory(request.backend, model=request.model, **options)
    chunk_size = request.chunk_size or backend.chunk_size

    writer = ResultsWriter(request.output)
    records: list[Record] = []
    try:
        with _progress(len(jobs)) as bar:
            for chunk in grade_jobs(jobs, backend, chunk_size):
                writer.write(chunk)
                records.extend(chunk)
                bar.update(len(chunk))
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    run = {
        "started": started,
        "finished": _now(),
        "data": request.data,
        "results": str(request.output),
        "prompt": {"name": prompt.name, "path": str(prompt.path), "sha256": prompt.sha256},
        "schema_sha256": _sha256_json(schema),
        "checklist": request.checklist,
        "model": request.model,
        "sampling": request.sampling.model_dump() | {"max_tokens": max_tokens},
        "engine": backend.describe(),
        "versions": _versions(),
    }
    summary = summarize(records, run=run)
    write_summary(summary_path(request.output), summary)
    return summary


def rescore(source: str | Path, output: Path) -> dict[str, Any]:
    """Re-parse each record's ``raw_output`` and recompute its score; no model is loaded.

    Records without ``raw_output`` (missing context, engine errors) keep their status. Fields
    other than the recomputed ones (usage, extra columns) are carried over.
    """
    rescored = []
    for _, record in read_records(source):
        if record.get("raw_output") is None:
            rescored.append(record)
            continue
        fresh = judged_record(record["id"], record["raw_output"], record.get("finish_reason", "stop"))
        rescored.append({**record, **fresh})
    writer = ResultsWriter(output)
    try:
        writer.write(rescored)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    summary = summarize(rescored, run={"rescored_from": str(source), "finished": _now()})
    write_summary(summary_path(output), summary)
    return summary
