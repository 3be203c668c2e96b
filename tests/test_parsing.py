"""grader.judge.parsing.parse_verdict on every kind of judge answer, and records.judged_record."""

from __future__ import annotations

import json
from fractions import Fraction

import msgspec
import pytest
from answers import answer

from grader.judge.parsing import parse_verdict
from grader.judge.records import judged_record
from grader.judge.scoring import Counts
from grader.records import MatchCount
from grader.status import Status

RATIONALE = [
    "Fact: 2 of 3 correctly matched.",
    "Conclusion: 1 of 1 correctly matched.",
    "Terminology: 2 of 4 terms correctly matched.",
    "Organization: matched",
    "Score: 3 ≈ 3.21 = 5 × (0.4 × 2/3 + 0.3 × 1/1 + 0.21 × 2/4 + 0.09 × 1)",
]
COUNTS = Counts(2, 3, 1, 1, 2, 4, "matched")


def with_lines(*lines: str, score=3, checklist=None) -> str:
    """A compact answer whose first rationale lines are replaced by ``lines``."""
    rationale = [*lines, *RATIONALE[len(lines) :]]
    data = {"score": score, "rationale": rationale}
    if checklist is not None:
        data = {"checklist": checklist, **data}
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------- valid answers


def test_valid_answer_with_checklist():
    parsed = parse_verdict(answer())
    assert parsed.status is None and parsed.error is None
    assert parsed.counts == COUNTS
    assert parsed.model_score == 3
    assert parsed.checklist == ["Find the facts", "Find the conclusions", "Find the terms"]
    assert parsed.rationale == RATIONALE


def test_valid_answer_without_checklist():
    parsed = parse_verdict(answer(checklist=None))
    assert parsed.status is None
    assert parsed.counts == COUNTS
    assert parsed.checklist is None
    assert parsed.rationale == RATIONALE


def test_notes_after_the_counts_are_allowed():
    text = with_lines(
        "Fact: 4 of 5 correctly matched. The date is missing.",
        "Conclusion: 0 of 2 correctly matched. Neither conclusion is drawn.",
        "Terminology: 3 of 3 terms correctly matched. All terms present.",
        "Organization: mismatched The output is a list, the reference prose.",
    )
    parsed = parse_verdict(text)
    assert parsed.status is None
    assert parsed.counts == Counts(4, 5, 0, 2, 3, 3, "mismatched")


def test_three_digit_counts_and_lenient_spacing():
    text = with_lines(
        "  Fact:120  of  999 correctly matched.",
        "Conclusion: 0 of 0",
        "Terminology:7 of 10 terms",
        "Organization:matched",
    )
    assert parse_verdict(text).counts == Counts(120, 999, 0, 0, 7, 10, "matched")


def test_surrounding_whitespace_and_extra_keys_are_tolerated():
    data = json.loads(answer())
    data["comment"] = "not in the schema, ignored by the parser"
    parsed = parse_verdict("\n  " + json.dumps(data) + "\n")
    assert parsed.status is None and parsed.counts == COUNTS


def test_matched_above_total_still_parses_the_counts():
    # Parsing reads counts; judging them impossible is compute_score's job.
    parsed = parse_verdict(answer(facts=(5, 3)))
    assert parsed.status is None
    assert parsed.counts.facts_matched == 5 and parsed.counts.facts_total == 3


# ---------------------------------------------------------------- failures


@pytest.mark.parametrize(
    "text", [answer(), answer(checklist=None), '{"score":3,"rationale":["Fact']
)
def test_finish_reason_length_is_truncated_even_if_the_json_is_complete(text):
    parsed = parse_verdict(text, finish_reason="length")
    assert parsed.status is Status.TRUNCATED
    assert parsed.counts is None and parsed.model_score is None and parsed.rationale is None
    assert "max_tokens" in parsed.error


@pytest.mark.parametrize("finish_reason", ["stop", None])
def test_other_finish_reasons_parse(finish_reason):
    assert parse_verdict(answer(), finish_reason).counts == COUNTS


@pytest.mark.parametrize("text", [None, "", "   ", "\n\t"])
def test_empty_answer(text):
    parsed = parse_verdict(text)
    assert parsed.status is Status.PARSE_ERROR
    assert parsed.error == "empty answer"
    assert parsed.counts is None


@pytest.mark.parametrize(
    "text",
    [
        "Score: 3",
        "```json\n" + answer() + "\n```",
        answer()[:-1],  # cut one character short
        answer() + " trailing",
        "{'score': 3}",
    ],
)
def test_not_json(text):
    parsed = parse_verdict(text)
    assert parsed.status is Status.PARSE_ERROR
    assert parsed.error.startswith("not JSON: ")
    assert parsed.counts is None


@pytest.mark.parametrize(
    "text, kind", [("[1, 2, 3]", "list"), ('"text"', "str"), ("3", "int"), ("null", "NoneType")]
)
def test_json_that_is_not_an_object(text, kind):
    parsed = parse_verdict(text)
    assert parsed.status is Status.PARSE_ERROR
    assert parsed.error == f"expected a JSON object, got {kind}"


@pytest.mark.parametrize(
    "rationale",
    [
        RATIONALE[:4],
        [*RATIONALE, "a sixth line"],
        [],
        "Fact: 2 of 3 correctly matched.",
        [*RATIONALE[:4], 5],
        None,
    ],
)
def test_rationale_must_be_five_strings(rationale):
    data = {"checklist": ["a", "b", "c"], "score": 2, "rationale": rationale}
    parsed = parse_verdict(json.dumps(data))
    assert parsed.status is Status.PARSE_ERROR
    assert parsed.error == "rationale must be a list of 5 strings"
    assert parsed.counts is None
    # what could be read is kept for audit
    assert parsed.model_score == 2
    assert parsed.checklist == ["a", "b", "c"]


def test_missing_rationale_key():
    parsed = parse_verdict('{"score": 4}')
    assert parsed.status is Status.PARSE_ERROR and parsed.model_score == 4


@pytest.mark.parametrize("score", [3.0, 3.5, "3", True, None, [3]])
def test_non_integer_score_is_kept_as_none_and_the_counts_still_parse(score):
    parsed = parse_verdict(with_lines(score=score))
    assert parsed.model_score is None
    assert parsed.status is None and parsed.counts == COUNTS


def test_out_of_range_integer_score_is_kept_for_audit():
    assert parse_verdict(with_lines(score=7)).model_score == 7


@pytest.mark.parametrize("checklist", [["a", 1, "c"], "a, b, c", {"a": 1}])
def test_a_checklist_that_is_not_a_list_of_strings_is_dropped(checklist):
    parsed = parse_verdict(with_lines(checklist=checklist))
    assert parsed.checklist is None and parsed.counts == COUNTS


@pytest.mark.parametrize(
    "lines, label",
    [
        (["Fact: two of three correctly matched."], "Fact"),
        (["Facts: 2 of 3 correctly matched."], "Fact"),
        (["fact: 2 of 3 correctly matched."], "Fact"),  # only Organization ignores case
        (["Fact: 2/3 correctly matched."], "Fact"),
        (["Fact: -1 of 3 correctly matched."], "Fact"),
        (["Fact: 2.5 of 3 correctly matched."], "Fact"),
        (["Fact: 2 of 3.5 correctly matched."], "Fact"),  # not "2 of 3"
        (["Fact: 2 of 3,5 correctly matched."], "Fact"),
        (["Fact: 2 of 3x correctly matched."], "Fact"),
        (["The answer has 2 of 3 facts. Fact: 2 of 3 correctly matched."], "Fact"),
        ([RATIONALE[1], RATIONALE[0]], "Fact"),  # lines out of order
        ([RATIONALE[0], "Conclusion: none"], "Conclusion"),
        ([RATIONALE[0], "Conclusion: N/A"], "Conclusion"),
        ([RATIONALE[0], RATIONALE[1], "Terminology: 2 of"], "Terminology"),
        ([RATIONALE[0], RATIONALE[1], "Terms: 2 of 4 terms correctly matched."], "Terminology"),
    ],
)
def test_count_lines_that_do_not_parse_are_invalid_counts(lines, label):
    parsed = parse_verdict(with_lines(*lines))
    assert parsed.status is Status.INVALID_COUNTS
    assert parsed.error.startswith(f"no '{label}: <m> of <t>' in ")
    assert parsed.counts is None
    assert parsed.model_score == 3 and len(parsed.rationale) == 5  # kept for audit


def test_a_count_too_long_for_int_is_invalid_counts_not_a_crash():
    # int() refuses strings of more than 4300 digits (sys.get_int_max_str_digits): a ValueError
    # used to escape parse_verdict and stop the whole run.
    parsed = parse_verdict(with_lines(f"Fact: {'9' * 5000} of 3 correctly matched."))
    assert parsed.status is Status.INVALID_COUNTS
    assert "too long" in parsed.error
    assert parsed.counts is None


@pytest.mark.parametrize(
    "line, organization",
    [
        ("Organization: matched", "matched"),
        ("Organization: mismatched", "mismatched"),
        ("Organization: MATCHED", "matched"),
        ("Organization: Mismatched", "mismatched"),
        ("organization: mIsMaTcHeD", "mismatched"),
        ("ORGANIZATION:matched.", "matched"),
        ("Organization: matched (same order of points)", "matched"),
        ("Organization: mismatched, the output is a table", "mismatched"),
    ],
)
def test_organization_is_case_insensitive_and_normalised(line, organization):
    parsed = parse_verdict(with_lines(*RATIONALE[:3], line))
    assert parsed.status is None
    assert parsed.counts.organization == organization
    assert parsed.rationale[3] == line  # the judge's text is kept verbatim


@pytest.mark.parametrize(
    "line",
    [
        "Organization: matchedx",
        "Organization: unmatched",
        "Organization: partially matched",
        "Organization: 1",
        "Organization:",
        "Structure: matched",
        "Organization: matched/mismatched",  # the seed's template copied verbatim: no answer
        "Organization: Matched / Mismatched",
        "Organization: mismatched|matched",
    ],
)
def test_organization_that_does_not_parse_is_invalid_counts(line):
    parsed = parse_verdict(with_lines(*RATIONALE[:3], line))
    assert parsed.status is Status.INVALID_COUNTS
    assert parsed.error.startswith("no 'Organization: matched|mismatched' in ")


# ---------------------------------------------------------------- judged_record, end to end


def test_judged_record_recomputes_the_score_and_rewrites_the_fifth_line():
    raw = answer(
        facts=(2, 3),
        conclusions=(1, 1),
        terms=(2, 4),
        organization="matched",
        score=3,
        score_line="Score: 3 ≈ 3.21 = 5 × (0.4 × 2/3 + 0.3 × 1/1 + 0.21 × 2/4 + 0.09 × 1)",
    )
    record = judged_record("row-1", raw, "stop", usage={"output_tokens": 120})
    # 5 × (0.4 × 2/3 + 0.3 + 0.21 × 1/2 + 0.09) = 457/120 = 3.808…: the judge said 3 (3.21)
    exact = Fraction(457, 120)
    assert record.status == "ok"
    assert record.score == 4
    assert record.score_exact == float(exact)
    assert Fraction(record.score_exact).limit_denominator(1000) == exact
    assert record.model_score == 3  # the judge's own score, kept for audit
    assert record.grade == {
        "score": 4,
        "rationale": [
            *RATIONALE[:4],
            "Score: 4 ≈ 3.81 = 5 × (0.4 × 2/3 + 0.3 × 1/1 + 0.21 × 2/4 + 0.09 × 1)",
        ],
    }
    assert msgspec.to_builtins(record.counts) == {
        "facts": {"matched": 2, "total": 3},
        "conclusions": {"matched": 1, "total": 1},
        "terms": {"matched": 2, "total": 4},
        "organization": "matched",
    }
    assert record.formula == "conclusions"
    assert record.checklist == ["Find the facts", "Find the conclusions", "Find the terms"]
    assert record.raw_output == raw and record.finish_reason == "stop"
    assert record.usage == {"output_tokens": 120}
    assert record.error is None and record.id == "row-1"


def test_judged_record_keeps_the_judges_notes_in_the_first_four_lines():
    lines = (
        "Fact: 0 of 2 correctly matched. Both facts are wrong.",
        "Conclusion: 1 of 1 correctly matched. The conclusion is there.",
        "Terminology: 0 of 0 terms correctly matched. No key terms.",
        "Organization: Matched Same order.",
    )
    record = judged_record(7, with_lines(*lines, score=2), "stop")
    assert record.grade["rationale"][:4] == list(lines)
    # no fact matched: 5 × (0.7 × 0/2 + 0.21 × 1) = 1.05, organization and conclusion ignored
    assert record.grade["rationale"][4] == "Score: 1 ≈ 1.05 = 5 × (0.7 × 0/2 + 0.21 × 1)"
    assert record.score == 1 and record.score_exact == 1.05
    assert record.formula == "no_fact_matched"
    assert record.model_score == 2
    assert record.counts.organization == "matched"


def test_judged_record_exact_tie_rounds_up():
    # 5 × (0.4 × 1/4 + 0.3 × 3/4 + 0.21 × 5/6) = 5/2 exactly; floats give 2.4999999999999996
    record = judged_record(1, answer(facts=(1, 4), conclusions=(3, 4), terms=(5, 6),
                                     organization="mismatched"), "stop")
    assert record.score == 3 and record.score_exact == 2.5
    assert record.grade["rationale"][4].startswith("Score: 3 ≈ 2.50 = ")


def test_judged_record_ambiguous():
    record = judged_record(1, answer(facts=(0, 0)), "stop")
    assert record.status == "ambiguous"
    assert record.score == 0 and record.score_exact == 0.0
    assert record.grade["score"] == 0
    assert record.grade["rationale"][4].startswith("Score: 0 ≈ 0.00 = ambiguous")
    assert record.error == "total_facts is 0"
    assert record.model_score == 3


def test_judged_record_invalid_counts_has_counts_but_no_score():
    record = judged_record(1, answer(terms=(5, 4)), "stop")
    assert record.status == "invalid_counts"
    assert record.score is None and record.score_exact is None and record.grade is None
    assert record.counts.terms == MatchCount(5, 4)
    assert record.error == "terms: matched 5 of 4 is impossible"
    assert record.model_score == 3


def test_judged_record_unparsable_counts():
    record = judged_record(1, answer(organization="matched/mismatched"), "stop")
    assert record.status == "invalid_counts"
    assert record.counts is None and record.score is None
    assert record.model_score == 3 and record.checklist is not None


def test_judged_record_truncated_keeps_the_raw_text():
    raw = answer()
    record = judged_record(1, raw, "length")
    assert record.status == "truncated"
    assert record.score is None and record.grade is None and record.counts is None
    assert record.raw_output == raw and record.finish_reason == "length"


def test_judged_record_parse_error():
    record = judged_record(1, "I cannot grade this.", "stop")
    assert record.status == "parse_error"
    assert record.score is None and record.model_score is None
    assert record.error.startswith("not JSON")
