"""The rubric format's first pass: one rubric per distinct (input, reference), before any row
is checked (docs/formats.md, "The rubric format"; :mod:`grader.judge.rubric`).

A reference's rubric comes, in this order of precedence, from the row's own ``facts`` /
``conclusions`` / ``terms`` columns, from ``--rubric FILE``, from the rubric file an earlier run
wrote beside the results (same model and rubric prompt), or else from the judge. Everything is
read and checked before the model loads; only references without a rubric are sent.

The stage (:class:`RubricPass`, the rubric judge's :class:`grader.run.stage.Stage`) is fed
the rows by the run's first pass and returns an immutable :class:`~grader.judge.rubric.Rubrics`,
which the check pass's judge is built with; the drafts are read by their own judge
(:class:`grader.judge.judges.DraftJudge`). In memory the same stage runs without its file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from grader.backends import Completion, GenerateRequest, Message
from grader.io.dataset import Dataset, DatasetError, Item, unsendable_at
from grader.io.lock import OutputLock
from grader.io.outputs import Kind, Planned, check_outputs
from grader.io.rubric_file import (
    LISTS,
    RubricAppender,
    RubricLine,
    RubricStageEntry,
    check_writable,
    read_rubric_file,
    rubric_key,
    rubric_path,
    write_rubric_file,
)
from grader.judge.judges import Judge, RubricJudge
from grader.judge.prompts import RenderError, render_messages
from grader.judge.rubric import (
    Rubric,
    RubricEntry,
    RubricFailure,
    Rubrics,
    make_rubric,
    parse_draft,
)
from grader.judge.schema import draft_schema
from grader.run.ahead import Watch
from grader.run.executor import Executor, Graded
from grader.run.owner import same_file
from grader.run.request import FileJob, GradeRequest
from grader.run.rows import Job, Unsent, generate_request
from grader.run.stage import Checks as StageChecks
from grader.run.stage import Prepared, Stage
from grader.status import Status

log = logging.getLogger(__name__)


def _columns(item: Item, path: str) -> dict[str, Sequence[str]] | None:
    """The row's own rubric columns (lists of strings, or such a list as JSON text: CSV), or
    None when it has none."""
    found: dict[str, Sequence[str]] = {}
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
        for index, text in enumerate(value):
            # said in pass 1, naming the column: not a prompt that fails to render once the
            # model has loaded (as a rubric file's line is: grader.io.rubric_file)
            unsendable = unsendable_at(text)
            if unsendable is not None:
                raise DatasetError(path, item.line, f"column {name}[{index}] contains "
                                   f"{unsendable[0]}, which no engine can take (a rubric column)")
        found[name] = value
    return found or None


def _same_columns(a: dict[str, Sequence[str]], b: dict[str, Sequence[str]] | None) -> bool:
    return b is not None and all(list(a.get(n) or []) == list(b.get(n) or []) for n in LISTS)


def _source(line: RubricLine) -> str:
    """Who wrote a kept line: a line without its ``source`` is read as the judge's."""
    return "model" if isinstance(line.source, UnsetType) else line.source


def _remade(line: RubricLine, reference: str, source: str) -> RubricLine:
    """A kept rubric line with its items checked again (they may be edited); what it dropped
    when it was made stays in its ``dropped`` audit list, so a resumed run's rubric is the
    uninterrupted run's (items dropped again are not listed twice)."""
    remade = make_rubric(line.key, line.lists(), reference, source)
    dropped = line.dropped + [d for d in remade.dropped if d not in line.dropped]
    return msgspec.structs.replace(
        line, facts=remade.facts, conclusions=remade.conclusions, terms=remade.terms,
        ungrounded=remade.ungrounded, dropped=dropped, source=source)


def _draft_prompt(judge: RubricJudge, item: Item, path: str
                  ) -> tuple[dict[str, str], list[Message]]:
    """The rubric pass's fields and prompt for ``item``'s reference."""
    fields = {"input": item.fields.get("input") or "", "reference": str(item.fields["reference"])}
    try:
        return fields, render_messages(judge.rubric_prompt, fields, checklist=False)
    except RenderError as exc:
        raise DatasetError(path, item.line, str(exc)) from None


# A rubric key's check rows that the check pass sends first, given its rubric (to run ahead).
Checks = Callable[[str, Rubric], list[Job]]
# A draft read (its items by category, and whether it ended on a loop) as its key's line.
LineOf = Callable[[str, dict[str, list[str]], bool], RubricLine]


class RubricFiles:
    """The rubric stage's file policy (:class:`grader.run.stage.StageFiles`): ``--rubric
    FILE`` as the given file, and the rubrics a panel's later judges mark."""

    kind = Kind.RUBRIC

    def given_file(self, request: GradeRequest) -> str | None:
        return request.rubric

    def given_lines(self, request: GradeRequest) -> dict[str, RubricLine]:
        return read_rubric_file(request.rubric) if request.rubric else {}

    def shared(self, request: GradeRequest, first: Path, output: Path) -> GradeRequest:
        """The first judge's rubric file; with ``--rubric FILE`` lacking references, the first
        judge drafted those into its own rubric file: the later judges mark FILE and those
        drafts, written together as ``OUT.panel-rubric.jsonl`` (else each would draft its
        own, and labels of different items do not pool)."""
        drafted = rubric_path(first)
        if request.rubric is None:
            return dataclasses.replace(request, rubric=str(drafted))
        if not drafted.exists():
            return request
        lines = {**read_rubric_file(drafted, resuming=True), **read_rubric_file(request.rubric)}
        merged = output.with_name(f"{output.name.removesuffix('.jsonl')}.panel-rubric.jsonl")
        write_rubric_file(merged, lines.values())
        return dataclasses.replace(request, rubric=str(merged))


class RubricPass(Stage[RubricLine]):
    """The rubric format's preparation stage (:class:`grader.run.stage.Stage`): fed every row
    as pass 1 reads it (:meth:`add`), it then drafts the rubrics no row, file or earlier run
    gave (:meth:`run`) into one immutable :class:`~grader.judge.rubric.Rubrics`, which the
    check pass's judge is built with. The data is not read again here.

    With ``--rubric FILE``, the references FILE lacks are drafted too; their rubrics go to the
    rubric file beside the results (FILE is the user's and is never written). Its arguments
    are :class:`~grader.run.stage.Stage`'s: ``kept``, the rubric lines of the earlier calls in
    memory, reused as a run reuses its rubric file (no file read or written but ``--rubric
    FILE``, no bar drawn); ``given``, lines to mark as ``--rubric FILE``'s.
    """

    name = "rubric"
    files = RubricFiles()

    def __init__(self, request: GradeRequest, judge: Judge, path: str, *,
                 output: Path | None = None, overwrite: bool = False,
                 kept: Mapping[str, RubricLine] | None = None,
                 given: Mapping[str, RubricLine] | None = None) -> None:
        assert isinstance(judge, RubricJudge)  # the stage RubricJudge names (Judge.stage)
        self.request, self.judge, self.path = request, judge, path
        self.given = dict(given) if given is not None else (
            read_rubric_file(request.rubric) if request.rubric else None)
        self.target, self.overwrite = output, overwrite
        self.model, self.prompt_sha = str(request.model), judge.rubric_prompt.sha256
        # each reference's rubric as found (a column, a file, an earlier run) or drafted
        self.found: dict[str, RubricLine] = {}
        self.drafts: dict[str, Item] = {}  # the references to draft, each with its first row
        self.sources = dict.fromkeys(("data", "file", "resumed", "model"), 0)
        # with --rubric: the keys FILE lacks, in order, each with its first row's line
        self.not_in_file: dict[str, int | None] = {}
        # each key's first row: its line and rubric columns; which source counted it
        self.seen: dict[str, tuple[int | None, dict[str, Sequence[str]] | None]] = {}
        self.counted: dict[str, str] = {}
        self.earlier: dict[str, RubricLine] = dict(kept or {})
        if self.given is None:
            self._read_earlier()
        self.written: list[RubricLine] = []

    @staticmethod
    def beside(results: Path) -> Path:
        return rubric_path(results)

    @classmethod
    def preview(cls, path: str, items: list[Item], judge: Judge) -> list[Job | Unsent]:
        """``grader render`` in the rubric format: the check prompt of a row whose data has its
        rubric columns, else the first prompt its reference would see, the rubric pass's."""
        from grader.run.rows import prepare_jobs

        assert isinstance(judge, RubricJudge)
        jobs: list[Job | Unsent] = []
        for item in items:
            unsent = bool(judge.missing(item)) or item.invalid
            columns = None if unsent else _columns(item, path)
            if columns is not None:
                key = rubric_key(item.fields.get("input"), item.fields["reference"])
                rubric = make_rubric(key, columns, str(item.fields["reference"]), "data")
                jobs += prepare_jobs(path, [item], judge.with_rubrics(Rubrics({key: rubric})))
            elif unsent:
                jobs += prepare_jobs(path, [item], judge)
            else:
                jobs.append(Job(item, _draft_prompt(judge, item, path)[1]))
        return jobs

    def add(self, item: Item) -> str | None:
        """Pass 1: a row as read; its rubric key, or None for a row that is not sent."""
        if self.judge.missing(item) or item.invalid:
            return None
        input_text, reference = item.fields.get("input"), str(item.fields["reference"])
        key = rubric_key(input_text, reference)
        columns = _columns(item, self.path)
        seen = self.seen.get(key)
        if seen is not None:
            if columns is None or _same_columns(columns, seen[1]):
                return key  # the reference's rubric is known: the first row's
            if seen[1] is not None:
                raise DatasetError(self.path, item.line, (
                    f"has the input and reference of line {seen[0]} but other rubric columns: "
                    "rows that share an input and reference share one rubric"))
            self._forget(key)  # the first rows had no columns: this row's are the rubric
        self.seen[key] = (item.line, columns)
        if columns is not None:
            self.found[key] = make_rubric(key, columns, reference, "data").line(input_text, reference)
            self.sources["data"] += 1
        elif not self._given(key, reference, item.line):
            self._resume(key, reference, item)
        return key

    def _given(self, key: str, reference: str, line: int | None) -> bool:
        """With --rubric FILE: whether FILE has ``key``'s rubric (else it is noted missing)."""
        if self.given is None:
            return False
        if key in self.given:
            self._count(key, _remade(self.given[key], reference, "file"), "file")
            return True
        if not self.not_in_file:  # read only now: a FILE with every rubric never needs it
            self._read_earlier()
        self.not_in_file[key] = line
        return False

    def _resume(self, key: str, reference: str, item: Item) -> None:
        """``key``'s rubric from the earlier run's file where it is reusable, else drafted."""
        line = self.earlier.get(key)
        if line is not None and self._reusable(line):
            self._count(key, _remade(line, reference, _source(line)), "resumed")
        else:
            self.drafts[key] = item

    def _count(self, key: str, line: RubricLine, source: str) -> None:
        self.found[key] = line
        self.sources[source] += 1
        self.counted[key] = source

    def _forget(self, key: str) -> None:
        """Undo :meth:`add` of ``key`` (a later row brings the reference's own columns)."""
        self.found.pop(key, None)
        if key in self.counted:
            self.sources[self.counted.pop(key)] -= 1
        self.drafts.pop(key, None)
        self.not_in_file.pop(key, None)

    def _read_earlier(self) -> None:
        if self.target is not None and self.target.exists() and not self.overwrite:
            self.earlier = read_rubric_file(self.target, resuming=True)

    def _reusable(self, line: RubricLine) -> bool:
        # a drafted rubric is reused for the same model and rubric prompt only
        return line.source != "model" or (
            line.model == self.model and line.prompt_sha256 == self.prompt_sha)

    def known(self, key: str) -> RubricLine | None:
        """The rubric line ``key`` has so far (the row's columns, a file's), None until it is
        drafted; a later row's columns may still replace it (:meth:`final`)."""
        return self.found.get(key)

    def judge_of(self, key: str, known: RubricLine) -> Judge:
        return self.judge.with_rubrics(Rubrics({key: Rubric.of_line(known)}))

    @property
    def lines(self) -> Mapping[str, RubricLine]:
        return {line.key: line for line in self.written}

    def run(self, executor: Executor, start_engine: Callable[[], None],
            checks: StageChecks | None = None) -> Prepared:
        """Draft the missing rubrics (the model loads here, through ``start_engine``, only if
        one is); returns the check pass's judge, built with every row's rubric, and what the
        run manifest says of them.

        Args:
            checks: the check rows of a rubric key that the check pass sends first; a backend
                that runs ahead (vLLM's) starts them as soon as their reference's draft is
                read, beside the drafts still running (:class:`_RunAhead`).
        """
        self._check_own_file()
        failures: dict[str, RubricEntry] = {}
        output_tokens = self._make(executor, start_engine, failures, None if checks is None else (
            lambda key, rubric: checks(key, self.judge.with_rubrics(Rubrics({key: rubric})))))
        lines = self.found
        rubrics = Rubrics({**failures, **{k: Rubric.of_line(line) for k, line in lines.items()}})
        self._say_not_in_file()

        def sends(key: str) -> bool:
            rubric = rubrics.get(key)
            return isinstance(rubric, Rubric) and bool(rubric.facts)  # else not sent

        return Prepared(self.judge.with_rubrics(rubrics), self._entry(output_tokens), sends)

    def _check_own_file(self) -> None:
        """FILE is the results' own rubric file: drafting the references it lacks would
        rewrite the file the user named (and edited); they add them, or name a copy."""
        not_in_file = self.not_in_file
        if not not_in_file or not same_file(self.request.rubric, self.target):
            return
        first = next(iter(not_in_file.values()))
        raise DatasetError(str(self.request.rubric), None, (
            f"lacks the rubrics of {len(not_in_file)} reference"
            f"{'s' if len(not_in_file) > 1 else ''} of {self.path} (the first at line "
            f"{first}), and it is this run's own rubric file beside -o, which a run would "
            "write: grader never writes a file named with --rubric; add them to it, or name "
            "a copy of it with --rubric"))

    def _written(self) -> list[RubricLine]:
        """What the file beside the results holds: every rubric of the run, or with --rubric
        only those grader wrote (FILE's stay in FILE); earlier lines this data no longer has
        are kept. In memory, the lines a rubric file would hold: the caller keeps them."""
        self.written = ([v for k, v in self.found.items()
                         if self.given is None or k in self.not_in_file]
                        + [v for k, v in self.earlier.items() if k not in self.found])
        return self.written

    def _make(self, executor: Executor, start_engine: Callable[[], None],
              failures: dict[str, RubricEntry], checks: Checks | None) -> int:
        """The missing rubrics drafted into :attr:`found` (a draft that fails: into
        ``failures``), the rubric file written; the output tokens spent."""
        target, output_tokens = self.target, 0
        if self.drafts:
            output_tokens = self._draft(executor, start_engine, failures, checks)
            self.sources["model"] = sum(1 for k in self.drafts if k in self.found)
        elif target is not None and (self.given is None or self.not_in_file):
            write_rubric_file(target, self._written())
        if target is None:
            self._written()
        return output_tokens

    def _say_not_in_file(self) -> None:
        if self.not_in_file and self.target is not None:
            log.warning("rubric: %d references are not in %s: %d drafted by the judge, "
                        "%d kept from an earlier run, into %s", len(self.not_in_file),
                        self.request.rubric, self.sources["model"],
                        len(self.not_in_file) - len(self.drafts), self.target)

    def _entry(self, output_tokens: int) -> RubricStageEntry:
        lines, drafts, sources, not_in_file = self.found, self.drafts, self.sources, self.not_in_file
        failed = sum(1 for k in drafts if k not in lines)
        return RubricStageEntry(
            path=str(self.target if self.given is None or not_in_file else self.request.rubric),
            references=len(lines) + failed,
            written_by_judge=sources["model"],
            from_data=sources["data"],
            from_file=sources["file"],
            resumed=sources["resumed"],
            failed=failed,
            ungrounded_items=sum(len(line.ungrounded) for line in lines.values()),
            ended_on_loop=sum(1 for k in drafts if k in lines and lines[k].ended_on_loop is True),
            output_tokens=output_tokens,
            not_in_file=len(not_in_file) if not_in_file else UNSET,
            file=str(self.request.rubric) if not_in_file else UNSET,
        )

    def _drafted_line(self, key: str, parsed: dict[str, list[str]], looped: bool) -> RubricLine:
        """A draft as its rubric file's line; a draft the judge began to repeat itself in
        ended there (``ended_on_loop``)."""
        item = self.drafts[key]
        reference = item.fields["reference"]
        return make_rubric(key, parsed, reference, "model").line(
            item.fields.get("input"), reference, model=self.model,
            prompt_sha256=self.prompt_sha, ended_on_loop=True if looped else UNSET)

    def _draft_jobs(self) -> list[tuple[Job, str]]:
        """One job per reference to draft, read by the rubric pass's own judge (not the
        check pass's)."""
        jobs = []
        for index, (key, item) in enumerate(self.drafts.items()):
            fields, messages = _draft_prompt(self.judge, item, self.path)
            jobs.append((Job(Item(key, index, item.line, fields), messages, draft_schema(),
                             judge=self.judge.drafts), key))
        return jobs

    def _draft(self, executor: Executor, start_engine: Callable[[], None],
               failures: dict[str, RubricEntry], checks: Checks | None) -> int:
        """The rubric pass proper: the drafts graded block by block into :attr:`found` (a
        draft that fails: into ``failures``), each block's rubrics appended to the rubric
        file as it comes back (in memory: no file and no bar). The output tokens spent."""
        jobs, target = self._draft_jobs(), self.target
        if target is None:  # in memory: no file, no bar; the check rows still start ahead
            start_engine()
            return self._drafted(executor, jobs, failures,
                                 ahead=_RunAhead(self.judge, jobs, self._drafted_line, checks, None))
        check_writable(target)  # a read-only directory stops here, before the model loads
        start_engine()
        # the bar below moves only as drafts finish, and a batch of drafts finishes nearly together
        if self.request.backend == "batch":
            log.info("rubric pass: %d rubrics read from the batch runner's answers, one per "
                     "distinct (input, reference), into %s", len(jobs), target)
        else:
            log.info("rubric pass: the judge drafts %d rubrics, one per distinct (input, "
                     "reference), into %s; each answer is then only checked against its "
                     "reference's items", len(jobs), target)
        # the lines known before any draft go in first: a crash keeps them with the drafted ones
        appender = RubricAppender(target, self._written())
        bar = _Bar(len(jobs))
        # a backend that streams hands each draft over as it finishes: written then
        ahead = _RunAhead(self.judge, jobs, self._drafted_line, checks, appender)
        try:
            output_tokens = self._drafted(executor, jobs, failures, appender, bar, ahead)
            # the order of a run without a crash: the kept, then the drafted
            appender.finish(self._written())
        finally:
            appender.close()
            bar.close()
        return output_tokens

    def _drafted(self, executor: Executor, jobs: list[tuple[Job, str]],
                 failures: dict[str, RubricEntry], appender: RubricAppender | None = None,
                 bar: _Bar | None = None, ahead: _RunAhead | None = None) -> int:
        """The drafts graded block by block into :attr:`found` (or ``failures``), each block's
        new lines appended to the rubric file where there is one; the output tokens spent.
        Where the backend streams, each draft moves the bar and is handed to ``ahead`` as it
        finishes."""
        size, output_tokens = max(executor.chunk_size, 1), 0
        watch = None if ahead is None else Watch(bar.tick if bar else None, ahead.follow_up)
        for graded in executor.grade((jobs[i:i + size] for i in range(0, len(jobs), size)), watch):
            block, tokens = self._read_drafts(jobs, graded, failures, ahead)
            output_tokens += tokens
            if appender is not None:
                appender.append(block)
            if bar is not None:
                bar.done(len(graded))
        return output_tokens

    def _read_drafts(self, jobs: list[tuple[Job, str]], graded: Graded,
                     failures: dict[str, RubricEntry], ahead: _RunAhead | None
                     ) -> tuple[list[RubricLine], int]:
        """A block's drafts read into :attr:`found` (or ``failures``): the lines the rubric
        file does not have yet, and the output tokens spent."""
        block, output_tokens = [], 0
        for index, record in graded:
            key = jobs[index][1]
            # With --samples N the engine draws N drafts (its sampling is the run's); a
            # reference has one rubric, so the first draft that reads is kept.
            drawn = record.samples or [record.to_dict()]
            output_tokens += sum((d.get("usage") or {}).get("output_tokens") or 0 for d in drawn)
            parsed, looped = _first_draft(drawn)
            if isinstance(parsed, tuple):
                failures[key] = RubricFailure(*parsed)
                continue
            self.found[key] = self._drafted_line(key, parsed, looped)
            if ahead is None or key not in ahead.written:
                block.append(self.found[key])
        return block, output_tokens


class _RunAhead:
    """The check rows the check pass sends first, started as soon as their reference's draft
    is read, while the longest drafts still run (a backend that streams: vLLM's; the run's
    :class:`grader.run.ahead.Runner` starts them and keeps their answers for the check pass).
    A rubric pass is bound by its longest draft (docs/benchmarks.md), which leaves most of the
    engine's batch unused. Each draft is also appended to the rubric file as it finishes, not
    when its block comes back: a crash keeps every draft that finished.
    """

    def __init__(self, judge: RubricJudge, jobs: list[tuple[Job, str]],
                 line_of: LineOf, checks: Checks | None, appender: RubricAppender | None) -> None:
        self.written: set[str] = set()  # keys whose line the appender has
        self.judge, self.jobs, self.line_of, self.checks = judge, jobs, line_of, checks
        self.appender = appender
        self.by_prompt: dict[str, int] | None = None  # made at the first draft handed over

    def follow_up(self, conversation: list[Message], completions: list[Completion]
                  ) -> list[GenerateRequest]:
        """A draft has finished: its line written, its reference's first check rows returned
        (:data:`grader.run.ahead.FollowUp`)."""
        from grader.judge.judges import Answer

        if self.by_prompt is None:
            self.by_prompt = {json.dumps(job.messages): index
                              for index, (job, _) in enumerate(self.jobs)}
        index = self.by_prompt.get(json.dumps(conversation))
        if index is None:  # a draft cut to fit the context: its rubric waits for the pass
            return []
        job, key = self.jobs[index]
        parsed, looped = _first_draft(
            [self.judge.drafts.read(Answer.of_completion(job.item, c)).to_dict()
             for c in completions])
        if isinstance(parsed, tuple):
            return []
        line = self.line_of(key, parsed, looped)
        if key not in self.written and self.appender is not None:
            # written as it finishes: a crash later in the block (512 drafts on vLLM) keeps it
            self.appender.append([line])
            self.written.add(key)
        if self.checks is None:  # `grader rubric`: no check pass
            return []
        return [generate_request(check.messages, check.schema)
                for check in self.checks(key, Rubric.of_line(line)) if check.messages is not None]


def _first_draft(drawn: Sequence[Mapping[str, Any]]
                 ) -> tuple[dict[str, list[str]] | tuple[Status, str], bool]:
    """The first of a reference's drafts that reads, and whether the engine ended it on a
    loop; else the first one's failure."""
    failure: tuple[Status, str] | None = None
    for draft in drawn:
        looped = False
        if draft["status"] != Status.OK:
            parsed: Any = (Status(draft["status"]), draft.get("error") or "failed")
        else:
            parsed, looped = parse_draft(draft["raw_output"], draft["finish_reason"])
        if not isinstance(parsed, tuple):
            return parsed, looped
        failure = failure or parsed
    assert failure is not None
    return failure, False


class _Bar:
    """The rubric pass's progress bar: it moves as the engine finishes each draft where the
    backend streams (:meth:`tick`, heard per call: :class:`grader.run.ahead.Watch`), else as
    each block comes back."""

    def __init__(self, total: int) -> None:
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, unit="rubric", desc="rubrics", file=sys.stderr,
                        dynamic_ncols=True)
        self.ticked = 0

    def tick(self, rows: int) -> None:
        self.ticked += rows
        self.bar.update(rows)

    def done(self, rows: int) -> None:
        counted = min(self.ticked, rows)  # rows the bar already moved for, not counted twice
        self.ticked -= counted
        self.bar.update(rows - counted)

    def close(self) -> None:
        self.bar.close()


def run_rubric(request: GradeRequest, job: FileJob, executor: Executor | None = None, *,
               backend_factory: Callable[..., Any] | None = None) -> RubricStageEntry:
    """``grader rubric``: write the rubric file of ``job.data`` to ``job.output``."""
    from grader.run.executor import LocalExecutor
    from grader.run.grading import StopOnSignal
    from grader.run.request import RunPlan, judge_for

    judge = judge_for(request)
    if not isinstance(judge, RubricJudge):
        raise ValueError("a rubric is written for the seed judge's rubric format")
    executor = executor or LocalExecutor(backend_factory)
    # one writer per rubric file, as per results file: a second run stops here (exit 75), and a
    # directory that cannot take a file stops before the model loads (exit 73); a SIGTERM raises
    # Terminated, so that the command's last line says what is saved and how to resume
    with StopOnSignal(), OutputLock(job.output), contextlib.ExitStack() as opened:
        check_outputs([Planned(job.output, Kind.RUBRIC)], [job.data], overwrite=job.overwrite)
        dataset = opened.enter_context(Dataset(job.data, mapping=request.mapping,
                                               id_column=request.id_column, limit=job.limit))
        opened.callback(executor.close)
        executor.open()
        backend_name = request.backend
        if backend_name == "auto":
            backend_name, _ = executor.choose_backend("auto")
        plan = RunPlan(request, backend_name, judge)

        def start() -> None:
            executor.start(plan)

        stage = RubricPass(request, judge, dataset.name, output=job.output,
                           overwrite=job.overwrite)
        for item in dataset:  # the one read of the data
            stage.add(item)
        entry = stage.run(executor, start).entry
        assert isinstance(entry, RubricStageEntry)
        return entry
