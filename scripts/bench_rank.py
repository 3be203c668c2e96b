"""``grader rank`` at scale (issue 38 item 8): N results files of simulated absolute scores,
ranked end to end as the command does it (files read, pair tables, the point fit, the
bootstrap), for 10, 80 and 300 models; prints a table.

Each model ``i`` has a quality ``q_i ~ N(0, 1)``; its score on a row is
``round(2.5 + q_i + N(0, 1.2))`` clipped to 0-5, so there are ties and upsets, as real
scores have. No model, no GPU; nothing but numpy and grader.

    PYTHONPATH=. .venv/bin/python scripts/bench_rank.py                  # 10, 80, 300 models
    PYTHONPATH=. .venv/bin/python scripts/bench_rank.py --models 300 --rows 100 --rounds 1000

Columns: models, rows, games (each pair of models on each row), rounds, the seconds to read
the files and build the tables plus the point fit (``--rounds 0``), the seconds of the whole
rank, the milliseconds per bootstrap round, and the peak resident memory of the process so
far (MiB; ``ru_maxrss``, so it only grows down the table).

It imports grader; grader never imports it.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from grader.analysis.rank import rank


def write_models(folder: Path, models: int, rows: int, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    quality = rng.normal(0, 1, models)
    scores = np.clip(np.round(2.5 + quality[:, None] + rng.normal(0, 1.2, (models, rows))), 0, 5)
    paths = []
    for i in range(models):
        path = folder / f"model{i:03d}.jsonl"
        path.write_text("".join(json.dumps({"id": f"r{r}", "status": "ok", "score": int(s),
                                            "format": "rubric"}) + "\n"
                                for r, s in enumerate(scores[i])))
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, action="append",
                        help="models (files) to rank; repeat for several rows of the table "
                        "[default: 10, 80, 300]")
    parser.add_argument("--rows", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{'models':>6} {'rows':>5} {'games':>10} {'rounds':>6} {'read+fit s':>10} "
          f"{'rank s':>8} {'ms/round':>8} {'peak MiB':>8}")
    for models in args.models or [10, 80, 300]:
        with tempfile.TemporaryDirectory() as folder:
            paths = write_models(Path(folder), models, args.rows, args.seed)
            start = time.perf_counter()
            rank(paths, rounds=0)
            base = time.perf_counter() - start
            start = time.perf_counter()
            result = rank(paths, rounds=args.rounds, seed=args.seed)
            total = time.perf_counter() - start
        per_round = (total - base) / args.rounds * 1000 if args.rounds else 0.0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"{models:>6} {args.rows:>5} {result['games']:>10} {args.rounds:>6} {base:>10.2f} "
              f"{total:>8.1f} {per_round:>8.1f} {peak:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
