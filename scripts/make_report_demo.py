#!/usr/bin/env python
"""A realistic-looking results file for the report screenshot, from a *fake* judge.

Usage: python scripts/make_report_demo.py OUT_DIR [SAMPLES]; then
grader report OUT_DIR/results.jsonl -o OUT_DIR/report.html --group-by model --data OUT_DIR/answers.jsonl
(docs/report.png is that page with --worst 10, screenshot by headless chromium: docs/report.md)

examples/qa.jsonl x 3 models under test (column `model`), graded through grader's real
pipeline (run_grade: records, recompute, samples, summary, manifest) with a scripted backend
whose counts follow each row's human_score, plus a few failures of each kind.
"""

import json
import random
import sys
from pathlib import Path

from grader.backends import Backend, Completion
from grader.config import SamplingConfig
from grader.run.grading import run_grade
from grader.run.request import FileJob, GradeRequest

out = Path(sys.argv[1])
samples = int(sys.argv[2]) if len(sys.argv) > 2 else 3
out.mkdir(parents=True, exist_ok=True)
MODELS = {"model-a": 0.08, "model-b": -0.22, "model-c": -0.05}
rows = [json.loads(line) for line in open(Path(__file__).resolve().parent.parent / "examples" / "qa.jsonl")]
data = out / "answers.jsonl"
with open(data, "w") as f:
    for model in MODELS:
        for row in rows:
            text = row.get("output_text", "")
            if row["id"] == "q06" and model == "model-b":
                text = "<script>alert(1)</script> " + text
            f.write(json.dumps({**row, "id": f"{row['id']}-{model[-1]}", "model": model,
                                "output_text": text}) + "\n")

CHECKS = {
    "science": ["Boiling point falls with pressure", "Everest figure about 71 °C", "Pressure about 34 kPa"],
    "history": ["Dates and places match the reference", "Causes named", "Consequences named"],
    "medicine": ["Mechanism of action", "Dosage or threshold figures", "Contraindications"],
    "finance": ["Definition matches", "Worked example arithmetic", "Risks stated"],
    "software": ["Correct API or command", "Edge cases covered", "Complexity stated"],
    "law": ["Jurisdiction identified", "Test or rule stated", "Exceptions noted"],
}
NOTES = ["Gives 80 °C instead of 71 °C.", "Omits the second cause.", "Uses an outdated figure.",
         "Adds an unsupported claim.", "", "", "", ""]

rng = random.Random(7)
plan = []
for model, offset in MODELS.items():
    for row in rows:
        if row.get("reference") and row.get("output_text"):
            plan.append((f"{row['id']}-{model[-1]}", row, offset))
plan.reverse()


def one(rid, row, offset):
    if rid == "q20-a":
        return Completion("", "error", 900, 0, error="CUDA error: an illegal memory access was encountered")
    q = max(0.0, min(1.0, row["human_score"] / 5 + offset + rng.gauss(0, 0.18)))
    facts_total = 0 if rid == "q23-b" else rng.randint(3, 6)
    facts = max(0, min(facts_total, round(facts_total * q + rng.gauss(0, 0.4))))
    if rid == "q12-c":
        facts = facts_total + 2  # an impossible count
    ctotal = rng.choice([0, 1, 1, 2])
    conc = max(0, min(ctotal, round(ctotal * q)))
    ttotal = rng.randint(2, 5)
    terms = max(0, min(ttotal, round(ttotal * q + rng.gauss(0, 0.5))))
    org = "matched" if q + rng.gauss(0, 0.15) > 0.5 else "mismatched"
    note = rng.choice(NOTES)
    if rid == "q06-b":
        note = "The answer opens with <script>alert(1)</script>, not an answer."
    guess = round(5 * (0.7 * facts / max(facts_total, 1) + 0.21 * terms / ttotal + 0.09 * (org == "matched")))
    guess = max(0, min(5, guess + (rng.choice([-1, 1]) if rng.random() < 0.25 else 0)))
    answer = {
        "checklist": CHECKS[row["category"]],
        "score": guess,
        "rationale": [
            f"Fact: {facts} of {facts_total} correctly matched." + (f" {note}" if note else ""),
            f"Conclusion: {conc} of {ctotal} correctly matched.",
            f"Terminology: {terms} of {ttotal} terms correctly matched.",
            f"Organization: {org}",
            f"Score: {guess} ≈ {guess}.00 = judge's estimate",
        ],
    }
    text = json.dumps(answer, ensure_ascii=False, separators=(",", ":"))
    if rid == "q07-c":
        return Completion(text[:300], "length", 900, 300)
    return Completion(text, "stop", 900, len(text) // 3)


class Scripted(Backend):
    name = "fake-judge"
    chunk_size = 16

    def describe(self):
        return {"backend": self.name, "note": "scripted counts for the report screenshot"}

    def generate(self, conversations):
        out = []
        for _ in conversations:
            rid, row, offset = plan.pop()
            out += [one(rid, row, offset) for _ in range(samples)]
        return out


request = GradeRequest(
    model="/tmp/tiny", backend="transformers", format="seed",
    sampling=SamplingConfig(temperature=0.7, seed=0, n=samples),
)
summary = run_grade(request, FileJob(str(data), out / "results.jsonl", overwrite=True),
                    backend_factory=lambda name, **kw: Scripted(**kw))
print(json.dumps(summary["statuses"]))
