"""The rubric file, locks, ownership, resume fidelity, a full disk and signals under hostile
use (issue 29 items 1, 2, 3, 4, 6, 8, 9, 13, 15, 16, 21).

Through the CLI with a fake backend (``grader.backends.load_backend`` replaced), which answers
as guided decoding would: a rubric-pass row gets the draft, a check-pass row its labels. A
full disk and a read-only filesystem are simulated by making the kernel calls fail with the
errno they give (ENOSPC, EROFS), or, where this process may mount one, by a real tmpfs.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import FakeBackend

from grader.cli import main
from grader.errors import (
    EXIT_BAD_INPUT,
    EXIT_BUSY,
    EXIT_OUTPUT,
    EXIT_TERMINATED,
    Terminated,
)
from grader.io.lock import OutputLock
from grader.io.results import read_records, summary_path
from grader.io.rubric_file import read_rubric_file

# Two items a judge repeats: make_rubric drops the second as a near duplicate (the ``dropped``
# audit list a resumed rubric must keep).
DRAFT = {"facts": ["Paris is the capital of France", "the capital of France is Paris",
                   "Paris lies on the Seine"],
         "conclusions": [], "terms": ["capital"]}


def _rows(references: int = 2, answers: int = 2) -> list[dict]:
    return [{"id": f"r{i}-{j}", "input": f"question {i}",
             "reference": f"Paris is the capital of France, on the Seine ({i}).",
             "output_text": f"reply {i}-{j}"}
            for i in range(references) for j in range(answers)]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


class Engine:
    """load_backend's stand-in: one backend per run, made by ``make`` (a FakeBackend giving
    DRAFT), every one remembered; ``crash`` is called before each generate() with the backend
    and that call's schemas."""

    def __init__(self, make: Any = None) -> None:
        self.backends: list[FakeBackend] = []
        self.make = make or (lambda: FakeBackend(chunk_size=1, draft=DRAFT))
        self.crash: Any = None

    def __call__(self, name: str, **options: Any) -> FakeBackend:
        backend = self.make()
        reply = backend.reply

        def crashing(conversations, schemas=None):
            if self.crash is not None:
                self.crash(backend, schemas)
            return reply(conversations, schemas)

        backend.reply = crashing  # type: ignore[method-assign]
        self.backends.append(backend)
        return backend


@pytest.fixture
def engine(monkeypatch) -> Engine:
    fake = Engine()
    monkeypatch.setattr("grader.backends.load_backend", fake)
    return fake


def _run(*args: Any):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="grader")


def _grade(data: Path, out: Path, model: Path, *extra: Any):
    return _run("grade", data, "--model", model, "-o", out, "--backend", "transformers", *extra)


def _rubric(data: Path, out: Path, model: Path, *extra: Any):
    return _run("rubric", data, "--model", model, "-o", out, "--backend", "transformers", *extra)


def _records(path: Path) -> list[dict]:
    return [r.to_dict() for _, r in read_records(path)]


def _is_rubric_pass(schemas: Any) -> bool:
    return bool(schemas) and all(s is not None and s.get("title") == "RubricDraft" for s in schemas)


def _fail_syscall(monkeypatch, name: str, where: str, code: int, *, after: int = 0) -> list[str]:
    """``os.NAME(fd, ...)`` raises OSError(code) for files whose path holds ``where``, from
    its ``after``+1-th such call on; returns the paths it failed."""
    real = getattr(os, name)
    seen: list[int] = [0]
    failed: list[str] = []

    def fake(fd, *args):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = ""
        if where in path:
            seen[0] += 1
            if seen[0] > after:
                failed.append(path)
                raise OSError(code, os.strerror(code))
        return real(fd, *args)

    monkeypatch.setattr(os, name, fake)
    return failed


# --- 1: drafted rubrics never go into the file the user named with --rubric -------------------

def test_a_rubric_file_named_with_rubric_that_lacks_references_is_never_rewritten(tmp_path, engine, model):
    data = _write(tmp_path / "d.jsonl", _rows())
    out = tmp_path / "u" / "r2.jsonl"
    assert _grade(data, out, model).exit_code == 0
    mine = tmp_path / "u" / "r2.rubric.jsonl"  # the results' own rubric file, hand-edited
    first = json.loads(mine.read_text().splitlines()[0])
    mine.write_text(json.dumps(first | {"facts": ["my own fact"]}) + "\n")
    before = mine.read_text()
    loads = len(engine.backends)
    result = _grade(data, out, model, "--rubric", mine, "--overwrite")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert str(mine) in result.output and "1 reference" in result.output
    assert "line 3" in result.output  # the first row whose reference it lacks
    assert mine.read_text() == before  # the hand edit stays
    assert len(engine.backends) == loads  # refused before any model work


# --- 2: grader rubric takes the output's lock ------------------------------------------------

def test_grader_rubric_stops_when_another_run_writes_the_same_output(tmp_path, engine, model):
    data = _write(tmp_path / "d.jsonl", _rows())
    out = tmp_path / "r.rubric.jsonl"
    with OutputLock(out):
        result = _rubric(data, out, model)
    assert result.exit_code == EXIT_BUSY, result.output
    assert "another grader run" in result.output and not out.exists()
    assert engine.backends == []


def test_grade_and_grader_rubric_on_the_same_rubric_file_do_not_run_together(tmp_path, engine, model):
    data = _write(tmp_path / "d.jsonl", _rows())
    with OutputLock(tmp_path / "r.rubric.jsonl"):  # `grader rubric -o r.rubric.jsonl` running
        result = _grade(data, tmp_path / "r.jsonl", model)
    assert result.exit_code == EXIT_BUSY, result.output
    assert engine.backends == []


# --- 3: a file that is not grader's is never replaced without --overwrite ----------------------

def test_grade_refuses_to_replace_a_file_that_is_not_a_results_file(tmp_path, engine, model):
    data = _write(tmp_path / "d.jsonl", _rows())
    copy = tmp_path / "X.jsonl"
    copy.write_bytes(data.read_bytes())
    result = _grade(data, copy, model)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert str(copy) in result.output and "--overwrite" in result.output
    assert copy.read_bytes() == data.read_bytes() and engine.backends == []
    assert _grade(data, copy, model, "--overwrite").exit_code == 0
    assert len(_records(copy)) == 4
    # an empty file holds nothing to lose
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert _grade(data, empty, model).exit_code == 0


# --- 4: rescore -o follows the ownership rule -------------------------------------------------

def test_rescore_refuses_to_replace_another_runs_results(tmp_path, engine, model):
    data = _write(tmp_path / "d.jsonl", _rows())
    mine = tmp_path / "a.jsonl"
    assert _grade(data, mine, model).exit_code == 0
    before = mine.read_bytes(), summary_path(mine).read_bytes()
    other = tmp_path / "b.jsonl"
    engine.make = lambda: FakeBackend(chunk_size=4)
    assert _grade(data, other, model, "--format", "seed", "--limit", "2").exit_code == 0
    result = _run("rescore", other, "-o", mine)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert str(mine) in result.output and "--overwrite" in result.output
    assert (mine.read_bytes(), summary_path(mine).read_bytes()) == before
    # a copy of the data is not replaced either
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(data.read_bytes())
    assert _run("rescore", other, "-o", copy).exit_code == EXIT_BAD_INPUT
    # its own file again, in place or to an earlier rescore of it, and --overwrite: allowed
    assert _run("rescore", mine, "-o", mine).exit_code == 0
    assert _run("rescore", mine, "-o", tmp_path / "c.jsonl").exit_code == 0
    assert _run("rescore", mine, "-o", tmp_path / "c.jsonl").exit_code == 0
    assert _run("rescore", other, "-o", mine, "--overwrite").exit_code == 0
    assert len(_records(mine)) == 2


# --- 6: a resumed run's records equal an uninterrupted run's ----------------------------------

class _Crash(BaseException):  # not an Exception: grade_pending makes those engine_error rows
    pass


@pytest.mark.parametrize("crash_in", ["check", "rubric", "sigterm"])
def test_a_resumed_rubric_run_equals_an_uninterrupted_one_field_for_field(tmp_path, engine, model, crash_in):
    data = _write(tmp_path / "d.jsonl", _rows(3, 2))
    straight = tmp_path / "straight.jsonl"
    assert _grade(data, straight, model).exit_code == 0
    whole = _records(straight)
    assert all(r["rubric"]["dropped"] for r in whole)  # the repeated item is audited

    resumed = tmp_path / "resumed.jsonl"
    calls = {"rubric": 0, "check": 0}

    def crash(backend, schemas):
        kind = "rubric" if _is_rubric_pass(schemas) else "check"
        calls[kind] += 1
        if crash_in == "sigterm" and kind == "check" and calls[kind] == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # the run saves this chunk, then stops
        elif kind == crash_in and calls[kind] == 2:
            raise _Crash

    engine.crash = crash
    if crash_in == "sigterm":
        stopped = _grade(data, resumed, model)
        assert stopped.exit_code == EXIT_TERMINATED, stopped.output
        assert "to resume" in stopped.output
    else:
        with pytest.raises(_Crash):
            CliRunner().invoke(main, ["grade", str(data), "--model", str(model), "-o",
                                      str(resumed), "--backend", "transformers"],
                               catch_exceptions=False)
    engine.crash = None
    assert _grade(data, resumed, model).exit_code == 0
    again = _records(resumed)
    assert again == whole
    assert (read_rubric_file(tmp_path / "resumed.rubric.jsonl")
            == read_rubric_file(tmp_path / "straight.rubric.jsonl"))


@pytest.mark.slow
def test_a_resumed_rubric_run_on_the_tiny_model_equals_an_uninterrupted_one(tiny_model, tmp_path):
    """transformers + the tiny model: a run stopped after its rubric pass, then resumed,
    gives the records of a run that was never stopped."""
    data = _write(tmp_path / "d.jsonl", _rows(2, 2))

    def grade(out: Path):
        return _run("grade", data, "-m", tiny_model, "-o", out, "--backend", "transformers",
                    "--max-tokens", "64")

    assert grade(tmp_path / "a.jsonl").exit_code == 0
    # the same rubric file, the results not graded yet: as a run killed after its rubric pass
    (tmp_path / "b.rubric.jsonl").write_bytes((tmp_path / "a.rubric.jsonl").read_bytes())
    assert grade(tmp_path / "b.jsonl").exit_code == 0
    assert _records(tmp_path / "b.jsonl") == _records(tmp_path / "a.jsonl")


# --- 8: rows sharing (input, reference) carry one rubric --------------------------------------

def test_rows_sharing_a_reference_with_different_rubric_columns_are_refused(tmp_path, engine, model):
    rows = _rows(1, 3)
    rows[0]["facts"], rows[2]["facts"] = ["Paris is the capital"], ["Paris lies on the Seine"]
    data = _write(tmp_path / "d.jsonl", rows)
    result = _grade(data, tmp_path / "r.jsonl", model)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"{data}:3" in result.output and "line 1" in result.output
    assert engine.backends == [] and not (tmp_path / "r.jsonl").exists()
    # the same columns, or a row without any, share the first row's rubric
    rows[2]["facts"] = rows[0]["facts"]
    _write(data, rows)
    assert _grade(data, tmp_path / "r.jsonl", model).exit_code == 0


def test_a_rows_columns_after_a_row_without_them_are_its_references_rubric(tmp_path, engine, model):
    rows = _rows(1, 2)
    rows[1]["facts"] = ["Paris is the capital"]
    data = _write(tmp_path / "d.jsonl", rows)
    result = _grade(data, tmp_path / "r.jsonl", model)
    assert result.exit_code == 0, result.output
    assert [r["rubric"]["facts"] for r in _records(tmp_path / "r.jsonl")] == [["Paris is the capital"]] * 2
    assert engine.backends[0].rubric_calls == []


# --- 9: a full disk, a read-only filesystem ----------------------------------------------------

def test_a_full_disk_while_the_rubric_file_is_written_exits_73_with_no_torn_line(
        tmp_path, engine, model):
    data = _write(tmp_path / "d.jsonl", _rows(3, 1))
    out = tmp_path / "r.jsonl"
    with pytest.MonkeyPatch.context() as full:
        # the first write (the file before any draft) and the first draft's go through
        _fail_syscall(full, "fsync", "r.rubric.jsonl", errno.ENOSPC, after=2)
        result = _grade(data, out, model)
    assert result.exit_code == EXIT_OUTPUT, result.output
    assert "r.rubric.jsonl" in result.output and "disk is full" in result.output
    assert len(read_rubric_file(tmp_path / "r.rubric.jsonl")) == 1  # whole lines only
    again = _grade(data, out, model)
    assert again.exit_code == 0, again.output  # and a rerun resumes it


def _mount(tmp_path: Path, name: str, *options: str) -> Path:
    point = tmp_path / name
    point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(point)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    return point


@pytest.fixture
def tmpfs(tmp_path):
    mounted: list[Path] = []

    def mount(name: str, *options: str) -> Path:
        mounted.append(_mount(tmp_path, name, *options))
        return mounted[-1]

    yield mount
    for point in mounted:
        subprocess.run(["umount", str(point)], check=False)


def test_a_full_tmpfs_under_grader_rubric_leaves_whole_lines(tmp_path, engine, model, tmpfs):
    full = tmpfs("full", "size=12k")
    rows = [r | {"reference": r["reference"] + " " + "word " * 400} for r in _rows(12, 1)]
    data = _write(tmp_path / "d.jsonl", rows)
    result = _rubric(data, full / "r.rubric.jsonl", model)
    assert result.exit_code == EXIT_OUTPUT, result.output
    assert "disk is full" in result.output
    text = (full / "r.rubric.jsonl").read_text() if (full / "r.rubric.jsonl").exists() else ""
    assert text == "" or text.endswith("\n")
    read_rubric_file(full / "r.rubric.jsonl") if text else None


def test_grader_rubric_on_a_read_only_filesystem_stops_before_the_model_loads(
        tmp_path, engine, model, monkeypatch):
    data = _write(tmp_path / "d.jsonl", _rows())
    readonly = tmp_path / "ro"
    readonly.mkdir()
    real_open = os.open

    def fake_open(path, flags, *args, **kwargs):
        if str(path).startswith(str(readonly)) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    result = _rubric(data, readonly / "r.rubric.jsonl", model)
    assert result.exit_code == EXIT_OUTPUT, result.output
    assert "read-only" in result.output and engine.backends == []


def test_grader_rubric_on_a_read_only_tmpfs_stops_before_the_model_loads(tmp_path, engine, model, tmpfs):
    data = _write(tmp_path / "d.jsonl", _rows())
    readonly = tmpfs("ro", "ro,size=64k")
    result = _rubric(data, readonly / "r.rubric.jsonl", model)
    assert result.exit_code == EXIT_OUTPUT, result.output
    assert "read-only" in result.output and engine.backends == []


# --- 13: a NUL byte in a rubric item is the rubric file's line -------------------------------

@pytest.mark.parametrize("beside", [False, True])
def test_a_nul_byte_in_a_rubric_item_names_the_rubric_file_and_its_line(tmp_path, engine, model, beside):
    data = _write(tmp_path / "d.jsonl", _rows())
    out = tmp_path / "r.jsonl"
    assert _grade(data, out, model).exit_code == 0
    rubric = tmp_path / "r.rubric.jsonl"
    lines = [json.loads(line) for line in rubric.read_text().splitlines()]
    lines[1]["facts"][0] = "Paris\u0000 is the capital"
    target = rubric if beside else tmp_path / "mine.jsonl"
    target.write_text("".join(json.dumps(line) + "\n" for line in lines))
    extra = ["--overwrite"] if beside else ["--rubric", target, "--overwrite"]
    if beside:  # the file beside the results is read when the run resumes, not on --overwrite
        extra = []
        (tmp_path / "r.jsonl").unlink()
        summary_path(out).unlink()
    result = _grade(data, out, model, *extra)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"{target}:2" in result.output and "NUL" in result.output
    assert "prompt" not in result.output


# --- 15: SIGTERM during the rubric pass --------------------------------------------------------

@pytest.mark.parametrize("command", ["grade", "rubric"])
def test_sigterm_in_the_rubric_pass_says_what_is_saved_and_how_to_resume(tmp_path, engine, model, command):
    data = _write(tmp_path / "d.jsonl", _rows(3, 1))
    calls = [0]

    def crash(backend, schemas):
        calls[0] += 1
        if calls[0] == 2:  # the first draft is in the file
            raise Terminated

    engine.crash = crash
    if command == "grade":
        out, rubric = tmp_path / "r.jsonl", tmp_path / "r.rubric.jsonl"
        result = _grade(data, out, model)
    else:
        out = rubric = tmp_path / "mine.rubric.jsonl"
        result = _rubric(data, out, model)
    assert result.exit_code == EXIT_TERMINATED, result.output
    assert "nothing was graded" not in result.output
    assert str(rubric) in result.output and "to resume: grader " in result.output
    assert len(read_rubric_file(rubric)) == 1
    engine.crash = None
    again = _grade(data, out, model) if command == "grade" else _rubric(data, out, model)
    assert again.exit_code == 0
    assert len(engine.backends[-1].rubric_calls[0]) == 1 and len(engine.backends[-1].rubric_calls) == 2


@pytest.mark.parametrize("command", ["grade", "rubric"])
def test_a_real_sigterm_in_the_rubric_pass_is_caught_by_both_commands(tmp_path, engine, model,
                                                                       command):
    """The signal itself, not a raised Terminated: `grader rubric` installed no handler, so
    a SIGTERM killed it with no word (and here, the test process with it)."""
    data = _write(tmp_path / "d.jsonl", _rows(3, 1))
    calls = [0]

    def crash(backend, schemas):
        calls[0] += 1
        if calls[0] == 2:  # the first draft is in the file
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before os.kill returns

    engine.crash = crash
    if command == "grade":
        rubric = tmp_path / "r.rubric.jsonl"
        result = _grade(data, tmp_path / "r.jsonl", model)
    else:
        rubric = tmp_path / "mine.rubric.jsonl"
        result = _rubric(data, rubric, model)
    assert result.exit_code == EXIT_TERMINATED, result.output
    assert str(rubric) in result.output and "to resume: grader " in result.output
    assert len(read_rubric_file(rubric)) == 1
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back as it was


# --- 16: a backend that runs ahead has each draft written as it finishes -----------------------

class AheadBackend(FakeBackend):
    """As vLLM's backend: it streams, one call for a block of drafts, each finished draft
    handed to the run as the engine finishes it; it crashes after ``finish`` drafts."""

    supports_streaming = True
    finish: int | None = None

    def stream(self):
        from conftest import ListStream

        finish = self.finish

        class Crashing(ListStream):
            def finished(self):
                for count, row in enumerate(super().finished()):
                    if count == finish:
                        raise _Crash
                    yield row

        return Crashing(self)

    def reply(self, conversations, schemas=None):
        from grader.backends import Completion

        if not _is_rubric_pass(schemas):
            return super().reply(conversations, schemas)
        return [Completion(json.dumps(DRAFT | {"terms": [f"term {index}"]}), "stop", 10, 5)
                for index, _ in enumerate(conversations)]


@pytest.mark.parametrize("command", ["grade", "rubric"])
def test_a_crash_in_a_block_of_drafts_keeps_every_draft_that_finished(tmp_path, engine, model, command):
    data = _write(tmp_path / "d.jsonl", _rows(5, 1))

    def make():
        backend = AheadBackend(chunk_size=512, draft=DRAFT)
        backend.finish = 3
        return backend

    engine.make = make
    rubric = tmp_path / ("r.rubric.jsonl" if command == "grade" else "mine.rubric.jsonl")
    with pytest.raises(_Crash):
        CliRunner().invoke(main, [command, str(data), "--model", str(model), "--backend",
                                  "transformers", "-o",
                                  str(tmp_path / "r.jsonl" if command == "grade" else rubric)],
                           catch_exceptions=False)
    kept = read_rubric_file(rubric)
    assert [line.terms for line in kept.values()] == [[f"term {i}"] for i in range(3)]


# --- 21: rescore on a full disk leaves the results and their summary consistent ---------------

def test_rescore_on_a_full_disk_writes_neither_the_results_nor_the_summary(
        tmp_path, engine, model):
    data = _write(tmp_path / "d.jsonl", _rows())
    graded = tmp_path / "a.jsonl"
    assert _grade(data, graded, model).exit_code == 0
    out = tmp_path / "b.jsonl"
    with pytest.MonkeyPatch.context() as full:
        _fail_syscall(full, "fsync", "b.summary.json", errno.ENOSPC)
        result = _run("rescore", graded, "-o", out)
    assert result.exit_code == EXIT_OUTPUT, result.output
    assert "disk is full" in result.output
    assert not out.exists() and not summary_path(out).exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("b.")) == []
    # an earlier rescore stays whole: its results with its own summary
    assert _run("rescore", graded, "-o", out).exit_code == 0
    before = out.read_bytes(), summary_path(out).read_bytes()
    with pytest.MonkeyPatch.context() as full:
        _fail_syscall(full, "fsync", "b.summary.json", errno.ENOSPC)
        assert _run("rescore", graded, "-o", out).exit_code == EXIT_OUTPUT
    assert (out.read_bytes(), summary_path(out).read_bytes()) == before
