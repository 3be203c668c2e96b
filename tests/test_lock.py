"""One writer per results file: a second run refuses at once; a dead run's lock blocks nothing.

Two real grading processes on one output are in tests/test_resume.py (they need the tiny model).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import make_request

from grader.cli import main
from grader.errors import EXIT_BUSY
from grader.io.lock import OutputBusy, OutputLock, lock_path
from grader.run.data_parallel import DataParallelExecutor
from grader.run.grading import run_grade


def _data(tmp_path: Path, n: int = 3) -> Path:
    path = tmp_path / "data.jsonl"
    rows = [{"id": f"r{i}", "reference": f"ref {i}", "output_text": f"out {i}"} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def test_a_second_grade_on_a_held_output_is_one_line_and_writes_nothing(tmp_path):
    data, out = _data(tmp_path), tmp_path / "results.jsonl"
    out.write_bytes(b"what the first run finished\n")
    partial = out.with_name(out.name + ".partial")
    partial.write_bytes(b'{"half a rec')  # the first run's log, mid-write
    model = _model_dir(tmp_path)
    with OutputLock(out):
        for extra in ([], ["--overwrite"], ["--data-parallel", "2"]):
            result = CliRunner().invoke(
                main, ["grade", str(data), "--model", str(model), "-o", str(out), *extra]
            )
            assert result.exit_code == EXIT_BUSY, (extra, result.output)
            assert result.output == (
                f"error: {out} is being written by another grader run (pid {os.getpid()} on "
                f"{socket.gethostname()}, started {_started(out)}); wait for it to finish, or "
                "write elsewhere with another -o\n"
            )
            # the first run's files are as it left them: not resumed from, truncated or removed
            assert out.read_bytes() == b"what the first run finished\n"
            assert partial.read_bytes() == b'{"half a rec'
            assert not (tmp_path / "results.summary.json").exists()
    assert not lock_path(out).exists()  # the holder removes it as it lets go


def _started(out: Path) -> str:
    return json.loads(lock_path(out).read_text())["started"]


def test_rescore_onto_a_held_output_refuses(tmp_path):
    source = tmp_path / "graded.jsonl"
    source.write_text(json.dumps({"id": 1, "status": "ok", "raw_output": "x"}) + "\n")
    out = tmp_path / "rescored.jsonl"
    with OutputLock(out):
        result = CliRunner().invoke(main, ["rescore", str(source), "-o", str(out)])
    assert result.exit_code == EXIT_BUSY, result.output
    assert result.output.startswith(f"error: {out} is being written by another grader run (pid ")
    assert len(result.output.splitlines()) == 1
    assert not out.exists() and not out.with_name(out.name + ".partial").exists()


def test_the_api_refuses_too_and_data_parallel_before_any_worker(tmp_path):
    data, out = _data(tmp_path), tmp_path / "r.jsonl"
    request, job = make_request(data, out)
    with OutputLock(out):
        with pytest.raises(OutputBusy):
            run_grade(request, job)
        with pytest.raises(OutputBusy):
            run_grade(request, job, DataParallelExecutor(2))


def test_a_lock_left_by_a_dead_process_does_not_block(tmp_path, fake_backend_factory):
    data, out = _data(tmp_path), tmp_path / "r.jsonl"
    # A process that took the lock and died: its file stays, the kernel dropped its lock.
    child = subprocess.run(
        [sys.executable, "-c",
         "import os, sys; from pathlib import Path; from grader.io.lock import OutputLock; "
         "OutputLock(Path(sys.argv[1])).acquire(); os._exit(9)", str(out)],
        env=os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)},
        timeout=60,
    )
    assert child.returncode == 9
    assert json.loads(lock_path(out).read_text())["pid"] != os.getpid()
    fake_backend_factory.default = "not json"
    summary = run_grade(*make_request(data, out),
                        backend_factory=fake_backend_factory)
    assert summary["rows"] == 3 and not lock_path(out).exists()


def test_the_lock_is_released_when_the_run_fails(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n{not json\n')
    out = tmp_path / "r.jsonl"
    with pytest.raises(ValueError, match="bad.jsonl:2: invalid JSON"):
        run_grade(*make_request(bad, out))
    assert not lock_path(out).exists()
    with OutputLock(out):  # free again
        pass


def test_a_filesystem_without_locks_is_a_warning_line_on_stderr(tmp_path, monkeypatch, caplog):
    import errno

    import grader.io.lock

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(grader.io.lock.fcntl, "flock", no_locks)
    out = tmp_path / "rescored.jsonl"
    with OutputLock(out):  # the library logs it (grader.io.lock's logger)
        pass
    assert caplog.records[-1].name == "grader.io.lock"
    source = tmp_path / "graded.jsonl"
    source.write_text(json.dumps({"id": 1, "status": "ok", "raw_output": "x"}) + "\n")
    result = CliRunner().invoke(main, ["rescore", str(source), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stderr == (f"warning: cannot lock {lock_path(out)} (No locks available): make "
                             "sure no other grader run writes the same results\n")
