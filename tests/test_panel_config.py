"""A judge panel from the settings file's ``panel`` section (``grader grade --config FILE``
without ``--model``, YAML or TOML, and ``grade_file(config=...)``): the same run as
``-m A -m B``, each judge with its own temperature; ``--model`` on the command line wins over
the section; a panel of one is refused in one line. And DATA on stdin (``-``), copied once for
every judge."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from conftest import FakeBackend, check_answer, cli


class Judges:
    """A backend factory whose judge answers as its model's script says (one reply a row)."""

    def __init__(self, scripts: dict[str, list[str]]):
        self.scripts = scripts
        self.loaded: list[tuple[str, float]] = []

    def __call__(self, name: str, *, model: str, sampling: Any, **options: Any) -> FakeBackend:
        self.loaded.append((model, sampling.temperature))
        return FakeBackend([check_answer(labels) for labels in self.scripts[model]])


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i}", "reference": "ref",
                                        "output_text": f"out {i}"}) + "\n" for i in range(2)))
    return data


def _models(tmp_path: Path, *names: str) -> list[Path]:
    for name in names:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    return [tmp_path / name for name in names]


def _config(tmp_path: Path, text: str, suffix: str = ".yaml") -> Path:
    path = tmp_path / f"settings{suffix}"
    path.write_text(text)
    return path


def test_the_settings_panel_section_grades_a_panel_with_each_judges_temperature(
        tmp_path, monkeypatch):
    a, b = _models(tmp_path, "a", "b")
    judges = Judges({str(a): ["yyy", "yny"], str(b): ["yyy", "nny"]})
    monkeypatch.setattr("grader.backends.load_backend", judges)
    config = _config(tmp_path, f"backend: vllm\nsampling:\n  temperature: 0.3\npanel:\n"
                               f"  - model: {a}\n  - model: {b}\n    temperature: 0.7\n")
    out = tmp_path / "out.jsonl"
    result = cli("grade", _data(tmp_path), "--config", config, "-o", out)
    assert result.exit_code == 0, result.output
    # judge 1 keeps the run's temperature, judge 2 has its own
    assert judges.loaded == [(str(a), 0.3), (str(b), 0.7)]
    assert "panel of 2 judges: Krippendorff's alpha" in result.output
    pooled = [json.loads(line) for line in out.read_text().splitlines()]
    # both must say present: "yyy"&"yyy" -> "yyy", "yny"&"nny" -> "nny"
    assert [json.loads(r["raw_output"])["l"] for r in pooled] == ["yyy", "nny"]
    assert [[j["labels"] for j in r["panel"]["judges"]] for r in pooled] == [
        ["yyy", "yyy"], ["yny", "nny"]]
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert [run["model"] for run in summary["run"]["panel"]] == [str(a), str(b)]


def test_a_toml_panel_of_array_tables_is_read_the_same(tmp_path, monkeypatch):
    a, b, c = _models(tmp_path, "a", "b", "c")
    judges = Judges({str(a): ["yyy", "yyy"], str(b): ["nnn", "nnn"], str(c): ["yyy", "nnn"]})
    monkeypatch.setattr("grader.backends.load_backend", judges)
    config = _config(tmp_path, "backend = \"vllm\"\n" + "".join(
        f"[[panel]]\nmodel = \"{m}\"\n" for m in (a, b, c)), ".toml")
    out = tmp_path / "out.jsonl"
    result = cli("grade", _data(tmp_path), "--config", config, "-o", out)
    assert result.exit_code == 0, result.output
    assert [model for model, _ in judges.loaded] == [str(a), str(b), str(c)]
    pooled = [json.loads(line) for line in out.read_text().splitlines()]
    assert [json.loads(r["raw_output"])["l"] for r in pooled] == ["yyy", "nnn"]  # 2 of 3


def test_model_on_the_command_line_wins_over_the_settings_panel(tmp_path, monkeypatch):
    a, b = _models(tmp_path, "a", "b")
    judges = Judges({str(a): ["yyy", "yyy"], str(b): ["nnn", "nnn"]})
    monkeypatch.setattr("grader.backends.load_backend", judges)
    config = _config(tmp_path, f"backend: vllm\npanel:\n  - model: {a}\n  - model: {b}\n")
    out = tmp_path / "out.jsonl"
    result = cli("grade", _data(tmp_path), "--config", config, "-m", b, "-o", out,
                 "--controls", "0")
    assert result.exit_code == 0, result.output
    assert judges.loaded == [(str(b), 0.0)]  # one judge, no panel
    assert "panel of" not in result.output
    assert not (tmp_path / "out.judge-1.jsonl").exists()


def test_a_settings_panel_of_one_judge_is_refused_in_one_line(tmp_path):
    (a,) = _models(tmp_path, "a")
    config = _config(tmp_path, f"panel:\n  - model: {a}\n")
    result = cli("grade", _data(tmp_path), "--config", config, "-o", tmp_path / "o.jsonl")
    assert result.exit_code == 2
    assert "panel: a panel needs two judges or more" in result.output
    assert "Traceback" not in result.output
    assert not list(tmp_path.glob("o.*"))


def test_the_python_api_grades_the_settings_panel(tmp_path, monkeypatch):
    from grader.api import grade_file

    a, b = _models(tmp_path, "a", "b")
    judges = Judges({str(a): ["yyy", "yyy"], str(b): ["nyy", "yyy"]})
    monkeypatch.setattr("grader.backends.load_backend", judges)
    config = _config(tmp_path, f"panel:\n  - model: {a}\n  - model: {b}\n    temperature: 0.5\n")
    result = grade_file(_data(tmp_path), tmp_path / "out.jsonl", config=str(config),
                        backend="vllm")
    assert judges.loaded == [(str(a), 0.0), (str(b), 0.5)]
    # "nyy": 5 x (0.7 x 1/2 + 0.21 + 0.09) = 3.25 -> 3; "yyy": 5
    assert [r.score for r in result.records] == [3, 5]
    assert result.summary["panel"]["judges"] == 2


def test_a_panel_reads_data_on_stdin_once_for_every_judge_and_resumes(tmp_path, monkeypatch):
    a, b = _models(tmp_path, "a", "b")
    judges = Judges({str(a): ["yyy", "yny"], str(b): ["yyy", "nny"]})
    broken = [str(b)]

    def load(name: str, **options: Any) -> FakeBackend:
        if options["model"] in broken:
            from grader.backends import EngineUnavailable

            raise EngineUnavailable("cannot load b")
        return judges(name, **options)

    monkeypatch.setattr("grader.backends.load_backend", load)
    spools = tmp_path / "spools"  # where the stdin copies go, to see them removed
    spools.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spools))
    rows = _data(tmp_path).read_text()
    command = ("grade", "-", "-m", a, "-m", b, "-o", tmp_path / "out.jsonl", "--backend", "vllm")
    first = cli(*command, input=rows)
    assert first.exit_code == 3, first.output
    assert "panel judge-2" in first.output and "cannot load b" in first.output
    broken.clear()
    again = cli(*command, input=rows)
    assert again.exit_code == 0, again.output
    # judge-1 loaded once: the second run resumed its rows from the same data on stdin
    assert [model for model, _ in judges.loaded] == [str(a), str(b)]
    pooled = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [json.loads(r["raw_output"])["l"] for r in pooled] == ["yyy", "nny"]
    summary = json.loads((tmp_path / "out.summary.json").read_text())
    assert summary["run"]["data"] == "-"
    assert not list(spools.iterdir())


def test_fail_on_a_judge_check_verdict_reads_the_panel_s_first_judge(tmp_path, monkeypatch):
    # a panel runs the controls for its first judge (issue 38.11): the gate reads that verdict
    a, b = _models(tmp_path, "a", "b")
    judges = Judges({str(a): ["yyy"] * 2, str(b): ["yyy"] * 2})
    monkeypatch.setattr("grader.backends.load_backend", judges)
    result = cli("grade", _data(tmp_path), "-m", a, "-m", b, "-o", tmp_path / "o.jsonl",
                 "--backend", "vllm", "--fail-on", "parse_error,too-few")
    assert result.exit_code == 1, result.output
    assert "judge check: TOO FEW" in result.output
    assert f"this check is of its first judge, judge-1 ({a})" in result.output
    assert result.output.splitlines()[-1] == "error: --fail-on: judge check too few"
