"""The estimate the labeling page shows as labels come in: the mean human score, its 95 %
interval and how wide it is, so the person sees when to stop.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from grader.io.labels import HIGHEST, LOWEST

CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    """The mean human score over the rows, with its interval, n and method (what it assumes:
    the labeled rows are a random sample of the rows)."""

    mean: float
    low: float
    high: float
    n: int  # the labels it is made of
    method: str
    confidence: float = CONFIDENCE

    @property
    def width(self) -> float:
        return self.high - self.low


def estimate_mean(human: Mapping[str, int], judge: Mapping[str, int | None], *,
                  confidence: float = CONFIDENCE) -> Estimate | None:
    """The mean human score of the rows (``human``: id -> label; ``judge``: id -> the judge's
    score or None, for every row) and its ``confidence`` interval; None below 2 labels.

    Calibrated (as ``grader agree``) where :func:`grader.analysis.calibration.calibrated_mean`
    does not fall back; else Student's t interval of the labels' mean, cut to the 0-5 scale
    (which loses no coverage).
    """
    calibrated = _calibrated(human, judge, confidence)
    if calibrated is not None:
        return calibrated
    values = list(human.values())
    n = len(values)
    if n < 2:
        return None
    from scipy import stats

    mean = sum(values) / n
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf(0.5 + confidence / 2, n - 1)) * spread / math.sqrt(n)
    return Estimate(mean=mean, low=max(mean - half, LOWEST), high=min(mean + half, HIGHEST),
                    n=n, method="labels only (t interval)", confidence=confidence)


def _calibrated(human: Mapping[str, int], judge: Mapping[str, int | None],
                confidence: float) -> Estimate | None:
    from grader.analysis.calibration import MIN_LABELS, calibrated_mean

    scored = {key: score for key, score in judge.items() if score is not None}
    labeled = [key for key in human if key in scored]
    if len(labeled) < MIN_LABELS:
        return None
    unlabeled = [score for key, score in scored.items() if key not in human]
    result = calibrated_mean([human[key] for key in labeled], [scored[key] for key in labeled],
                             unlabeled, confidence=confidence)
    if result.fallback is not None or result.mean is None or result.interval is None:
        return None
    low, high = result.interval
    return Estimate(mean=result.mean, low=max(low, LOWEST), high=min(high, HIGHEST),
                    n=len(labeled), method="calibrated with the judge's scores (PPI++)",
                    confidence=confidence)


def warm_up() -> None:
    """Import scipy.stats in the background: the second label computes the first interval, and
    a first import of scipy.stats took over 2 s there on a busy CPU, which the page waited."""
    threading.Thread(target=importlib.import_module, args=("scipy.stats",), daemon=True).start()
