"""The vLLM backend's orchestration, with a stand-in for ``vllm.LLM`` alone (no GPU here).

Everything else is real: vllm's SamplingParams and output classes, the tiny model's tokenizer,
the pipeline. tests/test_vllm_contract.py checks what we send against vLLM's own validators.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import vllm  # CI installs vllm: a missing vllm fails these tests, it never skips them
from answers import answer
from conftest import EXAMPLES
from vllm.exceptions import VLLMValidationError
from vllm.outputs import CompletionOutput, RequestOutput

from grader.backends import load_backend
from grader.backends.vllm_backend import NoGPUError, UnsupportedVLLMError, VLLMBackend, schema_grammar
from grader.config import SamplingConfig, VLLMConfig
from grader.dataset import read_items
from grader.judges import seed_judge
from grader.pipeline import GradeRequest, grade_jobs, prepare_jobs, run_grade
from grader.results import read_records
from grader.verdict import max_answer_chars, verdict_schema

PINNED = {"backend": "xgrammar", "disable_any_whitespace": True}
TOO_LONG = (
    "This model's maximum context length is 4096 tokens. However, your prompt contains at "
    "least 4097 input tokens, which exceeds this limit even without any output tokens. "
    "Please reduce the length of the input prompt."
)


class FakeLLM:
    """Stands in for ``vllm.LLM``: records its construction and its ``chat`` calls.

    Like vLLM it fails the WHOLE call when one conversation is invalid, and it answers in input
    order. ``script(conversation)`` says what a conversation gets: an exception to raise, or a
    ``(text, finish_reason, output_tokens)`` tuple.
    """

    instances: list[FakeLLM] = []
    script: Any = None
    max_model_len = 4096

    def __init__(self, model: str, **kwargs: Any):
        self.model, self.kwargs = model, kwargs
        self.calls: list[dict[str, Any]] = []
        self.model_config = SimpleNamespace(max_model_len=self.max_model_len)
        FakeLLM.instances.append(self)

    def chat(self, messages, sampling_params=None, use_tqdm=True, *, chat_template_kwargs=None,
             add_generation_prompt=True, **rest):
        self.calls.append(
            dict(messages=[list(m) for m in messages], sampling_params=sampling_params,
                 use_tqdm=use_tqdm, chat_template_kwargs=chat_template_kwargs,
                 add_generation_prompt=add_generation_prompt, rest=rest)
        )
        replies = [self.script(conversation) for conversation in messages]
        for reply in replies:  # vLLM validates every request before generating any
            if isinstance(reply, BaseException):
                raise reply
        outputs = []
        samples = getattr(sampling_params, "n", 1)
        for i, (conversation, (text, reason, n_out)) in enumerate(zip(messages, replies)):
            prompt_ids = list(range(sum(len(m["content"]) for m in conversation)))
            # SamplingParams.n completions, listed last index first: the backend must sort
            completions = [
                CompletionOutput(
                    index=k, text=text if k == 0 else f"{text}#{k}", token_ids=list(range(n_out)),
                    cumulative_logprob=None, logprobs=None, finish_reason=reason,
                )
                for k in reversed(range(samples))
            ]
            outputs.append(RequestOutput(str(i), None, prompt_ids, None, completions, True))
        return outputs


def _user_text(conversation) -> str:
    return next(m["content"] for m in conversation if m["role"] == "user")


def default_script(conversation):
    text = _user_text(conversation)
    if "TOO_LONG" in text:
        return VLLMValidationError(TOO_LONG, parameter="input_tokens", value=4097)
    if "BAD_TEMPLATE" in text:
        return VLLMValidationError("the chat template failed: unknown role 'robot'")
    if "OLD_VALUE_ERROR" in text:  # vLLM before VLLMValidationError raised ValueError
        return ValueError(TOO_LONG)
    if "ENGINE_DIED" in text:
        return RuntimeError("EngineCore died unexpectedly")
    for reason in ("length", "abort", "error", "repetition"):
        if f"FINISH_{reason.upper()}" in text:
            return ("{\"score\":", reason, 7)
    return (f"echo:{text}", "stop", 12)


@pytest.fixture
def fake_llm(monkeypatch):
    """``vllm.LLM`` replaced by :class:`FakeLLM`, and a CUDA device that seems present."""
    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(FakeLLM, "instances", [])
    monkeypatch.setattr(FakeLLM, "script", staticmethod(default_script))
    return FakeLLM


def _backend(model, *, checklist=True, sampling=None, max_tokens=None, **config) -> VLLMBackend:
    return VLLMBackend(
        str(model),
        schema=verdict_schema(checklist),
        sampling=sampling or SamplingConfig(),
        max_tokens=max_tokens or max_answer_chars(checklist),
        config=VLLMConfig(**config),
    )


def _conversations(*texts):
    return [
        [{"role": "system", "content": "Grade it."}, {"role": "user", "content": t}] for t in texts
    ]


def test_one_engine_per_backend_and_one_chat_call_per_generate(tiny_model, fake_llm):
    backend = _backend(tiny_model, chat_template_kwargs={"enable_thinking": False})
    first = backend.generate(_conversations("a", "b", "c"))
    second = backend.generate(_conversations("d"))
    [llm] = fake_llm.instances
    assert llm.model == str(tiny_model)
    assert len(llm.calls) == 2
    call = llm.calls[0]
    assert call["use_tqdm"] is False and call["add_generation_prompt"] is True
    assert call["chat_template_kwargs"] == {"enable_thinking": False}
    assert call["rest"] == {}
    # one SamplingParams for the whole call: vLLM's real class, forcing our schema
    params = call["sampling_params"]
    assert isinstance(params, vllm.SamplingParams)
    assert params.structured_outputs.grammar == schema_grammar(verdict_schema(True))
    assert params.max_tokens == max_answer_chars(True) and params.temperature == 0.0
    assert [c.text for c in first + second] == ["echo:a", "echo:b", "echo:c", "echo:d"]


def test_completions_come_back_in_input_order_with_token_counts(tiny_model, fake_llm):
    texts = [f"row {i} " + "x" * i for i in range(7)]
    completions = _backend(tiny_model).generate(_conversations(*texts))
    assert [c.text for c in completions] == [f"echo:{t}" for t in texts]
    assert all(c.finish_reason == "stop" and c.error is None for c in completions)
    assert [c.prompt_tokens for c in completions] == [len("Grade it.") + len(t) for t in texts]
    assert {c.output_tokens for c in completions} == {12}


@pytest.mark.parametrize(
    "marker, finish_reason",
    [("FINISH_LENGTH", "length"), ("FINISH_ABORT", "error"), ("FINISH_ERROR", "error"),
     ("FINISH_REPETITION", "error")],
)
def test_finish_reasons(tiny_model, fake_llm, marker, finish_reason):
    [completion] = _backend(tiny_model).generate(_conversations(marker))
    assert completion.finish_reason == finish_reason
    assert completion.text == '{"score":'  # the partial answer is kept for the record
    if finish_reason == "error":
        vllm_reason = marker.removeprefix("FINISH_").lower()
        assert completion.error == f"vLLM finished the request with finish_reason={vllm_reason!r}"
        assert not completion.error.startswith("context_overflow")
    else:
        assert completion.error is None


def test_an_answer_cut_by_the_context_not_max_tokens_is_a_context_overflow(
    tiny_model, fake_llm, monkeypatch
):
    # vLLM says "length" also when prompt + answer reach max_model_len before max_tokens
    monkeypatch.setattr(FakeLLM, "max_model_len", len("Grade it.") + 20 + 7)
    [cut, fits] = _backend(tiny_model).generate(
        _conversations("FINISH_LENGTH" + "y" * 7, "FINISH_LENGTH")
    )
    assert cut.finish_reason == "error"
    assert cut.error.startswith("context_overflow: the prompt (29 tokens) left room for only 7 ")
    assert fits.finish_reason == "length" and fits.error is None


def test_one_invalid_prompt_fails_only_its_own_row(tiny_model, fake_llm):
    texts = [f"ok {i}" for i in range(16)]
    texts[5] = "TOO_LONG " * 3
    texts[11] = "BAD_TEMPLATE"
    completions = _backend(tiny_model).generate(_conversations(*texts))

    assert completions[5].finish_reason == "error" and completions[5].text == ""
    assert completions[5].error == (
        f"context_overflow: {TOO_LONG} (parameter=input_tokens, value=4097)"
    )
    assert completions[11].finish_reason == "error"
    assert completions[11].error == "the chat template failed: unknown role 'robot'"
    good = [i for i in range(16) if i not in (5, 11)]
    assert [completions[i].text for i in good] == [f"echo:ok {i}" for i in good]

    [llm] = fake_llm.instances
    # the whole chunk first, then halves until the bad rows stand alone: every good row is
    # generated exactly once, in batches, never one by one
    assert [_user_text(c) for c in llm.calls[0]["messages"]] == texts
    succeeded = [call for call in llm.calls if not any(
        "TOO_LONG" in _user_text(c) or "BAD_TEMPLATE" in _user_text(c) for c in call["messages"]
    )]
    generated = sorted(_user_text(c) for call in succeeded for c in call["messages"])
    assert generated == sorted(texts[i] for i in good)
    assert len(llm.calls) < len(texts)


def test_a_value_error_from_an_older_vllm_is_isolated_too(tiny_model, fake_llm):
    completions = _backend(tiny_model).generate(_conversations("ok", "OLD_VALUE_ERROR"))
    assert completions[0].finish_reason == "stop"
    assert completions[1].finish_reason == "error"
    assert completions[1].error.startswith("context_overflow: This model's maximum context")


def test_other_engine_exceptions_propagate(tiny_model, fake_llm):
    backend = _backend(tiny_model)
    with pytest.raises(RuntimeError, match="EngineCore died"):
        backend.generate(_conversations("ok", "ENGINE_DIED"))


def test_engine_kwargs_pin_xgrammar_and_carry_the_config(tiny_model, fake_llm):
    _backend(
        tiny_model,
        tensor_parallel_size=2,
        gpu_memory_utilization=0.8,
        max_model_len=8192,
        dtype="bfloat16",
        max_num_seqs=64,
        max_num_batched_tokens=16384,
        enforce_eager=True,
        enable_prefix_caching=False,
        download_dir="/models",
        seed=7,
        engine_args={
            "load_format": "dummy",
            "structured_outputs_config": {"reasoning_parser": "qwen3"},
        },
    )
    [llm] = fake_llm.instances
    assert llm.model == str(tiny_model)
    assert llm.kwargs == {
        "tensor_parallel_size": 2,
        "gpu_memory_utilization": 0.8,
        "max_model_len": 8192,
        "dtype": "bfloat16",
        "max_num_seqs": 64,
        "max_num_batched_tokens": 16384,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "trust_remote_code": False,
        "download_dir": "/models",
        "seed": 7,
        "load_format": "dummy",
        # an engine_args structured_outputs_config adds to the pins, it does not drop them
        "structured_outputs_config": {**PINNED, "reasoning_parser": "qwen3"},
    }


def test_default_engine_kwargs_leave_unset_values_to_vllm(tiny_model, fake_llm):
    backend = _backend(tiny_model)
    [llm] = fake_llm.instances
    assert llm.kwargs == {
        "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9,
        "dtype": "auto",
        "enforce_eager": False,
        "enable_prefix_caching": True,
        "trust_remote_code": False,
        "seed": 0,
        "structured_outputs_config": PINNED,
    }
    assert backend.chunk_size == 512
    described = backend.describe()
    assert json.loads(json.dumps(described)) == described
    assert described["backend"] == "vllm" and described["vllm"] == vllm.__version__
    assert described["engine"] == llm.kwargs and described["max_model_len"] == 4096
    assert backend.context_length == 4096  # for the pipeline's token budget
    conversations = _conversations("a", "b " * 50)
    prompts = [backend.formatter.prompt(c) for c in conversations]
    assert backend.count_tokens(conversations) == [
        len(backend.tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts
    ]
    assert described["sampling"]["max_tokens"] == max_answer_chars(True)


def test_unknown_engine_args_are_refused_before_any_engine(tiny_model, fake_llm):
    unknown = r"unknown vLLM engine argument\(s\): guided_decoding_backend, swap_space"
    with pytest.raises(ValueError, match=unknown):
        _backend(tiny_model, engine_args={"swap_space": 4, "guided_decoding_backend": "xgrammar"})
    with pytest.raises(ValueError, match="model"):
        _backend(tiny_model, engine_args={"model": "/elsewhere"})
    assert fake_llm.instances == []


def test_a_schema_xgrammar_refuses_is_reported_before_any_engine(tiny_model, fake_llm):
    code = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8}
    schema = {"type": "object", "properties": {"code": code}}
    with pytest.raises(ValueError, match="xgrammar backend rejects the JSON schema"):
        VLLMBackend(str(tiny_model), schema=schema, sampling=SamplingConfig(), max_tokens=64)
    assert fake_llm.instances == []


def test_no_gpu_is_one_clear_line_after_every_check(tiny_model, fake_llm, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NoGPUError) as caught:
        _backend(tiny_model)
    message = str(caught.value)
    assert "\n" not in message and "--backend transformers" in message
    assert isinstance(caught.value, RuntimeError)
    assert fake_llm.instances == []
    # a bad setting is still reported as such on a machine without a GPU
    with pytest.raises(ValueError, match="swap_space"):
        _backend(tiny_model, engine_args={"swap_space": 4})


def test_a_vllm_without_structured_outputs_params_is_refused(tiny_model, fake_llm, monkeypatch):
    monkeypatch.delattr(vllm.sampling_params, "StructuredOutputsParams")
    with pytest.raises(UnsupportedVLLMError) as caught:
        _backend(tiny_model)
    message = str(caught.value)
    assert message == (
        f"grader needs vllm 0.12–0.32 (vllm.sampling_params.StructuredOutputsParams); "
        f"found vllm {vllm.__version__}"
    )
    assert isinstance(caught.value, RuntimeError) and fake_llm.instances == []


def test_a_guided_decoding_era_sampling_params_is_refused(tiny_model, fake_llm, monkeypatch):
    class OldSamplingParams:  # vLLM < 0.10.2: SamplingParams(guided_decoding=...)
        __struct_fields__ = ("temperature", "guided_decoding")

    monkeypatch.setattr(vllm.sampling_params, "SamplingParams", OldSamplingParams)
    expected = r"0\.12–0\.32 \(SamplingParams\(structured_outputs"
    with pytest.raises(UnsupportedVLLMError, match=expected):
        _backend(tiny_model)


def test_a_template_without_system_role_gets_the_system_text_in_the_user_turn(
    tiny_model, tmp_path, fake_llm
):
    model = tmp_path / "no-system"
    shutil.copytree(tiny_model, model)
    rejecting = (
        "{% for m in messages %}{% if m['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    (model / "chat_template.jinja").write_text(rejecting)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = rejecting
    (model / "tokenizer_config.json").write_text(json.dumps(config))

    backend = _backend(model)
    backend.generate(_conversations("q"))
    [llm] = fake_llm.instances
    assert llm.calls[0]["messages"] == [[{"role": "user", "content": "Grade it.\n\nq"}]]
    assert backend.describe()["merges_system_role"] is True


def test_load_backend_finds_the_vllm_backend(tiny_model, fake_llm):
    backend = load_backend(
        "vllm", model=str(tiny_model), schema=verdict_schema(False), sampling=SamplingConfig(),
        max_tokens=max_answer_chars(False),
    )
    assert isinstance(backend, VLLMBackend) and backend.name == "vllm"
    assert backend.config == VLLMConfig()  # run_grade passes no config for vllm yet


def _judge_script(bad_input: str, *, checklist: bool = True):
    """Answers each row with a schema-valid verdict; the row holding ``bad_input`` is too long."""
    checklist_items = ("Find the facts", "Find the conclusions", "Find the terms")

    def script(conversation):
        text = _user_text(conversation)
        if bad_input in text:
            return VLLMValidationError(TOO_LONG, parameter="input_tokens", value=4097)
        facts = len(text) % 5 + 1
        reply = answer(facts=(facts, 5), checklist=checklist_items if checklist else None)
        return (reply, "stop", 200)

    return script


def test_run_grade_end_to_end_with_backend_vllm(tiny_model, tmp_path, fake_llm, monkeypatch):
    rows = [json.loads(line) for line in (EXAMPLES / "qa.jsonl").read_text().splitlines()]
    bad = next(r for r in rows if r["id"] == "q05")
    monkeypatch.setattr(FakeLLM, "script", staticmethod(_judge_script(bad["input"])))
    out = tmp_path / "out" / "results.jsonl"
    summary = run_grade(
        GradeRequest(
            data=str(EXAMPLES / "qa.jsonl"), output=out, model=str(tiny_model), backend="vllm",
            chunk_size=8,
        )
    )
    records = [r for _, r in read_records(out)]
    assert [r["id"] for r in records] == [r["id"] for r in rows]
    status = {r["id"]: r["status"] for r in records}
    assert {i for i, s in status.items() if s == "missing_context"} == {"q10", "q15", "q18"}
    assert status["q05"] == "engine_error"
    assert records[4]["error"].startswith("context_overflow: This model's maximum context length")
    assert {s for i, s in status.items() if i not in {"q05", "q10", "q15", "q18"}} == {"ok"}
    for record in records:
        if record["status"] == "ok":
            assert record["usage"]["output_tokens"] == 200
            assert record["finish_reason"] == "stop"
    [llm] = fake_llm.instances
    # the chunk holding q05 failed as a whole, then was halved until q05 stood alone: every
    # other row was generated exactly once, and the first call was a whole chunk
    assert len(llm.calls[0]["messages"]) == 8
    generated = [
        _user_text(c) for call in llm.calls for c in call["messages"]
        if not any(bad["input"] in _user_text(x) for x in call["messages"])
    ]
    assert len(generated) == len(set(generated)) == 20
    assert summary["run"]["engine"]["backend"] == "vllm"
    assert summary["run"]["engine"]["engine"]["structured_outputs_config"] == PINNED


def test_grade_jobs_with_a_configured_vllm_backend(tiny_model, fake_llm, monkeypatch):
    # what run_grade will do once it passes a VLLMConfig: chunk size from the backend
    script = _judge_script("no row has this", checklist=False)
    monkeypatch.setattr(FakeLLM, "script", staticmethod(script))
    items = read_items(str(EXAMPLES / "qa.jsonl"))
    judge = seed_judge("seed", checklist=False)
    jobs = prepare_jobs(str(EXAMPLES / "qa.jsonl"), items, judge)
    backend = _backend(
        tiny_model, checklist=False, chunk_size=10, chat_template_kwargs={"enable_thinking": False}
    )
    chunks = list(grade_jobs(jobs, backend, judge, backend.chunk_size))
    assert [len(c) for c in chunks] == [10, 10, 4]
    records = [r for chunk in chunks for r in chunk]
    assert [r["id"] for r in records] == [item.id for item in items]
    assert sum(r["status"] == "ok" for r in records) == 21
    [llm] = fake_llm.instances
    assert [len(c["messages"]) for c in llm.calls] == [9, 8, 4]
    assert all(c["chat_template_kwargs"] == {"enable_thinking": False} for c in llm.calls)
    sent = llm.calls[0]["sampling_params"].structured_outputs
    assert sent.grammar == schema_grammar(verdict_schema(False))


def test_samples_come_back_flat_row_by_row_in_index_order(tiny_model, fake_llm):
    backend = _backend(tiny_model, sampling=SamplingConfig(temperature=0.7, n=3))
    completions = backend.generate(_conversations("a", "TOO_LONG", "b"))
    [call] = fake_llm.instances[0].calls[-1:]
    assert call["sampling_params"].n == 3  # one engine call draws all samples
    texts = [c.text for c in completions]
    assert texts[:3] == ["echo:a", "echo:a#1", "echo:a#2"]
    assert texts[6:] == ["echo:b", "echo:b#1", "echo:b#2"]
    # the row vLLM refused fails as many times as it has samples
    assert [c.finish_reason for c in completions[3:6]] == ["error"] * 3
    assert all(c.error.startswith("context_overflow: ") for c in completions[3:6])
