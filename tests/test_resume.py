"""Crash-safe resume: what is reused, what is re-graded, and SIGKILL / Ctrl-C mid-run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXAMPLES, FakeBackend, make_request

from grader.io.results import read_records
from grader.run.grading import run_grade


def _rows(n: int) -> list[dict]:
    return [
        {"id": f"r{i}", "input": f"q{i}", "reference": f"ref {i}", "output_text": f"out {i}"}
        for i in range(n)
    ]


def _data(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _records(path: Path) -> list[dict]:
    return [r for _, r in read_records(path)]


class Factory:
    """One fake judge per run, in chunks of 2; ``sent``: the rows of each judged call."""

    def __init__(self, replies=()):
        self.backend = FakeBackend(replies, chunk_size=2)
        self.built = 0  # how many times a run asked for a backend (a model load)

    def __call__(self, name, **options):
        self.built += 1
        return self.backend

    @property
    def sent(self) -> list[int]:
        return [len(call) for call in self.backend.calls]


def test_rerunning_a_finished_job_reuses_every_record_and_loads_no_model(tmp_path):
    data, out = _data(tmp_path, _rows(5)), tmp_path / "r.jsonl"
    first = Factory()
    graded = run_grade(*make_request(data, out), backend_factory=first)
    before = out.read_bytes()
    again = Factory()
    summary = run_grade(*make_request(data, out), backend_factory=again)
    assert again.built == 0 and again.sent == [] and out.read_bytes() == before
    assert summary["run"]["resumed_rows"] == 5
    # no engine ran, so the manifest keeps the one that graded the rows
    assert summary["run"]["engine"] == graded["run"]["engine"] == {"backend": "fake"}


def test_a_changed_prompt_or_sampling_stops_and_overwrite_starts_over(tmp_path):
    from grader.config import SamplingConfig
    from grader.run.owner import ResultsOwned

    data, out = _data(tmp_path, _rows(3)), tmp_path / "r.jsonl"
    run_grade(*make_request(data, out, format="seed"), backend_factory=Factory())
    before = out.read_bytes()
    for changed, named in (
        ({"prompt": "seed-verbatim"}, "the prompt seed (sha256"),
        ({"checklist": False}, "checklist=true; this run has checklist=false"),
        ({"sampling": SamplingConfig(seed=1)}, "seed=0; this run has seed=1"),
        ({"limit": 2}, "no --limit; this run has --limit 2"),
    ):
        factory = Factory()
        with pytest.raises(ResultsOwned) as refused:
            run_grade(*make_request(data, out, **changed, format="seed"),
                      backend_factory=factory)
        assert named in str(refused.value) and "--overwrite" in str(refused.value)
        assert factory.sent == [] and out.read_bytes() == before, changed
    factory = Factory()
    request, job = make_request(data, out, sampling=SamplingConfig(seed=1), format="seed",
                           overwrite=True)
    run_grade(request, job, backend_factory=factory)
    assert sum(factory.sent) == 3

    # one changed row (the same ids) re-grades that row only
    rows = _rows(3)
    rows[1]["output_text"] = "a different answer"
    factory = Factory()
    request, job = make_request(_data(tmp_path, rows), out, sampling=SamplingConfig(seed=1),
                           format="seed")
    run_grade(request, job, backend_factory=factory)
    assert factory.sent == [1]


def test_engine_errors_are_retried_on_resume_and_other_failures_are_not(tmp_path):
    data, out = _data(tmp_path, _rows(4)), tmp_path / "r.jsonl"
    flaky = Factory([RuntimeError("CUDA out of memory"), "not json", "not json"])

    run_grade(*make_request(data, out), backend_factory=flaky)
    assert [r.status for r in _records(out)] == ["engine_error"] * 2 + ["parse_error"] * 2
    factory = Factory()
    run_grade(*make_request(data, out), backend_factory=factory)
    assert factory.sent == [2]  # only the engine errors went back to the judge
    assert [r.status for r in _records(out)] == ["ok", "ok", "parse_error", "parse_error"]


def test_a_torn_last_line_is_dropped_and_the_rest_resumed(tmp_path):
    data, out = _data(tmp_path, _rows(6)), tmp_path / "r.jsonl"
    run_grade(*make_request(data, out), backend_factory=Factory())
    full = _records(out)
    # what a SIGKILL in the middle of the fourth write leaves behind
    lines = out.read_text().splitlines(keepends=True)
    partial = out.with_name(out.name + ".partial")
    partial.write_text("".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    out.unlink()
    factory = Factory()
    run_grade(*make_request(data, out), backend_factory=factory)
    assert sum(factory.sent) == 3
    resumed = _records(out)
    assert [r.id for r in resumed] == [r.id for r in full]
    assert resumed[:3] == full[:3]
    assert not partial.exists()


def test_rows_with_the_same_text_keep_their_own_ids(tmp_path):
    rows = _rows(2)
    rows[1] |= {k: rows[0][k] for k in ("input", "reference", "output_text")}
    data, out = _data(tmp_path, rows), tmp_path / "r.jsonl"
    run_grade(*make_request(data, out), backend_factory=Factory())
    run_grade(*make_request(data, out), backend_factory=Factory())
    assert [r.id for r in _records(out)] == ["r0", "r1"]


# --- real processes, the tiny model ------------------------------------------------------------


def _grade_command(model: Path, out: Path) -> list[str]:
    return [
        sys.executable, "-m", "grader", "grade", str(EXAMPLES / "qa.jsonl"), "--model", str(model),
        "-o", str(out), "--format", "seed", "--no-checklist", "--batch-size", "2", "--controls", "0",
    ]


def _lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def _start(command: list[str]) -> subprocess.Popen:
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_for_lines(path: Path, count: int, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while _lines(path) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run wrote nothing in time"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model, tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("baseline") / "results.jsonl"
    subprocess.run(_grade_command(tiny_model, out), check=True, capture_output=True, timeout=600)
    return _records(out)


# One kill point (each costs two process starts): after an odd number of lines, 5, i.e. inside
# the third block of 2 rows, then 0.29 s more, so the kill most likely lands while a block is
# half written, the case where resume must drop a torn or partial block and regrade it.
KILL_AFTER_LINES, KILL_DELAY_S = 5, 0.29


@pytest.mark.slow
def test_sigkill_in_the_middle_of_a_block_then_resume_equals_an_uninterrupted_run(
    tiny_model, tmp_path, uninterrupted
):
    out = tmp_path / "results.jsonl"
    partial = out.with_name(out.name + ".partial")
    # blocks of 2 rows (the batch size) are written as they are graded
    process = _start(_grade_command(tiny_model, out))
    _wait_for_lines(partial, KILL_AFTER_LINES, process)
    time.sleep(KILL_DELAY_S)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)
    assert not out.exists()
    assert out.with_name(out.name + ".lock").exists()  # left behind; the kernel dropped the lock
    saved = _lines(partial)
    assert 0 < saved < 24

    resumed = subprocess.run(_grade_command(tiny_model, out), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _records(out) == uninterrupted
    summary = json.loads((tmp_path / "results.summary.json").read_text())
    assert summary["run"]["resumed_rows"] == saved
    assert not partial.exists()


@pytest.mark.slow
def test_first_ctrl_c_finishes_the_chunk_and_says_how_to_resume(tiny_model, tmp_path, uninterrupted):
    out = tmp_path / "results.jsonl"
    partial = out.with_name(out.name + ".partial")
    process = _start(_grade_command(tiny_model, out))
    _wait_for_lines(partial, 4, process)  # the first two blocks of rows
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "to resume: " in stderr and "Traceback" not in stderr
    assert "Traceback" not in stderr
    saved = _lines(partial)
    assert saved % 2 == 0 and saved < 24  # whole blocks of 2 rows, unsent ones included

    resumed = subprocess.run(_grade_command(tiny_model, out), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert _records(out) == uninterrupted


@pytest.mark.slow
def test_a_second_run_on_the_same_output_refuses_and_the_first_finishes_intact(
    tiny_model, tmp_path, uninterrupted
):
    # A scheduler retry, or the same command typed in a second terminal, while the first runs.
    out = tmp_path / "results.jsonl"
    partial = out.with_name(out.name + ".partial")
    first = _start(_grade_command(tiny_model, out))
    _wait_for_lines(partial, 2, first)
    for command in (_grade_command(tiny_model, out), _grade_command(tiny_model, out) + ["--overwrite"]):
        second = subprocess.run(command, capture_output=True, text=True, timeout=300)
        assert second.returncode == 75, second.stderr
        assert second.stderr.splitlines() == [
            line for line in second.stderr.splitlines() if line.startswith("error: ")
        ] and len(second.stderr.splitlines()) == 1, second.stderr
        assert f"is being written by another grader run (pid {first.pid} on " in second.stderr
    assert first.poll() is None, "the first run finished before the second started: no overlap"
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert _records(out) == uninterrupted
    summary = json.loads((tmp_path / "results.summary.json").read_text())
    assert summary["run"]["resumed_rows"] == 0
