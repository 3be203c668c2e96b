"""What a backend is asked: a :class:`GenerateRequest` per row (its conversation, its JSON
schema, an optional stop rule, :class:`LoopStop`), all plain data."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# A chat message, {"role": ..., "content": ...}: the judge's prompts render them under the same
# alias; backends only send them.
Message = dict[str, str]

# A JSON schema, as engines and servers take it: JSON a backend passes on, never reads.
JSONSchema = dict[str, Any]

# The finish_reason of a row that its stop rule (:class:`LoopStop`) ended: vLLM's own word.
REPETITION = "repetition"


@dataclass(frozen=True)
class LoopStop:
    """A stop rule given as data: end a row's generation where it begins to loop.

    The loop is vLLM's rule (:func:`loop_end`). ``copied``, if given, is a test on the text so
    far (True: it repeats itself in a way the token rule misses, a list item numbered anew); a
    backend that streams a row may end it there (calling it only once new text holds a ``"``),
    else the caller reads the whole text with the same test.
    """

    min_pattern_size: int
    max_pattern_size: int
    min_count: int
    copied: Callable[[str], bool] | None = None

    def pattern(self) -> dict[str, int]:
        """The three numbers, as vLLM's RepetitionDetectionParams takes them."""
        return {"min_pattern_size": self.min_pattern_size,
                "max_pattern_size": self.max_pattern_size, "min_count": self.min_count}


@dataclass(frozen=True)
class GenerateRequest:
    """One row for :meth:`Backend.generate`: its conversation, the JSON schema its answer is
    forced into (None: the backend's own, the run's schema) and an optional stop rule."""

    messages: list[Message]
    schema: JSONSchema | None = None
    stop: LoopStop | None = None


def requests_of(conversations: Sequence[list[Message]],
                schemas: Sequence[JSONSchema | None] | None = None) -> list[GenerateRequest]:
    """Requests for ``conversations``, each with its schema of ``schemas`` (None: the run's)."""
    if schemas is None:
        return [GenerateRequest(list(c)) for c in conversations]
    return [GenerateRequest(list(c), s) for c, s in zip(conversations, schemas, strict=True)]


def loop_end(tokens: Sequence[int], loop: LoopStop) -> int | None:
    """How many of ``tokens`` a generation that ends on ``loop`` keeps (None: no loop).

    vLLM's rule (vllm_compat, "repetition"), checked after each token: the last N tokens
    repeat ``min_count`` times in a row for an N from ``min_pattern_size`` to
    ``max_pattern_size``. A backend whose engine has no such rule finds the same end after
    generating.
    """
    shortest, longest, count = (max(loop.min_pattern_size, 1), loop.max_pattern_size,
                                loop.min_count)
    for end in range(shortest * count, len(tokens) + 1):
        for size in range(shortest, min(longest, end // count) + 1):
            last = tokens[end - size:end]
            if all(tokens[end - size * (k + 1):end - size * k] == last for k in range(1, count)):
                return end
    return None
