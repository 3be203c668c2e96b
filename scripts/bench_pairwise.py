"""Pairwise judging (--format pairwise, both orders) against absolute grading, on the
benchmarking case: the four answers per question of examples/qa_multi.jsonl.

The pairs: for each question, its original answer against each of the three worse ones
(``truncated``, ``dropped``, ``other``: scripts/make_multi_answer_examples.py), 63 pairs; the
original is ``output_a`` in every other pair and ``output_b`` in the rest, so that a judge that
favours a place is not mistaken for one that favours the original. Each pair's models are its
two variants' names.

It grades the pairs in the pairwise format (two games a pair) and the 84 answers in an
absolute format (the rubric format, rubric pass included, by default), each with its own
engine, and prints one JSON object: for each, the time in the backend's generate() (loading
excluded), rows/s, and how often the original won (the pairwise winner; the absolute
format: the original scored higher than the other answer to its question), with the pairwise
summary (position consistency, first-position win rate).

    flock /tmp/grader-heavy.lock env PYTHONPATH=. .venv/bin/python scripts/bench_pairwise.py \\
        --model ~/.cache/grader/models/SmolLM2-135M-Instruct --out /tmp/bench-pairwise

It imports grader; grader never imports it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from judge_sanity import CachedBackends  # scripts/ is this script's own folder

from grader.config import SamplingConfig, VLLMConfig
from grader.io.results import read_records
from grader.run.grading import run_grade
from grader.run.request import FileJob, GradeRequest

ROOT = Path(__file__).resolve().parent.parent
WORSE = ("truncated", "dropped", "other")


def read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def make_pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each question's original answer against each worse one, the original A and B in turn."""
    by_question: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        question, variant = row["id"].split(":")
        by_question.setdefault(question, {})[variant] = row
    pairs = []
    for question, variants in by_question.items():
        original = variants["original"]
        for worse in WORSE:
            other = variants[worse]
            first, second = (original, other) if len(pairs) % 2 == 0 else (other, original)
            pairs.append({
                "id": f"{question}:original-{worse}",
                "input": original["input"], "reference": original["reference"],
                "output_a": first["output_text"], "output_b": second["output_text"],
                "model_a": first["variant"], "model_b": second["variant"],
            })
    return pairs


def grade(data: Path, output: Path, args: argparse.Namespace, answer_format: str,
          **request: Any) -> tuple[dict[str, Any], list[Any], float, float]:
    """One format's run on its own engine: the summary, the records, the seconds in
    generate() and the run's wall seconds (the engine's start excluded: it loads before)."""
    factory = CachedBackends()
    try:
        vllm = VLLMConfig(enforce_eager=True, **({"dtype": args.dtype} if args.dtype else {}))
        grade_request = GradeRequest(
            model=args.model, backend="vllm", format=answer_format, vllm=vllm,
            **{"sampling": SamplingConfig(), **request})
        # the engine is started by the first call for it: a run of one row, discarded
        warm = output.with_name(output.stem + ".warmup.jsonl")
        run_grade(grade_request, FileJob(str(data), warm, overwrite=True, limit=1),
                  backend_factory=factory)
        before = factory.seconds()
        started = time.perf_counter()
        summary = run_grade(grade_request, FileJob(str(data), output, overwrite=True),
                            backend_factory=factory)
        wall = time.perf_counter() - started
        seconds = factory.seconds() - before
    finally:
        factory.close()
    return summary, [record for _, record in read_records(output)], seconds, wall


def pairwise_figures(pairs: list[dict[str, Any]], records: list[Any]) -> dict[str, Any]:
    """How often the original won, tied, lost; by the worse answer's kind too."""
    outcome: dict[str, dict[str, int]] = {}
    for pair, record in zip(pairs, records, strict=True):
        kind = pair["id"].split("-")[-1]
        original = "A" if pair["model_a"] == "original" else "B"
        result = ("failed" if record.winner is None else "tie" if record.winner == "tie"
                  else "original" if record.winner == original else "worse")
        counts = outcome.setdefault(kind, {"original": 0, "tie": 0, "worse": 0, "failed": 0})
        counts[result] += 1
    return outcome


def confidence_figures(pairs: list[dict[str, Any]], records: list[Any]) -> dict[str, Any]:
    """--confidence: the mean over the pairs of P(original wins) and P(worse wins), each the
    mean of the two orders' probabilities in the row's labels, and in how many pairs the
    original's is the higher: whether the judge prefers the original below its favourite place."""
    mine, theirs, higher, read = [], [], 0, 0
    for pair, record in zip(pairs, records, strict=True):
        confidence = record.confidence if isinstance(record.confidence, dict) else None
        if confidence is None:
            continue
        original = "A" if pair["model_a"] == "original" else "B"
        worse = "B" if original == "A" else "A"
        read += 1
        mine.append(confidence["p"][original])
        theirs.append(confidence["p"][worse])
        higher += confidence["p"][original] > confidence["p"][worse]
    first = [g["confidence"]["A"] for r in records if r.games for g in r.games
             if isinstance(g.get("confidence"), dict)]
    return {
        "pairs_read": read,
        "p_original": round(sum(mine) / read, 4) if read else None,
        "p_worse": round(sum(theirs) / read, 4) if read else None,
        "original_higher": higher,
        # P(the answer shown first), over every game: the judge's own position bias
        "p_first_shown": round(sum(first) / len(first), 4) if first else None,
    }


def absolute_figures(pairs: list[dict[str, Any]], records: list[Any]) -> dict[str, Any]:
    """The same pairs read from the absolute scores: the original above, level, below."""
    scores = {record.id: record.score for record in records}
    outcome: dict[str, dict[str, int]] = {}
    for pair in pairs:
        question, kind = pair["id"].split(":")[0], pair["id"].split("-")[-1]
        mine, theirs = scores.get(f"{question}:original"), scores.get(f"{question}:{kind}")
        result = ("failed" if mine is None or theirs is None else "tie" if mine == theirs
                  else "original" if mine > theirs else "worse")
        counts = outcome.setdefault(kind, {"original": 0, "tie": 0, "worse": 0, "failed": 0})
        counts[result] += 1
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the judge's model directory")
    parser.add_argument("--data", type=Path, default=ROOT / "examples" / "qa_multi.jsonl")
    parser.add_argument("--absolute", default="rubric", choices=("rubric", "itemized", "seed"),
                        help="the absolute format to compare with [default: rubric]")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--confidence", action="store_true",
                        help="the pairwise run with --confidence (logprobs 5): P(original wins)")
    parser.add_argument("--only", choices=("pairwise", "absolute"), default=None,
                        help="one of the two runs [default: both]")
    parser.add_argument("--out", type=Path, default=Path("bench-pairwise"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = read_rows(args.data)
    pairs = make_pairs(rows)
    pairs_file = args.out / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs),
                          encoding="utf-8")

    result: dict[str, Any] = {}
    if args.only != "absolute":
        sampling = SamplingConfig(logprobs=5) if args.confidence else SamplingConfig()
        result["pairwise"] = measure_pairwise(pairs, pairs_file, args, sampling)
    if args.only != "pairwise":
        result[args.absolute] = measure_absolute(pairs, args)
    (args.out / "bench.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


def measure_pairwise(pairs: list[dict[str, Any]], pairs_file: Path, args: argparse.Namespace,
                     sampling: SamplingConfig) -> dict[str, Any]:
    summary, records, seconds, wall = grade(pairs_file, args.out / "pairwise.jsonl", args,
                                            "pairwise", sampling=sampling)
    games = 2 * sum(1 for r in records if r.games)
    tokens = [g["usage"]["prompt_tokens"] for r in records if r.games for g in r.games
              if isinstance(g.get("usage"), dict)]
    measured = {
        "pairs": len(pairs), "games": games, "seconds": round(seconds, 1), "wall": round(wall, 1),
        "pairs_per_second": round(len(pairs) / seconds, 3),
        "games_per_second": round(games / seconds, 3),
        "prompt_tokens_per_game": round(sum(tokens) / len(tokens)) if tokens else None,
        "statuses": {k: v for k, v in summary["statuses"].items() if v},
        "summary": summary["pairwise"],
        "original_against": pairwise_figures(pairs, records),
    }
    if sampling.logprobs:
        measured["confidence"] = confidence_figures(pairs, records)
    return measured


def measure_absolute(pairs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    summary, records, seconds, wall = grade(args.data, args.out / "absolute-results.jsonl",
                                            args, args.absolute)
    return {
        "rows": len(records), "seconds": round(seconds, 1), "wall": round(wall, 1),
        "rows_per_second": round(len(records) / seconds, 3),
        "statuses": {k: v for k, v in summary["statuses"].items() if v},
        "original_against": absolute_figures(pairs, records),
    }


if __name__ == "__main__":
    main()
