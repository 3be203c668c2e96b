"""Several engines on one machine: ``--data-parallel N``, an executor for :func:`run_grade`.

N worker processes, each pinned to its own GPUs (``CUDA_VISIBLE_DEVICES``; tensor parallel
inside each) or, for vLLM on CPU, its own cores, load the backend once and grade blocks of rows
from one task queue. This process does everything else, as a local run does: it reads,
validates and renders every row, resumes what an earlier run finished and writes each block's
records to the one resumable log as it comes back. A worker that fails or dies stops the run
with one line naming it; what was written stays, and the same command resumes the rest.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import wait
from queue import Empty
from typing import Any

from grader.backends import Backend, backend_class
from grader.errors import EXIT_ENGINE, GraderError, one_line
from grader.run.ahead import Watch
from grader.run.executor import Graded, GradeWorker, Pending
from grader.run.request import RunPlan

BLOCKS_PER_WORKER = 2  # in flight at once: one graded while the next waits, and memory stays flat
STOP_TIMEOUT_S = 60.0  # for idle workers to close their engines (vLLM's shutdown takes seconds)
KILL_TIMEOUT_S = 10.0  # after SIGTERM, before SIGKILL
ORPHAN_CHECK_S = 5.0  # how often an idle worker checks that its parent is still there


class DataParallelError(GraderError, RuntimeError):
    """The workers cannot run this job, or one of them failed; the message says which."""

    exit_code = EXIT_ENGINE


def gpu_groups(n: int, per_worker: int) -> list[str | None]:
    """The CUDA_VISIBLE_DEVICES of each worker, or None each without CUDA."""
    import torch  # the parent must know the GPUs to split them

    if not torch.cuda.is_available():
        return [None] * n
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if n * per_worker > len(devices):
        raise DataParallelError(f"--data-parallel {n} x {per_worker} GPU(s) each needs "
                                f"{n * per_worker} GPUs; {len(devices)} are visible")
    return [",".join(devices[k * per_worker : (k + 1) * per_worker]) for k in range(n)]


def cpu_groups(n: int) -> list[str]:
    """The CPUs of each worker on a machine without CUDA: the allowed CPUs cut into n runs,
    for a backend that binds its threads to keep to (:meth:`Backend.worker_environment`: vLLM's
    CPU build). With fewer CPUs than workers, workers share CPUs round-robin.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if n >= len(cpus):
        return [str(cpus[k % len(cpus)]) for k in range(n)]
    size = len(cpus) // n
    return [",".join(map(str, cpus[k * size : (k + 1) * size])) for k in range(n)]


def worker_environments(n: int, per_worker: int, backend: str | type[Backend]
                        ) -> list[dict[str, str]]:
    """What each worker sets before it imports torch: its GPUs, or on CPU what its backend
    sets to keep to its cores (:meth:`Backend.worker_environment`).

    The GPUs are always split; what the backend sets on CPU, it says (a setting the user gave
    in the environment may stand).
    """
    gpus = gpu_groups(n, per_worker)
    if gpus[0] is not None:
        return [{"CUDA_VISIBLE_DEVICES": group} for group in gpus if group is not None]
    declared = backend_class(backend) if isinstance(backend, str) else backend
    return [declared.worker_environment(group) for group in cpu_groups(n)]


def _declared(name: str) -> type[Backend]:
    """The class of the backend called ``name``, for what it declares of itself; the base's
    defaults for a name no registry holds (a test's factory makes such backends)."""
    try:
        return backend_class(name)
    except ValueError:
        return Backend


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _serve(k: int, plan: RunPlan, worker: WorkerPipes) -> None:
    """Worker ``k``: load the plan's backend, report it, then grade blocks until None."""
    os.environ.update(worker.environment)  # before anything imports torch in this spawned process
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it stops the run
    signal.signal(signal.SIGTERM, _raise_exit)  # close() on a failure: the engine is shut down
    if worker.log_level:  # a spawned process starts without the parent's log handlers
        logging.getLogger("grader").setLevel(worker.log_level)
        logging.getLogger("grader").addHandler(logging.StreamHandler(sys.stderr))
    grader = None
    code = 0
    try:
        grader = GradeWorker(plan, worker.backend_factory)
        worker.report.send(("ready", (grader.describe(), grader.backend.chunk_size)))
        while (pending := _next_task(worker)) is not None:
            worker.report.send(("graded", grader.grade(pending)))
    except Exception as exc:
        code = 1
        with contextlib.suppress(OSError):  # the parent may be gone
            worker.report.send(("failed", one_line(exc, named=True)))
    finally:
        if grader is not None:
            with contextlib.suppress(Exception):
                grader.close()
        worker.report.close()
    sys.exit(code)  # reached after a failure: the exit code says so too


@dataclass
class WorkerPipes:
    """What a worker process is handed besides the plan: its environment, the backend loader
    (tests pass a fake), the task queue, its report pipe, its parent's pid and the level its
    parent shows grader's log at (0: not configured)."""

    environment: dict[str, str]
    backend_factory: Callable[..., Backend] | None
    tasks: Any
    report: Any
    parent: int
    log_level: int


def _next_task(worker: WorkerPipes) -> Pending | None:
    """The next block, or None: told to stop, or the parent was killed (free the GPU)."""
    while True:
        try:
            task: Pending | None = worker.tasks.get(timeout=ORPHAN_CHECK_S)
            return task
        except Empty:
            if os.getppid() != worker.parent:
                return None


class DataParallelExecutor:
    """``workers`` engine processes on this machine, fed blocks of rows from one task queue.

    Args:
        workers: engine processes, each with its own GPU(s) (``--tensor-parallel-size`` each
            for vLLM) or, for vLLM on CPU, its own cores.
        backend_factory: replaces :func:`grader.backends.load_backend` in each worker (tests
            pass a fake); it is pickled by name, so a module-level function.
    """

    def __init__(self, workers: int, backend_factory: Callable[..., Backend] | None = None) -> None:
        self.workers = workers
        self.backend_factory = backend_factory
        self.chunk_size = 0
        self.environments: list[dict[str, str]] | None = None
        self.about: dict[str, object] = {}
        self._processes: list[Any] = []
        self._reports: list[Any] = []
        self._tasks: Any = None
        self._inbox: deque[tuple[int, str, Any]] = deque()
        self._ready: set[int] = set()
        self._in_flight = 0

    def open(self) -> None:
        pass

    def choose_backend(self, name: str) -> tuple[str, str | None]:
        # resolved here, before start() splits the GPUs: with vLLM each worker needs
        # --tensor-parallel-size of them, and every worker must run the same engine
        from grader.backends import choose_backend

        return choose_backend(name)

    def start(self, plan: RunPlan) -> None:
        """Start the workers and wait until each has loaded its backend."""
        request, backend_name = plan.request, plan.backend
        declared = _declared(backend_name)
        settings = request.settings_for(backend_name) or declared.settings()
        # the GPUs one copy of the backend holds (vLLM's --tensor-parallel-size), else one each
        per_worker = int(declared.resources(settings, gpus=1).get("GPU", 0)) or 1
        # before any process starts: too few GPUs is one line, and nothing to stop
        self.environments = worker_environments(self.workers, per_worker, declared)
        context = multiprocessing.get_context("spawn")  # CUDA does not survive fork
        self._tasks = context.Queue()
        for k, environment in enumerate(self.environments):
            # one pipe per worker: a send is written before it returns (a queue's feeder
            # thread may not be, when the worker dies next), and a dead worker's pipe ends
            receive, send = context.Pipe(duplex=False)
            process = context.Process(
                target=_serve, name=f"grader-worker-{k}",
                args=(k, plan, WorkerPipes(environment, self.backend_factory, self._tasks, send,
                                           os.getpid(), logging.getLogger("grader").level)))
            self._processes.append(process)
            self._reports.append(receive)
            process.start()
            send.close()  # the worker's end: only the worker holds it now
        while len(self._ready) < self.workers:
            k, kind, ready = self._next_report()
            if kind != "ready":  # nothing is sent to grade before every worker is ready
                raise DataParallelError(f"data-parallel worker {k} sent {kind!r} before 'ready'")
            self._ready.add(k)
            if k == 0:
                self.about, chunk_size = ready
        self.chunk_size = request.chunk_size or chunk_size

    def grade(self, blocks: Iterable[Pending], watch: Watch | None = None) -> Iterator[Graded]:
        """``watch`` is not heard: a worker process reports per block."""
        limit = BLOCKS_PER_WORKER * self.workers
        blocks = iter(blocks)
        more = True
        while True:
            while more and self._in_flight < limit:
                pending = next(blocks, None)
                if pending is None:
                    more = False
                elif pending:
                    self._tasks.put(pending)
                    self._in_flight += 1
            if not self._in_flight:
                return
            k, kind, graded = self._next_report()
            if kind != "graded":
                raise DataParallelError(f"data-parallel worker {k} sent {kind!r} while grading")
            self._in_flight -= 1
            yield graded

    def _next_report(self) -> tuple[int, str, Any]:
        """The next report of any worker, in the order each sent them; a worker that failed or
        died raises :class:`DataParallelError`, after the reports it sent before."""
        while not self._inbox:
            self._collect()
        k, kind, payload = self._inbox.popleft()
        if kind == "failed":
            what = "failed" if k in self._ready else "could not load its backend"
            raise DataParallelError(f"data-parallel worker {k} {what}: {payload}"
                                    f"{self._resume_hint()}")
        if kind == "died":
            code = payload
            how = f"killed by signal {-code}" if code and code < 0 else f"exit code {code}"
            raise DataParallelError(f"data-parallel worker {k} died without a report ({how})"
                                    f"{self._resume_hint()}")
        return k, kind, payload

    def _resume_hint(self) -> str:
        if len(self._ready) < self.workers:
            return ""  # nothing was graded
        return "; the rows graded so far are saved: run the same command again to resume"

    def _collect(self) -> None:
        """Wait for reports or for a worker to end; a worker that ends during the run is dead.

        Waiting on each process's sentinel as well as its pipe: a worker killed by the OOM
        killer or a crash in native code sends nothing, and its engine's own processes may
        hold its pipe open.
        """
        sentinels = {p.sentinel: k for k, p in enumerate(self._processes)}
        pipes = {id(r): k for k, r in enumerate(self._reports)}
        for ready in wait([*self._reports, *sentinels]):
            if ready in sentinels:
                k = sentinels[ready]
                # a worker writes its reports before it exits: they are all readable now
                self._drain(k)
                self._processes[k].join()
                self._inbox.append((k, "died", self._processes[k].exitcode))
            elif not self._drain(pipes[id(ready)]):
                k = pipes[id(ready)]
                self._processes[k].join(timeout=KILL_TIMEOUT_S)
                self._inbox.append((k, "died", self._processes[k].exitcode))

    def _drain(self, k: int) -> bool:
        """Move worker k's waiting reports to the inbox; False once its pipe is closed."""
        report = self._reports[k]
        try:
            while report.poll():
                kind, payload = report.recv()
                self._inbox.append((k, kind, payload))
        except (EOFError, OSError):
            return False
        return True

    def describe(self) -> dict[str, object]:
        return {"engine": self.about.get("engine"), "token_budget": self.about.get("token_budget"),
                "data_parallel": {"workers": self.workers, "environments": self.environments}}

    def close(self) -> None:
        """Stop the workers: idle ones are told to and close their engines; after a failure or
        a Ctrl-C, with blocks in hand (their rows are graded again on resume), they are
        terminated. Whatever is still alive after that is killed."""
        processes, self._processes = self._processes, []
        if not processes:
            return
        try:
            if self._in_flight or len(self._ready) < len(processes):
                for process in processes:
                    process.terminate()
            else:
                for _ in processes:
                    self._tasks.put(None)
            _join(processes, STOP_TIMEOUT_S)
            for process in processes:
                if process.is_alive():
                    process.terminate()
            _join(processes, KILL_TIMEOUT_S)
        finally:  # a second Ctrl-C in the waits above included
            for process in processes:
                if process.is_alive():
                    process.kill()
                process.join()
            for report in self._reports:
                report.close()
            self._tasks.cancel_join_thread()  # blocks no worker took: not worth waiting for
            self._tasks.close()


def _join(processes: list[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
