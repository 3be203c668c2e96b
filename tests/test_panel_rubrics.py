"""A judge panel's one rubric where the first judge's rubric file lacks a reference: a
``--rubric FILE`` without it (the first judge drafts it, the later judges mark FILE and that
draft together), or a draft of the first judge that failed (each later judge drafts its own;
a judge whose items are not the panel's votes for neither, and nothing crashes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import FakeBackend, make_request

from grader.analysis.panel import OWN_ITEMS
from grader.backends import Completion
from grader.io.results import read_records
from grader.run.grading import run_grade
from grader.run.panel import PanelJudge, run_panel


def _draft(*facts: str) -> dict[str, Any]:
    return {"facts": list(facts), "conclusions": [], "terms": []}


class Drafters:
    """A backend factory: each model drafts its own rubric (or fails to) and labels every
    item present."""

    def __init__(self, drafts: dict[str, Any]):
        self.drafts = drafts
        self.backends: dict[str, FakeBackend] = {}

    def __call__(self, name: str, *, model: str, sampling: Any, **options: Any) -> FakeBackend:
        self.backends[model] = FakeBackend(draft=self.drafts[model], labels="y")
        return self.backends[model]


def _data(tmp_path: Path, references: int, name: str = "data.jsonl") -> Path:
    data = tmp_path / name
    data.write_text("".join(json.dumps({"id": f"r{i}", "reference": f"ref {i}",
                                        "output_text": f"out {i}"}) + "\n"
                            for i in range(references)))
    return data


def _records(path: Path) -> list[dict]:
    return [record.to_dict() for _, record in read_records(path)]


FAILED = Completion('{"facts": ["cut', "length", 10, 5)  # a draft cut at max_tokens


def test_a_rubric_file_lacking_a_reference_gives_every_judge_the_first_judges_draft(tmp_path):
    # FILE: the rubric of reference 0 only, drafted beforehand by another run
    given = make_request(_data(tmp_path, 1, "first.jsonl"), tmp_path / "given.jsonl")
    run_grade(*given, None, backend_factory=lambda name, **o: FakeBackend(draft=_draft("f0")))
    rubric = tmp_path / "given.rubric.jsonl"
    drafters = Drafters({"a": _draft("a1", "a2"), "b": _draft("b1"), "c": _draft("c1")})
    request, job = make_request(_data(tmp_path, 2), tmp_path / "out.jsonl", rubric=str(rubric))
    summary = run_panel(request, job, [PanelJudge(m) for m in "abc"], backend_factory=drafters)
    # the first judge drafted reference 1; the later ones drafted nothing
    assert len(drafters.backends["a"].rubric_calls) == 1
    assert drafters.backends["b"].rubric_calls == drafters.backends["c"].rubric_calls == []
    pooled = _records(tmp_path / "out.jsonl")
    assert [r["rubric"]["facts"] for r in pooled] == [["f0"], ["a1", "a2"]]
    assert [r["panel"]["answered"] for r in pooled] == [3, 3]
    assert summary["statuses"]["ok"] == 2
    assert summary["run"]["rubric_file"] == str(tmp_path / "out.panel-rubric.jsonl")


def test_a_failed_first_draft_leaves_later_judges_with_rubrics_of_their_own(tmp_path):
    drafters = Drafters({"a": FAILED, "b": _draft("b1"), "c": _draft("c1", "c2")})
    request, job = make_request(_data(tmp_path, 2), tmp_path / "out.jsonl")
    summary = run_panel(request, job, [PanelJudge(m) for m in "abc"], backend_factory=drafters)
    pooled = _records(tmp_path / "out.jsonl")
    # judge-1 failed, judge-3's items are not the panel's (judge-2's): 1 of 3 answered
    assert [(r["status"], r["score"]) for r in pooled] == [("truncated", None)] * 2
    judges = pooled[0]["panel"]["judges"]
    assert [(j["status"], j["labels"]) for j in judges] == [
        ("truncated", None), ("ok", "y"), ("ok", None)]
    assert judges[2]["error"] == OWN_ITEMS
    assert pooled[0]["error"].startswith("only 1 of 3 judges answered")
    assert summary["panel"]["per_judge"][2]["rows"] == 0


def test_later_judges_that_drafted_the_same_rubric_still_pool(tmp_path):
    drafters = Drafters({"a": FAILED, "b": _draft("x"), "c": _draft("x")})
    request, job = make_request(_data(tmp_path, 1), tmp_path / "out.jsonl")
    run_panel(request, job, [PanelJudge(m) for m in "abc"], backend_factory=drafters)
    (pooled,) = _records(tmp_path / "out.jsonl")
    assert (pooled["status"], pooled["panel"]["answered"]) == ("ok", 2)
    assert pooled["score"] == 5  # the one fact present, organization matched


def test_a_single_judges_results_at_the_output_are_kept_unless_overwrite(tmp_path):
    import pytest

    from grader.run.owner import ResultsOwned

    data = _data(tmp_path, 2)
    single = make_request(data, tmp_path / "out.jsonl")
    run_grade(*single, None, backend_factory=lambda name, **o: FakeBackend())
    before = (tmp_path / "out.jsonl").read_bytes()
    drafters = Drafters({"a": _draft("x"), "b": _draft("x")})
    with pytest.raises(ResultsOwned, match="holds the results of a run that is not a judge panel"):
        run_panel(*make_request(data, tmp_path / "out.jsonl"), [PanelJudge("a"), PanelJudge("b")],
                  backend_factory=drafters)
    assert drafters.backends == {}  # refused before any judge loaded
    assert (tmp_path / "out.jsonl").read_bytes() == before
    # the panel's own pooled results are rewritten by a rerun; --overwrite replaces the single's
    run_panel(*make_request(data, tmp_path / "out.jsonl", overwrite=True),
              [PanelJudge("a"), PanelJudge("b")], backend_factory=drafters)
    summary = run_panel(*make_request(data, tmp_path / "out.jsonl"),
                        [PanelJudge("a"), PanelJudge("b")], backend_factory=drafters)
    assert [run["resumed_rows"] for run in summary["run"]["panel"]] == [2, 2]
