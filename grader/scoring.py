"""Counts -> the seed's formula as an exact rational -> a score rounded half up. Pure.

The judge's own arithmetic is never trusted: it is kept for audit only. Policy (README,
"Scoring policy"):

* terms_ratio = 1 when total_terms = 0;
* the conclusions formula applies when total_conclusions > 0, otherwise the no-conclusions one;
* fewer than 1 matched fact -> 5 * (0.7 * facts_ratio + 0.21 * terms_ratio), before both others;
* total_facts = 0 -> score 0, status ``ambiguous``;
* a matched count above its total -> status ``invalid_counts``, no score.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from grader.status import Status

W_FACTS_WITH_CONCLUSIONS = Fraction(4, 10)
W_CONCLUSIONS = Fraction(3, 10)
W_FACTS = Fraction(7, 10)
W_TERMS = Fraction(21, 100)
W_ORGANIZATION = Fraction(9, 100)

Formula = Literal["conclusions", "no_conclusions", "no_fact_matched"]


@dataclass(frozen=True)
class Counts:
    """What the judge counted, read from its first four rationale lines."""

    facts_matched: int
    facts_total: int
    conclusions_matched: int
    conclusions_total: int
    terms_matched: int
    terms_total: int
    organization: Literal["matched", "mismatched"]

    def as_dict(self) -> dict:
        return {
            "facts": {"matched": self.facts_matched, "total": self.facts_total},
            "conclusions": {"matched": self.conclusions_matched, "total": self.conclusions_total},
            "terms": {"matched": self.terms_matched, "total": self.terms_total},
            "organization": self.organization,
        }


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
    """Round to the nearest integer, halves away from zero for the non-negative scores here."""
    return math.floor(value + Fraction(1, 2))


def format_decimal(value: Fraction, places: int = 2) -> str:
    """``value`` with ``places`` decimals, rounded half up exactly (no float on the way)."""
    scaled = round_half_up(abs(value) * 10**places)  # a negative value: halves away from 0
    whole, frac = divmod(scaled, 10**places)
    sign = "-" if value < 0 and scaled else ""
    return f"{sign}{whole}.{frac:0{places}d}" if places else f"{sign}{whole}"


def _ratio(matched: int, total: int) -> str:
    return f"{matched}/{total}"


def compute_score(counts: Counts) -> Score:
    """Apply the seed's formula to the judge's counts, exactly."""
    pairs = (
        ("facts", counts.facts_matched, counts.facts_total),
        ("conclusions", counts.conclusions_matched, counts.conclusions_total),
        ("terms", counts.terms_matched, counts.terms_total),
    )
    for name, matched, total in pairs:
        if matched < 0 or total < 0 or matched > total:
            return Score(
                Status.INVALID_COUNTS,
                None,
                None,
                None,
                reason=f"{name}: matched {matched} of {total} is impossible",
            )
    if counts.facts_total == 0:
        return Score(
            Status.AMBIGUOUS,
            0,
            Fraction(0),
            "ambiguous: the judge found no facts in the reference, so the seed assigns 0",
            reason="total_facts is 0",
        )

    facts = Fraction(counts.facts_matched, counts.facts_total)
    if counts.terms_total == 0:
        terms, terms_text = Fraction(1), "1"  # seed: terms_ratio = 1 if total_terms == 0
    else:
        terms = Fraction(counts.terms_matched, counts.terms_total)
        terms_text = _ratio(counts.terms_matched, counts.terms_total)
    organization = 1 if counts.organization == "matched" else 0
    facts_text = _ratio(counts.facts_matched, counts.facts_total)

    formula: Formula
    if counts.facts_matched < 1:
        # The seed's third formula takes precedence: no organization credit without a fact.
        formula = "no_fact_matched"
        weighted = W_FACTS * facts + W_TERMS * terms
        parts = [f"0.7 × {facts_text}", f"0.21 × {terms_text}"]
    elif counts.conclusions_total > 0:
        formula = "conclusions"
        conclusions = Fraction(counts.conclusions_matched, counts.conclusions_total)
        weighted = (
            W_FACTS_WITH_CONCLUSIONS * facts
            + W_CONCLUSIONS * conclusions
            + W_TERMS * terms
            + W_ORGANIZATION * organization
        )
        parts = [
            f"0.4 × {facts_text}",
            f"0.3 × {_ratio(counts.conclusions_matched, counts.conclusions_total)}",
            f"0.21 × {terms_text}",
            f"0.09 × {organization}",
        ]
    else:
        formula = "no_conclusions"
        weighted = W_FACTS * facts + W_TERMS * terms + W_ORGANIZATION * organization
        parts = [f"0.7 × {facts_text}", f"0.21 × {terms_text}", f"0.09 × {organization}"]
    exact = 5 * weighted
    calculation = f"5 × ({' + '.join(parts)})"
    return Score(Status.OK, round_half_up(exact), exact, calculation, formula)


def score_line(score: Score) -> str:
    """The seed's fifth rationale line, written from the recomputed values."""
    assert score.exact is not None and score.rounded is not None
    return f"Score: {score.rounded} ≈ {format_decimal(score.exact)} = {score.calculation}"
