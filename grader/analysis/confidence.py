"""Does the judge's confidence predict agreement with the human labels? (``grader agree`` on
records graded with ``--confidence``.)

A record's ``confidence.p_score`` is the probability, under the judge's own P(present) of each
item, of the score it reported. If the confidence means something, rows where the judge agrees
exactly with the human should have a higher p_score than rows where it does not. Reported:

* ``auc``: the probability that a random agreeing row has a higher p_score than a random
  disagreeing one (ties count one half; Mann-Whitney). 0.5 is no better than chance.
* ``halves``: the exact-agreement rate of the less and the more confident half of the rows
  (split at the median p_score; rows at the median go to the lower half).
* ``mean_p_score`` beside the exact-agreement rate: were the judge calibrated against the
  humans, the two would be equal.
* ``mean_p_human``: the mean probability the judge's distribution gives the human's label.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

import numpy as np

from grader.records import Record, ScoreConfidence


def _p_score(record: Record) -> float | None:
    confidence = record.confidence
    if not isinstance(confidence, ScoreConfidence):
        return None
    value = confidence.p_score
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _p_label(record: Record, label: int) -> float | None:
    confidence = record.confidence
    distribution = confidence.distribution if isinstance(confidence, ScoreConfidence) else None
    value = distribution.get(str(label)) if isinstance(distribution, dict) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def auc(scores: Sequence[float], positive: Sequence[bool]) -> float | None:
    """P(a positive's score > a negative's), ties one half; None without both kinds."""
    from scipy.stats import rankdata

    positives = sum(positive)
    negatives = len(positive) - positives
    if not positives or not negatives:
        return None
    # the Mann-Whitney U of the positives, from the average ranks (1-based) over ties
    ranks = rankdata(scores)
    u = float(ranks[np.asarray(positive, dtype=bool)].sum()) - positives * (positives + 1) / 2
    return u / (positives * negatives)


def _rate(values: Sequence[bool]) -> float | None:
    return sum(values) / len(values) if values else None


class Half(TypedDict):
    n: int
    p_score_max: float | None
    exact_agreement: float | None


class ConfidenceAgreement(TypedDict, total=False):
    """:func:`confidence_agreement`'s; ``note`` where a figure is missing, and the figures
    only where a compared row has a confidence that could be read."""

    n: int
    without: int
    note: str
    auc: float | None
    exact_agreement: float | None
    mean_p_score: float
    mean_p_human: float | None
    halves: list[Half]


def confidence_agreement(records: Sequence[Record], human: Sequence[int], judge: Sequence[int]
                         ) -> dict[str, ConfidenceAgreement]:
    """``{"confidence": {...}}`` for the compared rows (``records[i]`` scored ``judge[i]``
    against the human's ``human[i]``), or ``{}`` when none carries a confidence: the output of
    ``grader agree`` is then what it always was."""
    if not any(r.has("confidence") for r in records):
        return {}
    # per row with a readable confidence: its p_score, whether the judge agreed, P(human label)
    read = [(p, h == j, _p_label(r, h))
            for r, h, j in zip(records, human, judge, strict=True)
            if (p := _p_score(r)) is not None]
    result: ConfidenceAgreement = {"n": len(read), "without": len(records) - len(read)}
    if not read:
        result["note"] = "no compared row has a confidence that could be read"
        return {"confidence": result}
    p_score, agrees, p_label = zip(*read, strict=True)
    p_human = [p for p in p_label if p is not None]
    ordered = sorted(read, key=lambda row: row[0])
    middle = (len(ordered) + 1) // 2
    result.update({"auc": auc(p_score, agrees), "exact_agreement": _rate(agrees),
                   "mean_p_score": sum(p_score) / len(read),
                   "mean_p_human": sum(p_human) / len(p_human) if p_human else None,
                   "halves": [_half(ordered[:middle]), _half(ordered[middle:])]})
    if result["auc"] is None:
        result["note"] = "auc: undefined: the judge agrees with every row, or with none"
    return {"confidence": result}


def _half(rows: list[tuple[float, bool, float | None]]) -> Half:
    return {"n": len(rows), "p_score_max": rows[-1][0] if rows else None,
            "exact_agreement": _rate([agrees for _, agrees, _ in rows])}


def format_number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_confidence_agreement(c: ConfidenceAgreement | None) -> list[str]:
    """The lines ``grader agree`` adds for records with a confidence (none without): ``c``,
    the agreement's ``confidence``."""
    if c is None:
        return []
    lines = ["", f"confidence (p_score) vs exact agreement: {c['n']} rows"
             + (f", {c['without']} without a confidence" if c["without"] else "")]
    if c["n"]:
        low, high = c["halves"]
        lines += [
            f"{'  AUC (agreeing rows surer)':<30}{format_number(c['auc']):>8}   0.5 is chance",
            f"{'  less confident half':<30}{format_number(low['exact_agreement']):>8}   "
            f"exact agreement, {low['n']} rows, p_score <= {format_number(low['p_score_max'])}",
            f"{'  more confident half':<30}{format_number(high['exact_agreement']):>8}   "
            f"exact agreement, {high['n']} rows",
            f"{'  mean p_score':<30}{format_number(c['mean_p_score']):>8}   "
            f"against exact agreement {format_number(c['exact_agreement'])}",
            f"{'  mean P(human label)':<30}{format_number(c['mean_p_human']):>8}",
        ]
    if c.get("note"):
        lines.append(f"note: {c['note']}")
    return lines
