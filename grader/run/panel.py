"""A judge panel (``grader grade -m A -m B ...``): one ordinary graded run per judge, each into
its own results file beside the output (``OUT.judge-1.jsonl``, ...: its own resume, lock and
owner), one judge loaded at a time; then the judges' records pooled by id into ``OUT.jsonl``
and its summary, with a ``panel`` section (:mod:`grader.analysis.panel`).

A panel needs a judge with a preparation stage (:mod:`grader.run.stage`): the first judge's
stage makes its values (or the request's file gives them), and the later judges are given
those (:meth:`~grader.run.stage.StageFiles.shared`), so every judge labels the same items. A
crash in a later judge leaves the earlier judges' results: the same command resumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from msgspec.structs import replace

from grader.analysis.panel import Agreement, PanelError, pool_row
from grader.analysis.summary import PanelAgreement, Summary, summarize
from grader.analysis.verdict import FirstJudge, JudgeCheck
from grader.backends import Backend
from grader.errors import GraderError
from grader.io.dataset import Dataset
from grader.io.lock import OutputLock
from grader.io.manifest import RunManifest, now
from grader.io.outputs import check_outputs, results_files
from grader.io.results import (
    ResultsWriter,
    check_results_name,
    read_records,
    summary_path,
    write_summary,
)
from grader.judge.judges import JUDGE_CLASSES, either
from grader.records import Record
from grader.run.core import LoadedJudge
from grader.run.executor import Executor
from grader.run.grading import grade_inputs, grade_outputs, run_grade
from grader.run.owner import (
    ResultsOwned,
    check_not_unfinished,
    check_results_file,
    summary_or_empty,
)
from grader.run.request import FileJob, GradeRequest, Interrupted, OptionError, judge_for
from grader.run.stage import Stage, stage_for


@dataclass(frozen=True)
class PanelJudge:
    """One judge of a panel: its model and, where it differs from the run's, its temperature
    (the same model twice at two temperatures stands in for two models)."""

    model: str
    temperature: float | None = None


class PanelJudgeError(GraderError):
    """A judge of the panel failed (to load, or on the way): its error, named."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def judge_results(output: Path, index: int) -> Path:
    """``OUT.jsonl`` -> ``OUT.judge-N.jsonl`` (N from 1): judge N's own results file."""
    return output.with_name(f"{output.name.removesuffix('.jsonl')}.judge-{index + 1}.jsonl")


def check_panel(request: GradeRequest, judges: Sequence[PanelJudge]) -> None:
    """What a panel cannot pool stops before any model loads."""
    if len(judges) < 2:
        raise OptionError("a panel needs two judges or more (--model given twice or more)")
    judge = judge_for(request)
    if stage_for(judge) is None or request.grader_config:
        staged = either([f for f, judge_class in JUDGE_CLASSES.items() if judge_class.stage])
        raise OptionError(
            f"a judge panel needs --format {staged}, not "
            f"{judge.answer_format or 'a --grader-config grader'}: "
            "its judges label one shared list of items, which pool item by item; in the other "
            "formats each judge writes items of its own (or one verdict), which do not")
    if request.evidence:
        raise OptionError("--evidence is not for a judge panel: the judges' quotes do not pool")
    if request.sampling.n > 1:
        raise OptionError("--samples is not for a judge panel: the panel's judges are its samples")


def check_panel_models(request: GradeRequest, judges: Sequence[PanelJudge]) -> None:
    """Every later judge's model checked as its backend will load it, before the first one
    loads (the first judge's is the request's, checked when it was built)."""
    from grader.backends.chat import check_model

    for judge in judges[1:]:
        check_model(request.backend, judge.model)


def _stage(request: GradeRequest) -> type[Stage]:
    stage = stage_for(judge_for(request))
    assert stage is not None  # check_panel
    return stage


def judge_request(request: GradeRequest, judge: PanelJudge, index: int) -> GradeRequest:
    """The ordinary grade request of judge ``index``: its model and temperature."""
    sampling = request.sampling
    if judge.temperature is not None:
        sampling = sampling.model_copy(update={"temperature": judge.temperature})
    # the judge check (the controls) runs for the first judge only, into its own files: the
    # others mark the same rubric, and the panel's agreement compares them with it
    return dataclasses.replace(request, model=judge.model, sampling=sampling,
                               controls=request.controls if index == 0 else 0)


def run_panel(request: GradeRequest, job: FileJob, judges: Sequence[PanelJudge],
              make_executor: Callable[[], Executor | None] | None = None, *,
              backend_factory: Callable[..., Backend] | None = None) -> Summary:
    """Grade the rows of ``job.data`` with each judge in turn, then pool them into
    ``job.output``.

    Returns the pooled summary (also written beside the output), with ``panel`` (the
    agreement), ``run.panel`` (each judge's model, temperature and results file) and the first
    judge's ``judge_check`` (its controls, :func:`panel_check`).
    """
    check_panel(request, judges)
    check_results_name(job.output)
    _check_pooled_output(job)
    started = now()
    with OutputLock(job.output), _stdin_once(job) as read:
        # every judge's files and the pooled ones, before the first judge loads
        planned = [p for i, judge in enumerate(judges)
                   for p in grade_outputs(judge_request(request, judge, i),
                                          judge_results(job.output, i))]
        check_outputs([*results_files(job.output)[:3], *planned],
                      grade_inputs(request, job.data), overwrite=job.overwrite)
        names, runs = [], []
        marked = request  # what the judges are given: after the first, what it made
        check: JudgeCheck | None = None
        for index, judge in enumerate(judges):
            name = f"judge-{index + 1}"
            names.append(name)
            summary = _run_judge(marked, read, judge, index, name, make_executor, backend_factory)
            if index == 0:  # given what the first judge's stage made (StageFiles.shared)
                marked = _stage(request).files.shared(request, judge_results(job.output, 0),
                                                      job.output)
                check = panel_check(summary.judge_check or None, name, judge.model)
            runs.append({"name": name, "model": judge.model,
                         "temperature": judge_request(request, judge, index).sampling.temperature,
                         "results": str(judge_results(job.output, index)),
                         "statuses": summary.statuses, "resumed_rows": summary.manifest.resumed_rows})
        return _pool(marked, job, names, runs, started, check)


def panel_check(check: JudgeCheck | None, name: str, model: str) -> JudgeCheck | None:
    """The first judge's judge check as the panel's, saying whose it is (``panel_judge``):
    the controls run for the first judge only."""
    if check is None:
        return None
    return replace(check, panel_judge=FirstJudge(name, model))


def _check_pooled_output(job: FileJob) -> None:
    """Before any judge runs: ``-o`` must be new, or an earlier panel's pooled results (the
    pooling rewrites it, and writes ``OUT.jsonl.partial`` on the way); a single judge's
    results there, finished or not, are another run's work, kept unless ``--overwrite``."""
    output = job.output
    if job.overwrite:
        return
    check_not_unfinished(output)
    if not output.is_file():
        return
    check_results_file(output)
    if "panel" not in summary_or_empty(output):
        raise ResultsOwned(f"{output} holds the results of a run that is not a judge panel: "
                           "use --overwrite to replace them with the panel's, or another -o "
                           "to keep both")


@contextmanager
def _stdin_once(job: FileJob) -> Iterator[FileJob]:
    """DATA ``-``: stdin copied once for every judge (each judge's run reads its data anew, and
    the second would find stdin spent: no rows); the copy is removed when the panel ends. The
    judges' resume holds across runs: it keys on the rows, not on the data's path."""
    if job.data != "-":
        yield job
        return
    from grader.io.dataset import _spool_stdin

    spool = _spool_stdin()
    try:
        yield dataclasses.replace(job, data=spool)
    finally:
        Path(spool).unlink(missing_ok=True)


def _run_judge(request: GradeRequest, job: FileJob, judge: PanelJudge, index: int, name: str,
               make_executor: Callable[[], Executor | None] | None,
               backend_factory: Callable[..., Backend] | None) -> Summary:
    executor = make_executor() if make_executor else None
    try:
        own = dataclasses.replace(job, output=judge_results(job.output, index))
        return run_grade(judge_request(request, judge, index), own, executor,
                         backend_factory=backend_factory)
    except Interrupted:
        raise
    except GraderError as exc:
        earlier = "judge-1's results are" if index == 1 else f"judges 1 to {index}'s results are"
        kept = (f"; {earlier} saved beside the output and the same command resumes with "
                f"{name}") if index else ""
        raise PanelJudgeError(f"panel {name} ({judge.model}): {exc}{kept}", exc.exit_code) from None


def pool(rows: Iterable[Sequence[Record]], names: list[str]) -> tuple[list[Record], Agreement]:
    """Each row's records, one per judge, pooled into one (:func:`pool_row`), and the judges'
    agreement over them: a file panel's and one in memory alike."""
    agreement, pooled = Agreement(names), []
    for records in rows:
        pooled.append(pool_row(records, names))
        agreement.add(records, pooled[-1])
    return pooled, agreement


def _pool(request: GradeRequest, job: FileJob, names: list[str], runs: list[dict[str, Any]],
          started: str, check: JudgeCheck | None = None) -> Summary:
    paths = [Path(run["results"]) for run in runs]
    writer = ResultsWriter(job.output)
    try:
        streams = [read_records(path) for path in paths]
        pooled_records, agreement = pool(
            ([record for _, record in rows] for rows in zip(*streams, strict=False)), names)
        writer.write(pooled_records)
        if len({sum(1 for _ in read_records(path)) for path in paths}) > 1:
            raise PanelError("the judges' results files hold different numbers of rows: "
                             + ", ".join(str(p) for p in paths))
        stage = _stage(request)
        run = RunManifest(started=started, data=job.data, results=str(job.output),
                          rows=len(pooled_records), panel=runs,
                          entries={f"{stage.name}_file": stage.files.given_file(request)
                                   or str(stage.beside(paths[0]))})
        summary = summarize(pooled_records, run=run)
        if check is not None:
            summary.judge_check = check
        summary.panel = agreement.result()
        run.finished = now()
        write_summary(summary_path(job.output), summary)
    except BaseException:
        writer.abort()
        raise
    writer.commit()
    return summary


class MemoryPanel:
    """A judge panel over rows held in memory (``grader.Grader([A, B, ...])``): each judge an
    in-memory core (:class:`grader.run.core.LoadedJudge`, kept for the next calls), given what
    the first judge's stage made, the records pooled as a file panel pools them. No file.

    Args:
        make_executor: a new executor for each judge.
    """

    def __init__(self, request: GradeRequest, judges: Sequence[PanelJudge],
                 make_executor: Callable[[], Executor]) -> None:
        check_panel(request, judges)
        self.request, self.judges, self.make_executor = request, list(judges), make_executor
        self.names = [f"judge-{index + 1}" for index in range(len(judges))]
        self.cores: list[LoadedJudge | None] = [None] * len(judges)
        #: the last call's agreement (a file panel's summary ``panel``)
        self.agreement: PanelAgreement | None = None
        #: the last call's judge check: the first judge's controls (:func:`panel_check`)
        self.judge_check: JudgeCheck | None = None

    @property
    def prepared_lines(self) -> Mapping[str, Any]:
        """What the panel's judges are given: what the first judge's stage made."""
        first = self.cores[0]
        return first.prepared_lines if first is not None else {}

    def _core(self, index: int) -> LoadedJudge:
        core = self.cores[index]
        if core is None:
            core = self.cores[index] = LoadedJudge.open(
                judge_request(self.request, self.judges[index], index), self.make_executor())
        return core

    def grade(self, dataset: Dataset) -> list[Record]:
        """Each judge's records of ``dataset``'s rows, pooled row by row."""
        graded = []
        for index, name in enumerate(self.names):
            given = None
            if index:  # what the first judge made (with the request's file: its lines over them)
                given = {**self.prepared_lines, **_stage(self.request).files.given_lines(self.request)}
            try:
                core = self._core(index)
                graded.append(core.grade(dataset, given=given, controls=core.plan.request.controls))
            except GraderError as exc:
                raise PanelJudgeError(f"panel {name} ({self.judges[index].model}): {exc}",
                                      exc.exit_code) from None
        pooled, agreement = pool(zip(*graded, strict=True), self.names)
        self.agreement = agreement.result()
        first = self.cores[0]
        self.judge_check = panel_check(first.judge_check if first is not None else None,
                                       self.names[0], self.judges[0].model)
        return pooled

    def close(self) -> None:
        """Stop every judge's engine."""
        for index, core in enumerate(self.cores):
            if core is not None:
                self.cores[index] = None
                core.executor.close()
