"""Run settings (pydantic, ``extra="forbid"``), each translated per backend by one method."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from grader.errors import GraderError


class SamplingConfig(BaseModel):
    """How the judge samples. Defaults: greedy, fixed seed: a rerun gives the same grades."""

    model_config = ConfigDict(extra="forbid")

    # finite: an infinite temperature makes every row an engine error, and a summary that
    # records it is not JSON (Infinity)
    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    seed: int = 0
    max_tokens: int | None = Field(None, gt=0, description="default: from the schema's bounds")
    n: int = Field(1, ge=1, description="samples per row, drawn in one engine call")
    # Top-k log-probabilities per output token (vLLM's name), for the confidence of an itemized
    # score (--confidence sets it; README, "Confidence"). None: not asked for.
    logprobs: int | None = Field(None, ge=1, le=20)

    @model_serializer(mode="wrap")
    def _dump(self, handler: Any) -> dict[str, Any]:
        # Left out when not asked for: the resume key and the run manifest are the sampling
        # settings' dump, and a run without --confidence must keep the ones it always had.
        data = handler(self)
        if data.get("logprobs", 0) is None:
            del data["logprobs"]
        return data

    @model_validator(mode="after")
    def _samples_need_sampling(self) -> SamplingConfig:
        if self.n > 1 and self.temperature == 0.0:
            raise ValueError(
                f"{self.n} samples per row need a temperature above 0: greedy decoding "
                "would give the same answer every time (e.g. --temperature 0.7)"
            )
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_transformers_kwargs(self, max_tokens: int) -> dict[str, Any]:
        """Keyword arguments for ``transformers.GenerationConfig``."""
        kwargs: dict[str, Any] = {"max_new_tokens": self.max_tokens or max_tokens}
        if self.n > 1:
            kwargs["num_return_sequences"] = self.n
        if self.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(
                do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
            )
        return kwargs

    def to_vllm_kwargs(self, max_tokens: int) -> dict[str, Any]:
        """Keyword arguments for ``vllm.SamplingParams`` (structured outputs added by the backend)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
            "max_tokens": self.max_tokens or max_tokens,
            "n": self.n,
            **({"logprobs": self.logprobs} if self.logprobs is not None else {}),
        }


# apply_chat_template's own arguments, which grader sets for every row: given again through
# --chat-template-kwarg they break the render of every row (tokenize=true returns token ids,
# add_generation_prompt=false ends the prompt without the assistant's turn, conversation=...
# collides with the messages), so each is refused before the model loads.
RESERVED_CHAT_TEMPLATE_KWARGS = {
    "conversation": "grader passes each row's messages itself",
    "messages": "grader passes each row's messages itself",
    "chat_template": "the template is the model's own (or the tokenizer's file)",
    "add_generation_prompt": "grader always asks for the assistant's turn",
    "continue_final_message": "grader always asks for the assistant's turn",
    "tokenize": "grader renders text, then tokenizes it itself",
    "return_dict": "grader renders text, then tokenizes it itself",
    "return_tensors": "grader renders text, then tokenizes it itself",
    "return_assistant_tokens_mask": "grader renders text, then tokenizes it itself",
    "padding": "grader renders text, then tokenizes it itself",
    "truncation": "grader renders text, then tokenizes it itself",
    "max_length": "grader renders text, then tokenizes it itself",
    "tokenizer_kwargs": "grader renders text, then tokenizes it itself",
    "tools": "the judge is given no tools",
    "documents": "the judge is given no documents",
}


def check_chat_template_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` when none is one of apply_chat_template's own arguments; else ValueError."""
    for key in kwargs:
        if key in RESERVED_CHAT_TEMPLATE_KWARGS:
            raise ValueError(f"chat template argument {key!r} cannot be set: "
                             f"{RESERVED_CHAT_TEMPLATE_KWARGS[key]}")
    return kwargs


class ThinkingConfig(BaseModel):
    """A thinking judge (README, "Thinking judges"): free reasoning, then the forced JSON.

    Both backends hold these fields under the same names; neither is set by default, and a run
    without them is what it always was.
    """

    model_config = ConfigDict(extra="forbid")

    # vLLM's name for the model's reasoning format (vllm.reasoning, vLLM 0.32.0): "deepseek_r1",
    # "qwen3", ... The grammar applies only after the end-of-thinking marker it names.
    reasoning_parser: str | None = None
    # At most this many thinking tokens; then the end-of-thinking marker is forced and the
    # answer follows under the grammar. None: the model thinks until it ends or max_tokens.
    thinking_budget: int | None = Field(None, ge=0)

    @field_validator("chat_template_kwargs", check_fields=False)  # both subclasses' field
    @classmethod
    def _own_arguments_kept(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        return check_chat_template_kwargs(kwargs)

    @model_validator(mode="after")
    def _budget_needs_parser(self) -> ThinkingConfig:
        if self.thinking_budget is not None and not self.reasoning_parser:
            raise ValueError(
                "thinking_budget needs reasoning_parser: the parser names the marker that ends "
                "the thinking (e.g. --reasoning-parser deepseek_r1)"
            )
        return self


class TransformersConfig(ThinkingConfig):
    """Settings of the transformers backend."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(8, gt=0)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"  # auto | float32 | bfloat16 | float16
    trust_remote_code: bool = False
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    # The KV cache. "static" preallocates prompt + max_tokens per batch; "dynamic" (transformers'
    # default) grows by concatenation, which copies the whole cache every decode step: on the
    # tiny model on CPU a batch of 8 at 5,400 tokens took 37.6 ms a step dynamic, 9.0 static.
    kv_cache: Literal["static", "dynamic"] = "static"

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        # found here, before the data pass and the model load, not by torch halfway through
        if not _DEVICE.fullmatch(device):
            raise ValueError(f"unknown device {device!r}: expected auto, cpu, cuda, cuda:N or mps")
        return device

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, dtype: str) -> str:
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
        return dtype


# Pinned engine-wide: the grammar backend is chosen per engine, and `auto` can put requests of
# one engine on different grammar backends and crash it (vllm-project/vllm#43920); free
# whitespace lets some models emit blanks until max_tokens (vllm-project/vllm#38696). vLLM reads
# disable_any_whitespace only here, at engine level, never per request (vLLM 0.32.0).
VLLM_STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}

_DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")
DTYPES = ("auto", "float32", "bfloat16", "float16")

# VLLMConfig fields that are vllm.LLM(...) keyword arguments under the same name.
_VLLM_ENGINE_FIELDS = (
    "tensor_parallel_size",
    "gpu_memory_utilization",
    "max_model_len",
    "dtype",
    "quantization",
    "max_num_seqs",
    "max_num_batched_tokens",
    "enforce_eager",
    "enable_prefix_caching",
    "trust_remote_code",
    "download_dir",
    "seed",
)


class VLLMConfig(ThinkingConfig):
    """Settings of the vLLM backend, under vLLM's own names (``vllm.LLM`` / ``EngineArgs``)."""

    model_config = ConfigDict(extra="forbid")

    tensor_parallel_size: int = Field(1, ge=1)
    # None: vLLM's own default on a GPU (0.9); on CPU, where vLLM reads it as a share of RAM,
    # grader sizes the KV cache itself (grader/backends/vllm_backend.py, cpu_engine_defaults).
    gpu_memory_utilization: float | None = Field(None, gt=0.0, le=1.0)
    max_model_len: int | None = Field(None, gt=0, description="default: the model's own")
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    quantization: str | None = None
    max_num_seqs: int | None = Field(None, gt=0)
    max_num_batched_tokens: int | None = Field(None, gt=0)
    enforce_eager: bool = False
    # On by default: every row shares the judge's system prompt, so its KV cache is reused.
    enable_prefix_caching: bool = True
    trust_remote_code: bool = False
    download_dir: str | None = None
    seed: int = 0  # the engine's seed; the per-request seed is SamplingConfig.seed
    # Further LLM(...) / EngineArgs keyword arguments (--engine-arg KEY=VALUE), passed as given.
    engine_args: dict[str, Any] = Field(default_factory=dict)
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)  # e.g. enable_thinking
    # Rows per LLM.chat call. vLLM batches continuously inside one call, so bigger chunks keep
    # the GPU busier; smaller ones lose less work to a crash and show progress more often.
    chunk_size: int = Field(512, gt=0)

    def to_vllm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM(model, ...)``.

        None values are left out (vLLM's defaults apply), the structured-output settings are
        pinned, and ``engine_args`` is merged last; a ``structured_outputs_config`` dict given
        there is merged over the pinned one rather than replacing it.
        """
        kwargs: dict[str, Any] = {
            name: getattr(self, name)
            for name in _VLLM_ENGINE_FIELDS
            if getattr(self, name) is not None
        }
        kwargs["structured_outputs_config"] = dict(VLLM_STRUCTURED_OUTPUTS)
        if self.reasoning_parser:
            # EngineArgs' own reasoning_parser, not structured_outputs_config's: vLLM 0.32.0 sets
            # both StructuredOutputsConfig.reasoning_parser (the grammar waits for the end of
            # thinking) and a ReasoningConfig (which SamplingParams.thinking_token_budget needs,
            # v1/engine/input_processor.py) from it (engine/arg_utils.py,
            # _set_default_reasoning_config_args); given only inside structured_outputs_config,
            # a budget is refused ("thinking_token_budget is set but reasoning_config is not
            # configured").
            kwargs["reasoning_parser"] = self.reasoning_parser
        extra = dict(self.engine_args)
        if isinstance(extra.get("structured_outputs_config"), dict):
            extra["structured_outputs_config"] = {
                **kwargs["structured_outputs_config"],
                **extra["structured_outputs_config"],
            }
        kwargs.update(extra)
        return kwargs


class OpenAIConfig(BaseModel):
    """Settings of the server backend (``--backend openai``): where the server is, how much
    traffic it gets, and what grader counts prompt tokens with. The model is ``--model``, the
    name the server serves it under."""

    model_config = ConfigDict(extra="forbid")

    base_url: str | None = Field(None, description="e.g. http://127.0.0.1:8000/v1")
    # The NAME of the environment variable holding the key, never the key: a settings file and
    # the run manifest may be shared.
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = Field(64, gt=0, description="requests in flight at once")
    request_timeout: float = Field(600.0, gt=0, description="seconds per request")
    # Retries of one request after a connection error, a 429 or a 5xx, with exponential backoff;
    # never after an answer that came back (a wrong answer is graded as it is).
    retries: int = Field(4, ge=0)
    # A local copy of the served model's tokenizer: prompts are counted with it (where the
    # server has no /tokenize) and rows defused of special-token look-alikes as in process.
    tokenizer: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)  # sent with each request
    chunk_size: int | None = Field(None, gt=0, description="default: 4 x max_concurrency")


# Settings that change what the judge answers: the rest (batch sizes, memory, chunking) only
# change how fast, and a resumed run must not re-grade rows over them.
_ANSWER_FIELDS = {
    "transformers": ("dtype", "trust_remote_code", "chat_template_kwargs"),
    "vllm": ("dtype", "quantization", "max_model_len", "seed", "trust_remote_code",
             "engine_args", "chat_template_kwargs"),
    # base_url, the key, concurrency, timeouts and the tokenizer only change how the rows travel
    # (the server's model id is the key's model, grader/run/grading.py).
    "openai": ("chat_template_kwargs",),
}


# Added to the resume key only when set, so the keys of runs without a thinking judge (and the
# rows their results files hold) stay what they were.
_THINKING_FIELDS = ("reasoning_parser", "thinking_budget")


def answer_settings(backend: str, config: BaseModel | None) -> dict[str, Any]:
    """The part of a backend's settings that can change an answer (for the resume key)."""
    if config is None:
        return {}
    settings = {name: getattr(config, name) for name in _ANSWER_FIELDS.get(backend, ())}
    for name in _THINKING_FIELDS:
        if getattr(config, name, None) is not None:
            settings[name] = getattr(config, name)
    return settings


class Settings(BaseModel):
    """Everything ``grader grade --config FILE`` may set; CLI options given explicitly win."""

    model_config = ConfigDict(extra="forbid")

    backend: str = "auto"
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    transformers: TransformersConfig = Field(default_factory=TransformersConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    openai: OpenAIConfig = Field(default_factory=OpenAIConfig)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        # found with the settings, before the data pass and the model load
        if backend not in BACKEND_NAMES:
            raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKEND_NAMES)}")
        return backend


# The names ``backend`` takes (grader.backends.BACKENDS, and auto); the registry is a layer up.
BACKEND_NAMES = ("auto", "transformers", "vllm", "openai")


class SettingsError(GraderError, ValueError):
    """A settings file that cannot be used: ``PATH: reason``."""


def load_settings(path: str | None, overrides: dict[str, dict[str, Any]]) -> Settings:
    """Settings from a YAML or TOML file (or defaults), with ``overrides`` applied on top.

    Args:
        path: ``.yaml``/``.yml``/``.toml`` file, or None.
        overrides: section -> {field: value} from CLI options given explicitly; the top-level
            ``backend`` is ``overrides[""]["backend"]``.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise SettingsError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
        except OSError as exc:
            raise SettingsError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
        try:
            if path.endswith(".toml"):
                import tomllib

                data = tomllib.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text) or {}
        except Exception as exc:  # tomllib.TOMLDecodeError, yaml.YAMLError
            reason = " ".join(str(exc).split())
            raise SettingsError(f"{path}: cannot be parsed: {reason}") from None
        if not isinstance(data, dict):
            raise SettingsError(f"{path}: expected a mapping of sections")
        for section in ("sampling", "transformers", "vllm"):
            if data.get(section) is not None and not isinstance(data[section], dict):
                raise SettingsError(f"{path}: {section}: expected a mapping of settings, got "
                                    f"{type(data[section]).__name__} {data[section]!r:.40}")
    for section, values in overrides.items():
        if section == "":
            data.update(values)
        else:
            data[section] = {**(data.get(section) or {}), **values}
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        reason = first["msg"].removeprefix("Value error, ")  # pydantic's prefix to our own
        option = _option(overrides, first["loc"])
        if option:  # the command line gave the value: name the option the user typed
            raise SettingsError(f"{option}: {reason}") from None
        raise SettingsError(f"{path or 'options'}: {where}: {reason}") from None


# Settings fields whose command-line option has another name than --FIELD.
_OPTION_NAMES = {"n": "--samples", "chat_template_kwargs": "--chat-template-kwarg",
                 "engine_args": "--engine-arg"}


def _option(overrides: dict[str, dict[str, Any]], loc: tuple[Any, ...]) -> str | None:
    """The command-line option that set the field at ``loc``, or None (a settings file's)."""
    section, field = (loc[0], loc[1]) if len(loc) > 1 else ("", loc[0] if loc else None)
    if section not in overrides or field not in overrides[section]:
        return None
    return _OPTION_NAMES.get(field, f"--{str(field).replace('_', '-')}")


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e999
        raise ValueError(f"{text} overflows a float")
    return value


def parse_key_values(pairs: tuple[str, ...] | list[str], option: str) -> dict[str, Any]:
    """``["enable_thinking=false", "max_loras=2"]`` -> ``{"enable_thinking": False, "max_loras": 2}``.

    Values are read as JSON when they parse (numbers, true/false, null, lists, objects) and are
    strings otherwise, as ``vllm serve`` reads its flags.
    """
    parsed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"{option} expects KEY=VALUE, got {pair!r}")
        try:  # strict JSON: NaN and Infinity stay strings, never a summary's invalid number
            value = json.loads(raw, parse_constant=_not_a_number, parse_float=_finite)
        except (ValueError, RecursionError):  # not JSON (or nested past json's depth): a string
            value = raw
        parsed[key.strip()] = value
    return parsed
