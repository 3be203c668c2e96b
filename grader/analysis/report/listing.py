"""What a report lists of a results file, gathered in one streaming pass: the tallies, the
groups, the judge-vs-recompute matrix and the rows the page shows (the rest of each record is
dropped as it streams past)."""

from __future__ import annotations

import heapq
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import msgspec

from grader.analysis.summary import Counted, Tally, counted, number
from grader.io.results import read_records
from grader.records import (
    ITEM_CATEGORIES,
    MarkedItems,
    Record,
    RecordCounts,
    Sample,
    ScoreConfidence,
)
from grader.status import ZERO_SCORE, Status

# The failed-rows section lists at most this many rows (in file order); the status table
# still counts every one. A run with thousands of engine errors needs the table, not a wall.
FAILED_ROWS_SHOWN = 200

NO_GROUP = "(none)"
NOT_IN_DATASET = "(not in dataset)"

KNOWN_STATUSES = frozenset(str(s) for s in Status)
_ZERO = frozenset(str(s) for s in ZERO_SCORE)


class SampleView(TypedDict):
    score: Any  # another tool's record's sample: whatever it holds
    status: Any


class ConfidenceView(TypedDict):
    p_score: float
    interval: list[Any]
    score_expected: float | None


@dataclass
class Row:
    """What the page shows of one record (the rest of it is dropped while streaming)."""

    line: int
    id: Any
    status: str
    score: Any
    model_score: Any
    score_exact: Any
    error: Any
    rationale: list[Any]
    checklist: list[Any]
    counts_text: str
    raw_output: str | None
    group: str | None
    result: float | None = None
    passed: bool | None = None
    spread: Mapping[str, Any] | None = None  # the record's, as it holds it
    samples: list[SampleView] | None = None
    confidence: ConfidenceView | None = None  # --confidence
    items: list[str] | None = None  # a record of marked items: each item with its label


def _item_lines(items: Any) -> list[str] | None:
    """``[present] category: item`` per item a record's judge marked (another tool's record:
    whatever is not that shape is left out)."""
    if isinstance(items, MarkedItems):  # read as another tool's: an item left out is None
        items = msgspec.to_builtins(items)
    if not isinstance(items, dict):
        return None
    marks = []
    for category in ITEM_CATEGORIES:
        entries = items.get(category)
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("present"), bool):
                marks.append((category, entry["present"], entry.get("item")))
    lines = [f"[{'present' if present else 'absent'}] {category[:-1]}: {item}"
             for category, present, item in marks]
    return lines or None


class _Bounded:
    """The ``limit`` smallest entries by key, kept in a heap while streaming."""

    def __init__(self, limit: int):
        self.limit = max(0, limit)
        self._heap: list[tuple[Any, Row]] = []

    def add(self, key: tuple[Any, ...], row: Row) -> None:
        if self.limit == 0:
            return
        # Max-heap on the key (negated): the root is the entry to drop first. Keys end with
        # the line number, so two entries never compare their rows.
        entry = (tuple(-k for k in key), row)
        if len(self._heap) < self.limit:
            heapq.heappush(self._heap, entry)
        elif entry[0] > self._heap[0][0]:
            heapq.heapreplace(self._heap, entry)

    def sorted(self) -> list[Row]:
        return [row for _, row in sorted(self._heap, key=lambda e: e[0], reverse=True)]


def _group_value(value: Any) -> str:
    if value is None or value == "":
        return NO_GROUP
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def dataset_groups(data: str | Path, column: str, id_column: str | None) -> dict[Any, str] | None:
    """id -> the column's value from the dataset, or None when no row has the column."""
    from grader.io.dataset import read_items

    items = read_items(str(data), id_column=id_column)
    if not any(column in item.fields for item in items):
        return None
    lookup = {item.id: _group_value(item.fields.get(column)) for item in items}
    # Results keep the dataset's ids, but a results file made elsewhere may hold them as text.
    lookup.update({str(k): v for k, v in list(lookup.items()) if str(k) not in lookup})
    return lookup


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def scored_rows(tally: Tally) -> int:
    """ok rows with a 0-5 score: each is in the histogram once (score_model results are not)."""
    return sum(tally.histogram.values())


def mean_score(tally: Tally) -> float | None:
    scored = scored_rows(tally)
    return float(tally.total / scored) if scored else None


class Listing:
    """What the page adds to the counts, gathered in the same pass: groups (a Tally each),
    the judge-vs-recompute matrix, the rows it lists and the points of the result chart."""

    def __init__(self, group_by: str | None, lookup: dict[Any, str] | None, worst: int):
        self.group_by, self.lookup = group_by, lookup
        self.groups: dict[str, Tally] = {}
        self.group_in_records = False
        self.matrix: Counter[tuple[int, int]] = Counter()
        self.points: list[tuple[float, bool | None]] = []  # score_model: (result, passed)
        self.lowest = _Bounded(worst)
        self.lowest_results = _Bounded(worst)
        self.widest = _Bounded(worst)
        self.sampled = 0
        # --confidence: the rows least sure of their own score, and those whose could not be read
        self.least_confident = _Bounded(worst)
        self.confident = self.unconfident = 0
        self.failed: list[Row] = []
        self.failed_total = 0

    def _group(self, record: Record) -> str | None:
        if self.group_by is None:
            return None
        if self.lookup is not None:
            item_id = record.id
            if not isinstance(item_id, (str, int)):
                item_id = str(item_id)  # a results file from elsewhere; never a crash here
            return self.lookup.get(item_id, self.lookup.get(str(item_id), NOT_IN_DATASET))
        self.group_in_records = self.group_in_records or record.has(self.group_by)
        return _group_value(record.field(self.group_by))

    def add(self, line: int, record: Record, count: Counted) -> None:
        """One record, and what :func:`counted` made of it for the tallies."""
        # What a card shows, by name: another tool's record may hold any of these, of any type.
        grade = record.field("grade")
        if not isinstance(grade, dict):
            grade = {}
        raw = record.raw_output
        row = Row(line=line, id=record.id, status=count.status, score=record.field("score"),
                  model_score=record.field("model_score"),
                  score_exact=record.field("score_exact"), error=record.error,
                  rationale=_as_list(grade.get("rationale")),
                  checklist=_as_list(record.field("checklist")),
                  counts_text=_counts_text(record.field("counts")),
                  raw_output=raw if isinstance(raw, str) else None, group=self._group(record),
                  items=_item_lines(record.field("items")))
        if count.score is not None:
            score, model_score = count.score, count.model_score
            if model_score is not None and model_score in range(6):
                self.matrix[int(model_score), score] += 1
            exact = number(row.score_exact)
            self.lowest.add((float(score), exact if exact is not None else float(score), line), row)
        elif count.result is not None:
            row.result, row.passed = count.result, count.passed
            self.points.append((row.result, row.passed))
            self.lowest_results.add((row.result, line), row)
        else:
            self.failed_total += 1
            if len(self.failed) < FAILED_ROWS_SHOWN:
                self.failed.append(row)
        if record.has("confidence") and count.score is not None:
            self._add_confidence(line, record, row)
        spread = record.spread
        if isinstance(spread, dict) and (width := number(spread.get("range"))) is not None:
            self.sampled += 1
            row.spread, row.samples = spread, _samples(record.samples)
            self.widest.add((-width, line), row)
        if row.group is not None:
            self.groups.setdefault(row.group, Tally()).add((record,))

    def _add_confidence(self, line: int, record: Record, row: Row) -> None:
        confidence = record.confidence
        if not isinstance(confidence, ScoreConfidence):
            confidence = ScoreConfidence()
        p_score = number(confidence.p_score)
        if p_score is None:
            self.unconfident += 1
            return
        self.confident += 1
        interval = _as_list(confidence.interval)
        row.confidence = {"p_score": p_score, "interval": interval if len(interval) == 2 else [],
                          "score_expected": number(confidence.score_expected)}
        self.least_confident.add((p_score, line), row)


def _samples(samples: Any) -> list[SampleView]:
    """Each sample's value, and its status where it is not ok."""
    return [{"score": sample.get("score", sample.get("result")),
             "status": None if sample.get("status") in (None, Status.OK) else sample.get("status")}
            for sample in _as_list(samples)
            if isinstance(sample, (dict, Sample))]  # Sample.get reads a field as dict.get does


def _counts_text(counts: Any) -> str:
    if isinstance(counts, RecordCounts):  # a seed-shaped record's, read as another tool's
        counts = msgspec.to_builtins(counts)
    if not isinstance(counts, dict):  # another tool's, read by name
        return ""
    parts = []
    for name in ("facts", "conclusions", "terms"):
        part = counts.get(name)
        if isinstance(part, dict):
            parts.append(f"{name} {part.get('matched')}/{part.get('total')}")
    if "organization" in counts:
        parts.append(f"organization {counts['organization']}")
    return ", ".join(parts)


def read_listing(results: Path, group_by: str | None, lookup: dict[Any, str] | None,
                 worst: int) -> tuple[Tally, Listing]:
    """One pass over a results file: the counts (:class:`Tally`) and what the page lists."""
    tally, listing = Tally(), Listing(group_by, lookup, worst)
    for line, record in read_records(results):
        tally.add((record,))
        listing.add(line, record, counted(record))
    return tally, listing


def status_kind(status: str) -> str:
    """The CSS class of a status: ok, zero (scored 0 by rule) or null (no score)."""
    if status == Status.OK:
        return "ok"
    if status in _ZERO:
        return "zero"
    if status in KNOWN_STATUSES:
        return "null"
    return "other"
