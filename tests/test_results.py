"""grader.io.results: the summary of a results file, whole or merged from consecutive parts."""

from __future__ import annotations

import json
import random

import pytest
from msgspec import UNSET

from grader.analysis.summary import Disagreement, Summary, Tally, summarize
from grader.analysis.verdict import judge_verdict
from grader.io.manifest import RunManifest, run_manifest
from grader.io.results import SummaryError, read_manifest, read_summary, write_summary
from grader.records import Record, parse_record


def _parsed(records: list[dict]) -> list[Record]:
    """The records as a results file's reader gives them."""
    return [parse_record(record, ("r.jsonl", line)) for line, record in enumerate(records, 1)]


def _records(rng: random.Random, count: int) -> list[Record]:
    records = []
    for index in range(count):
        roll = rng.random()
        if roll < 0.5:
            score = rng.randint(0, 5)
            records.append({"id": index, "status": "ok", "score": score,
                            "model_score": rng.choice((None, score, (score + 1) % 6))})
        elif roll < 0.6:
            records.append({"id": index, "status": "ok", "result": rng.random() * 7,
                            "passed": rng.choice((None, True, False))})
        elif roll < 0.65:
            records.append({"id": index, "status": rng.choice(("later_status", "other"))})
        else:
            records.append({"id": index, "status": rng.choice(
                ("missing_context", "ambiguous", "invalid_counts", "parse_error", "truncated"))})
    return _parsed(records)


def _seed_only(records: list[Record]) -> list[Record]:
    return [r for r in records if r.kind != "score_model"]


def test_a_tally_merged_from_parts_is_the_summary_of_the_whole():
    rng = random.Random(4)
    for trial in range(200):
        records = _records(rng, rng.randint(0, 60))
        if trial % 2:
            records = _seed_only(records)
        cuts = sorted(rng.sample(range(len(records) + 1), k=min(3, len(records) + 1)))
        parts = [records[a:b] for a, b in zip([0, *cuts], [*cuts, len(records)])]
        merged = Tally()
        for part in parts:
            tally = Tally()
            tally.add(iter(part))
            merged.merge(tally)
        whole = summarize(iter(records), run={"x": 1})
        assert merged.summary(run={"x": 1}) == whole
        # the same order of statuses too: a status first seen late is listed late
        assert list(merged.summary()["statuses"]) == list(whole["statuses"])


def test_summary_of_seed_records():
    records = [
        {"id": 1, "status": "ok", "score": 3, "model_score": 3},
        {"id": 2, "status": "ok", "score": 4, "model_score": 2},
        {"id": 3, "status": "ok", "score": 4},
        {"id": 4, "status": "ambiguous", "score": 0},
    ]
    summary = summarize(_parsed(records))
    assert summary["rows"] == 4 and summary["graded"] == 3
    assert summary["statuses"]["ambiguous"] == 1
    assert summary["mean_score"] == round(11 / 3, 4)
    assert summary["histogram"] == {"0": 0, "1": 0, "2": 0, "3": 1, "4": 2, "5": 0}
    assert summary["judge_disagreement"] == {"rows": 2, "disagree": 1, "rate": 0.5}


# ---------------------------------------------------------------- reading a file in parts


def _results_file(tmp_path, lines: list[str], bom: bool = True):
    path = tmp_path / "r.jsonl"
    path.write_bytes(("\ufeff" if bom else "").encode() + "".join(lines).encode("utf-8"))
    return path


def _lines(count: int, rng: random.Random) -> list[str]:
    lines = []
    for index in range(count):
        lines.append(f'{{"id": {index}, "text": "{"é" * rng.randint(0, 40)}"}}\n')
        if rng.random() < 0.1:
            lines.append(rng.choice(("\n", "   \n", "\t\r\n")))
    return lines


def test_records_read_in_parts_are_the_records_of_the_whole(tmp_path):
    from grader.io.results import line_number, read_records, split_lines

    rng = random.Random(8)
    for count in (1, 2, 7, 50):
        path = _results_file(tmp_path, _lines(count, rng))
        whole = list(read_records(path))
        assert [r.id for _, r in whole] == list(range(count))
        for parts in (1, 2, 3, 5, 64):
            ranges = split_lines(path, parts)
            assert ranges[0][0] == 0 and ranges[-1][1] == path.stat().st_size
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            assert len(ranges) <= parts
            joined = []
            for start, end in ranges:
                first = line_number(path, start)
                joined += [(n + first - 1, r) for n, r in read_records(path, start=start, end=end)]
            assert joined == whole


def test_an_error_in_a_part_names_the_files_own_line(tmp_path):
    from grader.io.results import line_number, read_records, split_lines
    from grader.records import ResultsError

    lines = _lines(40, random.Random(2))
    lines[31] = '{"id": 31, "broken": \n'
    path = _results_file(tmp_path, lines, bom=False)
    with pytest.raises(ResultsError) as whole:
        list(read_records(path))
    assert whole.value.line == 32 and str(whole.value).startswith(f"{path}:32: invalid JSON")
    for start, end in split_lines(path, 3):
        try:
            list(read_records(path, start=start, end=end))
        except ResultsError as exc:
            assert str(exc.shifted(line_number(path, start) - 1)) == str(whole.value)
            break
    else:
        pytest.fail("no part reported the broken line")


def test_a_writer_appends_part_files_in_order(tmp_path):
    from grader.io.results import ResultsWriter

    part = tmp_path / "part"
    part.write_bytes('{"id": 2, "t": "é"}\n'.encode() * 3)
    writer = ResultsWriter(tmp_path / "out.jsonl")
    writer.write(_parsed([{"id": 1}]))
    writer.append_file(part)
    writer.write(_parsed([{"id": 3}]))
    writer.commit()
    assert (tmp_path / "out.jsonl").read_bytes() == (
        b'{"id": 1}\n' + part.read_bytes() + b'{"id": 3}\n'
    )


def test_rescore_reads_and_writes_what_grade_wrote_with_a_lone_surrogate(tmp_path, fake_backend_factory):
    # An engine's error text (or a judge's answer) may hold a lone surrogate: grade's log
    # writes it as a JSON escape, and rescore must write it back the same way, not crash.
    import json

    from click.testing import CliRunner
    from conftest import make_request

    from grader.backends import Completion
    from grader.cli import main
    from grader.io.results import read_records
    from grader.run.grading import run_grade

    data = tmp_path / "d.jsonl"
    data.write_text("".join(
        json.dumps({"id": i, "reference": "r", "output_text": "o"}) + "\n" for i in range(2)
    ))
    fake_backend_factory.replies = [
        Completion("", "error", 1, 0, error="decoder said \ud800 here"),
        Completion("not \udfff json", "stop", 1, 1),
    ]
    graded = tmp_path / "graded.jsonl"
    run_grade(*make_request(data, graded), backend_factory=fake_backend_factory)
    assert b"\\ud800" in graded.read_bytes()
    result = CliRunner().invoke(main, ["rescore", str(graded), "-o", str(tmp_path / "again.jsonl")])
    assert result.exit_code == 0, result.output
    again = [r for _, r in read_records(tmp_path / "again.jsonl")]
    assert again == [r for _, r in read_records(graded)]
    assert again[0].error == "decoder said \ud800 here"
    assert again[1].raw_output == "not \udfff json" and again[1].status == "parse_error"


def test_the_summary_is_typed_and_written_as_its_json_object(tmp_path):
    records = _parsed([{"id": 1, "status": "ok", "score": 3, "model_score": 2},
                       {"id": 2, "status": "parse_error", "score": None}])
    run = run_manifest(started="2026-11-27T00:00:00+00:00", data="d.jsonl", results="r.jsonl",
                       rows=2, resumed_rows=0, judge={"format": "seed", "unknown": 1},
                       engine=None, token_budget=None, identity={"run_key": "k"},
                       rubric={"path": "r.rubric.jsonl"})
    summary = summarize(records, run=run)
    assert isinstance(summary, Summary) and isinstance(summary.run, RunManifest)
    assert summary.graded == 1 and summary.mean_score == 3.0 and summary.pairwise is UNSET
    assert isinstance(summary.judge_disagreement, Disagreement)
    assert summary.judge_disagreement.disagree == 1 and summary.manifest.format == "seed"
    summary.judge_check = judge_verdict([])
    run.finished = "2026-11-27T00:00:01+00:00"
    written = summary.to_dict()
    # the sections a seed run has, in the file's order; the judge's fields null where unknown
    assert list(written) == ["rows", "statuses", "graded", "mean_score", "histogram",
                             "judge_disagreement", "judge_check", "run"]
    assert list(written["run"])[:6] == ["grader_version", "started", "data", "results", "rows",
                                        "resumed_rows"]
    assert written["run"]["model"] is None and "unknown" not in written["run"]
    # a stage's entry under its own name, after what every run has
    assert list(written["run"])[-4:] == ["host", "identity", "rubric", "finished"]
    assert summary.manifest.entries == {"rubric": {"path": "r.rubric.jsonl"}}
    assert summary["run"]["rubric"] == {"path": "r.rubric.jsonl"} and "entries" not in written["run"]
    # the dict-era reading: a section as its JSON object
    assert summary["judge_disagreement"] == {"rows": 1, "disagree": 1, "rate": 1.0}
    assert "flagged" not in summary and summary.get("flagged") is None
    with pytest.raises(KeyError):
        summary["panel"]
    # a lookup reads one field, as to_dict writes it: the same values, the same keys
    for section in (summary, run):
        whole = section.to_dict()
        assert {name: section[name] for name in whole} == whole
        assert all(section.get(name) is None for name in section.__struct_fields__
                   if name not in whole and name != "entries")
    assert run["rubric"] == {"path": "r.rubric.jsonl"} and "entries" not in run
    path = tmp_path / "r.summary.json"
    write_summary(path, summary)
    assert path.read_text(encoding="utf-8") == json.dumps(written, indent=2, ensure_ascii=False) + "\n"
    assert read_summary(tmp_path / "r.jsonl") == written


def test_a_stored_run_manifest_is_read_typed_keeping_what_it_does_not_declare(tmp_path):
    results = tmp_path / "r.jsonl"
    stored = tmp_path / "r.summary.json"
    assert read_manifest(results) is None  # no summary
    stored.write_text(json.dumps({"rows": 1}))  # another tool's: no run
    assert read_manifest(results) is None
    stored.write_text(json.dumps({"run": {"format": "rubric", "rows": 2, "rubric": {"path": "p"},
                                          "later_stage": [1]}}))
    run = read_manifest(results)
    assert run is not None and run.format == "rubric" and run.rows == 2
    assert run.entries == {"rubric": {"path": "p"}, "later_stage": [1]}
    assert run.to_dict() == {"rows": 2, "format": "rubric", "rubric": {"path": "p"}, "later_stage": [1]}
    stored.write_text(json.dumps({"run": {"rows": "many"}}))
    with pytest.raises(SummaryError, match="r.summary.json: run: Expected `int`"):
        read_manifest(results)
