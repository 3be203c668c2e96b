"""Counts -> the seed's formula as an exact rational -> a score rounded half up. Pure.

The judge's own arithmetic is never trusted: it is kept for audit only. Policy (docs/judging.md,
"Scoring policy"):

* terms_ratio = 1 when total_terms = 0;
* the conclusions formula applies when total_conclusions > 0, otherwise the no-conclusions one;
* fewer than 1 matched fact -> 5 * (0.7 * facts_ratio + 0.21 * terms_ratio), before both others;
* total_facts = 0 -> score 0, status ``ambiguous``;
* a matched count above its total -> status ``invalid_counts``, no score.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from grader.records import MatchCount, RecordCounts
from grader.status import Status

Formula = Literal["conclusions", "no_conclusions", "no_fact_matched"]
Organization = Literal["matched", "mismatched"]


@dataclass(frozen=True)
class Counts:
    """What the judge counted, read from its first four rationale lines."""

    facts_matched: int
    facts_total: int
    conclusions_matched: int
    conclusions_total: int
    terms_matched: int
    terms_total: int
    organization: Organization

    @classmethod
    def from_numbers(cls, numbers: Sequence[int], organization: str) -> Counts:
        """Counts from ``[matched, total]`` of each category in :data:`COUNT_LINES`' order."""
        if organization not in ("matched", "mismatched"):
            raise ValueError(f"organization must be matched or mismatched, got {organization!r}")
        fm, ft, cm, ct, tm, tt = numbers
        return cls(fm, ft, cm, ct, tm, tt, "matched" if organization == "matched" else "mismatched")

    def numbers(self) -> tuple[int, int, int, int, int, int]:
        """``(matched, total)`` of each category in :data:`COUNT_LINES`' order, flat."""
        return (self.facts_matched, self.facts_total, self.conclusions_matched,
                self.conclusions_total, self.terms_matched, self.terms_total)

    def as_record(self) -> RecordCounts:
        """The counts as a record stores them (``counts``)."""
        return RecordCounts(
            MatchCount(self.facts_matched, self.facts_total),
            MatchCount(self.conclusions_matched, self.conclusions_total),
            MatchCount(self.terms_matched, self.terms_total),
            self.organization,
        )


    def of(self, category: str) -> tuple[int, int]:
        """``(matched, total)`` of ``facts``, ``conclusions`` or ``terms``."""
        return {
            "facts": (self.facts_matched, self.facts_total),
            "conclusions": (self.conclusions_matched, self.conclusions_total),
            "terms": (self.terms_matched, self.terms_total),
        }[category]


@dataclass(frozen=True)
class CountLine:
    """One of the seed's three count lines ("Fact: 2 of 3 correctly matched.").

    :data:`COUNT_LINES` is the one place their text is spelled: the schema's patterns, the
    parser, the lines grader writes and the answer-length bound are all made from it.
    """

    label: str  # the line's first word
    category: str  # its key in a record's counts and the itemized format
    unit: str  # what is counted, where the seed names it ("terms")

    def text(self, matched: int | str, total: int | str) -> str:
        return f"{self.label}: {matched} of {total}{self.unit} correctly matched."

    def pattern(self, count: str) -> str:
        """The line as a regular expression, each count matched by ``count``."""
        return rf"{self.label}: {count} of {count}{self.unit} correctly matched\."


COUNT_LINES = (
    CountLine("Fact", "facts", ""),
    CountLine("Conclusion", "conclusions", ""),
    CountLine("Terminology", "terms", " terms"),
)


@dataclass(frozen=True)
class Score:
    """The recomputed score; ``exact`` and ``rounded`` are None unless a score exists."""

    status: Status
    rounded: int | None
    exact: Fraction | None
    calculation: str | None
    formula: Formula | None = None
    reason: str | None = None


def round_half_up(value: Fraction) -> int:
    """Round to the nearest integer, halves up (Python's ``round`` goes to even)."""
    return math.floor(value + Fraction(1, 2))


def format_decimal(value: Fraction, places: int = 2) -> str:
    """``value`` with ``places`` decimals, rounded half up exactly (no float on the way); a
    negative value's halves go away from 0."""
    scaled = round_half_up(abs(value) * 10**places)
    whole, frac = divmod(scaled, 10**places)
    sign = "-" if value < 0 and scaled else ""
    return f"{sign}{whole}.{frac:0{places}d}" if places else f"{sign}{whole}"


# The seed's weights, as the exact decimals it writes them.
_FACTS, _CONCLUSIONS, _TERMS, _ORGANIZATION = (Fraction("0.4"), Fraction("0.3"),
                                               Fraction("0.21"), Fraction("0.09"))
_FACTS_ALONE = Fraction("0.7")  # the facts' weight where the formula has no conclusions


def compute_score(counts: Counts) -> Score:
    """Apply the seed's formula to the judge's counts, exactly.

    Each ratio is an exact :class:`~fractions.Fraction`, so a tie (x.5) rounds up where a float
    sum would land just below it (tests/test_scoring.py lists such counts).
    """
    # Judges give a few hundred distinct counts: each score is computed once and shared (a
    # Score is frozen): Fraction arithmetic costs about 30 µs a row, a cache hit about 1. Only
    # ints: Counts(True, ...) equals Counts(1, ...), but its calculation text is its own.
    if all(type(number) is int for number in counts.numbers()):
        return _known_score(counts)
    return _score(counts)


def _score(counts: Counts) -> Score:
    fm, ft = counts.facts_matched, counts.facts_total
    cm, ct = counts.conclusions_matched, counts.conclusions_total
    tm, tt = counts.terms_matched, counts.terms_total
    for name, matched, total in (("facts", fm, ft), ("conclusions", cm, ct), ("terms", tm, tt)):
        if matched < 0 or total < 0 or matched > total:
            return Score(
                Status.INVALID_COUNTS,
                None,
                None,
                None,
                reason=f"{name}: matched {matched} of {total} is impossible",
            )
    if ft == 0:
        return _ambiguous()

    facts = Fraction(fm, ft)
    # seed: terms_ratio = 1 if total_terms == 0
    terms, terms_text = (Fraction(tm, tt), f"{tm}/{tt}") if tt else (Fraction(1), "1")
    org = 1 if counts.organization == "matched" else 0
    formula: Formula
    if fm < 1:
        # The seed's third formula takes precedence: no organization credit without a fact.
        formula = "no_fact_matched"
        exact = 5 * (_FACTS_ALONE * facts + _TERMS * terms)
        calculation = f"5 × (0.7 × {fm}/{ft} + 0.21 × {terms_text})"
    elif ct > 0:
        formula = "conclusions"
        exact = 5 * (_FACTS * facts + _CONCLUSIONS * Fraction(cm, ct) + _TERMS * terms
                     + _ORGANIZATION * org)
        calculation = f"5 × (0.4 × {fm}/{ft} + 0.3 × {cm}/{ct} + 0.21 × {terms_text} + 0.09 × {org})"
    else:
        formula = "no_conclusions"
        exact = 5 * (_FACTS_ALONE * facts + _TERMS * terms + _ORGANIZATION * org)
        calculation = f"5 × (0.7 × {fm}/{ft} + 0.21 × {terms_text} + 0.09 × {org})"
    return Score(Status.OK, round_half_up(exact), exact, calculation, formula)


_known_score = functools.lru_cache(maxsize=4096)(_score)


def _ambiguous() -> Score:
    return Score(
        Status.AMBIGUOUS,
        0,
        Fraction(0),
        "ambiguous: the judge found no facts in the reference, so the seed assigns 0",
        reason="total_facts is 0",
    )


@functools.lru_cache(maxsize=4096)  # as compute_score's: one text per distinct score
def score_line(score: Score) -> str:
    """The seed's fifth rationale line, written from the recomputed values."""
    assert score.exact is not None and score.rounded is not None
    return f"Score: {score.rounded} ≈ {format_decimal(score.exact)} = {score.calculation}"
