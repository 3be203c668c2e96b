"""Several engines on one machine: ``--data-parallel N``.

N worker processes, each pinned to its own GPUs (``CUDA_VISIBLE_DEVICES``; tensor parallel
inside each), grade disjoint shards of the rows (row i goes to shard i mod N). Each shard is an
ordinary resumable run with its own results file under ``RESULTS.shards/``, so a rerun of the
same command resumes every shard; the parent merges them back into input order.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from queue import Empty
from typing import Any

from grader.io.dataset import Dataset, DatasetError
from grader.io.lock import OutputLock
from grader.io.manifest import now, run_manifest
from grader.run.request import GradeRequest, Interrupted, judge_for
from grader.run.grading import check_not_input
from grader.run.rows import prepare_jobs
from grader.analysis.summary import summarize
from grader.io.results import read_summary, summary_path, write_summary


class ShardFailed(RuntimeError):
    """A worker did not finish its shard; the message says which and how."""

    def __init__(self, message: str, *, interrupted: bool = False):
        super().__init__(message)
        self.interrupted = interrupted


def shard_path(output: Path, k: int, n: int) -> Path:
    return output.with_name(output.name + ".shards") / f"shard-{k}-of-{n}.jsonl"


def gpu_groups(n: int, per_worker: int) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES of each worker, or None each without CUDA."""
    import torch  # the parent must know the GPUs to split them

    if not torch.cuda.is_available():
        return [None] * n
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if n * per_worker > len(devices):
        raise ShardFailed(
            f"--data-parallel {n} x {per_worker} GPU(s) each needs {n * per_worker} GPUs; "
            f"{len(devices)} are visible"
        )
    return [",".join(devices[k * per_worker : (k + 1) * per_worker]) for k in range(n)]


def cpu_groups(n: int) -> list[str]:
    """The CPUs of each worker on a machine without CUDA: the allowed CPUs cut into n runs.

    vLLM's CPU build binds its OpenMP threads by VLLM_CPU_OMP_THREADS_BIND; left at "auto",
    every worker binds the same cores of the NUMA node (and vLLM 0.32.0 reserves one of them
    for the frontend), so N workers on 2 cores all ran on core 0. With fewer CPUs than
    workers, workers share CPUs round-robin.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if n >= len(cpus):
        return [str(cpus[k % len(cpus)]) for k in range(n)]
    size = len(cpus) // n
    return [",".join(map(str, cpus[k * size : (k + 1) * size])) for k in range(n)]


def worker_environments(n: int, per_worker: int, backend: str) -> list[dict[str, str]]:
    """What each worker sets before it imports torch: its GPUs, or on CPU its cores."""
    gpus = gpu_groups(n, per_worker)
    if gpus[0] is not None:
        return [{"CUDA_VISIBLE_DEVICES": group} for group in gpus]  # type: ignore[dict-item]
    if backend != "vllm":
        return [{} for _ in range(n)]
    return [{"VLLM_CPU_OMP_THREADS_BIND": group} for group in cpu_groups(n)]


def _worker(request: GradeRequest, environment: dict[str, str], queue: Any) -> None:
    # Before anything imports torch in this fresh (spawned) process. A setting the user gave
    # in the environment (VLLM_CPU_OMP_THREADS_BIND=...) stands.
    for name, value in environment.items():
        if name == "CUDA_VISIBLE_DEVICES" or name not in os.environ:
            os.environ[name] = value
    from grader.run.grading import run_grade

    try:
        run_grade(request)
        queue.put((request.shard, None))
    except Interrupted as exc:
        queue.put((request.shard, str(exc)))
    except BaseException as exc:  # reported by the parent, one line per shard
        queue.put((request.shard, f"{type(exc).__name__}: {exc}"))


def run_grade_parallel(request: GradeRequest, workers: int) -> dict[str, Any]:
    """Grade with ``workers`` engine processes and merge their shards in input order.

    This process holds the lock on the results file; each worker locks its own shard's.
    """
    started = now()
    with OutputLock(request.output):
        judge = judge_for(request)
        check_not_input(request.data, request.output)
        # The whole file is checked here, once: duplicate ids across shards, templates, bad rows.
        with Dataset(
            request.data, mapping=request.mapping, id_column=request.id_column, limit=request.limit
        ) as dataset:
            total = 0
            for item in dataset:
                prepare_jobs(dataset.name, [item], judge)
                total += 1
            dataset.check_unique_ids()
            # stdin was spooled: the workers read the same copy, removed once they are done
            shards = _run_shards(request, workers, dataset.path)
        return _merge(request, shards, total, started)


def _run_shards(request: GradeRequest, workers: int, data: str) -> list[GradeRequest]:
    """Start one worker per shard and wait for all; :class:`ShardFailed` if any did not finish."""
    # `auto` is resolved here, before the GPUs are split: with vLLM each worker needs
    # --tensor-parallel-size of them, and every worker must run the same engine.
    if request.backend == "auto":
        from grader.backends import choose_backend

        backend, reason = choose_backend("auto")
        print(f"backend: {backend} ({reason})", file=sys.stderr)
        request = replace(request, backend=backend)
    per_worker = request.vllm.tensor_parallel_size if request.backend == "vllm" else 1
    groups = worker_environments(workers, per_worker, request.backend)
    context = multiprocessing.get_context("spawn")  # CUDA does not survive fork
    queue = context.Queue()
    shards = [
        replace(request, data=data, shard=(k, workers), output=shard_path(request.output, k, workers))
        for k in range(workers)
    ]
    processes = [
        context.Process(target=_worker, args=(shard, groups[k], queue), name=f"grader-shard-{k}")
        for k, shard in enumerate(shards)
    ]
    for process in processes:
        process.start()
    # A Ctrl-C reaches every worker too: each finishes its chunk and reports; the parent waits.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        outcomes = _outcomes(processes, queue)
    finally:
        signal.signal(signal.SIGINT, previous)
    failed = {k: e for k, e in outcomes.items() if e is not None}
    if failed:
        listed = "; ".join(f"shard {k}: {e}" for k, e in sorted(failed.items()))
        raise ShardFailed(
            f"{len(failed)} of {workers} shards did not finish ({listed}); "
            "run the same command again to resume them",
            interrupted=all(e.startswith("interrupted") for e in failed.values()),
        )
    return shards


def _outcomes(processes: list[Any], queue: Any) -> dict[int, str | None]:
    """Each worker's report (None: its shard is done), waiting for all of them.

    A worker that dies without a report (killed, out of memory, a crash in native code) is
    reported by its exit code: waiting on the queue alone would wait for it forever.
    """
    outcomes: dict[int, str | None] = {}
    while len(outcomes) < len(processes):
        try:
            shard, error = queue.get(timeout=1.0)
            outcomes[shard[0]] = error
            continue
        except Empty:
            pass
        dead = [k for k, p in enumerate(processes) if k not in outcomes and not p.is_alive()]
        if not dead:
            continue
        # A worker flushes its report before it exits: whatever it sent is readable by now.
        try:
            while True:
                shard, error = queue.get(timeout=0.5)
                outcomes[shard[0]] = error
        except Empty:
            pass
        for k in dead:
            if k not in outcomes:
                code = processes[k].exitcode
                how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                outcomes[k] = f"the worker died without a report ({how})"
    for process in processes:
        process.join()
    return outcomes


def _merge(
    request: GradeRequest, shards: list[GradeRequest], total: int, started: str
) -> dict[str, Any]:
    """The shards' records in input order into the results file, and the run's summary."""
    workers = len(shards)
    shard_runs = []
    for shard in shards:
        summary = read_summary(shard.output)
        shard_runs.append((summary or {}).get("run") or {})
    # Every shard ran the same judge: the first one's manifest says which, for the whole run.
    first = shard_runs[0]
    run = run_manifest(
        started=started,
        data=request.data,
        results=str(request.output),
        rows=total,
        resumed_rows=sum(r.get("resumed_rows") or 0 for r in shard_runs),
        judge=first,
        engine=first.get("engine"),
        token_budget=first.get("token_budget"),
        data_parallel=workers,
        shards=shard_runs,
    )

    # Row i is row i // n of shard i % n: a round-robin read restores input order.
    readers = [open(shard.output, "rb") for shard in shards]
    partial = request.output.with_name(request.output.name + ".tmp")

    def merged():
        with open(partial, "wb") as stream:
            for i in range(total):
                line = readers[i % workers].readline()
                if not line.endswith(b"\n"):
                    raise DatasetError(request.data, None, "changed while it was being graded")
                stream.write(line)
                yield json.loads(line)
            if any(reader.readline() for reader in readers):  # more rows than were checked
                raise DatasetError(request.data, None, "changed while it was being graded")
            stream.flush()
            os.fsync(stream.fileno())

    try:
        summary = summarize(merged(), run=run)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    finally:
        for reader in readers:
            reader.close()
    os.replace(partial, request.output)
    summary["run"]["finished"] = now()
    write_summary(summary_path(request.output), summary)
    return summary
