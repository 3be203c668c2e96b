"""A results file belongs to the run that made it; nothing saved is lost, nothing is torn.

Through the CLI with a fake backend (``grader.backends.load_backend`` replaced): a rerun with
other settings or rows stops before any model work; the interrupt line is a command that
resumes; each results file has its own summary; a data file edited between the two passes
stops the run; an output that cannot be written is one line, and a full disk leaves no torn
file.
"""

from __future__ import annotations

import errno
import json
import shlex
from pathlib import Path

import pytest
from answers import answer
from click.testing import CliRunner
from conftest import FakeBackend

from grader.cli import main
from grader.errors import EXIT_BAD_INPUT, EXIT_OUTPUT
from grader.io.results import read_records, summary_path


def _rows(n: int) -> list[dict]:
    return [{"id": f"q{i:02d}", "reference": f"ref {i}", "output_text": f"out {i}"} for i in range(n)]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


class Engine:
    """load_backend's stand-in: one FakeBackend per run, every call remembered."""

    def __init__(self) -> None:
        self.backends: list[FakeBackend] = []
        self.replies: list = []
        self.on_load = None

    def __call__(self, name, **options):
        if self.on_load:
            self.on_load()
        backend = FakeBackend(self.replies, chunk_size=4, default=answer())
        self.backends.append(backend)
        return backend

    @property
    def sent(self) -> int:
        return sum(len(call) for backend in self.backends for call in backend.calls)


@pytest.fixture
def engine(monkeypatch) -> Engine:
    fake = Engine()
    monkeypatch.setattr("grader.backends.load_backend", fake)
    return fake


def _grade(data: Path, out: Path, model: Path, *extra: str):
    args = ["grade", str(data), "--model", str(model), "-o", str(out), "--backend",
            "transformers", "--format", "seed", *extra]
    return CliRunner().invoke(main, args, prog_name="grader")


def _ids(path: Path) -> list[str]:
    return [r.id for _, r in read_records(path)]


def test_a_shorter_limit_or_a_changed_setting_stops_before_any_model_work(tmp_path, engine, model):
    data, out = _write(tmp_path / "data.jsonl", _rows(8)), tmp_path / "results.jsonl"
    assert _grade(data, out, model, "--max-tokens", "64").exit_code == 0
    before, summary = out.read_bytes(), summary_path(out).read_bytes()
    sent = engine.sent
    for extra, named in (
        (["--max-tokens", "64", "--limit", "3"], "was graded with no --limit; this run has --limit 3"),
        (["--max-tokens", "65"], "was graded with max_tokens=64; this run has max_tokens=65"),
        (["--max-tokens", "64", "--no-checklist"], "was graded with checklist=true; this run has checklist=false"),
        (["--max-tokens", "64", "--temperature", "0.5", "--seed", "1"], "was graded with seed=0; this run has seed=1"),
    ):
        result = _grade(data, out, model, *extra)
        assert result.exit_code == EXIT_BAD_INPUT, (extra, result.output)
        assert result.output == (
            f"error: {out} {named}: use --overwrite to start over, or another -o to keep both\n"
        ), extra
        assert engine.sent == sent  # no model work
        assert out.read_bytes() == before and summary_path(out).read_bytes() == summary
    # the same settings resume every row; --overwrite starts over; another -o keeps both
    assert _grade(data, out, model, "--max-tokens", "64").exit_code == 0 and engine.sent == sent
    assert _grade(data, tmp_path / "other.jsonl", model, "--limit", "3").exit_code == 0
    assert _ids(out) == [f"q{i:02d}" for i in range(8)]
    result = _grade(data, out, model, "--max-tokens", "64", "--limit", "3", "--overwrite")
    assert result.exit_code == 0 and _ids(out) == ["q00", "q01", "q02"]


def test_another_format_stops_even_against_a_summary_from_before_identities(tmp_path, engine, model):
    # the rubric issue's new default format must not silently re-grade an existing file
    data, out = _write(tmp_path / "data.jsonl", _rows(3)), tmp_path / "results.jsonl"
    assert _grade(data, out, model).exit_code == 0
    stored = json.loads(summary_path(out).read_text())
    del stored["run"]["identity"]  # what grader wrote before this change
    summary_path(out).write_text(json.dumps(stored))
    args = ["grade", str(data), "--model", str(model), "-o", str(out), "--backend", "transformers",
            "--format", "itemized"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "was graded with --format seed; this run has --format itemized" in result.output
    # and the rows: the same format with other data
    _write(data, _rows(4))
    result = _grade(data, out, model)
    assert result.exit_code == EXIT_BAD_INPUT and "was graded with 3 rows; this run has 4 rows" in result.output


def test_an_interrupted_run_is_owned_too_and_the_stop_line_resumes_after_overwrite(
    tmp_path, engine, model, monkeypatch
):
    data, out = _write(tmp_path / "data.jsonl", _rows(10)), tmp_path / "results.jsonl"
    assert _grade(data, out, model, "--chunk-size", "4").exit_code == 0

    def ctrl_c():
        import os
        import signal

        os.kill(os.getpid(), signal.SIGINT)
        return answer()

    engine.replies = [answer(), ctrl_c]
    # --overwrite, then Ctrl-C in the first chunk: the printed command must resume, not start over
    # (without controls: the count of rows sent below is the resumed run's rows)
    result = _grade(data, out, model, "--chunk-size", "4", "--max-tokens", "99", "--overwrite",
                    "--controls", "0")
    assert result.exit_code == 130, result.output
    partial = out.with_name(out.name + ".partial")
    line = result.output.splitlines()[-1]
    assert line.startswith(f"error: interrupted: 4 of 10 rows are graded and saved in {partial}; "
                           "to resume: grader grade "), line
    command = shlex.split(line.partition("to resume: ")[2])
    assert "--overwrite" not in command
    # another setting against the unfinished run stops, naming it
    result = _grade(data, out, model, "--chunk-size", "4", "--max-tokens", "98")
    assert result.exit_code == EXIT_BAD_INPUT
    assert f"{out} (its unfinished run, {out.name}.partial) was graded with max_tokens=99" in result.output
    sent, engine.replies = engine.sent, []
    result = CliRunner().invoke(main, command[1:], prog_name="grader")
    assert result.exit_code == 0, result.output
    assert engine.sent - sent == 6  # the 4 saved rows are resumed
    assert not partial.exists() and not out.with_name(out.name + ".partial.json").exists()
    assert json.loads(summary_path(out).read_text())["run"]["identity"]["sampling"]["max_tokens"] == 99


def test_each_results_file_has_its_own_summary_and_lock(tmp_path, engine, model):
    from grader.io.lock import lock_path

    data = _write(tmp_path / "data.jsonl", _rows(3))
    bare, jsonl = tmp_path / "X", tmp_path / "X.jsonl"
    paths = {summary_path(p) for p in (bare, jsonl, tmp_path / "X.jsonl.jsonl", tmp_path / "X.json")}
    assert len(paths) == 4 and summary_path(jsonl).name == "X.summary.json"
    assert lock_path(bare) != lock_path(jsonl)
    assert _grade(data, bare, model, "--no-checklist").exit_code == 0
    assert _grade(data, jsonl, model).exit_code == 0
    for results, checklist in ((bare, False), (jsonl, True)):
        run = json.loads(summary_path(results).read_text())["run"]
        assert run["results"] == str(results) and run["judge"]["checklist"] is checklist
    # compare reads each file's own summary: the judges differ
    result = CliRunner().invoke(main, ["compare", str(bare), str(jsonl), "--json"])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.output)["notes"]
    assert any("different judge settings" in note and "checklist" in note for note in notes), notes
    # a results file may not take the name of a file grader keeps beside another
    result = _grade(data, tmp_path / "X.summary.json", model)
    assert result.exit_code == EXIT_BAD_INPUT and "names ending in .summary.json" in result.output


def test_a_data_file_edited_between_the_passes_stops_the_run(tmp_path, engine, model):
    rows = _rows(6)
    data, out = _write(tmp_path / "data.jsonl", rows), tmp_path / "results.jsonl"
    edited = [dict(r) for r in rows]
    edited[2]["id"] = "q01"  # the same row count, a duplicate id
    edited[4]["output_text"] = "another answer"
    engine.on_load = lambda: _write(data, edited)  # the model loads between the two passes
    result = _grade(data, out, model, "--chunk-size", "2")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.output.splitlines()[-1] == f"error: {data}: changed while it was being graded"
    assert not out.exists() and not summary_path(out).exists()
    # only the text: caught in a later block, what was graded before stays for a rerun
    _write(data, rows)
    edited = [dict(r) for r in rows]
    edited[4]["output_text"] = "another answer"
    engine.on_load = lambda: _write(data, edited)
    result = _grade(data, out, model, "--chunk-size", "2")
    assert result.exit_code == EXIT_BAD_INPUT and "changed while it was being graded" in result.output
    partial = out.with_name(out.name + ".partial")
    assert [r.id for _, r in read_records(partial)] == ["q00", "q01", "q02", "q03"]
    engine.on_load = None
    assert _grade(data, out, model, "--chunk-size", "2").exit_code == 0
    assert _ids(out) == [r["id"] for r in edited]


def test_an_output_that_cannot_be_written_is_one_line(tmp_path, engine, model):
    data = _write(tmp_path / "data.jsonl", _rows(2))
    (tmp_path / "file").write_text("not a directory")
    result = _grade(data, tmp_path / "file" / "results.jsonl", model)
    assert result.exit_code == EXIT_OUTPUT, result.output
    assert result.output.startswith(f"error: cannot write {tmp_path / 'file' / 'results.jsonl'}: ")
    assert len(result.output.splitlines()) == 1 and engine.sent == 0


def test_a_full_disk_leaves_whole_records_and_no_temporary_file(tmp_path, engine, model, monkeypatch):
    import os

    import grader.io.results as results

    data, out = _write(tmp_path / "data.jsonl", _rows(10)), tmp_path / "results.jsonl"
    real_fsync, synced = results.os.fsync, []
    full: tuple[str, int] | None = None  # the file (by its name's end) and its sync that fails

    def fsync(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")
        synced.append(name)
        if full and name.endswith(full[0]) and sum(n.endswith(full[0]) for n in synced) == full[1]:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(results.os, "fsync", fsync)
    partial = out.with_name(out.name + ".partial")
    # the log's second chunk, the results file, the summary
    for name, sync, saved in ((".jsonl.partial", 2, 4), (".jsonl.tmp", 1, 10),
                              (".summary.json.partial", 1, 10)):
        full = (name, sync)  # read by fsync above
        synced.clear()
        result = _grade(data, out, model, "--chunk-size", "4")
        assert result.exit_code == EXIT_OUTPUT, result.output
        errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and "No space left on device (the disk is full" in errors[0]
        assert "Traceback" not in result.output
        assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.json.partial"))
        lines = partial.read_bytes().splitlines(keepends=True)
        assert len(lines) == saved and all(json.loads(line) for line in lines)
        assert not out.exists() and not summary_path(out).exists()
    full, sent = None, engine.sent
    assert _grade(data, out, model, "--chunk-size", "4").exit_code == 0
    assert _ids(out) == [f"q{i:02d}" for i in range(10)] and engine.sent == sent


def test_the_resume_index_keeps_8_byte_keys_and_the_later_record_of_a_key(tmp_path):
    from grader.io.results import ResultsLog

    out = tmp_path / "results.jsonl"
    keys = [f"{i:016x}" + "f" * 48 for i in (1, 2, 3)]
    final = [{"id": "a", "key": keys[0], "status": "ok"}, {"id": "b", "key": keys[1], "status": "ok"}]
    out.write_text("".join(json.dumps(r) + "\n" for r in final))
    partial = [
        {"id": "b", "key": keys[1], "status": "parse_error"},  # graded again: this one wins
        {"id": "c", "key": keys[2], "status": "engine_error"},  # retried, not reused
        {"id": "d", "key": "not a hash", "status": "ok"},  # another tool's: ignored
    ]
    text = "".join(json.dumps(r) + "\n" for r in partial)
    out.with_name(out.name + ".partial").write_text(text + '{"id": "e", "key": "to')  # torn
    log = ResultsLog(out)
    assert log.resumable == 2
    assert log.lookup(keys[0]) == (ResultsLog.FINAL, 0)
    assert log.lookup(keys[1]) == (ResultsLog.PARTIAL, 0)
    assert log.lookup(keys[2]) is None and log.lookup("not a hash") is None
    assert log.lookup(f"{4:016x}" + "f" * 48) is None
    assert out.with_name(out.name + ".partial").read_text() == text  # the torn line cut


def test_overwrite_replaces_the_earlier_log_only_when_it_writes(tmp_path, engine, model):
    data, out = _write(tmp_path / "data.jsonl", _rows(4)), tmp_path / "results.jsonl"
    partial = out.with_name(out.name + ".partial")
    saved = json.dumps({"id": "q00", "key": "f" * 64, "status": "ok"}) + "\n"
    partial.write_text(saved)
    # a duplicate id: found at the end of the first pass, after the log is opened
    _write(tmp_path / "bad.jsonl", _rows(2) + _rows(1))
    result = _grade(tmp_path / "bad.jsonl", out, model, "--overwrite")
    assert result.exit_code == EXIT_BAD_INPUT and partial.read_text() == saved  # nothing lost
    assert _grade(data, out, model, "--overwrite").exit_code == 0
    assert _ids(out) == ["q00", "q01", "q02", "q03"] and not partial.exists()
