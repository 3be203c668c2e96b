"""Nothing kept on resume is trusted that was not recomputed (issue 38 item 5).

A resumed run reads each record it keeps (results, controls, a panel's per-judge files) again
from its raw text, as ``rescore`` does; a record whose stored score, items or counts say
otherwise is graded again, counted and named in the summary, and the judge check comes from the
controls' recomputed scores, in ``grade`` and in ``rescore`` alike.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import FakeBackend
from test_controls import TOPICS, ReadingJudge

from grader.cli import main
from grader.io.results import summary_path
from grader.run.controls import controls_path


class Engine:
    def __init__(self, judge: type[FakeBackend] = FakeBackend) -> None:
        self.judge = judge
        self.backends: list[FakeBackend] = []

    def __call__(self, name: str, **options: Any) -> FakeBackend:
        self.backends.append(self.judge(chunk_size=4))
        return self.backends[-1]

    @property
    def sent(self) -> int:
        return sum(len(call) for backend in self.backends for call in backend.calls)


def _rows() -> list[dict]:
    # the reference itself as the answer: every item present, score 5
    return [{"id": f"q{i}", "input": question, "reference": reference, "output_text": reference}
            for i, (question, reference) in enumerate(TOPICS)]


def _grade(data: Path, out: Path, model: Path, *extra: Any):
    return CliRunner().invoke(main, ["grade", str(data), "--model", str(model), "-o", str(out),
                                     "--backend", "transformers", *map(str, extra)],
                              prog_name="grader")


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rewrite(path: Path, edit) -> None:
    path.write_text("".join(json.dumps(edit(record)) + "\n" for record in _lines(path)))


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    return path


def test_an_edited_score_in_the_results_is_regraded_counted_and_named(
        tmp_path, data, model, monkeypatch):
    engine = Engine(ReadingJudge)
    monkeypatch.setattr("grader.backends.load_backend", engine)
    out = tmp_path / "r.jsonl"
    assert _grade(data, out, model, "--controls", 0).exit_code == 0
    first = _lines(out)
    assert all(r["score"] == 5 for r in first)

    def zero(record: dict) -> dict:  # score 0 beside "grade": {"score": 5}
        return record | {"score": 0, "score_exact": 0} if record["id"] in ("q1", "q4") else record

    _rewrite(out, zero)
    sent = engine.sent
    result = _grade(data, out, model, "--controls", 0)
    assert result.exit_code == 0, result.output
    assert engine.sent - sent == 2  # those two rows only, graded again
    assert "2 kept records said other than the judge's raw text" in result.output
    assert "q1, q4" in result.output
    assert _lines(out) == first  # as the judge's raw text has it
    regraded = json.loads(summary_path(out).read_text())["run"]["regraded"]
    assert (regraded["rows"], regraded["ids"]) == (2, ["q1", "q4"])
    # a run that keeps every record unedited regrades none and says nothing of it
    again = _grade(data, out, model, "--controls", 0)
    assert engine.sent - sent == 2 and "said other than" not in again.output
    assert "regraded" not in json.loads(summary_path(out).read_text())["run"]


def test_edited_items_in_the_results_are_regraded(tmp_path, data, model, monkeypatch):
    engine = Engine(ReadingJudge)
    monkeypatch.setattr("grader.backends.load_backend", engine)
    out = tmp_path / "r.jsonl"
    assert _grade(data, out, model, "--controls", 0).exit_code == 0
    first = _lines(out)

    def absent(record: dict) -> dict:  # the items marked absent, the score left as it was
        if record["id"] != "q2":
            return record
        items = record["items"]
        items["facts"] = [item | {"present": False} for item in items["facts"]]
        return record | {"items": items}

    _rewrite(out, absent)
    sent = engine.sent
    assert _grade(data, out, model, "--controls", 0).exit_code == 0
    assert engine.sent - sent == 1 and _lines(out) == first


def _judge_check(out: Path) -> dict:
    return json.loads(summary_path(out).read_text())["judge_check"]


def _zero_controls(record: dict) -> dict:
    # the wrong answers' and non-answers' scores edited to 0: a judge that tells them apart
    if record["id"].endswith(("#control:wrong", "#control:non_answer")):
        return record | {"score": 0, "score_exact": 0}
    return record


def test_edited_control_scores_do_not_change_the_verdict_on_resume_or_rescore(
        tmp_path, data, model, monkeypatch):
    engine = Engine()  # every item present, whatever the answer: no signal
    monkeypatch.setattr("grader.backends.load_backend", engine)
    out = tmp_path / "r.jsonl"
    assert _grade(data, out, model).exit_code == 0
    check = _judge_check(out)
    assert check["verdict"] == "no signal"
    controls = controls_path(out)
    kinds = {r["id"].rpartition(":")[2] for r in _lines(controls)}
    assert {"wrong", "non_answer"} <= kinds

    _rewrite(controls, _zero_controls)
    sent = engine.sent
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    edited = sum(r["id"].endswith(("wrong", "non_answer")) for r in _lines(controls))
    assert engine.sent - sent == edited  # the edited controls, graded again
    assert _judge_check(out)["verdict"] == "no signal"
    assert json.loads(summary_path(out).read_text())["run"]["regraded"]["rows"] == edited

    # rescore recomputes the verdict from the controls' raw text too
    _rewrite(controls, _zero_controls)
    stored = json.loads(summary_path(out).read_text())
    stored["judge_check"] = stored["judge_check"] | {"verdict": "informative"}
    summary_path(out).write_text(json.dumps(stored))
    result = CliRunner().invoke(main, ["rescore", str(out), "-o", str(out)])
    assert result.exit_code == 0, result.output
    rescored = _judge_check(out)
    assert rescored["verdict"] == "no signal"
    assert {k: v for k, v in rescored.items() if k != "controls"} == {
        k: v for k, v in check.items() if k != "controls"}


def test_a_panel_judges_edited_items_are_regraded_before_pooling(tmp_path, data, model, monkeypatch):
    engine = Engine(ReadingJudge)
    monkeypatch.setattr("grader.backends.load_backend", engine)
    out = tmp_path / "p.jsonl"
    other = tmp_path / "model2"
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert _grade(data, out, model, "-m", other).exit_code == 0
    pooled = _lines(out)
    assert all(r["score"] == 5 for r in pooled)
    first_judge = tmp_path / "p.judge-1.jsonl"

    def absent(record: dict) -> dict:
        items = record["items"]
        items["facts"] = [item | {"present": False} for item in items["facts"]]
        return record | {"items": items}

    _rewrite(first_judge, absent)
    sent = engine.sent
    result = _grade(data, out, model, "-m", other)
    assert result.exit_code == 0, result.output
    assert engine.sent - sent == len(TOPICS)  # judge 1's rows, graded again
    assert [r["score"] for r in _lines(out)] == [r["score"] for r in pooled]
