"""Build the benchmarking data set: every question of examples/qa.jsonl with four answers.

Comparing models on one benchmark means several answers per reference; this is that case,
built deterministically from the examples (no model, no randomness):

    original    the row's own answer
    truncated   its first half (cut at a word boundary)
    dropped     the first, third, ... sentences removed (one sentence: its second half)
    other       the answer to another question (the next row's, cyclically)

Each row keeps the question's ``input`` and ``reference``; ``id`` is ``<id>:<variant>`` and
``variant`` names it. A human score is not carried over (the variants have none).

    python scripts/make_multi_answer_examples.py -o examples/qa_multi.jsonl

It imports nothing from grader; grader never imports it.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("original", "truncated", "dropped", "other")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def truncated(text: str) -> str:
    words = text.split()
    return " ".join(words[: max(1, len(words) // 2)])


def dropped(text: str) -> str:
    """The first, third, ... sentences removed (so it never starts as ``truncated`` does); a
    one-sentence answer keeps its second half instead."""
    sentences = _SENTENCE.split(text.strip())
    if len(sentences) > 1:
        return " ".join(sentences[1::2])
    words = text.split()
    return " ".join(words[len(words) // 2:])


def multi_answer_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for index, row in enumerate(rows):
        answer = str(row["output_text"])
        other = str(rows[(index + 1) % len(rows)]["output_text"])
        answers = {"original": answer, "truncated": truncated(answer),
                   "dropped": dropped(answer), "other": other}
        for variant in VARIANTS:
            out.append({"id": f"{row['id']}:{variant}", "variant": variant,
                        "input": row.get("input", ""), "reference": row["reference"],
                        "output_text": answers[variant]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, nargs="?", default=ROOT / "examples" / "qa.jsonl")
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.data.read_text(encoding="utf-8").splitlines()
            if line.strip()]
    # rows without both texts are no benchmark case (examples/ holds some, on purpose)
    rows = [r for r in rows if str(r.get("reference") or "").strip()
            and str(r.get("output_text") or "").strip()]
    out = multi_answer_rows(rows)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in out),
                           encoding="utf-8")
    print(f"{args.output}: {len(out)} rows, {len(rows)} references x {len(VARIANTS)} answers")


if __name__ == "__main__":
    main()
