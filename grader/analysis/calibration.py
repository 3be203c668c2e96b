"""Calibrated estimates: a judge's scores on every row plus human labels on a random subset.

Prediction-powered inference (Angelopoulos et al., Science 2023) in its power-tuned form
PPI++ (Angelopoulos, Duchi, Zrnic 2023): the mean human score over all rows is estimated as

    theta = mean(Y - lambda * Yhat) over the n labeled rows + lambda * mean(Yhat) over the N others

which is unbiased for any fixed lambda when the labeled rows are a random sample of the rows;
lambda = cov(Y, Yhat) / ((1 + n/N) var(Yhat)), clipped to [0, 1], makes its variance smallest
(lambda 0 is the labels alone, 1 is classic PPI).

Plain PPI++ estimates lambda on the same labels it then uses, and its normal interval covers
the truth in only ~92 % of runs at n = 30 (tests/test_calibration.py's simulations). grader
**cross-fits** lambda instead: the labeled rows are split into 10 folds (fewer below 20 labels)
and each fold's rows are corrected with the lambda fitted on the other folds, so no label
tunes its own correction; the interval is Student's t with n - 1 degrees of freedom. Measured
coverage of the 95 % interval: 94-96 % from n = 30 to 500 (docs/judging.md).

Below the finite-sample threshold, a judge-human correlation under 1/sqrt(n - 2) ("no free
lunch", arXiv 2505.20178), the judge cannot narrow the interval: the estimate is the labels
alone, and ``fallback`` says why. Fewer than :data:`MIN_LABELS` labels give no calibrated
interval at all.

numpy and scipy only (``ppi_py`` is the reference: tests/test_calibration.py compares).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TypedDict, cast

import numpy as np
from numpy.typing import ArrayLike, NDArray

MIN_LABELS = 10
FOLDS = 10
CONFIDENCE = 0.95
METHOD = ("PPI++ with lambda cross-fitted over up to 10 folds of the labels, "
          "Student's t interval (n - 1 degrees of freedom)")
ASSUMPTION = "assumes the labeled rows are a random sample of the graded ones"


class EstimateJSON(TypedDict):
    mean: float | None
    interval: list[float] | None


# Calibrated's JSON object ("lambda" is a keyword)
CalibratedJSON = TypedDict("CalibratedJSON", {
    "mean": float | None, "interval": list[float] | None, "judge_only": EstimateJSON,
    "human_only": EstimateJSON, "correlation": float | None, "lambda": float | None,
    "effective_labels": float | None, "labeled": int, "unlabeled": int, "fallback": str | None,
    "correlation_rows": int | None})


class LabelPlanJSON(TypedDict):
    half_width: float
    labels: int | None
    labels_alone: int | None
    rows: int
    correlation: float | None
    pilot: int
    confidence: float


@dataclass(frozen=True)
class Estimate:
    """A mean and its interval (None: not enough rows for one)."""

    mean: float | None
    interval: tuple[float, float] | None

    def to_dict(self) -> EstimateJSON:
        return {"mean": self.mean, "interval": None if self.interval is None else list(self.interval)}


@dataclass(frozen=True)
class Calibrated:
    """The three estimates of one quantity (a mean, a pass rate, a paired difference).

    ``mean``/``interval`` are the calibrated estimate (the labels alone when ``fallback`` says
    why; None with fewer than :data:`MIN_LABELS` labels). ``lam`` is the tuning weight used (0:
    labels alone), ``effective_labels`` the number of labels alone whose interval would be as
    narrow, ``correlation`` Pearson's r of judge and human on the labeled rows.
    """

    mean: float | None
    interval: tuple[float, float] | None
    judge_only: Estimate
    human_only: Estimate
    correlation: float | None
    lam: float | None
    effective_labels: float | None
    labeled: int
    unlabeled: int
    fallback: str | None
    confidence: float = CONFIDENCE
    #: the labeled rows the correlation is over: those the judge graded (None: every one)
    correlation_rows: int | None = None

    def to_dict(self) -> CalibratedJSON:
        """The JSON object agree, compare and report show, key for key."""
        return {"mean": self.mean,
                "interval": None if self.interval is None else list(self.interval),
                "judge_only": self.judge_only.to_dict(), "human_only": self.human_only.to_dict(),
                "correlation": self.correlation, "lambda": self.lam,
                "effective_labels": self.effective_labels, "labeled": self.labeled,
                "unlabeled": self.unlabeled, "fallback": self.fallback,
                "correlation_rows": self.correlation_rows}


@dataclass(frozen=True)
class LabelPlan:
    """How many labels an interval of +/- ``half_width`` needs (None: not within ``rows``)."""

    half_width: float
    labels: int | None
    labels_alone: int | None
    rows: int
    correlation: float | None
    pilot: int
    confidence: float = CONFIDENCE

    def to_dict(self) -> LabelPlanJSON:
        # the fields, in their order, are LabelPlanJSON's keys
        return cast(LabelPlanJSON, asdict(self))


def _array(values: ArrayLike) -> NDArray[np.float64]:
    return np.asarray(values, dtype=float).reshape(-1)


def _quantile(confidence: float, df: float) -> float:
    from scipy import stats

    return float(stats.t.ppf((1 + confidence) / 2, df))


def _t_estimate(values: NDArray[np.float64], confidence: float,
                bounds: tuple[float, float] | None = None) -> Estimate:
    """The mean with a Student's t interval (None with fewer than 2 values)."""
    if values.size == 0:
        return Estimate(None, None)
    mean = float(values.mean())
    if values.size < 2:
        return Estimate(mean, None)
    half = _quantile(confidence, values.size - 1) * float(values.std(ddof=1)) / math.sqrt(values.size)
    return Estimate(mean, _bounded(mean - half, mean + half, bounds))


def _bounded(low: float, high: float, bounds: tuple[float, float] | None) -> tuple[float, float]:
    # A share's interval beyond [0, 1] says nothing more than [0, 1] does.
    if bounds is None:
        return (low, high)
    return (max(low, bounds[0]), min(high, bounds[1]))


def correlation(x: NDArray[np.float64], y: NDArray[np.float64]) -> float | None:
    """Pearson's r, None when either side is constant (or fewer than 2 rows)."""
    if x.size < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.clip(np.corrcoef(x, y)[0, 1], -1.0, 1.0))


def threshold(labeled: int) -> float:
    """The finite-sample threshold: below this judge-human correlation PPI++ gains nothing."""
    return 1 / math.sqrt(labeled - 2)


def _lambda(human: NDArray[np.float64], judge: NDArray[np.float64],
            judge_variance: NDArray[np.float64], labeled: int, unlabeled: int) -> NDArray[np.float64]:
    """PPI++'s power-tuned weight for a mean, clipped to [0, 1], over the last axis: the
    labels' covariance with the judge over n (as ppi_py), the judge's variance over all rows."""
    dy = human - human.mean(-1, keepdims=True)
    dj = judge - judge.mean(-1, keepdims=True)
    covariance = (dy * dj).mean(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        weight = covariance / ((1 + labeled / unlabeled) * judge_variance)
    clipped: NDArray[np.float64] = np.clip(np.nan_to_num(weight, nan=0.0, posinf=0.0, neginf=0.0), 0.0, 1.0)
    return clipped


def ppi_means(human: ArrayLike, judge_labeled: ArrayLike, judge_unlabeled: ArrayLike, *,
              confidence: float = CONFIDENCE, folds: int | None = FOLDS,
              lam: float | None = None) -> dict[str, NDArray[np.float64]]:
    """The prediction-powered mean over the last axis (many runs at once), with no fallback:
    ``{"mean", "low", "high", "lambda", "se"}``, arrays of the leading shape.

    Args:
        folds: cross-fit lambda over this many folds (fewer below 2 labels a fold), t
            interval with n - 1 df; None: plain PPI++ as ``ppi_py.ppi_mean_ci`` computes it
            (lambda from all labels, population variances, a normal interval), for comparison.
        lam: a fixed lambda instead of the tuned one (plain PPI++ only).
    """
    y = np.asarray(human, dtype=float)
    yh = np.asarray(judge_labeled, dtype=float)
    yu = np.asarray(judge_unlabeled, dtype=float)
    n, big_n = y.shape[-1], yu.shape[-1]
    if folds is None:
        from scipy import stats

        judge_variance = np.concatenate([yh, yu], -1).var(-1, ddof=1)
        weight = (_lambda(y, yh, judge_variance, n, big_n) if lam is None
                  else np.full(y.shape[:-1], float(lam)))
        w = weight[..., None]
        mean = weight * yu.mean(-1) + (y - w * yh).mean(-1)
        se = np.sqrt((y - w * yh).var(-1) / n + (w * yu).var(-1) / big_n)
        half = float(stats.norm.ppf((1 + confidence) / 2)) * se
        return {"mean": mean, "low": mean - half, "high": mean + half, "lambda": weight, "se": se}
    return crossfit_means(y, yh, yu.mean(-1), yu.var(-1, ddof=1), big_n,
                          confidence=confidence, folds=folds)


def crossfit_means(human: NDArray[np.float64], judge_labeled: NDArray[np.float64],
                   unlabeled_mean: ArrayLike, unlabeled_variance: ArrayLike, unlabeled: int, *,
                   confidence: float = CONFIDENCE,
                   folds: int = FOLDS) -> dict[str, NDArray[np.float64]]:
    """:func:`ppi_means`' cross-fitted estimate from the unlabeled rows' judge mean and
    variance (ddof 1) alone: all it reads of them (a simulation of 100,000 rows draws only
    their counts per score)."""
    y, yh = np.asarray(human, dtype=float), np.asarray(judge_labeled, dtype=float)
    mean_u = np.asarray(unlabeled_mean, dtype=float)
    var_u = np.asarray(unlabeled_variance, dtype=float)
    n, big_n = y.shape[-1], unlabeled
    # the judge's variance over all n + N rows, from the two groups' moments
    mean_l = yh.mean(-1)
    total = (n * mean_l + big_n * mean_u) / (n + big_n)
    squares = ((yh - total[..., None]) ** 2).sum(-1) + (big_n - 1) * var_u \
        + big_n * (mean_u - total) ** 2
    judge_variance = squares / (n + big_n - 1)
    # Folds by a fixed permutation, not by position: a file sorted by category would else
    # put one category in a fold and tune its lambda on the others. Seeded: reproducible.
    k = max(2, min(folds, n // 2))
    fold = np.random.default_rng(0).permutation(n) % k
    weights = np.empty(y.shape)
    for part in range(k):
        rest = fold != part
        weights[..., ~rest] = _lambda(y[..., rest], yh[..., rest], judge_variance, n, big_n)[..., None]
    corrected = y - weights * (yh - mean_u[..., None])  # each label corrected by a lambda it did not tune
    mean = corrected.mean(-1)
    weight = weights.mean(-1)
    se = np.sqrt(corrected.var(-1, ddof=1) / n + weight**2 * var_u / big_n)
    half = _quantile(confidence, n - 1) * se
    return {"mean": mean, "low": mean - half, "high": mean + half, "lambda": weight, "se": se}


def correlations(x: NDArray[np.float64], y: NDArray[np.float64]) -> NDArray[np.float64]:
    """Pearson's r over the last axis, NaN where either side is constant."""
    dx = x - x.mean(-1, keepdims=True)
    dy = y - y.mean(-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (dx * dy).sum(-1) / np.sqrt((dx**2).sum(-1) * (dy**2).sum(-1))
    clipped: NDArray[np.float64] = np.clip(r, -1.0, 1.0)
    return clipped


def calibrated_means(human: ArrayLike, judge_labeled: ArrayLike, judge_unlabeled: ArrayLike, *,
                     confidence: float = CONFIDENCE) -> dict[str, NDArray[np.float64]]:
    """:func:`calibrated_mean`'s estimate and interval for many runs at once (the last axis
    holds the rows; at least :data:`MIN_LABELS` labels and two unlabeled rows):
    ``{"mean", "low", "high", "lambda", "fallback"}``, ``fallback`` True where the labels
    alone are the estimate (the correlation under 1/sqrt(n - 2), or undefined)."""
    yu = np.asarray(judge_unlabeled, dtype=float)
    return calibrated_moments(human, judge_labeled, yu.mean(-1), yu.var(-1, ddof=1),
                              yu.shape[-1], confidence=confidence)


def calibrated_moments(human: ArrayLike, judge_labeled: ArrayLike, unlabeled_mean: ArrayLike,
                       unlabeled_variance: ArrayLike, unlabeled: int, *,
                       confidence: float = CONFIDENCE) -> dict[str, NDArray[np.float64]]:
    """:func:`calibrated_means` from the unlabeled rows' judge mean and variance (ddof 1)."""
    y = np.asarray(human, dtype=float)
    yh = np.asarray(judge_labeled, dtype=float)
    n = y.shape[-1]
    out = crossfit_means(y, yh, unlabeled_mean, unlabeled_variance, unlabeled,
                         confidence=confidence)
    r = correlations(y, yh)
    fallback = ~(r >= threshold(n))  # NaN (constant) falls back too
    mean = y.mean(-1)
    half = _quantile(confidence, n - 1) * y.std(-1, ddof=1) / math.sqrt(n)
    return {"mean": np.where(fallback, mean, out["mean"]),
            "low": np.where(fallback, mean - half, out["low"]),
            "high": np.where(fallback, mean + half, out["high"]),
            "lambda": np.where(fallback, 0.0, out["lambda"]), "fallback": fallback}


def calibrated_mean(human: ArrayLike, judge_labeled: ArrayLike, judge_unlabeled: ArrayLike, *,
                    confidence: float = CONFIDENCE,
                    bounds: tuple[float, float] | None = None,
                    judged: ArrayLike | None = None) -> Calibrated:
    """The mean of the human labels over all rows: judge only, labels only, calibrated.

    Args:
        human: the human labels of the labeled rows.
        judge_labeled: the judge's scores of the same rows, in the same order.
        judge_unlabeled: the judge's scores of every other row.
        bounds: the range of the quantity (a share: (0, 1)); intervals are cut to it.
        judged: per labeled row, whether its score is the judge's own answer (False where a
            rule set it: the seed's 0 for a row without an answer). The correlation, and so
            the fallback, is the judge's: over these rows only. A rule's 0 that a human also
            scores 0 would otherwise make a judge that reads nothing look informative. The
            estimate itself uses every row (a rule's score predicts as well as any).
    """
    y, yh, yu = _array(human), _array(judge_labeled), _array(judge_unlabeled)
    if y.size != yh.size:
        raise ValueError(f"{y.size} labels for {yh.size} judge scores")
    n, big_n = y.size, yu.size
    judge_only = _t_estimate(np.concatenate([yh, yu]), confidence, bounds)
    human_only = _t_estimate(y, confidence, bounds)
    own = np.ones(n, dtype=bool) if judged is None else np.asarray(judged, dtype=bool)
    graded = int(own.sum())
    r = correlation(y[own], yh[own]) if graded >= 3 else None

    def result(mean: float | None, interval: tuple[float, float] | None, lam: float | None,
               effective: float | None, fallback: str | None) -> Calibrated:
        return Calibrated(mean, interval, judge_only, human_only, r, lam, effective, n, big_n,
                          fallback, confidence, graded if graded < n else None)

    if n < MIN_LABELS:
        return result(None, None, None, None,
                      f"fewer than {MIN_LABELS} labels ({n}): no calibrated interval")
    reason = None
    if big_n < 2:  # no judge variance to speak of among the others: nothing to gain
        reason = ("every scored row is labeled: the labels alone are the estimate" if big_n == 0
                  else "one scored row has no label: the labels alone are the estimate")
    elif graded < 3:
        reason = (f"the judge graded {graded} of the labeled rows: no correlation to measure, "
                  "the labels alone carry the estimate")
    elif r is None:
        constant = "the human labels" if np.ptp(y[own]) == 0 else "the judge's scores"
        reason = (f"{constant} on the labeled rows are all the same: no correlation, "
                  "the labels alone carry the estimate")
    elif r < threshold(graded):
        reason = (f"the judge-human correlation {r:.2f} is under 1/sqrt(n-2) = "
                  f"{threshold(graded):.2f}"
                  + (f" (n: the {graded} labeled rows the judge graded)" if graded < n else "")
                  + ": the judge cannot narrow the interval, the labels alone carry the estimate")
    if reason is not None:
        return result(human_only.mean, human_only.interval, 0.0, float(n), reason)
    batch = calibrated_means(y[None], yh[None], yu[None], confidence=confidence)
    mean, low, high = (float(batch[key][0]) for key in ("mean", "low", "high"))
    lam = float(batch["lambda"][0])
    # the labels' half-width before any cut to bounds, for the effective labels
    labels_half = _quantile(confidence, n - 1) * float(y.std(ddof=1)) / math.sqrt(n)
    effective = n * (labels_half / ((high - low) / 2)) ** 2 if high > low else None
    return result(mean, _bounded(low, high, bounds), lam, effective, None)


def calibrated_pass_rate(human: ArrayLike, judge_labeled: ArrayLike, judge_unlabeled: ArrayLike,
                         at: float, *, confidence: float = CONFIDENCE,
                         judged: ArrayLike | None = None) -> Calibrated:
    """The share of all rows a human would score at least ``at``: the judge's pass (its score
    at least ``at``) predicts the human's (``judged`` as for :func:`calibrated_mean`)."""
    def passed(values: ArrayLike) -> NDArray[np.float64]:
        return (_array(values) >= at).astype(float)

    return calibrated_mean(passed(human), passed(judge_labeled), passed(judge_unlabeled),
                           confidence=confidence, bounds=(0.0, 1.0), judged=judged)


def calibrated_difference(human_a: ArrayLike, human_b: ArrayLike, judge_a_labeled: ArrayLike,
                          judge_b_labeled: ArrayLike, judge_a_unlabeled: ArrayLike,
                          judge_b_unlabeled: ArrayLike, *,
                          confidence: float = CONFIDENCE) -> Calibrated:
    """The mean paired difference B - A in human score over all rows graded for both.

    Labels for both models on the same rows: the row's difference of labels is predicted by
    its difference of judge scores (a row labeled for one model only counts as unlabeled).
    """
    return calibrated_mean(_array(human_b) - _array(human_a),
                           _array(judge_b_labeled) - _array(judge_a_labeled),
                           _array(judge_b_unlabeled) - _array(judge_a_unlabeled),
                           confidence=confidence)


def plan_labels(human: ArrayLike, judge_labeled: ArrayLike, judge_unlabeled: ArrayLike,
                half_width: float, *, confidence: float = CONFIDENCE) -> LabelPlan:
    """PPI++'s power analysis: from a pilot of labels, how many labels (of all the rows) a
    calibrated interval of +/- ``half_width`` needs with this judge, and how many alone.

    The pilot's variances and covariance stand for the population's; the answer is as good
    as the pilot is large (plan again once more labels are in).
    """
    y, yh, yu = _array(human), _array(judge_labeled), _array(judge_unlabeled)
    rows = y.size + yu.size
    r = correlation(y, yh) if y.size >= 3 else None
    if y.size < 3 or half_width <= 0:
        return LabelPlan(half_width, None, None, rows, r, int(y.size), confidence)
    from scipy import stats

    var_y = float(y.var(ddof=1))
    var_j = float(np.concatenate([yh, yu]).var(ddof=1))
    cov = float(np.cov(y, yh, ddof=1)[0, 1]) if y.size > 1 else 0.0
    n = np.arange(MIN_LABELS, rows + 1, dtype=float)
    q = stats.t.ppf((1 + confidence) / 2, n - 1)
    alone = q * math.sqrt(var_y) / np.sqrt(n)
    others = np.maximum(rows - n, 1.0)
    lam = np.clip(cov / ((1 + n / others) * var_j), 0, 1) if var_j > 0 else np.zeros_like(n)
    variance = (var_y - 2 * lam * cov + lam**2 * var_j) / n + lam**2 * var_j / others
    calibrated = q * np.sqrt(np.maximum(variance, 0))
    # where the pilot's correlation is under the threshold at n, the labels alone are used
    usable = (r is not None) & (n > 2)
    if r is not None:
        usable = usable & (r >= 1 / np.sqrt(np.maximum(n - 2, 1)))
    calibrated = np.where(usable, calibrated, alone)

    def first(widths: NDArray[np.float64]) -> int | None:
        hits = np.flatnonzero(widths <= half_width)
        return int(n[hits[0]]) if hits.size else None

    return LabelPlan(half_width, first(calibrated), first(alone), rows, r, int(y.size), confidence)


def describe(result: Calibrated, *, what: str = "mean", digits: int = 2) -> str:
    """One plain sentence: how far the judge is off, and the calibrated estimate."""
    def number(value: float) -> str:
        return f"{value:.{digits}f}"

    if result.mean is None or result.interval is None:
        return f"no calibrated {what}: {result.fallback}"
    low, high = result.interval
    bias = ""
    if result.judge_only.mean is not None:
        off = result.judge_only.mean - result.mean
        word = "overrates" if off > 0 else "underrates"
        bias = f"the judge {word} by {number(abs(off))}; " if round(off, digits) else \
            "the judge's own mean is the same; "
    estimate = f"{what} is {number(result.mean)} [{number(low)}, {number(high)}]"
    if result.fallback is not None:
        return f"{bias}with {result.labeled} labels the {estimate} from the labels alone " \
            f"({result.fallback})"
    effective = result.effective_labels or 0
    return (f"{bias}with {result.labeled} labels the {estimate}, "
            f"as sure as {effective:.0f} labels alone")


def correlation_words(correlation: float | None, rows: int | None, none: str = "-") -> str:
    """The judge-human correlation and the rows it is over: the labeled rows, less those a rule
    scored (``rows`` of them are the judge's own; None: every one). Not the agreement table's
    Pearson r, which counts every row with both scores, a rule's 0 beside a human's 0 too."""
    r = none if correlation is None else f"{correlation:.3f}"
    if rows is not None:
        return f"{r} (on the {rows} labeled rows the judge graded)"
    return r if correlation is None else f"{r} (on the labeled rows)"


def format_calibrated(result: Calibrated, *, title: str = "mean human score",
                      digits: int = 3) -> list[str]:
    """The three estimates as a small table, then the correlation, lambda and the sentence."""
    pct = f"{round(result.confidence * 100, 1):g}%"

    def row(name: str, estimate: Estimate, n: str) -> str:
        mean = "-" if estimate.mean is None else f"{estimate.mean:.{digits}f}"
        interval = "" if estimate.interval is None else \
            f"[{estimate.interval[0]:.{digits}f}, {estimate.interval[1]:.{digits}f}]"
        return f"  {name:<28}{mean:>8}   {interval:<20}{n}"

    lines = [f"{title}, all {result.labeled + result.unlabeled} scored rows ({pct} intervals)"]
    lines.append(row("judge only", result.judge_only, f"{result.labeled + result.unlabeled} rows"))
    lines.append(row("labels only", result.human_only, f"{result.labeled} labels"))
    lines.append(row("calibrated (PPI++)", Estimate(result.mean, result.interval),
                     "" if result.effective_labels is None
                     else f"as {result.effective_labels:.0f} labels"))
    r = correlation_words(result.correlation, result.correlation_rows)
    lam = "-" if result.lam is None else f"{result.lam:.3f}"
    lines.append(f"  correlation judge-human {r}, lambda {lam}, labeled {result.labeled}, "
                 f"unlabeled {result.unlabeled}")
    if result.fallback is not None:
        lines.append(f"  fallback: {result.fallback}")
    return lines
