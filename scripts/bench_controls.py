#!/usr/bin/env python
"""What grade's controls cost: DATA graded without controls (``--controls 0``) and with them,
on one engine, and the verdict the controls give.

The engine starts once (a warm-up run on two rows first); then each run grades DATA from
scratch (its own output, its rubrics drafted again; with --fixed-rubric, marked against the
rubrics the warm-up run drafted from all of DATA, so that only the check pass is timed), the
prefix cache reset before each, the two settings alternating. Per run it prints the wall seconds, rows/s (DATA's rows over the
wall: what a user sees), the control rows (the first group graded with pass 2's last block,
so they have no time of their own; a later group only while the sequential check is open),
the references the check used, why it stopped, and the verdict.

Usage::

    python scripts/bench_controls.py --model DIR [--data examples/qa_multi.jsonl] \\
        [--controls 50] [--repeats 2] [--backend vllm] [--enforce-eager] [--json out.json]

Imports grader; grader never imports this file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from grader.api import _job, _request, _settings  # noqa: E402
from grader.run.executor import LocalExecutor  # noqa: E402
from grader.run.grading import run_grade  # noqa: E402


class _KeptOpen(LocalExecutor):
    """A local executor that one run starts and no run closes: every timed run grades on the
    engine the warm-up loaded (each run's plan is the same but for its judge, and a worker
    reads records with the judge of the rows it is given)."""

    def start(self, plan: Any) -> None:
        if self.worker is None:
            super().start(plan)

    def close(self) -> None:
        """Kept for the next run: :meth:`shut` closes it."""

    def shut(self) -> None:
        super().close()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a local model directory")
    parser.add_argument("--data", default=str(ROOT / "examples" / "qa_multi.jsonl"))
    parser.add_argument("--controls", type=int, default=50, help="the run with controls")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each setting")
    parser.add_argument("--backend", default="vllm")
    parser.add_argument("--enforce-eager", action="store_true", default=None)
    parser.add_argument("--format", default=None, help="default: grade's (rubric)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="default: the schema's bound (a small one: a quick smoke run)")
    parser.add_argument("--fixed-rubric", action="store_true",
                        help="the warm-up run drafts DATA's rubrics once; every timed run marks "
                        "its answers against them (--rubric): the check pass alone is timed")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    rows = sum(1 for line in open(args.data, encoding="utf-8") if line.strip())
    settings = {"backend": args.backend, "enforce_eager": args.enforce_eager,
                "format": args.format, "overwrite": True,
                **({"max_tokens": args.max_tokens} if args.max_tokens else {})}
    executor = _KeptOpen()
    figures: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-controls-") as scratch:
        try:
            warm_out = Path(scratch) / "warm.jsonl"
            warm = _settings(None, settings | {
                "controls": 0, **({} if args.fixed_rubric else {"limit": 2})})
            run_grade(_request(args.model, warm), _job(args.data, warm_out, warm), executor)
            if args.fixed_rubric:
                settings["rubric"] = str(Path(scratch) / "warm.rubric.jsonl")
            plan = [0, args.controls] * args.repeats
            for index, controls in enumerate(plan):
                backend = executor.worker.backend if executor.worker is not None else None
                if backend is not None and hasattr(backend, "llm"):
                    backend.llm.reset_prefix_cache()
                out = Path(scratch) / f"run{index}.jsonl"
                given = _settings(None, settings | {"controls": controls})
                request, job = _request(args.model, given), _job(args.data, out, given)
                started = time.perf_counter()
                summary = run_grade(request, job, executor)
                wall = time.perf_counter() - started
                check = summary.get("judge_check") or {}
                figure = {
                    "controls": controls, "rows": rows, "wall_s": round(wall, 2),
                    "rows_per_s": round(rows / wall, 3),
                    "control_rows": (check.get("controls") or {}).get("rows", 0),
                    "verdict": check.get("verdict"),
                    # the sequential check: the references it used and why it stopped
                    "references": check.get("references"),
                    "stopped": (check.get("sequential") or {}).get("stopped"),
                    "above_both": (check.get("above_both") or {}).get("count"),
                    "scored": check.get("scored"),
                    "wrong": {k: (check.get("wrong") or {}).get(k) for k in ("above", "tied", "below")},
                    "mean_scores": check.get("mean_scores"),
                }
                figures.append(figure)
                print(json.dumps(figure), flush=True)
        finally:
            executor.shut()
    base = [f["wall_s"] for f in figures if f["controls"] == 0]
    with_controls = [f["wall_s"] for f in figures if f["controls"] != 0]
    slower = sum(with_controls) / len(with_controls) / (sum(base) / len(base)) - 1
    print(f"with --controls {args.controls}: {slower:+.0%} wall against --controls 0 "
          f"(means of {len(base)} runs each)")
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": figures, "slower": round(slower, 4)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
