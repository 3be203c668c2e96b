"""grader.judge.schema: the schema both backends force, checked against xgrammar, re and pydantic.

The schema is pinned by golden files. After an intended change to grader/judge/schema.py, regenerate
them with

    GRADER_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_verdict.py

and review the diff of tests/golden/ before committing it.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from answers import answer
from pydantic import ConfigDict, TypeAdapter, ValidationError

from grader.judge.schema import (
    CALCULATION_MAX,
    CHECKLIST_ITEM_MAX,
    CHECKLIST_ITEM_PATTERN,
    CHECKLIST_MAX_ITEMS,
    CHECKLIST_MIN_ITEMS,
    CONCLUSION_PATTERN,
    FACT_PATTERN,
    NOTE_MAX,
    ORGANIZATION_PATTERN,
    RATIONALE_PATTERNS,
    SCORE_PATTERN,
    TERMINOLOGY_PATTERN,
    line_type,
    max_answer_chars,
    verdict_model,
    verdict_schema,
)

if TYPE_CHECKING:
    import xgrammar as xgr

GOLDEN = Path(__file__).parent / "golden"
GOLDEN_FILES = {True: GOLDEN / "schema.json", False: GOLDEN / "schema_no_checklist.json"}
CHECKLIST = [True, False]


# ---------------------------------------------------------------- the schema itself


@pytest.mark.parametrize("checklist", CHECKLIST)
def test_schema_matches_golden_file(checklist):
    text = json.dumps(verdict_schema(checklist), indent=2, ensure_ascii=False) + "\n"
    path = GOLDEN_FILES[checklist]
    if os.environ.get("GRADER_UPDATE_GOLDEN") == "1":
        path.write_text(text, encoding="utf-8")
    # compared as text: key order is part of the contract (see the next test)
    assert path.read_text(encoding="utf-8") == text, (
        f"{path.name} differs from verdict_schema({checklist}); if the change is intended, "
        "rerun with GRADER_UPDATE_GOLDEN=1"
    )


def test_properties_are_in_the_seeds_order():
    # xgrammar emits properties in schema order, and the seed asks for score before rationale
    with_checklist = verdict_schema(True)
    assert list(with_checklist["properties"]) == ["checklist", "score", "rationale"]
    assert with_checklist["required"] == ["checklist", "score", "rationale"]
    without = verdict_schema(False)
    assert list(without["properties"]) == ["score", "rationale"]
    assert without["required"] == ["score", "rationale"]


def test_schema_is_a_fresh_copy_every_call():
    schema = verdict_schema(True)
    schema["properties"].pop("checklist")
    assert "checklist" in verdict_schema(True)["properties"]


def _string_schemas(node):
    if isinstance(node, dict):
        if node.get("type") == "string":
            yield node
        for value in node.values():
            yield from _string_schemas(value)
    elif isinstance(node, list):
        for value in node:
            yield from _string_schemas(value)


@pytest.mark.parametrize("checklist", CHECKLIST)
def test_every_string_is_bounded_by_its_pattern_alone(checklist):
    strings = list(_string_schemas(verdict_schema(checklist)))
    assert len(strings) == 5 + checklist
    for string in strings:
        # xgrammar rejects pattern + minLength/maxLength (mlc-ai/xgrammar#966)
        assert "minLength" not in string and "maxLength" not in string
        assert string["pattern"].startswith("^") and string["pattern"].endswith("$")
        # the (...)? mis-compilation: optional groups are written (...){0,1}
        assert ")?" not in string["pattern"]
    rationale = verdict_schema(checklist)["properties"]["rationale"]
    assert [item["pattern"] for item in rationale["prefixItems"]] == list(RATIONALE_PATTERNS)
    assert rationale["minItems"] == rationale["maxItems"] == 5
    assert verdict_schema(checklist)["additionalProperties"] is False


# ---------------------------------------------------------------- xgrammar = re = pydantic


# xgrammar is imported where it is used: importing it (and the torch it imports) at collection
# would cost every pytest run seconds.


@cache
def string_grammar(pattern: str) -> xgr.Grammar:
    import xgrammar as xgr

    return xgr.Grammar.from_json_schema(
        {"type": "string", "pattern": pattern}, any_whitespace=False
    )


@cache
def _compiler() -> xgr.GrammarCompiler:
    import xgrammar as xgr

    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


_COMPILED: dict[str, xgr.CompiledGrammar] = {}


def accepts(grammar: xgr.Grammar, text: str) -> bool:
    """``_is_grammar_accept_string(grammar, text)`` (test_accepts_is_xgrammars_own), but with
    the grammar compiled once: that helper compiles it again on every call."""
    import xgrammar as xgr

    key = str(grammar)
    if key not in _COMPILED:
        _COMPILED[key] = _compiler().compile_grammar(grammar)
    matcher = xgr.GrammarMatcher(_COMPILED[key], terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


@cache
def string_adapter(pattern: str) -> TypeAdapter:
    # the engine the verdict models use: Rust's regex cannot spell the surrogate range
    return TypeAdapter(line_type(pattern), config=ConfigDict(regex_engine="python-re"))


def grammar_accepts(pattern: str, s: str) -> bool:
    return accepts(string_grammar(pattern), json.dumps(s, ensure_ascii=False))


def pydantic_accepts(pattern: str, s: str) -> bool:
    try:
        string_adapter(pattern).validate_python(s)
    except ValidationError:
        return False
    return True


HEADS = {
    FACT_PATTERN: ["Fact: 2 of 3 correctly matched.", "Fact: 0 of 0 correctly matched."],
    CONCLUSION_PATTERN: ["Conclusion: 999 of 999 correctly matched."],
    TERMINOLOGY_PATTERN: ["Terminology: 10 of 12 terms correctly matched."],
    ORGANIZATION_PATTERN: ["Organization: matched", "Organization: mismatched"],
    SCORE_PATTERN: [
        "Score: 4 ≈ 3.81 = 5 × (0.4 × 2/3 + 0.3 × 1/1 + 0.21 × 2/4 + 0.09 × 1)",
        "Score: 0 ≈ 0 = no facts",
        "Score: 5 ≈ 5.0 = 5 × 1",
    ],
    CHECKLIST_ITEM_PATTERN: ["Identify facts, conclusions and terms in the reference"],
}

BAD_CHARS = ['"', "\\", "\x00", "\t", "\n", "\r", "\x1f", 'say "yes"', "C:\\path"]
ODD_BUT_ALLOWED = ["≈", "×", "é", "😀", "\x7f", "\u2028", "\u0085", "a/b", "'", "{}[]", "  "]


def probes(pattern: str) -> list[str]:
    """Probe strings around one pattern's bounds; the caller checks the engines agree."""
    out = []
    for head in HEADS[pattern]:
        out += [head, head + " a note", head + " " + "n" * 20]
        if pattern in (SCORE_PATTERN, CHECKLIST_ITEM_PATTERN):
            continue
        out += [
            head + " " + "n" * NOTE_MAX,  # the longest note
            head + " " + "n" * (NOTE_MAX + 1),  # one over
            head + " " + "≈" * NOTE_MAX,  # bounds count characters, not bytes
            head + " " + "😀" * (NOTE_MAX + 1),
            head + "x",  # a note without its space
            head + " ",  # a space and no note
            head + "\n",
            head + " \n",
            head + "  two spaces",
        ]
        out += [head + " note " + c for c in BAD_CHARS + ODD_BUT_ALLOWED]
    return out


EXTRA_PROBES = {
    FACT_PATTERN: [
        "Fact: 1000 of 1000 correctly matched.",  # 4-digit counts
        "Fact: 2 of 1000 correctly matched.",
        "Fact: 02 of 3 correctly matched.",
        "Fact: -1 of 3 correctly matched.",
        "Fact: 2 of 3 correctly matched",
        "Fact: 2 of 3 correctly matched.. note",
        "fact: 2 of 3 correctly matched.",
        "Fact: 2 of 3 correctly matched. ≈",
        " Fact: 2 of 3 correctly matched.",
        "Fact: two of three correctly matched.",
    ],
    CONCLUSION_PATTERN: [
        "Conclusion: 1 of 9999 correctly matched.",
        "Conclusion: 0 of 0 correctly matched. " + "x" * NOTE_MAX,
        "Conclusions: 0 of 0 correctly matched.",
    ],
    TERMINOLOGY_PATTERN: [
        "Terminology: 1234 of 5 terms correctly matched.",
        "Terminology: 1 of 5 correctly matched.",
    ],
    ORGANIZATION_PATTERN: [
        # xgrammar 0.2.8 accepts this under `( ...)?` (test_optional_group_workaround_is_needed)
        "Organization: matchedx",
        "Organization: mismatchedx",
        "Organization: matched x",
        "Organization: Matched",
        "Organization: matched/mismatched",
        "Organization: unmatched",
        "Organization: ",
        "Organization:",
    ],
    SCORE_PATTERN: [
        "Score: 3 ≈ 3.21 = " + "c" * CALCULATION_MAX,
        "Score: 3 ≈ 3.21 = " + "c" * (CALCULATION_MAX + 1),
        "Score: 3 ≈ 3.21 = " + "≈" * CALCULATION_MAX,
        "Score: 3 ≈ 3.215 = x",
        "Score: 3 ≈ 3. = x",
        "Score: 6 ≈ 3.21 = x",
        "Score: 3 ~ 3.21 = x",
        "Score: 3 = 3.21 = x",
        "Score: 3 ≈ 3.21 = ",
        "Score: 3 ≈ 3.21",
        'Score: 3 ≈ 3.21 = "x"',
        "Score: 3 ≈ 3.21 = a\\b",
        "Score: 3 ≈ 3.21 = a\tb",
    ],
    CHECKLIST_ITEM_PATTERN: [
        "c" * CHECKLIST_ITEM_MAX,
        "c" * (CHECKLIST_ITEM_MAX + 1),
        "😀" * CHECKLIST_ITEM_MAX,
        "",
        " ",
        "a\nb",
        'a"b',
        "a\\b",
        "\x1f",
        "≈",
    ],
}

ALL_PATTERNS = [*RATIONALE_PATTERNS, CHECKLIST_ITEM_PATTERN]
PATTERN_IDS = ["fact", "conclusion", "terminology", "organization", "score", "checklist_item"]


@pytest.mark.parametrize("pattern", ALL_PATTERNS, ids=PATTERN_IDS)
def test_xgrammar_re_and_pydantic_agree(pattern):
    cases = probes(pattern) + EXTRA_PROBES[pattern]
    accepted = rejected = 0
    disagreements = []
    for s in cases:
        by_re = re.fullmatch(pattern, s) is not None
        by_grammar = grammar_accepts(pattern, s)
        by_pydantic = pydantic_accepts(pattern, s)
        if not by_re == by_grammar == by_pydantic:
            verdicts = {"re": by_re, "xgrammar": by_grammar, "pydantic": by_pydantic}
            disagreements.append((s, verdicts))
        accepted += by_re
        rejected += not by_re
    assert disagreements == []
    assert accepted >= 3 and rejected >= 5  # the probes exercise both sides


@pytest.mark.parametrize(
    "pattern, s, expected",
    [
        (FACT_PATTERN, "Fact: 2 of 3 correctly matched. " + "n" * NOTE_MAX, True),
        (FACT_PATTERN, "Fact: 2 of 3 correctly matched. " + "n" * (NOTE_MAX + 1), False),
        (FACT_PATTERN, "Fact: 2 of 3 correctly matched.x", False),
        (FACT_PATTERN, "Fact: 999 of 999 correctly matched.", True),
        (FACT_PATTERN, "Fact: 1000 of 1000 correctly matched.", False),
        (ORGANIZATION_PATTERN, "Organization: matchedx", False),
        (ORGANIZATION_PATTERN, "Organization: matched x", True),
        (ORGANIZATION_PATTERN, "Organization: matched ≈ same", True),
        (ORGANIZATION_PATTERN, 'Organization: matched "x"', False),
        (ORGANIZATION_PATTERN, "Organization: matched a\\b", False),
        (ORGANIZATION_PATTERN, "Organization: matched a\x01b", False),
        (SCORE_PATTERN, "Score: 3 ≈ 3.21 = 5 × (0.7 × 1/2)", True),
        (CHECKLIST_ITEM_PATTERN, "c" * (CHECKLIST_ITEM_MAX + 1), False),
    ],
)
def test_key_probes_have_the_intended_answer(pattern, s, expected):
    # The agreement test alone would pass if all three engines were wrong the same way.
    assert (re.fullmatch(pattern, s) is not None) is expected
    assert grammar_accepts(pattern, s) is expected
    assert pydantic_accepts(pattern, s) is expected


def test_accepts_is_xgrammars_own():
    # the cached helper above answers as xgrammar's own test helper, on both outcomes
    from xgrammar.testing import _is_grammar_accept_string

    cases = [
        (FACT_PATTERN, "Fact: 2 of 3 correctly matched. note"),
        (FACT_PATTERN, "Fact: 2 of 3 correctly matched.note"),
        (ORGANIZATION_PATTERN, "Organization: matchedx"),
        (ORGANIZATION_PATTERN, "Organization: mismatched"),
        (SCORE_PATTERN, "Score: 3 ≈ 3.21 = x"),
        (CHECKLIST_ITEM_PATTERN, 'a"b'),
    ]
    for pattern, s in cases:
        text = json.dumps(s, ensure_ascii=False)
        assert accepts(string_grammar(pattern), text) is _is_grammar_accept_string(
            string_grammar(pattern), text
        )
    for checklist, text in [
        (True, compact(maximal(True))),  # accepted
        (False, compact(maximal(False))[:-1]),  # rejected: not terminated
    ]:
        assert accepts(answer_grammar(checklist), text) is _is_grammar_accept_string(
            answer_grammar(checklist), text
        )


def test_escaped_characters_are_rejected_so_json_text_equals_the_string():
    # The model cannot write ≈ as \u2248 (nor any other escape): the JSON text of a string is
    # the string between quotes, which is what max_answer_chars relies on.
    from xgrammar.testing import _is_grammar_accept_string

    line = "Score: 4 ≈ 3.81 = 5 × 1"
    assert grammar_accepts(SCORE_PATTERN, line)
    assert not _is_grammar_accept_string(
        string_grammar(SCORE_PATTERN), json.dumps(line, ensure_ascii=True)
    )
    assert not _is_grammar_accept_string(string_grammar(CHECKLIST_ITEM_PATTERN), r'"\u0041"')
    assert not _is_grammar_accept_string(string_grammar(CHECKLIST_ITEM_PATTERN), r'"a\/b"')


def test_optional_group_workaround_is_needed():
    """xgrammar 0.2.8 compiles `( x{1,5})?` so that "matchedx" passes; `{0,1}` is correct."""
    import xgrammar as xgr

    broken = r"^Organization: (matched|mismatched)( [a-z]{1,5})?$"
    fixed = r"^Organization: (matched|mismatched)( [a-z]{1,5}){0,1}$"
    assert re.fullmatch(broken, "Organization: matchedx") is None
    assert not grammar_accepts(fixed, "Organization: matchedx")
    assert grammar_accepts(fixed, "Organization: matched x")
    if not grammar_accepts(broken, "Organization: matchedx"):
        pytest.skip(f"xgrammar {xgr.__version__} compiles (...)? correctly now")


# ---------------------------------------------------------------- whole answers


@cache
def answer_grammar(checklist: bool) -> xgr.Grammar:
    # as the transformers backend compiles it: no free whitespace, compact separators
    import xgrammar as xgr

    return xgr.Grammar.from_json_schema(
        json.dumps(verdict_schema(checklist)), any_whitespace=False, separators=(",", ":")
    )


def grammar_accepts_answer(checklist: bool, text: str) -> bool:
    return accepts(answer_grammar(checklist), text)


def pydantic_accepts_answer(checklist: bool, text: str) -> bool:
    try:
        verdict_model(checklist).model_validate_json(text)
    except ValidationError:
        return False
    return True


def compact(data) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def maximal(checklist: bool) -> dict:
    """Every string at its longest, 3-digit counts, notes present, 7 checklist items."""
    note = " " + "n" * NOTE_MAX
    data = {}
    if checklist:
        data["checklist"] = ["c" * CHECKLIST_ITEM_MAX] * CHECKLIST_MAX_ITEMS
    data["score"] = 5
    data["rationale"] = [
        "Fact: 999 of 999 correctly matched." + note,
        "Conclusion: 999 of 999 correctly matched." + note,
        "Terminology: 999 of 999 terms correctly matched." + note,
        "Organization: mismatched" + note,
        "Score: 5 ≈ 5.00 = " + "c" * CALCULATION_MAX,
    ]
    return data


@pytest.mark.parametrize("checklist", CHECKLIST)
def test_maximal_answer_is_accepted_and_max_answer_chars_is_exact(checklist):
    text = compact(maximal(checklist))
    assert grammar_accepts_answer(checklist, text)
    assert pydantic_accepts_answer(checklist, text)
    assert len(text) == max_answer_chars(checklist)
    assert max_answer_chars(True) > max_answer_chars(False)


def _longer_variants(checklist: bool):
    """Each one character (or one item) past a bound of the maximal answer."""
    base = maximal(checklist)
    for i in range(4):
        data = json.loads(json.dumps(base))
        data["rationale"][i] += "n"
        yield f"note {i} too long", data
    data = json.loads(json.dumps(base))
    data["rationale"][4] += "c"
    yield "calculation too long", data
    data = json.loads(json.dumps(base))
    data["rationale"][0] = data["rationale"][0].replace("999 of", "1000 of")
    yield "4-digit count", data
    data = json.loads(json.dumps(base))
    data["rationale"][4] = data["rationale"][4].replace("5.00", "5.000")
    yield "3 decimals", data
    for score in ["05", "-0", "5.0", "1e0", '"5"', "true", "6"]:
        yield f"score {score}", compact(base).replace('"score":5', f'"score":{score}')
    if checklist:
        data = json.loads(json.dumps(base))
        data["checklist"].append("c")
        yield "8 checklist items", data
        data = json.loads(json.dumps(base))
        data["checklist"][0] += "c"
        yield "checklist item too long", data


@pytest.mark.parametrize("checklist", CHECKLIST)
def test_nothing_past_the_bounds_is_accepted(checklist):
    for name, data in _longer_variants(checklist):
        text = data if isinstance(data, str) else compact(data)
        assert len(text) > max_answer_chars(checklist) or name.startswith("score"), name
        assert not grammar_accepts_answer(checklist, text), name
        if name != "score -0":  # -0 is the JSON number 0: only its text is refused
            assert not pydantic_accepts_answer(checklist, text), name


@pytest.mark.parametrize("checklist", CHECKLIST)
def test_only_compact_separators_are_accepted(checklist):
    data = json.loads(answer(checklist=("a", "b", "c") if checklist else None))
    assert grammar_accepts_answer(checklist, compact(data))
    assert not grammar_accepts_answer(checklist, json.dumps(data, ensure_ascii=False))
    assert not grammar_accepts_answer(checklist, json.dumps(data, ensure_ascii=False, indent=2))
    assert not grammar_accepts_answer(checklist, " " + compact(data))


def _valid(checklist: bool) -> dict:
    return json.loads(answer(checklist=("a", "b", "c") if checklist else None))


def _bad_answers(checklist: bool):
    def changed(**kw):
        data = _valid(checklist)
        data.update(kw)
        return data

    rationale = _valid(checklist)["rationale"]
    yield "4 lines", changed(rationale=rationale[:4])
    yield "6 lines", changed(rationale=[*rationale, "x"])
    yield "lines out of order", changed(rationale=[rationale[1], rationale[0], *rationale[2:]])
    yield "matchedx", changed(rationale=[*rationale[:3], "Organization: matchedx", rationale[4]])
    yield "4-digit count", changed(
        rationale=["Fact: 1000 of 1000 correctly matched.", *rationale[1:]]
    )
    yield "note too long", changed(
        rationale=[rationale[0] + " " + "n" * (NOTE_MAX + 1), *rationale[1:]]
    )
    yield "quote in a note", changed(rationale=[rationale[0] + ' "x"', *rationale[1:]])
    yield "score 6", changed(score=6)
    yield "score -1", changed(score=-1)
    yield "score 3.0", changed(score=3.0)
    yield "score '3'", changed(score="3")
    yield "score true", changed(score=True)
    yield "extra key", changed(comment="x")
    missing = _valid(checklist)
    del missing["score"]
    yield "no score", missing
    if checklist:
        yield "2 items", changed(checklist=["a", "b"])
        yield "8 items", changed(checklist=list("abcdefgh"))
        yield "empty item", changed(checklist=["a", "b", ""])
        yield "item with newline", changed(checklist=["a", "b", "c\nd"])
        missing = _valid(checklist)
        del missing["checklist"]
        yield "no checklist", missing
    else:
        yield "unexpected checklist", {"checklist": ["a", "b", "c"], **_valid(False)}


@pytest.mark.parametrize("checklist", CHECKLIST)
def test_grammar_and_pydantic_agree_on_whole_answers(checklist):
    good = [
        _valid(checklist),
        maximal(checklist),
        {**_valid(checklist), "score": 0},
    ]
    if checklist:
        good.append({**_valid(True), "checklist": ["≈ 😀"] * CHECKLIST_MIN_ITEMS})
    for data in good:
        text = compact(data)
        assert grammar_accepts_answer(checklist, text), text
        assert pydantic_accepts_answer(checklist, text), text
        verdict_model(checklist).model_validate(json.loads(text))  # python mode too
    for name, data in _bad_answers(checklist):
        text = compact(data)
        assert not grammar_accepts_answer(checklist, text), name
        assert not pydantic_accepts_answer(checklist, text), name
        with pytest.raises(ValidationError):
            verdict_model(checklist).model_validate(data)


def test_utf8_encoded_surrogates_are_rejected_by_the_grammar():
    """xgrammar 0.2.8 accepts the bytes ED A0-BF xx (a surrogate in UTF-8, invalid UTF-8) for
    `[^"]`; the tiny model emitted ED A3 8D and the decoder made three U+FFFD of it. FREE's
    surrogate exclusion closes that hole for every free-text field."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo(encoded_vocab=["a"], vocab_type=xgr.VocabType.RAW)
    compiler = xgr.GrammarCompiler(info)

    def accepts(pattern: str, raw: bytes) -> bool:
        grammar = xgr.Grammar.from_json_schema(
            json.dumps({"type": "string", "pattern": pattern}), any_whitespace=False
        )
        return xgr.GrammarMatcher(compiler.compile_grammar(grammar)).accept_string(raw)

    surrogate = b"\xed\xa3\x8d"
    assert accepts(r'^[^"\\\x00-\x1f]{1,10}$', b'"ok ' + surrogate + b'"')  # the upstream hole
    assert not accepts(CHECKLIST_ITEM_PATTERN, b'"ok ' + surrogate + b'"')
    assert not accepts(SCORE_PATTERN, "\"Score: 1 ≈ 1 = ok ".encode() + surrogate + b'"')
    assert accepts(SCORE_PATTERN, '"Score: 1 ≈ 1 = ok → ∑ 😀"'.encode())
    assert accepts(CHECKLIST_ITEM_PATTERN, '"ok → ∑ 😀"'.encode())  # real non-ASCII stays allowed
