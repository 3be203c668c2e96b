"""Judge panels: several judges' records of the same rows pooled into one record per row, and
how far the judges agree (Krippendorff's alpha, each judge against the pooled verdict).

The pooling rule (inspect_ai's): an item is present
when a strict majority of the *whole* panel says so; a judge whose record is not ``ok`` votes
for neither side, so it still counts in the panel's size. With two judges both must say
present. A row is scored only when a strict majority of the judges answered it (``ok``);
otherwise no label could reach a majority, and a score of absent items would be invented: the
row keeps the first failed judge's status and no score. The pooled labels are then counted
and scored exactly as one judge's are (:func:`grader.judge.records.relabelled_record`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from grader.analysis.summary import PanelAgreement
from grader.errors import GraderError
from grader.judge.records import relabelled_record
from grader.judge.schema import ABSENT, PRESENT
from grader.judge.scoring import format_decimal
from grader.records import Record, RecordCounts
from grader.status import Status


class PanelError(GraderError):
    """The judges' results do not describe the same rows marked against the same items."""


def _labels(record: Record) -> list[bool] | None:
    """A judge's item labels in order (facts, conclusions, terms), None if it did not answer
    the row."""
    items = record.marked()
    if record.status != Status.OK or items is None:
        return None
    return items.labels()


def _organization(record: Record) -> str | None:
    counts = getattr(record, "counts", None)
    return counts.organization if isinstance(counts, RecordCounts) else None


def _same_row(records: Sequence[Record], names: Sequence[str]) -> None:
    first = records[0]
    for record, name in zip(records[1:], names[1:], strict=True):
        if record.id != first.id:
            raise PanelError(f"{name}'s results hold row {record.id!r} where {names[0]}'s hold "
                             f"{first.id!r}: the judges graded different rows")


def _votes(records: Sequence[Record]) -> list[list[bool] | None]:
    """Each judge's labels on the row, None where it votes for neither: it did not answer, or
    it marked other items than the panel's. The panel's items of a row are the first judge's
    (in panel order) that has them. A later judge marks items of its own only where the first
    judge's file of item lists lacks the reference (its draft failed, or a ``--rubric FILE``
    without it): every later judge then drafts its own, and labels of different items do not
    pool."""
    shared = next((items for r in records if (items := r.listed_items()) is not None), None)
    return [None if labels is None or r.listed_items() != shared else labels
            for r, labels in ((r, _labels(r)) for r in records)]


OWN_ITEMS = "marked a rubric of its own (the panel's first rubric lacks this reference): no vote"


def pool_row(records: Sequence[Record], names: Sequence[str]) -> Record:
    """One row's records, one per judge (in panel order), -> the pooled record, with each
    judge's status, labels, organization and score under ``panel``."""
    _same_row(records, names)
    votes = _votes(records)
    panel = _panel(records, names, votes)
    size = len(records)
    answered = [v for v in votes if v is not None]
    if 2 * len(answered) <= size:
        return _unpooled(records, names, len(answered), panel)
    pooled = [2 * sum(column) > size for column in zip(*answered, strict=True)]
    matched = sum(_organization(r) == "matched" for r, v in zip(records, votes, strict=True)
                  if v is not None)
    ok = next(r for r, v in zip(records, votes, strict=True) if v is not None)
    return relabelled_record(ok, pooled, "matched" if 2 * matched > size else "mismatched",
                             panel=panel)


def _panel(records: Sequence[Record], names: Sequence[str], votes: list[list[bool] | None]
           ) -> dict[str, object]:
    """The pooled record's ``panel``: each judge's status, labels, organization, score and
    error on the row, and how many answered."""
    judges = [{"name": name, "status": r.status,
               "labels": None if v is None else "".join(PRESENT if x else ABSENT for x in v),
               "organization": _organization(r), "score": r.value,
               "error": OWN_ITEMS if v is None and _labels(r) is not None else r.error}
              for name, r, v in zip(names, records, votes, strict=True)]
    return {"judges": judges, "answered": sum(v is not None for v in votes)}


def _unpooled(records: Sequence[Record], names: Sequence[str], answered: int,
              panel: dict[str, object]) -> Record:
    """A row without a quorum (or a row no judge was sent): the first judge's own failure,
    no score, with the panel's ``panel``."""
    failed = next((r for r in records if r.status != Status.OK), None)
    if failed is None:  # every judge answered, on items of their own: none to pool
        raise PanelError(f"row {records[0].id!r}: the judges marked different rubrics and "
                         "no strict majority of them shares one; give every judge one "
                         "complete --rubric FILE")
    error = failed.error
    if answered:
        error = (f"only {answered} of {len(records)} judges answered: a strict majority must "
                 f"answer ({names[records.index(failed)]}: {failed.error or failed.status})")
    extra = dict(failed.extra or {}) | {"panel": panel}
    # order=None: a record read from a file writes only the fields it was read with (its
    # order), and would drop the panel; its resume key is its judge's, not the pool's
    return msgspec.structs.replace(failed, error=error, extra=extra, order=None,
                                   key=msgspec.UNSET)


def alpha(data: Any, level: str = "nominal") -> float | None:
    """Krippendorff's alpha of ``data`` (judges x units, NaN where a judge gave no value),
    from the coincidence matrix (Krippendorff 2011, "Computing Krippendorff's alpha"):
    ``1 - D_o / D_e``; ``level`` nominal or interval. None where it is undefined (fewer than
    two values in any unit, or every value the same)."""
    import numpy as np

    values = np.asarray(data, dtype=float)
    present = ~np.isnan(values)
    categories = np.unique(values[present])
    if categories.size == 0:
        return None
    # counts[u, c]: how many judges gave unit u the value c
    index = np.searchsorted(categories, np.where(present, values, categories[0]))
    counts = ((index[..., None] == np.arange(categories.size)) & present[..., None]).sum(axis=0)
    counts = counts.astype(float)
    pairable = counts.sum(axis=1)
    counts = counts[pairable >= 2]
    if counts.size == 0:
        return None
    weights = 1.0 / (counts.sum(axis=1) - 1)
    coincidences = (counts * weights[:, None]).T @ counts - np.diag((counts * weights[:, None]).sum(axis=0))
    marginals = coincidences.sum(axis=1)
    total = marginals.sum()
    if level == "nominal":
        distance = 1.0 - np.eye(categories.size)
    elif level == "interval":
        distance = (categories[:, None] - categories[None, :]) ** 2
    else:
        raise ValueError(f"unknown level {level!r}: nominal or interval")
    observed = (coincidences * distance).sum() / total
    expected = (np.outer(marginals, marginals) * distance).sum() / (total * (total - 1))
    if expected == 0:
        return None
    return float(1.0 - observed / expected)


class Agreement:
    """The panel's agreement, gathered row by row as the pooled records are written."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.label_units: list[list[float]] = []  # one per (row, item): each judge's 1/0/NaN
        self.score_units: list[list[float]] = []  # one per row: each judge's exact score
        self.matches = [[0, 0, 0, 0] for _ in names]  # labels equal, labels, scores equal, rows

    def add(self, records: Sequence[Record], pooled: Record) -> None:
        nan = float("nan")
        votes = _votes(records)
        voted = next((v for v in votes if v is not None), None)
        if voted is not None:
            self.label_units += [[nan if v is None else float(v[k]) for v in votes]
                                 for k in range(len(voted))]
            exact = [getattr(r, "score_exact", None) for r in records]
            self.score_units.append([
                float(e) if v is not None and e is not None else nan
                for e, v in zip(exact, votes, strict=True)])
        pooled_labels = _labels(pooled)
        if pooled_labels is None:
            return
        for tally, vote, record in zip(self.matches, votes, records, strict=True):
            if vote is None:
                continue
            tally[0] += sum(a == b for a, b in zip(vote, pooled_labels, strict=True))
            tally[1] += len(vote)
            tally[2] += record.value == pooled.value
            tally[3] += 1

    def result(self) -> PanelAgreement:
        """The summary's ``panel`` section."""
        import numpy as np

        def share(a: int, b: int) -> float | None:
            return round(a / b, 4) if b else None

        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        labels = np.array(self.label_units, dtype=float).T if self.label_units else np.empty((0, 0))
        scores = np.array(self.score_units, dtype=float).T if self.score_units else np.empty((0, 0))
        return {"judges": len(self.names),
                "rule": "strict majority of the whole panel; a judge that did not answer votes "
                        "for neither; a row needs a strict majority of judges answering",
                "alpha_labels": rounded(alpha(labels, "nominal")),
                "alpha_scores": rounded(alpha(scores, "interval")),
                "item_labels": len(self.label_units),
                "per_judge": [{"name": name, "rows": rows, "label_agreement": share(equal, total),
                               "score_agreement": share(same, rows)}
                              for name, (equal, total, same, rows)
                              in zip(self.names, self.matches, strict=True)]}


def format_panel(panel: PanelAgreement) -> str:
    """The panel's agreement on the terminal, a few lines."""

    def show(value: float | None) -> str:
        return "n/a" if value is None else format_decimal_float(value)

    lines = [f"panel of {panel['judges']} judges: Krippendorff's alpha {show(panel['alpha_labels'])} "
             f"on {panel['item_labels']} item labels (nominal), {show(panel['alpha_scores'])} "
             "on scores (interval)"]
    for judge in panel["per_judge"]:
        lines.append(f"  {judge['name']}: agrees with the pooled verdict on "
                     f"{show(judge['label_agreement'])} of its labels and "
                     f"{show(judge['score_agreement'])} of its scores ({judge['rows']} rows answered)")
    return "\n".join(lines)


def format_decimal_float(value: float) -> str:
    from fractions import Fraction

    return format_decimal(Fraction(value).limit_denominator(10**6))
