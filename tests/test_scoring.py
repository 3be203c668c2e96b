"""grader.judge.scoring: every formula branch, the policy's edge cases, and exact half-up rounding."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from grader.judge.schema import SCORE_PATTERN
from grader.judge.scoring import (
    Counts,
    compute_score,
    format_decimal,
    round_half_up,
    score_line,
)
from grader.status import Status


def counts(facts, conclusions=(0, 0), terms=(0, 0), organization="matched") -> Counts:
    return Counts(*facts, *conclusions, *terms, organization=organization)


# ---------------------------------------------------------------- the three formulas, by hand


def test_conclusions_formula():
    # 5 × (0.4 × 2/3 + 0.3 × 1/2 + 0.21 × 3/4 + 0.09 × 1)
    # = 5 × (320 + 180 + 189 + 108) / 1200 = 797/240 = 3.3208…
    score = compute_score(counts((2, 3), (1, 2), (3, 4), "matched"))
    assert score.status is Status.OK
    assert score.formula == "conclusions"
    assert score.exact == Fraction(797, 240)
    assert score.rounded == 3
    assert score.calculation == "5 × (0.4 × 2/3 + 0.3 × 1/2 + 0.21 × 3/4 + 0.09 × 1)"
    assert score.reason is None


def test_conclusions_formula_organization_mismatched_gives_no_organization_credit():
    # 5 × (0.4 × 1/2 + 0.3 × 1/3 + 0.21 × 1/1 + 0.09 × 0) = 5 × (0.2 + 0.1 + 0.21) = 51/20
    score = compute_score(counts((1, 2), (1, 3), (1, 1), "mismatched"))
    assert score.formula == "conclusions"
    assert score.exact == Fraction(51, 20)
    assert score.rounded == 3
    assert score.calculation.endswith("+ 0.09 × 0)")


def test_no_conclusions_formula():
    # 5 × (0.7 × 3/4 + 0.21 × 1/3 + 0.09 × 0) = 5 × (21/40 + 7/100) = 119/40 = 2.975
    score = compute_score(counts((3, 4), (0, 0), (1, 3), "mismatched"))
    assert score.status is Status.OK
    assert score.formula == "no_conclusions"
    assert score.exact == Fraction(119, 40)
    assert score.rounded == 3
    assert score.calculation == "5 × (0.7 × 3/4 + 0.21 × 1/3 + 0.09 × 0)"


def test_no_fact_matched_formula():
    # 5 × (0.7 × 0/4 + 0.21 × 2/5) = 21/50
    score = compute_score(counts((0, 4), (0, 0), (2, 5), "mismatched"))
    assert score.status is Status.OK
    assert score.formula == "no_fact_matched"
    assert score.exact == Fraction(21, 50)
    assert score.rounded == 0
    assert score.calculation == "5 × (0.7 × 0/4 + 0.21 × 2/5)"


def test_full_marks_are_exactly_five():
    # The weights of each formula sum to 1: every ratio at 1 (and organization matched) is 5.
    assert compute_score(counts((4, 4), (2, 2), (3, 3))).exact == 5
    assert compute_score(counts((4, 4), (0, 0), (3, 3))).exact == 5
    # 0.09 of 5 is what a mismatched organization costs
    mismatched = compute_score(counts((4, 4), (2, 2), (3, 3), "mismatched"))
    assert mismatched.exact == 5 - Fraction(45, 100)


def test_precedence_no_fact_matched_beats_conclusions_and_organization():
    # 0 facts matched, conclusions present and organization matched: still the no-fact formula.
    # 5 × (0.7 × 0/3 + 0.21 × 2/5) = 21/50 -> 0; the conclusions formula would have given
    # 5 × (0 + 0.3 × 2/3 + 0.21 × 2/5 + 0.09) = 187/100 -> 2.
    score = compute_score(counts((0, 3), (2, 3), (2, 5), "matched"))
    assert score.formula == "no_fact_matched"
    assert score.exact == Fraction(21, 50)
    assert score.rounded == 0
    assert "0.3 ×" not in score.calculation and "0.09" not in score.calculation
    # organization gets no credit: matched and mismatched give the same score
    other = compute_score(counts((0, 3), (2, 3), (2, 5), "mismatched"))
    assert other.exact == score.exact and other.calculation == score.calculation


def test_precedence_no_fact_matched_beats_no_conclusions():
    # 5 × (0.21 × 1) = 21/20 -> 1, not 5 × (0.21 + 0.09) = 3/2 -> 2 (the no-conclusions formula)
    score = compute_score(counts((0, 2), (0, 0), (0, 0), "matched"))
    assert score.formula == "no_fact_matched"
    assert score.exact == Fraction(21, 20)
    assert score.rounded == 1


def test_one_matched_fact_is_enough_for_the_other_formulas():
    assert compute_score(counts((1, 6), (0, 1), (0, 1))).formula == "conclusions"
    assert compute_score(counts((1, 6), (0, 0), (0, 1))).formula == "no_conclusions"


# ---------------------------------------------------------------- policy edge cases


def test_terms_total_zero_means_terms_ratio_one():
    # 5 × (0.7 × 1/2 + 0.21 × 1 + 0.09 × 0) = 5 × 0.56 = 14/5
    score = compute_score(counts((1, 2), (0, 0), (0, 0), "mismatched"))
    assert score.exact == Fraction(14, 5)
    assert score.rounded == 3
    assert score.calculation == "5 × (0.7 × 1/2 + 0.21 × 1 + 0.09 × 0)"
    # the same as all terms matched, in every formula
    for facts, conclusions in [((1, 2), (0, 0)), ((1, 2), (1, 3)), ((0, 2), (1, 3))]:
        none = compute_score(counts(facts, conclusions, (0, 0)))
        all_matched = compute_score(counts(facts, conclusions, (4, 4)))
        assert none.exact == all_matched.exact
        assert "0.21 × 1" in none.calculation


def test_total_facts_zero_is_ambiguous_with_score_zero():
    score = compute_score(counts((0, 0), (2, 2), (3, 3), "matched"))
    assert score.status is Status.AMBIGUOUS
    assert score.rounded == 0
    assert score.exact == 0
    assert score.formula is None
    assert score.reason == "total_facts is 0"
    assert score_line(score) == (
        "Score: 0 ≈ 0.00 = ambiguous: the judge found no facts in the reference, "
        "so the seed assigns 0"
    )


@pytest.mark.parametrize(
    "facts, conclusions, terms, name",
    [
        ((3, 2), (0, 0), (0, 0), "facts"),
        ((1, 2), (2, 1), (0, 0), "conclusions"),
        ((1, 2), (0, 0), (5, 4), "terms"),
        ((1, 0), (0, 0), (0, 0), "facts"),  # matched > total beats ambiguous (total 0)
        ((0, 0), (0, 0), (1, 0), "terms"),  # invalid beats ambiguous
        ((-1, 2), (0, 0), (0, 0), "facts"),
        ((1, 2), (0, -1), (0, 0), "conclusions"),
    ],
)
def test_invalid_counts_have_no_score(facts, conclusions, terms, name):
    score = compute_score(counts(facts, conclusions, terms))
    assert score.status is Status.INVALID_COUNTS
    assert score.rounded is None and score.exact is None and score.calculation is None
    assert score.reason.startswith(f"{name}: matched ")
    assert "impossible" in score.reason
    with pytest.raises(AssertionError):
        score_line(score)


# ---------------------------------------------------------------- rounding, exactly


def test_round_half_up():
    halves = [round_half_up(Fraction(n, 2)) for n in range(0, 11)]
    assert halves == [0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert round_half_up(Fraction(249, 100)) == 2
    assert round_half_up(Fraction(2_499_999, 1_000_000)) == 2
    assert round_half_up(Fraction(5, 2)) == 3  # Python's round(2.5) is 2


# Exact score k + 1/2 where floats get the rounding wrong. Found by scanning every count with
# totals up to 6 (as test_float_arithmetic_gets_ties_wrong does): the float formula lands just
# below the tie (2.4999999999999996), so both round() and int(x + 0.5) round down.
FLOAT_BELOW_TIE = [
    # facts, conclusions, terms, organization, exact
    ((1, 4), (3, 4), (5, 6), "mismatched", Fraction(5, 2)),  # 5 × (0.1 + 0.225 + 0.175)
    ((3, 5), (3, 4), (1, 6), "mismatched", Fraction(5, 2)),  # 5 × (0.24 + 0.225 + 0.035)
    ((1, 5), (0, 0), (1, 3), "matched", Fraction(3, 2)),  # 5 × (0.14 + 0.07 + 0.09)
    ((1, 5), (0, 0), (2, 6), "matched", Fraction(3, 2)),
]
# Ties that floats compute exactly, but Python's round() sends to the even neighbour.
FLOAT_BANKERS_TIE = [
    ((1, 2), (1, 1), (0, 1), "mismatched", Fraction(5, 2)),  # 5 × (0.2 + 0.3) -> 3, round() 2
    ((1, 1), (2, 3), (0, 0), "matched", Fraction(9, 2)),  # 5 × (0.4 + 0.2 + 0.21 + 0.09) -> 5
]


def _float_score(c: Counts) -> float:
    """The seed's formula the naive way: float ratios and float weights."""
    f = c.facts_matched / c.facts_total
    t = c.terms_matched / c.terms_total if c.terms_total else 1.0
    o = 1.0 if c.organization == "matched" else 0.0
    if c.facts_matched < 1:
        return 5 * (0.7 * f + 0.21 * t)
    if c.conclusions_total:
        conclusions = c.conclusions_matched / c.conclusions_total
        return 5 * (0.4 * f + 0.3 * conclusions + 0.21 * t + 0.09 * o)
    return 5 * (0.7 * f + 0.21 * t + 0.09 * o)


@pytest.mark.parametrize("facts, conclusions, terms, organization, exact", FLOAT_BELOW_TIE)
def test_exact_ties_round_up_where_floats_round_down(
    facts, conclusions, terms, organization, exact
):
    c = counts(facts, conclusions, terms, organization)
    score = compute_score(c)
    assert score.exact == exact and exact.denominator == 2
    assert score.rounded == exact + Fraction(1, 2)
    naive = _float_score(c)
    assert naive < exact  # 2.4999999999999996, not 2.5
    assert round(naive) == int(naive + 0.5) == score.rounded - 1  # both float roundings are wrong


@pytest.mark.parametrize("facts, conclusions, terms, organization, exact", FLOAT_BANKERS_TIE)
def test_exact_ties_round_up_where_round_goes_to_even(
    facts, conclusions, terms, organization, exact
):
    c = counts(facts, conclusions, terms, organization)
    score = compute_score(c)
    assert score.exact == exact
    assert score.rounded == exact + Fraction(1, 2)
    assert round(_float_score(c)) == score.rounded - 1


def test_format_decimal_half_up_exactly():
    assert format_decimal(Fraction("2.675")) == "2.68"  # f"{2.675:.2f}" is "2.67"
    assert f"{2.675:.2f}" == "2.67"
    assert format_decimal(Fraction("3.005")) == "3.01"
    assert format_decimal(Fraction(119, 40)) == "2.98"  # 2.975
    assert format_decimal(Fraction("4.995")) == "5.00"  # the carry reaches the whole part
    assert format_decimal(Fraction("2.6749")) == "2.67"
    assert format_decimal(Fraction(2.675)) == "2.67"  # the float 2.675 is 2.67499999…
    assert format_decimal(Fraction(1, 3)) == "0.33"
    assert format_decimal(Fraction(2, 3)) == "0.67"
    assert format_decimal(Fraction(797, 240)) == "3.32"
    assert format_decimal(Fraction(5)) == "5.00"
    assert format_decimal(0) == "0.00"
    assert format_decimal(Fraction(7, 200)) == "0.04"  # 0.035
    assert format_decimal(Fraction(1, 200), places=3) == "0.005"
    assert format_decimal(Fraction(5, 2), places=0) == "3"
    assert format_decimal(Fraction(1, 16), places=1) == "0.1"


def test_format_decimal_negative_values_keep_their_sign():
    # Scores are never negative, but the helper must not print -0.25 as "-1.75".
    assert format_decimal(Fraction(-1, 4)) == "-0.25"
    assert format_decimal(Fraction("-2.675")) == "-2.68"
    assert format_decimal(Fraction(-1, 1000)) == "0.00"
    assert format_decimal(Fraction(-5, 2), places=0) == "-3"


def test_score_line_text():
    score = compute_score(counts((2, 3), (1, 1), (2, 4), "matched"))
    # 5 × (4/15 + 3/10 + 21/200 + 9/100) = 457/120 = 3.8083…
    assert score.exact == Fraction(457, 120)
    assert score_line(score) == (
        "Score: 4 ≈ 3.81 = 5 × (0.4 × 2/3 + 0.3 × 1/1 + 0.21 × 2/4 + 0.09 × 1)"
    )
    no_fact = compute_score(counts((0, 2), (0, 0), (0, 0)))
    assert score_line(no_fact) == "Score: 1 ≈ 1.05 = 5 × (0.7 × 0/2 + 0.21 × 1)"
    no_conclusions = compute_score(counts((3, 4), (0, 0), (1, 3), "mismatched"))
    assert score_line(no_conclusions) == (
        "Score: 3 ≈ 2.98 = 5 × (0.7 × 3/4 + 0.21 × 1/3 + 0.09 × 0)"
    )


def test_score_line_of_the_largest_counts_fits_the_schema():
    score = compute_score(counts((999, 999), (999, 999), (999, 999)))
    assert re.fullmatch(SCORE_PATTERN, score_line(score))


# ---------------------------------------------------------------- exhaustive over small counts

MAX_TOTAL = 6
PAIRS = [(m, t) for t in range(MAX_TOTAL + 1) for m in range(t + 1)]


def _expected(fm, ft, cm, ct, tm, tt, organization) -> tuple[str, int, int]:
    """The policy, written independently in integers: (formula, numerator, denominator).

    The weights are in hundredths and every ratio goes over the common denominator
    100 × ft × ct × tt, so no Fraction is involved.
    """
    o = 1 if organization == "matched" else 0
    if ft == 0:
        return "ambiguous", 0, 1
    tm, tt = (tm, tt) if tt else (1, 1)  # terms_ratio = 1 when total_terms = 0
    if fm == 0:
        return "no_fact_matched", 5 * (70 * fm * tt + 21 * tm * ft), 100 * ft * tt
    if ct == 0:
        return (
            "no_conclusions",
            5 * (70 * fm * tt + 21 * tm * ft + 9 * o * ft * tt),
            100 * ft * tt,
        )
    numerator = 40 * fm * ct * tt + 30 * cm * ft * tt + 21 * tm * ft * ct + 9 * o * ft * ct * tt
    return "conclusions", 5 * numerator, 100 * ft * ct * tt


def test_every_small_count_matches_an_independent_computation():
    """All m ≤ t ≤ 6 in each category, both organizations (43,904 verdicts)."""
    wrong = []  # collected, not asserted one by one: this loop must stay fast
    float_wrong = set()
    checked = 0
    for fm, ft in PAIRS:
        for cm, ct in PAIRS:
            for tm, tt in PAIRS:
                for organization in ("matched", "mismatched"):
                    c = Counts(fm, ft, cm, ct, tm, tt, organization)
                    score = compute_score(c)
                    formula, n, d = _expected(fm, ft, cm, ct, tm, tt, organization)
                    exact = score.exact
                    # exact == n/d, and rounded == floor(n/d + 1/2), in integers
                    if not (
                        exact.numerator * d == n * exact.denominator
                        and score.rounded == (2 * n + d) // (2 * d)
                        and 0 <= score.rounded <= 5
                        and (score.formula or "ambiguous") == formula
                        and score.status is (Status.AMBIGUOUS if ft == 0 else Status.OK)
                    ):
                        wrong.append((c, score, Fraction(n, d)))
                    if exact.denominator == 2 and int(_float_score(c) + 0.5) != score.rounded:
                        float_wrong.add((fm, ft, cm, ct, tm, tt, organization))
                    checked += 1
    assert wrong == []
    assert checked == 43_904
    # the hard-coded float failures above are exactly what this scan finds
    assert float_wrong == {(*f, *c, *t, o) for f, c, t, o, _ in FLOAT_BELOW_TIE}


@pytest.mark.parametrize("fm, ft", [(0, 1), (1, 6), (6, 6)])
def test_score_lines_fit_the_schema_pattern(fm, ft):
    for cm, ct in PAIRS:
        for tm, tt in PAIRS:
            for organization in ("matched", "mismatched"):
                line = score_line(compute_score(Counts(fm, ft, cm, ct, tm, tt, organization)))
                assert re.fullmatch(SCORE_PATTERN, line), line


# ------------------------------------------- counts of other numeric types


def test_counts_of_other_types_keep_the_fraction_behaviour():
    # bools and Fractions are Rational: Fraction takes them as the integers they equal
    assert compute_score(Counts(True, True, 0, 0, 0, 0, "matched")).exact == 5
    assert compute_score(Counts(Fraction(1), 2, 0, 0, 0, 0, "matched")) == compute_score(
        Counts(1, 2, 0, 0, 0, 0, "matched")
    )
    with pytest.raises(TypeError):  # a float count is no count: Fraction refuses it
        compute_score(Counts(1.0, 2, 0, 0, 0, 0, "matched"))


@pytest.mark.parametrize("limit", [10**6, 10**40])
def test_large_counts_score_exactly(limit):
    score = compute_score(Counts(1, limit, 1, limit, 1, limit, "mismatched"))
    assert score.exact == 5 * (Fraction(4, 10 * limit) + Fraction(3, 10 * limit)
                               + Fraction(21, 100 * limit))
    assert score.rounded == 0


def test_a_score_is_computed_once_per_distinct_counts():
    # a judge gives few distinct counts: the Fraction arithmetic runs once for each, not per row
    from grader.judge.scoring import _known_score

    counts = Counts(2, 3, 0, 0, 1, 2, "matched")
    first = compute_score(counts)
    before = _known_score.cache_info()
    assert [compute_score(Counts(2, 3, 0, 0, 1, 2, "matched")) for _ in range(3)] == [first] * 3
    after = _known_score.cache_info()
    assert (after.misses, after.hits) == (before.misses, before.hits + 3)
