#!/usr/bin/env bash
# Grade examples/qa.jsonl. With MODEL=DIR it uses that local model (greedy); without, it builds
# the tiny random-weight model and samples at temperature 1 (see README, "The demo").
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${MODEL:-}" ]; then
  .venv/bin/grader grade examples/qa.jsonl --model "$MODEL" -o demo/results.jsonl "$@"
else
  .venv/bin/python scripts/make_tiny_model.py demo/tiny-model
  .venv/bin/grader grade examples/qa.jsonl --model demo/tiny-model -o demo/results.jsonl \
    --temperature 1 --seed 0 "$@"
  cat <<'NOTE'

The tiny model has random weights: every answer above is schema-valid JSON (guided decoding),
but its counts are noise, so most rows are invalid_counts and the few ok scores mean nothing.
For real grades: MODEL=/path/to/judge-model bash scripts/demo.sh
NOTE
fi
