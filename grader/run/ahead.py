"""How a run sends rows to its backend: a runner around it, not hooks assigned onto it.

Each call may say what it wants to hear as each of its rows finishes (:class:`Watch`): a tick
for a progress bar, and rows to start at once beside the ones still running (a follow-up: as a
row is read, the rows a later call will send whose prompts that answer completes). On a
backend that ``supports_streaming`` (vLLM's) the runner sends the call on one stream
(:meth:`grader.backends.Backend.stream`), starts the follow-up rows on the same stream and
keeps them: a later call with the same request is answered from what they gave, as lm-eval's
``CachingLM`` answers from its cache, and the rest are aborted when the run ends
(:meth:`Runner.close`). A backend that does not stream (transformers, openai, a plugin), and
any backend in a ``--data-parallel`` worker or a Ray actor (whose calls pass no watch), gets
plain :meth:`~grader.backends.Backend.generate` calls: its bar moves per block, and nothing
starts ahead.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from grader.backends import Backend, Completion, CompletionStream, GenerateRequest, Message
from grader.errors import one_line

log = logging.getLogger(__name__)

# Rows to start while a call still runs: called as each row of the call finishes, with the
# row's conversation and completions, it returns requests to start now (rows whose prompts
# that row's answer completes).
FollowUp = Callable[[list[Message], list[Completion]], Sequence[GenerateRequest]]


@dataclass(frozen=True)
class Watch:
    """What one call hears as each of its rows finishes, where the backend streams."""

    progress: Callable[[int], None] | None = None  # called with 1 per row (a progress bar)
    follow_up: FollowUp | None = None  # rows to start ahead (see FollowUp)


def _key(request: GenerateRequest) -> str | None:
    """A request's identity (None: a row with a stop rule, never kept: its test is code)."""
    if request.stop is not None:
        return None
    return json.dumps([request.messages, request.schema], sort_keys=True)


class Runner:
    """A run's calls to ``backend``, and the rows a call's follow-up started ahead.

    Not a hook on the backend: the backend is only called (``generate``, ``stream``); the rows
    started ahead, and their answers once finished, are kept here, by request, oldest first.
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self._stream: CompletionStream | None = None
        self.ahead: dict[str, deque[int]] = {}  # request key -> its rows started ahead
        self.started: dict[int, str] = {}  # each of those rows' handle -> its request key
        self.answered: dict[int, list[Completion]] = {}  # those that finished

    def generate(self, requests: Sequence[GenerateRequest], watch: Watch | None = None
                 ) -> list[Completion]:
        """``sampling.n`` completions per request, flat, in input order, as
        :meth:`Backend.generate`; on a streaming backend ``watch`` hears each row as it
        finishes, and a request a follow-up started ahead is answered from that row."""
        if not self.backend.supports_streaming or (watch is None and not self.started):
            return self.backend.generate(requests)
        return self._streamed(requests, watch or Watch())

    def _streamed(self, requests: Sequence[GenerateRequest], watch: Watch) -> list[Completion]:
        """The call on the run's stream: the rows started ahead taken, the others submitted,
        each answered as it finishes; a failure stops this call's rows, not those ahead."""
        stream = self._open()
        waiting = {handle: position
                   for position, handle in enumerate(self._submit(stream, requests))}
        results: list[list[Completion]] = [[] for _ in requests]
        try:
            for handle in [h for h in waiting if h in self.answered]:  # finished ahead
                self._row(requests, waiting.pop(handle), self.answered.pop(handle), results,
                          watch, stream)
            for handle, completions in self._finished(stream, waiting):
                self._row(requests, waiting.pop(handle), completions, results, watch, stream)
        except BaseException:
            stream.abort(waiting)  # nothing of this call is left running that no call reads
            raise
        return [completion for row in results for completion in row]

    def _submit(self, stream: CompletionStream, requests: Sequence[GenerateRequest]
                ) -> list[int]:
        """A handle per request, in order: the row started ahead for it, else a row submitted
        now; where submitting fails, the rows taken from ahead are aborted."""
        handles: list[int | None] = [self._take(_key(r)) for r in requests]
        fresh = [p for p, handle in enumerate(handles) if handle is None]
        try:
            for position, handle in zip(fresh, stream.submit([requests[p] for p in fresh]),
                                        strict=True):
                handles[position] = handle
        except BaseException:
            stream.abort(h for h in handles if h is not None)
            raise
        return [h for h in handles if h is not None]  # each: the zip above is strict

    def _finished(self, stream: CompletionStream, waiting: dict[int, int]
                  ) -> Iterator[tuple[int, list[Completion]]]:
        """This call's rows as they finish; rows started ahead that finish meanwhile are
        kept (one that failed is forgotten: its own call sends it again)."""
        if not waiting:
            return
        for handle, completions in stream.finished():
            if handle in waiting:
                yield handle, completions
                if not waiting:
                    return
            elif handle in self.started:
                if any(c.finish_reason == "error" for c in completions):
                    self._forget(handle)
                else:
                    self.answered[handle] = completions
        if waiting:
            raise RuntimeError(f"the engine stopped with {len(waiting)} requests unanswered")

    def _row(self, requests: Sequence[GenerateRequest], position: int,
             completions: list[Completion], results: list[list[Completion]], watch: Watch,
             stream: CompletionStream) -> None:
        """A row of the call has its answer: the bar moves, its follow-up rows start."""
        results[position] = completions
        if watch.progress is not None:
            watch.progress(1)
        if watch.follow_up is not None:
            self._start(requests[position].messages, completions, watch.follow_up, stream)

    def _start(self, conversation: list[Message], completions: list[Completion],
               follow_up: FollowUp, stream: CompletionStream) -> None:
        """Start the rows ``follow_up`` returns. Starting rows ahead only saves time: whatever
        fails in it (a check prompt that does not render, a prompt the engine refuses) is left
        for the row's own call, where it is reported as it would be without, and never fails
        this call's rows."""
        try:
            rows = [row for row in follow_up(conversation, completions) if _key(row) is not None]
            handles = stream.submit(rows) if rows else []
        except Exception as exc:  # noqa: BLE001  (see above: never this call's failure)
            log.debug("rows to start ahead: %s", one_line(exc))
            return
        for row, handle in zip(rows, handles, strict=True):
            key = _key(row)
            assert key is not None
            self.ahead.setdefault(key, deque()).append(handle)
            self.started[handle] = key

    def _take(self, key: str | None) -> int | None:
        """The oldest row started ahead for this request, no longer kept for another."""
        if key is None or not self.ahead.get(key):
            return None
        queue = self.ahead[key]
        handle = queue.popleft()
        if not queue:
            del self.ahead[key]
        del self.started[handle]
        return handle

    def _forget(self, handle: int) -> None:
        key = self.started.pop(handle)
        self.ahead[key].remove(handle)
        if not self.ahead[key]:
            del self.ahead[key]

    def _open(self) -> CompletionStream:
        if self._stream is None:
            self._stream = self.backend.stream()
        return self._stream

    def drop(self) -> None:
        """Abort the rows started ahead that no call asked for, and forget them all (a row
        cut to fit the context is sent again as cut, never answered from ahead)."""
        if self._stream is not None and self.started:
            self._stream.abort(list(self.started))
        self.ahead.clear()
        self.started.clear()
        self.answered.clear()

    def close(self) -> None:
        """Stop what the runner started; the backend stays open (it is the caller's)."""
        self.drop()
        if self._stream is not None:
            self._stream.close()
            self._stream = None
