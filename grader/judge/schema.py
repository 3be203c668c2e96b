"""The judge's answer as pydantic models, and the JSON schema made from them.

This is the only module that defines the shape of a judge answer. The schema is what both
backends force with xgrammar, so every string carries its length bound inside its ``pattern``:
xgrammar rejects ``pattern`` together with ``maxLength`` (mlc-ai/xgrammar#966; vLLM refuses
such a schema in ``has_xgrammar_unsupported_json_features``).
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from grader.judge.scoring import COUNT_LINES

# Characters allowed in free text: anything but a double quote, a backslash, a control
# character or a surrogate. With these excluded the JSON text of a string is the string itself,
# so a length bound in characters is also a bound on the JSON, and no escape sequence can appear.
# Surrogates are excluded because xgrammar 0.2.8 accepts the bytes ED A0-BF xx (a surrogate
# "encoded" in UTF-8, which is invalid UTF-8): the tiny model produced them, and the decoder
# turned each into three U+FFFD, breaking the length bound. Python's `re` and xgrammar both
# read the \ud800-\udfff range; pydantic-core's Rust regex cannot, hence regex_engine below.
FREE = r'[^"\\\x00-\x1f\ud800-\udfff]'
NOTE_MAX = 100
CHECKLIST_ITEM_MAX = 100
CALCULATION_MAX = 160
CHECKLIST_MIN_ITEMS, CHECKLIST_MAX_ITEMS = 3, 7
COUNT = r"(0|[1-9][0-9]{0,2})"  # 0..999: a judge that counts more facts than that is wrong anyway
# An optional group is written `(...){0,1}`, never `(...)?`: xgrammar 0.2.8 compiles
# `( [a-z]{1,5})?` as if only part of the group were optional, so "matchedx" passed where
# "matched x" was meant (seen with the tiny model; tests/test_verdict.py pins the workaround).
NOTE = rf"( {FREE}{{1,{NOTE_MAX}}}){{0,1}}"

FACT_PATTERN, CONCLUSION_PATTERN, TERMINOLOGY_PATTERN = (
    rf"^{line.pattern(COUNT)}{NOTE}$" for line in COUNT_LINES
)
ORGANIZATION_PATTERN = rf"^Organization: (matched|mismatched){NOTE}$"
SCORE_PATTERN = rf"^Score: [0-5] ≈ [0-5](\.[0-9]{{1,2}}){{0,1}} = {FREE}{{1,{CALCULATION_MAX}}}$"
CHECKLIST_ITEM_PATTERN = rf"^{FREE}{{1,{CHECKLIST_ITEM_MAX}}}$"

# A JSON Schema as the grammar engines take it (xgrammar through vLLM, or transformers): JSON
# of another tool's format, built here from pydantic models and handed over as it is.
JsonSchema = dict[str, Any]

RATIONALE_PATTERNS = (FACT_PATTERN, CONCLUSION_PATTERN, TERMINOLOGY_PATTERN, ORGANIZATION_PATTERN,
                      SCORE_PATTERN)


def _object(text: str) -> JsonSchema:
    """A schema of grader's own (its JSON text) as a fresh object a caller may change."""
    schema = json.loads(text)
    assert isinstance(schema, dict)  # grader's own schema text: always an object
    return schema


def _no_control_character(value: str) -> str:
    # With regex_engine="python-re", `$` also matches before a final "\n" (Python's re), which
    # the schema's ECMA-style `$` and xgrammar do not allow. No string of the schema may hold a
    # control character at all, so rejecting them restores the pattern's meaning exactly.
    if any(ord(c) < 0x20 for c in value):
        raise ValueError("control characters are not allowed")
    return value


# A string of the schema is `Annotated[str, StringConstraints(pattern=...), _NO_CONTROL]`:
# pinned by its pattern, validated by pydantic exactly as the schema means it. Written out at
# each use, not made by a function, so that a type checker reads it as a type.
_NO_CONTROL = AfterValidator(_no_control_character)


def line_type(pattern: str) -> Any:
    """The string type pinned by ``pattern``, for a run-time ``TypeAdapter``."""
    return Annotated[str, StringConstraints(pattern=pattern), _NO_CONTROL]


Rationale = tuple[
    Annotated[str, StringConstraints(pattern=FACT_PATTERN), _NO_CONTROL],
    Annotated[str, StringConstraints(pattern=CONCLUSION_PATTERN), _NO_CONTROL],
    Annotated[str, StringConstraints(pattern=TERMINOLOGY_PATTERN), _NO_CONTROL],
    Annotated[str, StringConstraints(pattern=ORGANIZATION_PATTERN), _NO_CONTROL],
    Annotated[str, StringConstraints(pattern=SCORE_PATTERN), _NO_CONTROL],
]


class Verdict(BaseModel):
    """The seed's output format: a score 0-5 and five fixed rationale lines."""

    model_config = ConfigDict(extra="forbid", title="Verdict", regex_engine="python-re")

    score: int = Field(ge=0, le=5, strict=True)  # as the schema: no "3", 3.0 or true
    rationale: Rationale


class ChecklistVerdict(BaseModel):
    """The seed's output format, its concise checklist of 3-7 items moved inside the JSON."""

    model_config = ConfigDict(extra="forbid", title="Verdict", regex_engine="python-re")

    checklist: list[Annotated[str, StringConstraints(pattern=CHECKLIST_ITEM_PATTERN), _NO_CONTROL]] = (
        Field(min_length=CHECKLIST_MIN_ITEMS, max_length=CHECKLIST_MAX_ITEMS))
    score: int = Field(ge=0, le=5, strict=True)  # as the schema: no "3", 3.0 or true
    rationale: Rationale


def verdict_model(checklist: bool = True) -> type[BaseModel]:
    """The pydantic model of a judge answer, with or without the checklist field."""
    return ChecklistVerdict if checklist else Verdict


@lru_cache(maxsize=8)
def _schema_text(model: type[BaseModel]) -> str:
    # Never sort keys: xgrammar emits properties in the schema's order, and the seed asks
    # for "score" before "rationale".
    return json.dumps(model.model_json_schema())


def verdict_schema(checklist: bool = True) -> JsonSchema:
    """The JSON Schema both backends force; a fresh copy on every call."""
    return _object(_schema_text(verdict_model(checklist)))


def max_answer_chars(checklist: bool = True) -> int:
    """The longest compact JSON answer the schema admits, in characters.

    Used as the default ``max_tokens``: a token of a real tokenizer spans at least one
    character except for byte-fallback pieces of rare non-ASCII text, so a conforming answer
    fits. An answer cut short anyway is reported as ``truncated``, never graded.
    """
    fixed_lines = {
        # literal text of each line at its longest, plus its optional note
        **{line.category: len(line.text(999, 999)) + 1 + NOTE_MAX for line in COUNT_LINES},
        "organization": len("Organization: mismatched") + 1 + NOTE_MAX,
        "score": len("Score: 5 ≈ 5.00 = ") + CALCULATION_MAX,
    }
    rationale = sum(n + 2 for n in fixed_lines.values()) + len(fixed_lines) - 1 + 2
    total = len('{"score":5,"rationale":}') + rationale
    if checklist:
        items = CHECKLIST_MAX_ITEMS * (CHECKLIST_ITEM_MAX + 2) + CHECKLIST_MAX_ITEMS - 1 + 2
        total += len('"checklist":,') + items
    return total


# The itemized format. A judge that is not a reasoning model does only the work it
# writes, so it writes the seed's enumeration itself: each reference fact, conclusion and key
# term, a quote from the model output as evidence, and whether it is present. grader counts
# the items; the judge's own count lines come after them, kept for audit only. Every string
# has a purpose and a tight bound: a weak model fills any free text up to its cap.
ITEM_MAX = 80  # a fact or conclusion restated in a short sentence
TERM_MAX = 40  # a key term is a few words
QUOTE_MAX = 60  # evidence is a short verbatim quote, not a justification essay
FACTS_MAX, CONCLUSIONS_MAX, TERMS_MAX = 8, 4, 8
ITEM_PATTERN = rf"^{FREE}{{1,{ITEM_MAX}}}$"
TERM_PATTERN = rf"^{FREE}{{1,{TERM_MAX}}}$"
# empty = no evidence in the model output
QUOTE_PATTERN = rf"^{FREE}{{0,{QUOTE_MAX}}}$"
TERM_QUOTE_PATTERN = rf"^{FREE}{{0,{TERM_MAX}}}$"
# The judge's count lines without the seed's optional note: a note is free text a weak model
# fills with repetition, and here the items already say what the note would.
FACT_COUNT_PATTERN, CONCLUSION_COUNT_PATTERN, TERMINOLOGY_COUNT_PATTERN = (
    rf"^{line.pattern(COUNT)}$" for line in COUNT_LINES
)

ANSWER_FORMATS = ("rubric", "itemized", "seed", "pairwise")


class Finding(BaseModel):
    """One reference fact or conclusion: the quote comes before the verdict it supports."""

    model_config = ConfigDict(extra="forbid", title="Finding", regex_engine="python-re")

    item: Annotated[str, StringConstraints(pattern=ITEM_PATTERN), _NO_CONTROL]
    quote: Annotated[str, StringConstraints(pattern=QUOTE_PATTERN), _NO_CONTROL]
    present: bool = Field(strict=True)


class TermFinding(BaseModel):
    """One reference key term, its quote and whether it is present."""

    model_config = ConfigDict(extra="forbid", title="TermFinding", regex_engine="python-re")

    item: Annotated[str, StringConstraints(pattern=TERM_PATTERN), _NO_CONTROL]
    quote: Annotated[str, StringConstraints(pattern=TERM_QUOTE_PATTERN), _NO_CONTROL]
    present: bool = Field(strict=True)


class ItemizedVerdict(BaseModel):
    """The itemized format: the enumeration, the organization verdict, then what the judge
    derives from them (its count lines and score, kept for audit; grader recounts)."""

    model_config = ConfigDict(extra="forbid", title="ItemizedVerdict", regex_engine="python-re")

    facts: list[Finding] = Field(max_length=FACTS_MAX)
    conclusions: list[Finding] = Field(max_length=CONCLUSIONS_MAX)
    terms: list[TermFinding] = Field(max_length=TERMS_MAX)
    organization: Literal["matched", "mismatched"]
    rationale: tuple[
        Annotated[str, StringConstraints(pattern=FACT_COUNT_PATTERN), _NO_CONTROL],
        Annotated[str, StringConstraints(pattern=CONCLUSION_COUNT_PATTERN), _NO_CONTROL],
        Annotated[str, StringConstraints(pattern=TERMINOLOGY_COUNT_PATTERN), _NO_CONTROL],
    ]
    score: int = Field(ge=0, le=5, strict=True)


# The rubric format (grader.judge.rubric): the rubric pass's answer, and the check pass's, whose
# schema is made per rubric size. Labels are one letter each, all in one string ("yny"): at most
# one token an item (docs/judging.md), where an array of "y"/"n" costs up to four. The keys are
# one letter for the same reason: "l" the labels, "q" the quotes (--evidence), "o" the
# organization; the record spells them out (items with ``present``, counts.organization).
LABELS, QUOTES, ORGANIZATION = "l", "q", "o"
PRESENT, ABSENT = "y", "n"
ORGANIZATIONS = ("matched", "mismatched")


class RubricDraft(BaseModel):
    """The rubric pass's answer: the reference's items, short, no quotes of any answer."""

    model_config = ConfigDict(extra="forbid", title="RubricDraft", regex_engine="python-re")

    facts: list[Annotated[str, StringConstraints(pattern=ITEM_PATTERN), _NO_CONTROL]] = Field(min_length=1, max_length=FACTS_MAX)
    conclusions: list[Annotated[str, StringConstraints(pattern=ITEM_PATTERN), _NO_CONTROL]] = Field(max_length=CONCLUSIONS_MAX)
    terms: list[Annotated[str, StringConstraints(pattern=TERM_PATTERN), _NO_CONTROL]] = Field(max_length=TERMS_MAX)


# An annotation on the rubric pass's schema (every backend takes it off before it builds the
# grammar): the draft is lists of distinct items, so a judge whose output repeats its last tokens
# verbatim is looping (docs/benchmarks.md). The value is the loop, as vLLM's
# SamplingParams.repetition_detection reads it (grader.run.rows makes it the request's stop
# rule): the last N tokens equal the N before them, N from min_pattern_size to max_pattern_size;
# min_count copies. A draft ended there reads up to its last complete item
# (grader.judge.rubric.parse_draft). Four tokens at least: a word may repeat a token or two.
END_ON_LOOP = "x-grader-end-on-loop"
LOOP = {"min_pattern_size": 4, "max_pattern_size": 64, "min_count": 2}
# The finish_reason of a row ended there (vLLM's own word; every backend says the same).
LOOPED = "repetition"


def draft_schema() -> JsonSchema:
    """The rubric pass's JSON Schema (tests/golden/schema_rubric.json); a fresh copy."""
    return _object(_schema_text(RubricDraft)) | {END_ON_LOOP: dict(LOOP)}


def draft_max_chars() -> int:
    """The longest compact JSON answer :class:`RubricDraft` admits, in characters."""
    lists = (FACTS_MAX + CONCLUSIONS_MAX) * (ITEM_MAX + 3) + TERMS_MAX * (TERM_MAX + 3) + 6
    return len('{"facts":,"conclusions":,"terms":}') + lists


# xgrammar (0.2.x, as vLLM pins it) fails a regex repetition above 128, failing every row of
# the batch (vllm_compat, "xgrammar-pin"): the labels' pattern is written in pieces of 128.
_MAX_REPEAT = 128


def labels_pattern(size: int) -> str:
    """The check pass's labels: exactly ``size`` of ``y``/``n``, as a regex xgrammar compiles."""
    pieces: list[str] = []
    left = size
    while left > 0 or not pieces:
        count = min(left, _MAX_REPEAT)
        pieces.append(f"[{PRESENT}{ABSENT}]{{{count}}}")
        left -= count
    return "^" + "".join(pieces) + "$"


def labels_size(pattern: str) -> int:
    """The number of labels :func:`labels_pattern` asks for (its pieces added up)."""
    return sum(int(count) for count in re.findall(r"\{(\d+)\}", pattern))


@lru_cache(maxsize=64)
def _check_schema_text(size: int, evidence: bool) -> str:
    properties: JsonSchema = {LABELS: {"type": "string", "pattern": labels_pattern(size)}}
    required = [LABELS]
    if evidence:
        # One short quote per item, "" for an item labelled absent; checked by string search.
        quote = {"type": "string", "pattern": QUOTE_PATTERN}
        properties[QUOTES] = {"type": "array", "items": quote, "minItems": size, "maxItems": size}
        required.append(QUOTES)
    properties[ORGANIZATION] = {"enum": list(ORGANIZATIONS)}
    required.append(ORGANIZATION)
    schema = {"type": "object", "properties": properties, "required": required,
              "additionalProperties": False, "title": "Labels"}
    return json.dumps(schema)


def check_schema(size: int, evidence: bool = False) -> JsonSchema:
    """The check pass's schema for a rubric of ``size`` items: exactly ``size`` labels."""
    return _object(_check_schema_text(size, evidence))


def check_max_chars(size: int, evidence: bool = False) -> int:
    """The longest answer :func:`check_schema` admits, in characters."""
    chars = len('{"l":"","o":"mismatched"}') + size
    if evidence:
        chars += len(',"q":[]') + size * (QUOTE_MAX + 3)
    return chars


# The pairwise format: one verdict, key "v", value "A" (shown first), "B" (shown second) or
# "tie": each begins with its own letter, so the verdict is decided at one token, the one
# --confidence reads (grader.judge.confidence).
VERDICT = "v"
VERDICTS = ("A", "B", "tie")


class PairwiseVerdict(BaseModel):
    """The pairwise format's answer: which of the two answers is better, or a tie."""

    model_config = ConfigDict(extra="forbid", title="PairwiseVerdict")

    v: Literal["A", "B", "tie"]


def pairwise_max_chars() -> int:
    """The longest compact JSON answer :class:`PairwiseVerdict` admits, in characters."""
    return len(json.dumps({VERDICT: max(VERDICTS, key=len)}, separators=(",", ":")))


def format_model(answer_format: str = "seed", checklist: bool = True) -> type[BaseModel]:
    """The pydantic model of a judge answer in ``answer_format``; for ``rubric``, the rubric
    pass's (the check pass's schema is per row: :func:`grader.judge.rubric.check_schema`)."""
    if answer_format == "pairwise":
        return PairwiseVerdict
    if answer_format == "rubric":
        return RubricDraft
    if answer_format == "itemized":
        return ItemizedVerdict
    if answer_format == "seed":
        return verdict_model(checklist)
    raise ValueError(f"unknown format {answer_format!r}: choose from {', '.join(ANSWER_FORMATS)}")


def format_schema(answer_format: str = "seed", checklist: bool = True) -> JsonSchema:
    """The JSON Schema of ``answer_format`` (the pairwise format's:
    tests/golden/schema_pairwise.json); a fresh copy on every call."""
    if answer_format == "rubric":
        return draft_schema()
    return _object(_schema_text(format_model(answer_format, checklist)))


def format_max_chars(answer_format: str = "seed", checklist: bool = True) -> int:
    """The longest compact JSON answer ``answer_format`` admits, in characters."""
    if answer_format == "rubric":  # the rubric pass's answer is the longer of its two
        return max(draft_max_chars(), check_max_chars(FACTS_MAX + CONCLUSIONS_MAX + TERMS_MAX, True))
    if answer_format == "pairwise":
        return pairwise_max_chars()
    if answer_format != "itemized":
        format_model(answer_format, checklist)
        return max_answer_chars(checklist)
    finding = len('{"item":"","quote":"","present":false}')
    facts = FACTS_MAX * (finding + ITEM_MAX + QUOTE_MAX + 1) + 1
    conclusions = CONCLUSIONS_MAX * (finding + ITEM_MAX + QUOTE_MAX + 1) + 1
    terms = TERMS_MAX * (finding + 2 * TERM_MAX + 1) + 1
    # each line in quotes, then two commas and two brackets
    lines = sum(len(line.text(999, 999)) + 2 for line in COUNT_LINES) + 2 + 2
    keys = len('{"facts":,"conclusions":,"terms":,"organization":"mismatched","rationale":,"score":5}')
    return keys + facts + conclusions + terms + lines
