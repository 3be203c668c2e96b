"""Results JSONL, the summary and its run manifest. The only module that writes results.

A results file is written under a temporary name, flushed and fsynced chunk by chunk, and
renamed into place at the end: a failed run never leaves a file that looks complete.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import IO, Any

from grader.records import Record
from grader.status import EXPLANATIONS, Status


class ResultsError(ValueError):
    """A results file that cannot be read: ``PATH:LINE: reason``."""


def summary_path(results: Path) -> Path:
    """``results.jsonl`` -> ``results.summary.json`` beside it."""
    return results.with_name(results.name.removesuffix(".jsonl") + ".summary.json")


def _dump(record: Record) -> str:
    return json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"


class ResultsWriter:
    """Writes records to ``PATH.partial`` and renames it to ``PATH`` on :meth:`commit`."""

    def __init__(self, path: Path):
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = open(self.partial, "w", encoding="utf-8")

    def write(self, records: Iterable[Record]) -> None:
        assert self._file is not None
        self._file.write("".join(_dump(r) for r in records))
        self._file.flush()
        os.fsync(self._file.fileno())

    def commit(self) -> None:
        assert self._file is not None
        self._file.close()
        self._file = None
        os.replace(self.partial, self.path)

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.partial.unlink(missing_ok=True)


def read_records(path: str | Path) -> Iterator[tuple[int, Record]]:
    """``(line, record)`` for each record of a results JSONL file."""
    with open(path, "rb") as stream:
        for number, raw in enumerate(stream, start=1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8-sig" if number == 1 else "utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ResultsError(f"{path}:{number}: invalid JSON: {exc}") from None
            if not isinstance(record, dict) or "id" not in record:
                raise ResultsError(f"{path}:{number}: expected a JSON object with an 'id'")
            yield number, record


def summarize(records: Iterable[Record], *, run: dict[str, Any] | None = None) -> dict[str, Any]:
    """Counts per status, the mean and histogram of ok scores, judge/recompute disagreement."""
    statuses: Counter[str] = Counter({str(s): 0 for s in Status})
    histogram = {str(score): 0 for score in range(6)}
    total = Fraction(0)
    rows = ok = compared = disagreements = 0
    for record in records:
        rows += 1
        statuses[record["status"]] += 1
        if record["status"] != Status.OK:
            continue
        ok += 1
        histogram[str(record["score"])] += 1
        total += Fraction(record["score"])
        if record.get("model_score") is not None:
            compared += 1
            disagreements += record["model_score"] != record["score"]
    summary: dict[str, Any] = {
        "rows": rows,
        "statuses": dict(statuses),
        "graded": ok,
        "mean_score": round(float(total / ok), 4) if ok else None,
        "histogram": histogram,
        "judge_disagreement": {
            "rows": compared,
            "disagree": disagreements,
            "rate": round(disagreements / compared, 4) if compared else None,
        },
    }
    if run is not None:
        summary["run"] = run
    return summary


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(partial, path)


def format_summary(summary: dict[str, Any]) -> str:
    """The short table printed after a run."""
    lines = [f"{'rows':<22}{summary['rows']:>8}"]
    for status, count in summary["statuses"].items():
        if count or status == Status.OK:
            note = EXPLANATIONS.get(Status(status))
            lines.append(f"  {status:<20}{count:>8}" + (f"   {note}" if note else ""))
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
