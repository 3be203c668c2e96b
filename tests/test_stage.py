"""The run drives a judge's preparation stage (grader.run.stage.Stage) without knowing what it
makes: a stage of a test's own is fed pass 1's rows, makes its values once, is resumed, and
its manifest entry is written and carried by rescore, as the rubric stage's are."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
from conftest import FakeBackend, cli, make_request

from grader.io.dataset import Item
from grader.io.manifest import StageEntry
from grader.io.outputs import Kind
from grader.io.results import read_records, read_summary
from grader.judge.judges import ItemizedJudge, Judge, StageRef
from grader.run import grading
from grader.run.executor import Executor
from grader.run.request import GradeRequest
from grader.run.rows import prepare_jobs
from grader.run.stage import Checks, Prepared, Stage


class HintJudge(ItemizedJudge):
    """The itemized judge, with a hint per reference that a stage makes before any row."""

    stage = StageRef("hint", "test_stage:HintStage")

    def __init__(self) -> None:
        super().__init__()
        self.hints: Mapping[str, str] = {}

    def context(self, item: Item) -> Mapping[str, Any] | None:
        hint = self.hints.get(str(item.fields.get("reference")))
        if hint is None:
            return None
        return {**item.fields, "reference": f"{item.fields['reference']} [{hint}]"}


class HintEntry(StageEntry, kw_only=True):
    name: ClassVar[str] = "hint"
    hints: int


class HintFiles:
    kind = Kind.STAGE

    def given_file(self, request: GradeRequest) -> str | None:
        return None

    def given_lines(self, request: GradeRequest) -> dict[str, str]:
        return {}

    def shared(self, request: GradeRequest, first: Path, output: Path) -> GradeRequest:
        return request


class HintStage(Stage[str]):
    name = "hint"
    files = HintFiles()
    made: list[str] = []  # every hint made, across runs (the test's record)

    def __init__(self, request: GradeRequest, judge: Judge, path: str, *,
                 output: Path | None = None, overwrite: bool = False,
                 kept: Mapping[str, str] | None = None,
                 given: Mapping[str, str] | None = None) -> None:
        assert isinstance(judge, HintJudge) and output is not None  # a file run's
        self.judge, self.file = judge, output
        self.hints: dict[str, str] = {}
        if self.file.exists():  # an earlier run's
            self.hints = {line["key"]: line["hint"]
                          for line in map(json.loads, self.file.read_text().splitlines())}
        self.keys: list[str] = []

    @staticmethod
    def beside(results: Path) -> Path:
        return results.with_name(results.name.removesuffix(".jsonl") + ".hint.jsonl")

    @classmethod
    def preview(cls, path: str, items: list[Item], judge: Judge) -> list[Any]:
        return prepare_jobs(path, items, judge)

    def add(self, item: Item) -> str | None:
        key = str(item.fields.get("reference"))
        if key not in self.keys:
            self.keys.append(key)
        return key

    def known(self, key: str) -> str | None:
        return self.hints.get(key)

    def judge_of(self, key: str, known: str) -> Judge:
        return self._judge({key: known})

    def _judge(self, hints: dict[str, str]) -> HintJudge:
        judge = copy.copy(self.judge)
        judge.hints = hints
        return judge

    def run(self, executor: Executor, start_engine: Callable[[], None],
            checks: Checks | None = None) -> Prepared:
        for key in self.keys:
            if key not in self.hints:
                self.hints[key] = f"hint {len(self.hints)}"
                self.made.append(key)
        self.file.write_text("".join(json.dumps({"key": k, "hint": h}) + "\n"
                                     for k, h in self.hints.items()))
        return Prepared(self._judge(dict(self.hints)), HintEntry(hints=len(self.hints)),
                        lambda key: True)

    @property
    def lines(self) -> Mapping[str, str]:
        return dict(self.hints)


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"id": i, "input": "q", "reference": f"ref {i % 2}",
                                        "output_text": f"answer {i}"}) + "\n" for i in range(4)))
    return path


@pytest.fixture
def hinted(monkeypatch: pytest.MonkeyPatch) -> list[FakeBackend]:
    HintStage.made.clear()
    monkeypatch.setattr(grading, "judge_for", lambda request: HintJudge())
    return []


def _grade(tmp_path: Path, made: list[FakeBackend]) -> dict[str, Any]:
    def factory(name: str, **options: Any) -> FakeBackend:
        made.append(FakeBackend())
        return made[-1]

    return grading.run_grade(*make_request(_data(tmp_path), format="itemized"),
                             backend_factory=factory)


def test_the_run_drives_a_stage_it_does_not_know(tmp_path: Path, hinted: list[FakeBackend]) -> None:
    summary = _grade(tmp_path, hinted)
    # made once per group key, from pass 1's rows; the rows rendered from what it made
    assert HintStage.made == ["ref 0", "ref 1"]
    sent = [json.dumps(conversation) for call in hinted[0].calls for conversation in call]
    assert len(sent) == 4 and all("[hint " in text for text in sent)
    assert summary["run"]["hint"] == {"hints": 2}  # its manifest entry, under its name
    assert summary.manifest.entry(HintEntry) == HintEntry(hints=2)  # read back typed
    assert (tmp_path / "results.hint.jsonl").is_file()
    assert len(list(read_records(tmp_path / "results.jsonl"))) == 4

    # a rerun: the stage knows every key from its file, so pass 1 counts every row resumed
    # and no model loads
    again = _grade(tmp_path, hinted)
    assert len(hinted) == 1 and HintStage.made == ["ref 0", "ref 1"]
    assert again["run"]["resumed_rows"] == 4


def _rescored_run(tmp_path: Path, name: str = "again.jsonl") -> dict[str, Any]:
    result = cli("rescore", tmp_path / "results.jsonl", "-o", tmp_path / name)
    assert result.exit_code == 0, result.output
    summary = read_summary(tmp_path / name)
    assert summary is not None
    run: dict[str, Any] = summary["run"]
    return run


def test_rescore_carries_the_stage_entry_of_the_run_that_graded(tmp_path: Path) -> None:
    # the rubric format's stage: its entry as the grade run wrote it
    graded = grading.run_grade(*make_request(_data(tmp_path)),
                               backend_factory=lambda name, **options: FakeBackend())
    assert _rescored_run(tmp_path)["rubric"] == graded["run"]["rubric"]
    # a file whose summary is gone: the entry is there, unknown
    (tmp_path / "results.summary.json").unlink()
    assert _rescored_run(tmp_path, "bare.jsonl")["rubric"] is None


def test_rescore_of_a_format_without_a_stage_adds_no_entry(tmp_path: Path) -> None:
    grading.run_grade(*make_request(_data(tmp_path), format="itemized"),
                      backend_factory=lambda name, **options: FakeBackend())
    (tmp_path / "results.summary.json").unlink()
    assert "rubric" not in _rescored_run(tmp_path)
