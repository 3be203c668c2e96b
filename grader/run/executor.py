"""Where the rows are graded. :func:`grader.run.grading.run_grade` reads, resumes and writes;
an executor holds the backend(s) and turns blocks of pending rows into records:

* :class:`LocalExecutor`: one backend in this process (the default);
* :class:`grader.run.data_parallel.DataParallelExecutor`: ``--data-parallel N`` worker
  processes on one machine, each with its own GPUs (or CPU cores);
* :class:`grader.run.ray_cluster.RayExecutor`: ``--ray``, engine actors on a Ray cluster.

The CLI builds one and hands it to ``run_grade``; ``run_grade`` opens it, starts it only when
there are rows to grade, and closes it however the run ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from grader.backends import Backend
from grader.records import Record
from grader.run.ahead import Runner, Watch
from grader.run.request import RunPlan
from grader.run.rows import Job, grade_pending, open_backend

# A block of rows left to grade: each row's job and its resume key.
Pending = list[tuple[Job, str]]
# What comes back: each record with its row's position in the input.
Graded = list[tuple[int, Record]]


class Executor(Protocol):
    chunk_size: int  # rows per block; read after start()

    def open(self) -> None:
        """Connect to what will run the backends (a Ray cluster); nothing is loaded yet."""

    def choose_backend(self, name: str) -> tuple[str, str | None]:
        """``auto`` resolved where the backends will run: ``(backend, reason)``."""

    def start(self, plan: RunPlan) -> None:
        """Load the backend(s) the plan names: called only when there are rows to grade."""

    def grade(self, blocks: Iterable[Pending], watch: Watch | None = None) -> Iterator[Graded]:
        """Grade blocks of pending rows; records may come back in any order. ``watch``: what
        each call hears as its rows finish, where the backend runs in this process and
        streams (a progress bar, rows to start ahead: :mod:`grader.run.ahead`); worker
        processes and Ray actors report per block."""

    def describe(self) -> dict[str, Any]:
        """The run manifest's ``engine`` and ``token_budget`` (None before start) and whatever
        else the executor adds (``ray``, ``data_parallel``)."""

    def close(self) -> None:
        """Stop what start() and open() began; safe to call when they were not."""


class GradeWorker:
    """One backend, loaded from a plan, turning blocks of pending rows into records.

    The same object grades in this process (:class:`LocalExecutor`), in a ``--data-parallel``
    worker and in a Ray actor. Its calls go through a :class:`~grader.run.ahead.Runner` around
    the backend, which keeps the rows a call started ahead until the worker closes.

    Args:
        backend_factory: replaces :func:`grader.backends.load_backend` (tests pass a fake).
    """

    def __init__(self, plan: RunPlan, backend_factory: Callable[..., Backend] | None = None) -> None:
        self.plan = plan
        self.backend, self.budget = open_backend(
            plan.request, plan.backend, plan.schema, plan.max_tokens, backend_factory
        )
        self.runner = Runner(self.backend)

    def grade(self, pending: Pending, watch: Watch | None = None) -> Graded:
        return grade_pending(pending, self.runner, self.plan.judge, self.budget,
                             self.plan.request, watch)

    def describe(self) -> dict[str, Any]:
        """The run manifest's ``engine`` and ``token_budget``."""
        return {
            "engine": self.backend.describe(),
            "token_budget": self.budget.describe() if self.budget else None,
        }

    def close(self) -> None:
        """Stop the rows started ahead, then the backend's engine processes, if it has any
        (vLLM's)."""
        try:
            self.runner.close()
        finally:
            self.backend.close()


class LocalExecutor:
    """One backend in this process, graded block by block as the dataset streams past.

    Args:
        backend_factory: replaces :func:`grader.backends.load_backend` (tests pass a fake).
    """

    def __init__(self, backend_factory: Callable[..., Backend] | None = None) -> None:
        self.backend_factory = backend_factory
        self.worker: GradeWorker | None = None
        self.chunk_size = 0

    def open(self) -> None:
        pass

    def choose_backend(self, name: str) -> tuple[str, str | None]:
        from grader.backends import choose_backend

        return choose_backend(name)

    def start(self, plan: RunPlan) -> None:
        self.worker = GradeWorker(plan, self.backend_factory)
        # rows per block: the request's, else the backend's own
        self.chunk_size = plan.request.chunk_size or self.worker.backend.chunk_size

    def grade(self, blocks: Iterable[Pending], watch: Watch | None = None) -> Iterator[Graded]:
        assert self.worker is not None, "start() first"
        for pending in blocks:
            if pending:
                yield self.worker.grade(pending, watch)

    def describe(self) -> dict[str, Any]:
        if self.worker is None:
            return {"engine": None, "token_budget": None}
        return self.worker.describe()

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()

