"""grade: read, render, resume, grade through an executor, write; one ``run_grade`` for a local
run, ``--data-parallel`` and ``--ray``."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import sys
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from grader.analysis.summary import Summary, summarize
from grader.backends import Backend
from grader.config import answer_settings
from grader.errors import Terminated
from grader.io.dataset import Dataset, DatasetError, Item
from grader.io.lock import OutputLock
from grader.io.manifest import model_identity, now, run_manifest, sha256_json
from grader.io.outputs import Kind, Planned, check_outputs, results_files
from grader.io.pairs import pairs_path
from grader.io.results import (
    ResultsLog,
    SummaryError,
    check_results_name,
    read_summary,
    summary_path,
    write_summary,
)
from grader.judge.judges import Judge, rescoring_judges
from grader.judge.records import AGGREGATES
from grader.records import Record
from grader.run.ahead import Watch
from grader.run.controls import Controls, controls_path, discard_controls
from grader.run.core import LoadedJudge, later_groups, model_key, with_controls
from grader.run.executor import Executor, LocalExecutor, Pending
from grader.run.owner import check_owner, id_set_digest
from grader.run.request import GradeRequest, Interrupted, OptionError, RunPlan, judge_for
from grader.run.rescore import distrusts
from grader.run.rows import Job, prepare_jobs, sort_jobs
from grader.run.stage import Stage, stage_for

log = logging.getLogger(__name__)


def make_executor(
    ray: str | None = None,
    data_parallel: int | None = None,
    backend_factory: Callable[..., Backend] | None = None,
) -> Executor:
    """Where the rows are graded: a Ray cluster (``ray``: its address, "" for Ray's default),
    ``data_parallel`` worker processes here, or this process.

    Args:
        backend_factory: replaces :func:`grader.backends.load_backend` (tests pass a fake).
    """
    if ray is not None:
        from grader.run.ray_cluster import RayExecutor

        return RayExecutor(ray, replicas=data_parallel)
    if data_parallel and data_parallel > 1:
        from grader.run.data_parallel import DataParallelExecutor

        factory = {"backend_factory": backend_factory} if backend_factory is not None else {}
        return DataParallelExecutor(data_parallel, **factory)
    return LocalExecutor(backend_factory)


class _StopOnSignal:
    """Ctrl-C and SIGTERM during a run.

    While rows are being graded (``deferring``), the first one asks the run to stop after the
    chunk in flight, saved; a second one stops at once. Before that (reading the data, loading
    the model) one stops at once: :class:`KeyboardInterrupt` for a Ctrl-C, :class:`Terminated`
    for a SIGTERM, either of which unwinds the run (the stdin copy removed, the lock let go).
    """

    def __enter__(self) -> _StopOnSignal:
        self.signal: int | None = None
        self.deferring = False
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    @property
    def requested(self) -> bool:
        return self.signal is not None

    @property
    def terminated(self) -> bool:
        return self.signal == signal.SIGTERM

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal is not None or not self.deferring:
            raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt
        self.signal = signum
        what = "SIGTERM" if signum == signal.SIGTERM else "interrupt"
        log.warning("%s: finishing the current chunk, then stopping (Ctrl-C again to stop now)",
                    what)

    def __exit__(self, *exc_info: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def _progress(total: int, initial: int) -> Any:
    from tqdm.auto import tqdm  # type: ignore[import-untyped]  # tqdm ships no stubs

    return tqdm(
        total=total, initial=initial, unit="row", desc="grading", file=sys.stderr, dynamic_ncols=True
    )


def run_grade(
    request: GradeRequest,
    executor: Executor | None = None,
    *,
    backend_factory: Callable[..., Backend] | None = None,
    rows: Dataset | None = None,
) -> Summary:
    """Read, render, grade and write, resuming what an earlier run of the same job finished.

    A results file belongs to the run that made it (:mod:`grader.run.owner`): a run whose
    settings or rows differ stops before any model work, unless ``request.overwrite``.

    The dataset is streamed twice and never held whole: a first pass validates and renders
    every row (bad input fails before any model work), feeds the judge's preparation stage
    (:mod:`grader.run.stage`), if it has one, and counts the rows left to grade (the model
    loads only if there are any); a second grades them block by block. Memory stays flat in
    the number of rows: 9 bytes a row say where each record lies in the log (and, with a
    stage, a few numbers per group key and the first block's rows, which the stage may start
    ahead).

    Args:
        executor: where the rows are graded (:mod:`grader.run.executor`); default a
            :class:`LocalExecutor`. Everything else, resume included, is the same for each.
        backend_factory: the default executor's backend loader (tests pass a fake).
        rows: the rows themselves, held in memory (:meth:`Dataset.of_rows`), graded in place
            of reading ``request.data`` (``grader audit``'s rows); its name is the data's.

    Returns the summary (also written beside the results). Raises :class:`Interrupted` after
    a Ctrl-C or a SIGTERM, once the chunk in flight is saved; a second one, or one before the
    grading starts, raises :class:`KeyboardInterrupt` (:class:`Terminated` for a SIGTERM).
    """
    started = now()
    if request.aggregate not in AGGREGATES:
        raise OptionError(f"unknown aggregate {request.aggregate!r}: choose from {AGGREGATES}")
    check_results_name(request.output)
    # Taken before anything is read or written: a second run on the same output stops here.
    with _StopOnSignal() as stop, OutputLock(request.output), contextlib.ExitStack() as opened:
        check_grade_outputs(request)  # the one output policy, before any model work
        run = _Run(request, executor or LocalExecutor(backend_factory), stop, opened, rows)
        run.open()
        run.first_pass()
        run.prepare()
        run.grade()
        return run.finish(started)


class _Run:
    """run_grade's steps, under the output's lock; ``opened`` closes the dataset and the
    executor however the run ends."""

    def __init__(self, request: GradeRequest, executor: Executor, stop: _StopOnSignal,
                 opened: contextlib.ExitStack, rows: Dataset | None = None) -> None:
        self.request, self.executor, self.stop, self.opened = request, executor, stop, opened
        self.rows = rows
        self.prepared: dict[str, Any] = {}  # the stage's run-manifest entry, by its name
        self.total = self.to_grade = 0
        # each row's digest (8 bytes), so that pass 2 sees any change made since pass 1
        self.digests = array("q")
        self.places: _Places | None = None  # pass 2's; the engine may start before, for a stage
        self.controls: Controls | None = None  # grader.run.controls: None with --controls 0
        # the judge's preparation stage (grader.run.stage), fed in pass 1; per group key what
        # pass 1 counted of its rows (_KeyRows); the first block's rows by key (_first_checks)
        self.stage: Stage | None = None
        self.key_rows: dict[str, _KeyRows] = {}
        self.early: dict[str, list[Item]] = {}
        self.ahead_jobs: dict[int, Job] = {}  # those rows, rendered: pass 2 takes them

    def open(self) -> None:
        """The dataset, the executor, the plan, the results log; settings checked against the
        results file's owner before any model work."""
        request = self.request
        judge = judge_for(request)
        check_not_input(request.data, request.output)
        self.stage_class = stage_for(judge)
        if self.stage_class is not None:  # its file beside the results: no other writer either
            self.opened.enter_context(OutputLock(self.stage_class.beside(request.output)))
        self.dataset = self.rows or self.opened.enter_context(
            Dataset(request.data, mapping=request.mapping, id_column=request.id_column,
                    limit=request.limit, source=request.source)
        )
        judge.check_fields(self.dataset)  # a column the format needs, before any row is read
        # closed however the run ends: a bad row found below must not leave a cluster open
        self.opened.callback(self.executor.close)
        self.executor.open()
        backend, self.reason = request.backend, None
        if backend == "auto":
            backend, self.reason = self.executor.choose_backend("auto")
        self.plan = RunPlan(request, backend, judge)
        # the judge rows are rendered by: the plan's, or the one its stage prepared (prepare);
        # the executor's reads the answers
        self.judge: Judge = judge
        if request.controls:
            self.controls = Controls(request.controls, judge, request.output)
        # the in-memory core the run is a shell around: it loads the backend(s) and grades
        self.core = LoadedJudge(self.plan, self.executor)
        self.run_key = self.core.run_key
        # a kept record is read again from its raw text, as rescore reads it: one that says
        # otherwise (an edited score, items or counts) is graded again, and named
        judges = rescoring_judges(request.grader_config)
        self.distrusts: Callable[[Record], bool] = lambda record: distrusts(record, judges)
        self.log = ResultsLog(request.output, overwrite=request.overwrite, distrusts=self.distrusts)
        self.identity = _identity(self.plan, self.run_key)
        if not request.overwrite:
            check_owner(self.log, request.output, self.identity)

    @property
    def engine_started(self) -> bool:
        return self.core.started

    def key(self, job: Job) -> str:
        """A row's resume key: its id, what it sends and everything that changes the answer."""
        return self.core.key(job)

    def start_engine(self) -> None:
        """Load the backend(s), once; a backend that fails to load leaves no file behind."""
        if self.engine_started:
            return
        if self.reason:
            log.info("backend: %s (%s)", self.plan.backend, self.reason)
        self.core.start()

    def prepare(self) -> None:
        """A judge with a preparation stage, once pass 1 has validated every row and fed
        every row to it: what the stage makes (the model loads here if it makes anything),
        the judge built with it, and the rows left to grade counted from pass 1's tally (no
        read more)."""
        if self.stage is None:
            return
        # A stage resumes from its own file: a rerun makes at most what the earlier run lacked.
        prepared = self.stage.run(self.executor, self.start_engine, checks=self._first_checks)
        self.prepared = {self.stage.name: prepared.entry}
        self.early = {}
        self.judge = prepared.judge
        self.to_grade = 0
        for key, rows in self.key_rows.items():
            if prepared.sends(key):
                exact = rows.known is not None and self.stage.final(key, rows.known)
                # rows counted against a value that changed later: each is graded, as far
                # as the count knows (at worst the engine loads for rows that are resumed)
                self.to_grade += rows.rows - (rows.resumed if exact else 0)

    def _first_checks(self, key: str, judge: Judge) -> list[Job]:
        """The rows of group key ``key`` among those pass 2 sends first (its first block,
        less the rows resumed or not sent), and the key's control rows (sent with the last
        block), rendered by ``judge`` (built with the key's prepared value), for the stage
        to start ahead; each row once."""
        size = self.executor.chunk_size
        items = [item for item in self.early.pop(key, []) if item.index < size]
        resuming = self.log.resumable > 0
        jobs = prepare_jobs(self.dataset.name, items, judge)
        self.ahead_jobs.update((job.item.index, job) for job in jobs)  # pass 2 sends them as they are
        rows = [job for job in jobs if job.messages is not None
                and not (resuming and self.log.lookup(self.key(job)))]
        # the key's controls too: they go with the last block, answered from ahead
        controls = self.controls.checks_for(key, self.dataset.name, judge) if self.controls else []
        return rows + controls

    def first_pass(self) -> None:
        """Pass 1: every row validated and rendered before any model work (with a stage: fed
        to it, and rendered only where a rerun may resume it); how many are left to grade
        (with a stage: once it has prepared); the rows' count and ids claim the results
        file."""
        resuming = self.log.resumable > 0  # a fresh run needs no keys until it writes
        if self.stage_class is not None:
            self.stage = self.stage_class(self.request, self.plan.judge, self.dataset.name)
        for item in self.dataset:
            self.total += 1
            self.digests.append(_row_digest(item))
            if self.controls is not None:
                self.controls.add(item)
            if self.stage is not None:
                self._collect(self.stage, item, resuming)
                continue
            job = prepare_jobs(self.dataset.name, [item], self.plan.judge)[0]
            self.to_grade += job.messages is not None and not (resuming and self.log.lookup(self.key(job)))
        self.dataset.check_unique_ids()
        self.identity |= {"limit": self.request.limit, "rows": self.total,
                          "row_ids": id_set_digest(self.dataset.id_hashes)}
        if not self.request.overwrite:
            check_owner(self.log, self.request.output, self.identity)
        self.log.claim(self.identity)

    def _collect(self, stage: Stage, item: Item, resuming: bool) -> None:
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
        if resuming and rows.known is not None:
            job = prepare_jobs(self.dataset.name, [item], stage.judge_of(key, rows.known))[0]
            rows.resumed += job.messages is not None and bool(self.log.lookup(self.key(job)))

    def grade(self) -> None:
        """Pass 2: resumed and unsent rows are placed here, the rest go to the executor, the
        controls' rows with the last block; a Ctrl-C or SIGTERM stops after the block in
        flight."""
        controls = self._open_controls()
        if self.to_grade or controls:  # nothing is written yet
            self.start_engine()
        if self.controls is not None:
            self.controls.begin()
        self.places = places = _Places(self.log, self.total)
        left = self.controls.total - self.controls.done if self.controls is not None else 0
        try:
            self.stop.deferring = True
            with _progress(self.total + left, 0) as places.bar:
                if self.engine_started:  # rows finished inside a call move the bar
                    graded = self.core.grade_blocks(self._pending_blocks(controls),
                                                    Watch(progress=places.tick))
                else:  # nothing to send: the blocks only place resumed and unsent rows
                    graded = ([] for _ in self._pending_blocks())
                for records in graded:
                    rows = self.controls.take(records) if self.controls is not None else records
                    places.write(rows)
                    places.count(len(records) - len(rows))
                    self._check_stop()
                if self.controls is not None:
                    self._later_controls(places)
        finally:
            self.stop.deferring = False
            self.log.close()
            if self.controls is not None:
                self.controls.close()
            # rows the stage started ahead that pass 2 did not ask for are aborted when the
            # executor closes (grader.run.ahead.Runner.close)

    def _later_controls(self, places: _Places) -> None:
        """The sequential check's later groups of control rows, each graded only while the
        verdict on the groups before it is open (:func:`later_groups`, as in memory)."""
        assert self.controls is not None
        size = self.executor.chunk_size or self.request.chunk_size or 1024  # as pass 2's
        for group in later_groups(self.controls, size):
            if places.bar is not None:
                places.bar.total += sum(len(block) for block in group)
                places.bar.refresh()
            self.start_engine()
            for records in self.core.grade_blocks(group, Watch(progress=places.tick)):
                self.controls.take(records)
                places.count(len(records))
                self._check_stop()

    def _open_controls(self) -> Pending:
        """The controls (:mod:`grader.run.controls`) rendered by the same judge (its stage
        done by now) and resumed; the rows left to grade."""
        if self.controls is None:
            return []
        self.controls.prepare(self.dataset.name, offset=self.total, judge=self.judge)
        return self.controls.open(self)

    def _check_stop(self) -> None:
        """After a block: stop, saved, if a Ctrl-C or SIGTERM asked to and rows are left."""
        assert self.places is not None
        if not self.stop.requested:
            return
        done, total, partial = self.places.done, self.total, self.log.partial
        if done == total and self.controls is not None and self.controls.log is not None:
            done, total, partial = self.controls.done, self.controls.total, self.controls.log.partial
        if done < total:
            raise Interrupted(done, total, partial, terminated=self.stop.terminated,
                              overwrite=self.request.overwrite)

    def _pending_blocks(self, controls: Pending | None = None) -> Iterator[Pending]:
        """Pass 2's blocks of rows left to grade, each checked against pass 1; ``controls``
        (rows of :mod:`grader.run.controls`) join the last block (:func:`with_controls`)."""
        chunk_size = self.executor.chunk_size if self.engine_started else (
            self.request.chunk_size or 1024)
        jobs = self._checked_jobs(chunk_size)
        blocks = ((self._pending(block), block[-1].item.index == self.total - 1)  # pass 1 counted
                  for block in iter(lambda: list(itertools.islice(jobs, chunk_size)), []))
        yield from with_controls(blocks, controls or [], chunk_size)

    def _checked_jobs(self, chunk_size: int) -> Iterator[Job]:
        """The dataset read again, rendered block by block, each row checked against pass 1."""
        seen = 0
        for block in _blocks(self.dataset, chunk_size):
            seen += len(block)
            if seen > self.total:
                raise self._changed()
            if any(_row_digest(item) != self.digests[item.index] for item in block):
                raise self._changed()  # an id or a text edited in place since pass 1
            yield from self._rendered(block)
        if seen != self.total:  # rows gone since the first pass: their places would stay empty
            raise self._changed()

    def _rendered(self, block: list[Item]) -> list[Job]:
        """A block's jobs: the rows the stage started ahead as rendered then (the same
        prepared value, the same row: each row is rendered once), the others now."""
        if not self.ahead_jobs:
            return prepare_jobs(self.dataset.name, block, self.judge)
        fresh = iter(prepare_jobs(self.dataset.name,
                                  [item for item in block if item.index not in self.ahead_jobs],
                                  self.judge))
        return [self.ahead_jobs.pop(item.index) if item.index in self.ahead_jobs else next(fresh)
                for item in block]

    def _pending(self, jobs: list[Job]) -> Pending:
        """A block's rows: resumed ones and unsent ones placed, the rest returned to grade."""
        assert self.places is not None
        rows = sort_jobs(jobs, self.key, self.judge, self.log.lookup)
        for position, location in rows.resumed:
            self.places.resumed(position, location)
        self.places.write(rows.unsent)
        if rows.pending and not self.engine_started:
            raise self._changed()  # rows the first pass did not see
        return rows.pending

    def _changed(self) -> DatasetError:
        # what is graded so far stays in the log for a rerun
        return DatasetError(self.dataset.name, None, "changed while it was being graded")

    def _regraded(self) -> dict[str, Any]:
        """The run manifest's ``regraded`` entry: kept records (results and controls) that
        said other than their own raw text and were graded again, counted and named."""
        ids = [*self.log.regraded]
        if self.controls is not None and self.controls.log is not None:
            ids += self.controls.log.regraded
        if not ids:
            return {}
        log.warning("resume: %d kept record%s said other than the judge's raw text (an edited "
                    "score, items or counts) and %s graded again: %s", len(ids),
                    "s" if len(ids) > 1 else "", "were" if len(ids) > 1 else "was",
                    ", ".join(ids[:_NAMED]) + (", ..." if len(ids) > _NAMED else ""))
        return {"regraded": {"rows": len(ids), "ids": ids[:_NAMED_IN_SUMMARY],
                             "reason": "the kept record disagreed with its own raw text"}}

    def finish(self, started: str) -> Summary:
        """The run manifest, the summary written beside the results, the results committed."""
        assert self.places is not None
        about = self.executor.describe()
        if not self.engine_started:
            # Every row was resumed: what graded them is in the summary of the run that did.
            earlier_run = _earlier_run(self.request.output, self.run_key)
            about |= {"engine": earlier_run.get("engine"),
                      "token_budget": earlier_run.get("token_budget")}
        run = run_manifest(
            started=started,
            data=self.request.data,
            results=str(self.request.output),
            rows=self.total,
            resumed_rows=self.places.resumed_rows,
            judge=_judge_manifest(self.plan, self.run_key),
            identity=self.identity,
            **about,
            **self.prepared,
            **self._regraded(),
        )
        # the controls file first: a results file in place has its verdict beside it
        check = self.controls.finish() if self.controls is not None else None
        # The results file is assembled in input order while the summary reads it; the summary
        # is written first, so a results file in place always has its own summary beside it.
        summary = summarize(self.log.assemble(self.places.locations()), run=run)
        if check is not None:  # written before the run manifest, where a reader looks first
            summary.judge_check = check
        run.finished = now()
        try:
            write_summary(summary_path(self.request.output), summary)
        except BaseException:
            self.log.abandon()  # no .tmp left behind; the log stays for a rerun
            raise
        self.log.commit()
        if self.request.overwrite and (self.controls is None or self.controls.log is None):
            discard_controls(self.request.output)  # the earlier run's, gone with its results
        return summary


# Ids of the regraded records named on the terminal, and in the summary.
_NAMED, _NAMED_IN_SUMMARY = 10, 1000


# Rows of the first block kept from pass 1 for a stage to start ahead: up to a block
# of the executor's (vLLM's is 512 rows; a larger --chunk-size runs fewer of them ahead).
_AHEAD_ROWS = 4096


class _KeyRows:
    """Pass 1's count of one group key's rows: how many, and on a rerun how many of them the
    results log holds, rendered against ``known`` (None: the stage did not know the key's
    value in pass 1, or it changed)."""

    __slots__ = ("known", "resumed", "rows")

    def __init__(self, known: object | None) -> None:
        self.known, self.rows, self.resumed = known, 0, 0


def _row_digest(item: Item) -> int:
    """A row as read (its id, its fields, why it cannot be sent), hashed in 8 bytes: a later
    pass must see what pass 1 saw; what it sends is rendered from these. Python's string hash
    is fine within one process, which every pass shares."""
    try:
        return hash((item.id, item.invalid, tuple(item.fields.items())))
    except TypeError:  # a field holding a list or a dict (JSONL): its text then
        return hash(repr((item.id, item.invalid, item.fields)))


def _identity(plan: RunPlan, run_key: str) -> dict[str, Any]:
    """The settings part of the run's identity (:mod:`grader.run.owner`); the rows' part is
    added once pass 1 has counted them."""
    request, judge, backend_name = plan.request, plan.judge, plan.backend
    return {
        "format": judge.answer_format,
        "judge": judge.describe(),
        "prompt": {"name": judge.prompt.name, "sha256": judge.prompt.sha256},
        "model": model_key(request.model),
        "backend": backend_name,
        "sampling": request.sampling.model_dump() | {"max_tokens": plan.max_tokens},
        "settings": answer_settings(backend_name, plan.settings),
        "truncate": sorted(request.truncate),
        "aggregate": request.aggregate if request.sampling.n > 1 else None,
        "run_key": run_key,
    }


class _Places:
    """Where each row's record lies in the results log, by row position (9 bytes a row), and
    how many rows are done."""

    def __init__(self, log: ResultsLog, total: int) -> None:
        self.log = log
        self.sources, self.offsets = array("b", [-1]) * total, array("q", [0]) * total
        self.done = self.resumed_rows = self.ticked = 0
        self.bar: Any = None

    def write(self, records: list[tuple[int, Record]]) -> None:
        if not records:  # a write is a flush and an fsync: none for nothing
            return
        for (position, _), location in zip(records, self.log.write(r for _, r in records), strict=True):
            self.sources[position], self.offsets[position] = location
        self.done += len(records)
        # the rows the bar already moved for as the engine finished them are not counted twice
        counted = min(self.ticked, len(records))
        self.ticked -= counted
        if self.bar is not None:
            self.bar.update(len(records) - counted)

    def count(self, rows: int) -> None:
        """Rows of a block that are not the results' (the controls'): the bar moves for them."""
        counted = min(self.ticked, rows)
        self.ticked -= counted
        if self.bar is not None:
            self.bar.update(rows - counted)

    def tick(self, rows: int) -> None:
        """Rows the engine finished inside a chunk (not saved yet: the chunk is saved whole)."""
        self.ticked += rows
        if self.bar is not None:
            self.bar.update(rows)

    def resumed(self, position: int, location: tuple[int, int]) -> None:
        self.sources[position], self.offsets[position] = location
        self.resumed_rows += 1
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)

    def locations(self) -> Iterator[tuple[int, int]]:
        return zip(self.sources, self.offsets, strict=True)


def _judge_manifest(plan: RunPlan, run_key: str) -> dict[str, Any]:
    """What graded the rows: judge, prompt, schema, model, sampling, backend."""
    request, judge, backend_name = plan.request, plan.judge, plan.backend
    return {
        "judge": judge.describe(),
        "prompt": {
            "name": judge.prompt.name,
            "path": str(judge.prompt.path),
            "sha256": judge.prompt.sha256,
        },
        "schema_sha256": sha256_json(judge.schema),
        "checklist": judge.checklist,
        "format": judge.answer_format,
        "aggregate": request.aggregate if request.sampling.n > 1 else None,
        "model": {"name": request.model, **_model_manifest(request, backend_name)},
        "sampling": request.sampling.model_dump() | {"max_tokens": plan.max_tokens},
        "backend": backend_name,
        "run_key": run_key,
    }


def check_grade_outputs(request: GradeRequest, pair: tuple[str, str] | None = None) -> None:
    """The one policy (:mod:`grader.io.outputs`) for every file a grade run writes, before
    any model work; with ``pair`` (``--pair A B``) the pairs file too, which is written from
    A and B and is then the run's data."""
    planned, reads = grade_outputs(request), grade_inputs(request)
    if pair:
        planned.append(Planned(pairs_path(request.output), Kind.PAIRS, "beside -o"))
        reads = [*pair, *reads[1:]]
    check_outputs(planned, reads, overwrite=request.overwrite)


def grade_outputs(request: GradeRequest, option: str = "-o") -> list[Planned]:
    """Every file a grade run of ``request`` writes (:mod:`grader.io.outputs`): the results,
    their summary and log, the controls and their log, the stage's file beside them (not
    where it is the file the request names to use as given: that one is read, never
    written)."""
    output = request.output
    beside = f"beside {option}"
    planned = results_files(output, option)
    if request.controls:
        controls = controls_path(output)
        planned += [Planned(controls, Kind.CONTROLS, beside),
                    *(Planned(p.path, p.kind, beside) for p in results_files(controls)[2:])]
    stage = stage_for(judge_for(request))
    if stage is not None and not _names(stage.files.given_file(request), stage.beside(output)):
        planned.append(Planned(stage.beside(output), stage.files.kind, beside))
    return planned


def grade_inputs(request: GradeRequest) -> list[str | None]:
    """Every file a grade run of ``request`` reads: its data, the stage's given file, the
    prompt and the score_model grader definition."""
    stage = stage_for(judge_for(request))
    return [request.data, stage.files.given_file(request) if stage else None, request.prompt,
            request.grader_config]


def _names(given: str | None, path: Path) -> bool:
    try:
        return given is not None and os.path.samefile(given, path)
    except OSError:
        return False


def check_not_input(data: str, output: Path) -> None:
    """A results file that is the input file would replace the data it is graded from."""
    try:
        same = data != "-" and os.path.samefile(data, output)
    except OSError:  # either one does not exist (yet): they are not the same file
        same = False
    if same:
        raise DatasetError(data, None, f"is also the results file -o {output}: grading would overwrite it")


def _blocks(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    """``items`` in lists of ``size`` (itertools.batched, which needs Python 3.12)."""
    iterator = iter(items)
    while block := list(itertools.islice(iterator, size)):
        yield block


def _earlier_run(results: Path, run_key: str) -> dict[str, Any]:
    try:
        run = (read_summary(results) or {}).get("run") or {}
    except SummaryError:
        return {}
    return run if run.get("run_key") == run_key else {}


def _model_manifest(request: GradeRequest, backend_name: str) -> dict[str, Any]:
    if backend_name == "openai":
        return {"served_model": request.model, "base_url": request.openai.base_url}
    try:
        return model_identity(request.model)
    except OSError as exc:
        from grader.backends.chat import LOCAL_WEIGHTS

        # a plugin backend's model may be a name it knows rather than a directory: no error
        return {"error": str(exc)} if backend_name in LOCAL_WEIGHTS else {}
