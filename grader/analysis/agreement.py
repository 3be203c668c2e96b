"""How well the judge agrees with human labels: agreement, kappa, correlations, alpha, intervals.

Judge scores and human labels are both integers 0-5, so every statistic is a function of the
6 x 6 table of (human, judge) counts. :func:`table_statistics` computes them all from tables,
vectorized: once for the point estimates and once for a thousand bootstrap resamples. Tests
hold it to scipy's, sklearn's and krippendorff's values (tests/test_agreement.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from grader.analysis.confidence import (
    confidence_agreement,
    format_confidence_agreement,
    format_number,
)
from grader.errors import GraderError
from grader.io.results import read_records
from grader.records import Record, ResultsError
from grader.status import ZERO_SCORE, in_status_order

if TYPE_CHECKING:
    from grader.analysis.calibration import CalibratedJSON, EstimateJSON, LabelPlanJSON

LABELS = tuple(range(6))
_NAMES = {
    "exact_agreement": "exact agreement",
    "within_one": "within one point",
    "quadratic_weighted_kappa": "kappa (quadratic)",
    "spearman": "Spearman rho",
    "kendall": "Kendall tau-b",
    "pearson": "Pearson r",
    "krippendorff_alpha": "Krippendorff alpha (ordinal)",
    "mean_human": "mean human",
    "mean_judge": "mean judge",
    "mean_difference": "mean judge - human",
}
STATISTICS = tuple(_NAMES)
# Why a results row is left out, in the order a row is checked: it counts under the first.
EXCLUSIONS = ("null_judge_score", "invalid_judge_score", "not_in_data", "missing_human_label",
              "invalid_human_label")


class AgreementError(GraderError, ValueError):
    """Inputs that cannot be compared at all (no human label column anywhere), or bootstrap
    settings out of range: the message names the file or the setting."""


def read_label(value: Any) -> tuple[int | None, str | None]:
    """A score or label as an integer 0-5: ``(label, None)``, or ``(None, "missing"|"invalid")``.

    Accepts ints, integral floats (4.0, from Parquet or pandas) and numeric strings ("4",
    " 4.0 ", from CSV). Booleans, fractions (3.5), out-of-range values and text are invalid;
    None, NaN and blank strings are missing.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None, "missing"
    if isinstance(value, str):
        if not value.strip():
            return None, "missing"
        try:
            value = float(value.strip())
        except ValueError:
            return None, "invalid"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None, "invalid"
    if isinstance(value, float) and not value.is_integer():
        return None, "invalid"
    label = int(value)
    return (label, None) if label in LABELS else (None, "invalid")


def load_records(path: str | Path) -> list[tuple[int, Record]]:
    """``(line, record)`` of a results file; a missing file or a duplicate id is a ResultsError."""
    try:
        rows = list(read_records(path))
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read the file: {exc.strerror or exc}") from None
    seen: dict[Any, int] = {}
    for line, record in rows:
        key = id_key(record.id)
        if key in seen:
            raise ResultsError(f"{path}:{line}: duplicate id {record.id!r} (first on line {seen[key]})")
        seen[key] = line
    return rows


def id_key(value: Any) -> Any:
    # Ids are strings or integers (dataset.read_items); anything else from a foreign file is
    # compared by its JSON-ish text so that it can still be a dict key.
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else repr(value)


def contingency_table(human: np.ndarray, judge: np.ndarray) -> np.ndarray:
    """6 x 6 counts, rows human, columns judge."""
    return np.bincount(human * 6 + judge, minlength=36).reshape(6, 6)


def _pearson(tables: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of tables whose row i has value x[..., i] and column j value y[..., j]."""
    rows, cols = tables.sum(-1), tables.sum(-2)
    n = rows.sum(-1)
    dx = x - ((rows * x).sum(-1) / n)[..., None]
    dy = y - ((cols * y).sum(-1) / n)[..., None]
    cov = (tables * dx[..., :, None] * dy[..., None, :]).sum((-2, -1))
    r: np.ndarray = cov / np.sqrt((rows * dx**2).sum(-1) * (cols * dy**2).sum(-1))
    return np.clip(r, -1.0, 1.0)


def _average_ranks(margins: np.ndarray) -> np.ndarray:
    """The average rank (1-based) shared by every row in each category, as scipy.stats.rankdata."""
    before = np.cumsum(margins, -1) - margins
    ranks: np.ndarray = before + (margins + 1) / 2
    return ranks


# sign(c - a) * sign(d - b) for cells (a, b) and (c, d): +1 concordant, -1 discordant, 0 tied.
_SIGNS = np.einsum("ac,bd->abcd", np.sign(np.subtract.outer(LABELS, LABELS)).T,
                   np.sign(np.subtract.outer(LABELS, LABELS)).T).reshape(36, 36)
_SQUARED = np.subtract.outer(LABELS, LABELS).astype(float) ** 2


def table_statistics(tables: np.ndarray) -> dict[str, np.ndarray]:
    """Every statistic of :data:`STATISTICS` from count tables of shape (..., 6, 6).

    Rows are human labels, columns judge scores. Undefined values are NaN: correlations when
    either side is constant, kappa when no disagreement is expected by chance, alpha when every
    label is the same, everything when a table is empty.
    """
    t = np.asarray(tables, dtype=float)
    values = np.arange(6, dtype=float)
    rows, cols = t.sum(-1), t.sum(-2)
    n = rows.sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {"exact_agreement": np.trace(t, axis1=-2, axis2=-1) / n,
               "within_one": (t * (_SQUARED <= 1)).sum((-2, -1)) / n,
               "mean_human": rows @ values / n, "mean_judge": cols @ values / n}
        out["mean_difference"] = out["mean_judge"] - out["mean_human"]
        # Cohen's kappa, quadratic weights: 1 - sum(w * observed) / sum(w * expected by chance)
        observed = (t * _SQUARED).sum((-2, -1)) / n
        expected = (rows[..., :, None] * cols[..., None, :] * _SQUARED).sum((-2, -1)) / n**2
        out["quadratic_weighted_kappa"] = 1 - observed / expected

        varied = ((rows > 0).sum(-1) > 1) & ((cols > 0).sum(-1) > 1)
        pearson = _pearson(t, np.broadcast_to(values, rows.shape), np.broadcast_to(values, cols.shape))
        spearman = _pearson(t, _average_ranks(rows), _average_ranks(cols))
        # Kendall's tau-b: (concordant - discordant) / sqrt((pairs - x ties)(pairs - y ties))
        flat = t.reshape(*t.shape[:-2], 36)
        score = np.einsum("...i,ij,...j->...", flat, _SIGNS, flat) / 2
        pairs = n * (n - 1) / 2
        x_ties = (rows * (rows - 1) / 2).sum(-1)
        y_ties = (cols * (cols - 1) / 2).sum(-1)
        kendall = score / np.sqrt((pairs - x_ties) * (pairs - y_ties))
        out["pearson"] = np.where(varied, pearson, np.nan)
        out["spearman"] = np.where(varied, spearman, np.nan)
        out["kendall"] = np.where(varied, np.clip(kendall, -1.0, 1.0), np.nan)

        # Krippendorff's ordinal alpha, two coders, no missing values: coincidences o = t + t',
        # value counts n_v, metric delta(c, k) = (sum of n_g for g from c to k - (n_c + n_k)/2)^2
        coincidences = t + np.swapaxes(t, -1, -2)
        counts = rows + cols
        cumulative = np.cumsum(counts, -1)
        delta = (cumulative[..., None, :] - cumulative[..., :, None]
                 + (counts[..., :, None] - counts[..., None, :]) / 2) ** 2
        disagreement = (coincidences * delta).sum((-2, -1))
        chance = (counts[..., :, None] * counts[..., None, :] * delta).sum((-2, -1))
        out["krippendorff_alpha"] = 1 - (2 * n - 1) * disagreement / chance
    return out


def bootstrap_intervals(table: np.ndarray,
                        statistic: Callable[[np.ndarray], Mapping[str, np.ndarray]],
                        names: tuple[str, ...], *, resamples: int, seed: int, confidence: float
                        ) -> tuple[dict[str, list[float] | None], dict[str, int]]:
    """Percentile intervals of ``statistic(tables)`` over bootstrap resamples of ``table``.

    Resampling n rows with replacement is drawing the table of counts from a multinomial with
    the observed cell frequencies, so resamples are drawn as tables directly: memory and time
    do not grow with the number of rows. A resample on which a statistic is undefined (NaN) is
    skipped for that statistic; returns the intervals and the number of valid resamples each.
    """
    n = int(table.sum())
    if resamples <= 0 or n == 0:
        return {name: None for name in names}, {name: 0 for name in names}
    rng = np.random.default_rng(seed)
    flat = table.reshape(-1)
    draws = rng.multinomial(n, flat / n, size=resamples).reshape(resamples, *table.shape)
    values = statistic(draws)
    tail = (1 - confidence) / 2
    intervals: dict[str, list[float] | None] = {}
    valid: dict[str, int] = {}
    for name in names:
        finite = values[name][np.isfinite(values[name])]
        valid[name] = int(finite.size)
        bounds = np.quantile(finite, [tail, 1 - tail]) if finite.size else None
        intervals[name] = None if bounds is None else [float(bounds[0]), float(bounds[1])]
    return intervals, valid


class BootstrapManifest(TypedDict):
    resamples: int
    valid: dict[str, int]
    seed: int
    confidence: float
    method: str


def bootstrap_manifest(resamples: int, valid: dict[str, int], seed: int, confidence: float,
                       unit: str) -> BootstrapManifest:
    """How the intervals were drawn, for the output: ``unit`` is what was resampled."""
    return {"resamples": resamples, "valid": valid, "seed": seed, "confidence": confidence,
            "method": f"percentile, {unit} resampled with replacement"}


def check_bootstrap_settings(bootstrap: int, confidence: float) -> None:
    if bootstrap < 0:
        raise AgreementError(f"bootstrap must be 0 or more resamples, got {bootstrap}")
    if not 0 < confidence < 1:
        raise AgreementError(f"confidence must be between 0 and 1, got {confidence}")


@dataclass(frozen=True)
class HumanLabels:
    """Where agree's human labels come from, read once.

    ``scores``: each id's label as given (checked later by :func:`read_label`); ids not in it
    have no label. ``random_sample``: True where the labeled rows were offered in a recorded
    seeded random order (a ``grader label`` file), False for a column of the user's data
    (nothing says how those rows were chosen: the calibrated estimate assumes it).
    ``data_rows_without_result``: dataset rows no record matches; ``texts``: each row's
    ``(reference, output_text)`` from the dataset for the floor (None: from the records).
    """

    scores: dict[Any, Any]
    random_sample: bool
    source: str
    data_rows_without_result: int = 0
    texts: dict[Any, tuple[Any, Any]] | None = None
    stale: tuple[str, ...] = ()  # a label file's labels of answers that changed: not used
    skipped: int = 0  # a label file's rows skipped by the person labeling
    # by id, the line and id as given of each label of the records or a dataset, for messages
    lines: dict[Any, tuple[int, Any]] = field(default_factory=dict)


def read_human_labels(results: str | Path, records: list[tuple[int, Record]], human: str,
                      data: str | None, mapping: Mapping[str, str] | None,
                      id_column: str | None) -> HumanLabels:
    """The human labels by id: from ``data`` (a dataset joined by id) or, without it, from
    the records' ``human`` field. The one place agree, compare, rank and the report read labels
    from: a ``grader label`` file (grader/io/labels.py) is read here too, its ``Labels.scores``
    as ``scores`` and ``Labels.random`` as ``random_sample``."""
    if data is None:
        if not any(record.has(human) for _, record in records):
            raise AgreementError(
                f"{results}: no record has a {human!r} field: pass the dataset that holds the "
                "human labels (with the --map/--id-column used for grading)")
        scores = {id_key(record.id): record.field(human) for _, record in records}
        return HumanLabels(scores, random_sample=False, source="results",
                           lines={id_key(r.id): (line, r.id) for line, r in records})
    from grader.io.dataset import DatasetError, read_items
    from grader.io.labels import is_label_file

    if is_label_file(data):
        return _label_file(results, records, data, mapping, id_column)
    items = read_items(data, mapping=mapping, id_column=id_column)
    if not any(human in item.fields for item in items):
        raise DatasetError(data, None, f"no column {human!r} with the human labels")
    labels = {id_key(item.id): item.fields.get(human) for item in items}
    texts = {id_key(item.id): (item.fields.get("reference"), item.fields.get("output_text"))
             for item in items}
    graded = {id_key(record.id) for _, record in records}
    return HumanLabels(labels, random_sample=False, source=str(data),
                       data_rows_without_result=sum(key not in graded for key in labels),
                       texts=texts, lines={id_key(i.id): (i.line, i.id) for i in items})


def _label_file(results: str | Path, records: list[tuple[int, Record]], data: str,
                mapping: Mapping[str, str] | None, id_column: str | None) -> HumanLabels:
    """A ``grader label`` file's labels of the rows of ``results`` (any ``--human`` column:
    the file holds one score per row): labels of answers that changed since are not used."""
    from grader.io.labels import label_id, labels_of_run

    found = labels_of_run(data, results, mapping=mapping, id_column=id_column)
    ids = {label_id(record.id): id_key(record.id) for _, record in records}
    return HumanLabels({ids[i]: score for i, score in found.scores.items() if i in ids},
                       random_sample=found.random, source=str(data), stale=found.stale,
                       skipped=len(found.skipped))


def agreement(results: str | Path, human: str, *, data: str | None = None,
              mapping: Mapping[str, str] | None = None, id_column: str | None = None,
              bootstrap: int = 1000, seed: int = 0, confidence: float = 0.95,
              pass_at: float | None = None, plan: float | None = None) -> dict[str, Any]:
    """Agreement between the judge's scores in a results file and human labels 0-5, and the
    mean human score over every scored row, calibrated (:mod:`grader.analysis.calibration`).

    Every record with a score counts, the seed's 0 for ``missing_context`` and ``ambiguous``
    included: that is the score grading hands out. The result says how many rows of each
    status were used and how many were left out and why.

    Args:
        results: a results JSONL file.
        human: the column (or record field) holding the human labels, integers 0-5.
        data: the graded dataset, joined on the record ``id``; without it the labels are read
            from the records themselves. Read with the grading run's ``mapping`` and
            ``id_column`` so that ids match.
        bootstrap: resamples for the percentile intervals (0: none).
        pass_at: also estimate the share of scored rows a human would score at least this.
        plan: also plan how many labels a calibrated interval of +/- this needs.

    Returns:
        A JSON-serialisable dict: ``n`` and each statistic (a float, or None where undefined,
        explained in ``notes``), ``intervals`` ({statistic: [low, high] or None}),
        ``bootstrap`` (resamples, valid resamples per statistic, seed, confidence),
        ``confusion_matrix`` (6 x 6, rows human 0-5, columns judge 0-5), ``excluded``,
        ``statuses`` of the rows used, and where the labels came from; ``calibrated``
        (judge only, labels only and calibrated means over every scored row: the
        :class:`~grader.analysis.calibration.Calibrated` JSON), ``calibration`` (method,
        confidence, whether the labels are a recorded random sample, the assumption, one
        sentence), and with ``pass_at``/``plan`` ``calibrated_pass_rate``/``label_plan``.
    """
    check_bootstrap_settings(bootstrap, confidence)
    records = load_records(results)
    read = read_human_labels(results, records, human, data, mapping, id_column)
    _check_scored(results, records)
    rows = _Compared.of(records, read.scores)
    human_labels = np.array(rows.human, dtype=int)
    judge_scores = np.array(rows.judge, dtype=int)
    table = contingency_table(human_labels, judge_scores)
    values, intervals, valid = estimates(table, bootstrap, seed, confidence)
    result: dict[str, Any] = {"n": len(rows.human), **values, "intervals": intervals}
    result["bootstrap"] = bootstrap_manifest(bootstrap, valid, seed, confidence, "rows")
    result["confusion_matrix"] = table.tolist()
    result["rows"] = len(records)
    statuses = Counter(str(record.status) for record in rows.records)
    result["statuses"] = {status: statuses[status] for status in in_status_order(statuses)}
    result["excluded"] = {"rows": sum(rows.excluded.values()), **rows.excluded}
    result["human_column"] = human
    result["human_source"] = read.source
    if data is not None:
        result["data_rows_without_result"] = read.data_rows_without_result
    if read.stale or read.skipped:
        result["labels_not_used"] = {"stale": list(read.stale), "skipped": read.skipped}
    result |= calibrate(human_labels, judge_scores, np.array(rows.unlabeled, dtype=int),
                        random_sample=read.random_sample, pass_at=pass_at, plan=plan,
                        # per compared row: the judge graded it (not the seed's rule's 0)
                        judged=np.array([r.status not in ZERO_SCORE for r in rows.records],
                                        dtype=bool))
    result["notes"] = _notes(result, human_labels, judge_scores)
    result |= confidence_agreement(rows.records, rows.human, rows.judge)
    texts, answers_from = read.texts, str(data) if read.texts is not None else "records"
    if texts is None and not all(_texts(record, None) for record in rows.records):
        texts, answers_from = _recorded_texts(Path(results), rows.records, mapping, id_column)
    result["floor"] = _floor(rows.records, texts, human_labels, judge_scores,
                             bootstrap=bootstrap, seed=seed, confidence=confidence)
    if result["floor"] is not None:
        result["floor"]["answers_from"] = answers_from
    return result


def _check_scored(results: str | Path, records: list[tuple[int, Record]]) -> None:
    """A results file without one judge score 0-5 is refused in one line, its statuses counted."""
    if not any(read_label(record.field("score"))[0] is not None for _, record in records):
        found = Counter(str(record.status) for _, record in records)
        raise AgreementError(
            f"{results}: no record has a judge score 0-5 ("
            + ", ".join(f"{status} {count}" for status, count in found.most_common())
            + "): nothing to compare with human labels or to calibrate")


@dataclass
class _Compared:
    """agree's rows: per compared row (a judge score and a human label 0-5) the label, the
    score and its record; the judge's scores of scored rows without a label; the rows left
    out by why."""

    human: list[int] = field(default_factory=list)
    judge: list[int] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    unlabeled: list[int] = field(default_factory=list)
    excluded: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EXCLUSIONS, 0))

    @classmethod
    def of(cls, records: list[tuple[int, Record]], labels: Mapping[Any, Any]) -> _Compared:
        rows = cls()
        for _, record in records:
            # by name: another tool's records hold a score too
            judge, problem = read_label(record.field("score"))
            if judge is None:
                rows.excluded["null_judge_score" if problem == "missing" else "invalid_judge_score"] += 1
                continue
            label, problem = read_label(labels.get(id_key(record.id)))
            if label is None:
                why = "not_in_data" if id_key(record.id) not in labels else f"{problem}_human_label"
                rows.excluded[why] += 1
                rows.unlabeled.append(judge)
                continue
            rows.human.append(label)
            rows.judge.append(judge)
            rows.records.append(record)
        return rows


def estimates(table: np.ndarray, bootstrap: int, seed: int, confidence: float,
              statistic: Callable[[np.ndarray], Mapping[str, np.ndarray]] = table_statistics,
              names: tuple[str, ...] = STATISTICS
              ) -> tuple[dict[str, float | None], dict[str, list[float] | None], dict[str, int]]:
    """Each of ``names`` of ``statistic(table)`` (None where undefined), its interval (None
    with an undefined statistic), and the valid resamples of each."""
    point = statistic(table)
    intervals, valid = bootstrap_intervals(table, statistic, names, resamples=bootstrap,
                                           seed=seed, confidence=confidence)
    values: dict[str, float | None] = {}
    for name in names:
        value = float(point[name])
        values[name] = value if math.isfinite(value) else None
        if values[name] is None:
            intervals[name] = None
    return values, intervals, valid


class CalibrationAbout(TypedDict):
    method: str
    confidence: float
    random_sample: bool
    assumption: str | None
    sentences: list[str]


class Calibration(TypedDict, total=False):
    """:func:`calibrate`'s: the pass rate's keys with ``pass_at``, the plan's with ``plan``."""

    calibrated: CalibratedJSON
    pass_at: float
    calibrated_pass_rate: CalibratedJSON
    label_plan: LabelPlanJSON
    calibration: CalibrationAbout


def calibrate(human: np.ndarray, judge: np.ndarray, unlabeled: np.ndarray, *,
              random_sample: bool, pass_at: float | None = None,
              plan: float | None = None, judged: np.ndarray | None = None) -> Calibration:
    """agree's calibrated estimates over every scored row (labeled or not), as JSON;
    ``judged``: per labeled row, whether the judge graded it (its correlation is over those)."""
    from grader.analysis.calibration import (
        calibrated_mean,
        calibrated_pass_rate,
        describe,
        plan_labels,
    )

    mean = calibrated_mean(human, judge, unlabeled, judged=judged)
    out: Calibration = {"calibrated": mean.to_dict()}
    sentences = [describe(mean)]
    if pass_at is not None:
        rate = calibrated_pass_rate(human, judge, unlabeled, pass_at, judged=judged)
        out["pass_at"] = pass_at
        out["calibrated_pass_rate"] = rate.to_dict()
        sentences.append(describe(rate, what=f"share a human scores >= {pass_at:g}"))
    if plan is not None:
        out["label_plan"] = plan_labels(human, judge, unlabeled, plan).to_dict()
    out["calibration"] = calibration_about(random_sample, sentences)
    return out


def calibration_about(random_sample: bool, sentences: list[str]) -> CalibrationAbout:
    """How calibrated estimates were made, with the assumption they rest on where the labels
    come from a data column (nothing recorded how their rows were chosen)."""
    from grader.analysis.calibration import ASSUMPTION, CONFIDENCE, METHOD

    return {"method": METHOD, "confidence": CONFIDENCE, "random_sample": random_sample,
            "assumption": None if random_sample else ASSUMPTION, "sentences": sentences}


def read_answers(results: str | Path, given: str | None, mapping: Mapping[str, str] | None,
                 id_column: str | None, fields: Sequence[str]
                 ) -> tuple[str, dict[Any, tuple[Any, ...]]] | None:
    """The dataset of the answers ``results`` graded and, by row id, their ``fields``: from
    ``given`` (--data), else from the dataset its run recorded in its summary (``run.data``),
    where that file is still there; None when neither is there. A recorded dataset that no
    longer reads with these settings is passed over (the caller says what is missing); a
    --data file that does not read is the user's error."""
    from grader.io.dataset import DatasetError, read_items
    from grader.io.results import recorded_data

    path = given if given is not None else recorded_data(Path(results))
    if path is None:
        return None
    try:
        items = read_items(path, mapping=mapping, id_column=id_column)
    except DatasetError:
        if given is not None:
            raise
        return None
    return path, {id_key(item.id): tuple(item.fields.get(f) for f in fields) for item in items}


def _recorded_texts(results: Path, compared: list[Record], mapping: Mapping[str, str] | None,
                    id_column: str | None) -> tuple[dict[Any, tuple[Any, ...]] | None, str]:
    """Without --data, for records that do not hold their answers: each row's ``(reference,
    output_text)`` from the dataset the run recorded, where it reads with
    ``mapping``/``id_column`` and holds every compared row's id (else None: the floor is not
    computed, never made of rows it cannot see)."""
    found = read_answers(results, None, mapping, id_column, ("reference", "output_text"))
    if found is None or any(id_key(record.id) not in found[1] for record in compared):
        return None, "records"
    return found[1], found[0]


def _texts(record: Record, texts: dict[Any, tuple[Any, Any]] | None) -> tuple[Any, Any] | None:
    """A compared row's ``(reference, output_text)``: from the dataset, else from the record
    where it holds them (another tool's record, or a caller's columns); None: not known."""
    if texts is not None:
        return texts.get(id_key(record.id), (None, None))
    if record.has("output_text") and (record.has("reference") or record.listed_items()):
        return record.field("reference"), record.field("output_text")
    return None


def _floor(compared: list[Record], texts: dict[Any, tuple[Any, Any]] | None, human: np.ndarray,
           judge: np.ndarray, *, bootstrap: int, seed: int, confidence: float
           ) -> dict[str, Any] | None:
    """The word-overlap floor (:mod:`grader.analysis.floor`) on the rows compared, with the
    same statistics and intervals as the judge's, the paired bootstrap interval of judge -
    floor in quadratic kappa, and a one-line ``conclusion``. None when no row's answer is known
    (no --data and records without ``output_text``)."""
    from grader.analysis.floor import FLOOR_METHOD, SOURCES, floor_score

    known = [_texts(record, texts) for record in compared]
    if not compared or any(pair is None for pair in known):
        return None
    scored = [floor_score(pair[1], pair[0], record.listed_items())
              for record, pair in zip(compared, known, strict=True) if pair is not None]
    floor = np.array([score for score, _ in scored], dtype=int)
    sources = Counter(source for _, source in scored)
    table = contingency_table(human, floor)
    values, intervals, _ = estimates(table, bootstrap, seed, confidence)
    out: dict[str, Any] = {"method": FLOOR_METHOD, "n": int(floor.size), **values,
                           "intervals": intervals}
    out["items_from"] = {name: sources[name] for name in SOURCES}
    out["confusion_matrix"] = table.tolist()
    out["kappa_difference"] = _kappa_difference(human, judge, floor, bootstrap, seed, confidence)
    out["conclusion"] = _floor_conclusion(out["kappa_difference"])
    return out


class KappaDifference(TypedDict):
    value: float | None
    interval: list[float] | None


def _kappa_difference(human: np.ndarray, judge: np.ndarray, floor: np.ndarray,
                      resamples: int, seed: int, confidence: float) -> KappaDifference:
    """Judge - floor in quadratic kappa, with a paired percentile interval: rows are resampled
    together, as a multinomial draw of the 6 x 6 x 6 table of (human, judge, floor)."""
    cube = np.bincount(human * 36 + judge * 6 + floor, minlength=216).reshape(6, 6, 6)

    def kappas(cubes: np.ndarray) -> np.ndarray:
        stats_judge = table_statistics(cubes.sum(-1))["quadratic_weighted_kappa"]
        stats_floor = table_statistics(cubes.sum(-2))["quadratic_weighted_kappa"]
        difference: np.ndarray = stats_judge - stats_floor
        return difference

    point = float(kappas(cube))
    if not math.isfinite(point):
        return {"value": None, "interval": None}
    intervals, _ = bootstrap_intervals(cube, lambda cubes: {"kappa": kappas(cubes)}, ("kappa",),
                                       resamples=resamples, seed=seed, confidence=confidence)
    return {"value": point, "interval": intervals["kappa"]}


def _floor_conclusion(difference: KappaDifference) -> str:
    value, interval = difference["value"], difference["interval"]
    if value is None:
        return "kappa is undefined for the judge or the floor: no comparison"
    if value <= 0:
        return ("the judge does not beat word overlap: a judge that needs no model agrees with "
                "the human labels as well or better (try a larger judge)")
    if interval is not None and interval[0] > 0:
        return "the judge beats word overlap (its kappa is higher, the interval above 0)"
    return "the judge is not clearly better than word overlap (the interval of the difference holds 0)"


def _notes(result: dict[str, Any], human: np.ndarray, judge: np.ndarray) -> list[str]:
    """One line for each statistic left undefined, and for resamples skipped."""
    if result["n"] == 0:
        return ["no row has both a judge score and a human label 0-5: no statistic"]
    notes = []
    constant = [f"the {who} are all {int(values[0])}"
                for who, values in (("human labels", human), ("judge's scores", judge))
                if len(set(values.tolist())) == 1]
    if result["pearson"] is None:
        why = " and ".join(constant) if constant else "only one row"
        notes.append(f"spearman, kendall, pearson: undefined: {why} (a correlation needs both to vary)")
    if result["quadratic_weighted_kappa"] is None:
        notes.append("quadratic_weighted_kappa: undefined: both give every row the same label, "
                     "so no disagreement is expected by chance")
    if result["krippendorff_alpha"] is None:
        notes.append("krippendorff_alpha: undefined: every label, human and judge, is the same")
    resamples = result["bootstrap"]["resamples"]
    skipped = {name: resamples - count for name, count in result["bootstrap"]["valid"].items()
               if result[name] is not None and count < resamples}
    if resamples and skipped:
        listed = ", ".join(f"{name} {count}" for name, count in skipped.items())
        notes.append(f"resamples skipped where a statistic is undefined (constant input): {listed}")
    return notes


def format_interval(interval: list[float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"


def left_out(excluded: Mapping[str, int], width: int) -> list[str]:
    """The line of the rows left out, by why (none when no row is)."""
    if not excluded["rows"]:
        return []
    reasons = ", ".join(f"{name.replace('_', ' ')} {count}" for name, count in excluded.items()
                        if name != "rows" and count)
    return [f"{'  left out':<{width}}{excluded['rows']:>8}   {reasons}"]


class LabelsNotUsed(TypedDict):
    stale: list[str]
    skipped: int


def _not_used(unused: LabelsNotUsed | None) -> list[str]:
    """The lines of a label file's labels not used: of changed answers, skipped rows."""
    lines = []
    if unused and unused["stale"]:
        stale = unused["stale"]
        named = ", ".join(stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        lines.append(f"{'  labels of changed answers':<30}{len(stale):>8}  (not used: {named})")
    if unused and unused["skipped"]:
        lines.append(f"{'  rows skipped by the labeler':<30}{unused['skipped']:>8}")
    return lines


def format_agreement(result: dict[str, Any]) -> str:
    """The short table printed by ``grader agree``."""
    lines = [f"{'rows in results':<30}{result['rows']:>8}",
             f"{'  compared (n)':<30}{result['n']:>8}   "
             + ", ".join(f"{status} {count}" for status, count in result["statuses"].items()),
             *left_out(result["excluded"], 30)]
    if result.get("data_rows_without_result"):
        lines.append(f"{'  data rows without a result':<30}{result['data_rows_without_result']:>8}")
    lines += _not_used(result.get("labels_not_used"))
    boot = result["bootstrap"]
    header = f"{round(boot['confidence'] * 100, 1):g}% interval" if boot["resamples"] else ""
    lines += ["", f"{'statistic':<30}{'value':>8}   {header}"]
    for name in STATISTICS:
        lines.append(f"{_NAMES[name]:<30}{format_number(result[name]):>8}   "
                     f"{format_interval(result['intervals'][name])}")
    if boot["resamples"]:
        lines.append(f"(bootstrap: {boot['resamples']} resamples, seed {boot['seed']}, percentile)")
    lines.append("")
    lines.append("confusion matrix: rows human, columns judge")
    lines.append("         " + "".join(f"{label:>6}" for label in LABELS))
    for label, row in zip(LABELS, result["confusion_matrix"], strict=True):
        lines.append(f"human {label:<3}" + "".join(f"{count:>6}" for count in row))
    lines.extend(f"note: {note}" for note in result["notes"])
    lines.extend(format_confidence_agreement(result.get("confidence")))
    lines.extend(_format_floor(result))
    lines.extend(format_calibration(result))
    return "\n".join(lines)


def format_calibration(result: dict[str, Any], *, title: str = "mean human score") -> list[str]:
    """agree's calibrated estimates: the three means (and pass rates), the sentence, the
    assumption and the label plan."""
    from grader.analysis.calibration import Calibrated, Estimate, format_calibrated

    if "calibrated" not in result:
        return []

    def pair(interval: list[float] | None) -> tuple[float, float] | None:
        return None if interval is None else (interval[0], interval[1])

    def typed(value: CalibratedJSON) -> Calibrated:
        def estimate(part: EstimateJSON) -> Estimate:
            return Estimate(part["mean"], pair(part["interval"]))

        return Calibrated(value["mean"], pair(value["interval"]),
                          estimate(value["judge_only"]), estimate(value["human_only"]),
                          value["correlation"], value["lambda"], value["effective_labels"],
                          value["labeled"], value["unlabeled"], value["fallback"],
                          result["calibration"]["confidence"], value["correlation_rows"])

    if not result["calibrated"]["labeled"] + result["calibrated"]["unlabeled"]:
        return ["", "calibrated: no row has a judge score 0-5: nothing to estimate"]
    lines = [""]
    lines += format_calibrated(typed(result["calibrated"]), title=title)
    if "calibrated_pass_rate" in result:
        lines += format_calibrated(typed(result["calibrated_pass_rate"]),
                                   title=f"share a human scores >= {result['pass_at']:g}")
    calibration = result["calibration"]
    lines += [f"calibrated: {sentence}" for sentence in calibration["sentences"]]
    if calibration["assumption"]:
        lines.append(f"calibrated: {calibration['assumption']} (labels from a column, "
                     "no recorded sampling)")
    plan = result.get("label_plan")
    if plan is not None:
        pct = f"{round(plan['confidence'] * 100, 1):g}%"
        need = "more than the rows" if plan["labels"] is None else f"about {plan['labels']} labels"
        alone = ("more than the rows" if plan["labels_alone"] is None
                 else f"{plan['labels_alone']} labels alone")
        lines.append(f"plan: a {pct} interval of +/- {plan['half_width']:g} needs {need} "
                     f"with this judge ({alone}), of {plan['rows']} rows; from a pilot of "
                     f"{plan['pilot']} labels")
    return lines


def _format_floor(result: dict[str, Any]) -> list[str]:
    """The judge and the word-overlap floor side by side, and the conclusion."""
    floor = result.get("floor")
    lines = [""]
    if floor is None:
        if result["n"]:
            lines.append("floor to beat: not computed: the answers are not known (pass --data)")
            return lines
        return []
    sources = ", ".join(f"{name} {count}" for name, count in floor["items_from"].items() if count)
    lines.append(f"floor to beat: {floor['method']}")
    lines.append(f"  items from: {sources}; answers from: {floor.get('answers_from')}")
    lines.append(f"{'statistic':<30}{'judge':>8}   {'':<17}{'floor':>8}")
    for name in STATISTICS:
        lines.append(f"{_NAMES[name]:<30}{format_number(result[name]):>8}   "
                     f"{format_interval(result['intervals'][name]):<17}"
                     f"{format_number(floor[name]):>8}   "
                     f"{format_interval(floor['intervals'][name])}")
    difference = floor["kappa_difference"]
    lines.append(f"{'kappa judge - floor':<30}{format_number(difference['value']):>8}   "
                 f"{format_interval(difference['interval'])}")
    lines.append(f"conclusion: {floor['conclusion']}")
    return lines
