"""Hand-edited and foreign results files (issue 19, items 6 and 11): ``rescore``, ``agree``,
``compare`` and ``report`` stop with one line naming the file and line, exit 2, and leave no
output; a rerun of ``grade`` is never blocked by such a line in its own results.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from answers import itemized_answer
from click.testing import CliRunner

from grader.cli import main
from grader.io.jsonlines import JSONError, loads
from grader.judge.confidence import record_confidence
from grader.judge.records import itemized_record
from grader.records import ForeignRecord, ItemizedRecord, ResultsError, parse_record

OUTPUT_TEXT = "boils at 100 °C, cooking takes longer, vapor pressure"
PROBABILITIES = {"facts": [0.9, 0.2], "conclusions": [0.8], "terms": [0.7, 0.1], "organization": 0.6}


def _record(row_id: str, **changes) -> dict:
    record = itemized_record(row_id, itemized_answer(), "stop", output_text=OUTPUT_TEXT)
    return {**record.to_dict(), **changes}


def _with_confidence(row_id: str) -> dict:
    record = itemized_record(row_id, itemized_answer(), "stop", output_text=OUTPUT_TEXT)
    record.confidence, record.confidence_error = record_confidence(record, probabilities=PROBABILITIES)
    assert record.confidence is not None
    return record.to_dict()


def _file(tmp_path: Path, second: str | bytes, name: str = "edited.jsonl") -> Path:
    path = tmp_path / name
    first = json.dumps(_record("q0"), ensure_ascii=False).encode()
    path.write_bytes(first + b"\n" + (second if isinstance(second, bytes) else second.encode()) + b"\n")
    return path


def _line(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False)


DEEP = '{"id": "deep", "status": "ok", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
BIG_ID = '{"id": ' + "9" * 5000 + ', "status": "ok", "raw_output": null, "score": 3}'

HAND_EDITED = {
    "unknown status": (_line(_record("q1", raw_output=None, status="weird")), "unknown status 'weird'"),
    "format as a list": (_line(_record("q1", format=["itemized"])), "unknown format ['itemized']"),
    "5000-digit id": (BIG_ID, "an integer of more than 4300 digits"),
    "deep nesting": (DEEP, "nested too deeply"),
    "engine_error with a score": (
        _line(_record("q1", raw_output=None, status="engine_error", score=5)),
        "status engine_error with score 5"),
    "probability 25": (
        _line({**_with_confidence("q1"), "confidence": {
            **_with_confidence("q1")["confidence"],
            "probabilities": {**PROBABILITIES, "facts": [25.0, -0.5]}}}),
        "facts probabilities must be a list of numbers from 0 to 1"),
    "kept p_score 25": (
        _line({**_with_confidence("q1"), "raw_output": None,
               "confidence": {**_with_confidence("q1")["confidence"], "p_score": 25.0}}),
        "p_score 25.0"),
    "expected score 11.05": (
        _line({**_with_confidence("q1"), "raw_output": None,
               "confidence": {**_with_confidence("q1")["confidence"], "score_expected": 11.05}}),
        "score_expected 11.05"),
    "NaN score": ('{"id": "n", "status": "ok", "raw_output": null, "score": NaN}', "score nan"),
    "not an object": ("[1, 2]", "expected a JSON object"),
    "invalid UTF-8": (b'{"id": "\xff", "status": "ok"}', "not valid UTF-8"),
    "a sample kept as ok": (
        _line(_record("q1", samples=[{"status": "ok", "score": 5, "raw_output": None}])),
        "sample 1: status ok without a raw_output"),
}


@pytest.mark.parametrize("name", list(HAND_EDITED))
def test_rescore_refuses_a_hand_edited_record_with_one_line_and_writes_nothing(tmp_path, name):
    second, reason = HAND_EDITED[name]
    source = _file(tmp_path, second)
    out = tmp_path / "out" / "again.jsonl"
    result = CliRunner().invoke(main, ["rescore", str(source), "-o", str(out)])
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"{source}:2: " in result.output and reason in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


@pytest.mark.parametrize("name", ["deep nesting", "5000-digit id", "invalid UTF-8"])
@pytest.mark.parametrize("command", ["agree", "compare", "report"])
def test_the_analysis_commands_name_the_bad_line(tmp_path, name, command):
    second, reason = HAND_EDITED[name]
    source = _file(tmp_path, second)
    good = _file(tmp_path, _line(_record("q1")), "good.jsonl")
    args = {"agree": ["agree", str(source), "--human", "label"],
            "compare": ["compare", str(good), str(source)],
            "report": ["report", str(source), "-o", str(tmp_path / "r.html")]}[command]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, (result.output, result.exception)
    assert f"{source}:2: " in result.output and reason in result.output
    assert not (tmp_path / "r.html").exists()


def test_an_engine_error_sample_with_a_score_is_rescored_without_it(tmp_path):
    record = _record("q1", samples=[
        {"status": "engine_error", "score": 5, "score_exact": 5.0, "raw_output": None,
         "finish_reason": "error", "error": "boom"},
        {"status": "engine_error", "score": 4, "raw_output": "x", "finish_reason": "error"},
    ], aggregate="median")
    source = _file(tmp_path, _line(record))
    out = tmp_path / "again.jsonl"
    result = CliRunner().invoke(main, ["rescore", str(source), "-o", str(out)])
    assert result.exit_code == 0, result.output
    again = [json.loads(line) for line in out.read_text().splitlines()][1]
    assert again["status"] == "engine_error" and again["score"] is None
    assert all(s["score"] is None and s["score_exact"] is None for s in again["samples"])


def test_kept_probabilities_in_range_are_rescored(tmp_path):
    source = _file(tmp_path, _line(_with_confidence("q1")))
    out = tmp_path / "again.jsonl"
    result = CliRunner().invoke(main, ["rescore", str(source), "-o", str(out)])
    assert result.exit_code == 0, result.output
    again = json.loads(out.read_text().splitlines()[1])
    assert again["confidence"] == _with_confidence("q1")["confidence"]


@pytest.mark.parametrize("data, reason", [
    (b"[" * 100_000, "nested too deeply"),
    (b'{"a": ' + b"1" * 5000 + b"}", "more than 4300 digits"),
    (b'{"a": "\xff"}', "not valid UTF-8"),
    (b'{"a": 1} x', "Extra data"),
])
def test_the_one_decoder_words_every_failure_as_a_json_error(data, reason):
    with pytest.raises(JSONError, match=reason):
        loads(data)
    if b"\xff" not in data:  # as text, the same failure
        with pytest.raises(JSONError, match=reason):
            loads(data.decode())


def test_the_one_decoder_reads_a_bom_only_when_told():
    assert loads(b'\xef\xbb\xbf{"a": 1}', bom=True) == {"a": 1}
    with pytest.raises(JSONError, match="BOM"):
        loads(b'\xef\xbb\xbf{"a": 1}')


@pytest.mark.parametrize("hostile", [DEEP, BIG_ID])
def test_a_hostile_line_in_a_partial_never_blocks_a_rerun_of_grade(tmp_path, fake_backend_factory, hostile):
    # what a hand edit (or another tool) leaves in an interrupted run's log: the line is not
    # one of the run's records, so its row is graded again; the rest are resumed
    from conftest import make_request

    from grader.io.results import read_records
    from grader.run.grading import run_grade

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "reference": "r", "output_text": "o"}) + "\n"
                            for i in range(3)))
    out = tmp_path / "r.jsonl"
    request, job = make_request(data, out)
    run_grade(request, job, backend_factory=fake_backend_factory)
    lines = out.read_text().splitlines(keepends=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text(lines[0] + hostile + "\n" + lines[2])
    out.unlink()
    run_grade(request, job, backend_factory=fake_backend_factory)
    assert [r.id for _, r in read_records(out)] == ["r0", "r1", "r2"]
    assert not partial.exists()


def test_parse_record_keeps_the_object_it_was_given():
    record = _with_confidence("q1")
    parsed = parse_record(record, ("r.jsonl", 3))
    assert isinstance(parsed, ItemizedRecord) and parsed.score == record["score"]
    assert parsed.to_dict() == record
    assert parsed.to_json() == json.dumps(record, ensure_ascii=False)  # today's bytes, in order
    # another tool's record: an id and fields grader does not know, or a status of its own
    foreign = {"id": 1, "status": "other_tool", "label": ["a"], "score": 3}
    parsed = parse_record(foreign, ("r.jsonl", 1))
    assert isinstance(parsed, ForeignRecord) and parsed.field("score") == 3
    assert parsed.to_json() == json.dumps(foreign, ensure_ascii=False)


@pytest.mark.parametrize("obj, reason", [
    ([1, 2], "expected a JSON object with an 'id'"),
    ({"status": "ok"}, "expected a JSON object with an 'id'"),
    ({"id": 1, "status": 3}, "status must be a string or null, not a number"),
    ({"id": 1, "raw_output": ["x"]}, "raw_output must be a string or null, not a list"),
    ({"id": 1, "format": "seed", "score": "5"}, "score must be a number or null, not a string"),
    ({"id": 1, "format": "seed", "score": True}, "score must be a number or null, not true or false"),
    ({"id": 1, "format": "itemized", "count_mismatch": None}, "count_mismatch must be a list, not null"),
    ({"id": 1, "format": "rubric", "rubric": "r"}, "rubric must be an object, not a string"),
    ({"id": 1, "result": 2, "passed": "yes"}, "passed must be true or false or null, not a string"),
    ({"id": 1, "samples": {}}, "samples must be a list of objects, not an object"),
    ({"id": 1, "samples": [{}, 2]}, "samples must be a list of objects, not a list holding a number"),
    ({"id": 1, "format": "rubric", "evidence_not_found": ["q"]},
     "evidence_not_found must be a list of objects, not a list holding a string"),
])
def test_parse_record_names_the_file_line_and_field(obj, reason):
    with pytest.raises(ResultsError) as caught:
        parse_record(obj, ("r.jsonl", 7))
    assert str(caught.value) == f"r.jsonl:7: {reason}"
    assert (caught.value.line, caught.value.reason) == (7, reason)


def test_every_reader_gets_records_through_parse_record(tmp_path):
    source = _file(tmp_path, _line(_record("q1", count_mismatch="x")))
    for command in (["rescore", str(source), "-o", str(tmp_path / "o.jsonl")],
                    ["report", str(source), "-o", str(tmp_path / "r.html")],
                    ["compare", str(source), str(source)]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, (command, result.output)
        assert f"{source}:2: count_mismatch must be a list, not a string" in result.output


def test_an_old_files_record_keeps_its_columns_and_their_order_through_rescore(tmp_path):
    # A record from before formats (no "format": a ForeignRecord, read by the seed judge) with a
    # column another tool added: rescore writes it back in its own order, the column kept and
    # the fields it lacked after it, as a seed record.
    from answers import answer

    from grader.judge.records import judged_record
    from grader.records import SeedRecord

    graded = judged_record("q1", answer(facts=(2, 3), checklist=None), "stop").to_dict()
    old = {"id": "q1", "human_score": 4, **{k: v for k, v in graded.items() if k not in ("id", "format")}}
    assert isinstance(parse_record(old, ("old.jsonl", 1)), ForeignRecord)
    source = tmp_path / "old.jsonl"
    source.write_text(_line(old) + "\n")
    out = tmp_path / "again.jsonl"
    result = CliRunner().invoke(main, ["rescore", str(source), "-o", str(out)])
    assert result.exit_code == 0, result.output
    line = out.read_text().splitlines()[0]
    assert line == _line({**old, "format": "seed"})
    assert isinstance(parse_record(json.loads(line), (out, 1)), SeedRecord)
