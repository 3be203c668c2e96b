"""Ctrl-C during a local run, with a fake backend: the first finishes the chunk in flight and
says how to resume, a second stops at once; the rerun grades only the rows left.

(tests/test_resume.py does the first with the tiny model in a real process; the same for
--data-parallel is in tests/test_data_parallel.py.)
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from conftest import check_answer, make_request

from grader.io.results import read_records
from grader.run.grading import run_grade
from grader.run.request import FileJob, GradeRequest, Interrupted


def _ctrl_c() -> str:
    """A reply that presses Ctrl-C while its chunk is being graded (the signal's handler runs
    before os.kill returns: it is sent to this process)."""
    os.kill(os.getpid(), signal.SIGINT)
    return check_answer()


def _request(tmp_path: Path, rows: int = 10) -> tuple[GradeRequest, FileJob]:
    data = tmp_path / "data.jsonl"
    # one reference: one rubric, so the check pass sends (and saves) the rows in input order
    data.write_text("".join(
        json.dumps({"id": f"r{i}", "reference": "ref", "output_text": f"out {i}"}) + "\n"
        for i in range(rows)
    ))
    return make_request(data, chunk_size=4)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_first_ctrl_c_finishes_the_chunk_then_a_rerun_resumes(
    tmp_path, fake_backend_factory, caplog
):
    request, job = _request(tmp_path)
    fake_backend_factory.replies = [check_answer(), _ctrl_c]  # during the first chunk's second row
    with pytest.raises(Interrupted) as stopped:
        run_grade(request, job, backend_factory=fake_backend_factory)
    assert "finishing the current chunk" in caplog.text  # logged: the CLI prints it
    assert str(stopped.value) == (
        f"interrupted: 4 of 10 rows are graded and saved in {stopped.value.partial}; "
        "run the same command again to resume"
    )
    # exactly the chunk in flight, whole, and no results file yet
    assert [r["id"] for r in _lines(stopped.value.partial)] == ["r0", "r1", "r2", "r3"]
    assert {r["status"] for r in _lines(stopped.value.partial)} == {"ok"}
    assert len(fake_backend_factory.backend.calls) == 1
    assert not job.output.exists()

    fake_backend_factory.replies = []
    summary = run_grade(request, job, backend_factory=fake_backend_factory)
    assert summary["run"]["resumed_rows"] == 4
    sent = [c for call in fake_backend_factory.backend.calls for c in call]
    assert len(sent) == 6  # only the rows left
    assert [r.id for _, r in read_records(job.output)] == [f"r{i}" for i in range(10)]
    assert not stopped.value.partial.exists()


def test_a_second_ctrl_c_stops_at_once(tmp_path, fake_backend_factory):
    request, job = _request(tmp_path)

    def twice() -> str:
        _ctrl_c()
        return _ctrl_c()

    fake_backend_factory.replies = [check_answer()] * 4 + [twice]  # in the second chunk
    with pytest.raises(KeyboardInterrupt):
        run_grade(request, job, backend_factory=fake_backend_factory)
    # the first chunk is saved; the one the Ctrl-C cut is not, half or whole
    partial = job.output.with_name(job.output.name + ".partial")
    assert [r["id"] for r in _lines(partial)] == ["r0", "r1", "r2", "r3"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back
