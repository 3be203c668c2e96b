"""Every script in scripts/ runs, in a small mode: a refactor cannot break one silently.

docs/benchmarks.md tells users to run these; each entry below is the smallest run that goes
through the script's whole path (the tiny model, a few rows, one repeat). A script added to
scripts/ without an entry here fails ``test_every_script_has_a_small_run``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# What runs each script elsewhere, where a run here would repeat a test that exists.
ELSEWHERE = {
    "setup.sh": ".ci/run runs it from a fresh clone before the tests",
    "demo.sh": "tests/test_demo_output.py",
    "fetch_judge.py": "tests/test_fetch_judge.py",
    "make_tiny_model.py": "tests/conftest.py (the tiny_model fixture)",
}


def _few_rows(tmp: Path, count: int = 3, source: Path = EXAMPLES / "qa.jsonl") -> Path:
    rows = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [r for r in rows if r.get("reference") and r.get("output_text")][:count]
    path = tmp / "few.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# name -> (arguments, given the tiny model and a temporary folder; whether it runs a model:
# those are `slow`, as every test that runs the tiny model; CI runs them all the same)
Small = Callable[[Path, Path], list[str]]
SMALL: dict[str, tuple[Small, bool]] = {
    "bench_pipeline.py": (lambda model, tmp: [
        "--rows", "200", "--rescore-rows", "300", "--repeat", "1", "--work", str(tmp)], False),
    "bench_read.py": (lambda model, tmp: ["--rows", "500", "--repeat", "1"], False),
    "bench_resume.py": (lambda model, tmp: ["--rows", "300", "--work", str(tmp)], False),
    "bench_vllm.py": (lambda model, tmp: [
        "--model", str(model), "--rows", "4", "--dry-run", "--data", str(_few_rows(tmp))], False),
    "bench_transformers.py": (lambda model, tmp: [
        "--model", str(model), "--rows", "2", "--repeats", "1", "--max-tokens", "64",
        "--data", str(_few_rows(tmp))], True),
    "judge_sanity.py": (lambda model, tmp: [
        str(_few_rows(tmp)), "--model", str(model), "--format", "seed", "--limit", "2",
        "--out", str(tmp / "sanity")], True),
    "bench_pairwise.py": (lambda model, tmp: [
        "--model", str(model), "--data", str(_few_rows(tmp, 4, EXAMPLES / "qa_multi.jsonl")),
        "--only", "pairwise", "--out", str(tmp / "pairwise")], True),
    "bench_controls.py": (lambda model, tmp: [
        "--model", str(model), "--backend", "transformers", "--repeats", "1", "--controls", "2",
        "--data", str(_few_rows(tmp, 4)), "--format", "seed", "--max-tokens", "64"], True),
    "bench_server.py": (lambda model, tmp: ["--model", str(model), "--rows", "4"], True),
    "bench_rank.py": (lambda model, tmp: ["--models", "4", "--rows", "20", "--rounds", "10"], False),
    "sim_judge_check.py": (lambda model, tmp: ["--runs", "20"], False),
    "bench_inspect.py": (lambda model, tmp: [
        "--model", str(model), "--data", str(_few_rows(tmp, 3)), "--controls", "0",
        "--max-tokens", "64"], True),
    "make_multi_answer_examples.py": (lambda model, tmp: ["-o", str(tmp / "multi.jsonl")], False),
    "make_rank_example.py": (lambda model, tmp: [str(tmp / "rank-example")], False),
    "make_report_demo.py": (lambda model, tmp: [str(tmp / "report-demo"), "1"], False),
}


def test_every_script_has_a_small_run():
    scripts = {p.name for p in (ROOT / "scripts").iterdir() if p.suffix in (".py", ".sh")}
    assert scripts - set(SMALL) - set(ELSEWHERE) == set(), "add a small run of the new script here"
    assert set(SMALL) | set(ELSEWHERE) <= scripts, "an entry names a script that is gone"


def _params() -> list:
    return [pytest.param(name, marks=[pytest.mark.slow] if model else [], id=name)
            for name, (_, model) in sorted(SMALL.items())]


@pytest.mark.parametrize("name", _params())
def test_the_script_runs_in_a_small_mode(name, tiny_model, tmp_path):
    arguments, _ = SMALL[name]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / name), *arguments(tiny_model, tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
