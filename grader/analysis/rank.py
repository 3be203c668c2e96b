"""Rank N models graded on the same rows: per-row outcomes, a Bradley-Terry fit, bootstrap
intervals over rows, win rates, and an optional length control (issue 30).

The core takes games: per-row pairwise outcomes (:class:`Game`) between named models. They
come from N results files of absolute scores (:func:`outcomes_from_scores`: on each row, each
pair of models that both have a score plays one game, the higher score winning, equal scores
a tie) or from pairwise records (:func:`outcomes_from_pairwise`: one game a record). A tie is
half a win each way, in the fit and in the win rate, as FastChat's llm_judge and Arena-Hard
count them.

The fit (:func:`fit_bradley_terry`) is Arena-Hard's (lmarena/arena-hard-auto,
``show_result.py``, and FastChat's ``elo_analysis.py``): a logistic regression of each game's
outcome on the two models' strengths, the ratings put on the Elo scale (400 / ln 10 per unit
of log-odds, centred on 1000 for the mean model). Intervals are percentile bootstrap
intervals over rows (a row's games stay together), seeded. ``length_controlled`` adds one
regressor, as AlpacaEval's length-controlled win rate does: ``tanh(length difference / its
standard deviation)``; the ratings are then the strengths with the length term at 0, i.e. as
if both answers were of the same length.

numpy only (imported at the top, as the other analyses): the fit is a few Newton steps.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from grader.errors import GraderError
from grader.records import Record

SCALE = 400 / math.log(10)  # Elo points per unit of log-odds (Arena-Hard's SCALE=400, BASE=10)
INIT = 1000.0  # the mean model's rating
# A small L2 penalty on the parameters keeps the fit finite when a model wins or loses every
# game (perfect separation), where the unpenalised maximum is at infinity; it moves the ratings
# of a non-separated fit by well under a point.
RIDGE = 1e-3
POINTS = {"A": 1.0, "tie": 0.5, "B": 0.0}
NAMED = 10  # rows named in a message or a note; the rest are counted


class RankError(GraderError, ValueError):
    """Inputs that cannot be ranked: files over different rows or formats, two files of one
    model name, fewer than two models, pairwise records without model names."""


@dataclass(frozen=True)
class Game:
    """One per-row outcome: ``a`` against ``b`` on row ``row``; ``points`` is a's: 1 a win,
    0.5 a tie, 0 a loss. ``length_a``/``length_b``: the answers' lengths in characters, where
    known (for ``length_controlled``)."""

    row: Any
    a: str
    b: str
    points: float
    length_a: int | None = None
    length_b: int | None = None


def shorten(rows: Sequence[Any], limit: int = NAMED) -> str:
    """The first ``limit`` row ids, and how many more."""
    shown = ", ".join(str(r) for r in rows[:limit])
    return shown + (f" and {len(rows) - limit} more" if len(rows) > limit else "")


def outcomes_from_scores(
    scores: Mapping[str, Mapping[Any, float | None]],
    lengths: Mapping[str, Mapping[Any, int | None]] | None = None,
) -> list[Game]:
    """Games from absolute scores: ``scores[model][row]`` (None: the row has no score in that
    model's file). On each row, each pair of models that both have a score plays one game."""
    models = list(scores)
    rows = list(dict.fromkeys(row for model in models for row in scores[model]))
    games = []
    for row in rows:
        for i, a in enumerate(models):
            for b in models[i + 1:]:
                score_a, score_b = scores[a].get(row), scores[b].get(row)
                if score_a is None or score_b is None:
                    continue
                points = 1.0 if score_a > score_b else 0.0 if score_a < score_b else 0.5
                length_a = lengths[a].get(row) if lengths else None
                length_b = lengths[b].get(row) if lengths else None
                games.append(Game(row, a, b, points, length_a, length_b))
    return games


def outcomes_from_pairwise(
    records: Iterable[Any],
    lengths: Mapping[Any, tuple[int | None, int | None]] | None = None,
) -> tuple[list[Game], dict[Any, str]]:
    """Games from pairwise records (``--format pairwise``,
    :class:`grader.records.PairwiseRecord`): one game a record, ``model_a`` against
    ``model_b``, ``winner`` ``"A"``, ``"B"`` or ``"tie"`` (the two orders already reconciled,
    as FastChat does). Records are anything with ``.id`` and ``.field(name)``. ``lengths``: by
    row id, the lengths of ``output_a`` and ``output_b`` (for the length control), where known.

    Returns the games and the records that are no game, by id, with why (no winner: a game
    the judge could not judge; the status says which). A record without ``model_a`` or
    ``model_b`` is a :class:`RankError`: which models played is not known.
    """
    games, unusable = [], {}
    for record in records:
        model_a, model_b = record.field("model_a"), record.field("model_b")
        if not isinstance(model_a, str) or not isinstance(model_b, str) or model_a == model_b:
            raise RankError(
                f"pairwise record {record.id!r} does not name two models (model_a, model_b): "
                "grade with --pair A.jsonl B.jsonl, which names them by file")
        winner = record.field("winner")
        if winner not in POINTS:
            unusable[record.id] = f"no winner (status {record.field('status')})"
            continue
        length_a, length_b = (lengths or {}).get(_key(record.id), (None, None))
        games.append(Game(record.id, model_a, model_b, POINTS[winner], length_a, length_b))
    return games, unusable


# ---------------------------------------------------------------- the fit


@dataclass(frozen=True)
class _Design:
    """The games as arrays: model indices, a's points, the length regressor, and each game's
    row index (the unit the bootstrap resamples)."""

    a: np.ndarray
    b: np.ndarray
    y: np.ndarray
    x: np.ndarray | None
    row: np.ndarray
    rows: int
    models: int
    # Without the length term a fit needs only each pair's games and points: one line a pair
    # (pairs x models: +1 in a's column, -1 in b's), and per row each pair's points and games
    # (rows x pairs), so a resample is two products and a fit on the pairs, not on every game.
    pairs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def _design(games: Sequence[Game], models: Sequence[str], length_controlled: bool) -> _Design:
    index = {m: i for i, m in enumerate(models)}
    row_index: dict[Any, int] = {}
    rows = np.array([row_index.setdefault(_key(g.row), len(row_index)) for g in games], dtype=int)
    x = None
    if length_controlled:
        diff = np.array([float(g.length_a) - float(g.length_b)  # type: ignore[arg-type]
                         for g in games])
        scale = float(np.std(diff)) if diff.size else 0.0
        # AlpacaEval's length feature: tanh of the difference over its standard deviation
        x = np.tanh(diff / scale) if scale > 0 else np.zeros_like(diff)
    a = np.array([index[g.a] for g in games], dtype=int)
    b = np.array([index[g.b] for g in games], dtype=int)
    y = np.array([g.points for g in games], dtype=float)
    pairs = None
    if x is None:
        lines, line = np.unique(a * len(models) + b, return_inverse=True)
        pair_matrix = np.zeros((lines.size, len(models)))
        pair_matrix[np.arange(lines.size), lines // len(models)] = 1.0
        pair_matrix[np.arange(lines.size), lines % len(models)] = -1.0
        points = np.zeros((len(row_index), lines.size))
        played = np.zeros((len(row_index), lines.size))
        np.add.at(points, (rows, line), y)
        np.add.at(played, (rows, line), 1.0)
        pairs = (pair_matrix, points, played)
    return _Design(a, b, y, x, rows, len(row_index), len(models), pairs)


def _key(value: Any) -> Any:
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else repr(value)


def _fit(design: _Design, weights: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """Strengths (log-odds, mean 0) and, with length control, the length coefficient last:
    the penalised maximum-likelihood fit of ``weights``-weighted games, by Newton's method
    with step halving (the loss is convex; a handful of steps, each a small linear solve)."""
    params = np.zeros(design.models + (design.x is not None)) if start is None else start.copy()
    if design.pairs is not None:  # the same loss, summed per pair: y a pair's share of points
        pair_matrix, points, played = design.pairs
        games = weights @ played
        keep = games > 0
        params = _newton(_Dense(pair_matrix[keep], (weights @ points)[keep] / games[keep],
                                games[keep]), params)
    else:
        assert design.x is not None
        params = _newton(_PerGame(design.a, design.b, design.x, design.y, weights[design.row],
                                  design.models), params)
    models = design.models
    params[:models] -= params[:models].mean()
    return params


@dataclass(frozen=True)
class _Dense:
    """The weighted logistic loss of lines ``matrix @ params`` (a pair's line: +1, -1), its
    gradient and Hessian, for a handful of lines."""

    matrix: np.ndarray
    y: np.ndarray
    w: np.ndarray

    def loss(self, params: np.ndarray) -> float:
        z = self.matrix @ params
        # -[y log s(z) + (1 - y) log s(-z)] = log(1 + e^z) - y z
        return float(self.w @ (np.logaddexp(0.0, z) - self.y * z))

    def derivatives(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = _logistic(self.matrix @ params)
        h = self.w * p * (1 - p)
        return self.matrix.T @ (self.w * (p - self.y)), (self.matrix * h[:, None]).T @ self.matrix


@dataclass(frozen=True)
class _PerGame:
    """The same loss with the length term, one line a game (``theta[a] - theta[b] + beta x``):
    its gradient and Hessian summed by model index (bincount), never a games x models matrix."""

    a: np.ndarray
    b: np.ndarray
    x: np.ndarray
    y: np.ndarray
    w: np.ndarray
    k: int

    def z(self, params: np.ndarray) -> np.ndarray:
        z: np.ndarray = params[self.a] - params[self.b] + params[self.k] * self.x
        return z

    def loss(self, params: np.ndarray) -> float:
        z = self.z(params)
        return float(self.w @ (np.logaddexp(0.0, z) - self.y * z))

    def derivatives(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k, a, b = self.k, self.a, self.b
        p = _logistic(self.z(params))
        r, h = self.w * (p - self.y), self.w * p * (1 - p)
        grad = np.empty(k + 1)
        grad[:k] = np.bincount(a, r, k) - np.bincount(b, r, k)
        grad[k] = r @ self.x
        hessian = np.zeros((k + 1, k + 1))
        cross = np.bincount(a * k + b, h, k * k).reshape(k, k)
        hessian[:k, :k] = np.diag(np.bincount(a, h, k) + np.bincount(b, h, k)) - cross - cross.T
        hessian[:k, k] = hessian[k, :k] = np.bincount(a, h * self.x, k) - np.bincount(b, h * self.x, k)
        hessian[k, k] = h @ (self.x * self.x)
        return grad, hessian


def _logistic(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(z / 2))  # without overflow


def _newton(objective: _Dense | _PerGame, params: np.ndarray) -> np.ndarray:
    """The minimum of ``objective`` plus the ridge: Newton's method with step halving."""

    def loss(values: np.ndarray) -> float:
        return objective.loss(values) + RIDGE * float(values @ values) / 2

    ridge = RIDGE * np.eye(params.size)
    current = loss(params)
    for _ in range(100):
        grad, hessian = objective.derivatives(params)
        step = np.linalg.solve(hessian + ridge, grad + RIDGE * params)
        size = 1.0
        while size > 1e-10:
            trial = loss(params - size * step)
            if trial <= current:
                break
            size /= 2
        params = params - size * step
        current = min(current, trial)
        if float(np.max(np.abs(size * step))) < 1e-10:
            break
    return params


def fit_bradley_terry(
    games: Sequence[Game],
    models: Sequence[str],
    *,
    rounds: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    length_controlled: bool = False,
) -> dict[str, Any]:
    """Bradley-Terry ratings of ``models`` from ``games``, with bootstrap intervals over rows.

    Returns ``ratings`` (Elo scale, by model), ``intervals`` ({model: [low, high]}), ``ranks``
    ({model: [best, worst]}: the 95 % interval of its place over the resamples), and with
    ``length_controlled`` the fitted ``length_coefficient`` (log-odds per unit of the tanh
    feature) with its interval.
    """
    design = _design(games, models, length_controlled)
    k = len(models)
    point = _fit(design, np.ones(design.rows))
    out: dict[str, Any] = {"ratings": {m: INIT + SCALE * float(point[i]) for i, m in enumerate(models)}}
    tail = (1 - confidence) / 2
    if rounds and design.rows:
        rng = np.random.default_rng(seed)
        draws = rng.multinomial(design.rows, np.full(design.rows, 1 / design.rows), size=rounds)
        # each resample starts from the point estimate: the same optimum, fewer steps
        fits = np.array([_fit(design, draw.astype(float), point) for draw in draws])
        ratings = INIT + SCALE * fits[:, :k]
        low, high = np.quantile(ratings, [tail, 1 - tail], axis=0)
        out["intervals"] = {m: [float(low[i]), float(high[i])] for i, m in enumerate(models)}
        # a model's place in each resample (1 = best); its interval
        places = (-ratings).argsort(axis=1).argsort(axis=1) + 1
        best, worst = np.quantile(places, [tail, 1 - tail], axis=0, method="nearest")
        out["ranks"] = {m: [int(best[i]), int(worst[i])] for i, m in enumerate(models)}
        if length_controlled:
            coef = np.quantile(fits[:, k], [tail, 1 - tail])
            out["length_interval"] = [float(coef[0]), float(coef[1])]
    else:
        out["intervals"] = {m: None for m in models}
        out["ranks"] = {m: None for m in models}
    if length_controlled:
        out["length_coefficient"] = float(point[k])
    # the win rate the fit predicts against each other model, with the length term at 0
    theta = point[:k]
    predicted = 1 / (1 + np.exp(-(theta[:, None] - theta[None, :])))
    out["predicted_win_rate"] = {
        m: float((predicted[i].sum() - 0.5) / (k - 1)) if k > 1 else None
        for i, m in enumerate(models)}
    return out


# ---------------------------------------------------------------- counts


def tally(games: Sequence[Game], models: Sequence[str]) -> dict[str, Any]:
    """Win/tie/loss counts of each model (over all its games) and of each pair, and the win
    rate with ties as half: (wins + ties / 2) / games."""
    per_model = {m: Counter({"wins": 0, "ties": 0, "losses": 0}) for m in models}
    pairs: dict[tuple[str, str], Counter[str]] = {}
    order = {m: i for i, m in enumerate(models)}
    for g in games:
        a, b, points = (g.a, g.b, g.points) if order[g.a] < order[g.b] else (g.b, g.a, 1 - g.points)
        pair = pairs.setdefault((a, b), Counter({"wins_a": 0, "ties": 0, "wins_b": 0}))
        if points == 1:
            per_model[a]["wins"] += 1
            per_model[b]["losses"] += 1
            pair["wins_a"] += 1
        elif points == 0:
            per_model[a]["losses"] += 1
            per_model[b]["wins"] += 1
            pair["wins_b"] += 1
        else:
            per_model[a]["ties"] += 1
            per_model[b]["ties"] += 1
            pair["ties"] += 1
    counts = {}
    for m, c in per_model.items():
        total = c["wins"] + c["ties"] + c["losses"]
        counts[m] = {**c, "games": total,
                     "win_rate": (c["wins"] + c["ties"] / 2) / total if total else None}
    return {"models": counts,
            "pairs": [{"a": a, "b": b, **c, "games": sum(c.values())} for (a, b), c in pairs.items()]}


def rank_games(
    games: Sequence[Game],
    models: Sequence[str],
    *,
    rounds: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    length_controlled: bool = False,
) -> dict[str, Any]:
    """The leaderboard of ``models`` from ``games``: one entry a model, best first (by the
    length-controlled rating with ``length_controlled``), each with its rating, interval, place
    interval, win rate and counts; the uncorrected figures beside the controlled ones."""
    if len(models) < 2:
        raise RankError(f"ranking needs at least 2 models, got {len(models)}")
    if rounds < 0:
        raise RankError(f"--rounds must be 0 or more, got {rounds}")
    if not 0 < confidence < 1:
        raise RankError(f"confidence must be between 0 and 1, got {confidence}")
    counted = tally(games, models)
    plain = fit_bradley_terry(games, models, rounds=rounds, seed=seed, confidence=confidence)
    controlled = (fit_bradley_terry(games, models, rounds=rounds, seed=seed,
                                    confidence=confidence, length_controlled=True)
                  if length_controlled else None)
    board = []
    for m in models:
        entry: dict[str, Any] = {
            "model": m,
            "rating": plain["ratings"][m],
            "interval": plain["intervals"][m],
            "place": plain["ranks"][m],
            "predicted_win_rate": plain["predicted_win_rate"][m],
            **counted["models"][m],
        }
        if controlled is not None:
            entry["lc_rating"] = controlled["ratings"][m]
            entry["lc_interval"] = controlled["intervals"][m]
            entry["lc_place"] = controlled["ranks"][m]
            entry["lc_win_rate"] = controlled["predicted_win_rate"][m]
        board.append(entry)
    key = "lc_rating" if controlled is not None else "rating"
    board.sort(key=lambda e: -e[key])
    result: dict[str, Any] = {
        "leaderboard": board,
        "pairs": counted["pairs"],
        "games": len(games),
        "bootstrap": {"rounds": rounds, "seed": seed, "confidence": confidence,
                      "method": "percentile, rows resampled with replacement (a row's games together)"},
        "fit": {"model": "Bradley-Terry (logistic regression), ties as half a win each way",
                "scale": "Elo: 400 per factor of 10 in odds, the mean model at 1000",
                "ridge": RIDGE},
        "length_controlled": controlled is not None,
    }
    if controlled is not None:
        result["length"] = {
            "feature": "tanh((length_a - length_b) / sd), lengths in characters",
            "coefficient": controlled["length_coefficient"],
            "interval": controlled.get("length_interval"),
        }
    return result


# ---------------------------------------------------------------- results files


def _value(record: Any) -> float | None:
    """A record's score (or score_model result) as a number, None without one."""
    value = record.value if record.value is not None else record.field("score")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _length(record: Any, texts: Mapping[Any, Any] | None) -> int | None:
    text = record.field("output_text")
    if not isinstance(text, str) and texts is not None:
        text = texts.get(_key(record.id))
    return len(text) if isinstance(text, str) else None


def _answers(results: Path, given: str | None, mapping: Mapping[str, str] | None,
             id_column: str | None, fields: Sequence[str]) -> dict[Any, tuple[Any, ...]] | None:
    """By row id, the ``fields`` of the answers ``results`` graded: from ``given`` (--data),
    else from the dataset its run recorded; None when neither is there. A recorded dataset
    that no longer reads with these settings is passed over (the caller says what is missing);
    a --data file that does not read is the user's error."""
    from grader.io.dataset import DatasetError, read_items
    from grader.io.results import recorded_data

    path = given if given is not None else recorded_data(results)
    if path is None:
        return None
    try:
        items = read_items(path, mapping=mapping, id_column=id_column)
    except DatasetError:
        if given is not None:
            raise
        return None
    return {_key(item.id): tuple(item.fields.get(f) for f in fields) for item in items}


def _model_names(paths: Sequence[Path], names: Sequence[str]) -> list[str]:
    if names and len(names) != len(paths):
        raise RankError(f"--name is given {len(names)} times for {len(paths)} results files: "
                        "give it once per file, in the same order, or not at all")
    chosen = list(names) if names else [p.stem for p in paths]
    seen: dict[str, Path] = {}
    for name, path in zip(chosen, paths, strict=True):
        if name in seen:
            raise RankError(f"{seen[name]} and {path} have the same model name {name!r}: "
                            "name each with --name")
        seen[name] = path
    return chosen


def _check_rows(files: dict[str, tuple[Path, list[tuple[int, Record]]]]) -> None:
    """Every file holds the same row ids; else one line naming the files, the rows they
    share, and the rows only one holds."""
    keys = {name: {_key(r.id) for _, r in records} for name, (_, records) in files.items()}
    names = list(files)
    first = names[0]
    for other in names[1:]:
        if keys[other] != keys[first]:
            shared = len(keys[first] & keys[other])
            only_first = sorted(keys[first] - keys[other], key=str)
            only_other = sorted(keys[other] - keys[first], key=str)
            parts = []
            if only_first:
                parts.append(f"{len(only_first)} only in {files[first][0]} ({shorten(only_first)})")
            if only_other:
                parts.append(f"{len(only_other)} only in {files[other][0]} ({shorten(only_other)})")
            raise RankError(
                f"{files[first][0]} and {files[other][0]} are over different rows: they share "
                f"{shared}; " + "; ".join(parts))


def _check_formats(files: dict[str, tuple[Path, list[tuple[int, Record]]]]) -> None:
    kinds = {name: sorted({str(r.kind) for _, r in records if r.kind}) for name, (_, records)
             in files.items()}
    seen = {tuple(k) for k in kinds.values() if k}
    if len(seen) > 1:
        described = ", ".join(f"{files[n][0]}: {'/'.join(k) or 'unknown'}" for n, k in kinds.items())
        raise RankError(f"the results files hold different formats ({described}): their scores "
                        "are not one measure")


def rank(
    results: Sequence[str | Path],
    *,
    names: Sequence[str] = (),
    data: Sequence[str] = (),
    mapping: Mapping[str, str] | None = None,
    id_column: str | None = None,
    rounds: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    length_controlled: bool = False,
) -> dict[str, Any]:
    """Rank the models of ``results`` (one results file a model, graded on the same rows; or
    pairwise results files, whose records name their models).

    Args:
        names: one model name a file, in order (default: each file's name without suffix).
        data: with ``length_controlled``, the answers each file graded (one a file, in order),
            for answer lengths, where the records do not hold ``output_text`` (pairwise:
            ``output_a`` and ``output_b``); without it, the dataset each run recorded in its
            summary (``run.data``), where that file is still there.

    Returns the leaderboard of :func:`rank_games` and ``files``, ``rows`` (how many, how many
    every model scored, and ``incomplete``: each row some model has no score for, with the
    statuses it has there), ``notes``.
    """
    from grader.analysis.agreement import load_records

    paths = [Path(p) for p in results]
    loaded = [load_records(p) for p in paths]
    for path, records in zip(paths, loaded, strict=True):
        if not records:
            raise RankError(f"{path}: no records: a results file of no row has no model to rank")
    if data and len(data) != len(paths):
        raise RankError(f"--data is given {len(data)} times for {len(paths)} results files: "
                        "give it once per file, in the same order")
    given: list[str | None] = list(data) if data else [None] * len(paths)
    if loaded and all(records and all(r.kind == "pairwise" for _, r in records) for records in loaded):
        if names:
            raise RankError("--name does not apply to pairwise results: their records name "
                            "the models (model_a, model_b)")
        answers = ([_answers(p, g, mapping, id_column, ("output_a", "output_b"))
                    for p, g in zip(paths, given, strict=True)] if length_controlled else None)
        return _rank_pairwise(paths, loaded, answers, rounds=rounds, seed=seed,
                              confidence=confidence, length_controlled=length_controlled)
    if len(paths) < 2:
        raise RankError(f"rank needs at least 2 results files (one a model), got {len(paths)}")
    models = _model_names(paths, names)
    files = {m: (p, records) for m, p, records in zip(models, paths, loaded, strict=True)}
    _check_rows(files)
    _check_formats(files)
    texts = [_texts(p, records, g, mapping, id_column) if g is not None or length_controlled
             else None for p, records, g in zip(paths, loaded, given, strict=True)]
    scores, lengths, statuses = {}, {}, {}
    for (m, (_, records)), known in zip(files.items(), texts, strict=True):
        scores[m] = {_key(r.id): _value(r) for _, r in records}
        lengths[m] = {_key(r.id): _length(r, known) for _, r in records}
        statuses[m] = {_key(r.id): str(r.status) for _, r in records}
    if length_controlled:
        for m, (path, _) in files.items():
            missing = [row for row, n in lengths[m].items() if n is None and scores[m][row] is not None]
            if missing:
                raise _no_lengths(path, missing, "output_text")
    games = outcomes_from_scores(scores, lengths)
    result = rank_games(games, models, rounds=rounds, seed=seed, confidence=confidence,
                        length_controlled=length_controlled)
    for entry in result["leaderboard"]:
        values = [v for v in scores[entry["model"]].values() if v is not None]
        entry["mean_score"] = sum(values) / len(values) if values else None
        entry["file"] = str(files[entry["model"]][0])
    incomplete = {row: {m: statuses[m][row] for m in models if scores[m][row] is None}
                  for row in scores[models[0]]
                  if any(scores[m][row] is None for m in models)}
    result["rows"] = {"total": len(scores[models[0]]),
                      "scored_by_every_file": len(scores[models[0]]) - len(incomplete),
                      "incomplete": incomplete}
    result["notes"] = _notes(result, incomplete)
    return result


def _texts(path: Path, records: list[tuple[int, Record]], given: str | None, mapping: Mapping[str, str] | None,
           id_column: str | None) -> dict[Any, Any] | None:
    """By row id, the answers of a results file whose records do not hold ``output_text``."""
    if given is None and all(isinstance(r.field("output_text"), str) for _, r in records):
        return None
    answers = _answers(path, given, mapping, id_column, ("output_text",))
    return None if answers is None else {row: texts[0] for row, texts in answers.items()}


def _no_lengths(path: Path, missing: list[Any], fields: str) -> RankError:
    return RankError(
        f"{path}: --length-controlled needs each answer's length: {len(missing)} rows have no "
        f"{fields} ({shorten(missing)}) in the records or in the dataset their run recorded: "
        "pass the answers with --data, once per results file")


def _pair_lengths(path: Path, records: list[tuple[int, Record]], answers: dict[Any, tuple[Any, ...]] | None
                  ) -> dict[Any, tuple[int | None, int | None]]:
    """By row id, the lengths of a pairwise file's two answers; a row with a winner and
    without both is refused."""
    lengths: dict[Any, tuple[int | None, int | None]] = {}
    missing = []
    for _, record in records:
        texts = (answers or {}).get(_key(record.id), (None, None))
        pair = tuple(len(t) if isinstance(t, str) else None for t in texts)
        lengths[_key(record.id)] = (pair[0], pair[1])
        if None in pair and record.field("winner") in POINTS:
            missing.append(record.id)
    if missing:
        raise _no_lengths(path, missing, "output_a and output_b")
    return lengths


def _rank_pairwise(paths: list[Path], loaded: list[list[tuple[int, Record]]],
                   answers: list[dict[Any, tuple[Any, ...]] | None] | None,
                   **settings: Any) -> dict[str, Any]:
    """Pairwise results files: their records' games, one file after another (a row id may
    be in several files: one question, another pair of models); with ``answers`` (the
    length control) each game with its answers' lengths."""
    games: list[Game] = []
    unusable: dict[Any, str] = {}
    for i, (path, rows) in enumerate(zip(paths, loaded, strict=True)):
        lengths = _pair_lengths(path, rows, answers[i]) if answers is not None else None
        found, failed = outcomes_from_pairwise((r for _, r in rows), lengths)
        games += found
        unusable |= {(f"{path.name}:{k}" if len(paths) > 1 else str(k)): v for k, v in failed.items()}
    models = list(dict.fromkeys(m for g in games for m in (g.a, g.b)))
    if len(models) < 2:
        raise RankError(f"{', '.join(map(str, paths))}: the pairwise records' games name "
                        f"{len(models)} model(s): ranking needs at least 2")
    result = rank_games(games, models, **settings)
    result["rows"] = {"total": sum(len(rows) for rows in loaded), "games": len(games),
                      "incomplete": unusable}
    result["source"] = "pairwise"
    result["notes"] = _notes(result, unusable)
    return result


def _notes(result: dict[str, Any], incomplete: Mapping[Any, Any]) -> list[str]:
    notes = []
    if incomplete and result.get("source") == "pairwise":
        notes.append(f"{len(incomplete)} pairwise records have no winner (a game the judge could "
                     f"not judge): counted, no game: {shorten(list(incomplete))}")
    elif incomplete:
        notes.append(f"{len(incomplete)} rows are not scored by every file (failure statuses); "
                     f"their other pairs still play: {shorten(list(incomplete))}")
    if not result["games"]:
        notes.append("no game was played: no row has a score in two files")
    board = result["leaderboard"]
    key = "lc_interval" if result["length_controlled"] else "interval"
    for upper, lower in zip(board, board[1:], strict=False):
        if upper[key] and lower[key] and lower[key][1] >= upper[key][0]:
            notes.append(f"{upper['model']} and {lower['model']}: their intervals overlap, "
                         "the order between them is not established")
    return notes


# ---------------------------------------------------------------- the terminal


def _interval(interval: list[float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.0f}, {interval[1]:.0f}]"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_rank(result: dict[str, Any]) -> str:
    """The leaderboard printed by ``grader rank``."""
    lc = result["length_controlled"]
    pct = f"{round(result['bootstrap']['confidence'] * 100, 1):g}%"
    head = f"{'#':<3}{'model':<20}{'rating':>8}  {pct + ' interval':<14}{'win rate':>9}  {'W / T / L':<15}"
    if lc:
        head = (f"{'#':<3}{'model':<20}{'LC rating':>9}  {pct + ' interval':<14}{'LC win':>7}"
                f"{'rating':>8}  {pct + ' interval':<14}{'win rate':>9}  {'W / T / L':<15}")
    lines = [head + ("mean score" if "mean_score" in (result["leaderboard"] or [{}])[0] else "")]
    for place, e in enumerate(result["leaderboard"], start=1):
        wtl = f"{e['wins']} / {e['ties']} / {e['losses']}"
        plain = f"{e['rating']:>8.0f}  {_interval(e['interval']):<14}{_rate(e['win_rate']):>9}  {wtl:<15}"
        name = e["model"] if len(e["model"]) <= 19 else e["model"][:18] + "…"
        line = f"{place:<3}{name:<20}"
        if lc:
            line += f"{e['lc_rating']:>9.0f}  {_interval(e['lc_interval']):<14}{_rate(e['lc_win_rate']):>7}"
        line += plain
        if "mean_score" in e:
            line += "-" if e["mean_score"] is None else f"{e['mean_score']:.2f}"
        lines.append(line)
    rows = result["rows"]
    boot = result["bootstrap"]
    lines.append("")
    if "scored_by_every_file" in rows:
        lines.append(f"rows {rows['total']}, scored by every file {rows['scored_by_every_file']}, "
                     f"games {result['games']} (each pair of models on each row both scored)")
    else:
        lines.append(f"pairwise records {rows['total']}, games {rows['games']}")
    lines.append(f"Bradley-Terry, ties half a win each way; Elo scale, the mean model at 1000; "
                 f"bootstrap {boot['rounds']} rounds over rows, seed {boot['seed']}, percentile")
    lines.append("win rate: (wins + ties / 2) / games against every other model")
    if lc:
        length = result["length"]
        lines.append(f"LC: length-controlled (AlpacaEval-style): {length['feature']}; "
                     f"coefficient {length['coefficient']:.3f} {_coef(length['interval'])}; "
                     "LC win: the fit's win rate with equal lengths")
    lines.append("pairs (wins a / ties / wins b): " + "; ".join(
        f"{p['a']} - {p['b']} {p['wins_a']}/{p['ties']}/{p['wins_b']}" for p in result["pairs"]))
    for row, where in list(rows["incomplete"].items())[:NAMED]:
        if isinstance(where, Mapping):  # the models without a score on the row: their statuses
            where = ", ".join(f"{model} {status}" for model, status in where.items())
        lines.append(f"  {'no game' if 'games' in rows else 'not scored'}: {row}: {where}")
    if len(rows["incomplete"]) > NAMED:
        lines.append(f"  ... and {len(rows['incomplete']) - NAMED} more (--json lists every one)")
    lines.extend(f"note: {note}" for note in result["notes"])
    return "\n".join(lines)


def _coef(interval: list[float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"
