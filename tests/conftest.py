"""Shared fixtures: offline Hugging Face, the tiny model, a fake backend, temporary work dirs."""

from __future__ import annotations

import importlib.util
import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

# Before anything imports huggingface_hub: tests never reach the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _load_script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A deterministic random-weight Llama chat model, built once per test session."""
    return _load_script("make_tiny_model").make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """Every test runs in its own empty directory, so relative outputs never land in the repo."""
    monkeypatch.chdir(tmp_path)


class FakeBackend:
    """A backend with a queue of replies and a history of what it was sent (llm's MockModel)."""

    name = "fake"

    def __init__(self, replies: Sequence[Any] = (), *, chunk_size: int = 4, default: Any = None):
        # A reply is a Completion, an exception to raise for that whole call, or a str (stop).
        self.replies = deque(replies)
        self.default = default
        self.chunk_size = chunk_size
        self.calls: list[list[list[dict]]] = []

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}

    def generate(self, conversations):
        from grader.backends import Completion

        self.calls.append([list(c) for c in conversations])
        out = []
        for _ in conversations:
            reply = self.replies.popleft() if self.replies else self.default
            if isinstance(reply, BaseException):
                raise reply
            if callable(reply):
                reply = reply()
            out.append(reply if isinstance(reply, Completion) else Completion(reply, "stop", 10, 5))
        return out


@pytest.fixture
def fake_backend_factory():
    """A backend factory for ``run_grade`` that hands out one FakeBackend and remembers it."""

    class Factory:
        backend: FakeBackend | None = None
        replies: list[Any] = []
        default: Any = None

        def __call__(self, name: str, **options: Any) -> FakeBackend:
            self.options = options
            self.backend = FakeBackend(self.replies, default=self.default)
            return self.backend

    return Factory()
