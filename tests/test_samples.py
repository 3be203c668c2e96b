"""Self-consistency: N samples per row in one engine call, aggregated, with their spread."""

from __future__ import annotations

import json

import pytest
from answers import answer
from conftest import EXAMPLES, FakeBackend, check_answer, cli, make_request

from grader.backends import Completion
from grader.config import SamplingConfig
from grader.io.results import read_records
from grader.run.grading import run_grade
from grader.run.rescore import rescore

# check-pass answers whose recomputed scores are 5, 4, 3, 2 (the fake rubric: 2 facts, 1 term;
# 5 × (0.7 × facts/2 + 0.21 × terms + 0.09 × organization matched))
SCORED = {5: check_answer("yyy"), 4: check_answer("yyn"), 3: check_answer("nyy"),
          2: check_answer("ynn")}  # 3.95, 3.25, 2.2


class SamplingJudge(FakeBackend):
    """A fake engine returning ``n`` completions per judged conversation, flat, row by row."""

    def __init__(self, per_row):
        super().__init__(chunk_size=8)
        self.per_row = per_row

    def reply(self, conversations, schemas=None):
        if schemas and all(s["title"] == "RubricDraft" for s in schemas):
            # the rubric pass samples as often: the same draft each time
            drafts = super().reply(conversations, schemas)
            return [draft for draft in drafts for _ in self.per_row]
        self.calls.append(len(conversations))
        return [reply if isinstance(reply, Completion) else Completion(reply, "stop", 1, 1)
                for _ in conversations for reply in self.per_row]


def _run(tmp_path, per_row, aggregate="median", n=None, **request):
    rows = tmp_path / "d.jsonl"
    rows.write_text(json.dumps({"id": "a", "reference": "r", "output_text": "o"}) + "\n")
    judge = SamplingJudge(per_row)
    out = tmp_path / "r.jsonl"
    run_grade(
        *make_request(rows, out, aggregate=aggregate,
                     sampling=SamplingConfig(temperature=0.7, n=n or len(per_row)), **request),
        backend_factory=lambda name, **options: judge,
    )
    [(_, record)] = list(read_records(out))
    return record, judge


@pytest.mark.parametrize(
    ("scores", "aggregate", "expected", "exact"),
    [
        ((5, 4, 2), "median", 4, 4.0),
        ((5, 4, 3, 2), "median", 4, 3.5),  # mean of the middle two, rounded half up
        ((5, 4, 2), "mean", 4, 11 / 3),
        ((5, 3, 3, 5), "majority", 3, 3.0),  # a tie goes to the lower score
    ],
)
def test_samples_are_aggregated_exactly(tmp_path, scores, aggregate, expected, exact):
    record, judge = _run(tmp_path, [SCORED[s] for s in scores], aggregate)
    assert judge.calls == [1]  # one engine call for all samples of the row
    assert record.score == expected and record.score_exact == pytest.approx(exact)
    assert record.aggregate == aggregate
    assert [s.score for s in record.samples] == list(scores)
    assert record.spread["range"] == max(scores) - min(scores)
    assert record.spread["n"] == len(scores)
    # grade and counts are those of a real sample, consistent with each other
    assert record.grade["score"] in scores


def test_a_failed_sample_is_kept_and_the_others_still_count(tmp_path):
    record, _ = _run(
        tmp_path, [SCORED[5], "not json", SCORED[2], Completion(SCORED[4], "length", 1, 9)]
    )
    assert record.status == "ok" and record.score == 4  # median of 5 and 2, half up
    assert [s.status for s in record.samples] == ["ok", "parse_error", "ok", "truncated"]
    assert record.spread["n"] == 2


def test_a_row_whose_samples_all_fail_has_no_score(tmp_path):
    record, _ = _run(tmp_path, ["nope", "nope"])
    assert record.status == "parse_error" and record.score is None
    assert record.spread["n"] == 0


@pytest.mark.parametrize("answer_format, replies", [
    ("seed", [answer(facts=(4, 4), terms=(4, 4)), answer(facts=(3, 4)), "oops"]),
    (None, [SCORED[5], SCORED[4], "oops"]),
])
def test_rescore_reaggregates_each_sample(tmp_path, answer_format, replies):
    record, _ = _run(tmp_path, replies, format=answer_format)
    assert record.score == 5 and record.spread["n"] == 2
    summary = rescore(tmp_path / "r.jsonl", tmp_path / "again.jsonl")
    [(_, again)] = list(read_records(tmp_path / "again.jsonl"))
    assert again == record and summary["mean_score"] == record.score


def test_samples_without_temperature_are_refused_with_a_reason(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    result = cli("grade", EXAMPLES / "qa.jsonl", "--model", tmp_path, "-o", "r.jsonl", "--samples", 3)
    assert result.exit_code == 2
    assert "3 samples per row need a temperature above 0" in result.output


@pytest.mark.slow
def test_the_tiny_model_draws_several_samples_per_row(tiny_model, tmp_path):
    out = tmp_path / "r.jsonl"
    result = cli("grade", EXAMPLES / "qa.jsonl", "--model", tiny_model, "-o", out, "--limit", 4,
                 "--format", "seed", "--no-checklist", "--samples", 3, "--temperature", 1,
                 "--aggregate", "mean")
    assert result.exit_code == 0, result.output
    records = [r for _, r in read_records(out)]
    for record in records:
        assert len(record.samples) == 3 and record.aggregate == "mean"
        assert all(s.finish_reason == "stop" for s in record.samples)
    raw = [s.raw_output for r in records for s in r.samples]
    assert len(set(raw)) > len(records)  # sampling: the samples of a row differ
