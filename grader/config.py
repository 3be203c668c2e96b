"""Run settings (pydantic, ``extra="forbid"``), each translated per backend by one method."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from grader.errors import GraderError, one_line


class SamplingConfig(BaseModel):
    """How the judge samples. Defaults: greedy, fixed seed: a rerun gives the same grades."""

    model_config = ConfigDict(extra="forbid")

    # finite: an infinite temperature makes every row an engine error, and a summary that
    # records it is not JSON (Infinity)
    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=0, description="0 disables top-k")
    seed: int = 0
    max_tokens: int | None = Field(default=None, gt=0, description="default: from the schema's bounds")
    n: int = Field(default=1, ge=1, description="samples per row, drawn in one engine call")
    # Top-k log-probabilities per output token (vLLM's name), for the confidence of an itemized
    # score (--confidence sets it; README, "Confidence"). None: not asked for.
    logprobs: int | None = Field(default=None, ge=1, le=20)

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


class BackendSettings(BaseModel):
    """A backend's section of the settings (``[transformers]``, ``[vllm]``, ``[openai]``).

    Each says which of its fields change what the judge answers (``answer_fields``): the rest
    (batch sizes, memory, chunking, where a server is) only change how fast, and a resumed run
    must not re-grade rows over them. The backend itself (grader/backends/) translates the
    section into its engine's arguments.
    """

    model_config = ConfigDict(extra="forbid")

    answer_fields: ClassVar[tuple[str, ...]] = ()

    def answer_settings(self) -> dict[str, Any]:
        """The fields that can change an answer, by name (for the resume key)."""
        return {name: getattr(self, name) for name in self.answer_fields}


class ThinkingConfig(BackendSettings):
    """A thinking judge (README, "Thinking judges"): free reasoning, then the forced JSON.

    Both backends hold these fields under the same names; neither is set by default, and a run
    without them is what it always was.
    """

    model_config = ConfigDict(extra="forbid")

    # vLLM's name for the model's reasoning format (vllm.reasoning): "deepseek_r1",
    # "qwen3", ... The grammar applies only after the end-of-thinking marker it names.
    reasoning_parser: str | None = None
    # At most this many thinking tokens; then the end-of-thinking marker is forced and the
    # answer follows under the grammar. None: the model thinks until it ends or max_tokens.
    thinking_budget: int | None = Field(default=None, ge=0)

    @field_validator("chat_template_kwargs", check_fields=False)  # both subclasses' field
    @classmethod
    def _own_arguments_kept(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        return check_chat_template_kwargs(kwargs)

    def answer_settings(self) -> dict[str, Any]:
        # The thinking fields join the resume key only when set, so the keys of runs without a
        # thinking judge (and the rows their results files hold) stay what they were.
        settings = super().answer_settings()
        if self.reasoning_parser is not None:
            settings["reasoning_parser"] = self.reasoning_parser
        if self.thinking_budget is not None:
            settings["thinking_budget"] = self.thinking_budget
        return settings

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
    answer_fields = ("dtype", "trust_remote_code", "chat_template_kwargs")

    batch_size: int = Field(default=8, gt=0)
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


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")
DTYPES = ("auto", "float32", "bfloat16", "float16")


class VLLMConfig(ThinkingConfig):
    """Settings of the vLLM backend, under vLLM's own names (``vllm.LLM`` / ``EngineArgs``;
    grader/backends/vllm_backend.py, ``engine_kwargs``)."""

    model_config = ConfigDict(extra="forbid")
    answer_fields = ("dtype", "quantization", "max_model_len", "seed", "trust_remote_code",
                     "engine_args", "chat_template_kwargs")

    tensor_parallel_size: int = Field(default=1, ge=1)
    # None: vLLM's own default on a GPU (0.9); on CPU, where vLLM reads it as a share of RAM,
    # grader sizes the KV cache itself (grader/backends/vllm_backend.py, cpu_engine_defaults).
    gpu_memory_utilization: float | None = Field(default=None, gt=0.0, le=1.0)
    max_model_len: int | None = Field(default=None, gt=0, description="default: the model's own")
    dtype: str = "auto"  # auto | bfloat16 | float16 | float32
    quantization: str | None = None
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
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
    chunk_size: int = Field(default=512, gt=0)


class OpenAIConfig(BackendSettings):
    """Settings of the server backend (``--backend openai``): where the server is, how much
    traffic it gets, and what grader counts prompt tokens with. The model is ``--model``, the
    name the server serves it under."""

    model_config = ConfigDict(extra="forbid")
    # base_url, the key, concurrency, timeouts and the tokenizer only change how the rows travel
    # (the server's model id is the key's model, grader/run/grading.py).
    answer_fields = ("chat_template_kwargs",)

    base_url: str | None = Field(default=None, description="e.g. http://127.0.0.1:8000/v1")
    # The NAME of the environment variable holding the key, never the key: a settings file and
    # the run manifest may be shared.
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrency: int = Field(default=64, gt=0, description="requests in flight at once")
    request_timeout: float = Field(default=600.0, gt=0, description="seconds per request")
    # Retries of one request after a connection error, a 429 or a 5xx, with exponential backoff;
    # never after an answer that came back (a wrong answer is graded as it is).
    retries: int = Field(default=4, ge=0)
    # A local copy of the served model's tokenizer: prompts are counted with it (where the
    # server has no /tokenize) and rows defused of special-token look-alikes as in process.
    tokenizer: str | None = None
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)  # sent with each request
    chunk_size: int | None = Field(default=None, gt=0, description="default: 4 x max_concurrency")


def answer_settings(backend: str, config: BaseModel | None) -> dict[str, Any]:
    """The part of ``backend``'s settings that can change an answer (for the resume key):
    ``config.answer_settings()``; nothing for a backend without settings."""
    return config.answer_settings() if isinstance(config, BackendSettings) else {}


class PanelJudgeConfig(BaseModel):
    """One judge of a ``panel`` section (``grader grade`` with a judge panel): its model and,
    where it differs from the sampling section's, its temperature."""

    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: float | None = Field(default=None, ge=0)


class Settings(BaseModel):
    """Everything ``grader grade --config FILE`` may set; CLI options given explicitly win."""

    model_config = ConfigDict(extra="forbid")

    backend: str = "auto"
    # grade's controls (grader.run.controls): how many references' controls are graded beside
    # the rows, for the verdict on the judge; 0 turns them off
    controls: int = Field(default=50, ge=0)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    transformers: TransformersConfig = Field(default_factory=TransformersConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    openai: OpenAIConfig = Field(default_factory=OpenAIConfig)
    # a judge panel, as --model given twice or more (README, "Judge panels"); --model wins
    panel: list[PanelJudgeConfig] = Field(default_factory=list)

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        # found with the settings, before the data pass and the model load
        if not known_backend(backend):
            raise ValueError(f"unknown backend {backend!r}: expected one of {', '.join(BACKEND_NAMES)}"
                             " or a backend an installed package registers")
        return backend


# The names ``backend`` takes (grader.backends.BACKENDS, and auto); the registry is a layer up.
BACKEND_NAMES = ("auto", "transformers", "vllm", "openai")


def known_backend(name: str) -> bool:
    """A built-in backend (or auto), or one an installed package registers in the entry-point
    group grader.backends (grader.backends.registered); the group is read only for a name that
    is not built in (reading it takes a tenth of a second)."""
    if name in BACKEND_NAMES:
        return True
    from importlib.metadata import entry_points

    return any(entry.name == name for entry in entry_points(group="grader.backends"))


class SettingsError(GraderError, ValueError):
    """A settings file that cannot be used: ``PATH: reason``."""


def load_settings(path: str | None, overrides: dict[str, dict[str, Any]]) -> Settings:
    """Settings from a YAML or TOML file (or defaults), with ``overrides`` applied on top.

    Args:
        path: ``.yaml``/``.yml``/``.toml`` file, or None.
        overrides: section -> {field: value} from CLI options given explicitly; the top-level
            ``backend`` is ``overrides[""]["backend"]``.
    """
    data = _read_settings_file(path) if path is not None else {}
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


def _read_settings_file(path: str) -> dict[str, Any]:
    """A settings file's mapping of sections, or a SettingsError naming the file."""
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
        raise SettingsError(f"{path}: cannot be parsed: {one_line(exc)}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{path}: expected a mapping of sections")
    for section in ("sampling", "transformers", "vllm"):
        if data.get(section) is not None and not isinstance(data[section], dict):
            raise SettingsError(f"{path}: {section}: expected a mapping of settings, got "
                                f"{type(data[section]).__name__} {data[section]!r:.40}")
    return data


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
