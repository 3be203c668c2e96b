"""One policy for every file grader writes (issue 38 items 1-4, 12; grader.io.outputs).

Every command that writes a file is walked through the CLI with a fake engine: a file that is
not grader's own of its kind, at the output or at any side-file name, stops the command before
any model work unless --overwrite; a file the command reads is never written, with or without
--overwrite, and the refusal does not offer --overwrite. The walk starts from the commands'
own Click options: a new command or a new path option is unknown to the tables here and fails
the first test until it is classified, so it cannot forget the policy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from conftest import FakeBackend

import grader
from grader.cli import main
from grader.errors import EXIT_BAD_INPUT, GraderError
from grader.io.outputs import Kind, Planned, check_outputs, is_own

FOREIGN = b"my own notes, not grader's\n"

# Every command's options that name a file it writes, and the files written beside each
# ("{}" is the option's file name without .jsonl). The policy test below puts a foreign file
# at each in turn.
WRITES: dict[tuple[str, str], tuple[str, ...]] = {
    ("grade", "output"): ("{}.jsonl", "{}.summary.json", "{}.controls.jsonl", "{}.jsonl.partial",
                          "{}.jsonl.partial.json", "{}.rubric.jsonl", "{}.controls.jsonl.partial"),
    ("audit", "output"): ("{}.jsonl", "{}.summary.json", "{}.audit.json", "{}.audit-rows.jsonl",
                          "{}.jsonl.partial", "{}.rubric.jsonl"),
    ("rescore", "output"): ("{}.jsonl", "{}.summary.json"),
    ("rubric", "output"): ("{}.jsonl",),
    ("report", "output"): ("{}.jsonl",),
    ("rank", "html"): ("{}.jsonl",),
}
# Written through the same policy but tested where the command's inputs are made: a page
# served until stopped (no CliRunner run here), and a scored inspect_ai log.
SERVED: dict[tuple[str, str], str] = {
    ("label", "output"): "tests/test_label.py::test_another_file_at_output_is_refused_unless_overwrite",
    ("grade", "write_inspect"): "tests/test_inspect_scorer.py::test_write_inspect_refuses_a_file_already_there",
    ("batch export", "output"): "tests/test_batch.py::test_export_and_import_keep_files_not_graders_own",
    ("batch import", "output"): "tests/test_batch.py::test_export_and_import_keep_files_not_graders_own",
}
# Every command's options (and arguments) that name a file it reads.
READS: dict[str, tuple[str, ...]] = {
    "grade": ("data", "pair", "rubric", "grader_config", "config_file", "prompt"),
    "audit": ("data", "rubric", "config_file", "prompt"),
    "rescore": ("results", "grader_config"),
    "rubric": ("data", "config_file"),
    "report": ("results", "data", "audit_file"),
    "rank": ("results", "data"),
    "render": ("data", "grader_config", "prompt"),
    "agree": ("results", "data"),
    "compare": ("a", "b", "data"),
    "label": ("results", "data"),
    "batch export": ("data", "answers", "rubric", "grader_config", "config_file", "prompt"),
    "batch import": ("answers", "requests_file"),
}


def _path_options(command: click.Command) -> set[str]:
    """The options and arguments of ``command`` that name a file (a click.Path, or a
    DATA-like string)."""
    return {p.name for p in command.params if p.name and (
        isinstance(p.type, click.Path) or p.name in ("data", "prompt"))}


def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every command by its full name ("batch export"), the groups' subcommands too."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found |= _commands(command, f"{prefix}{name} ")
        else:
            found[prefix + name] = command
    return found


def test_every_path_option_of_every_command_is_classified_as_read_or_written():
    assert "batch export" in _commands(main)
    for name, command in _commands(main).items():
        options = _path_options(command)
        written = {option for (cmd, option) in [*WRITES, *SERVED] if cmd == name}
        known = written | set(READS.get(name, ()))
        assert options == known, (
            f"grader {name}: options {sorted(options - known)} name files and are in neither "
            "WRITES nor READS here: a file it writes must go through grader.io.outputs")


# --- the walk ----------------------------------------------------------------------------------

def _rows() -> list[dict]:
    return [{"id": f"r{i}-{j}", "input": f"question {i}",
             "reference": f"Paris is the capital of France, on the Seine ({i}).",
             "output_text": f"reply {i}-{j}"} for i in range(3) for j in range(2)]


class Engine:
    def __init__(self) -> None:
        self.backends: list[FakeBackend] = []

    def __call__(self, name: str, **options: Any) -> FakeBackend:
        backend = FakeBackend(chunk_size=4)
        self.backends.append(backend)
        return backend


@pytest.fixture
def engine(monkeypatch) -> Engine:
    fake = Engine()
    monkeypatch.setattr("grader.backends.load_backend", fake)
    return fake


def _run(*args: Any):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="grader")


@pytest.fixture
def made(tmp_path, engine, model) -> dict[str, Path]:
    """A data file, and two finished results files of it (graded before the test looks)."""
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    graded = {}
    for name in ("a", "b"):
        out = tmp_path / "done" / f"{name}.jsonl"
        result = _run("grade", data, "-m", model, "-o", out, "--backend", "transformers",
                      "--format", "seed", "--controls", 0)
        assert result.exit_code == 0, result.output
        graded[name] = out
    engine.backends.clear()
    return {"data": data, "model": model, **graded}


def _command(command: str, option: str, target: Path, made: dict[str, Path]) -> list[Any]:
    """``grader COMMAND`` writing ``target`` through ``option``."""
    data, model, a, b = made["data"], made["model"], made["a"], made["b"]
    engine_args = ["-m", model, "--backend", "transformers"]
    return {
        "grade": ["grade", data, *engine_args, "-o", target, "--controls", 3],
        "audit": ["audit", data, *engine_args, "-o", target, "--rows", 2],
        "rescore": ["rescore", a, "-o", target],
        "rubric": ["rubric", data, *engine_args, "-o", target],
        "report": ["report", a, "-o", target],
        "rank": ["rank", a, b, "--rounds", 0, "--html", target],
    }[command]


@pytest.mark.parametrize(("command", "option", "side"), [
    (command, option, side) for (command, option), sides in WRITES.items() for side in sides])
def test_a_file_not_graders_own_at_any_output_or_side_file_stops_before_any_model_work(
        tmp_path, engine, made, command, option, side):
    output = tmp_path / "out" / "new.jsonl"
    output.parent.mkdir()
    foreign = output.with_name(side.format("new"))
    foreign.write_bytes(FOREIGN)
    result = _run(*_command(command, option, output, made))
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert str(foreign) in result.output and "--overwrite" in result.output, result.output
    assert foreign.read_bytes() == FOREIGN
    assert engine.backends == []
    assert sorted(p.name for p in output.parent.iterdir()) == [foreign.name]  # nothing written


@pytest.mark.parametrize(("command", "option"), list(WRITES))
def test_overwrite_replaces_a_file_that_is_not_graders_own(tmp_path, engine, made, command, option):
    output = tmp_path / "new.jsonl"
    output.write_bytes(FOREIGN)
    result = _run(*_command(command, option, output, made), "--overwrite")
    assert result.exit_code == 0, result.output
    assert output.read_bytes() != FOREIGN
    # grader's own file again: no --overwrite needed to write it once more
    assert _run(*_command(command, option, output, made)).exit_code == 0


def _reading(command: str, read: str, made: dict[str, Path], tmp_path: Path) -> tuple[list[Any], Path]:
    """``grader COMMAND`` whose output is a file it reads (``read``): the command and the file."""
    data, model, a, b = made["data"], made["model"], made["a"], made["b"]
    engine_args = ["-m", model, "--backend", "transformers"]
    summary = a.with_name("a.summary.json")
    if command == "grade" and read == "pair":
        return ["grade", "--pair", a_copy(a, tmp_path), b_copy(b, tmp_path), *engine_args,
                "-o", tmp_path / "pa.jsonl"], tmp_path / "pa.jsonl"
    if command == "grade" and read == "rubric":
        rubric = tmp_path / "mine.rubric.jsonl"
        rubric.write_text("")
        return ["grade", data, *engine_args, "-o", rubric, "--rubric", rubric], rubric
    return {
        ("grade", "data"): (["grade", data, *engine_args, "-o", data], data),
        ("audit", "data"): (["audit", data, *engine_args, "-o", data], data),
        ("rescore", "summary"): (["rescore", a, "-o", summary], summary),
        ("rubric", "data"): (["rubric", data, *engine_args, "-o", data], data),
        ("report", "results"): (["report", a, "-o", a], a),
        ("report", "summary"): (["report", a, "-o", summary], summary),
        ("report", "data"): (["report", a, "--data", data, "-o", data], data),
        ("rank", "results"): (["rank", a, b, "--rounds", 0, "--html", b], b),
        ("rank", "summary"): (["rank", a, b, "--rounds", 0, "--html", summary], summary),
    }[(command, read)]


def a_copy(a: Path, tmp_path: Path) -> Path:
    return _answers(tmp_path / "pa.jsonl", "A")


def b_copy(b: Path, tmp_path: Path) -> Path:
    return _answers(tmp_path / "pb.jsonl", "B")


def _answers(path: Path, who: str) -> Path:
    path.write_text("".join(json.dumps(r | {"output_text": f"{who} {r['id']}"}) + "\n"
                            for r in _rows()))
    return path


@pytest.mark.parametrize(("command", "read"), [
    ("grade", "data"), ("grade", "pair"), ("grade", "rubric"), ("audit", "data"),
    ("rescore", "summary"), ("rubric", "data"), ("report", "results"), ("report", "summary"),
    ("report", "data"), ("rank", "results"), ("rank", "summary")])
def test_a_file_the_command_reads_is_never_written_even_with_overwrite(
        tmp_path, engine, made, command, read):
    args, target = _reading(command, read, made, tmp_path)
    before = target.read_bytes()
    for extra in ([], ["--overwrite"]):
        result = _run(*args, *extra)
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert "which this command reads" in result.output, result.output
        assert "use --overwrite" not in result.output  # it cannot help
        assert target.read_bytes() == before
    assert engine.backends == []


@pytest.mark.parametrize("command", ["grade", "audit", "rubric"])
def test_the_settings_file_is_never_the_output(tmp_path, engine, made, command):
    settings = tmp_path / "settings.toml"
    settings.write_text("[sampling]\ntemperature = 0\n")
    before = settings.read_bytes()
    result = _run(command, made["data"], "-m", made["model"], "--backend", "transformers",
                  "--config", settings, "-o", settings, "--overwrite")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "which this command reads" in result.output
    assert settings.read_bytes() == before and engine.backends == []


@pytest.mark.parametrize("side", ["new.pairs.jsonl", "new.summary.json"])
def test_grade_pair_refuses_a_foreign_file_beside_its_output(tmp_path, engine, made, side):
    foreign = tmp_path / side
    foreign.write_bytes(FOREIGN)
    result = _run("grade", "--pair", a_copy(made["a"], tmp_path), b_copy(made["b"], tmp_path),
                  "-m", made["model"], "--backend", "transformers", "-o", tmp_path / "new.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert str(foreign) in result.output and "--overwrite" in result.output
    assert foreign.read_bytes() == FOREIGN and engine.backends == []


@pytest.mark.parametrize("side", ["new.judge-2.jsonl", "new.judge-1.summary.json", "new.summary.json"])
def test_a_judge_panel_refuses_a_foreign_file_at_any_judges_output_before_the_first_loads(
        tmp_path, engine, made, side):
    other = tmp_path / "model2"
    other.mkdir()
    (other / "config.json").write_text("{}")
    foreign = tmp_path / side
    foreign.write_bytes(FOREIGN)
    result = _run("grade", made["data"], "-m", made["model"], "-m", other, "--backend",
                  "transformers", "-o", tmp_path / "new.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert str(foreign) in result.output and "--overwrite" in result.output
    assert foreign.read_bytes() == FOREIGN and engine.backends == []


def test_rescore_in_place_is_still_allowed(made):
    a = made["a"]
    assert _run("rescore", a, "-o", a).exit_code == 0


# --- item 12: the API refuses a directory before loading the model ------------------------------

def test_grade_file_to_a_directory_refuses_before_loading_the_model(tmp_path, engine, made):
    directory = tmp_path / "results_dir"
    directory.mkdir()
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(GraderError, match="is a directory") as raised:
        grader.grade_file(made["data"], directory, str(made["model"]), backend="transformers")
    assert raised.value.exit_code == EXIT_BAD_INPUT
    assert engine.backends == []
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing left beside it
    assert list(directory.iterdir()) == []


# --- the module itself ---------------------------------------------------------------------------

def _written(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    return path


def test_each_kind_knows_its_own_file_and_refuses_another(tmp_path):
    own = {
        Kind.RESULTS: '{"id": "q1", "status": "ok"}\n',
        Kind.SUMMARY: '{"rows": 1, "statuses": {"ok": 1}, "run": {}}\n',
        Kind.LOG: '{"id": "q1", "status": "ok"}\n{"id": "q2", "sta',
        Kind.LOG_OWNER: '{"format": "seed"}\n',
        Kind.CONTROLS: '{"id": "q1#control:reference", "status": "ok"}\n',
        Kind.RUBRIC: '{"key": "k", "input": "i", "reference": "r", "facts": []}\n',
        Kind.AUDIT: '{"kinds": [], "original": {"mean_score": 3}}\n',
        Kind.AUDIT_ROWS: '{"id": "q1#audit:original", "reference": "r"}\n',
        Kind.PAIRS: '{"id": "q1", "output_a": "x", "output_b": "y"}\n',
        Kind.REPORT: "<!DOCTYPE html>\n<html><head><title>grader report: r.jsonl</title>",
        Kind.RANK_PAGE: "<!DOCTYPE html>\n<html><head><title>grader rank</title>",
        Kind.LABELS: '{"grader_labels": 1, "results": "r.jsonl"}\n{"id": "q1"}\n',
        Kind.STAGE: '{"key": "k", "hint": "h"}\n',
        Kind.BATCH_REQUESTS: '{"custom_id": "grader-0123-abcd", "method": "POST"}\n',
        Kind.BATCH_MANIFEST: '{"grader_batch": 1, "export": "e"}\n',
    }
    # an inspect_ai log is not told apart from another's: every file there is someone's
    assert not is_own(_written(tmp_path / "log.eval", b"PK\x03\x04..."), Kind.SCORED_LOG)
    assert is_own(_written(tmp_path / "empty.eval", b""), Kind.SCORED_LOG)
    assert set(own) | {Kind.SCORED_LOG} == set(Kind)
    for kind, text in own.items():
        path = tmp_path / f"{kind.name}.file"
        path.write_text(text)
        assert is_own(path, kind), kind
        check_outputs([Planned(path, kind)])
        path.write_bytes(FOREIGN + b"second line\n")
        assert not is_own(path, kind), kind
        with pytest.raises(GraderError, match="use --overwrite"):
            check_outputs([Planned(path, kind)])
        check_outputs([Planned(path, kind)], overwrite=True)
        path.write_text("")  # nothing to lose
        assert is_own(path, kind)


def test_save_rubric_refuses_a_file_that_is_not_a_rubric_file(tmp_path, engine, made):
    rows = [{"id": r["id"], "input": r["input"], "reference": r["reference"],
             "output_text": r["output_text"]} for r in _rows()]
    foreign = tmp_path / "notes.jsonl"
    foreign.write_bytes(FOREIGN)
    with grader.Grader(str(made["model"]), backend="transformers", controls=0) as judge:
        judge.grade(rows)
        with pytest.raises(GraderError, match="not a grader rubric file"):
            judge.save_rubric(foreign)
        assert foreign.read_bytes() == FOREIGN
        saved = judge.save_rubric(foreign, overwrite=True)
        assert saved.read_bytes() != FOREIGN
        judge.save_rubric(saved)  # grader's own rubric file: written again


def test_overwrite_without_controls_removes_only_graders_own_controls_file(tmp_path, engine, made):
    out = tmp_path / "r.jsonl"
    foreign = tmp_path / "r.controls.jsonl"
    foreign.write_bytes(FOREIGN)
    args = ["grade", made["data"], "-m", made["model"], "--backend", "transformers", "-o", out,
            "--controls", 0, "--overwrite"]
    assert _run(*args).exit_code == 0
    assert foreign.read_bytes() == FOREIGN  # not written by this run, not grader's to remove
