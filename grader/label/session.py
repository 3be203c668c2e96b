"""A labeling session: the rows of one results file in a seeded random order, the labels given
so far, and the labels file every new one is appended to before it is acknowledged.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypedDict

from grader.errors import GraderError
from grader.io.labels import (
    HIGHEST,
    LOWEST,
    Header,
    LabelEvent,
    LabelLog,
    answer_digest,
    graded_texts,
    is_label_file,
    label_id,
    read_events,
    results_key,
)
from grader.io.lock import OutputLock
from grader.label.estimate import Estimate, estimate_mean
from grader.records import Record, SeedRecord

logger = logging.getLogger(__name__)


class LabelError(GraderError, ValueError):
    """Input ``grader label`` cannot label, or a labels file it must not write: one line."""


# What the page gets as JSON: a row (GET /api/row), where the labels stand (GET /api/state, and
# serve_labels's answer), both after a label is given (POST /api/label).
class JudgeItem(TypedDict):
    category: str
    item: str
    present: bool


class JudgeView(TypedDict):
    score: int | None  # as the summary counts the record (0-5); None where it counts none
    status: str | None
    items: list[JudgeItem]


class LabelView(TypedDict):
    human: int | None
    skipped: bool
    note: str | None


class RowView(TypedDict):
    position: int
    id: str
    input: str
    reference: str
    answer: str
    label: LabelView | None
    judge: JudgeView | None


class EstimateView(TypedDict):
    mean: float
    low: float
    high: float
    width: float
    n: int
    method: str
    confidence: float


class StateView(TypedDict):
    total: int
    rows: int
    labeled: int
    skipped: int
    without_judge: int
    stale: int
    next: int
    estimate: EstimateView | None
    seed: int
    sample: int | None


class LabelReply(TypedDict):
    row: RowView
    state: StateView


@dataclass(frozen=True)
class Row:
    """One row offered: its texts, the digest naming its answer, and what the judge said
    (shown only once the row is labeled)."""

    id: str
    input: str
    reference: str
    answer: str
    digest: str
    judge: JudgeView


class Session:
    """The rows in order and the labels given; every method is safe from several threads."""

    def __init__(self, rows: Mapping[str, Row], header: Header, events: list[LabelEvent],
                 log: LabelLog, lock: OutputLock):
        self.rows, self.header, self.order = dict(rows), header, header.order
        self._log, self._lock, self._mutex = log, lock, threading.Lock()
        # the latest event of each id that still names the row's answer (a stale one does not:
        # its row is offered again)
        self._latest: dict[str, LabelEvent] = {}
        stale = set()
        for event in events:
            row = self.rows.get(event.id)
            if row is not None and event.digest == row.digest:
                self._latest[event.id] = event
                stale.discard(event.id)
            elif row is not None:
                self._latest.pop(event.id, None)
                stale.add(event.id)
        self.stale = tuple(sorted(stale))

    @property
    def path(self) -> Path:
        return self._log.path

    def close(self) -> None:
        with self._mutex:
            self._log.close()
            self._lock.release()

    def first_open(self) -> int:
        """The first position of the order without a label or a skip (len(order): all done)."""
        return next((p for p, name in enumerate(self.order) if name not in self._latest),
                    len(self.order))

    def state(self) -> StateView:
        with self._mutex:
            return self._state()

    def row(self, position: int) -> RowView:
        with self._mutex:
            return self._row(position)

    def label(self, position: int, human: int | None, note: str | None) -> LabelReply:
        """Record a score (``human`` 0-5) or a skip (``human`` None) of the row at
        ``position``: on disk (fsynced) before this returns. Only a row at or before the first
        open one can be labeled, so the rows labeled stay the first ones of the random order."""
        if human is not None and not (type(human) is int and LOWEST <= human <= HIGHEST):
            raise LabelError(f"a label is a whole number {LOWEST}-{HIGHEST}, not {human!r}")
        with self._mutex:
            self._check_position(position)
            if position > self.first_open():
                raise LabelError(f"row {position + 1} comes after the first row not labeled "
                                 f"({self.first_open() + 1}): label or skip that one first")
            row = self.rows[self.order[position]]
            event = LabelEvent(id=row.id, digest=row.digest, human=human,
                               skipped=human is None, note=note or None, position=position,
                               at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            self._log.append(event)
            self._latest[row.id] = event
            return {"row": self._row(position), "state": self._state()}

    def _check_position(self, position: int) -> None:
        if not (type(position) is int and 0 <= position < len(self.order)):
            raise LabelError(f"no row at position {position!r} (0 to {len(self.order) - 1})")

    def _row(self, position: int) -> RowView:
        self._check_position(position)
        row = self.rows[self.order[position]]
        event = self._latest.get(row.id)
        return {
            "position": position, "id": row.id, "input": row.input,
            "reference": row.reference, "answer": row.answer,
            "label": None if event is None else {"human": event.human, "skipped": event.skipped,
                                                 "note": event.note},
            # the judge's verdict only once the person has scored the row: it must not anchor them
            "judge": row.judge if event is not None and not event.skipped else None,
        }

    def _state(self) -> StateView:
        human = {name: e.human for name, e in self._latest.items() if e.human is not None}
        without_judge = sum(1 for name in human if self.rows[name].judge["score"] is None)
        judge = {name: row.judge["score"] for name, row in self.rows.items()}
        estimate = estimate_mean(human, judge)
        return {
            "total": len(self.order), "rows": len(self.rows), "labeled": len(human),
            "skipped": sum(1 for e in self._latest.values() if e.skipped),
            "without_judge": without_judge, "stale": len(self.stale),
            "next": self.first_open(), "estimate": _estimate_view(estimate),
            "seed": self.header.seed, "sample": self.header.sample,
        }


def _estimate_view(estimate: Estimate | None) -> EstimateView | None:
    if estimate is None:
        return None
    return {"mean": estimate.mean, "low": estimate.low, "high": estimate.high,
            "width": estimate.width, "n": estimate.n, "method": estimate.method,
            "confidence": estimate.confidence}


def open_session(results: Path, output: Path, *, data: str | None = None,
                 mapping: Mapping[str, str] | None = None, id_column: str | None = None,
                 seed: int | None = None, sample: int | None = None,
                 overwrite: bool = False) -> Session:
    """Check everything, take the labels file's lock, and open the session: the rows of
    ``results`` with their texts (``data``, else the dataset its run recorded, else the
    records' own fields), their order (the file's, on a resume), the labels given so far; a
    :class:`LabelError`, or ``OutputBusy`` where another label server holds the labels file.
    """
    records = _records(results)
    texts = graded_texts(results, records, data=data, mapping=mapping, id_column=id_column)
    rows = {name: _row(name, record, texts[name]) for name, record in records.items()}
    from grader.io.outputs import label_files
    from grader.io.results import summary_path

    # the one policy for every file grader writes: never RESULTS, its summary or the data
    label_files(output, [results, summary_path(results), data if data != "-" else None],
                overwrite=overwrite)
    lock = OutputLock(output)
    lock.acquire()
    try:
        key = results_key(rows)
        header, events = _resume(output, str(results), key, seed, sample, overwrite)
        fresh = header is None
        if header is None:
            chosen = 0 if seed is None else seed
            header = Header(results=str(results), results_key=key, seed=chosen, sample=sample,
                            order=_order(list(rows), chosen, sample))
        log = LabelLog(output, header, fresh=fresh)
    except BaseException:
        lock.release()
        raise
    session = Session(rows, header, events, log, lock)
    if session.stale:
        logger.info("%d labels judged answers that have changed since, and are offered again: "
                    "%s", len(session.stale), ", ".join(session.stale[:10]))
    return session


def _order(ids: list[str], seed: int, sample: int | None) -> tuple[str, ...]:
    """The ids in the seeded random order (numpy's PCG64 permutation), the first ``sample``."""
    import numpy

    permutation = numpy.random.default_rng(seed).permutation(len(ids))
    chosen = permutation if sample is None else permutation[:sample]
    return tuple(ids[int(index)] for index in chosen)


def _resume(output: Path, results: str, key: str, seed: int | None, sample: int | None,
            overwrite: bool) -> tuple[Header | None, list[LabelEvent]]:
    """The header and events of the labels file to resume; (None, []) for a new one."""
    if overwrite or not output.exists() or (output.is_file() and output.stat().st_size == 0):
        return None, []
    if not is_label_file(output):
        raise LabelError(f"{output} exists and is not a grader labels file: use --overwrite to "
                         "replace it, or another -o")
    header, events = read_events(output)
    if header.results_key != key:
        raise LabelError(
            f"{output} holds labels for other rows (made for {header.results}, whose row ids "
            f"differ from {results}'s): use --overwrite to start over, or another -o")
    given = []
    if seed is not None and seed != header.seed:
        given.append(f"--seed {seed}")
    if sample is not None and sample != header.sample:
        given.append(f"--sample {sample}")
    if given:
        was = f"--seed {header.seed}" + (f" --sample {header.sample}" if header.sample else "")
        raise LabelError(
            f"{output} was started with {was}; this run has {' '.join(given)}: leave them out "
            "to go on in its order, or use --overwrite to start over, or another -o")
    return header, events


def _records(results: Path) -> dict[str, Record]:
    """The records of ``results`` by id; :class:`LabelError` where it holds no 0-5 scores."""
    from grader.io.results import read_records

    records = {label_id(record.id): record for _, record in read_records(results)}
    if not records:
        raise LabelError(f"{results}: holds no records: nothing to label")
    if not any(isinstance(r, SeedRecord) or r.has("score") for r in records.values()):
        kinds = sorted({str(r.kind) for r in records.values()})
        raise LabelError(f"{results}: holds no 0-5 scores ({', '.join(kinds)} records): "
                         "grader label labels the scores of a grade run")
    return records


def _row(name: str, record: Record, texts: tuple[str, str, str]) -> Row:
    from grader.analysis.summary import counted

    score = counted(record).score
    marked = record.marked()
    items: list[JudgeItem] = [
        {"category": category, "item": entry.item if isinstance(entry.item, str) else "",
         "present": entry.present}
        for category, entries in (marked.by_category() if marked is not None else ())
        for entry in entries]
    judge: JudgeView = {"score": score, "status": record.status, "items": items}
    return Row(id=name, input=texts[0], reference=texts[1], answer=texts[2],
               digest=answer_digest(*texts), judge=judge)
