"""A real instruct judge (SmolLM2-135M-Instruct, scripts/fetch_judge.py) through the whole CLI,
on both engines: what random weights cannot show.

A 135M model is a weak judge: these tests check that its answers go through grader as a real
judge's would (schema-valid, finished or truncated, never a parse or engine error, the real
tokens counted), not that its grades are good; docs/benchmarks.md has what it measured.
"""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import pytest
from conftest import EXAMPLES

from grader.io.results import read_records
from grader.judge.schema import format_schema

pytestmark = pytest.mark.slow

ROWS = 2  # the first rows of examples/qa.jsonl, both with a reference and an answer
# This judge fills every string the schema allows (hundreds of tokens a verdict): on 2 CPU cores
# the full answers of 4 rows take over 7 minutes with transformers. Capped, most rows end
# `truncated`, which is a real judge's path through grader too.
MAX_TOKENS = 128


@pytest.mark.parametrize("backend", ["vllm", "transformers"])
def test_the_real_judge_grades_the_examples(judge_model, tmp_path, backend):
    out = tmp_path / "results.jsonl"
    extra = ["--enforce-eager"] if backend == "vllm" else []
    result = subprocess.run(
        [sys.executable, "-m", "grader", "grade", str(EXAMPLES / "qa.jsonl"), "--model",
         str(judge_model), "-o", str(out), "--backend", backend, "--limit", str(ROWS),
         "--max-tokens", str(MAX_TOKENS), "--format", "itemized", *extra],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [r.to_dict() for _, r in read_records(out)]
    assert len(records) == ROWS
    for record in records:
        assert record["status"] not in {"parse_error", "engine_error"}, record
        assert record["finish_reason"] in {"stop", "length"}
        assert record["format"] == "itemized"
        if record["finish_reason"] == "stop":
            jsonschema.validate(json.loads(record["raw_output"]), format_schema("itemized"))
        assert 0 < record["usage"]["output_tokens"] <= MAX_TOKENS
        assert (record["status"] == "truncated") == (record["finish_reason"] == "length")
    summary = json.loads((tmp_path / "results.summary.json").read_text())
    assert summary["run"]["engine"]["backend"] == backend
    assert summary["run"]["model"]["name"] == str(judge_model)
