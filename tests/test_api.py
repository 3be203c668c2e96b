"""The Python API (grader.api): the README's example runs as written, its defaults are the
CLI's, a Grader loads its model once, and a bad setting is one GraderError."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import grader
from grader import cli
from grader.run.request import OptionError
from tests.conftest import EXAMPLES, ROOT


def _readme_example() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return code


@pytest.mark.slow  # two runs of the tiny model on CPU: about a minute and a half
def test_the_readmes_example_runs_on_the_tiny_model(tiny_model, tmp_path, capsys):
    (tmp_path / "judge-model").symlink_to(tiny_model)
    (tmp_path / "examples").mkdir()
    shutil.copy(EXAMPLES / "qa.jsonl", tmp_path / "examples" / "qa.jsonl")
    # the example as written, run as a script's main module (its `__main__` guard)
    exec(compile(_readme_example(), "README.md (Python API)", "exec"), {"__name__": "__main__"})  # noqa: S102
    printed = capsys.readouterr().out
    assert re.search(r"^boil \w+ ", printed, flags=re.M)
    assert "2 unknown setting temprature" in printed
    assert (tmp_path / "results.summary.json").is_file()


def test_the_readmes_example_keeps_its_grading_under_the_main_guard():
    """Issue 38, item 14: run as a script on vLLM, the engine's process re-imports it; the
    README's example guards what grades, and says why."""
    import ast

    tree = ast.parse(_readme_example())
    calls = {node.func.attr for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)}
    assert {"Grader", "grade_file", "rescore"} <= calls
    top = [node for node in tree.body if not isinstance(node, (ast.Import, ast.ImportFrom))]
    guarded = [node for node in top if isinstance(node, ast.If)
               and ast.unparse(node.test) == "__name__ == '__main__'"]
    assert len(guarded) == 1
    # nothing else at the top level calls grader
    for node in top:
        if node is not guarded[0]:
            assert "grader." not in ast.unparse(node), ast.unparse(node)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Python API", 1)[1].split("\n## ", 1)[0]
    assert "imports the script again" in section


def test_import_grader_loads_no_torch():
    code = "import sys, grader; grader.grade_file; grader.Grader; print('torch' in sys.modules, 'vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    assert out.stdout.split() == ["False", "False"]


@pytest.fixture
def fake_model(tmp_path, fake_backend_factory, monkeypatch):
    """A model directory the API's executors answer with the fake backend."""
    from grader.run import grading
    from tests.answers import answer

    fake_backend_factory.default = answer()
    made = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor",
                        lambda *a: made(*a, backend_factory=fake_backend_factory))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def test_grade_file_takes_strings_and_gives_the_clis_records(tmp_path, fake_model):
    model = fake_model
    result = grader.grade_file(str(EXAMPLES / "qa.jsonl"), "out.jsonl", model=str(model),
                               format="seed", limit=3)
    lines = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [record.to_dict() for record in result.records] == lines
    assert isinstance(result.summary, grader.Summary) and result.summary.rows == 3
    # the CLI's default backend (GRADER_BACKEND, set by conftest, else auto), not run_grade's
    assert result.summary.manifest.backend == "transformers"
    # the summary file's JSON object, and the dict-era reading of it
    written = json.loads((tmp_path / "out.summary.json").read_text())
    assert result.summary.to_dict() == written and result.summary["run"] == written["run"]


def test_a_refusal_names_the_keyword_a_python_caller_passes(tmp_path, fake_model):
    model = fake_model
    notes = tmp_path / "notes.jsonl"
    notes.write_text("my own notes\nnot grader's\n")
    with pytest.raises(grader.GraderError) as refused:
        grader.grade_file(str(EXAMPLES / "qa.jsonl"), notes, model=str(model), limit=2)
    assert "overwrite=True" in str(refused.value) and "--overwrite" not in str(refused.value)
    assert "another output" in str(refused.value) and " -o" not in str(refused.value)
    assert notes.read_text() == "my own notes\nnot grader's\n"
    # the command line says it in its own words
    result = CliRunner().invoke(cli.main, ["grade", str(EXAMPLES / "qa.jsonl"), "-o", str(notes),
                                           "-m", str(model), "--limit", "2"])
    assert result.exit_code != 0 and "--overwrite" in result.output


def test_a_grader_loads_its_model_once(tmp_path, fake_backend_factory, monkeypatch):
    from tests.answers import answer

    fake_backend_factory.default = answer()
    loads = []

    def factory(name, **options):
        loads.append(name)
        return fake_backend_factory(name, **options)

    from grader.run import grading

    made = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor", lambda *a: made(*a, backend_factory=factory))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    rows = [{"id": str(i), "input": "q", "reference": "r", "output_text": f"a{i}"} for i in range(3)]
    with grader.Grader(str(model), format="seed") as judge:
        first = judge.grade(rows)
        second = judge.grade(rows[:2])
        assert judge.grade([]) == []
    assert [r.id for r in first] == ["0", "1", "2"]
    assert [r.id for r in second] == ["0", "1"]
    assert loads == ["transformers"]


def test_a_grader_drafts_each_rubric_once_for_every_model_it_grades(tmp_path,
                                                                     fake_backend_factory,
                                                                     monkeypatch):
    """Ten models' answers to one benchmark, one grade() each: one rubric per reference, the
    same items (and denominators) for every model; save_rubric keeps it for --rubric."""
    from grader.io.rubric_file import read_rubric_file
    from grader.run import grading

    made = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor",
                        lambda *a: made(*a, backend_factory=fake_backend_factory))
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")

    def rows(name, questions):
        return [{"id": f"{name}-{q}", "input": f"question {q}", "reference": f"reference {q}",
                 "output_text": f"{name}'s answer to {q}"} for q in questions]

    with grader.Grader(str(model)) as judge:
        with pytest.raises(grader.GraderError, match="no rubric yet"):
            judge.save_rubric(tmp_path / "early.jsonl")
        first = judge.grade(rows("model-a", [1, 2]))
        second = judge.grade(rows("model-b", [1, 2, 3]))
        saved = judge.save_rubric(tmp_path / "rubric.jsonl")
    backend = fake_backend_factory.backend
    # the second call drafted only question 3's rubric
    drafted = [[c[-1]["content"] for c in call] for call in backend.rubric_calls]
    assert [len(call) for call in drafted] == [2, 1]
    assert "reference 3" in drafted[1][0]
    assert [r.rubric["key"] for r in first] == [r.rubric["key"] for r in second[:2]]
    assert [r.rubric["source"] for r in second] == ["model"] * 3
    assert set(read_rubric_file(saved)) == {r.rubric["key"] for r in second}
    assert not list(scratch.iterdir())  # the drafts go with the Grader


@pytest.mark.parametrize(("settings", "message"), [
    ({"temprature": 0.5}, "unknown setting temprature"),
    ({"format": "seed", "evidence": True}, "--evidence is for --format rubric"),
    ({"format": "bogus"}, "unknown format 'bogus'"),
    ({"temperature": -1}, "--temperature"),
    ({"truncate": "all"}, "truncate: 'all'"),
])
def test_a_bad_setting_is_one_grader_error(tmp_path, settings, message):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with pytest.raises(grader.GraderError, match=re.escape(message)) as raised:
        grader.Grader(str(model), **settings)
    assert raised.value.exit_code == 2
    assert isinstance(raised.value, (OptionError, grader.GraderError))


def test_a_row_that_is_no_json_is_a_grader_error(tmp_path, fake_backend_factory):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with grader.Grader(str(model)) as judge, pytest.raises(grader.GraderError, match="rows:1"):
        judge.grade([{"input": object()}])
    assert Path(tmp_path).is_dir()
