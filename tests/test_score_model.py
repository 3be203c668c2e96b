"""OpenAI score_model grader configs on the local judge: schema, records, pass rate, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, ROOT, make_request

from grader.cli import main
from grader.io.results import read_records
from grader.judge.judges import ScoreModelJudge
from grader.judge.score_model import GraderConfigError, load_grader_config
from grader.run.grading import run_grade
from grader.run.rescore import rescore

CONFIG = ROOT / "tests" / "data" / "score_model_grader.json"


def _config(tmp_path: Path, **changes) -> Path:
    data = json.loads(CONFIG.read_text()) | changes
    path = tmp_path / "grader.json"
    path.write_text(json.dumps(data))
    return path


def test_the_config_becomes_a_prompt_a_bounded_schema_and_sampling():
    import xgrammar as xgr  # here, not at collection: importing it (and torch) costs seconds
    from xgrammar.testing import _is_grammar_accept_string

    grader = load_grader_config(CONFIG)
    judge = ScoreModelJudge(str(CONFIG))
    assert judge.prompt.roles == ("system", "user")
    messages = [t.render(item={"input": "Q", "reference": "R"}, sample={"output_text": "A"})
                for t in judge.prompt.templates]
    assert messages[1] == "Question: Q\nReference: R\nAnswer: A"
    assert grader.sampling_overrides() == {"temperature": 0.2, "seed": 42, "max_tokens": 48}
    compiled = xgr.Grammar.from_json_schema(
        json.dumps(judge.schema), any_whitespace=False, separators=(",", ":")
    )
    accepts = {t: _is_grammar_accept_string(compiled, t) for t in
               ('{"result":1}', '{"result":6.5}', '{"result":7}', '{"result":0.5}', '{"result":8}',
                '{"result":"5"}', '{"score":5}')}
    assert accepts == {'{"result":1}': True, '{"result":6.5}': True, '{"result":7}': True,
                       '{"result":0.5}': False, '{"result":8}': False, '{"result":"5"}': False,
                       '{"score":5}': False}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"type": "string_check"}, "grader type 'string_check' is not supported"),
        ({"range": [5, 1]}, "range must be [low, high] with low < high"),
        ({"input": []}, "input is empty"),
        ({"input": [{"role": "user", "content": "{{ item.x "}]}, "input[0].content line 1"),
        ({"bogus": 1}, "bogus: Extra inputs are not permitted"),
    ],
)
def test_a_bad_config_is_one_line_naming_the_file(tmp_path, changes, message):
    path = _config(tmp_path, **changes)
    with pytest.raises(GraderConfigError) as info:
        load_grader_config(path)
    assert message in str(info.value) and str(path) in str(info.value)
    assert "\n" not in str(info.value)


def _grade(tmp_path, fake_backend_factory, replies, **request):
    fake_backend_factory.replies = replies
    out = tmp_path / "r.jsonl"
    summary = run_grade(
        *make_request(EXAMPLES / "qa.jsonl", out, limit=10, grader_config=str(CONFIG), **request),
        backend_factory=fake_backend_factory,
    )
    return summary, {r.id: r for _, r in read_records(out)}


def test_records_carry_the_result_and_pass_fail_and_the_summary_the_pass_rate(
    tmp_path, fake_backend_factory
):
    # q10 has no output_text: not sent; 9 rows get these answers in order
    replies = ['{"result":6}', '{"result":2.5}', '{"result":5}', '{"result":9}', "oops",
               '{"result":7}', '{"result":1}', '{"result":5.5}', '{"result":3}']
    summary, records = _grade(tmp_path, fake_backend_factory, replies)
    assert (records["q01"].result, records["q01"].passed) == (6, True)
    assert (records["q02"].result, records["q02"].passed) == (2.5, False)
    assert records["q03"].passed is True  # 5 >= pass_threshold 5
    assert records["q04"].status == "invalid_counts" and records["q04"].result is None
    assert records["q05"].status == "parse_error" and records["q05"].passed is None
    assert records["q10"].status == "missing_context" and records["q10"].result is None
    assert not records["q01"].has("score") and not records["q01"].has("grade")
    graded = summary["score_model"]
    assert (graded["passed"], graded["judged"]) == (4, 7)
    assert graded["pass_rate"] == round(4 / 7, 4)
    assert summary["run"]["judge"]["type"] == "score_model"
    assert summary["run"]["sampling"]["max_tokens"] == 64  # the schema's bound, not 1505
    # the conversation is the config's, not the seed's
    sent = fake_backend_factory.backend.calls[0][0]
    assert sent[0] == {"role": "system", "content": "You grade answers against a reference. Return a score between 1 and 7."}


def test_rescoring_score_model_records_needs_the_config(tmp_path, fake_backend_factory):
    _, records = _grade(tmp_path, fake_backend_factory, ['{"result":6}'] * 9)
    with pytest.raises(ValueError, match="pass its --grader-config"):
        rescore(tmp_path / "r.jsonl", tmp_path / "again.jsonl")
    stricter = _config(tmp_path, pass_threshold=6.5)
    summary = rescore(tmp_path / "r.jsonl", tmp_path / "again.jsonl", grader_config=str(stricter))
    assert summary["score_model"]["passed"] == 0


@pytest.mark.slow
def test_a_score_model_config_runs_on_the_tiny_model_through_the_cli(tiny_model, tmp_path):
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main,
        ["grade", str(EXAMPLES / "qa.jsonl"), "--model", str(tiny_model), "-o", str(out),
         "--grader-config", str(CONFIG), "--limit", "6", "--temperature", "0", "--controls", "0"],
    )
    assert result.exit_code == 0, result.output
    records = [r for _, r in read_records(out)]
    assert len(records) == 6
    for record in records:
        assert record.status == "ok", record
        assert 1 <= record.result <= 7  # guided decoding keeps even random weights in range
        assert record.passed == (record.result >= 5)
    assert "passed" in result.output
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    # the config's sampling_params apply, except where an option was given
    assert summary["run"]["sampling"]["temperature"] == 0.0
    assert summary["run"]["sampling"]["seed"] == 42
