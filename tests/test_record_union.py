"""The record format as msgspec's tagged union: a results line is read into the class its
``format`` names, straight from its bytes where msgspec decides (grader.records.decode_record),
and that record is the one the ``json`` path reads (parse_record), written back byte for byte."""

from __future__ import annotations

import json

import pytest
from answers import itemized_answer
from msgspec import UNSET

from grader.io.results import read_records
from grader.judge.records import itemized_record, judged_record, rubric_record
from grader.records import (
    Finding,
    ForeignRecord,
    ItemizedRecord,
    LabelledItem,
    MatchCount,
    MissingEvidence,
    PairwiseRecord,
    Record,
    RubricRecord,
    ScoreConfidence,
    ScoreModelRecord,
    SeedRecord,
    SeedSample,
    TextCut,
    Usage,
    decode_record,
    parse_record,
)

RUBRIC = {"facts": ["a", "b"], "conclusions": ["c"], "terms": ["d"]}


def _lines() -> list[str]:
    seed = judged_record("s1", "Fact: 1 of 2 correctly matched.", "stop",
                         usage={"prompt_tokens": 3, "output_tokens": 4})
    itemized = itemized_record("i1", itemized_answer(), "stop", output_text="text")
    rubric = RubricRecord.build(id="r1", status="truncated", finish_reason="length", items=None,
                                rubric=RUBRIC, evidence_not_found=[])
    objects = [seed.to_dict(), itemized.to_dict(), rubric.to_dict(),
               {"id": "p1", "status": "ok", "winner": "A", "verdicts": ["A", "A"],
                "consistent": True, "model_a": None, "model_b": None, "format": "pairwise"},
               {"id": 7, "status": "ok", "result": 0.5, "passed": True},
               {"id": 8, "status": "ok", "result": 1, "passed": True},  # an int stays an int
               {"id": "f1", "score": 3, "custom": [1, {"x": None}]},  # another tool's
               {"id": "f2", "format": "essay", "status": "ok"},  # a format of no class
               {"format": "seed", "id": "o1", "score": 3.0, "status": "ok"},  # its own order
               {"id": "o2", "status": "ok", "format": "itemized", "column": "kept"}]
    return [json.dumps(obj, ensure_ascii=False) for obj in objects]


@pytest.mark.parametrize("line", _lines())
def test_msgspec_and_json_read_the_same_record_and_write_it_back(line):
    by_json = parse_record(json.loads(line), ("r.jsonl", 1))
    fast = decode_record(line.encode())
    if fast is not None:
        assert fast == by_json and type(fast) is type(by_json)
    assert by_json.to_json() == line


def test_the_format_tag_picks_the_class(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(_lines()) + "\n", encoding="utf-8")
    kinds = [type(record) for _, record in read_records(path)]
    assert kinds == [SeedRecord, ItemizedRecord, RubricRecord, PairwiseRecord, ScoreModelRecord,
                     ScoreModelRecord, ForeignRecord, ForeignRecord, SeedRecord, ItemizedRecord]
    records: list[Record] = [record for _, record in read_records(path)]
    assert [record.field("format") for record in records[:4]] == [
        "seed", "itemized", "rubric", "pairwise"]
    assert records[7].field("format") == "essay" and records[9].extra == {"column": "kept"}
    assert "".join(r.to_json() + "\n" for r in records) == path.read_text(encoding="utf-8")
    # msgspec decides grader's own lines; another tool's columns, an unknown format: json's path
    decided = [decode_record(line.encode()) is not None for line in _lines()]
    assert decided == [True] * 6 + [False, False, True, False]


def test_a_line_msgspec_refuses_is_named_by_the_json_path():
    line = b'{"id": 1, "format": "seed", "score": "5"}'
    assert decode_record(line) is None
    with pytest.raises(ValueError, match="score must be a number or null, not a string"):
        parse_record(json.loads(line), ("r.jsonl", 1))


def test_counts_are_a_struct_read_strictly_and_written_as_they_were():
    line = _lines()[1]  # itemized: counted from its items
    record = parse_record(json.loads(line), ("r.jsonl", 1))
    assert isinstance(record, ItemizedRecord) and record.counts is not None
    assert isinstance(record.counts.facts, MatchCount) and record.counts.organization in (
        "matched", "mismatched")
    assert decode_record(line.encode()) == record and record.to_json() == line
    for counts, reason in (({"facts": {"matched": "1", "total": 2}}, "counts.facts.matched"),
                           ({**json.loads(line)["counts"], "mood": "glad"},
                            "counts: Object contains unknown field `mood`")):
        edited = json.dumps({**json.loads(line), "counts": counts})
        assert decode_record(edited.encode()) is None
        with pytest.raises(ValueError, match=f"^r.jsonl:3: {reason}"):
            parse_record(json.loads(edited), ("r.jsonl", 3))


def _marked_lines() -> list[str]:
    """An itemized and a rubric record with items, quotes and a quote not found, as built."""
    itemized = itemized_record("i1", itemized_answer(), "stop", output_text="no quote here")
    rubric = rubric_record("r1", '{"l":"yny","q":["a quote","",""],"o":"matched"}', "stop",
                           rubric={"key": "k", "facts": ["a", "b"], "conclusions": [],
                                   "terms": ["d"]},
                           output_text="not quoted")
    return [itemized.to_json(), rubric.to_json()]


@pytest.mark.parametrize("line", _marked_lines())
def test_items_and_evidence_are_structs_read_strictly_and_written_as_they_were(line):
    record = parse_record(json.loads(line), ("r.jsonl", 1))
    items = record.marked()
    assert items is not None and record.evidence_not_found  # type: ignore[attr-defined]
    entry = items.facts[0]
    assert isinstance(entry, Finding if isinstance(record, ItemizedRecord) else LabelledItem)
    assert isinstance(record.evidence_not_found[0], MissingEvidence)  # type: ignore[attr-defined]
    assert decode_record(line.encode()) == record and record.to_json() == line
    # each item keeps its keys in the order its judge wrote them
    obj = json.loads(line)
    assert list(obj["items"]["facts"][0]) == (["item", "quote", "present"]
                                              if obj["format"] == "itemized"
                                              else ["item", "present", "quote"])
    facts = obj["items"]["facts"]
    for field, value, reason in (
            ("items", {**obj["items"], "facts": [{**facts[0], "present": "yes"}, *facts[1:]]},
             r"items.facts\[0\].present: Expected `bool`, got `str`"),
            ("items", {**obj["items"], "facts": [{**facts[0], "mood": "glad"}, *facts[1:]]},
             r"items.facts\[0\]: Object contains unknown field `mood`"),
            ("evidence_not_found", [{"category": "facts", "index": "0", "quote": "q"}],
             r"evidence_not_found\[0\].index: Expected `int`, got `str`"),
            ("evidence_not_found", ["facts 0"],
             "evidence_not_found must be a list of objects, not a list holding a string")):
        edited = json.dumps({**obj, field: value})
        assert decode_record(edited.encode()) is None
        with pytest.raises(ValueError, match=f"^r.jsonl:3: {reason}"):
            parse_record(json.loads(edited), ("r.jsonl", 3))


def test_usage_and_truncation_are_structs_read_strictly_on_graders_records():
    seed = judged_record("s1", "Fact: 1 of 2 correctly matched.", "stop",
                         usage=Usage(prompt_tokens=3, output_tokens=None))
    seed.truncation = {"output_text": TextCut(chars=900, kept=400)}
    line = seed.to_json()
    assert '"truncation": {"output_text": {"chars": 900, "kept": 400}}' in line
    assert '"usage": {"prompt_tokens": 3, "output_tokens": null}' in line  # no reasoning_tokens
    record = parse_record(json.loads(line), ("r.jsonl", 1))
    assert record.usage == Usage(prompt_tokens=3, output_tokens=None)
    assert record.truncation == {"output_text": TextCut(chars=900, kept=400)}
    assert decode_record(line.encode()) == record and record.to_json() == line
    for field, value, reason in (
            ("usage", {"prompt_tokens": 3, "completion_tokens": 4},
             "usage: Object contains unknown field `completion_tokens`"),
            ("usage", {"prompt_tokens": "3"}, "usage.prompt_tokens: Expected `int | null`"),
            ("usage", [3, 4], "usage must be an object or null, not a list"),
            ("truncation", {"output_text": {"chars": 9}}, r"truncation\[\.\.\.\]: Object missing required field `kept`"),
    ):
        edited = json.dumps({**json.loads(line), field: value})
        assert decode_record(edited.encode()) is None
        with pytest.raises(ValueError, match=f"^r.jsonl:3: {reason}"):
            parse_record(json.loads(edited), ("r.jsonl", 3))


def test_another_tools_usage_is_kept_as_it_was():
    # no grader format: another tool's record, whose usage may have keys grader does not declare
    line = json.dumps({"id": "f1", "score": 3, "usage": {"completion_tokens": 4, "total": 7},
                       "truncation": "none"})
    record = parse_record(json.loads(line), ("r.jsonl", 1))
    assert isinstance(record, ForeignRecord) and record.usage == {"completion_tokens": 4, "total": 7}
    assert record.to_json() == line


def test_a_pair_adds_its_games_usage():
    assert Usage.total([Usage(prompt_tokens=3, output_tokens=None),
                        Usage(prompt_tokens=4, output_tokens=5, reasoning_tokens=1), None]) == Usage(
        prompt_tokens=7, output_tokens=5, reasoning_tokens=1)
    assert Usage.total([Usage(output_tokens=None), UNSET]) is None


def test_a_scored_records_confidence_is_a_struct_read_strictly():
    line = json.loads(_lines()[1])  # itemized
    kept = {"score_expected": 2.5, "p_score": 0.75, "interval": [2, 3],
            "distribution": {"2": 0.25, "3": 0.75}, "items_read": 6,
            "probabilities": {"facts": [0.9], "conclusions": [], "terms": [], "organization": 1.0}}
    text = json.dumps({**line, "confidence": kept, "confidence_error": None}, ensure_ascii=False)
    record = parse_record(json.loads(text), ("r.jsonl", 1))
    assert isinstance(record, ItemizedRecord) and isinstance(record.confidence, ScoreConfidence)
    assert record.confidence.p_score == 0.75 and record.confidence.interval == [2, 3]
    assert decode_record(text.encode()) == record and record.to_json() == text
    for confidence, reason in (({**kept, "mood": "sure"}, "confidence: Object contains unknown field `mood`"),
                               ({**kept, "p_score": "high"}, "confidence.p_score: Expected `float | null`")):
        edited = json.dumps({**line, "confidence": confidence})
        assert decode_record(edited.encode()) is None
        with pytest.raises(ValueError, match=f"^r.jsonl:3: {reason}"):
            parse_record(json.loads(edited), ("r.jsonl", 3))


def test_samples_are_structs_of_their_kind_read_strictly():
    samples = [{"score": 4, "status": "ok", "score_exact": 4.0, "model_score": None,
                "counts": json.loads(_lines()[1])["counts"], "raw_output": "{}",
                "finish_reason": "stop", "error": None, "usage": {"prompt_tokens": 3}},
               {"score": None, "status": "engine_error", "error": "boom"}]
    line = json.dumps({"id": "s", "status": "ok", "score": 4, "format": "seed", "aggregate": "median",
                       "samples": samples})
    record = parse_record(json.loads(line), ("r.jsonl", 1))
    assert isinstance(record, SeedRecord) and all(isinstance(s, SeedSample) for s in record.samples)
    first, second = record.samples
    assert first.usage == Usage(prompt_tokens=3) and first.counts is not None
    assert second.raw_output is UNSET and second.get("raw_output") is None and "error" in second
    assert decode_record(line.encode()) == record and record.to_json() == line
    edited = json.dumps({**json.loads(line), "samples": [{**samples[1], "mood": "glad"}]})
    with pytest.raises(ValueError, match=r"^r.jsonl:3: samples\[0\]: Object contains unknown field `mood`"):
        parse_record(json.loads(edited), ("r.jsonl", 3))
    # another tool's record: its samples are plain objects, as read
    foreign = parse_record({"id": 1, "samples": [{"x": 1}]}, ("r.jsonl", 1))
    assert foreign.samples == [{"x": 1}]
