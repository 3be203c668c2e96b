"""What a run asks of a local backend while a call is running, in one place: its per-row
progress hook (:attr:`grader.backends.Backend.progress`) and the rows it starts ahead
(:attr:`~grader.backends.Backend.runs_ahead`, :attr:`~grader.backends.Backend.follow_up`,
:meth:`~grader.backends.Backend.drop_ahead`).

Each hook is set for the length of a ``with`` block and put back after it, so no stage leaves
a callback on the backend for the next one. Only a backend in this process has them (a
started :class:`grader.run.executor.LocalExecutor`); with worker processes or Ray actors each
call here does nothing: those report per block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from grader.run.executor import Executor, local_backend

if TYPE_CHECKING:
    from grader.backends import Backend, FollowUp


class LocalHooks:
    """The hooks of ``executor``'s backend, when it runs in this process (read at each call:
    the backend exists once the executor has started)."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    @property
    def backend(self) -> Backend | None:
        return local_backend(self.executor)

    @contextlib.contextmanager
    def progress(self, tick: Callable[[int], None]) -> Iterator[None]:
        """``tick(rows)`` called as rows finish inside a call, while in the block."""
        backend = self.backend
        if backend is None:
            yield
            return
        previous, backend.progress = backend.progress, tick
        try:
            yield
        finally:
            backend.progress = previous

    @contextlib.contextmanager
    def ahead(self, follow_up: FollowUp) -> Iterator[bool]:
        """While in the block, ``follow_up`` hands the backend rows to start as each row of a
        call finishes (a backend that runs ahead: vLLM's); what an earlier call started and
        no call asked for is dropped first. Yields whether the backend runs rows ahead."""
        backend = self.backend
        if backend is None or not backend.runs_ahead:
            yield False
            return
        backend.drop_ahead()
        backend.follow_up = follow_up
        try:
            yield True
        finally:
            backend.follow_up = None

    def drop_ahead(self) -> None:
        """Forget the rows started ahead that no call asked for (a row cut to fit the context
        is sent again as cut): none is left in the engine."""
        backend = self.backend
        if backend is not None:
            backend.drop_ahead()
