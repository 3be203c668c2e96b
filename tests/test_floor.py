"""The word-overlap floor of ``grader agree`` (issue 28 item 4): a judge that needs no model."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, cli

from grader.analysis.floor import floor_score, item_present, reference_facts
from grader.judge.words import content_words

QA = EXAMPLES / "qa.jsonl"


def results_of(path, score):
    """A results file of examples/qa.jsonl whose judge gives ``score(row)``."""
    with open(QA, encoding="utf-8") as stream, open(path, "w", encoding="utf-8") as out:
        for line in stream:
            row = json.loads(line)
            out.write(json.dumps({"id": row["id"], "status": "ok", "score": score(row)}) + "\n")
    return path


def agree_json(path, *extra):
    result = cli("agree", path, "--human", "human_score", "--data", QA, "--json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_item_present_at_half_of_its_content_words():
    answer = content_words("Paris is lovely")
    assert item_present("Paris capital", answer)  # 1 of 2 content words: half
    assert not item_present("Paris capital France", answer)  # 1 of 3
    assert not item_present("the of and", answer)  # no content word: never present


def test_reference_sentences_are_the_facts():
    facts = reference_facts("At sea level (101.325 kPa) it boils at 100 °C. It falls! Why?  ")
    assert facts == ["At sea level (101.325 kPa) it boils at 100 °C.", "It falls!", "Why?"]


def test_floor_score_uses_the_seed_formula_and_the_rubric():
    reference = "Water boils at 100 C at sea level. Pressure falls with altitude."
    # facts 1/2, no terms (ratio 1): 5 * (0.7 * 1/2 + 0.21 + 0.09) = 3.25 -> 3
    assert floor_score("Water boils at 100 C.", reference) == (3, "reference")
    assert floor_score("", reference) == (0, "missing")
    rubric = {"facts": ["Pressure falls with altitude"], "conclusions": ["cook slower"],
              "terms": ["vapor pressure"]}
    # facts 1/1, conclusions 0/1, terms 1/1 ("pressure" is half of the term's words):
    # 5 * (0.4 + 0 + 0.21 + 0.09) = 3.5 -> 4, half up
    assert floor_score("Pressure falls with altitude.", reference, rubric) == (4, "rubric")


def test_floor_on_the_shipped_human_scores(tmp_path):
    """The issue's measurement: word overlap agrees at quadratic kappa 0.71 with
    examples/qa.jsonl's human scores; a judge that gives every row 3 does not beat it."""
    result = agree_json(results_of(tmp_path / "r.jsonl", lambda row: 3))
    floor = result["floor"]
    assert floor["n"] == result["n"] == 24
    assert floor["quadratic_weighted_kappa"] == pytest.approx(0.714, abs=0.001)
    assert floor["items_from"] == {"rubric": 0, "reference": 21, "missing": 3}
    assert floor["kappa_difference"]["value"] == pytest.approx(-0.714, abs=0.001)
    low, high = floor["kappa_difference"]["interval"]
    assert low < high < 0
    assert floor["conclusion"].startswith("the judge does not beat word overlap")


def test_a_judge_that_matches_the_humans_beats_the_floor(tmp_path):
    path = results_of(tmp_path / "r.jsonl", lambda row: row["human_score"])
    result = cli("agree", path, "--human", "human_score", "--data", QA)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    row = next(line for line in lines if line.startswith("kappa (quadratic)") and "0.714" in line)
    assert row.split()[2] == "1.000" and row.split()[-3] == "0.714"
    assert "conclusion: the judge beats word overlap" in result.output


def test_floor_reads_the_records_rubric_and_text(tmp_path):
    """Without --data: the records' own output_text and rubric (the rubric format's records)."""
    rubric = {"facts": ["Paris is the capital of France", "The Seine flows through Paris"],
              "conclusions": [], "terms": []}
    rows = [("Paris is the capital of France; the Seine flows through it.", 5),
            ("Paris is the capital of France.", 3), ("Lyon is a city.", 1), ("", 0)]
    path = tmp_path / "r.jsonl"
    with open(path, "w", encoding="utf-8") as out:
        for i, (answer, human) in enumerate(rows):
            out.write(json.dumps({"id": i, "status": "ok", "score": 2, "format": "rubric",
                                  "rubric": {"key": "k", **rubric}, "output_text": answer,
                                  "human": human}) + "\n")
    result = cli("agree", path, "--human", "human", "--json")
    assert result.exit_code == 0, result.output
    floor = json.loads(result.output)["floor"]
    assert floor["items_from"] == {"rubric": 3, "reference": 0, "missing": 1}
    # 2/2 -> 5*(0.7+0.21+0.09) = 5; 1/2 -> 3.25 -> 3; 0/2 -> no fact: 5*0.21 -> 1; blank: 0
    assert [sum(row) for row in floor["confusion_matrix"]] == [1, 1, 0, 1, 0, 1]
    assert floor["exact_agreement"] == 1.0


def test_floor_needs_the_answers(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"id": i, "status": "ok", "score": i, "h": i}) + "\n"
                            for i in range(4)))
    result = cli("agree", path, "--human", "h")
    assert result.exit_code == 0, result.output
    assert "floor to beat: not computed: the answers are not known (pass --data)" in result.output
    assert json.loads(cli("agree", path, "--human", "h", "--json").output)["floor"] is None


def test_floor_reads_the_answers_from_the_dataset_the_run_recorded(tmp_path):
    """Without --data, records without their answers: the dataset named in the summary's
    run.data (the human labels in the records, as another tool writes them)."""
    rows = [json.loads(line) for line in open(QA, encoding="utf-8")]
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"id": r["id"], "status": "ok", "score": 3,
                                        "human": r["human_score"]}) + "\n" for r in rows))
    summary = tmp_path / "r.summary.json"
    summary.write_text(json.dumps({"run": {"data": str(QA)}}))
    result = cli("agree", path, "--human", "human", "--json")
    assert result.exit_code == 0, result.output
    floor = json.loads(result.output)["floor"]
    assert floor["answers_from"] == str(QA)
    assert floor["quadratic_weighted_kappa"] == pytest.approx(0.714, abs=0.001)
    assert f"answers from: {QA}" in cli("agree", path, "--human", "human").output
    # a recorded dataset that does not hold every compared row is not used
    summary.write_text(json.dumps({"run": {"data": str(EXAMPLES / "qa_multi.jsonl")}}))
    assert json.loads(cli("agree", path, "--human", "human", "--json").output)["floor"] is None
