#!/usr/bin/env python
"""How fast a results file is read: ``grader.io.results.read_records`` over synthetic records
written as ``run_grade`` writes them (``scripts/bench_pipeline.write_results``), best and median
of ``--repeat`` passes, and whether writing the records back gives the file byte for byte.

Usage::

    python scripts/bench_read.py                 # 100k records, 5 passes
    python scripts/bench_read.py --rows 20000 --repeat 9

Imports grader; grader never imports this file.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path


def _write_results(path: Path, rows: int) -> Path:
    spec = importlib.util.spec_from_file_location(
        "bench_pipeline", Path(__file__).with_name("bench_pipeline.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written: Path = module.write_results(path, rows)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    from grader.io.results import read_records

    with tempfile.TemporaryDirectory() as work:
        path = _write_results(Path(work) / "results.jsonl", args.rows)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            count = sum(1 for _ in read_records(path))
            times.append(time.perf_counter() - start)
        back = "".join(record.to_json() + "\n" for _, record in read_records(path))
        same = back == path.read_text(encoding="utf-8")
    best, median = min(times), statistics.median(times)
    print(f"read_records, {count} records: best {best:.3f} s ({best / count * 1e6:.2f} us a "
          f"record), median {median:.3f} s; written back byte for byte: {same}")


if __name__ == "__main__":
    main()
