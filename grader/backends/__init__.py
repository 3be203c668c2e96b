"""The one backend interface, and a registry that imports a backend only when it is chosen.

A backend takes a batch of chat conversations and returns one :class:`Completion` per
conversation, in input order. The JSON schema arrives as a plain dict at construction, so
backends never import the verdict models.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Message = dict[str, str]

# "module:Class" strings: importing grader.backends imports neither torch nor vllm.
BACKENDS = {
    "transformers": "grader.backends.transformers_backend:TransformersBackend",
    "vllm": "grader.backends.vllm_backend:VLLMBackend",
}


class EngineUnavailable(RuntimeError):
    """The chosen engine cannot run here (no GPU, an unsupported version): one line says why."""


class EngineSettingsError(ValueError):
    """A setting the engine refuses (an unknown engine argument, a value out of range)."""


@dataclass(frozen=True)
class Completion:
    """One judge answer.

    ``finish_reason`` is ``"stop"`` (the answer ended on its own), ``"length"`` (cut at
    max_tokens) or ``"error"`` (the engine failed this row alone; ``error`` says why).
    """

    text: str
    finish_reason: str
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None


class Backend(Protocol):
    name: str
    # rows per generate() call the pipeline should send (a progress step; a crash loses at most this)
    chunk_size: int

    def generate(self, conversations: Sequence[list[Message]]) -> list[Completion]:
        """One completion per conversation, in input order."""
        ...

    def describe(self) -> dict[str, Any]:
        """What produced the answers (model, device, versions), for the run manifest."""
        ...


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


def choose_backend(name: str) -> tuple[str, str]:
    """Resolve ``auto``: vLLM when it imports and a CUDA device is present, else transformers.

    Returns the backend name and the reason, for one log line.
    """
    if name != "auto":
        return name, "asked for"
    if importlib.util.find_spec("vllm") is None:
        return "transformers", "vllm is not installed"
    import torch  # only here: `auto` is resolved when a model is about to be loaded anyway

    if not torch.cuda.is_available():
        return "transformers", "no CUDA device is visible"
    return "vllm", f"vllm is installed and {torch.cuda.device_count()} CUDA device(s) are visible"


def load_backend(name: str, **options: Any) -> Backend:
    """Import and construct the backend called ``name``."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: choose from {', '.join(sorted(BACKENDS))}")
    module_name, _, class_name = BACKENDS[name].partition(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    return backend_class(**options)
