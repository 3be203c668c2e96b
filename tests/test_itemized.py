"""The itemized answer format (issue #13): the judge lists, grader counts.

The schema is pinned by tests/golden/schema_itemized.json; regenerate it with
GRADER_UPDATE_GOLDEN=1 as tests/test_verdict.py says.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from answers import answer, itemized_answer
from click.testing import CliRunner
from conftest import make_request
from pydantic import ValidationError

from grader.cli import main
from grader.judge.records import itemized_record
from grader.judge.schema import (
    CONCLUSIONS_MAX,
    FACTS_MAX,
    ITEM_MAX,
    QUOTE_MAX,
    TERM_MAX,
    TERMS_MAX,
    ItemizedVerdict,
    format_max_chars,
    format_schema,
)
from grader.records import Finding, MatchCount, MissingEvidence, parse_record
from grader.run.grading import run_grade

GOLDEN = Path(__file__).parent / "golden" / "schema_itemized.json"
OUTPUT = "A liquid boils at 100 °C at sea level; cooking takes longer up there: vapor pressure."


def test_schema_matches_golden_file():
    text = json.dumps(format_schema("itemized"), indent=2, ensure_ascii=False) + "\n"
    if os.environ.get("GRADER_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert GOLDEN.read_text(encoding="utf-8") == text


def test_items_come_before_the_organization_before_anything_derived():
    schema = format_schema("itemized")
    order = ["facts", "conclusions", "terms", "organization", "rationale", "score"]
    assert list(schema["properties"]) == order and schema["required"] == order
    finding = schema["$defs"]["Finding"]
    assert list(finding["properties"]) == ["item", "quote", "present"]  # evidence, then verdict


def _compiled():
    import xgrammar as xgr  # here, not at collection: importing it (and torch) costs seconds

    grammar = xgr.Grammar.from_json_schema(
        json.dumps(format_schema("itemized")), any_whitespace=False, separators=(",", ":")
    )
    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False).compile_grammar(grammar)


def _grammar_accepts(compiled, text: str) -> bool:
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def _maximal() -> dict:
    fact = {"item": "i" * ITEM_MAX, "quote": "q" * QUOTE_MAX, "present": False}
    term = {"item": "t" * TERM_MAX, "quote": "q" * TERM_MAX, "present": False}
    return {
        "facts": [fact] * FACTS_MAX,
        "conclusions": [fact] * CONCLUSIONS_MAX,
        "terms": [term] * TERMS_MAX,
        "organization": "mismatched",
        "rationale": ["Fact: 999 of 999 correctly matched.",
                      "Conclusion: 999 of 999 correctly matched.",
                      "Terminology: 999 of 999 terms correctly matched."],
        "score": 5,
    }


def _compact(data) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def _too_long() -> list[tuple[str, dict]]:
    cases = []
    for key, limit in (("facts", FACTS_MAX), ("conclusions", CONCLUSIONS_MAX), ("terms", TERMS_MAX)):
        data = _maximal()
        data[key] = data[key] + [data[key][0]]
        cases.append((f"{limit + 1} {key}", data))
    for key, field in (("facts", "item"), ("facts", "quote"), ("terms", "item"), ("terms", "quote")):
        data = _maximal()
        data[key] = [{**data[key][0], field: data[key][0][field] + "x"}]
        cases.append((f"{key} {field} too long", data))
    data = _maximal()
    data["rationale"][0] += " a note"
    cases.append(("a note after a count line", data))
    return cases


def test_bounds_are_exact_and_grammar_and_pydantic_agree():
    compiled = _compiled()
    text = _compact(_maximal())
    assert len(text) == format_max_chars("itemized")
    assert _grammar_accepts(compiled, text)
    ItemizedVerdict.model_validate_json(text)
    assert _grammar_accepts(compiled, itemized_answer())
    assert _grammar_accepts(compiled, itemized_answer(facts=(), conclusions=(), terms=()))
    for name, data in _too_long():
        assert not _grammar_accepts(compiled, _compact(data)), name
        with pytest.raises(ValidationError):
            ItemizedVerdict.model_validate_json(_compact(data))
    assert not _grammar_accepts(compiled, answer())  # the seed's format is not this one


def test_counts_come_from_the_items_and_a_judge_line_that_differs_is_flagged():
    raw = itemized_answer(lines=("Fact: 100 of 101 correctly matched.",
                                 "Conclusion: 1 of 1 correctly matched.",
                                 "Terminology: 1 of 2 terms correctly matched."), score=5)
    record = itemized_record("q1", raw, "stop", output_text=OUTPUT)
    assert record.status == "ok" and record.format == "itemized"
    assert record.counts.facts == MatchCount(1, 2)
    # 5 × (0.4 × 1/2 + 0.3 × 1/1 + 0.21 × 1/2 + 0.09 × 1) = 3.475 -> 3
    assert record.score == 3 and record.score_exact == 3.475 and record.model_score == 5
    assert record.grade["rationale"][0] == "Fact: 1 of 2 correctly matched."
    assert record.grade["rationale"][4].startswith("Score: 3 ≈ 3.48 = ")
    assert record.count_mismatch == ["Fact: 100 of 101 correctly matched."]
    assert record.judge_lines[0] == "Fact: 100 of 101 correctly matched."


def test_a_quote_not_in_the_output_is_flagged_and_still_counts_as_the_judge_said():
    raw = itemized_answer(facts=(("Water boils at 100 C", "boils at 100 °C", True),
                                 ("Everest is 8,849 m", "8,849 metres high", True)))
    record = itemized_record("q1", raw, "stop", output_text=OUTPUT)
    assert record.evidence_not_found == [MissingEvidence("facts", 1, "8,849 metres high")]
    assert record.counts.facts == MatchCount(2, 2)  # counted as present
    # case, runs of whitespace and the prompt's `&lt;` escape are not evidence of absence
    raw = itemized_answer(facts=(("x", "BOILS   at 100 °c", True), ("y", "&lt;b>", True)),
                          conclusions=(), terms=())
    assert itemized_record("q1", raw, "stop",
                           output_text="It boils at 100 °C. <b>").evidence_not_found == []


def test_an_answer_without_a_schema_keeps_each_items_mark_and_what_is_text():
    """A judge answering without the grammar may leave out an item's text or quote, or add
    keys: each item's ``present`` still counts, its strings are kept, the rest stays in
    raw_output only, and the record reads back from its file as it was written."""
    raw = json.dumps({"facts": [{"present": True, "note": "extra"},
                                {"item": 3, "quote": "boils", "present": False}],
                      "conclusions": [], "terms": [], "organization": "matched"})
    record = itemized_record("q1", raw, "stop", output_text=OUTPUT)
    assert record.items.facts == [Finding(present=True), Finding(quote="boils", present=False)]
    assert record.counts.facts == MatchCount(1, 2) and record.raw_output == raw
    line = record.to_json()
    assert json.loads(line)["items"]["facts"] == [{"present": True},
                                                  {"quote": "boils", "present": False}]
    assert parse_record(json.loads(line), ("r.jsonl", 1)).to_json() == line


def test_no_facts_is_ambiguous_with_a_zero():
    record = itemized_record("q1", itemized_answer(facts=()), "stop", output_text=OUTPUT)
    assert record.status == "ambiguous" and record.score == 0
    assert "no facts" in record.grade["rationale"][0]


@pytest.mark.parametrize("raw, status", [
    ('{"facts":"all of them"}', "parse_error"),
    ('{"facts":[{"item":"x"}],"conclusions":[],"terms":[],"organization":"matched"}', "parse_error"),
    ('{"facts":[],"conclusions":[],"terms":[],"organization":"matched/mismatched"}', "invalid_counts"),
    ("not json", "parse_error"),
])
def test_an_answer_without_countable_items_gets_no_score(raw, status):
    record = itemized_record("q1", raw, "stop", output_text=OUTPUT)
    assert record.status == status and record.score is None and record.error


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    rows = [{"id": "a", "reference": "Water boils at 100 C.", "output_text": OUTPUT},
            {"id": "b", "reference": "r", "output_text": ""}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_format_itemized_and_rescore_reads_each_records_format(tmp_path, fake_backend_factory):
    fake_backend_factory.replies = [itemized_answer(facts=(("f", "not in it", True),))]
    out = tmp_path / "itemized.jsonl"
    run_grade(*make_request(_data(tmp_path), out, format="itemized"),
              backend_factory=fake_backend_factory)
    system = fake_backend_factory.backend.calls[0][0][0]["content"]
    assert '"quote"' in system and "checklist" not in system
    graded = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["format"] for r in graded] == ["itemized", "itemized"]
    assert graded[0]["evidence_not_found"] == [{"category": "facts", "index": 0, "quote": "not in it"}]
    summary = json.loads((tmp_path / "itemized.summary.json").read_text())
    assert summary["run"]["format"] == "itemized" and summary["run"]["checklist"] is False

    # a seed-format record written before formats existed: no "format" field
    old = tmp_path / "mixed.jsonl"
    seed_record = {"id": "s", "raw_output": answer(), "finish_reason": "stop"}
    old.write_text(out.read_text() + json.dumps(seed_record) + "\n")
    result = CliRunner().invoke(main, ["rescore", str(old), "-o", str(tmp_path / "re.jsonl")])
    assert result.exit_code == 0, result.output
    again = [json.loads(line) for line in (tmp_path / "re.jsonl").read_text().splitlines()]
    assert again[:2] == graded  # the evidence check of grading time is kept
    assert again[2]["format"] == "seed" and again[2]["counts"]["facts"] == {"matched": 2, "total": 3}


def test_format_seed_keeps_the_seeds_exact_lines(tmp_path, fake_backend_factory):
    fake_backend_factory.replies = [answer(checklist=None)]
    out = tmp_path / "seed.jsonl"
    run_grade(*make_request(_data(tmp_path), out, format="seed", checklist=False),
              backend_factory=fake_backend_factory)
    record = json.loads(out.read_text().splitlines()[0])
    assert record["format"] == "seed" and record["status"] == "ok"
    assert record["grade"]["rationale"][0] == "Fact: 2 of 3 correctly matched."


def test_cli_format_options(tmp_path):
    runner = CliRunner()
    schema = runner.invoke(main, ["schema"])  # the default format is rubric (issue #18)
    assert json.loads(schema.output) == format_schema("rubric")
    itemized = runner.invoke(main, ["schema", "--format", "itemized"])
    assert json.loads(itemized.output) == format_schema("itemized")
    seed = runner.invoke(main, ["schema", "--format", "seed", "--no-checklist"])
    assert json.loads(seed.output) == format_schema("seed", False)
    refused = runner.invoke(main, ["schema", "--checklist"])
    assert refused.exit_code == 2 and "--format seed" in refused.output
    # --no-checklist used to mean the seed's format without a checklist: said, not reinterpreted
    for command in (["schema"], ["render", str(_data(tmp_path))]):
        refused = runner.invoke(main, [*command, "--no-checklist"])
        assert refused.exit_code == 2 and "--no-checklist is for --format seed" in refused.output
    data = _data(tmp_path)
    rendered = runner.invoke(main, ["render", str(data), "--format", "itemized"])
    assert '"quote"' in rendered.output
    # the default format's first prompt for a reference without a rubric: the rubric pass
    assert "preparing a rubric" in runner.invoke(main, ["render", str(data)]).output
    verbatim = runner.invoke(main, ["render", str(data), "--prompt", "seed-verbatim"])
    assert '"quote"' not in verbatim.output and "Developer:" in verbatim.output


@pytest.mark.slow
def test_the_tiny_model_answers_schema_valid_itemized_json(tiny_model, tmp_path):
    out = tmp_path / "tiny.jsonl"
    result = CliRunner().invoke(main, [
        "grade", str(_data(tmp_path)), "--model", str(tiny_model), "-o", str(out),
        "--backend", "transformers", "--device", "cpu", "--max-tokens", "4000",
        "--format", "itemized",
    ])
    assert result.exit_code == 0, result.output
    record = json.loads(out.read_text().splitlines()[0])
    assert record["format"] == "itemized" and record["finish_reason"] == "stop"
    ItemizedVerdict.model_validate_json(record["raw_output"])
    assert record["status"] in {"ok", "ambiguous"}


@pytest.mark.parametrize("answer_format", ["seed", "itemized", "rubric"])
def test_a_judge_pickles_and_reads_as_before(answer_format):
    """Judges travel to worker processes and Ray actors: the copy renders and reads the same."""
    import pickle

    from grader.judge.judges import Answer, make_judge
    from grader.judge.prompts import render_messages

    judge = make_judge(answer_format=answer_format)
    copy = pickle.loads(pickle.dumps(judge))
    assert type(copy) is type(judge) and copy.describe() == judge.describe()
    row = {"input": "q", "reference": "r", "output_text": "o", "rubric_items": "1. a",
           "rubric_evidence": False}
    assert render_messages(copy.prompt, row) == render_messages(judge.prompt, row)
    raw = answer() if answer_format == "seed" else itemized_answer()
    read = Answer("1", raw, "stop", {"usage": {"prompt_tokens": 1, "output_tokens": 2}})
    if answer_format != "rubric":
        assert copy.read(read) == judge.read(read)
