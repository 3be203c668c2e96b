"""What we send vLLM, checked by the installed vLLM's own code (no GPU needed, none used).

If these fail after a vLLM upgrade, grader/backends/vllm_backend.py needs a change: each test
names the vLLM API it pins. Written against vLLM 0.32.0.
"""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import pytest
from answers import answer, itemized_answer

# vllm, and grader.backends.vllm_backend which imports it, are imported in each test, not at
# collection: importing vllm costs seconds. CI installs vllm: a missing vllm fails these tests,
# it never skips them.
from grader.backends.chat import load_tokenizer
from grader.config import SamplingConfig, VLLMConfig, load_settings
from grader.judge.schema import format_max_chars, format_schema, max_answer_chars, verdict_schema

# every answer format grader can force: (format, checklist)
FORMATS = [("seed", True), ("seed", False), ("itemized", False)]

PATTERN_AND_MAX_LENGTH = {
    "type": "object",
    "properties": {"code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 8}},
    "required": ["code"],
}
EVERY_FIELD_SET = VLLMConfig(
    tensor_parallel_size=1,
    gpu_memory_utilization=0.85,
    max_model_len=4096,
    dtype="bfloat16",
    quantization="fp8",
    max_num_seqs=128,
    max_num_batched_tokens=8192,
    enforce_eager=True,
    enable_prefix_caching=True,
    trust_remote_code=False,
    download_dir="/tmp/models",
    seed=1,
    engine_args={"load_format": "dummy", "max_logprobs": 0},
)


def _parameters(function) -> set[str]:
    return set(inspect.signature(function).parameters)


def test_the_vllm_apis_we_use_exist_with_the_parameters_we_pass():
    import vllm
    from vllm.exceptions import VLLMValidationError
    from vllm.outputs import CompletionOutput, RequestOutput

    from grader.backends.vllm_backend import load_api

    api = load_api()  # raises UnsupportedVLLMError naming what is missing
    assert {"chat_template_kwargs", "add_generation_prompt", "use_tqdm"} <= _parameters(
        vllm.LLM.chat
    )
    assert "structured_outputs_config" in _parameters(vllm.LLM.__init__)
    assert "structured_outputs" in vllm.SamplingParams.__struct_fields__
    assert "json" in {f.name for f in dataclasses.fields(api.StructuredOutputsParams)}
    completion_fields = {f.name for f in dataclasses.fields(CompletionOutput)}
    assert {"text", "token_ids", "finish_reason", "stop_reason"} <= completion_fields
    assert {"prompt_token_ids", "outputs"} <= _parameters(RequestOutput.__init__)
    # a chunk's validation error is caught whatever its base class (not ValueError in 0.32.0)
    assert issubclass(VLLMValidationError, api.validation_errors)
    from vllm.v1.engine import FINISH_REASON_STRINGS

    assert {"stop", "length", "repetition"} <= set(FINISH_REASON_STRINGS)


@pytest.mark.parametrize(("answer_format", "checklist"), FORMATS)
def test_our_schema_passes_vllms_structured_output_validation(answer_format, checklist, tiny_model):
    from vllm.config import StructuredOutputsConfig

    from grader.backends.vllm_backend import VLLM_STRUCTURED_OUTPUTS, build_sampling_params

    params = build_sampling_params(
        format_schema(answer_format, checklist),
        SamplingConfig(),
        format_max_chars(answer_format, checklist),
    )
    # the check LLM.chat runs on every request, for an engine configured as ours is
    tokenizer = load_tokenizer(str(tiny_model))
    params._validate_structured_outputs(
        SimpleNamespace(is_diffusion=False),
        StructuredOutputsConfig(**VLLM_STRUCTURED_OUTPUTS),
        tokenizer,
    )
    assert params.structured_outputs._backend == "xgrammar"


def test_a_schema_xgrammar_cannot_force_is_rejected_by_the_same_path(tiny_model):
    import vllm
    from vllm.config import StructuredOutputsConfig
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    from grader.backends.vllm_backend import VLLM_STRUCTURED_OUTPUTS, build_sampling_params

    with pytest.raises(ValueError, match="not supported by xgrammar"):
        build_sampling_params(PATTERN_AND_MAX_LENGTH, SamplingConfig(), 64)
    structured = vllm.sampling_params.StructuredOutputsParams(json=PATTERN_AND_MAX_LENGTH)
    params = vllm.SamplingParams(max_tokens=64, structured_outputs=structured)
    with pytest.raises(VLLMValidationError, match="not supported by xgrammar"):
        validate_xgrammar_grammar(params)
    with pytest.raises(VLLMValidationError, match="not supported by xgrammar"):
        params._validate_structured_outputs(
            SimpleNamespace(is_diffusion=False),
            StructuredOutputsConfig(**VLLM_STRUCTURED_OUTPUTS),
            load_tokenizer(str(tiny_model)),
        )


@pytest.mark.parametrize(("answer_format", "checklist"), FORMATS)
def test_the_ebnf_we_send_is_the_grammar_vllm_compiles_for_the_json_schema(
    tiny_model, answer_format, checklist
):
    """Requests carry the schema's grammar as EBNF (48 ms -> 0.5 ms of validation per request
    in vLLM 0.32.0). vLLM's own XgrammarBackend, configured as our engine is, must compile the
    JSON request and our EBNF request to the same grammar, and accept the same answers."""
    import json

    from vllm.config import StructuredOutputsConfig
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend
    from vllm.v1.structured_output.utils import grammar_is_likely_lark

    from grader.backends.vllm_backend import VLLM_STRUCTURED_OUTPUTS, schema_grammar

    schema = format_schema(answer_format, checklist)
    ebnf = schema_grammar(schema)
    assert not grammar_is_likely_lark(ebnf)  # vLLM would otherwise compile it as Lark
    engine = SimpleNamespace(
        structured_outputs_config=StructuredOutputsConfig(**VLLM_STRUCTURED_OUTPUTS),
        model_config=None,
        speculative_config=None,
    )
    backend = XgrammarBackend(engine, tokenizer=load_tokenizer(str(tiny_model)), vocab_size=2048)
    from_json = backend.compile_grammar(StructuredOutputOptions.JSON, json.dumps(schema))
    from_ebnf = backend.compile_grammar(StructuredOutputOptions.GRAMMAR, ebnf)
    assert str(from_json.ctx.grammar) == str(from_ebnf.ctx.grammar)
    texts = (
        answer(checklist=None if not checklist else ("a", "b", "c")),
        answer(facts=(1000, 2)),
        itemized_answer(),
        itemized_answer(lines=("Fact: 1000 of 2 correctly matched.",) * 3),
    )
    good = texts[2] if answer_format == "itemized" else texts[0]
    for text in texts:
        accepted = [g.matcher.accept_string(text) for g in (from_json, from_ebnf)]
        assert accepted[0] == accepted[1]
        assert accepted[0] == (text == good), text
        for g in (from_json, from_ebnf):
            g.matcher.reset()


def test_the_sampling_params_carry_our_settings():
    import vllm

    from grader.backends.vllm_backend import build_sampling_params, schema_grammar

    schema = verdict_schema(True)
    sampled = build_sampling_params(
        schema, SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, seed=3), 900
    )
    assert isinstance(sampled, vllm.SamplingParams)
    assert sampled.structured_outputs.grammar == schema_grammar(schema)
    assert sampled.structured_outputs.json is None
    assert sampled.skip_special_tokens is False
    assert (sampled.temperature, sampled.top_p, sampled.top_k, sampled.seed) == (0.7, 0.9, 20, 3)
    assert sampled.max_tokens == 900 and sampled.n == 1

    greedy = build_sampling_params(schema, SamplingConfig(), max_answer_chars(True))
    assert (greedy.temperature, greedy.top_k, greedy.seed) == (0.0, 0, 0)
    assert greedy.max_tokens == max_answer_chars(True)
    # SamplingConfig.max_tokens wins over the schema-derived default
    assert build_sampling_params(schema, SamplingConfig(max_tokens=50), 900).max_tokens == 50


def test_the_rubric_pass_asks_the_engine_to_end_a_draft_where_it_loops():
    from grader.backends.vllm_backend import build_sampling_params, schema_grammar
    from grader.judge.schema import END_ON_LOOP, LOOP, check_schema, draft_schema
    from grader.run.rows import generate_request

    request = generate_request([], draft_schema())
    draft = build_sampling_params(request.schema, SamplingConfig(), 900, stop=request.stop)
    detection = draft.repetition_detection
    assert (detection.min_pattern_size, detection.max_pattern_size, detection.min_count) == (
        LOOP["min_pattern_size"], LOOP["max_pattern_size"], LOOP["min_count"])
    # the annotation is no part of the grammar
    plain = {k: v for k, v in draft_schema().items() if k != END_ON_LOOP}
    assert draft.structured_outputs.grammar == schema_grammar(plain)
    # a check-pass row (labels may repeat) and a verdict run to their end
    assert build_sampling_params(check_schema(8), SamplingConfig(), 40).repetition_detection is None
    assert build_sampling_params(verdict_schema(True), SamplingConfig(), 900).repetition_detection is None


def test_top_k_zero_means_disabled_in_this_vllm():
    # SamplingConfig passes top_k=0 for "disabled"; vLLM 0.32.0 takes 0 (or -1) to mean that
    import vllm
    from vllm.exceptions import VLLMValidationError

    params = vllm.SamplingParams(temperature=1.0, top_k=0)
    assert params.top_k == 0
    with pytest.raises(VLLMValidationError, match=r"top_k must be 0 \(disable\)"):
        vllm.SamplingParams(temperature=1.0, top_k=-2)


def test_a_sampling_setting_vllm_refuses_is_one_clear_value_error():
    from grader.backends.vllm_backend import build_sampling_params

    expected = r"^vLLM rejects the sampling settings: temperature must be in \[0, 2\]"
    with pytest.raises(ValueError, match=expected):
        build_sampling_params(verdict_schema(True), SamplingConfig(temperature=2.5), 100)


def test_our_engine_kwargs_are_names_vllm_takes():
    import vllm
    from vllm.config import StructuredOutputsConfig

    from grader.backends.vllm_backend import build_engine_kwargs, engine_kwarg_names

    kwargs = build_engine_kwargs(EVERY_FIELD_SET)
    engine_fields = {f.name for f in dataclasses.fields(vllm.EngineArgs)}
    llm_parameters = _parameters(vllm.LLM.__init__)
    assert set(kwargs) <= engine_fields | llm_parameters
    assert set(kwargs) <= engine_kwarg_names()
    # the pinned settings are a valid StructuredOutputsConfig (pydantic, extra="forbid")
    config = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
    assert config.backend == "xgrammar" and config.disable_any_whitespace is True
    # names vLLM dropped (swap_space) or renamed (guided_decoding_backend) are refused by name
    with pytest.raises(ValueError, match="guided_decoding_backend, swap_space"):
        build_engine_kwargs(
            VLLMConfig(engine_args={"swap_space": 4, "guided_decoding_backend": "x"})
        )


class _EngineWouldStart(Exception):
    def __init__(self, engine_args):
        super().__init__("the engine would start here")
        self.engine_args = engine_args


def test_llm_accepts_our_kwargs_up_to_the_engine(tiny_model, monkeypatch):
    """The real ``vllm.LLM(...)`` with our kwargs, stopped where the engine would start."""
    import vllm
    import vllm.entrypoints.llm as llm_module
    from vllm.config import StructuredOutputsConfig

    from grader.backends.vllm_backend import VLLMBackend

    def stop(engine_args, usage_context=None, **_):
        raise _EngineWouldStart(engine_args)

    monkeypatch.setattr(llm_module.LLMEngine, "from_engine_args", stop)
    with pytest.raises(_EngineWouldStart) as caught:
        VLLMBackend(
            str(tiny_model),
            schema=verdict_schema(True),
            sampling=SamplingConfig(),
            max_tokens=max_answer_chars(True),
            config=EVERY_FIELD_SET.model_copy(update={"quantization": None}),
        )
    engine_args = caught.value.engine_args
    assert isinstance(engine_args, vllm.EngineArgs)
    assert engine_args.model == str(tiny_model)
    assert engine_args.structured_outputs_config == StructuredOutputsConfig(
        backend="xgrammar", disable_any_whitespace=True
    )
    assert engine_args.gpu_memory_utilization == 0.85 and engine_args.seed == 1
    assert engine_args.max_model_len == 4096 and engine_args.enable_prefix_caching is True
    assert engine_args.max_num_seqs == 128 and engine_args.max_num_batched_tokens == 8192
    assert engine_args.load_format == "dummy" and engine_args.max_logprobs == 0
    # and vLLM's value checks against the model's own config pass on CPU
    model_config = engine_args.create_model_config()
    assert model_config.max_model_len == 4096


def test_the_vllm_section_of_a_settings_file_becomes_the_engine_arguments(tmp_path):
    from grader.backends.vllm_backend import engine_kwargs

    toml_file = tmp_path / "judge.toml"
    toml_file.write_text(
        'backend = "vllm"\n[vllm]\ntensor_parallel_size = 2\nmax_model_len = 8192\n'
        '[vllm.engine_args]\nkv_cache_dtype = "fp8"\n'
    )
    assert engine_kwargs(load_settings(str(toml_file), {}).vllm) == {
        "tensor_parallel_size": 2,
        "max_model_len": 8192,
        "dtype": "auto",
        "enforce_eager": False,
        "enable_prefix_caching": True,
        "trust_remote_code": False,
        "seed": 0,
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
        "kv_cache_dtype": "fp8",
    }
