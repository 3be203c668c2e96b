"""The summary of a results file: counts per status, the score histogram and mean, the judge's
own arithmetic against the recompute. One tally, for ``grade``, ``rescore`` and ``report``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from fractions import Fraction
from typing import Any

from grader.judge.records import Record, record_kind
from grader.status import EXPLANATIONS, Status

_SCORE_KEYS = [str(score) for score in range(6)]

# The record fields that flag an ok row for a reader (grader.judge.records.itemized_record):
# each a list, empty when the row is clean.
FLAGS = ("evidence_not_found", "count_mismatch")


def summarize(records: Iterable[Record], *, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Counts per status; for the seed judge the mean and histogram of ok scores and the
    judge/recompute disagreement; for a score_model grader the mean result and pass rate."""
    tally = Tally()
    tally.add(records)
    return tally.summary(run=run)


class Tally:
    """What :func:`summarize` counts, kept so that tallies of consecutive parts of a file
    can be merged: ``a.merge(b)`` is the tally of a's records followed by b's."""

    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter({str(s): 0 for s in Status})
        self.histogram = {str(score): 0 for score in range(6)}
        self.total = Fraction(0)
        self.rows = self.ok = self.compared = self.disagreements = 0
        self.results: list[float] = []
        self.verdicts: list[bool] = []
        # ok rows with any flag; per flag; ok rows whose every quote is absent from the answer
        self.flags: Counter[str] = Counter()

    def add(self, records: Iterable[Record]) -> None:
        statuses, histogram, results, verdicts = (
            self.statuses, self.histogram, self.results, self.verdicts
        )
        total = Fraction(0)
        int_total = 0  # int scores (all of them, from grader) summed as ints: Fraction(n) is n
        rows = ok = compared = disagreements = 0
        try:
            for record in records:
                rows += 1
                status = record["status"]
                statuses[status] += 1
                if status != Status.OK:
                    continue
                ok += 1
                if record_kind(record) == "score_model":
                    results.append(record["result"])
                    if record.get("passed") is not None:
                        verdicts.append(record["passed"])
                    continue
                if record.get("evidence_not_found") or record.get("count_mismatch"):  # FLAGS
                    self._flag(record)
                score = record["score"]
                if score is None:  # an ok row without a score (another tool's): only counted
                    continue
                if type(score) is int and 0 <= score <= 5:
                    histogram[_SCORE_KEYS[score]] += 1
                    int_total += score
                else:
                    histogram[str(score)] += 1
                    total += Fraction(score)
                model_score = record.get("model_score")
                if model_score is not None:
                    compared += 1
                    disagreements += model_score != score
        finally:
            self.total += total + int_total
            self.rows += rows
            self.ok += ok
            self.compared += compared
            self.disagreements += disagreements

    def _flag(self, record: Record) -> None:
        flags = self.flags
        flags["rows"] += 1
        for flag in FLAGS:
            flags[flag] += bool(record.get(flag))
        missing = record.get("evidence_not_found")
        items = record.get("items")
        if missing and isinstance(items, dict):
            quoted = sum(
                1
                for entries in items.values() if isinstance(entries, list)
                for entry in entries
                if isinstance(entry, dict) and isinstance(entry.get("quote"), str)
                and entry["quote"].strip()
            )
            flags["no_quote_found"] += isinstance(missing, list) and len(missing) >= quoted > 0

    def merge(self, other: Tally) -> None:
        self.statuses.update(other.statuses)  # a status first seen in other goes after ours
        for key, count in other.histogram.items():
            self.histogram[key] += count
        self.total += other.total
        self.rows += other.rows
        self.ok += other.ok
        self.compared += other.compared
        self.disagreements += other.disagreements
        self.results += other.results
        self.verdicts += other.verdicts
        self.flags.update(other.flags)

    def summary(self, *, run: dict[str, Any] | None = None) -> dict[str, Any]:
        ok, results, verdicts = self.ok, self.results, self.verdicts
        summary: dict[str, Any] = {
            "rows": self.rows, "statuses": dict(self.statuses), "graded": ok
        }
        if results:
            summary["score_model"] = {
                "mean_result": round(sum(results) / len(results), 4),
                "passed": sum(verdicts),
                "judged": len(verdicts),
                "pass_rate": round(sum(verdicts) / len(verdicts), 4) if verdicts else None,
            }
        else:
            compared, disagreements = self.compared, self.disagreements
            summary |= {
                "mean_score": round(float(self.total / ok), 4) if ok else None,
                "histogram": dict(self.histogram),
                "judge_disagreement": {
                    "rows": compared,
                    "disagree": disagreements,
                    "rate": round(disagreements / compared, 4) if compared else None,
                },
            }
        if self.flags:
            # how far to trust the ok rows: those a reader should look at before their score
            summary["flagged"] = {
                "rows": self.flags["rows"],
                **{flag: self.flags[flag] for flag in FLAGS},
                "no_quote_found": self.flags["no_quote_found"],
            }
        if run is not None:
            summary["run"] = run
        return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The short table printed after a run."""
    lines = [f"{'rows':<22}{summary['rows']:>8}"]
    for status, count in summary["statuses"].items():
        if count or status == Status.OK:
            note = EXPLANATIONS.get(Status(status))
            lines.append(f"  {status:<20}{count:>8}" + (f"   {note}" if note else ""))
            if status == Status.OK:
                lines += _flag_lines(summary.get("flagged"))
    if "score_model" in summary:
        graded = summary["score_model"]
        lines.append(f"{'mean result (ok rows)':<22}{graded['mean_result']:>8}")
        if graded["pass_rate"] is not None:
            lines.append(
                f"{'passed':<22}{graded['passed']:>8} of {graded['judged']} ({graded['pass_rate']:.0%})"
            )
        return "\n".join(lines)
    mean = summary["mean_score"]
    lines.append(f"{'mean score (ok rows)':<22}{'-' if mean is None else f'{mean:.2f}':>8}")
    lines.append(
        f"{'histogram':<22}" + "  ".join(f"{k}:{v}" for k, v in summary["histogram"].items())
    )
    dis = summary["judge_disagreement"]
    if dis["rows"]:
        lines.append(
            f"{'judge != recompute':<22}{dis['disagree']:>8} of {dis['rows']} ok rows "
            f"({dis['rate']:.0%}): the judge's own arithmetic, kept as model_score"
        )
    return "\n".join(lines)


def _flag_lines(flagged: dict[str, int] | None) -> list[str]:
    """Under ``ok``: the ok rows a reader should check before trusting their score."""
    if not flagged or not flagged.get("rows"):
        return []
    kinds = ", ".join(f"{flagged[flag]} {flag}" for flag in FLAGS if flagged.get(flag))
    lines = [f"    {'ok, flagged':<18}{flagged['rows']:>8}   {kinds}: look before trusting the score"]
    if flagged.get("no_quote_found"):
        lines.append(
            f"    {'ok, no quote found':<18}{flagged['no_quote_found']:>8}   every quote the "
            "judge gave is absent from the answer: the items may be invented"
        )
    return lines
