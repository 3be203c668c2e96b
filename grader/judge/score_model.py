"""OpenAI ``score_model`` grader configs, run on the local judge under guided decoding.

A config written for OpenAI's hosted evals (``input`` messages over ``{{ item.* }}`` and
``{{ sample.output_text }}``, ``range``, ``pass_threshold``, ``sampling_params``) runs
unchanged: the judge's answer is forced to ``{"result": <number within range>}`` and each
record carries the result and whether it passes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from grader.config import SamplingConfig
from grader.errors import GraderError
from grader.io.jsonlines import loads
from grader.judge.prompts import Prompt, PromptError, compile_prompt
from grader.judge.schema import JsonSchema
from grader.records import ScoreModelRecord
from grader.status import Status

if TYPE_CHECKING:
    from grader.judge.judges import JudgeEntry


class GraderConfigError(GraderError, ValueError):
    """A grader config that cannot be used: ``PATH: reason``, one line."""


class _ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["input_text", "text", "output_text"]
    text: str


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_ContentPart]
    type: Literal["message"] | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class _SamplingParams(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    max_completions_tokens: int | None = Field(None, gt=0)
    reasoning_effort: str | None = None  # accepted and not honoured locally (docs/formats.md)


class ScoreModelConfig(BaseModel):
    """An OpenAI ``score_model`` grader definition."""

    # finite numbers only: json reads Infinity and NaN, and a range of [0, Infinity] or a NaN
    # threshold would reach the schema, the records and the summary, none of which can hold them
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["score_model"]
    name: str = "score_model"
    model: str | None = None  # the hosted model's name: the local --model is used instead
    input: list[_Message]
    range: tuple[float, float] = (0.0, 1.0)
    pass_threshold: float | None = None
    sampling_params: _SamplingParams | None = None

    @model_validator(mode="after")
    def _check_range(self) -> ScoreModelConfig:
        low, high = self.range
        if not low < high:
            raise ValueError(f"range must be [low, high] with low < high, got {list(self.range)}")
        return self


class ScoreModelGrader:
    """A loaded config: its prompt, its answer schema, and how an answer becomes a record."""

    # The longest answer the schema admits: xgrammar 0.2.8 bounds a number's digits, so
    # {"result":-1234567.123456} is about as long as it gets; 64 leaves room for any range.
    MAX_TOKENS = 64

    def __init__(self, config: ScoreModelConfig, path: Path, sha256: str):
        self.config, self.path, self.sha256 = config, path, sha256
        self.low, self.high = config.range

    @property
    def prompt(self) -> Prompt:
        return compile_prompt(self.config.name, self.path, self.sha256,
                              [(m.role, m.text()) for m in self.config.input], field="input")

    def schema(self) -> JsonSchema:
        """``{"result": number}`` within the config's range (xgrammar enforces min and max)."""
        result = {"type": "number", "minimum": self.low, "maximum": self.high}
        return {"type": "object", "properties": {"result": result}, "required": ["result"],
                "additionalProperties": False}

    def sampling_overrides(self) -> dict[str, float]:
        """The config's sampling_params under grader's names (CLI options still win)."""
        params = self.config.sampling_params
        if params is None:
            return {}
        found = {"temperature": params.temperature, "top_p": params.top_p, "seed": params.seed,
                 "max_tokens": params.max_completions_tokens}
        return {k: v for k, v in found.items() if v is not None}

    def passed(self, result: float | None) -> bool | None:
        if result is None or self.config.pass_threshold is None:
            return None
        return result >= self.config.pass_threshold

    def record(self, item_id: Any, raw_output: str | None, finish_reason: str | None,
               **extra: Any) -> ScoreModelRecord:
        """Parse ``{"result": x}`` and check it against the range; never a guessed result."""
        common = {"raw_output": raw_output, "finish_reason": finish_reason, **extra}
        if finish_reason == "length":
            return self.failed(item_id, Status.TRUNCATED, "the answer reached max_tokens", **common)
        try:
            data = loads(raw_output or "")
        except ValueError as exc:  # bad syntax, a 5000-digit number, nesting too deep
            return self.failed(item_id, Status.PARSE_ERROR,
                               f"not JSON: {str(exc).removeprefix('invalid JSON: ')}", **common)
        value = data.get("result") if isinstance(data, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return self.failed(item_id, Status.PARSE_ERROR, 'no numeric "result"', **common)
        if not self.low <= value <= self.high:
            error = f"result {value} is outside the range [{self.low}, {self.high}]"
            return self.failed(item_id, Status.INVALID_COUNTS, error, **common)
        return _record(item_id, Status.OK, result=value, passed=self.passed(value), **common)

    def failed(self, item_id: Any, status: Status, error: str, **fields: Any) -> ScoreModelRecord:
        """A row without a result (not sent, overflow, engine error, unreadable answer)."""
        return _record(item_id, status, error=error, **fields)

    def describe(self) -> JudgeEntry:
        return {"type": "score_model", "name": self.config.name, "path": str(self.path),
                "sha256": self.sha256, "range": list(self.config.range),
                "pass_threshold": self.config.pass_threshold,
                "hosted_model_ignored": self.config.model}


def _record(item_id: Any, status: Status, **fields: Any) -> ScoreModelRecord:
    return ScoreModelRecord.build(id=item_id, status=str(status), **fields)


def load_grader_config(path: str | Path) -> ScoreModelGrader:
    """Read an OpenAI grader definition (JSON) and check it is a ``score_model``."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        data = loads(raw, bom=True)
    except OSError as exc:
        raise GraderConfigError(f"{path}: cannot read the file: {exc.strerror}") from None
    except ValueError as exc:  # JSONError: bad syntax or bytes, a huge number, deep nesting
        raise GraderConfigError(f"{path}: {exc}") from None
    if isinstance(data, dict) and data.get("type") not in (None, "score_model"):
        raise GraderConfigError(f"{path}: grader type {data.get('type')!r} is not supported; only "
                                "score_model runs on a local judge (string_check and "
                                "text_similarity need no model)")
    try:
        config = ScoreModelConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise GraderConfigError(f"{path}: {where}: {first['msg']}".replace(": : ", ": ")) from None
    grader = ScoreModelGrader(config, path, hashlib.sha256(raw).hexdigest())
    _check_sampling(path, grader)
    try:
        _ = grader.prompt  # compile now: a template error is the config's error
    except PromptError as exc:
        raise GraderConfigError(str(exc)) from None
    return grader


# grader's sampling names -> the config's (sampling_overrides maps them the other way)
_SAMPLING_FIELDS = {"max_tokens": "max_completions_tokens"}


def _check_sampling(path: Path, grader: ScoreModelGrader) -> None:
    """The config's sampling_params under grader's own bounds, blamed on the file's field: they
    become the run's sampling settings, whose error would name a command-line option instead."""
    try:
        SamplingConfig.model_validate(grader.sampling_overrides())
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        field = _SAMPLING_FIELDS.get(name, name)
        raise GraderConfigError(f"{path}: sampling_params.{field}: {first['msg']}") from None
