"""Comparing two results files: paired means, wins/ties/losses, sign test, exclusions, intervals."""

from __future__ import annotations

import json
from math import comb

import pytest

from grader.analysis.compare import compare, format_comparison
from grader.records import ResultsError

# Scores of models A and B on rows 0..11: B wins 7, ties 3, loses 2.
A = [2, 3, 1, 4, 0, 5, 2, 3, 3, 1, 4, 2]
B = [4, 3, 2, 5, 0, 4, 3, 3, 5, 2, 2, 5]


def write_results(path, rows):
    with open(path, "w", encoding="utf-8") as stream:
        for row in rows:
            stream.write(json.dumps({"status": "ok", **row}) + "\n")
    return path


def pair_files(tmp_path, a=A, b=B):
    return (
        write_results(tmp_path / "a.jsonl", [{"id": f"r{i}", "score": s} for i, s in enumerate(a)]),
        write_results(tmp_path / "b.jsonl", [{"id": f"r{i}", "score": s} for i, s in enumerate(b)]),
    )


def sign_test(wins, losses):
    """Two-sided exact sign test: twice the smaller binomial tail at p = 1/2, at most 1."""
    n = wins + losses
    tail = sum(comb(n, i) for i in range(min(wins, losses) + 1)) / 2**n
    return min(1.0, 2 * tail)


def test_means_differences_and_wins(tmp_path):
    result = compare(*pair_files(tmp_path), bootstrap=0)
    assert result["n"] == 12
    assert result["mean_a"] == pytest.approx(sum(A) / 12)
    assert result["mean_b"] == pytest.approx(sum(B) / 12)
    assert result["mean_difference"] == pytest.approx(sum(b - a for a, b in zip(A, B)) / 12)
    assert result["wins"] == sum(b > a for a, b in zip(A, B)) == 7
    assert result["ties"] == sum(b == a for a, b in zip(A, B)) == 3
    assert result["losses"] == sum(b < a for a, b in zip(A, B)) == 2


def test_sign_test_against_the_binomial_sum(tmp_path):
    result = compare(*pair_files(tmp_path), bootstrap=0)
    # 7 wins of 9 untied pairs: 2 * (C(9,0) + C(9,1) + C(9,2)) / 2^9 = 92 / 512
    assert sign_test(7, 2) == pytest.approx(92 / 512)
    assert result["sign_test_p"] == pytest.approx(92 / 512)
    # swapping the files swaps wins and losses, not the p-value
    a, b = pair_files(tmp_path)
    swapped = compare(b, a, bootstrap=0)
    assert (swapped["wins"], swapped["losses"]) == (2, 7)
    assert swapped["sign_test_p"] == pytest.approx(result["sign_test_p"])
    assert swapped["mean_difference"] == pytest.approx(-result["mean_difference"])
    # an even split has p = 1
    even = compare(*pair_files(tmp_path, [1, 2, 3, 3], [2, 1, 3, 3]), bootstrap=0)
    assert even["sign_test_p"] == pytest.approx(1.0) == sign_test(1, 1)


def test_every_pair_tied_has_no_sign_test(tmp_path):
    result = compare(*pair_files(tmp_path, [1, 2, 3], [1, 2, 3]), bootstrap=100)
    assert (result["wins"], result["ties"], result["losses"]) == (0, 3, 0)
    assert result["sign_test_p"] is None
    assert result["intervals"]["mean_difference"] == [0.0, 0.0]
    assert "every pair ties: no sign test" in result["notes"]


def test_interval_contains_the_difference_and_repeats_with_the_seed(tmp_path):
    a, b = pair_files(tmp_path)
    first = compare(a, b, bootstrap=500, seed=3)
    assert first == compare(a, b, bootstrap=500, seed=3)
    assert first["intervals"] != compare(a, b, bootstrap=500, seed=4)["intervals"]
    for name in ("mean_a", "mean_b", "mean_difference"):
        low, high = first["intervals"][name]
        assert low < first[name] < high, name
    assert first["bootstrap"]["valid"]["mean_difference"] == 500
    json.dumps(first, allow_nan=False)


def test_excluded_rows_and_statuses(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [
        {"id": 1, "score": 3},
        {"id": 2, "score": 4},
        {"id": 3, "status": "truncated", "score": None},
        {"id": 4, "score": 2},
        {"id": 5, "status": "engine_error", "score": None},
        {"id": 6, "status": "missing_context", "score": 0},
        {"id": "only-a", "score": 5},
    ])
    b = write_results(tmp_path / "b.jsonl", [
        {"id": 6, "score": 1},
        {"id": 5, "status": "invalid_counts", "score": None},
        {"id": 4, "status": "parse_error", "score": None},
        {"id": 3, "score": 1},
        {"id": 2, "score": 4},
        {"id": 1, "score": 5},
        {"id": "only-b-1", "score": 5},
        {"id": "only-b-2", "score": 0},
    ])
    result = compare(a, b, bootstrap=0)
    assert result["n"] == 3  # ids 1, 2 and 6, joined by id whatever the order
    assert result["mean_a"] == pytest.approx((3 + 4 + 0) / 3)
    assert result["mean_b"] == pytest.approx((5 + 4 + 1) / 3)
    assert (result["wins"], result["ties"], result["losses"]) == (2, 1, 0)
    assert result["excluded"] == {
        "rows": 6, "only_in_a": 1, "only_in_b": 2, "no_score_in_a": 1, "no_score_in_b": 1,
        "no_score_in_either": 1,
    }
    assert result["statuses"]["a"]["ok"] == 4
    assert result["statuses"]["a"]["truncated"] == 1
    assert result["statuses"]["a"]["missing_context"] == 1
    assert result["statuses"]["b"]["ok"] == 6
    assert result["statuses"]["b"]["parse_error"] == 1


def test_no_pairs(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [{"id": 1, "score": 3}])
    b = write_results(tmp_path / "b.jsonl", [{"id": 2, "score": 3}])
    result = compare(a, b, bootstrap=100)
    assert result["n"] == 0
    assert result["mean_difference"] is None and result["sign_test_p"] is None
    assert result["intervals"]["mean_difference"] is None
    json.dumps(result, allow_nan=False)
    assert "pairs (n)" in format_comparison(result)


def test_different_judge_settings_are_noted(tmp_path):
    a, b = pair_files(tmp_path)
    run = {"model": "/models/judge", "prompt": {"path": "/x/seed.yaml", "sha256": "p"},
           "schema_sha256": "s", "checklist": True, "sampling": {"temperature": 0.0}}
    (tmp_path / "a.summary.json").write_text(json.dumps({"run": run}))
    (tmp_path / "b.summary.json").write_text(
        json.dumps({"run": {**run, "prompt": {"path": "/y/seed.yaml", "sha256": "p"}}})
    )
    assert compare(a, b, bootstrap=0)["notes"] == []  # the same prompt from another place
    (tmp_path / "b.summary.json").write_text(json.dumps({"run": {**run, "model": "/models/other"}}))
    notes = compare(a, b, bootstrap=0)["notes"]
    assert len(notes) == 1 and "different judge settings (model)" in notes[0]


def _model(path, mtime=1, config="c"):
    return {"name": path, "path": path, "config_sha256": config, "tokenizer_sha256": "t",
            "chat_template_sha256": "ct", "weights": [{"file": "w.safetensors", "bytes": 9, "mtime": mtime}]}


def test_the_same_judge_copied_elsewhere_is_the_same_judge(tmp_path):
    a, b = pair_files(tmp_path)
    run = {"model": _model("/models/judge"), "prompt": {"sha256": "p"}, "schema_sha256": "s",
           "checklist": True, "sampling": {"temperature": 0.0}}
    (tmp_path / "a.summary.json").write_text(json.dumps({"run": run}))
    moved = {**run, "model": _model("./judge", mtime=2)}
    (tmp_path / "b.summary.json").write_text(json.dumps({"run": moved}))
    assert compare(a, b, bootstrap=0)["notes"] == []
    other = {**run, "model": _model("/models/judge", config="other")}
    (tmp_path / "b.summary.json").write_text(json.dumps({"run": other}))
    assert "different judge settings (model)" in compare(a, b, bootstrap=0)["notes"][0]


def test_a_summary_that_does_not_name_its_judge_is_noted(tmp_path):
    a, b = pair_files(tmp_path)
    run = {"model": "/models/judge", "prompt": {"sha256": "p"}, "schema_sha256": "s",
           "checklist": True, "sampling": {"temperature": 0.0}}
    (tmp_path / "a.summary.json").write_text(json.dumps({"run": run}))
    # what a --data-parallel run wrote before every command shared one manifest
    (tmp_path / "b.summary.json").write_text(json.dumps({"run": {"data_parallel": 2}}))
    notes = compare(a, b, bootstrap=0)["notes"]
    assert notes == ["the summary of B does not say which judge graded it: the judges may differ"]
    (tmp_path / "b.summary.json").write_text("{broken")
    assert "the summary of B cannot be read" in compare(a, b, bootstrap=0)["notes"][0]


def test_bad_files(tmp_path):
    a, _ = pair_files(tmp_path)
    with pytest.raises(ResultsError, match="cannot read the file"):
        compare(a, tmp_path / "missing.jsonl")
    duplicate = write_results(tmp_path / "d.jsonl", [{"id": 1, "score": 1}, {"id": 1, "score": 2}])
    with pytest.raises(ResultsError, match="duplicate id"):
        compare(a, duplicate)


def test_format_comparison(tmp_path):
    result = compare(*pair_files(tmp_path), bootstrap=200)
    text = format_comparison(result)
    assert "B better / tie / worse" in text and "7 / 3 / 2" in text
    low, high = result["intervals"]["mean_difference"]
    assert f"[{low:.3f}, {high:.3f}]" in text
    assert f"{result['sign_test_p']:.4g}" in text


def test_a_side_without_a_summary_is_noted_in_the_text_and_the_json(tmp_path):
    from click.testing import CliRunner

    from grader.cli import main

    a, b = pair_files(tmp_path)
    run = {"model": "/models/judge", "prompt": {"sha256": "p"}, "schema_sha256": "s",
           "checklist": True, "sampling": {"temperature": 0.0}}
    (tmp_path / "a.summary.json").write_text(json.dumps({"run": run}))
    notes = compare(a, b, bootstrap=0)["notes"]
    assert notes == [f"no summary beside B ({tmp_path / 'b.summary.json'}): cannot tell whether "
                     "one judge graded both"]
    text = CliRunner().invoke(main, ["compare", str(a), str(b), "--bootstrap", "100"])
    assert text.exit_code == 0 and "note: no summary beside B" in text.output
    result = CliRunner().invoke(main, ["compare", str(a), str(b), "--bootstrap", "100", "--json"])
    assert json.loads(result.output)["notes"] == notes


def test_records_of_different_formats_are_noted(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [{"id": i, "score": 3, "format": "itemized"} for i in range(4)])
    b = write_results(tmp_path / "b.jsonl", [{"id": i, "score": 4, "format": "seed"} for i in range(4)])
    notes = compare(a, b, bootstrap=0)["notes"]
    assert "the records' formats differ (A: itemized, B: seed)" in notes[0]
    mixed = write_results(tmp_path / "m.jsonl", [{"id": i, "score": 4, "format": f}
                                                 for i, f in enumerate(["seed", "itemized"] * 2)])
    assert "B holds records of several formats (seed, itemized)" in compare(a, mixed, bootstrap=0)["notes"][0]
    same = write_results(tmp_path / "s.jsonl", [{"id": i, "score": 1, "format": "itemized"} for i in range(4)])
    assert not any("format" in note for note in compare(a, same, bootstrap=0)["notes"])
