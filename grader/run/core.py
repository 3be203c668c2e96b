"""The core: a judge loaded over a run plan and its executor, rows in, records out.

:meth:`LoadedJudge.grade_stream` is the one loop every run goes through, rows held in memory
and a file alike: pass 1 over the rows (each validated and rendered, fed to the judge's
preparation stage, :mod:`grader.run.stage`, and to the controls), the stage run (its rows
started ahead on a backend that streams, :mod:`grader.run.ahead`), then pass 2 block by block
(rows resumed, not sent or graded, the controls' first group with the last block, their later
groups while the sequential check is open). Where the rows come from is a :class:`Rows` and
where the records go a :class:`Sink`: in memory a list (:meth:`LoadedJudge.grade`); the file
run (:func:`grader.run.grading.run_grade`) adds what only a file needs (the lock, the owner
check, the row digests, the results log, the bar and the summary).
"""

from __future__ import annotations

import gc
import itertools
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from grader.analysis.verdict import JudgeCheck
from grader.io.dataset import Dataset, DatasetError, Item
from grader.io.manifest import model_fingerprint, model_identity, sha256_json
from grader.io.results import Location
from grader.judge.judges import Judge
from grader.records import Record
from grader.run.ahead import Watch
from grader.run.controls import Controls
from grader.run.executor import Executor, Pending
from grader.run.request import FileJob, GradeRequest, RunPlan, judge_for
from grader.run.rows import Job, Unsent, prepare_jobs, sends, sort_jobs
from grader.run.stage import Stage, stage_for

log = logging.getLogger(__name__)

# A results log's lookup: where an earlier run left the record of a resume key.
Lookup = Callable[[str], Location | None]
# What a stage's file holds, by key (grader.run.stage.Stage.lines).
Lines = Mapping[str, Any]

# Rows of the first block kept from pass 1 for a stage to start ahead: up to a block
# of the executor's (vLLM's is 512 rows; a larger --chunk-size runs fewer of them ahead).
_AHEAD_ROWS = 4096


def model_key(model: str, backend_name: str = "") -> dict[str, str]:
    """The model's part of the resume key: what it is, not where it lies or when it was copied."""
    if backend_name == "openai":
        # the id the server serves it under (/v1/models), even where it names a local directory:
        # the server's weights are not these files
        return {"served_model": model}
    try:
        identity = model_identity(model)
    except OSError:
        return {"model": model}
    return model_fingerprint(identity)


def run_key(plan: RunPlan) -> str:
    """Everything that changes an answer is in the key: a changed prompt, model, sampling,
    schema or engine setting re-grades the affected rows on resume; batch sizes do not."""
    from grader.config import answer_settings

    request, backend_name = plan.request, plan.backend
    return sha256_json({
        "model": model_key(request.model, backend_name),
        "backend": backend_name,
        "sampling": request.sampling.model_dump() | {"max_tokens": plan.max_tokens},
        "schema": sha256_json(plan.schema),
        "settings": answer_settings(backend_name, plan.settings),
        "truncate": sorted(request.truncate),
        "aggregate": request.aggregate if request.sampling.n > 1 else None,
        **plan.judge.key_fields,
    })


def with_controls(blocks: Iterable[tuple[Pending, bool]], controls: Pending,
                  chunk_size: int) -> Iterator[Pending]:
    """Each block of rows to grade (with whether it is the last), ``controls`` joining the last
    one, as many as a block holds, the rest after it: one engine batch with the last rows, where
    a batch of their own ran at under half the rows/s of big batches (vLLM CPU,
    docs/judging.md). Lazy: a file run's blocks are read as they are asked for."""
    size = max(chunk_size, 1)
    for pending, last in blocks:
        if last and controls:
            yield pending + controls[:size]
            for start in range(size, len(controls), size):
                yield controls[start:start + size]
        else:
            yield pending


class Rows:
    """The rows a stream grades, read twice: whole in pass 1 (:meth:`first_pass`), then block
    by block in pass 2 (:meth:`blocks`). This one's are held in memory; the file run's checks
    pass 2 against pass 1 and claims its results file once pass 1 is done."""

    #: a file run's job: the stage writes its file beside the results, rather than keeping
    #: its lines in memory for the next call
    job: FileJob | None = None

    def __init__(self, dataset: Dataset) -> None:
        self.dataset, self.name, self.total = dataset, dataset.name, 0

    def first_pass(self) -> Iterator[Item]:
        for item in self.dataset:
            self.total += 1
            yield item
        self.dataset.check_unique_ids()

    def blocks(self, size: int) -> Iterator[list[Item]]:
        iterator = iter(self.dataset)
        while block := list(itertools.islice(iterator, size)):
            yield block


class Sink(Protocol):
    """Where a stream's records go (a file run's: its results log and bar)."""

    def begin(self, rows: int, controls: int) -> None:
        """Pass 2 starts: ``rows`` rows to place, ``controls`` control rows to grade."""

    def resumed(self, position: int, location: Location) -> None:
        """A row whose record an earlier run left in the log (only with a lookup)."""

    def write(self, records: list[tuple[int, Record]]) -> None:
        """Rows' records (not sent, or graded) by position."""

    def block(self, records: list[tuple[int, Record]], controls: int) -> None:
        """A block of pass 2 done: its graded rows' records, and how many control rows it
        held (a file run stops here, saved, if asked to)."""

    def more(self, controls: int) -> None:
        """A later group of control rows to grade."""


class Collected:
    """A stream's records in memory, in input order (:attr:`records`)."""

    def __init__(self) -> None:
        self._placed: dict[int, Record] = {}
        self.rows = 0

    def begin(self, rows: int, controls: int) -> None:
        self.rows = rows

    def resumed(self, position: int, location: Location) -> None:
        raise AssertionError("rows in memory resume nothing")

    def write(self, records: list[tuple[int, Record]]) -> None:
        self._placed.update(records)

    def block(self, records: list[tuple[int, Record]], controls: int) -> None:
        self._placed.update(records)

    def more(self, controls: int) -> None:
        pass

    @property
    def records(self) -> list[Record]:
        return [self._placed[position] for position in range(self.rows)]


@dataclass
class _KeyRows:
    """Pass 1's count of one group key's rows: how many, and on a rerun how many of them the
    results log holds, rendered against ``known`` (None: the stage did not know the key's
    value in pass 1, or it changed)."""

    known: object | None
    rows: int = 0
    resumed: int = 0


class LoadedJudge:
    """A judge model loaded once (lazily, at the first row it must send) over ``plan`` and
    ``executor``: :meth:`grade_stream` turns rows into records.

    In memory it keeps what the stage made so far (:attr:`prepared_lines`, a new read-only
    mapping after each call, never changed in place): a later call makes only what the
    earlier ones did not. One call at a time: the caller takes turns (:class:`grader.Grader`
    holds a lock).

    Args:
        reason: why the plan's backend was chosen (``backend="auto"``), logged as it loads.
    """

    def __init__(self, plan: RunPlan, executor: Executor, reason: str | None = None) -> None:
        self.plan, self.executor, self.reason = plan, executor, reason
        self.run_key = run_key(plan)
        self.started = False
        #: what the judge's stage made so far, as its file holds it
        self.prepared_lines: Lines = MappingProxyType({})
        #: the last call's verdict on the judge from its controls (None: no controls)
        self.judge_check: JudgeCheck | None = None

    @classmethod
    def open(cls, request: GradeRequest, executor: Executor, judge: Judge | None = None
             ) -> LoadedJudge:
        """``executor`` opened and the plan resolved (``backend="auto"``: the executor picks;
        ``judge``: the request's, built already), the executor closed again if that fails;
        the model loads at the first row sent."""
        executor.open()
        try:
            backend, reason = request.backend, None
            if backend == "auto":
                backend, reason = executor.choose_backend("auto")
            return cls(RunPlan(request, backend, judge or judge_for(request)), executor, reason)
        except BaseException:
            executor.close()
            raise

    def start(self) -> None:
        """Load the backend(s), once."""
        if not self.started:
            if self.reason:
                log.info("backend: %s (%s)", self.plan.backend, self.reason)
            self.executor.start(self.plan)
            self.started = True

    def key(self, job: Job | Unsent) -> str:
        """A row's resume key: its id, what it sends and everything that changes the answer."""
        return sha256_json([job.item.id, job.messages, self.run_key])

    def grade_stream(self, rows: Rows, sink: Sink, *, controls: Controls | None = None,
                     lookup: Lookup | None = None, given: Lines | None = None,
                     watch: Watch | None = None, send_rows: bool = True) -> dict[str, Any]:
        """Every row of ``rows`` placed in ``sink``, the controls graded (their verdict is the
        caller's: :meth:`Controls.finish`). Returns the stage's run-manifest entry, by its
        name (none without a stage).

        Args:
            lookup: the results log's, to resume (a file run's rerun).
            given: the stage's lines to use as given, as the file the request names.
            watch: what each call hears as its rows finish (a file run's bar).
            send_rows: False grades the controls alone (:meth:`check`).
        """
        gc.freeze()  # what the imports made lives as long as the process (rows.open_backend)
        try:
            stream = _Stream(self, rows, sink, controls, lookup, given)
            stream.first_pass()
            if not send_rows:
                stream.to_grade = 0
            stream.prepare()
            stream.grade(watch, send_rows)
            return stream.entry
        finally:
            # back to the collector when the run ends: a long-lived caller's objects, and a
            # backend dropped without close() (its watchdog ends once it is collected), are
            # not kept for the rest of the process
            gc.unfreeze()

    def grade(self, dataset: Dataset, *, controls: int = 0,
              given: Lines | None = None) -> list[Record]:
        """One record per row of ``dataset`` (in memory: :meth:`Dataset.of_rows`), in its
        order; with ``controls``, the run's controls and their verdict in
        :attr:`judge_check`; ``given``: the stage's lines to use as given."""
        checks = Controls(controls, self.plan.judge) if controls else None
        sink = Collected()
        self.grade_stream(Rows(dataset), sink, controls=checks, given=given)
        self.judge_check = checks.finish() if checks is not None else None
        return sink.records

    def check(self, dataset: Dataset, count: int) -> JudgeCheck:
        """The judge check (a summary's ``judge_check``) on up to ``count`` references of
        ``dataset``, graded as a run grades its controls, the rows themselves not sent (with a
        stage: marked against what it made for them)."""
        checks = Controls(count, self.plan.judge)
        self.grade_stream(Rows(dataset), Collected(), controls=checks, send_rows=False)
        return checks.finish()


class _Stream:
    """One :meth:`LoadedJudge.grade_stream` call's steps and what they carry between them."""

    def __init__(self, core: LoadedJudge, rows: Rows, sink: Sink, controls: Controls | None,
                 lookup: Lookup | None, given: Lines | None) -> None:
        self.core, self.rows, self.sink, self.controls, self.lookup = (
            core, rows, sink, controls, lookup)
        self.judge: Judge = core.plan.judge  # the one its stage prepared, once it has
        self.judge.check_fields(rows.dataset)  # a column the format needs, before any row is read
        self.to_grade = 0
        self.entry: dict[str, Any] = {}
        self.stage: Stage | None = None
        stage_class = stage_for(self.judge)
        if stage_class is not None and rows.job is not None:
            self.stage = stage_class(core.plan.request, self.judge, rows.name,
                                     output=stage_class.beside(rows.job.output),
                                     overwrite=rows.job.overwrite)
        elif stage_class is not None:  # in memory: no file read or written but the given one
            self.stage = stage_class(core.plan.request, self.judge, rows.name,
                                     kept=core.prepared_lines, given=given)
        # per group key what pass 1 counted of its rows; the first block's rows by key, and
        # those rendered for the stage to start ahead (pass 2 takes them as they are)
        self.key_rows: dict[str, _KeyRows] = {}
        self.early: dict[str, list[Item]] = {}
        self.ahead_jobs: dict[int, Job | Unsent] = {}

    def first_pass(self) -> None:
        """Every row validated and rendered before any model work (with a stage: fed to it,
        and rendered only where a rerun may resume it); how many are left to grade (with a
        stage: once it has prepared)."""
        name, judge, lookup, key = self.rows.name, self.judge, self.lookup, self.core.key
        for item in self.rows.first_pass():
            if self.controls is not None:
                self.controls.add(item)
            if self.stage is not None:
                self._collect(self.stage, item)
                continue
            if lookup is None:  # a fresh run: validated, rendered in pass 2 only
                self.to_grade += sends(name, item, judge)
                continue
            job = prepare_jobs(name, [item], judge)[0]
            self.to_grade += job.messages is not None and not lookup(key(job))

    def _collect(self, stage: Stage, item: Item) -> None:
        """Pass 1 with a stage: the row to the stage, counted under its group key (on a
        rerun: resumed or not, where the stage knows the key's value already), and kept if
        it is in the first block (the rows the stage may start ahead: _first_checks)."""
        key = stage.add(item)
        if key is None:  # not sent
            return
        if item.index < _AHEAD_ROWS:
            self.early.setdefault(key, []).append(item)
        known = stage.known(key)
        rows = self.key_rows.get(key)
        if rows is None:
            rows = self.key_rows[key] = _KeyRows(known)
        elif rows.known is not known:
            rows.known = None  # its value changed: the rows before were counted against another
        rows.rows += 1
        if self.lookup is not None and rows.known is not None:
            job = prepare_jobs(self.rows.name, [item], stage.judge_of(key, rows.known))[0]
            rows.resumed += job.messages is not None and bool(self.lookup(self.core.key(job)))

    def prepare(self) -> None:
        """What the stage makes (the model loads here if it makes anything), the judge built
        with it, and the rows left to grade counted from pass 1's tally (no read more)."""
        stage = self.stage
        if stage is None:
            return
        # A stage resumes from its own file: a rerun makes at most what the earlier run lacked.
        prepared = stage.run(self.core.executor, self.core.start, checks=self._first_checks)
        self.core.prepared_lines = MappingProxyType(dict(stage.lines))
        self.entry = {stage.name: prepared.entry}
        self.early = {}
        self.judge = prepared.judge
        self.to_grade = 0
        for key, rows in self.key_rows.items():
            if prepared.sends(key):
                exact = rows.known is not None and stage.final(key, rows.known)
                # rows counted against a value that changed later: each is graded, as far
                # as the count knows (at worst the engine loads for rows that are resumed)
                self.to_grade += rows.rows - (rows.resumed if exact else 0)

    def _first_checks(self, key: str, judge: Judge) -> list[Job]:
        """The rows of group key ``key`` among those pass 2 sends first (its first block,
        less the rows resumed or not sent), and the key's control rows (sent with the last
        block), rendered by ``judge`` (built with the key's prepared value), for the stage
        to start ahead; each row once."""
        size = self.core.executor.chunk_size
        items = [item for item in self.early.pop(key, []) if item.index < size]
        jobs = prepare_jobs(self.rows.name, items, judge)
        self.ahead_jobs.update((job.item.index, job) for job in jobs)  # pass 2 sends them as they are
        lookup = self.lookup
        rows = [job for job in jobs if isinstance(job, Job)
                and not (lookup and lookup(self.core.key(job)))]
        # the key's controls too: they go with the last block, answered from ahead
        controls = (self.controls.checks_for(key, self.rows.name, judge)
                    if self.controls is not None else [])
        return rows + controls

    def grade(self, watch: Watch | None, send_rows: bool) -> None:
        """Pass 2: resumed and unsent rows placed, the rest graded, the controls' first group
        with the last block, their later groups while the verdict is open."""
        core, controls, sink = self.core, self.controls, self.sink
        extra: Pending = []
        if controls is not None:
            controls.prepare(self.rows.name, offset=self.rows.total, judge=self.judge)
            extra = controls.open(core.key)
        if self.to_grade or extra:
            core.start()
        if controls is not None:
            controls.begin()
        sink.begin(self.rows.total, controls.total - controls.done if controls else 0)
        size = (max(core.executor.chunk_size, 1) if core.started
                else core.plan.request.chunk_size or 1024)
        blocks = self._pending_blocks(size) if send_rows else iter([([], True)])
        if not core.started:  # nothing to send: the blocks only place resumed and unsent rows
            for _ in blocks:
                sink.block([], 0)
        else:
            for records in core.executor.grade(with_controls(blocks, extra, size), watch):
                rows = controls.take(records) if controls is not None else records
                sink.block(rows, len(records) - len(rows))
        if controls is not None:
            self._later_groups(controls, watch)

    def _later_groups(self, controls: Controls, watch: Watch | None) -> None:
        """The sequential check's later groups of control rows (:meth:`Controls.next_group`),
        each asked for only once the groups before it are graded and taken: a call of the
        executor's of its own per group, as an executor may read every block of a call before
        it grades any (Ray's, a data-parallel one's queue)."""
        core = self.core
        size = max(core.executor.chunk_size or core.plan.request.chunk_size or 1024, 1)
        while (rows := controls.next_group()) is not None:
            if not rows:  # an earlier run graded them all
                continue
            self.sink.more(len(rows))
            core.start()
            for records in core.executor.grade(
                    [rows[start:start + size] for start in range(0, len(rows), size)], watch):
                controls.take(records)
                self.sink.block([], len(records))

    def _pending_blocks(self, size: int) -> Iterator[tuple[Pending, bool]]:
        """Pass 2's blocks, each with whether it is the last: resumed and unsent rows placed,
        the rows left to grade returned."""
        key, judge, lookup, sink = self.core.key, self.judge, self.lookup, self.sink
        for block in self.rows.blocks(size):
            rows = sort_jobs(self._rendered(block), key, judge, lookup)
            for position, location in rows.resumed:
                sink.resumed(position, location)
            sink.write(rows.unsent)
            if rows.pending and not self.core.started:  # rows the first pass did not see
                raise DatasetError(self.rows.name, None, "changed while it was being graded")
            yield rows.pending, block[-1].index == self.rows.total - 1  # pass 1 counted

    def _rendered(self, block: list[Item]) -> list[Job | Unsent]:
        """A block's jobs: the rows the stage started ahead as rendered then (the same
        prepared value, the same row: each row is rendered once), the others now."""
        if not self.ahead_jobs:
            return prepare_jobs(self.rows.name, block, self.judge)
        fresh = iter(prepare_jobs(self.rows.name,
                                  [item for item in block if item.index not in self.ahead_jobs],
                                  self.judge))
        return [self.ahead_jobs.pop(item.index) if item.index in self.ahead_jobs else next(fresh)
                for item in block]
