"""The judge's answer as pydantic models, and the JSON schema made from them.

This is the only module that defines the shape of a judge answer. The schema is what both
backends force with xgrammar, so every string carries its length bound inside its ``pattern``:
xgrammar rejects ``pattern`` together with ``maxLength`` (mlc-ai/xgrammar#966; vLLM 0.32.0
refuses such a schema in ``has_xgrammar_unsupported_json_features``).
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

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

FACT_PATTERN = rf"^Fact: {COUNT} of {COUNT} correctly matched\.{NOTE}$"
CONCLUSION_PATTERN = rf"^Conclusion: {COUNT} of {COUNT} correctly matched\.{NOTE}$"
TERMINOLOGY_PATTERN = rf"^Terminology: {COUNT} of {COUNT} terms correctly matched\.{NOTE}$"
ORGANIZATION_PATTERN = rf"^Organization: (matched|mismatched){NOTE}$"
SCORE_PATTERN = rf"^Score: [0-5] ≈ [0-5](\.[0-9]{{1,2}}){{0,1}} = {FREE}{{1,{CALCULATION_MAX}}}$"
CHECKLIST_ITEM_PATTERN = rf"^{FREE}{{1,{CHECKLIST_ITEM_MAX}}}$"

RATIONALE_PATTERNS = (
    FACT_PATTERN,
    CONCLUSION_PATTERN,
    TERMINOLOGY_PATTERN,
    ORGANIZATION_PATTERN,
    SCORE_PATTERN,
)


def _no_control_character(value: str) -> str:
    # With regex_engine="python-re", `$` also matches before a final "\n" (Python's re), which
    # the schema's ECMA-style `$` and xgrammar do not allow. No string of the schema may hold a
    # control character at all, so rejecting them restores the pattern's meaning exactly.
    if any(ord(c) < 0x20 for c in value):
        raise ValueError("control characters are not allowed")
    return value


def line_type(pattern: str) -> Any:
    """A string pinned by ``pattern``, validated by pydantic exactly as the schema means it."""
    return Annotated[str, StringConstraints(pattern=pattern), AfterValidator(_no_control_character)]


Rationale = tuple[
    line_type(FACT_PATTERN),
    line_type(CONCLUSION_PATTERN),
    line_type(TERMINOLOGY_PATTERN),
    line_type(ORGANIZATION_PATTERN),
    line_type(SCORE_PATTERN),
]


class Verdict(BaseModel):
    """The seed's output format: a score 0-5 and five fixed rationale lines."""

    model_config = ConfigDict(extra="forbid", title="Verdict", regex_engine="python-re")

    score: int = Field(ge=0, le=5, strict=True)  # as the schema: no "3", 3.0 or true
    rationale: Rationale


class ChecklistVerdict(BaseModel):
    """The seed's output format, its concise checklist of 3-7 items moved inside the JSON."""

    model_config = ConfigDict(extra="forbid", title="Verdict", regex_engine="python-re")

    checklist: list[line_type(CHECKLIST_ITEM_PATTERN)] = Field(
        min_length=CHECKLIST_MIN_ITEMS, max_length=CHECKLIST_MAX_ITEMS
    )
    score: int = Field(ge=0, le=5, strict=True)  # as the schema: no "3", 3.0 or true
    rationale: Rationale


def verdict_model(checklist: bool = True) -> type[BaseModel]:
    """The pydantic model of a judge answer, with or without the checklist field."""
    return ChecklistVerdict if checklist else Verdict


@lru_cache(maxsize=2)
def _schema_text(checklist: bool) -> str:
    # Never sort keys: xgrammar emits properties in the schema's order, and the seed asks
    # for "score" before "rationale".
    return json.dumps(verdict_model(checklist).model_json_schema())


def verdict_schema(checklist: bool = True) -> dict[str, Any]:
    """The JSON Schema both backends force; a fresh copy on every call."""
    return json.loads(_schema_text(checklist))


def max_answer_chars(checklist: bool = True) -> int:
    """The longest compact JSON answer the schema admits, in characters.

    Used as the default ``max_tokens``: a token of a real tokenizer spans at least one
    character except for byte-fallback pieces of rare non-ASCII text, so a conforming answer
    fits. An answer cut short anyway is reported as ``truncated``, never graded.
    """
    fixed_lines = {
        # literal text of each line at its longest, plus its optional note
        "fact": len("Fact: 999 of 999 correctly matched.") + 1 + NOTE_MAX,
        "conclusion": len("Conclusion: 999 of 999 correctly matched.") + 1 + NOTE_MAX,
        "terms": len("Terminology: 999 of 999 terms correctly matched.") + 1 + NOTE_MAX,
        "organization": len("Organization: mismatched") + 1 + NOTE_MAX,
        "score": len("Score: 5 ≈ 5.00 = ") + CALCULATION_MAX,
    }
    rationale = sum(n + 2 for n in fixed_lines.values()) + len(fixed_lines) - 1 + 2
    total = len('{"score":5,"rationale":}') + rationale
    if checklist:
        items = CHECKLIST_MAX_ITEMS * (CHECKLIST_ITEM_MAX + 2) + CHECKLIST_MAX_ITEMS - 1 + 2
        total += len('"checklist":,') + items
    return total
