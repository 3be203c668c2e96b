"""The one backend interface, and a registry that imports a backend only when it is chosen.

A backend takes a batch of chat conversations and returns one :class:`Completion` per
conversation, in input order. The JSON schema arrives as a plain dict at construction, so
backends never import the verdict models.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Message = dict[str, str]

# "module:Class" strings: importing grader.backends imports neither torch nor vllm.
BACKENDS = {
    "transformers": "grader.backends.transformers_backend:TransformersBackend",
}


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


def load_backend(name: str, **options: Any) -> Backend:
    """Import and construct the backend called ``name``."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: choose from {', '.join(sorted(BACKENDS))}")
    module_name, _, class_name = BACKENDS[name].partition(":")
    backend_class = getattr(importlib.import_module(module_name), class_name)
    return backend_class(**options)
