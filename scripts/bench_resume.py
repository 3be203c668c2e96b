#!/usr/bin/env python
"""Peak memory of a resume from a large ``.partial``, against a fresh run of the same rows.

A fresh run grades ``--rows`` synthetic rows (``scripts/bench_pipeline.py``'s data) with an
instant fake judge; its results file is then turned into the ``.partial`` an interrupted run
leaves (the summary removed), and a rerun resumes every row from it, loading no model. Each
run is a fresh process; its peak RSS is its VmHWM. ``--grader DIR`` measures another checkout
(main, say) with the same data.

Usage::

    python scripts/bench_resume.py --rows 300000
    python scripts/bench_resume.py --rows 300000 --grader /path/to/other/checkout

Imports grader; grader never imports this file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(data: str, output: str, resume: bool) -> None:
    """One run in this process; prints one JSON line."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_pipeline import judge_answers, peak_rss_mb

    import grader
    from grader.backends import Backend, Completion
    from grader.run.grading import run_grade
    from grader.run.request import FileJob, GradeRequest

    answers = judge_answers()

    class Instant(Backend):
        chunk_size = 512
        sent = 0

        def describe(self):
            return {"backend": "instant"}

        def generate(self, conversations):
            out = []
            for _ in conversations:
                out.append(Completion(answers[Instant.sent % len(answers)], "stop", 1000, 100))
                Instant.sent += 1
            return out

    request = GradeRequest(model="judge", backend="transformers", format="seed")
    job = FileJob(data, Path(output), overwrite=not resume)
    before = peak_rss_mb()
    start = time.perf_counter()
    summary = run_grade(request, job, backend_factory=lambda name, **options: Instant(**options))
    print(json.dumps({
        "rows": summary["rows"], "resumed_rows": summary["run"]["resumed_rows"],
        "sent": Instant.sent, "seconds": round(time.perf_counter() - start, 1),
        "rss_before_run_mb": round(before, 1), "peak_rss_mb": round(peak_rss_mb(), 1),
        "grader": str(Path(grader.__file__).parent),
    }))


def _run(grader_root: Path, *args: str) -> dict:
    env = os.environ | {"PYTHONPATH": str(grader_root), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, __file__, "--_child", *args], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"child run failed: {args}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--grader", type=Path, default=ROOT, help="the checkout to measure [this one]")
    parser.add_argument("--work", type=Path, default=None, help="where the data is cached")
    parser.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._child:
        child(args._child[0], args._child[1], args._child[2] == "resume")
        return 0

    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_pipeline import DATA_VERSION, write_dataset

    work = args.work or Path(tempfile.gettempdir()) / "grader-bench"
    work.mkdir(parents=True, exist_ok=True)
    data = write_dataset(work / f"data-{args.rows}-v{DATA_VERSION}.jsonl", args.rows)
    with tempfile.TemporaryDirectory(dir=work) as scratch:
        output = Path(scratch) / "results.jsonl"
        fresh = _run(args.grader, str(data), str(output), "fresh")
        # what an interrupted run leaves: every record in the log, no results file, no summary
        os.replace(output, output.with_name(output.name + ".partial"))
        for summary in Path(scratch).glob("results.*summary.json"):
            summary.unlink()
        resumed = _run(args.grader, str(data), str(output), "resume")
        size = output.stat().st_size
    assert resumed["resumed_rows"] == args.rows and resumed["sent"] == 0, resumed
    print(json.dumps({"rows": args.rows, "partial_mb": round(size / 2**20, 1),
                      "fresh": fresh, "resume": resumed}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
