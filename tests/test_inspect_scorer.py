"""grader inside inspect_ai (grader/inspect_scorer.py): the scorer in a Task and on a written log
(inspect_ai's own eval, score and `inspect score`), and `grader grade --write-inspect`, read
back with inspect_ai's own read_eval_log and samples_df.

The fast tests grade on the tiny model with a given rubric (the check pass only: short guided
answers, every one parses), so they spend seconds, not the drafts' minutes."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import math
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from conftest import ROOT, cli
from inspect_ai import Task, score
from inspect_ai import eval as inspect_eval
from inspect_ai.analysis import samples_df
from inspect_ai.dataset import Sample
from inspect_ai.log import read_eval_log, write_eval_log
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import match
from inspect_ai.solver import generate

from grader.errors import GraderError
from grader.io.results import read_records
from grader.judge.rubric import rubric_key

# Six questions with distinct references (the judge check needs five), one with no answer.
QA = [
    ("q1", "At what temperature does water boil at sea level?", "Water boils at 100 degrees Celsius at sea level.",
     "It boils at 100 degrees Celsius."),
    ("q2", "What is the capital of France?", "Paris is the capital of France.", "Paris."),
    ("q3", "How many legs does a spider have?", "A spider has eight legs.", "Spiders have six legs."),
    ("q4", "What gas do plants absorb?", "Plants absorb carbon dioxide from the air.", "Oxygen."),
    ("q5", "Who wrote Hamlet?", "William Shakespeare wrote Hamlet.", "Shakespeare wrote it."),
    ("q6", "What is the chemical formula of water?", "The formula of water is H2O.", ""),
]
VERDICT_KEYS = {"informative", "weak", "no_signal", "too_few"}


def _reply(messages, tools, tool_choice, config):
    # mockllm answers each question with the answer QA gives it; usage given, or mockllm
    # counts tokens with tiktoken, which downloads its encoding
    answers = {question: answer for _, question, _, answer in QA}
    output = ModelOutput.from_content(model="mockllm", content=answers[messages[-1].text])
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


def _task(scorer=None) -> Task:
    return Task(dataset=[Sample(id=i, input=q, target=r) for i, q, r, _ in QA],
                solver=[generate()], scorer=scorer or match(),
                model=get_model("mockllm/model", custom_outputs=_reply))


@pytest.fixture(scope="module")
def rubric(tmp_path_factory) -> Path:
    """Each reference's rubric, given: the tiny model only labels (grader grade --rubric)."""
    path = tmp_path_factory.mktemp("rubric") / "given.rubric.jsonl"
    lines = [{"key": rubric_key(q, r), "input": q, "reference": r,
              "facts": [r, f"The answer names {r.split()[-1]}"], "conclusions": [],
              "terms": [r.split()[0]]} for _, q, r, _ in QA]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """An inspect_ai log of QA, written by inspect_ai's eval with mockllm and match()."""
    logs = tmp_path_factory.mktemp("logs")
    [log] = inspect_eval(_task(), display="none", log_dir=str(logs))
    assert log.status == "success"
    [path] = logs.glob("*.eval")
    return path


def _settings(tiny_model: Path, rubric: Path, **more) -> dict:
    return {"model": str(tiny_model), "backend": "transformers", "rubric": str(rubric),
            "max_tokens": 32, **more}


def _value(score) -> float | None:
    return None if isinstance(score.value, float) and math.isnan(score.value) else score.value


def _check_score(score) -> None:
    """A grader score: its record's score with the rationale, or unscored with the reason."""
    status = score.metadata["status"]
    if status == "ok":
        assert score.value in range(6) and score.explanation.startswith("Fact: ")
        assert score.metadata["rubric_key"] and score.metadata["raw_output"]
    elif status == "missing_context":  # no answer: grader's 0, not sent
        assert score.value == 0 and score.reason == "no_response"
        assert score.metadata["raw_output"] is None
    else:
        assert _value(score) is None and score.reason == "grader_failed"
        assert score.explanation.startswith(status)


def test_scorer_in_a_task_batches_samples_into_one_loaded_model(tiny_model, rubric, tmp_path):
    from grader import inspect_scorer
    from grader.inspect_scorer import grader_scorer

    before = {key: (b.calls, b.rows) for key, b in inspect_scorer._BATCHERS.items()}
    scorer = grader_scorer(**_settings(tiny_model, rubric, controls=6))
    [log] = inspect_eval(_task(scorer), display="none", log_dir=str(tmp_path / "logs"))
    assert log.status == "success", log.error
    scores = {sample.id: sample.scores["reference_judge"] for sample in log.samples}
    assert set(scores) == {i for i, *_ in QA}
    for value in scores.values():
        _check_score(value)
    assert scores["q6"].metadata["status"] == "missing_context"
    # concurrent samples shared engine calls: fewer calls than rows
    [(key, batcher)] = [(k, b) for k, b in inspect_scorer._BATCHERS.items()
                        if (b.calls, b.rows) != before.get(k)]
    calls, rows = batcher.calls - before.get(key, (0, 0))[0], batcher.rows - before.get(key, (0, 0))[1]
    assert rows == len(QA) and calls < rows
    [result] = log.results.scores
    assert result.name == "reference_judge"
    ok = [v.value for v in scores.values() if _value(v) is not None]
    assert result.metrics["mean"].value == pytest.approx(sum(ok) / len(ok))
    verdicts = VERDICT_KEYS & set(result.metrics)
    assert len(verdicts) == 1, result.metrics  # the judge check: its verdict, its references
    assert result.metrics[verdicts.pop()].value == 6 - 1  # q6 has no answer: no controls
    assert {"p_value"} <= set(result.metrics)


def test_score_a_written_log_appends_beside_its_scores(written, tiny_model, rubric):
    from grader.inspect_scorer import reference_judge

    log = read_eval_log(str(written))
    scored = score(log, reference_judge(**_settings(tiny_model, rubric, controls=0)),
                   action="append", display="none")
    for sample in scored.samples:
        assert set(sample.scores) == {"match", "reference_judge"}
        _check_score(sample.scores["reference_judge"])
    assert [s.name for s in scored.results.scores] == ["match", "reference_judge"]
    # no controls, no judge check
    assert not VERDICT_KEYS & set(scored.results.scores[1].metrics)


def test_grade_write_inspect_is_a_scored_copy_inspect_reads(written, tiny_model, rubric, tmp_path):
    before = hashlib.sha256(written.read_bytes()).hexdigest()
    out, scored = tmp_path / "results.jsonl", tmp_path / "scored.eval"
    result = cli("grade", written, "-m", tiny_model, "--backend", "transformers", "--rubric",
                 rubric, "--max-tokens", 32, "--controls", 6, "-o", out, "--write-inspect", scored)
    assert result.exit_code == 0, result.output
    assert f"inspect log: {scored}" in result.output
    assert hashlib.sha256(written.read_bytes()).hexdigest() == before  # never modified
    records = {str(r.id): r for _, r in read_records(out)}
    log = read_eval_log(str(scored))
    assert len(log.samples) == len(QA)
    for sample in log.samples:
        assert set(sample.scores) == {"match", "grader"}
        grade = sample.scores["grader"]
        _check_score(grade)
        record = records[str(sample.id)]
        assert _value(grade) == record.score and grade.metadata["status"] == record.status
    names = [s.name for s in log.results.scores]
    assert names == ["match", "grader"]
    metrics = log.results.scores[1].metrics
    summary = json.loads((tmp_path / "results.summary.json").read_text())
    check = summary["judge_check"]
    assert metrics[check["verdict"].replace(" ", "_")].value == check["scored"]
    # inspect's mean counts the sample with no answer as grader scores it, 0 (the summary's
    # mean_score is over the ok rows)
    values = [r.score for r in records.values() if r.score is not None]
    assert metrics["mean"].value == pytest.approx(sum(values) / len(values))
    # inspect's own data frames: one grader score per sample, as the results hold them
    frame = samples_df(str(scored)).set_index("id")
    for sample_id, record in records.items():
        value = frame.loc[sample_id, "score_grader"]
        assert (record.score is None) == (value is None or value != value)
        if record.score is not None:
            assert float(value) == record.score


def test_the_scorer_and_grade_give_the_same_scores(written, tiny_model, rubric, tmp_path):
    """One judge, two doors: inspect's scorer on the log, grader grade on the same log."""
    from grader.inspect_scorer import reference_judge

    scored = score(read_eval_log(str(written)),
                   reference_judge(**_settings(tiny_model, rubric, controls=0)),
                   action="append", display="none")
    out = tmp_path / "results.jsonl"
    result = cli("grade", written, "-m", tiny_model, "--backend", "transformers", "--rubric",
                 rubric, "--max-tokens", 32, "--controls", 0, "-o", out)
    assert result.exit_code == 0, result.output
    records = {str(r.id): r for _, r in read_records(out)}
    for sample in scored.samples:
        grade, record = sample.scores["reference_judge"], records[str(sample.id)]
        assert (grade.metadata["status"], _value(grade), grade.metadata["raw_output"]) == (
            record.status, record.score, record.raw_output)


def test_scorer_settings_are_checked_before_any_model_work(tiny_model):
    from grader.inspect_scorer import reference_judge

    with pytest.raises(GraderError, match="unknown setting temprature") as caught:
        reference_judge(model=str(tiny_model), temprature=0.7)
    assert caught.value.exit_code == 2
    with pytest.raises(GraderError, match="max-tokens"):
        reference_judge(model=str(tiny_model), max_tokens="many")
    with pytest.raises(GraderError, match="pairwise"):
        reference_judge(model=str(tiny_model), format="pairwise")
    with pytest.raises(GraderError, match="controls"):
        reference_judge(model=str(tiny_model), controls="many")
    # inspect's -S max-tokens=64 spells it with a dash
    reference_judge(model=str(tiny_model), **{"max-tokens": 64, "backend": "transformers"})


def _one_line(result, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_write_inspect_refuses_what_it_cannot_write(written, tiny_model, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"id": 1, "input": "q", "reference": "r", "output_text": "a"}) + "\n")
    args = ["-m", tiny_model, "-o", tmp_path / "r.jsonl"]
    assert "is not an inspect_ai log" in _one_line(
        cli("grade", data, *args, "--write-inspect", tmp_path / "o.eval"))
    assert "never modifies" in _one_line(cli("grade", written, *args, "--write-inspect", written))
    assert "named .eval or .json" in _one_line(
        cli("grade", written, *args, "--write-inspect", tmp_path / "o.jsonl"))
    assert "--id-column" in _one_line(
        cli("grade", written, *args, "--id-column", "sample_id", "--write-inspect", tmp_path / "o.eval"))
    assert not (tmp_path / "r.jsonl").exists()


def test_write_inspect_refuses_a_file_already_there(written, tiny_model, tmp_path):
    # grader.io.outputs: a log there may be anyone's (not told apart by its bytes): kept,
    # before any model work, unless --overwrite
    there = tmp_path / "o.eval"
    there.write_bytes(b"someone's log")
    result = cli("grade", written, "-m", tiny_model, "-o", tmp_path / "r.jsonl",
                 "--write-inspect", there)
    assert result.exit_code == 2 and "--overwrite" in _one_line(result) and str(there) in _one_line(result)
    assert there.read_bytes() == b"someone's log" and not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize("suffix", [".eval", ".json"])
def test_a_log_without_samples_is_one_line(written, tiny_model, tmp_path, suffix):
    log = read_eval_log(str(written))
    log.samples = None if suffix == ".eval" else []
    empty = tmp_path / f"empty{suffix}"
    write_eval_log(log, str(empty))
    result = cli("grade", empty, "-m", tiny_model, "-o", tmp_path / "r.jsonl",
                 "--write-inspect", tmp_path / "out.eval")
    assert _one_line(result) == f"error: {empty}: no rows"
    assert not (tmp_path / "out.eval").exists()


def test_the_entry_point_is_declared():
    """pyproject.toml registers grader with inspect_ai (the next test runs it where installed)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["inspect_ai"] == {"grader": "grader._registry"}


def _installed_here() -> bool:
    """grader's installed metadata is this tree's (pip install -e .), with its entry point."""
    try:
        found = importlib.metadata.distribution("grader").read_text("direct_url.json") or ""
    except importlib.metadata.PackageNotFoundError:
        return False
    return Path(json.loads(found).get("url", "").removeprefix("file://")) == ROOT and any(
        ep.name == "grader" for ep in importlib.metadata.entry_points(group="inspect_ai"))


@pytest.mark.skipif(not _installed_here(), reason="grader's installed metadata is another tree's: "
                    "`pip install -e .` here gives inspect_ai the entry point")
def test_inspect_score_finds_the_scorer_by_its_entry_point(written, tiny_model, rubric, tmp_path):
    out = tmp_path / "scored.eval"
    options = [f"-S{k}={v}" for k, v in _settings(tiny_model, rubric, controls=0).items()]
    done = subprocess.run(
        [sys.executable, "-m", "inspect_ai", "score", str(written), "--scorer",
         "grader/reference_judge", *options, "--action", "append", "--output-file", str(out),
         "--display", "none"],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    log = read_eval_log(str(out))
    for sample in log.samples:
        _check_score(sample.scores["reference_judge"])
    assert [s.name for s in log.results.scores] == ["match", "reference_judge"]


@pytest.mark.slow
def test_the_real_judge_scores_a_task(judge_model, tmp_path):
    """SmolLM2 as inspect's scorer: the rubric drafted once per reference, then the labels;
    grader's statuses and the judge check in the log (run under the engine lock)."""
    from grader.inspect_scorer import grader_scorer

    rows = [json.loads(line) for line in (ROOT / "examples" / "qa.jsonl").read_text().splitlines()]
    # 2 rows: SmolLM2 on transformers drafts at a few tokens a second on 2 CPU cores, and CI
    # runs this test; the judge check's own rows are the tiny model tests' (too few here)
    rows = [row for row in rows if row.get("reference") and row.get("output_text")][:2]
    answers = {row["input"]: row["output_text"] for row in rows}

    def reply(messages, tools, tool_choice, config):
        output = ModelOutput.from_content(model="mockllm", content=answers[messages[-1].text])
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output

    task = Task(dataset=[Sample(id=str(row["id"]), input=row["input"], target=row["reference"])
                         for row in rows], solver=[generate()],
                scorer=grader_scorer(model=str(judge_model), backend="transformers", controls=2),
                model=get_model("mockllm/model", custom_outputs=reply))
    [log] = inspect_eval(task, display="none", log_dir=str(tmp_path / "logs"))
    assert log.status == "success", log.error
    statuses = []
    for sample in log.samples:
        grade = sample.scores["reference_judge"]
        _check_score(grade)
        statuses.append(grade.metadata["status"])
        if grade.metadata["status"] == "ok":
            assert grade.metadata["format"] == "rubric" and grade.metadata["items"]
    assert "ok" in statuses, statuses  # the judged branch above was reached
    metrics = log.results.scores[0].metrics
    assert len(VERDICT_KEYS & set(metrics)) == 1, metrics
