"""grade: read, render, resume, grade through an executor, write; one ``run_grade`` for a local
run, ``--data-parallel`` and ``--ray``."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from array import array
from collections.abc import Callable, Iterator
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
from grader.io.results import ResultsLog, check_results_name, summary_path, write_summary
from grader.judge.judges import rescoring_judges
from grader.judge.records import AGGREGATES
from grader.records import Record
from grader.run.ahead import Watch
from grader.run.controls import Controls, controls_path, discard_controls
from grader.run.core import LoadedJudge, Rows, model_key
from grader.run.executor import Executor, LocalExecutor
from grader.run.owner import check_owner, id_set_digest, same_file, summary_or_empty
from grader.run.request import FileJob, GradeRequest, Interrupted, OptionError, RunPlan, judge_for
from grader.run.rescore import distrusts
from grader.run.stage import stage_for

log = logging.getLogger(__name__)


def make_executor(ray: str | None = None, data_parallel: int | None = None,
                  backend_factory: Callable[..., Backend] | None = None) -> Executor:
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


class StopOnSignal:
    """Ctrl-C and SIGTERM during a run.

    While rows are being graded (``deferring``), the first one asks the run to stop after the
    chunk in flight, saved; a second one stops at once. Before that (reading the data, loading
    the model) one stops at once: :class:`KeyboardInterrupt` for a Ctrl-C, :class:`Terminated`
    for a SIGTERM, either of which unwinds the run (the stdin copy removed, the lock let go).
    """

    def __enter__(self) -> StopOnSignal:
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


def run_grade(request: GradeRequest, job: FileJob, executor: Executor | None = None, *,
              backend_factory: Callable[..., Backend] | None = None,
              rows: Dataset | None = None) -> Summary:
    """Read ``job.data``, render, grade and write ``job.output``, resuming what an earlier run
    of the same job finished.

    A results file belongs to the run that made it (:mod:`grader.run.owner`): a run whose
    settings or rows differ stops before any model work, unless ``job.overwrite``.

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
            of reading ``job.data`` (``grader audit``'s rows); its name is the data's.

    Returns the summary (also written beside the results). Raises :class:`Interrupted` after
    a Ctrl-C or a SIGTERM, once the chunk in flight is saved; a second one, or one before the
    grading starts, raises :class:`KeyboardInterrupt` (:class:`Terminated` for a SIGTERM).
    """
    started = now()
    if request.aggregate not in AGGREGATES:
        raise OptionError(f"unknown aggregate {request.aggregate!r}: choose from {AGGREGATES}")
    check_results_name(job.output)
    # Taken before anything is read or written: a second run on the same output stops here.
    with StopOnSignal() as stop, OutputLock(job.output), contextlib.ExitStack() as opened:
        check_grade_outputs(request, job)  # the one output policy, before any model work
        run = _Run(request, job, executor or LocalExecutor(backend_factory), stop, opened, rows)
        run.grade()
        return run.finish(started)


class _Run:
    """run_grade's steps, under the output's lock, around the core's stream
    (:meth:`LoadedJudge.grade_stream`): made, it has opened the dataset, the executor, the
    plan and the results log, and checked the settings against the results file's owner
    before any model work; ``opened`` closes the dataset and the executor however the run
    ends."""

    def __init__(self, request: GradeRequest, job: FileJob, executor: Executor,
                 stop: StopOnSignal, opened: contextlib.ExitStack,
                 rows: Dataset | None = None) -> None:
        self.request, self.job, self.executor = request, job, executor
        self.stop, self.opened = stop, opened
        self.prepared: dict[str, Any] = {}  # the stage's run-manifest entry, by its name
        self.controls: Controls | None = None  # grader.run.controls: None with --controls 0
        judge = judge_for(request)
        check_not_input(job.data, job.output)
        stage_class = stage_for(judge)
        if stage_class is not None:  # its file beside the results: no other writer either
            self.opened.enter_context(OutputLock(stage_class.beside(job.output)))
        dataset = rows or self.opened.enter_context(
            Dataset(job.data, mapping=request.mapping, id_column=request.id_column,
                    limit=job.limit, source=request.source))
        # the core the run is a shell around: it loads the backend(s) and grades
        self.core = LoadedJudge.open(request, self.executor, judge)
        # closed however the run ends: a bad row found below must not leave a cluster open
        self.opened.callback(self.executor.close)
        self.plan, self.run_key = self.core.plan, self.core.run_key
        if request.controls:
            self.controls = Controls(request.controls, self.plan.judge, job.output,
                                     self._controls_log)
        # a kept record is read again from its raw text, as rescore reads it: one that says
        # otherwise (an edited score, items or counts) is graded again, and named
        judges = rescoring_judges(request.grader_config)
        self.distrusts: Callable[[Record], bool] = lambda record: distrusts(record, judges)
        self.log = ResultsLog(job.output, overwrite=job.overwrite, distrusts=self.distrusts)
        self.identity = _identity(self.plan, self.run_key)
        if not job.overwrite:
            check_owner(self.log, job.output, self.identity)
        self.source = _FileRows(dataset, self)
        self.places = _Places(self.log, self.stop, self._check_stop)

    def claim(self, total: int, id_hashes: array[int]) -> None:
        """After pass 1: the rows' count and ids claim the results file."""
        self.identity |= {"limit": self.job.limit, "rows": total,
                          "row_ids": id_set_digest(id_hashes)}
        if not self.job.overwrite:
            check_owner(self.log, self.job.output, self.identity)
        self.log.claim(self.identity)

    def _controls_log(self, path: Path) -> ResultsLog:
        """The controls' log, the results' run's (:mod:`grader.run.controls`)."""
        log_ = ResultsLog(path, overwrite=self.job.overwrite, distrusts=self.distrusts)
        log_.claim(self.identity)
        return log_

    def grade(self) -> None:
        """Both passes through the core; a Ctrl-C or SIGTERM stops after the block in
        flight (:meth:`_check_stop`)."""
        try:
            self.prepared = self.core.grade_stream(
                self.source, self.places, controls=self.controls,
                lookup=self.log.lookup if self.log.resumable > 0 else None,
                watch=Watch(progress=self.places.tick))
        finally:
            self.stop.deferring = False
            if self.places.bar is not None:
                self.places.bar.close()
            self.log.close()
            if self.controls is not None:
                self.controls.close()
            # rows the stage started ahead that pass 2 did not ask for are aborted when the
            # executor closes (grader.run.ahead.Runner.close)

    def _check_stop(self) -> None:
        """After a block: stop, saved, if a Ctrl-C or SIGTERM asked to and rows are left."""
        if not self.stop.requested:
            return
        done, total, partial = self.places.done, self.source.total, self.log.partial
        if done == total and self.controls is not None and self.controls.log is not None:
            done, total, partial = self.controls.done, self.controls.total, self.controls.log.partial
        if done < total:
            raise Interrupted(done, total, partial, terminated=self.stop.terminated,
                              overwrite=self.job.overwrite)

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
        about = self.executor.describe()
        if not self.core.started:
            # Every row was resumed: what graded them is in the summary of the run that did.
            earlier_run = _earlier_run(self.job.output, self.run_key)
            about |= {"engine": earlier_run.get("engine"),
                      "token_budget": earlier_run.get("token_budget")}
        run = run_manifest(
            started=started, data=self.job.data, results=str(self.job.output),
            rows=self.source.total, resumed_rows=self.places.resumed_rows,
            judge=_judge_manifest(self.plan, self.run_key), identity=self.identity,
            **about, **self.prepared, **self._regraded())
        # the controls file first: a results file in place has its verdict beside it
        check = self.controls.finish() if self.controls is not None else None
        # The results file is assembled in input order while the summary reads it; the summary
        # is written first, so a results file in place always has its own summary beside it.
        summary = summarize(self.log.assemble(self.places.locations()), run=run)
        if check is not None:  # written before the run manifest, where a reader looks first
            summary.judge_check = check
        run.finished = now()
        try:
            write_summary(summary_path(self.job.output), summary)
        except BaseException:
            self.log.abandon()  # no .tmp left behind; the log stays for a rerun
            raise
        self.log.commit()
        if self.job.overwrite and (self.controls is None or self.controls.log is None):
            discard_controls(self.job.output)  # the earlier run's, gone with its results
        return summary


# Ids of the regraded records named on the terminal, and in the summary.
_NAMED, _NAMED_IN_SUMMARY = 10, 1000


class _FileRows(Rows):
    """The data file's rows for the core: pass 1 hashes each row and claims the results file
    once every row is read; pass 2 checks each row against pass 1 (a file changed while it
    is graded stops the run)."""

    def __init__(self, dataset: Dataset, run: _Run) -> None:
        super().__init__(dataset)
        self.run, self.job = run, run.job
        # each row's digest (8 bytes), so that pass 2 sees any change made since pass 1
        self.digests = array("q")

    def first_pass(self) -> Iterator[Item]:
        for item in super().first_pass():
            self.digests.append(_row_digest(item))
            yield item
        self.run.claim(self.total, self.dataset.id_hashes)

    def blocks(self, size: int) -> Iterator[list[Item]]:
        seen = 0
        for block in super().blocks(size):
            seen += len(block)
            if seen > self.total or any(_row_digest(item) != self.digests[item.index]
                                        for item in block):
                raise self._changed()  # an id or a text edited in place since pass 1
            yield block
        if seen != self.total:  # rows gone since the first pass: their places would stay empty
            raise self._changed()

    def _changed(self) -> DatasetError:
        # what is graded so far stays in the log for a rerun
        return DatasetError(self.name, None, "changed while it was being graded")


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
    """The file run's sink (:class:`grader.run.core.Sink`): where each row's record lies in
    the results log, by row position (9 bytes a row), how many rows are done, the bar."""

    def __init__(self, log: ResultsLog, stop: StopOnSignal, check: Callable[[], None]) -> None:
        self.log, self.stop, self.check = log, stop, check
        self.sources, self.offsets = array("b"), array("q")
        self.done = self.resumed_rows = self.ticked = 0
        self.bar: Any = None

    def begin(self, rows: int, controls: int) -> None:
        self.sources, self.offsets = array("b", [-1]) * rows, array("q", [0]) * rows
        self.stop.deferring = True  # from here on a Ctrl-C stops after the block in flight
        from tqdm.auto import tqdm

        self.bar = tqdm(total=rows + controls, unit="row", desc="grading", file=sys.stderr,
                        dynamic_ncols=True)

    def write(self, records: list[tuple[int, Record]]) -> None:
        if not records:  # a write is a flush and an fsync: none for nothing
            return
        for (position, _), location in zip(records, self.log.write(r for _, r in records), strict=True):
            self.sources[position], self.offsets[position] = location
        self.done += len(records)
        self._moved(len(records))

    def block(self, records: list[tuple[int, Record]], controls: int) -> None:
        self.write(records)
        self._moved(controls)
        self.check()

    def _moved(self, rows: int) -> None:
        """Rows saved: the bar moves, less the rows it already moved for as the engine
        finished them (:meth:`tick`)."""
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

    def more(self, controls: int) -> None:
        if self.bar is not None:
            self.bar.total += controls
            self.bar.refresh()

    def locations(self) -> Iterator[tuple[int, int]]:
        return zip(self.sources, self.offsets, strict=True)


def _judge_manifest(plan: RunPlan, run_key: str) -> dict[str, Any]:
    """What graded the rows: judge, prompt, schema, model, sampling, backend."""
    request, judge, backend_name = plan.request, plan.judge, plan.backend
    return {
        "judge": judge.describe(),
        "prompt": {"name": judge.prompt.name, "path": str(judge.prompt.path),
                   "sha256": judge.prompt.sha256},
        "schema_sha256": sha256_json(judge.schema),
        "checklist": judge.checklist,
        "format": judge.answer_format,
        "aggregate": request.aggregate if request.sampling.n > 1 else None,
        "model": {"name": request.model, **_model_manifest(request, backend_name)},
        "sampling": request.sampling.model_dump() | {"max_tokens": plan.max_tokens},
        "backend": backend_name,
        "run_key": run_key,
    }


def check_grade_outputs(request: GradeRequest, job: FileJob,
                        pair: tuple[str, str] | None = None) -> None:
    """The one policy (:mod:`grader.io.outputs`) for every file a grade run writes, before
    any model work; with ``pair`` (``--pair A B``) the pairs file too, which is written from
    A and B and is then the run's data."""
    planned, reads = grade_outputs(request, job.output), grade_inputs(request, job.data)
    if pair:
        planned.append(Planned(pairs_path(job.output), Kind.PAIRS, "beside -o"))
        reads = [*pair, *reads[1:]]
    check_outputs(planned, reads, overwrite=job.overwrite)


def grade_outputs(request: GradeRequest, output: Path, option: str = "-o") -> list[Planned]:
    """Every file a grade run of ``request`` into ``output`` writes (:mod:`grader.io.outputs`):
    the results, their summary and log, the controls and their log, the stage's file beside
    them (not where it is the file the request names to use as given: that one is read,
    never written)."""
    beside = f"beside {option}"
    planned = results_files(output, option)
    if request.controls:
        controls = controls_path(output)
        planned += [Planned(controls, Kind.CONTROLS, beside),
                    *(Planned(p.path, p.kind, beside) for p in results_files(controls)[2:])]
    stage = stage_for(judge_for(request))
    if stage is not None and not same_file(stage.files.given_file(request), stage.beside(output)):
        planned.append(Planned(stage.beside(output), stage.files.kind, beside))
    return planned


def grade_inputs(request: GradeRequest, data: str) -> list[str | None]:
    """Every file a grade run of ``request`` over ``data`` reads: the data, the stage's given
    file, the prompt and the score_model grader definition."""
    stage = stage_for(judge_for(request))
    return [data, stage.files.given_file(request) if stage else None, request.prompt,
            request.grader_config]


def check_not_input(data: str, output: Path, what: str | None = None) -> None:
    """A file a run writes (the results, else ``what`` says which) that is the input file
    would replace the data it is made from."""
    if data != "-" and same_file(data, output):
        raise DatasetError(data, None, what or f"is also the results file -o {output}: grading "
                           "would overwrite it")


def _earlier_run(results: Path, run_key: str) -> dict[str, Any]:
    run = summary_or_empty(results).get("run") or {}
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
