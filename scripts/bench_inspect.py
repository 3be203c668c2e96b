#!/usr/bin/env python
"""grader's inspect_ai scorer against ``grader grade`` on the same log: rows/s of each.

The log is written once, by inspect_ai's ``eval`` with mockllm answering each row of DATA with
its ``output_text``. Then, alternating, each in a fresh process (the model loaded once in each,
as a user's run loads it):

- **grade**: ``grader.grade_file(LOG, ...)``, what ``grader grade LOG -m DIR`` runs;
- **scorer**: ``inspect_ai.score(log, reference_judge(model=DIR, ...), action="append")``, what
  ``inspect score LOG --scorer grader/reference_judge -S model=DIR`` runs (samples scored
  concurrently, batched into one engine by grader's batcher), its judge check included.

Both with the same settings (and the same controls: the scorer grades them when inspect
computes its metrics). Per run: wall seconds from the call to its return (imports excluded,
model load included), rows/s (the log's samples over the wall), and the scorer's engine calls.

Usage::

    python scripts/bench_inspect.py --model DIR [--data examples/qa.jsonl] [--backend transformers] \\
        [--controls 50] [--repeats 1] [--max-tokens N]

Imports grader; grader never imports this file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local model directory")
    parser.add_argument("--data", default=str(ROOT / "examples" / "qa.jsonl"))
    parser.add_argument("--backend", default="transformers")
    parser.add_argument("--controls", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each")
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--worker", choices=("grade", "scorer"), help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {"backend": args.backend, "controls": args.controls}
    if args.max_tokens is not None:
        settings["max_tokens"] = args.max_tokens
    return settings


def write_log(data: Path, where: Path) -> Path:
    """DATA's rows as an inspect_ai log: mockllm answers each input with its output_text."""
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.solver import generate

    rows = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    answers = {row["input"]: row.get("output_text") or "" for row in rows}

    def reply(messages: Any, tools: Any, tool_choice: Any, config: Any) -> ModelOutput:
        output = ModelOutput.from_content(model="mockllm", content=answers[messages[-1].text])
        output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return output

    task = Task(dataset=[Sample(id=str(row["id"]), input=row["input"],
                                target=row.get("reference") or "") for row in rows],
                solver=[generate()], model=get_model("mockllm/model", custom_outputs=reply))
    inspect_eval(task, display="none", log_dir=str(where))
    [log] = where.glob("*.eval")
    return log


def worker(args: argparse.Namespace) -> None:
    """One timed run in this process; prints its JSON."""
    settings = _settings(args)
    if args.worker == "grade":
        import grader

        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            result = grader.grade_file(args.log, Path(tmp) / "r.jsonl", args.model, **settings)
            seconds = time.perf_counter() - start
        rows, calls = result.summary.rows, None
        verdict = result.summary.judge_check.verdict if result.summary.judge_check else None
    else:
        from inspect_ai import score
        from inspect_ai.log import read_eval_log

        from grader import inspect_scorer

        log = read_eval_log(args.log)
        start = time.perf_counter()
        scored = score(log, inspect_scorer.reference_judge(model=args.model, **settings),
                       action="append", display="none")
        seconds = time.perf_counter() - start
        rows = len(scored.samples or [])
        [batcher] = inspect_scorer._BATCHERS.values()
        calls = batcher.calls
        metrics = scored.results.scores[-1].metrics if scored.results else {}
        verdict = next((m for m in ("informative", "weak", "no_signal", "too_few")
                        if m in metrics), None)
    print(json.dumps({"seconds": seconds, "rows": rows, "calls": calls, "verdict": verdict}))


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        log = write_log(Path(args.data), Path(tmp) / "logs")
        passed = [a for a in (argv if argv is not None else sys.argv[1:])]
        runs: list[tuple[str, dict[str, Any]]] = []
        for _ in range(args.repeats):
            for mode in ("grade", "scorer"):
                done = subprocess.run([sys.executable, __file__, *passed, "--worker", mode,
                                       "--log", str(log)], capture_output=True, text=True)
                if done.returncode != 0:
                    sys.exit(f"{mode} failed:\n{done.stderr[-3000:]}")
                runs.append((mode, json.loads(done.stdout.strip().splitlines()[-1])))
    print("| run | s | rows | rows/s | engine calls | verdict |")
    print("|---|---|---|---|---|---|")
    for mode, run in runs:
        print(f"| {mode} | {run['seconds']:.1f} | {run['rows']} | "
              f"{run['rows'] / run['seconds']:.3f} | {run['calls'] or '-'} | {run['verdict']} |")
    best = {mode: max(r["rows"] / r["seconds"] for m, r in runs if m == mode)
            for mode in ("grade", "scorer")}
    print(f"\nscorer / grade rows/s (best of each): {best['scorer'] / best['grade']:.2f}")


if __name__ == "__main__":
    main()
