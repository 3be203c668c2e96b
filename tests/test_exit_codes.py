"""Every way a command stops is one line and a documented exit code (grader/errors.py):
an internal error is not --fail-on's 1, Ctrl-C is 130 and SIGTERM 143, never click's
"Aborted!"; SIGTERM saves the chunk in flight like the first Ctrl-C and leaves no stdin copy."""

from __future__ import annotations

import json
import os
import signal
import tempfile
from pathlib import Path

import pytest
from answers import answer
from click.testing import CliRunner
from conftest import FakeBackend, make_request

from grader.cli import main
from grader.errors import (
    EXIT_BAD_INPUT,
    EXIT_BUSY,
    EXIT_ENGINE,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OUTPUT,
    EXIT_TERMINATED,
    GraderError,
)
from grader.run.grading import run_grade
from grader.run.request import Interrupted


def _data(tmp_path: Path, n: int = 6, **fields) -> Path:
    path = tmp_path / "data.jsonl"
    rows = [{"id": f"r{i}", "reference": f"ref {i}", "output_text": f"out {i}", **fields}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _signal(signum: int):
    def reply() -> str:
        os.kill(os.getpid(), signum)  # its handler runs before os.kill returns
        return answer()

    return reply


def test_every_error_type_is_a_grader_error_with_its_code():
    from grader.analysis.agreement import AgreementError
    from grader.analysis.report import ReportError
    from grader.backends import EngineSettingsError, EngineUnavailable
    from grader.backends.chat import ModelError
    from grader.config import SettingsError
    from grader.io.dataset import DatasetError, MappingError
    from grader.io.lock import OutputBusy
    from grader.io.results import SummaryError
    from grader.judge.prompts import PromptError
    from grader.judge.score_model import GraderConfigError
    from grader.records import ResultsError
    from grader.run.data_parallel import DataParallelError
    from grader.run.owner import ResultsOwned
    from grader.run.ray_cluster import RayError

    codes = {
        DatasetError: EXIT_BAD_INPUT, SettingsError: EXIT_BAD_INPUT, PromptError: EXIT_BAD_INPUT,
        ModelError: EXIT_BAD_INPUT, GraderConfigError: EXIT_BAD_INPUT,
        EngineSettingsError: EXIT_BAD_INPUT, ResultsError: EXIT_BAD_INPUT,
        SummaryError: EXIT_BAD_INPUT, AgreementError: EXIT_BAD_INPUT,
        ReportError: EXIT_BAD_INPUT, MappingError: EXIT_BAD_INPUT,
        ResultsOwned: EXIT_BAD_INPUT, OutputBusy: EXIT_BUSY, EngineUnavailable: EXIT_ENGINE,
        RayError: EXIT_ENGINE, DataParallelError: EXIT_ENGINE, Interrupted: EXIT_INTERRUPTED,
    }
    for kind, code in codes.items():
        assert issubclass(kind, GraderError) and kind.exit_code == code, kind
    # the codes the README documents, each once
    assert len({EXIT_BAD_INPUT, EXIT_ENGINE, EXIT_INTERNAL, EXIT_OUTPUT, EXIT_BUSY,
                EXIT_INTERRUPTED, EXIT_TERMINATED, 1}) == 8


@pytest.mark.parametrize("command", ["agree", "compare", "report"])
def test_a_plain_value_error_in_the_analysis_is_a_bug_not_bad_input(tmp_path, monkeypatch,
                                                                    command):
    """What agree, compare and report refuse is a typed GraderError; any other ValueError is
    grader's own mistake, reported as one (70)."""
    import grader.analysis.agreement
    import grader.analysis.compare
    import grader.analysis.report

    def broken(*args, **kwargs):
        raise ValueError("not the user's input")

    monkeypatch.setattr(grader.analysis.agreement, "agreement", broken)
    monkeypatch.setattr(grader.analysis.compare, "compare", broken)
    monkeypatch.setattr(grader.analysis.report, "write_report", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the traceback's file
    monkeypatch.delenv("GRADER_DEBUG", raising=False)
    results = tmp_path / "r.jsonl"
    results.write_text('{"id": 1, "status": "ok", "score": 3}\n')
    args = {"agree": ["agree", str(results), "--human", "h"],
            "compare": ["compare", str(results), str(results)],
            "report": ["report", str(results), "-o", str(tmp_path / "r.html")]}[command]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == EXIT_INTERNAL, result.output
    assert result.output.startswith("error: internal error (a bug in grader, please report it): "
                                    "ValueError: not the user's input")


def test_an_internal_error_is_one_line_exit_70_and_its_traceback_is_saved(
    tmp_path, model, monkeypatch
):
    def broken(*args, **kwargs):
        raise RuntimeError("an unexpected\nstate")

    monkeypatch.setattr("grader.run.grading.run_grade", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("GRADER_DEBUG", raising=False)
    args = ["grade", str(_data(tmp_path)), "--model", str(model), "-o", "out.jsonl",
            "--backend", "transformers"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == EXIT_INTERNAL, result.output
    (line,) = result.output.splitlines()
    assert line.startswith("error: internal error (a bug in grader, please report it): "
                           "RuntimeError: an unexpected state (the traceback is saved in ")
    (saved,) = tmp_path.glob("grader-traceback-*.txt")
    assert str(saved) in line and "raise RuntimeError" in saved.read_text()
    monkeypatch.setenv("GRADER_DEBUG", "1")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == EXIT_INTERNAL and "Traceback (most recent call last)" in result.output


def test_ctrl_c_before_grading_starts_exits_130_not_aborted(tmp_path, model, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("grader.backends.load_backend", interrupted)  # while the model loads
    args = ["grade", str(_data(tmp_path)), "--model", str(model), "-o", "out.jsonl",
            "--backend", "transformers", "--format", "seed"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    assert result.output.splitlines()[-1] == "error: interrupted: nothing was graded"
    assert "Aborted" not in result.output
    # a command other than grade
    monkeypatch.setattr("grader.analysis.compare.compare", interrupted)
    Path("a.jsonl").write_text('{"id": 1, "status": "ok", "score": 3}\n')
    result = CliRunner().invoke(main, ["compare", "a.jsonl", "a.jsonl"])
    assert (result.exit_code, result.output) == (EXIT_INTERRUPTED, "error: interrupted\n")


def test_sigterm_saves_the_chunk_prints_the_resume_line_and_exits_143(tmp_path, model, monkeypatch):
    created = []

    def factory(name, **options):
        created.append(FakeBackend([answer(), _signal(signal.SIGTERM)], default=answer()))
        return created[-1]

    monkeypatch.setattr("grader.backends.load_backend", factory)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the stdin copy goes
    data = _data(tmp_path, 10)
    args = ["grade", "-", "--model", str(model), "-o", "out.jsonl", "--backend", "transformers",
            "--format", "seed", "--chunk-size", "4"]
    result = CliRunner().invoke(main, args, input=data.read_text(), prog_name="grader")
    assert result.exit_code == EXIT_TERMINATED, result.output
    assert "SIGTERM: finishing the current chunk" in result.output
    assert result.output.splitlines()[-1] == (
        f"error: stopped by SIGTERM: 4 of 10 rows are graded and saved in out.jsonl.partial; "
        f"to resume: grader grade - --model {model} -o out.jsonl --backend transformers --format "
        "seed --chunk-size 4 (with the same data on stdin)"
    )
    assert len(Path("out.jsonl.partial").read_text().splitlines()) == 4
    assert not list(tmp_path.glob("grader-stdin-*"))  # the copy of stdin is removed
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handed back


def test_a_ctrl_c_with_no_engine_work_stops_the_run(tmp_path, fake_backend_factory, monkeypatch):
    import grader.run.grading as grading

    # every row lacks its answer: none goes to an engine, each is written as it is read
    data = _data(tmp_path, 8, output_text="")
    written = []
    write = grading._Places.write

    def write_then_ctrl_c(places, records):
        write(places, records)
        written.append(len(records))
        if len(written) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(grading._Places, "write", write_then_ctrl_c)
    request, job = make_request(data, tmp_path / "out.jsonl", chunk_size=2)
    with pytest.raises(Interrupted) as stopped:
        run_grade(request, job, backend_factory=fake_backend_factory)
    assert (stopped.value.done, stopped.value.total) == (2, 8)
    assert fake_backend_factory.backend is None and not job.output.exists()


def test_an_output_problem_in_another_command_is_one_line(tmp_path):
    Path("r.jsonl").write_text('{"id": 1, "status": "ok", "score": 3, "raw_output": null}\n')
    Path("file").write_text("")
    for args in (["report", "r.jsonl", "-o", "file/report.html"],
                 ["rescore", "r.jsonl", "-o", "file/rescored.jsonl"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == EXIT_OUTPUT, result.output
        assert result.output.startswith("error: cannot write file/") and len(result.output.splitlines()) == 1
