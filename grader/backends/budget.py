"""Pre-flight token budget: a prompt plus the longest answer must fit the judge's context.

Counted with the judge's own tokenizer and chat template before any generation, so an
overlong row never reaches the engine. A row that does not fit is ``context_overflow``; with
``--truncate`` its reference and/or output is cut in the middle, with a visible marker, until
it fits. Where the backend gives a cheap upper bound (``token_upper_bounds``), only the rows
whose bound exceeds the limit are tokenized.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from grader.backends.request import Message
from grader.records import TextCut

TRUNCATABLE = ("output_text", "output_a", "output_b", "reference")
MARKER = "\n[... {cut} characters cut by grader to fit the judge's context ...]\n"


def cut_middle(text: str, keep: int) -> str:
    """``text`` with all but ``keep`` characters removed from its middle, marked."""
    if keep >= len(text):
        return text
    head = (keep + 1) // 2
    tail = keep - head
    return text[:head] + MARKER.format(cut=len(text) - keep) + (text[len(text) - tail :] if tail else "")


class BudgetDescription(TypedDict):
    """The run manifest's ``token_budget``."""

    context_length: int
    max_tokens: int
    prompt_limit: int
    truncate: list[str]
    counted: str  # "near the limit" (a cheap bound first) or "every row"


@dataclass
class Fitted:
    """A row's conversation that fits, and what was cut to make it fit."""

    messages: list[Message]
    prompt_tokens: int | None  # None: not counted, its upper bound already fits
    truncation: dict[str, TextCut] | None = None


@dataclass
class Overflow:
    prompt_tokens: int
    reason: str


class TokenBudget:
    """Checks and, where allowed, cuts rows to fit ``context_length - max_tokens`` prompt tokens."""

    def __init__(self, count_tokens: Callable[[Sequence[list[Message]]], list[int]], *,
                 context_length: int, max_tokens: int, truncate: Sequence[str] = (),
                 upper_bounds: Callable[[Sequence[list[Message]]], list[int] | None] | None = None):
        unknown = set(truncate) - set(TRUNCATABLE)
        if unknown:
            raise ValueError(f"--truncate: unknown field(s) {sorted(unknown)}")
        self.count_tokens = count_tokens
        self.context_length = context_length
        self.max_tokens = max_tokens
        self.limit = context_length - max_tokens
        self.truncate = tuple(truncate)
        self.upper_bounds = upper_bounds

    def describe(self) -> BudgetDescription:
        return {
            "context_length": self.context_length,
            "max_tokens": self.max_tokens,
            "prompt_limit": self.limit,
            "truncate": list(self.truncate),
            "counted": "near the limit" if self.upper_bounds else "every row",
        }

    def fit(self, conversations: Sequence[list[Message]],
            rerender: Callable[[int, dict[str, str]], list[Message]],
            fields: Sequence[Mapping[str, Any]]) -> list[Fitted | Overflow]:
        """Check every conversation; cut the overflowing ones where ``--truncate`` allows.

        Args:
            conversations: the rendered conversations, one per row.
            rerender: ``(row position, replaced fields) -> conversation`` for a cut row.
            fields: each row's template fields (the text that may be cut).
        """
        bounds = self.upper_bounds(conversations) if self.upper_bounds else None
        near = [position for position in range(len(conversations))
                if bounds is None or bounds[position] > self.limit]
        counted = self.count_tokens([conversations[p] for p in near]) if near else []
        counts: list[int | None] = [None] * len(conversations)
        for position, exact in zip(near, counted, strict=True):
            counts[position] = exact
        results: list[Fitted | Overflow] = []
        for position, (messages, count) in enumerate(zip(conversations, counts, strict=True)):
            if count is None or count <= self.limit:
                results.append(Fitted(messages, count))
            else:
                results.append(self._cut(position, count, rerender, fields[position]))
        return results

    def _overflow(self, count: int, note: str = "") -> Overflow:
        return Overflow(count, f"the prompt is {count} tokens; with max_tokens {self.max_tokens} "
                        f"it needs {count + self.max_tokens} of the judge's "
                        f"{self.context_length}{note}")

    def _cut(self, position: int, count: int,
             rerender: Callable[[int, dict[str, str]], list[Message]],
             fields: Mapping[str, Any]) -> Fitted | Overflow:
        texts = {name: fields[name] for name in self.truncate if fields.get(name)}
        if not texts:
            return self._overflow(count)

        def attempt(cap: int) -> tuple[list[Message], int]:
            # Every cut field keeps at most `cap` characters: the longest is cut first, and a
            # short reference beside a huge output stays whole (an equal share of each field
            # would cut a 16-character reference to nothing).
            cut = {name: cut_middle(text, cap) for name, text in texts.items()}
            messages = rerender(position, cut)
            return messages, self.count_tokens([messages])[0]

        smallest = attempt(0)
        if smallest[1] > self.limit:
            # even cut to nothing it does not fit: the rest of the prompt is too long
            fields_cut = " and ".join(texts)
            return self._overflow(count, f" (with {fields_cut} cut entirely: {smallest[1]} tokens)")
        # low fits; high (nothing cut: the row as it came) does not. The largest cap that fits.
        low, high = 0, max(len(text) for text in texts.values())
        best = smallest
        while high - low > 1:
            middle = (low + high) // 2
            messages, tokens = attempt(middle)
            if tokens <= self.limit:
                low, best = middle, (messages, tokens)
            else:
                high = middle
        messages, tokens = best
        truncation = {name: TextCut(chars=len(text), kept=low)
                      for name, text in texts.items() if len(text) > low}
        return Fitted(messages, tokens, truncation)
