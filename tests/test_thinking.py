"""Thinking judges (issue #14): free reasoning, then the answer under the grammar.

The real backends run on the tiny model's --think variant (its prompt opens "<think>\\n"), with
vLLM's deepseek_r1 parser. Random weights almost never write "</think>" themselves, so the
thinking ends by the budget (the engine forces the marker) or by max_tokens (truncated). One
vLLM engine serves every vLLM test in this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from answers import answer
from click.testing import CliRunner
from conftest import make_request

from grader.backends import Completion
from grader.cli import main
from grader.config import SamplingConfig, TransformersConfig, VLLMConfig
from grader.io.results import read_records
from grader.records import Usage
from grader.run.grading import run_grade
from grader.run.rescore import rescore

PARSER = "deepseek_r1"
ROWS = [
    {"id": "a", "reference": "Water boils at 100 C at sea level.", "output_text": "At 100 C."},
    {"id": "b", "reference": "Paris is the capital of France.", "output_text": "Paris </think>."},
]
ANSWER = json.dumps({"score": 3, "rationale": [
    "Fact: 1 of 2 correctly matched.", "Conclusion: 1 of 1 correctly matched.",
    "Terminology: 1 of 1 terms correctly matched.", "Organization: matched", "Score: 3"]})


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS), encoding="utf-8")
    return path


def _records(path: Path) -> list[dict[str, Any]]:
    return [record for _, record in read_records(path)]


# --- the record: what a thinking completion becomes (a fake backend; no model) ---------------

def _fake_grade(fake_backend_factory, data, out, replies, overwrite=False, **config):
    fake_backend_factory.replies = list(replies)
    run_grade(
        *make_request(data, out, format="seed", checklist=False, overwrite=overwrite,
                     transformers=TransformersConfig(**config)),
        backend_factory=fake_backend_factory,
    )
    return _records(out)


def test_the_record_keeps_the_reasoning_apart_from_the_answer(fake_backend_factory, data,
                                                              tmp_path):
    thinking = Completion(ANSWER, "stop", 20, 40, reasoning="the facts: one of two",
                          reasoning_tokens=12)
    cut = Completion("", "length", 20, 30, reasoning="still thinking", reasoning_tokens=30)
    records = _fake_grade(fake_backend_factory, data, tmp_path / "r.jsonl", [thinking, cut],
                          reasoning_parser=PARSER)
    ok, truncated = records
    assert ok.status == "ok" and ok.score == 4  # recomputed: 5 × 0.8
    assert ok.raw_output == ANSWER  # the JSON alone: rescore reads it as any answer
    assert ok.reasoning == "the facts: one of two"
    assert ok.usage == Usage(prompt_tokens=20, output_tokens=40, reasoning_tokens=12)
    # max_tokens ran out inside the thinking: truncated, no score, the reasoning kept
    assert truncated.status == "truncated" and truncated.score is None
    assert truncated.reasoning == "still thinking" and truncated.raw_output == ""
    assert "still thinking" in truncated.error
    # rescore needs no model and gives the same records, reasoning included
    again = tmp_path / "again.jsonl"
    rescore(tmp_path / "r.jsonl", again)
    assert _records(again) == records


def test_without_a_reasoning_parser_the_record_has_no_new_field(fake_backend_factory, data,
                                                                tmp_path):
    records = _fake_grade(fake_backend_factory, data, tmp_path / "r.jsonl", [ANSWER, ANSWER])
    for record in records:
        assert not record.has("reasoning")
        assert set(record.to_dict()["usage"]) == {"prompt_tokens", "output_tokens"}


def test_a_changed_thinking_setting_is_refused_then_regrades_with_overwrite(
        fake_backend_factory, data, tmp_path):
    from grader.run.owner import ResultsOwned

    out = tmp_path / "r.jsonl"

    def graded(overwrite=False, **config) -> int:
        fake_backend_factory.backend = None
        _fake_grade(fake_backend_factory, data, out, [ANSWER] * 2, overwrite, **config)
        backend = fake_backend_factory.backend
        return 0 if backend is None else sum(len(call) for call in backend.calls)

    assert graded() == 2
    assert graded() == 0  # the same settings: nothing left to grade
    # the thinking settings change answers: the file is the earlier run's, kept as it is
    with pytest.raises(ResultsOwned, match="reasoning_parser"):
        graded(reasoning_parser=PARSER)
    assert graded(overwrite=True, reasoning_parser=PARSER) == 2
    assert graded(reasoning_parser=PARSER) == 0
    with pytest.raises(ResultsOwned, match="thinking_budget"):
        graded(reasoning_parser=PARSER, thinking_budget=8)


def test_a_budget_without_a_parser_is_one_line(data, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = CliRunner().invoke(main, ["grade", str(data), "-m", str(model), "-o",
                                       str(tmp_path / "r.jsonl"), "--thinking-budget", "4"])
    assert result.exit_code != 0
    assert "thinking_budget needs reasoning_parser" in result.output
    assert "Traceback" not in result.output


# --- the transformers backend on the think model -------------------------------------------

def _grade(model, data, out, backend, *, max_tokens=None, factory=None, **thinking):
    config = {"transformers": TransformersConfig, "vllm": VLLMConfig}[backend]
    options = ENGINE if backend == "vllm" else {}
    summary = run_grade(
        *make_request(data, out, model=str(model), backend=backend, format="seed", checklist=False,
                     sampling=SamplingConfig(max_tokens=max_tokens),
                     **{backend: config(**options, **thinking)}),
        backend_factory=factory,
    )
    return summary, _records(out)


def _check_budget_ended(records, budget):
    # The prompt ends "<think>\n": that "\n" counts against the budget, as vLLM counts it.
    for record in records:
        assert record.usage.reasoning_tokens == budget - 1, record
        assert record.reasoning  # what the model thought, kept
        assert "</think>" not in record.raw_output and "</think>" not in record.reasoning
        json.loads(record.raw_output)  # the answer after the forced marker obeys the grammar
        assert record.finish_reason == "stop"
        assert record.status in {"ok", "ambiguous", "invalid_counts"}, record
        assert (record.score is None) == (record.status == "invalid_counts")


def _check_truncated_while_thinking(records, max_tokens):
    for record in records:
        assert record.status == "truncated" and record.score is None
        assert record.raw_output == "" and record.reasoning
        assert record.usage.reasoning_tokens == record.usage.output_tokens == max_tokens


def test_transformers_budget_ends_the_thinking_then_the_grammar_answers(tiny_think_model, data,
                                                                         tmp_path):
    summary, records = _grade(tiny_think_model, data, tmp_path / "r.jsonl", "transformers",
                              reasoning_parser=PARSER, thinking_budget=4)
    _check_budget_ended(records, 4)
    assert summary["run"]["engine"]["thinking"] == {
        "reasoning_parser": PARSER, "thinking_budget": 4, "markers": ["<think>", "</think>"]}


def test_transformers_max_tokens_inside_the_thinking_is_truncated(tiny_think_model, data,
                                                                  tmp_path):
    _, records = _grade(tiny_think_model, data, tmp_path / "r.jsonl", "transformers",
                        max_tokens=6, reasoning_parser=PARSER, thinking_budget=50)
    _check_truncated_while_thinking(records, 6)


def test_transformers_unknown_parser_is_one_line(tiny_think_model, data, tmp_path):
    result = CliRunner().invoke(main, [
        "grade", str(data), "-m", str(tiny_think_model), "-o", str(tmp_path / "r.jsonl"),
        "--backend", "transformers", "--reasoning-parser", "nope"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "unknown --reasoning-parser 'nope'" in result.output and "deepseek_r1" in result.output


def test_cli_thinking_options_reach_the_backend(tiny_think_model, data, tmp_path):
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(main, [
        "grade", str(data), "-m", str(tiny_think_model), "-o", str(out), "--backend",
        "transformers", "--format", "seed", "--no-checklist", "--max-tokens", "5",
        "--reasoning-parser", PARSER, "--thinking-budget", "20"])
    assert result.exit_code == 0, result.output
    _check_truncated_while_thinking(_records(out), 5)


# --- vLLM's real CPU engine: one engine for the module ---------------------------------------

ENGINE = {"enforce_eager": True, "max_num_seqs": 4}


@pytest.fixture(scope="module")
def engine(tiny_think_model):
    from grader.backends.vllm_backend import VLLMBackend, vllm_platform
    from grader.judge.schema import verdict_schema

    assert vllm_platform().is_cpu(), "these tests run the CPU build of vLLM"
    backend = VLLMBackend(str(tiny_think_model), schema=verdict_schema(False),
                          sampling=SamplingConfig(), max_tokens=10,
                          config=VLLMConfig(**ENGINE, reasoning_parser=PARSER))
    yield backend.llm
    backend.close()


def _shared(engine):
    from grader.backends.vllm_backend import VLLMBackend

    def factory(name: str, **options: Any) -> VLLMBackend:
        assert name == "vllm"
        return VLLMBackend(**options, llm=engine)

    return factory


@pytest.mark.slow
def test_vllm_budget_ends_the_thinking_then_the_grammar_answers(tiny_think_model, engine, data,
                                                                tmp_path):
    summary, records = _grade(tiny_think_model, data, tmp_path / "r.jsonl", "vllm",
                              factory=_shared(engine), reasoning_parser=PARSER, thinking_budget=4)
    _check_budget_ended(records, 4)
    assert summary["run"]["engine"]["engine"]["reasoning_parser"] == PARSER


@pytest.mark.slow
def test_vllm_max_tokens_inside_the_thinking_is_truncated(tiny_think_model, engine, data,
                                                          tmp_path):
    _, records = _grade(tiny_think_model, data, tmp_path / "r.jsonl", "vllm", max_tokens=6,
                        factory=_shared(engine), reasoning_parser=PARSER, thinking_budget=50)
    _check_truncated_while_thinking(records, 6)


@pytest.mark.slow
def test_vllm_a_closed_think_block_answers_at_once(tiny_think_model, engine, data, tmp_path):
    # enable_thinking=false: the prompt ends the thinking itself, the grammar applies from the
    # first token, and the record says there was no reasoning.
    _, records = _grade(tiny_think_model, data, tmp_path / "r.jsonl", "vllm",
                        factory=_shared(engine), reasoning_parser=PARSER,
                        chat_template_kwargs={"enable_thinking": False})
    for record in records:
        assert record.reasoning == "" and record.usage.reasoning_tokens == 0
        json.loads(record.raw_output)


def test_vllm_unknown_parser_names_the_known_ones(tiny_think_model):
    from grader.backends import EngineSettingsError
    from grader.backends.vllm_backend import VLLMBackend
    from grader.judge.schema import verdict_schema

    with pytest.raises(EngineSettingsError) as raised:
        VLLMBackend(str(tiny_think_model), schema=verdict_schema(False), sampling=SamplingConfig(),
                    max_tokens=10, config=VLLMConfig(reasoning_parser="nope"))
    message = str(raised.value)
    assert "\n" not in message and "unknown --reasoning-parser 'nope'" in message
    assert "deepseek_r1" in message and "qwen3" in message


def test_the_context_check_leaves_room_for_the_thinking_budget(tmp_path):
    # A backend whose max_tokens includes a thinking budget: a row that fits the answer alone
    # but not answer + thinking is context_overflow before it is sent, not an engine error.
    from conftest import FakeBackend

    class Thinking(FakeBackend):
        context_length = 400

        def __init__(self, max_tokens):
            super().__init__(default=answer())
            self.max_tokens = max_tokens + 300  # what a --thinking-budget 299 adds

        def count_tokens(self, conversations):
            return [sum(len(m["content"]) for m in c) // 40 for c in conversations]

    made = []

    def factory(name, **options):
        made.append(Thinking(options["max_tokens"]))
        return made[0]

    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": 1, "reference": "r", "output_text": "o"}) + "\n")
    out = tmp_path / "r.jsonl"
    run_grade(*make_request(data, out, format="seed", checklist=False,
                           sampling=SamplingConfig(max_tokens=50)), backend_factory=factory)
    record = json.loads(out.read_text())
    assert record["status"] == "context_overflow" and made[0].calls == []


def test_a_thinking_budget_and_its_end_marker_come_on_top_of_the_longest_answer():
    from grader.backends import total_max_tokens

    assert total_max_tokens(SamplingConfig(), 100, None) == 100
    assert total_max_tokens(SamplingConfig(), 100, 299) == 400  # + the end marker
    assert total_max_tokens(SamplingConfig(max_tokens=50), 100, 299) == 50  # --max-tokens wins
