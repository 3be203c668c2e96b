"""Judge panels (``grade -m A -m B ...``): scripted fake judges, one per model name, for the
pooling rule (a strict majority of the whole panel; a judge that failed votes for neither), the
exact scores of the pooled labels, per-judge resume, and Krippendorff's alpha against the
``krippendorff`` package; one slow test with the tiny model on vLLM CPU through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import EXAMPLES, FakeBackend, check_answer, cli, make_request

from grader.analysis.panel import alpha
from grader.backends import EngineUnavailable
from grader.io.results import read_records
from grader.run.panel import PanelJudge, PanelJudgeError, run_panel
from grader.run.request import OptionError

# conftest's DRAFT: two facts, no conclusions, one term: labels "fact fact term"


def _data(tmp_path: Path, rows: int = 2, references: int = 1) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(
        json.dumps({"id": f"r{i}", "reference": f"ref {i % references}",
                    "output_text": f"out {i}"}) + "\n"
        for i in range(rows)))
    return data


class Judges:
    """A backend factory whose judge answers as its model's script says (one reply a row);
    it remembers which models it loaded and with what sampling."""

    def __init__(self, scripts: dict[str, list[Any]], broken: frozenset[str] = frozenset()):
        self.scripts, self.broken = scripts, set(broken)
        self.loaded: list[tuple[str, float]] = []

    def __call__(self, name: str, *, model: str, sampling: Any, **options: Any) -> FakeBackend:
        if model in self.broken:
            raise EngineUnavailable(f"cannot load {model}")
        self.loaded.append((model, sampling.temperature))
        return FakeBackend([check_answer(r) if len(r) == 3 else r for r in self.scripts[model]])


def _panel(tmp_path: Path, judges: Judges, models: list[str], rows: int = 2, **fields: Any):
    request, job = make_request(_data(tmp_path, rows), tmp_path / "out.jsonl", **fields)
    return run_panel(request, job, [PanelJudge(m) for m in models], backend_factory=judges)


def _model(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    return directory


def _records(path: Path) -> list[dict]:
    return [record.to_dict() for _, record in read_records(path)]


def test_a_broken_judge_still_gives_the_majority_of_the_others(tmp_path):
    # judge b writes no verdict (parse_error) on both rows; a and c decide
    judges = Judges({"a": ["yny", "yyy"], "b": ["oops", "oops"], "c": ["yyy", "nyy"]})
    summary = _panel(tmp_path, judges, ["a", "b", "c"])
    pooled = _records(tmp_path / "out.jsonl")
    # row 0: facts y/y, n/y, term y/y -> "yny"; row 1: y/n, y/y, y/y -> "nyy"; 2 of 3 needed
    assert [json.loads(r["raw_output"])["l"] for r in pooled] == ["yny", "nyy"]
    assert [r["status"] for r in pooled] == ["ok", "ok"]
    # 5 x (0.7 x 1/2 + 0.21 x 1 + 0.09) = 3.25 -> 3, on both rows
    assert [(r["score"], r["score_exact"]) for r in pooled] == [(3, 3.25), (3, 3.25)]
    judged = pooled[0]["panel"]["judges"]
    assert [(j["name"], j["status"], j["labels"]) for j in judged] == [
        ("judge-1", "ok", "yny"), ("judge-2", "parse_error", None), ("judge-3", "ok", "yyy")]
    assert pooled[0]["panel"]["answered"] == 2
    assert summary["statuses"]["ok"] == 2
    assert summary["panel"]["per_judge"][1]["rows"] == 0


def test_with_two_judges_both_must_say_present(tmp_path):
    judges = Judges({"a": ["yyy", "yyy"], "b": ["ynn", "yyy"]})
    _panel(tmp_path, judges, ["a", "b"])
    pooled = _records(tmp_path / "out.jsonl")
    assert [json.loads(r["raw_output"])["l"] for r in pooled] == ["ynn", "yyy"]
    # 5 x (0.7 x 1/2 + 0.21 x 0 + 0.09) = 2.2 -> 2; all present: 5
    assert [(r["score"], r["score_exact"]) for r in pooled] == [(2, 2.2), (5, 5.0)]


def test_organization_pools_by_the_same_majority(tmp_path):
    judges = Judges({"a": [check_answer("yyy", "mismatched")], "b": [check_answer("yyy")]})
    _panel(tmp_path, judges, ["a", "b"], rows=1)
    (pooled,) = _records(tmp_path / "out.jsonl")
    assert pooled["counts"]["organization"] == "mismatched"
    assert pooled["score_exact"] == 4.55  # 5 x (0.7 + 0.21)


def test_a_row_only_a_minority_answered_has_no_score(tmp_path):
    # two judges, one failed: no item could reach 2 votes; a score of 0 would be invented
    judges = Judges({"a": ["yyy", "oops"], "b": ["oops", "oops"]})
    summary = _panel(tmp_path, judges, ["a", "b"])
    pooled = _records(tmp_path / "out.jsonl")
    assert [(r["status"], r["score"]) for r in pooled] == [
        ("parse_error", None), ("parse_error", None)]
    assert pooled[0]["error"].startswith("only 1 of 2 judges answered")
    assert summary["graded"] == 0 and summary["mean_score"] is None


def test_every_judge_marks_the_first_judges_rubric_and_their_temperatures_differ(tmp_path):
    judges = Judges({"a": ["yyy"] * 5, "b": ["yyy"] * 5})
    # five references: enough for the controls, which a panel's judges do not run
    request, job = make_request(_data(tmp_path, 5, references=5), tmp_path / "out.jsonl")
    summary = run_panel(request, job, [PanelJudge("a", 0.0), PanelJudge("b", 0.7)],
                        backend_factory=judges)
    assert judges.loaded == [("a", 0.0), ("b", 0.7)]
    assert [run["results"] for run in summary["run"]["panel"]] == [
        str(tmp_path / "out.judge-1.jsonl"), str(tmp_path / "out.judge-2.jsonl")]
    assert not (tmp_path / "out.judge-2.rubric.jsonl").exists()  # no second rubric pass
    # the controls judge one judge; a panel's agreement judges its judges: none per judge
    assert not list(tmp_path.glob("out.judge-*.controls.jsonl"))
    assert summary["run"]["rubric_file"] == str(tmp_path / "out.judge-1.rubric.jsonl")


def test_a_crash_in_the_third_judge_keeps_the_first_two_judges_work(tmp_path):
    judges = Judges({"a": ["yyy", "yyy"], "b": ["yny", "yny"], "c": ["yyy", "nnn"]},
                    broken=frozenset({"c"}))
    with pytest.raises(PanelJudgeError) as failed:
        _panel(tmp_path, judges, ["a", "b", "c"])
    assert str(failed.value).startswith(
        "panel judge-3 (c): cannot load c; judges 1 to 2's results are saved beside the output")
    assert failed.value.exit_code == EngineUnavailable.exit_code
    assert not (tmp_path / "out.jsonl").exists()
    assert len(_records(tmp_path / "out.judge-2.jsonl")) == 2

    judges.broken.clear()
    judges.loaded.clear()
    summary = _panel(tmp_path, judges, ["a", "b", "c"])
    assert [model for model, _ in judges.loaded] == ["c"]  # a and b resumed, never loaded
    assert [run["resumed_rows"] for run in summary["run"]["panel"]] == [2, 2, 0]
    pooled = _records(tmp_path / "out.jsonl")
    assert [json.loads(r["raw_output"])["l"] for r in pooled] == ["yyy", "yny"]


def test_formats_whose_labels_do_not_pool_are_refused(tmp_path):
    judges = Judges({})
    for fields, says in (({"format": "itemized"}, "needs --format rubric, not itemized"),
                         ({"evidence": True}, "--evidence is not for a judge panel")):
        with pytest.raises(OptionError, match=says):
            _panel(tmp_path, judges, ["a", "b"], **fields)
    assert judges.loaded == []


@pytest.mark.parametrize("level", ["nominal", "interval"])
@pytest.mark.parametrize("seed", range(4))
def test_alpha_matches_the_krippendorff_package(level, seed):
    krippendorff = pytest.importorskip("krippendorff")
    rng = np.random.default_rng(seed)
    data = rng.integers(0, 2 if level == "nominal" else 6, (3, 30)).astype(float)
    data[rng.random(data.shape) < 0.2] = np.nan  # judges that did not answer
    expected = krippendorff.alpha(reliability_data=data, level_of_measurement=level)
    assert alpha(data, level) == pytest.approx(expected, abs=1e-12)


def test_alpha_is_one_for_judges_that_agree_and_undefined_without_variation():
    assert alpha([[1, 0, 1, 0], [1, 0, 1, 0]]) == 1.0
    assert alpha([[1, 1, 1], [1, 1, 1]]) is None
    assert alpha([[1, np.nan], [np.nan, 0]]) is None  # no unit holds two values


def test_the_cli_grades_a_panel_and_prints_its_agreement(tmp_path, monkeypatch):
    a, b = _model(tmp_path, "a"), _model(tmp_path, "b")
    judges = Judges({str(a): ["yyy", "yny"], str(b): ["yyy", "nny"]})
    monkeypatch.setattr("grader.backends.load_backend", judges)
    out = tmp_path / "out.jsonl"
    result = cli("grade", _data(tmp_path), "-m", a, "-m", b, "-o", out, "--backend", "vllm",
                 "--panel-temperature", "0", "--panel-temperature", "0.7")
    assert result.exit_code == 0, result.output
    assert judges.loaded == [(str(a), 0.0), (str(b), 0.7)]
    assert "panel of 2 judges: Krippendorff's alpha" in result.output
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["panel"]["judges"] == 2
    assert [j["label_agreement"] for j in summary["panel"]["per_judge"]] == [0.8333, 1.0]


def test_the_python_api_grades_a_panel(tmp_path, monkeypatch):
    from grader.api import grade_panel

    a, b = _model(tmp_path, "a"), _model(tmp_path, "b")
    judges = Judges({str(a): ["yyy"], str(b): ["nyy"]})
    monkeypatch.setattr("grader.backends.load_backend", judges)
    result = grade_panel(_data(tmp_path, 1), tmp_path / "out.jsonl", [a, b],
                         temperatures=[0, 0.5], backend="vllm")
    assert judges.loaded == [(str(a), 0.0), (str(b), 0.5)]
    assert [r.score for r in result.records] == [3]  # "nyy": 5 x (0.7 x 1/2 + 0.21 + 0.09)
    with pytest.raises(OptionError, match="needs --format rubric"):
        grade_panel(_data(tmp_path, 1), tmp_path / "o2.jsonl", [a, b], format="itemized")


def test_a_settings_files_panel_section_names_the_judges(tmp_path, monkeypatch):
    a, b = _model(tmp_path, "a"), _model(tmp_path, "b")
    judges = Judges({str(a): ["yyy"], str(b): ["yyy"]})
    monkeypatch.setattr("grader.backends.load_backend", judges)
    config = tmp_path / "judges.yaml"
    config.write_text(f"backend: vllm\npanel:\n  - model: {a}\n  - model: {b}\n"
                      "    temperature: 0.7\n")
    result = cli("grade", _data(tmp_path, 1), "--config", config, "-o", tmp_path / "out.jsonl")
    assert result.exit_code == 0, result.output
    assert judges.loaded == [(str(a), 0.0), (str(b), 0.7)]
    # --model on the command line wins over the section: one judge, no panel
    judges.loaded.clear()
    result = cli("grade", _data(tmp_path, 1), "--config", config, "-m", a, "-o",
                 tmp_path / "one.jsonl")
    assert result.exit_code == 0, result.output
    assert judges.loaded == [(str(a), 0.0)]
    assert "panel of" not in result.output


def test_a_ctrl_c_as_the_second_judge_loads_says_the_first_judges_work_is_saved(
        tmp_path, monkeypatch):
    a, b = _model(tmp_path, "a"), _model(tmp_path, "b")
    judges = Judges({str(a): ["yyy"], str(b): ["yyy"]})

    def load(name: str, **options: Any) -> FakeBackend:
        if options["model"] == str(b):
            raise KeyboardInterrupt
        return judges(name, **options)

    monkeypatch.setattr("grader.backends.load_backend", load)
    out = tmp_path / "out.jsonl"
    result = cli("grade", _data(tmp_path, 1), "-m", a, "-m", b, "-o", out, "--backend", "vllm")
    assert result.exit_code == 130
    assert "the panel's judges' work so far is saved beside it (out.judge-1.jsonl" in result.output
    assert "; to resume: " in result.output and " grade " in result.output
    assert len(_records(tmp_path / "out.judge-1.jsonl")) == 1


@pytest.mark.parametrize("args, says", [
    (["--format", "itemized"], "needs --format rubric"),
    (["--panel-temperature", "0"], "--panel-temperature given 1 times for 2 judges"),
])
def test_the_cli_refuses_a_panel_it_cannot_pool(tmp_path, args, says):
    a, b = _model(tmp_path, "a"), _model(tmp_path, "b")
    result = cli("grade", _data(tmp_path), "-m", a, "-m", b, "-o", tmp_path / "o.jsonl", *args)
    assert result.exit_code == 2
    assert says in result.output
    assert not list(tmp_path.glob("o.*"))


@pytest.mark.slow
def test_a_panel_of_two_judges_runs_resumes_after_a_kill_and_reports_alpha(tiny_model, tmp_path):
    """The tiny model at temperature 0 and at 0.7 (seeded) stands in for two models, on vLLM CPU
    (the panel's mechanics, not its judging: answers cut at 64 tokens, no controls, 2
    rows); the run is killed (SIGTERM) once the first judge's results are in, and the rerun
    resumes it without grading its rows again."""
    out = tmp_path / "panel.jsonl"
    command = [sys.executable, "-m", "grader", "grade", str(EXAMPLES / "qa_multi.jsonl"),
               "-m", str(tiny_model), "-m", str(tiny_model), "--panel-temperature", "0",
               "--panel-temperature", "0.7", "--seed", "1", "-o", str(out), "--backend", "vllm",
               "--max-tokens", "64", "--controls", "0", "--limit", "2",
               "--enforce-eager"]
    first = tmp_path / "panel.judge-1.jsonl"
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as run:
        try:
            while run.poll() is None and not first.exists():
                try:
                    run.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            # SIGTERM, as a scheduler kills a job: grader closes the second judge's engine
            run.terminate()
            try:
                run.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                run.kill()
                run.communicate()
    assert run.returncode != 0
    assert first.exists() and not out.exists()
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-12000:]
    summary = json.loads((tmp_path / "panel.summary.json").read_text())
    assert summary["run"]["panel"][0]["resumed_rows"] == 2
    assert summary["rows"] == 2
    assert "alpha_labels" in summary["panel"] and "alpha_scores" in summary["panel"]
    assert "panel of 2 judges: Krippendorff's alpha" in done.stdout
    for record in _records(out):
        assert len(record["panel"]["judges"]) == 2
