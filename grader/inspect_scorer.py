"""grader's judge as an inspect_ai scorer: ``grader/reference_judge``.

    inspect score LOG.eval --scorer grader/reference_judge -S model=DIR --action append
    Task(..., scorer=grader_scorer(model=DIR, max_tokens=64))

Registered through inspect_ai's entry point (:mod:`grader._registry`); its settings are
``grader grade``'s, checked when the scorer is made. Scores are grader's records as inspect's
``Score`` (:func:`grader.inspect_log.score_of`): a row grader cannot grade is unscored.

inspect scores samples concurrently; a process's samples hand their rows to one
:class:`_Batcher` per judge and settings, which grades every row waiting as one
``Grader.grade`` call on one loaded model. The judge check runs once, over every row the scorer
graded, when inspect computes the metrics (:func:`grader.inspect_log.judge_check`).

inspect_ai is imported here, never by ``import grader``.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from inspect_ai.scorer import Score, Scorer, Target, mean, scorer, stderr
from inspect_ai.solver import TaskState

from grader.analysis.verdict import JudgeCheck
from grader.api import Grader, log_judge_check
from grader.config import GradeSettings
from grader.inspect_log import CHECKS, judge_check, score_of
from grader.io.dataset import Dataset
from grader.records import Record
from grader.run.request import OptionError

# How long the batcher waits for more rows after the last one came (a burst becomes one engine
# call), and at most after the first (a steady trickle still gets graded).
QUIET_S = 0.05
MAX_WAIT_S = 1.0


def sample_row(state: TaskState, target: Target) -> dict[str, Any]:
    """A sample's row as grader reads it from a log (grader.io.foreign): a chat input as
    ``role: text`` paragraphs (a lone user message as its text), several targets as a list."""
    given = state.input
    if isinstance(given, str):
        text = given
    elif len(given) == 1 and given[0].role == "user":
        text = given[0].text
    else:
        text = "\n\n".join(f"{message.role}: {message.text}" for message in given)
    targets = list(target.target)
    return {"input": text, "reference": targets[0] if len(targets) == 1 else targets,
            "output_text": state.output.completion}


class _InspectGrader(Grader):
    """A :class:`grader.Grader` that can also check its judge alone, on rows it graded before."""

    def check(self, rows: list[dict[str, Any]], count: int) -> JudgeCheck | None:
        """The judge check on up to ``count`` references of ``rows``, graded by the loaded model
        as a run grades its controls; None if nothing was graded yet."""
        engines = self._engines
        with engines.turn:
            core = engines.core
            if core is None or not rows or count <= 0:
                return None
            request = engines.request
            return core.check(Dataset.of_rows(rows, name="inspect", mapping=request.mapping,
                                              id_column=request.id_column), count)


@dataclass
class _Job:
    row: dict[str, Any]
    future: Future[Record] = field(default_factory=Future)


class _Batcher:
    """One judge model for a process: rows from any number of concurrent samples, graded in
    batches by one thread (``Grader.grade`` is one call at a time)."""

    def __init__(self, judge: _InspectGrader) -> None:
        self.judge = judge
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self._ids = itertools.count(1)
        #: engine calls made and rows graded (docs/benchmarks.md counts them)
        self.calls = self.rows = 0

    def submit(self, row: dict[str, Any]) -> Future[Record]:
        # an id per row: a batch may hold two tasks' samples with the same id
        job = _Job({**row, "id": str(next(self._ids))})
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="grader-inspect",
                                                daemon=True)
                self._thread.start()
        self._queue.put(job)
        return job.future

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, stop = self._gather(first)
            self._grade(batch)
            if stop:
                return

    def _gather(self, first: _Job) -> tuple[list[_Job], bool]:
        """``first`` and every row that follows it within QUIET_S of the last (MAX_WAIT_S in
        all); True where the batcher was closed meanwhile."""
        batch, deadline = [first], time.monotonic() + MAX_WAIT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return batch, False
            try:
                job = self._queue.get(timeout=min(QUIET_S, left))
            except queue.Empty:
                return batch, False
            if job is None:
                return batch, True
            batch.append(job)

    def _grade(self, batch: list[_Job]) -> None:
        try:
            records = self.judge.grade([job.row for job in batch])
        except BaseException as exc:  # the samples' scorers raise it (inspect: a sample error)
            for job in batch:
                job.future.set_exception(exc)
            return
        self.calls, self.rows = self.calls + 1, self.rows + len(batch)
        for job, record in zip(batch, records, strict=True):
            job.future.set_result(record)

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        self.judge.close()


# One loaded judge per model and settings in this process, shared by scorers, closed at exit.
_BATCHERS: dict[str, _Batcher] = {}
_BATCHERS_LOCK = threading.Lock()


def _close_all() -> None:
    with _BATCHERS_LOCK:
        batchers = list(_BATCHERS.values())
        _BATCHERS.clear()
    for batcher in batchers:
        batcher.close()


atexit.register(_close_all)


def _batcher(model: str | None, settings: dict[str, Any]) -> _Batcher:
    """The process's batcher for ``model`` and ``settings``, made (settings checked, nothing
    loaded) on the first call."""
    key = json.dumps({"model": model, **settings}, sort_keys=True, default=str)
    with _BATCHERS_LOCK:
        batcher = _BATCHERS.get(key)
        if batcher is None:
            # controls: none per batch; the judge_check metric runs them once over every row
            judge = _InspectGrader(model, **{**settings, "controls": 0})
            batcher = _BATCHERS[key] = _Batcher(judge)
        return batcher


def _settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """``-S NAME=VALUE`` options as grade settings (``max-tokens`` or ``max_tokens``); those a
    scorer cannot take are an OptionError (the Grader checks the rest)."""
    settings = {name.replace("-", "_"): value for name, value in options.items()}
    if settings.get("format") == "pairwise":
        raise OptionError("format: pairwise judges two answers side by side; an inspect sample "
                          "has one (grader grade --pair)")
    for name in ("limit", "ray", "data_parallel"):
        if settings.get(name) is not None:
            raise OptionError(f"{name}: a file run's setting (grader grade "
                              f"--{name.replace('_', '-')}): the scorer grades every sample "
                              "inspect gives it on one model")
    return settings


@dataclass
class _Run:
    """One scorer made by inspect (one task's scorer): the rows it graded, its check."""

    batcher: _Batcher
    controls: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _check: JudgeCheck | None = None
    _checked: int = -1

    def check(self) -> JudgeCheck | None:
        """The judge check on this run's rows (once per number of rows: inspect computes
        metrics again per reducer)."""
        with self.lock:
            rows = list(self.rows)
        if self._checked != len(rows):
            self._check = self.batcher.judge.check(rows, self.controls)
            self._checked = len(rows)
            if self._check is not None:
                log_judge_check(self._check)
        return self._check


@scorer(metrics=[mean(), stderr(), judge_check()], name="reference_judge")
def reference_judge(model: str | None = None, **settings: Any) -> Scorer:
    """grader's judge as an inspect_ai scorer: the sample's completion graded against its
    target by the judge model in ``model`` (a local directory; never downloaded).

    Args:
        model: the judge's model directory (``-S model=DIR``).
        settings: ``grader grade``'s settings, underscores or dashes (``max_tokens=64``,
            ``backend="transformers"``, ``format="itemized"``, ``controls=20``), checked now.
    """
    checked = _settings(settings)
    controls = checked.pop("controls", None)
    if controls is None:
        controls = GradeSettings.model_fields["controls"].default
    elif type(controls) is not int or controls < 0:
        raise OptionError(f"controls: expected a number of references (0 or more), got "
                          f"{controls!r}")
    batcher = _batcher(model, checked)
    run = _Run(batcher, controls)
    name = uuid.uuid4().hex
    CHECKS[name] = run.check

    async def score(state: TaskState, target: Target) -> Score:
        row = sample_row(state, target)
        with run.lock:
            run.rows.append({**row, "id": str(len(run.rows) + 1)})
        record = await _wait(batcher.submit(row))
        return score_of(record, name)

    return score


#: ``Task(scorer=grader_scorer(model=DIR))``: the same scorer by the name Python users look for.
grader_scorer = reference_judge


async def _wait(future: Future[Record]) -> Record:
    """The batcher's answer, awaited without a thread per sample under asyncio (inspect's
    default); under trio, in a worker thread."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        import anyio

        return await anyio.to_thread.run_sync(future.result)
    return await asyncio.wrap_future(future, loop=loop)
