"""The engine watchdog (grader.backends.lifetime) without an engine: a stand-in "engine" is a
process started below grader while the engine is built, which maps a shared-memory segment and
starts a worker of its own. Killed with SIGKILL, grader takes the engine's processes and
segments along and leaves the user's own processes alone. The same on
vLLM's real engine, through the Python API: tests/test_vllm_engine.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from procs import alive, watchdogs_below

from grader.backends.lifetime import Watchdog

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the watchdog reads /proc (Linux)")

ROOT = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")

# The stand-in engine: maps the segment argv[1] names (creating it), starts a worker, prints
# the worker's pid, and waits.
ENGINE = r"""
import mmap, os, subprocess, sys, time
fd = os.open("/dev/shm/" + sys.argv[1], os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, 4096)
memory = mmap.mmap(fd, 4096)
worker = subprocess.Popen(["sleep", "600"], stdout=subprocess.DEVNULL)
print(worker.pid, flush=True)
time.sleep(600)
"""

# The process that uses grader: a process of the user's started before the engine, the engine
# (under a Watchdog), then two more of the user's: one plain, one detached. It prints every pid.
GRADER = r"""
import json, subprocess, sys, time
from pathlib import Path
quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
from grader.backends.lifetime import Watchdog
state, segment, close = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "close"
early = subprocess.Popen(["sleep", "600"], **quiet)
dog = Watchdog(state)
engine = subprocess.Popen([sys.executable, "-c", sys.argv[4], segment], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL)
worker = int(engine.stdout.readline())
dog.started()
later = subprocess.Popen(["sleep", "600"], **quiet)
detached = subprocess.Popen(["sleep", "600"], start_new_session=True, **quiet)
print(json.dumps({"engine": [engine.pid, worker], "user": [early.pid, later.pid, detached.pid]}),
      flush=True)
if close:  # a clean end: the engine shut down, then the watchdog closed
    sys.stdin.readline()
    engine.kill()
    engine.wait()
    subprocess.run(["kill", "-9", str(worker)])
    dog.close()
    print("closed", flush=True)
    sys.stdin.readline()
time.sleep(600)
"""


def _wait(condition, seconds: float = 30) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def segment() -> Iterator[str]:
    name = f"psm_gradertest_{os.getpid()}_{time.monotonic_ns()}"
    yield name
    (SHM / name).unlink(missing_ok=True)


@pytest.fixture
def started() -> Iterator[list[int]]:
    """The pids a test started; each still alive at its end is killed."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _run_grader(tmp_path: Path, segment: str, started: list[int], close: bool
                ) -> tuple[subprocess.Popen[str], dict[str, list[int]]]:
    process = subprocess.Popen(
        [sys.executable, "-c", GRADER, str(tmp_path / "state"), segment,
         "close" if close else "kill", ENGINE],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    started.append(process.pid)
    assert process.stdout is not None
    pids = json.loads(process.stdout.readline() or process.communicate()[1])
    started.extend(pids["engine"] + pids["user"])
    # the watchdog looks every half second: once it has noted the engine's segment, its file
    # names it
    state = tmp_path / "state"
    assert _wait(lambda: any(segment in p.read_text() for p in state.glob("*.json")))
    return process, pids


def test_kill_9_of_grader_kills_the_engines_processes_and_not_the_users(tmp_path, segment,
                                                                        started):
    process, pids = _run_grader(tmp_path, segment, started, close=False)
    process.kill()
    process.wait(timeout=30)
    assert _wait(lambda: not any(alive(pid) for pid in pids["engine"]))
    # the user's processes: started before the engine, after it, and detached
    assert [alive(pid) for pid in pids["user"]] == [True] * 3
    # the engine's segment is unlinked, and the watchdog's file with it
    assert _wait(lambda: not (SHM / segment).exists())
    assert _wait(lambda: not list((tmp_path / "state").glob("*.json")))


def test_a_watchdog_closed_kills_nothing_and_unlinks_the_engines_segment_without_a_warning(
    tmp_path, segment, started
):
    process, pids = _run_grader(tmp_path, segment, started, close=True)
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("\n")
    process.stdin.flush()
    assert process.stdout.readline() == "closed\n"
    assert not (SHM / segment).exists()
    assert not list((tmp_path / "state").glob("*.json"))
    process.kill()  # closed: a kill now is the user's processes' business only
    _, errors = process.communicate(timeout=30)
    time.sleep(1)  # what a watchdog would do, it would do in its half-second look
    assert all(alive(pid) for pid in pids["user"])
    # multiprocessing's resource tracker saw the segment go (Python's "leaked shared_memory
    # objects" warning at exit)
    assert "resource_tracker" not in errors and "leaked" not in errors, errors


def test_the_next_watchdog_unlinks_the_segments_of_one_that_died_and_no_one_elses(
    tmp_path, started
):
    names = [f"psm_gradertest_{os.getpid()}_{time.monotonic_ns()}_{i}" for i in range(3)]
    for name in names:
        (SHM / name).write_bytes(b"\0" * 4096)
    try:
        gone = subprocess.Popen(["true"])
        gone.wait()
        state = tmp_path / "state"
        state.mkdir()
        # an earlier watchdog, dead before it could clean up, had noted the first two
        (state / f"{gone.pid}-1.json").write_text(json.dumps({"segments": names[:2]}))
        # the second is mapped by a live process (this one); the third is no engine's
        with open(SHM / names[1], "r+b") as file:
            import mmap

            mapped = mmap.mmap(file.fileno(), 4096)
            Watchdog(state).close()
            assert [(SHM / n).exists() for n in names] == [False, True, True]
            mapped.close()
        assert not list(state.glob("*.json"))
    finally:
        for name in names:
            (SHM / name).unlink(missing_ok=True)


def test_a_watchdog_closed_or_dropped_ends(tmp_path):
    """A watchdog lives no longer than its engine's owner holds it: close() ends it, and so
    does its collection without close() (the engine's owner dropped), not the interpreter's
    exit."""
    import gc

    closed = Watchdog(tmp_path / "state")
    closed.started()
    assert closed.process is not None
    pid = closed.process.pid
    assert pid in watchdogs_below(os.getpid())
    closed.close()
    assert pid not in watchdogs_below(os.getpid())
    dropped = Watchdog(tmp_path / "state")
    dropped.started()
    assert dropped.process is not None
    pid = dropped.process.pid
    del dropped
    gc.collect()
    assert _wait(lambda: pid not in watchdogs_below(os.getpid()), 15)


def test_a_grader_dropped_without_close_closes_its_engine(tmp_path, monkeypatch):
    """A Grader garbage-collected without close() (no ``with``) stops its
    engine; its engine's processes do not live on beside the user's program."""
    import gc

    from answers import answer
    from conftest import FakeBackend

    import grader
    from grader.run import grading

    closed: list[str] = []
    kept: list[BaseException] = []

    class EngineBackend(FakeBackend):
        def __init__(self, **options: Any) -> None:
            super().__init__(**options)
            # a library that keeps an exception raised while the engine starts (as vLLM's
            # start did): its traceback keeps every frame above, grade()'s among them
            try:
                raise RuntimeError("kept")
            except RuntimeError as exc:
                kept.append(exc)

        def close(self) -> None:  # where vLLM's backend stops its engine's processes
            closed.append("engine")

    made = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor", lambda *a: made(
        *a, backend_factory=lambda name, **options: EngineBackend(default=answer())))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    judge = grader.Grader(str(model), format="seed")
    judge.grade([{"id": "1", "input": "q", "reference": "r", "output_text": "a"}])
    assert closed == []
    del judge
    gc.collect()
    assert closed == ["engine"]
    # closed once: close() and then the collection do not stop it twice
    with grader.Grader(str(model), format="seed") as judge:
        judge.grade([{"id": "1", "input": "q", "reference": "r", "output_text": "a"}])
    del judge
    gc.collect()
    assert closed == ["engine"] * 2


# A script without the __main__ guard, as multiprocessing's spawn runs it: the parent spawns a
# process (as vLLM starts its engine core), whose interpreter re-imports the script and so runs
# its top level again: there, the script grades (VERB). The parent prints what the child left.
UNGUARDED = r"""
import multiprocessing
import grader
from grader.backends.lifetime import reimported
rows = [{"id": "1", "input": "q", "reference": "r", "output_text": "a"}]
if multiprocessing.current_process().name == "engine":  # the spawned one, re-importing this
    VERB
else:
    engine = multiprocessing.get_context("spawn").Process(target=len, args=("",), name="engine")
    engine.start()
    engine.join()
    print(engine.exitcode, reimported(), sep="\n")
"""

VERBS = {
    "Grader.grade": "grader.Grader('model', backend='vllm').grade(rows)",
    "grade_file": "grader.grade_file('data.jsonl', 'out.jsonl', model='model', backend='vllm')",
    "rescore": "grader.rescore('results.jsonl', 'rescored.jsonl')",
}


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_script_without_the_main_guard_is_told_why_its_engine_did_not_start(verb, tmp_path):
    """The spawned process stops at the script's first grader call with the
    reason, and leaves it for the parent, whose engine start failed, to raise."""
    script = tmp_path / "grade_it.py"
    script.write_text(UNGUARDED.replace("VERB", VERBS[verb]))
    (tmp_path / "results.jsonl").write_text("")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert done.returncode == 0, done.stderr
    exitcode, message = done.stdout.splitlines()
    assert exitcode == "2"  # the spawned process stopped: bad usage
    assert message.startswith(f"{script} starts grading again in a process spawned for the "
                              "engine"), message
    assert 'under `if __name__ == "__main__":`' in message or "under that guard" in message
    # the spawned process said it too, in one line on its stderr (the terminal's)
    assert done.stderr.splitlines() == [f"error: {message}"]
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "rescored.jsonl").exists()


def test_a_grader_made_at_a_scripts_top_level_and_graded_under_the_guard_is_no_error(tmp_path):
    """Only grading stops a re-imported script: a Grader made at its top level loads nothing."""
    script = tmp_path / "grade_it.py"
    script.write_text(UNGUARDED.replace("VERB", "judge = grader.Grader('model', backend='vllm')"))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    assert (done.returncode, done.stdout.splitlines()) == (0, ["0", "None"]), done.stderr
