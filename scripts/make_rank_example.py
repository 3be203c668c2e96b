"""Three results files for ``grader rank``, made from examples/qa_multi.jsonl with no model.

examples/qa_multi.jsonl holds four answers to each of 21 questions (``variant``: original,
truncated, dropped, other). Each of the first three variants plays one model under test: its
answers go to ``OUT/data/VARIANT.jsonl`` (``id`` the question's, so the three files are over
the same rows), and ``grader grade`` grades them (``run_grade``, the seed format) with a
scripted judge that needs no model: it counts a reference sentence as matched when at least
half of its content words are in the answer (``grader.analysis.floor``), the word-overlap
floor of ``grader agree``. The results go to ``OUT/results/VARIANT.jsonl``.

    PYTHONPATH=. .venv/bin/python scripts/make_rank_example.py /tmp/rank-example
    grader rank /tmp/rank-example/results/*.jsonl --html /tmp/rank-example/rank.html
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the scripted seed answer of the test suite

from answers import answer  # noqa: E402

from grader.analysis.floor import item_present, reference_facts  # noqa: E402
from grader.backends import Backend, Completion  # noqa: E402
from grader.judge.rubric import content_words  # noqa: E402
from grader.run.grading import run_grade  # noqa: E402
from grader.run.request import FileJob, GradeRequest  # noqa: E402

VARIANTS = ("original", "truncated", "dropped")


class OverlapJudge(Backend):
    """A seed-format judge by word overlap: the row is found by its answer in the prompt."""

    name = "overlap"

    def __init__(self, rows: list[dict[str, Any]]):
        # longest answers first, so that an answer that is a prefix of another never wins
        self.rows = sorted(rows, key=lambda r: -len(r["output_text"]))
        self.chunk_size = 8

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}

    def generate(self, requests):
        return [Completion(self._verdict(r.messages), "stop", 10, 5) for r in requests]

    def _verdict(self, conversation: list[dict]) -> str:
        text = "\n".join(str(m.get("content", "")) for m in conversation)
        row = next(r for r in self.rows if r["output_text"] in text)
        facts = reference_facts(row["reference"])
        words = content_words(row["output_text"])
        matched = sum(item_present(f, words) for f in facts)
        return answer(facts=(matched, len(facts)), conclusions=(0, 0), terms=(0, 0), score=0)


def main(out: Path) -> None:
    rows = [json.loads(line) for line in open(ROOT / "examples" / "qa_multi.jsonl", encoding="utf-8")]
    for variant in VARIANTS:
        chosen = [{"id": r["id"].split(":")[0], "input": r["input"], "reference": r["reference"],
                   "output_text": r["output_text"]} for r in rows if r["variant"] == variant]
        data = out / "data" / f"{variant}.jsonl"
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chosen),
                        encoding="utf-8")
        request = GradeRequest(model="word-overlap", backend="transformers", format="seed",
                               controls=0)  # the example ranks answers; no judge check
        job = FileJob(str(data), out / "results" / f"{variant}.jsonl", overwrite=True)
        judge = OverlapJudge(chosen)
        summary = run_grade(request, job, backend_factory=lambda name, **_: judge)  # noqa: B023
        print(f"{variant}: {summary['rows']} rows, mean score {summary['mean_score']}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "rank-example"))
