"""``grader.Grader.grade`` over the in-memory core (grader.run.core, issue 31): no file, no
lock, no temporary folder; the records a file run writes; calls from two threads take turns;
a rubric drafted in one call is reused by the next."""

from __future__ import annotations

import builtins
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
from conftest import FakeBackend, cli

import grader
from grader.io.results import read_records

REFERENCES = 6  # more than the controls' minimum: they run, and their verdict is computed


def _rows(name: str = "m", references: int = REFERENCES) -> list[dict[str, Any]]:
    return [{"id": f"{name}-{q}-{a}", "input": f"question {q}",
             "reference": f"The answer to question {q} is {q}.",
             "output_text": f"{name}'s answer {a} to {q}"}
            for q in range(references) for a in range(2)]


class Backends:
    """The API's test hook: its executors load these fakes (and count the calls in flight)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay: float = 0.0) -> None:
        from grader.run import grading

        self.made: list[FakeBackend] = []
        self.delay, self.in_flight, self.most = delay, 0, 0
        made = grading.make_executor
        monkeypatch.setattr("grader.api.make_executor",
                            lambda *a: made(*a, backend_factory=self.load))

    def load(self, name: str, **options: Any) -> FakeBackend:
        backends = self

        class Slow(FakeBackend):
            def reply(self, conversations, schemas=None):
                backends.in_flight += 1
                backends.most = max(backends.most, backends.in_flight)
                try:
                    time.sleep(backends.delay)
                    return super().reply(conversations, schemas)
                finally:
                    backends.in_flight -= 1

        self.made.append(Slow(chunk_size=4))
        return self.made[-1]


def _no_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any file opened for writing, any temporary file or folder, fails the test."""
    real_open, real_os_open = builtins.open, os.open

    def guarded_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        if any(flag in mode for flag in "wax+"):
            raise AssertionError(f"opened {file} for writing")
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise AssertionError(f"opened {path} for writing")
        return real_os_open(path, flags, *args, **kwargs)

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a temporary file or folder")

    monkeypatch.setattr(builtins, "open", guarded_open)
    monkeypatch.setattr(os, "open", guarded_os_open)
    for name in ("mkstemp", "mkdtemp", "TemporaryDirectory", "NamedTemporaryFile",
                 "TemporaryFile", "SpooledTemporaryFile"):
        monkeypatch.setattr(tempfile, name, refused)


def test_grade_touches_no_file_and_gives_a_file_runs_records(tmp_path, model, monkeypatch):
    backends = Backends(monkeypatch)
    rows = _rows()
    # the same rows graded by `grader grade` into a file, first
    data, out = tmp_path / "d.jsonl", tmp_path / "r.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    monkeypatch.setattr("grader.backends.load_backend", backends.load)
    assert cli("grade", data, "-o", out, "-m", model, "--backend", "transformers").exit_code == 0
    from_file = [r.to_dict() for _, r in read_records(out)]
    file_check = json.loads(out.with_name("r.summary.json").read_text())["judge_check"]

    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    monkeypatch.setenv("TMPDIR", str(empty))
    monkeypatch.setattr(tempfile, "tempdir", str(empty))
    _no_writes(monkeypatch)
    with grader.Grader(str(model)) as judge:
        records = judge.grade(rows)
        check = judge.judge_check
    assert list(empty.iterdir()) == []
    # the records a file run writes, resume keys (the rendered prompts' hash) included
    assert [r.to_dict() for r in records] == from_file
    # the controls' verdict, computed in memory, is the file run's
    assert check is not None and check.controls and check.controls.file is None
    assert msgspec.to_builtins(check) | {"controls": None} == file_check | {"controls": None}
    assert check.controls.rows == 3 * REFERENCES


def test_two_threads_sharing_a_grader_take_turns_and_get_their_own_records(model, monkeypatch):
    backends = Backends(monkeypatch, delay=0.02)
    results: dict[str, list[Any]] = {}
    errors: list[BaseException] = []
    with grader.Grader(str(model), format="rubric") as judge:

        def grade(name: str) -> None:
            try:
                results[name] = judge.grade(_rows(name))
            except BaseException as exc:  # noqa: BLE001  (reported below, in the test's thread)
                errors.append(exc)

        threads = [threading.Thread(target=grade, args=(name,)) for name in ("a", "b", "c")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    assert backends.most == 1  # never two calls on the one model at once
    assert len(backends.made) == 1  # loaded once
    for name, records in results.items():
        assert [r.id for r in records] == [row["id"] for row in _rows(name)]
        assert {r.status for r in records} == {"ok"}
    # one rubric per reference for all three: drafted by the first call, reused by the others
    drafts = sum(len(call) for call in backends.made[0].rubric_calls)
    assert drafts == REFERENCES


def test_the_rubrics_of_one_call_are_reused_by_the_next_and_never_changed(model, monkeypatch,
                                                                           tmp_path):
    backends = Backends(monkeypatch)
    with grader.Grader(str(model)) as judge:
        first = judge.grade(_rows("a", references=2))
        assert judge._core is not None
        after_first = judge._core.prepared_lines
        kept = {key: msgspec.to_builtins(line) for key, line in after_first.items()}
        second = judge.grade(_rows("b", references=3))
        after_second = judge._core.prepared_lines
        saved = judge.save_rubric(tmp_path / "saved.rubric.jsonl")
    # call 2 drafted only the reference call 1 had not seen
    assert [len(call) for call in backends.made[0].rubric_calls] == [2, 1]
    assert [r.rubric for r in first] == [r.rubric for r in second[:4]]
    # a new mapping per call; the first one is as it was, and read-only
    assert after_second is not after_first and len(after_first) == 2 and len(after_second) == 3
    assert {key: msgspec.to_builtins(line) for key, line in after_first.items()} == kept
    with pytest.raises(TypeError):
        after_first["x"] = {}  # type: ignore[index]
    from grader.io.rubric_file import read_rubric_file

    assert set(read_rubric_file(saved)) == set(after_second)


def test_rows_in_memory_start_their_checks_ahead_on_a_backend_that_streams(model, monkeypatch):
    """The stream the file run uses runs ahead in memory too: as each reference's draft is
    read, its rows' checks start on the same stream, and the check pass sends none again."""
    from grader.run import grading

    class Streaming(FakeBackend):
        supports_streaming = True

    made: list[FakeBackend] = []
    executor = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor", lambda *a: executor(
        *a, backend_factory=lambda name, **o: made.append(Streaming(chunk_size=512)) or made[-1]))
    with grader.Grader(str(model), controls=0) as judge:
        records = judge.grade(_rows("a", references=2))
    assert {r.status for r in records} == {"ok"}
    # one call per reference, started as its draft was read (not one call of the 4 rows)
    assert sorted(len(call) for call in made[0].calls) == [2, 2]


def test_a_grader_of_several_models_is_an_in_memory_panel_with_a_file_panels_records(
        tmp_path, monkeypatch):
    from conftest import check_answer, make_request

    from grader.run.panel import PanelJudge, run_panel

    scripts = {"a": ["yny", "yyy", "nnn", "yyy"], "b": ["yyy", "oops", "nny", "yyy"],
               "c": ["yyy", "nyy", "nnn", "nyn"]}
    models = []
    for name in scripts:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        models.append(str(tmp_path / name))

    def factory(name: str, *, model: str, **options: Any) -> FakeBackend:
        script = scripts[Path(model).name]
        return FakeBackend([check_answer(r) if len(r) == 3 else r for r in script])

    rows = [{"id": f"r{i}", "input": f"q{i % 2}", "reference": f"ref {i % 2}",
             "output_text": f"out {i}"} for i in range(4)]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out.jsonl"
    summary = run_panel(*make_request(data, out), [PanelJudge(m) for m in models],
                        backend_factory=factory)
    from_file = [r.to_dict() for _, r in read_records(out)]

    from grader.run import grading

    made = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor", lambda *a: made(*a, backend_factory=factory))
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    _no_writes(monkeypatch)
    with grader.Grader(models) as panel:
        records = panel.grade(rows)
        agreement = panel.panel
    assert list(empty.iterdir()) == []
    assert [r.to_dict() for r in records] == from_file
    assert agreement == summary["panel"]
