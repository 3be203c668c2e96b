"""grade: read, render, resume, grade through an executor, write; one ``run_grade`` for a local
run, ``--data-parallel`` and ``--ray``."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import sys
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from grader.analysis.summary import summarize
from grader.backends import Backend
from grader.config import answer_settings
from grader.io.dataset import Dataset, DatasetError, Item
from grader.io.lock import OutputLock
from grader.io.manifest import model_fingerprint, model_identity, now, run_manifest, sha256_json
from grader.io.results import ResultsLog, SummaryError, read_summary, summary_path, write_summary
from grader.judge.judges import Judge
from grader.judge.records import AGGREGATES, Record
from grader.run.executor import Executor, LocalExecutor, Pending
from grader.run.request import GradeRequest, Interrupted, judge_for
from grader.run.rows import Job, backend_config, prepare_jobs


class _FinishChunkOnInterrupt:
    """The first Ctrl-C asks the run to stop after the chunk in flight; a second stops at once."""

    def __enter__(self) -> _FinishChunkOnInterrupt:
        self.requested = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\ninterrupt: finishing the current chunk, then stopping (Ctrl-C again to stop now)",
            file=sys.stderr,
        )

    def __exit__(self, *exc_info: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _progress(total: int, initial: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total, initial=initial, unit="row", desc="grading", file=sys.stderr, dynamic_ncols=True
    )


def _model_key(model: str) -> dict[str, Any]:
    """The model's part of the resume key: what it is, not where it lies or when it was copied."""
    try:
        identity = model_identity(model)
    except OSError:
        return {"model": model}
    return model_fingerprint(identity)


def run_grade(
    request: GradeRequest,
    executor: Executor | None = None,
    *,
    backend_factory: Callable[..., Backend] | None = None,
) -> dict[str, Any]:
    """Read, render, grade and write, resuming what an earlier run of the same job finished.

    The dataset is streamed twice and never held whole: a first pass validates and renders
    every row (bad input fails before any model work) and counts the rows left to grade (the
    model loads only if there are any); a second grades them block by block. Memory stays
    flat in the number of rows: 9 bytes a row say where each record lies in the log.

    Args:
        executor: where the rows are graded (:mod:`grader.run.executor`); default a
            :class:`LocalExecutor`. Everything else, resume included, is the same for each.
        backend_factory: the default executor's backend loader (tests pass a fake).

    Returns the summary (also written beside the results). Raises :class:`Interrupted` after
    a Ctrl-C, once the chunk in flight is saved.
    """
    started = now()
    if request.aggregate not in AGGREGATES:
        raise ValueError(f"unknown aggregate {request.aggregate!r}: choose from {AGGREGATES}")
    # Taken before anything is read or written: a second run on the same output stops here.
    with OutputLock(request.output), contextlib.ExitStack() as opened:
        executor = executor or LocalExecutor(backend_factory)
        return _run_grade(request, started, opened, executor)


def _run_grade(
    request: GradeRequest,
    started: str,
    opened: contextlib.ExitStack,
    executor: Executor,
) -> dict[str, Any]:
    """run_grade's work, under the output's lock; ``opened`` closes the dataset and the
    executor."""
    judge = judge_for(request)
    check_not_input(request.data, request.output)
    dataset = opened.enter_context(
        Dataset(
            request.data,
            mapping=request.mapping,
            id_column=request.id_column,
            limit=request.limit,
        )
    )

    # closed however the run ends: a bad row found below must not leave a cluster open
    opened.callback(executor.close)
    executor.open()
    max_tokens = request.sampling.max_tokens or judge.max_tokens
    backend_name, reason = request.backend, None
    if backend_name == "auto":
        backend_name, reason = executor.choose_backend("auto")
    run_key = _run_key(request, backend_name, judge.schema, max_tokens, judge.answer_format)

    def key(job: Job) -> str:
        return sha256_json([job.item.id, job.messages, run_key])

    started_engine = False

    def start_engine() -> None:
        nonlocal started_engine
        if not started_engine:  # a backend that fails to load leaves no file behind
            if reason:
                print(f"backend: {backend_name} ({reason})", file=sys.stderr)
            executor.start(request, backend_name, judge, max_tokens)
            started_engine = True

    rubric: dict[str, Any] | None = None
    if judge.answer_format == "rubric":  # every reference's rubric, before any row is rendered
        from grader.run.rubric_pass import prepare_rubrics

        rubric = prepare_rubrics(request, dataset, judge, executor, start_engine)  # type: ignore[arg-type]
    log = ResultsLog(request.output, overwrite=request.overwrite)
    # Pass 1: every row validated and rendered before any model work; what is left to grade.
    total = to_grade = 0
    resuming = log.resumable > 0  # a fresh run needs no keys until it writes
    for item in dataset:
        job = prepare_jobs(dataset.name, [item], judge)[0]
        total += 1
        to_grade += job.messages is not None and not (resuming and log.lookup(key(job)))
    dataset.check_unique_ids()

    if to_grade:  # nothing is written yet
        start_engine()
    chunk_size = executor.chunk_size if started_engine else (request.chunk_size or 1024)

    # Pass 2: blocks of rows; resumed and unsent rows are placed here, the rest go to the executor.
    places = _Places(log, total)

    def pending_blocks() -> Iterator[Pending]:
        seen = 0
        for block in _blocks(dataset, chunk_size):
            unsent: list[tuple[int, Record]] = []
            pending: Pending = []
            seen += len(block)
            if seen > total:
                raise DatasetError(dataset.name, None, "changed while it was being graded")
            for job in prepare_jobs(dataset.name, block, judge):
                job_key, position = key(job), job.item.index
                earlier = log.lookup(job_key)
                if earlier is not None:
                    places.resumed(position, earlier)
                elif job.messages is None:
                    unsent.append((position, judge.unsent(job.item) | {"key": job_key}))
                else:
                    pending.append((job, job_key))
            places.write(unsent)
            if pending and not started_engine:
                # rows the first pass did not see: what is graded so far stays for a rerun
                raise DatasetError(dataset.name, None, "changed while it was being graded")
            yield pending
        if seen != total:  # rows gone since the first pass: their places would stay empty
            raise DatasetError(dataset.name, None, "changed while it was being graded")

    try:
        with _FinishChunkOnInterrupt() as interrupt, _progress(total, 0) as places.bar:
            if not started_engine:
                for _ in pending_blocks():
                    pass
            else:
                for graded in executor.grade(pending_blocks()):
                    places.write(graded)
                    if interrupt.requested and places.done < total:
                        raise Interrupted(places.done, total, log.partial)
    finally:
        log.close()

    about = executor.describe()
    if not started_engine:
        # Every row was resumed: what graded them is in the summary of the run that did.
        earlier_run = _earlier_run(request.output, run_key)
        about |= {"engine": earlier_run.get("engine"), "token_budget": earlier_run.get("token_budget")}
    run = run_manifest(
        started=started,
        data=request.data,
        results=str(request.output),
        rows=total,
        resumed_rows=places.resumed_rows,
        judge=_judge_manifest(request, judge, backend_name, max_tokens, run_key),
        **about,
        **({"rubric": rubric} if rubric is not None else {}),
    )
    # The results file is written in input order while the summary reads it.
    summary = summarize(log.finish(places.locations()), run=run)
    summary["run"]["finished"] = now()
    write_summary(summary_path(request.output), summary)
    return summary


class _Places:
    """Where each row's record lies in the results log, by row position (9 bytes a row), and
    how many rows are done."""

    def __init__(self, log: ResultsLog, total: int) -> None:
        self.log = log
        self.sources, self.offsets = array("b", [-1]) * total, array("q", [0]) * total
        self.done = self.resumed_rows = 0
        self.bar: Any = None

    def write(self, records: list[tuple[int, Record]]) -> None:
        if not records:  # a write is a flush and an fsync: none for nothing
            return
        for (position, _), location in zip(records, self.log.write(r for _, r in records)):
            self.sources[position], self.offsets[position] = location
        self.done += len(records)
        self.bar.update(len(records))

    def resumed(self, position: int, location: tuple[int, int]) -> None:
        self.sources[position], self.offsets[position] = location
        self.resumed_rows += 1
        self.done += 1
        self.bar.update(1)

    def locations(self) -> Iterator[tuple[int, int]]:
        return zip(self.sources, self.offsets)


def _judge_manifest(
    request: GradeRequest, judge: Judge, backend_name: str, max_tokens: int, run_key: str
) -> dict[str, Any]:
    """What graded the rows: judge, prompt, schema, model, sampling, backend."""
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
        "model": {"name": request.model, **_model_manifest(request.model)},
        "sampling": request.sampling.model_dump() | {"max_tokens": max_tokens},
        "backend": backend_name,
        "run_key": run_key,
    }


def _run_key(request: GradeRequest, backend_name: str, schema: dict[str, Any], max_tokens: int,
             answer_format: str | None = None) -> str:
    """Everything that changes an answer is in the key: a changed prompt, model, sampling,
    schema or engine setting re-grades the affected rows on resume; batch sizes do not."""
    return sha256_json(
        {
            "model": _model_key(request.model),
            "backend": backend_name,
            "sampling": request.sampling.model_dump() | {"max_tokens": max_tokens},
            "schema": sha256_json(schema),
            "settings": answer_settings(backend_name, backend_config(request, backend_name)),
            "truncate": sorted(request.truncate),
            "aggregate": request.aggregate if request.sampling.n > 1 else None,
            # a results file graded in another format is re-graded, never mixed in
            **({"format": answer_format} if answer_format == "rubric" else {}),
        }
    )


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


def _model_manifest(model: str) -> dict[str, Any]:
    try:
        return model_identity(model)
    except OSError as exc:
        return {"error": str(exc)}
