"""The judge's raw text -> a parsed verdict, or a typed failure. Pure.

Parsing is deliberately more lenient than the schema (a results file from another tool, or a
run without guided decoding, can be rescored): it needs valid JSON with a ``rationale`` of five
strings whose first four lines carry the counts. Anything less is a failure with a reason,
never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from msgspec import UNSET

from grader.io.jsonlines import loads
from grader.judge.scoring import COUNT_LINES, Counts
from grader.records import Finding, MarkedItems
from grader.status import Status

# A total must end where its digits end: "2 of 3.5" is not "2 of 3".
_COUNTS = r":\s*(\d+)\s+of\s+(\d+)\b(?![.,]\d)"
# Leniently: the judge's "m of t" after the line's label, whatever follows (COUNT_LINES).
_COUNT_LINES = tuple((line.label, re.compile(rf"^\s*{line.label}{_COUNTS}")) for line in COUNT_LINES)
# The seed's template "matched/mismatched" copied verbatim is no answer.
_ORGANIZATION = re.compile(r"^\s*Organization:\s*(matched|mismatched)\b(?!\s*[/|])", re.IGNORECASE)


@dataclass(frozen=True)
class ParsedVerdict:
    """A judge answer split into what is kept for audit and what is recomputed."""

    status: Status | None  # None when the counts parsed; a failure status otherwise
    error: str | None = None
    counts: Counts | None = None
    model_score: int | None = None
    checklist: list[str] | None = None
    rationale: list[str] | None = None


def _failure(status: Status, error: str, **kept: Any) -> ParsedVerdict:
    return ParsedVerdict(status=status, error=error, **kept)


def _answer_object(text: str | None, finish_reason: str | None) -> dict[str, object] | tuple[Status, str]:
    """The judge's answer as a JSON object, or ``(status, reason)`` why it is none.

    ``finish_reason`` ``"length"`` means the answer was cut at max_tokens: it is ``truncated``
    whatever it holds, since a cut answer may parse yet be wrong.
    """
    if finish_reason == "length":
        return Status.TRUNCATED, "the answer reached max_tokens before it ended"
    if text is None or not text.strip():
        return Status.PARSE_ERROR, "empty answer"
    try:
        data = loads(text)  # msgspec; where it declines, json decides and words the error
    except ValueError as exc:  # bad syntax, a 5000-digit number, nesting too deep
        return Status.PARSE_ERROR, f"not JSON: {str(exc).removeprefix('invalid JSON: ')}"
    if not isinstance(data, dict):
        return Status.PARSE_ERROR, f"expected a JSON object, got {type(data).__name__}"
    return data


def parse_verdict(text: str | None, finish_reason: str | None = "stop") -> ParsedVerdict:
    """Parse one judge answer.

    Args:
        text: the judge's completion text.
        finish_reason: ``"length"`` means the answer was cut at max_tokens: it is
            ``truncated`` whatever it contains, since a cut answer may parse yet be wrong.
    """
    data = _answer_object(text, finish_reason)
    if isinstance(data, tuple):
        return _failure(*data)

    model_score = _model_score(data)
    checklist = data.get("checklist")
    # decoded JSON holds only plain str, so "type is str" is isinstance(, str) here
    if not (type(checklist) is list and _all_str(checklist)):
        checklist = None
    rationale = data.get("rationale")
    if not (type(rationale) is list and len(rationale) == 5 and _all_str(rationale)):
        return _failure(Status.PARSE_ERROR, "rationale must be a list of 5 strings",
                        model_score=model_score, checklist=checklist)
    kept = {"model_score": model_score, "checklist": checklist, "rationale": rationale}

    numbers: list[int] = []
    for (label, pattern), line in zip(_COUNT_LINES, rationale, strict=False):  # lines 1-3 of 5
        match = pattern.match(line)
        if match is None:
            return _failure(Status.INVALID_COUNTS, f"no '{label}: <m> of <t>' in {line!r}", **kept)
        matched, total = match.groups()
        try:
            numbers += [int(matched), int(total)]
        except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
            return _failure(Status.INVALID_COUNTS, f"a count too long in {label} line", **kept)
    organization = _ORGANIZATION.match(rationale[3])
    if organization is None:
        return _failure(Status.INVALID_COUNTS,
                        f"no 'Organization: matched|mismatched' in {rationale[3]!r}", **kept)
    counts = Counts.from_numbers(numbers, organization.group(1).lower())
    return ParsedVerdict(None, None, counts, model_score, checklist, rationale)


def _model_score(data: dict[str, object]) -> int | None:
    """The judge's own score, kept for audit: an int, or None."""
    score = data.get("score")
    return score if type(score) is int else None


def _all_str(values: list[Any]) -> bool:
    for value in values:  # a plain loop: a generator into all() costs twice as much
        if type(value) is not str:
            return False
    return True


# ---------------------------------------------------------------- the itemized format

CATEGORIES = tuple(line.category for line in COUNT_LINES)


@dataclass(frozen=True)
class ParsedItems:
    """An itemized answer: the judge's items, the counts derived from them, its own claims."""

    status: Status | None  # None when the items parsed; a failure status otherwise
    error: str | None = None
    counts: Counts | None = None
    items: MarkedItems[Finding] | None = None
    judge_lines: list[str] | None = None  # the judge's own count lines, for audit
    model_score: int | None = None


def parse_itemized(text: str | None, finish_reason: str | None = "stop") -> ParsedItems:
    """Parse an itemized answer and count its items; the judge's count lines are not used.

    As lenient as :func:`parse_verdict` where it can be (the count lines and score may be
    missing or malformed: they are audit only), strict where the score depends on it: each
    category a list of objects with a boolean ``present``, and an organization verdict.
    """
    data = _answer_object(text, finish_reason)
    if isinstance(data, tuple):
        return ParsedItems(*data)
    model_score = _model_score(data)
    lines = data.get("rationale")
    judge_lines = lines if type(lines) is list and _all_str(lines) else None

    lists: list[list[Finding]] = []
    for category in CATEGORIES:
        entries = data.get(category)
        if type(entries) is not list or not all(
                type(e) is dict and type(e.get("present")) is bool for e in entries):
            return ParsedItems(Status.PARSE_ERROR,
                               f"{category} must be a list of objects with a boolean 'present'",
                               judge_lines=judge_lines, model_score=model_score)
        lists.append(_findings(entries))
    items = MarkedItems(*lists)
    organization = data.get("organization")
    if organization not in ("matched", "mismatched"):
        return ParsedItems(Status.INVALID_COUNTS,
                           f"organization must be matched or mismatched, got {organization!r}",
                           items=items, judge_lines=judge_lines, model_score=model_score)
    return ParsedItems(None, None, Counts.from_numbers(items.numbers(), organization), items,
                       judge_lines=judge_lines, model_score=model_score)


def _findings(entries: list[dict[str, Any]]) -> list[Finding]:
    """The answer's items as the record keeps them: each one's item and quote where they are
    strings (a judge without a schema may leave them out or write others), and its
    ``present``. What else an entry holds is not kept: the score does not read it, and
    raw_output has it. (A plain loop: msgspec.convert of the list costs twice as much.)"""
    findings = []
    for entry in entries:
        item, quote = entry.get("item", UNSET), entry.get("quote", UNSET)
        findings.append(Finding(item=item if type(item) is str else UNSET,
                                quote=quote if type(quote) is str else UNSET,
                                present=entry["present"]))
    return findings


def claimed_counts(line: str) -> tuple[str, int, int] | None:
    """``(label, matched, total)`` of a judge's count line, or None when it claims none."""
    for label, pattern in _COUNT_LINES:
        match = pattern.match(line)
        if match:
            return label, int(match.group(1)), int(match.group(2))
    return None
