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
    if type(value) is Fraction or type(value) is int:
        # floor(n/d + 1/2) = floor((2n + d) / 2d), d > 0: the same value without a Fraction
        return (2 * value.numerator + value.denominator) // (2 * value.denominator)
    return math.floor(value + Fraction(1, 2))


def _decimal_text(numerator: int, denominator: int, places: int) -> str:
    """``numerator/denominator`` (denominator > 0) as :func:`format_decimal` writes it."""
    # round_half_up(|n/d| * 10**places) in integers: floor((2|n| * 10**places + d) / 2d)
    scale = 10**places
    scaled = (2 * abs(numerator) * scale + denominator) // (2 * denominator)
    whole, frac = divmod(scaled, scale)
    sign = "-" if numerator < 0 and scaled else ""
    return f"{sign}{whole}.{frac:0{places}d}" if places else f"{sign}{whole}"


def format_decimal(value: Fraction, places: int = 2) -> str:
    """``value`` with ``places`` decimals, rounded half up exactly (no float on the way)."""
    if (type(value) is Fraction or type(value) is int) and type(places) is int and places >= 0:
        return _decimal_text(value.numerator, value.denominator, places)
    scaled = round_half_up(abs(value) * 10**places)  # a negative value: halves away from 0
    whole, frac = divmod(scaled, 10**places)
    sign = "-" if value < 0 and scaled else ""
    return f"{sign}{whole}.{frac:0{places}d}" if places else f"{sign}{whole}"


def compute_score(counts: Counts) -> Score:
    """Apply the seed's formula to the judge's counts, exactly.

    The formula is evaluated over one common denominator in integers (5 × 0.4 = 40/20,
    5 × 0.3 = 30/20, 5 × 0.21 = 21/20, 5 × 0.09 = 9/20, 5 × 0.7 = 70/20), then kept as a
    Fraction; tests/test_scoring.py checks it against a sum of Fractions.
    """
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

    if tt == 0:
        tn, td, terms_text = 1, 1, "1"  # seed: terms_ratio = 1 if total_terms == 0
    else:
        tn, td, terms_text = tm, tt, f"{tm}/{tt}"
    org = 1 if counts.organization == "matched" else 0
    formula: Formula
    if fm < 1:
        # The seed's third formula takes precedence: no organization credit without a fact.
        formula = "no_fact_matched"
        numerator = 70 * fm * td + 21 * tn * ft
        denominator = 20 * ft * td
        calculation = f"5 × (0.7 × {fm}/{ft} + 0.21 × {terms_text})"
    elif ct > 0:
        formula = "conclusions"
        numerator = (40 * fm * ct + 30 * cm * ft) * td + (21 * tn + 9 * org * td) * ft * ct
        denominator = 20 * ft * ct * td
        calculation = f"5 × (0.4 × {fm}/{ft} + 0.3 × {cm}/{ct} + 0.21 × {terms_text} + 0.09 × {org})"
    else:
        formula = "no_conclusions"
        numerator = 70 * fm * td + (21 * tn + 9 * org * td) * ft
        denominator = 20 * ft * td
        calculation = f"5 × (0.7 × {fm}/{ft} + 0.21 × {terms_text} + 0.09 × {org})"
    exact = Fraction(numerator, denominator)
    return Score(Status.OK, round_half_up(exact), exact, calculation, formula)


def _ambiguous() -> Score:
    return Score(
        Status.AMBIGUOUS,
        0,
        Fraction(0),
        "ambiguous: the judge found no facts in the reference, so the seed assigns 0",
        reason="total_facts is 0",
    )


def score_line(score: Score) -> str:
    """The seed's fifth rationale line, written from the recomputed values."""
    assert score.exact is not None and score.rounded is not None
    return f"Score: {score.rounded} ≈ {format_decimal(score.exact)} = {score.calculation}"
