#!/usr/bin/env python
"""The sequential judge check's verdicts against the check all at once, simulated: for judges
whose reference scores above both controls, ties them, or scores below both with given
probabilities, how often each verdict comes, and how many references the sequential check
grades on average. Prints the Markdown table of docs/judging.md ("Sequential").

Usage::

    python scripts/sim_judge_check.py [--runs 300] [--seed 0]

Each share is over ``--runs`` seeded runs: its 95 % interval is about +-3 points near 5 %
and +-6 near 50 % at 300 runs. Imports grader; grader never imports this file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from grader.analysis.verdict import (  # noqa: E402
    ControlScores,
    judge_verdict,
    looks,
    sequential_verdict,
)

#: name -> probabilities of (above both, all tied, below both) per reference
JUDGES = {
    "SmolLM2-like: above 10 %, tied 80 %, below 10 %": (0.1, 0.8, 0.1),
    "coin: above 50 %, below 50 %": (0.5, 0.0, 0.5),
    "informative: above 90 %, tied 10 %": (0.9, 0.1, 0.0),
    "informative at the edge: above 80 %, tied 20 %": (0.8, 0.2, 0.0),
    "weak: above 50 %, tied 50 %": (0.5, 0.5, 0.0),
}
OUTCOMES = (ControlScores(5, 0, 0, 3), ControlScores(3, 3, 3, 3), ControlScores(0, 5, 5, 3))
VERDICTS = ("informative", "weak", "no signal")


def _shares(counts: dict[str, int], runs: int) -> str:
    return ", ".join(f"{v} {counts.get(v, 0) / runs:.0%}" for v in VERDICTS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print("| judge (per reference) | sampled | all at once | sequential | references used |")
    print("| --- | --- | --- | --- | --- |")
    for sampled in (21, 50):
        for name, probabilities in JUDGES.items():
            at_once: dict[str, int] = {}
            sequential: dict[str, int] = {}
            used = []
            for _ in range(args.runs):
                scores = [OUTCOMES[k] for k in rng.choice(3, size=sampled, p=probabilities)]
                for look in looks(sampled):  # the looks in turn, as a run grades its groups
                    check = sequential_verdict(scores[:look.references], sampled)
                    if check is not None:
                        break
                assert check is not None  # the last look always decides
                assert check.sequential  # a sequential verdict says how it stopped
                sequential[check.verdict] = sequential.get(check.verdict, 0) + 1
                used.append(check.sequential.used)
                verdict = judge_verdict(scores).verdict
                at_once[verdict] = at_once.get(verdict, 0) + 1
            print(f"| {name} | {sampled} | {_shares(at_once, args.runs)} | "
                  f"{_shares(sequential, args.runs)} | {np.mean(used):.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
