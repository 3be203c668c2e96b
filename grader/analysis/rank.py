"""Rank N models graded on the same rows: per-row outcomes, a Bradley-Terry fit, bootstrap
intervals over rows, win rates, and an optional length control.

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

At scale, without the length term the games are only ever counted, per row and
pair of models (:class:`PairTables`, made from the scores without a :class:`Game` each), the
fit reads their sums (a models x models solve a Newton step) and a bootstrap round is its row
weights times the tables, so 300 models at 1000 rounds take minutes, not hours.

With human labels on a random sample of rows, :func:`calibrated_bradley_terry` is
the prediction-powered (PPI++) fit of "AutoEval Done Right": the humans' Bradley-Terry
ratings, the judge's games on every row narrowing the interval, its bias cancelled.

numpy only (imported at the top, as the other analyses): the fit is a few Newton steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, Protocol, TypedDict

import numpy as np

from grader.analysis.agreement import format_interval, id_key, read_answers
from grader.errors import GraderError
from grader.records import Record, SeedRecord

SCALE = 400 / math.log(10)  # Elo points per unit of log-odds (Arena-Hard's SCALE=400, BASE=10)
INIT = 1000.0  # the mean model's rating
# A small L2 penalty on the parameters keeps the fit finite when a model wins or loses every
# game (perfect separation), where the unpenalised maximum is at infinity; it moves the ratings
# of a non-separated fit by well under a point.
RIDGE = 1e-3
POINTS = {"A": 1.0, "tie": 0.5, "B": 0.0}
NAMED = 10  # rows named in a message or a note; the rest are counted


Loaded = list[tuple[int, Record]]  # a results file's records with their line numbers
Answers = tuple[str, dict[Any, tuple[Any, ...]]]  # agreement.read_answers': a dataset's fields
# The JSON-ready values the ranking returns (``grader rank --json`` prints them as they are).
Interval = list[float]


class Bootstrap(TypedDict):
    rounds: int
    seed: int
    confidence: float
    method: str


class FitMethod(TypedDict):
    model: str
    scale: str
    ridge: float


class Length(TypedDict):
    feature: str
    coefficient: float
    interval: Interval | None


class Board(TypedDict):
    ratings: dict[str, float]
    intervals: dict[str, Interval]


class Rated(TypedDict):
    rating: float
    interval: Interval


class Calibrated(Rated):
    human_only: Rated


class Counts(TypedDict):
    wins: int
    ties: int
    losses: int
    games: int
    win_rate: float | None


class PairCount(TypedDict):
    a: str
    b: str
    wins_a: int
    ties: int
    wins_b: int
    games: int


class Tally(TypedDict):
    models: dict[str, Counts]
    pairs: list[PairCount]


class Rows(TypedDict, total=False):
    """``scored_by_every_file`` for results files of scores, ``games`` for pairwise ones."""

    total: int
    scored_by_every_file: int
    games: int
    incomplete: dict[Any, Any]


class Fit(TypedDict, total=False):
    """:func:`fit_bradley_terry`'s; the length's only with the length control."""

    ratings: dict[str, float]
    intervals: dict[str, Interval | None]
    ranks: dict[str, list[int] | None]
    predicted_win_rate: dict[str, float | None]
    length_coefficient: float
    length_interval: Interval


Calibration = TypedDict("Calibration", {  # calibrated_bradley_terry's ("lambda" is a keyword)
    "method": str, "assumption": str, "confidence": float, "labeled": int, "unlabeled": int,
    "partially_labeled": int, "available": bool, "reason": str | None,
    "ratings": dict[str, float], "intervals": dict[str, Interval], "human_only": Board,
    "correlation": float | None, "threshold": float, "lambda": float,
    "effective_labels": float, "fallback": str | None, "human_column": str,
    "human_source": list[str]}, total=False)


class Entry(TypedDict, total=False):
    """One model's line of the leaderboard: the fit's figures, the counts (:data:`Counts`),
    the length-controlled ones (``lc_``) and, from results files, the mean score and file."""

    model: str
    rating: float
    interval: Interval | None
    place: list[int] | None
    predicted_win_rate: float | None
    wins: int
    ties: int
    losses: int
    games: int
    win_rate: float | None
    lc_rating: float
    lc_interval: Interval | None
    lc_place: list[int] | None
    lc_win_rate: float | None
    mean_score: float | None
    file: str
    calibrated: Calibrated | None


class Ranking(TypedDict, total=False):
    """:func:`rank_games`'s and :func:`rank`'s result."""

    leaderboard: list[Entry]
    pairs: list[PairCount]
    games: int
    bootstrap: Bootstrap
    fit: FitMethod
    length_controlled: bool
    length: Length
    rows: Rows
    source: str
    notes: list[str]
    calibration: Calibration


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


def outcomes_from_scores(scores: Mapping[str, Mapping[Any, float | None]],
                         lengths: Mapping[str, Mapping[Any, int | None]] | None = None
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


def outcomes_from_pairwise(records: Iterable[Any],
                           lengths: Mapping[Any, tuple[int | None, int | None]] | None = None
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
        length_a, length_b = (lengths or {}).get(id_key(record.id), (None, None))
        games.append(Game(record.id, model_a, model_b, POINTS[winner], length_a, length_b))
    return games, unusable


# ---------------------------------------------------------------- the tables


@dataclass(frozen=True)
class PairTables:
    """The games per row and pair of models, all a Bradley-Terry fit needs without the
    length term: pair ``p`` is models ``first[p] < second[p]`` (indices), ``points[r, p]``
    first's points against second on row ``r`` and ``played[r, p]`` their games there (rows x
    pairs), ``ties[p]`` the pair's tied games over every row. The fit reads the tables summed
    over rows (one number a pair: the models x models win/tie table); a bootstrap round
    over rows is the same sum with the round's row weights, one matrix product for a block of
    rounds, so a round costs rows x pairs multiply-adds and a fit on the pairs, never a pass
    over games. float32: halves and counts up to 2^23, exact, at half the memory."""

    models: int
    first: np.ndarray
    second: np.ndarray
    points: np.ndarray
    played: np.ndarray
    ties: np.ndarray

    @property
    def rows(self) -> int:
        return int(self.points.shape[0])

    def totals(self) -> tuple[np.ndarray, np.ndarray]:
        """Each pair's points (first's) and games, summed over rows."""
        return self.points.sum(0, dtype=float), self.played.sum(0, dtype=float)


def _arrays(games: Sequence[Game], models: Sequence[str]
            ) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray]:
    """Each game's row index (rows by id, in order of appearance), the number of rows, the
    two models' indices and a's points."""
    index = {m: i for i, m in enumerate(models)}
    row_index: dict[Any, int] = {}
    rows = np.array([row_index.setdefault(id_key(g.row), len(row_index)) for g in games], dtype=int)
    a = np.array([index[g.a] for g in games], dtype=int)
    b = np.array([index[g.b] for g in games], dtype=int)
    return rows, len(row_index), a, b, np.array([g.points for g in games], dtype=float)


def tables_from_games(games: Sequence[Game], models: Sequence[str]) -> PairTables:
    """:class:`PairTables` of ``games`` (rows by id, in order of appearance)."""
    k = len(models)
    rows, n, a, b, y = _arrays(games, models)
    low, high = np.minimum(a, b), np.maximum(a, b)
    lines, line = np.unique(low * k + high, return_inverse=True)
    points = np.zeros((n, lines.size), dtype=np.float32)
    played = np.zeros((n, lines.size), dtype=np.float32)
    np.add.at(points, (rows, line), np.where(a < b, y, 1 - y))
    np.add.at(played, (rows, line), 1.0)
    ties = np.bincount(line, weights=(y == 0.5).astype(float), minlength=lines.size)
    return PairTables(k, lines // k, lines % k, points, played, ties)


def tables_from_scores(matrix: np.ndarray, *, every_pair: bool = False) -> PairTables:
    """:class:`PairTables` of absolute scores, ``matrix[model, row]`` (NaN: no score): on
    each row each pair of models that both have a score plays one game, the higher winning;
    the pairs that never play are left out (``every_pair``: kept, so that tables of several
    row sets share one pair order). No :class:`Game` is made: 300 models on 100 rows are 4.5
    million games."""
    k, n = matrix.shape
    first, second = np.triu_indices(k, 1)
    points = np.empty((n, first.size), dtype=np.float32)
    played = np.empty((n, first.size), dtype=np.float32)
    ties = np.empty(first.size)
    step = max(1, 2_000_000 // max(n, 1))  # pairs x rows compared a block at a time
    for start in range(0, first.size, step):
        block = slice(start, start + step)
        a, b = matrix[first[block]], matrix[second[block]]
        tied = a == b  # NaN compares unequal, and neither greater nor less
        points[:, block] = ((a > b) + 0.5 * tied).T
        played[:, block] = (~(np.isnan(a) | np.isnan(b))).T
        ties[block] = tied.sum(1)
    keep = np.full(first.size, True) if every_pair else played.sum(0) > 0
    return PairTables(k, first[keep], second[keep], points[:, keep], played[:, keep], ties[keep])


# ---------------------------------------------------------------- the fit


def _design(games: Sequence[Game], models: Sequence[str]) -> tuple[_PerGame, np.ndarray, int]:
    """The games as the length-controlled fit's lines, one a game, each of weight 1; each
    game's row index (the unit the bootstrap resamples) and the number of rows."""
    rows, n, a, b, y = _arrays(games, models)
    lengths = np.array([(g.length_a, g.length_b) for g in games], dtype=float).reshape(-1, 2)
    if np.isnan(lengths).any():  # None, a length not known, is NaN here
        raise RankError("the length control needs both answers' lengths in every game")
    diff = lengths[:, 0] - lengths[:, 1]
    scale = float(np.std(diff)) if diff.size else 0.0
    # AlpacaEval's length feature: tanh of the difference over its standard deviation
    x = np.tanh(diff / scale) if scale > 0 else np.zeros_like(diff)
    return _PerGame(a, b, x, y, np.ones(len(games)), len(models)), rows, n


def _fit_pairs(first: np.ndarray, second: np.ndarray, points: np.ndarray, games: np.ndarray,
               k: int, start: np.ndarray | None = None) -> np.ndarray:
    """Strengths (log-odds, mean 0) from each pair's points and games: the penalised
    maximum-likelihood fit of the games summed per pair (the loss is linear in the outcome,
    so a pair's games are one line weighted by their number)."""
    params: np.ndarray = np.zeros(k) if start is None else start.copy()
    keep = games != 0
    params = _newton(_Pairs(first[keep], second[keep], points[keep], games[keep], k), params)
    params -= params.mean()
    return params


def _fit_games(objective: _PerGame, start: np.ndarray | None = None) -> np.ndarray:
    """Strengths (log-odds, mean 0) and the length coefficient last: the penalised
    maximum-likelihood fit of ``objective``'s weighted games, one line a game."""
    params = np.zeros(objective.k + 1) if start is None else start.copy()
    params = _newton(objective, params)
    params[:objective.k] -= params[:objective.k].mean()
    return params


@dataclass(frozen=True)
class _Pairs:
    """The logistic loss of one line a pair of models, ``z = theta[first] - theta[second]``:
    ``w log(1 + e^z) - s z``, ``w`` the pair's games and ``s`` first's points (for the
    prediction-powered fit, any such weights); its gradient summed by model (bincount), its
    Hessian models x models, never a pairs x models matrix."""

    first: np.ndarray
    second: np.ndarray
    s: np.ndarray
    w: np.ndarray
    k: int

    def z(self, params: np.ndarray) -> np.ndarray:
        z: np.ndarray = params[self.first] - params[self.second]
        return z

    def loss(self, params: np.ndarray) -> float:
        z = self.z(params)
        # -[y log s(z) + (1 - y) log s(-z)] w = w log(1 + e^z) - w y z
        # elementwise and summed, not BLAS dot products: at 45,000 pairs OpenBLAS threads a
        # dot product, and on a busy machine its threads wait on each other (30 ms, not 0.1)
        return float((self.w * _softplus(z) - self.s * z).sum())

    def derivatives(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k, first, second = self.k, self.first, self.second
        p = _logistic(self.z(params))
        r, h = self.w * p - self.s, self.w * p * (1 - p)
        grad = np.bincount(first, r, k) - np.bincount(second, r, k)
        hessian = np.zeros((k, k))
        hessian[first, second] = -h  # each pair once: the (first, second) lines are unique
        hessian[second, first] = -h
        hessian[np.diag_indices(k)] = np.bincount(first, h, k) + np.bincount(second, h, k)
        return grad, hessian


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


def _softplus(z: np.ndarray) -> np.ndarray:
    """log(1 + e^z) without overflow; a third of np.logaddexp(0, z)'s time."""
    softplus: np.ndarray = np.maximum(z, 0.0) + np.log1p(np.exp(-np.abs(z)))
    return softplus


def _logistic(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1 + np.tanh(z / 2))  # without overflow


def _newton(objective: _Pairs | _PerGame, params: np.ndarray) -> np.ndarray:
    """The minimum of ``objective`` plus the ridge: Newton's method with step halving."""

    def loss(values: np.ndarray) -> float:
        return objective.loss(values) + RIDGE * float(values @ values) / 2

    ridge = RIDGE * np.eye(params.size)
    current = loss(params)
    for _ in range(100):
        grad, hessian = objective.derivatives(params)
        step = np.linalg.solve(hessian + ridge, grad + RIDGE * params)
        if float(np.max(np.abs(step))) < 1e-9:
            # converged: the full step, no line search (the loss no longer moves beyond its
            # rounding there, and halving on that noise cost up to 30 evaluations a fit)
            done: np.ndarray = params - step
            return done
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


class Progress(Protocol):
    """What a progress bar must do for the bootstrap (a tqdm bar does)."""

    def update(self, n: int = 1) -> Any: ...

    def close(self) -> Any: ...


# rounds refitted per matrix product: a block's tables are rounds x pairs floats
BLOCK = 64


def _bootstrap_pairs(tables: PairTables, draws: np.ndarray, point: np.ndarray,
                     progress: Progress | None) -> np.ndarray:
    """Each round's strengths: the tables summed with its row weights (a block of rounds one
    product), then the fit on the pairs, started from the point estimate (the same optimum,
    fewer steps)."""
    fits = np.empty((len(draws), tables.models))
    for start in range(0, len(draws), BLOCK):
        block = draws[start:start + BLOCK].astype(np.float32)
        points, games = (block @ tables.points).astype(float), (block @ tables.played).astype(float)
        for i in range(len(block)):
            fits[start + i] = _fit_pairs(tables.first, tables.second, points[i], games[i],
                                         tables.models, point)
        if progress is not None:
            progress.update(len(block))
    return fits


def _bootstrap_games(objective: _PerGame, row: np.ndarray, draws: np.ndarray, point: np.ndarray,
                     progress: Progress | None) -> np.ndarray:
    """Each round's strengths and length coefficient: each game weighted by its row's draws."""
    fits = np.empty((len(draws), objective.k + 1))
    for i, draw in enumerate(draws):
        fits[i] = _fit_games(replace(objective, w=draw.astype(float)[row]), point)
        if progress is not None and ((i + 1) % BLOCK == 0 or i + 1 == len(draws)):
            progress.update(i % BLOCK + 1)
    return fits


def _percentiles(fits: np.ndarray, models: Sequence[str], tail: float) -> Fit:
    k = len(models)
    ratings = INIT + SCALE * fits[:, :k]
    low, high = np.quantile(ratings, [tail, 1 - tail], axis=0)
    # a model's place in each resample (1 = best); its interval
    places = (-ratings).argsort(axis=1).argsort(axis=1) + 1
    best, worst = np.quantile(places, [tail, 1 - tail], axis=0, method="nearest")
    return {"intervals": {m: [float(low[i]), float(high[i])] for i, m in enumerate(models)},
            "ranks": {m: [int(best[i]), int(worst[i])] for i, m in enumerate(models)}}


def _predicted(theta: np.ndarray, models: Sequence[str]) -> dict[str, float | None]:
    """The win rate the fit predicts against each other model."""
    k = len(models)
    predicted = _logistic(theta[:, None] - theta[None, :])
    return {m: float((predicted[i].sum() - 0.5) / (k - 1)) if k > 1 else None
            for i, m in enumerate(models)}


def fit_bradley_terry(games: Sequence[Game] | PairTables, models: Sequence[str], *,
                      rounds: int = 1000, seed: int = 0, confidence: float = 0.95,
                      length_controlled: bool = False, progress: Progress | None = None) -> Fit:
    """Bradley-Terry ratings of ``models`` from ``games`` (or their :class:`PairTables`),
    with bootstrap intervals over rows (a row's games resampled together).

    Returns ``ratings`` (Elo scale, by model), ``intervals`` ({model: [low, high]}), ``ranks``
    ({model: [best, worst]}: the 95 % interval of its place over the resamples), and with
    ``length_controlled`` (games only) the fitted ``length_coefficient`` (log-odds per unit
    of the tanh feature) with its interval. ``progress`` is told of each block of rounds.
    """
    k = len(models)
    tail = (1 - confidence) / 2
    out: Fit = {}
    if length_controlled:
        assert not isinstance(games, PairTables), "the length control needs every game"
        objective, row, rows = _design(games, models)
        point = _fit_games(objective)
        out["length_coefficient"] = float(point[k])
    else:
        tables = games if isinstance(games, PairTables) else tables_from_games(games, models)
        point = _fit_pairs(tables.first, tables.second, *tables.totals(), k)
        rows = tables.rows
    out["ratings"] = {m: INIT + SCALE * float(point[i]) for i, m in enumerate(models)}
    if rounds and rows:
        rng = np.random.default_rng(seed)
        draws = rng.multinomial(rows, np.full(rows, 1 / rows), size=rounds)
        fits = (_bootstrap_games(objective, row, draws, point, progress) if length_controlled
                else _bootstrap_pairs(tables, draws, point, progress))
        out.update(_percentiles(fits, models, tail))
        if length_controlled:
            coef = np.quantile(fits[:, k], [tail, 1 - tail])
            out["length_interval"] = [float(coef[0]), float(coef[1])]
    else:
        out["intervals"] = {m: None for m in models}
        out["ranks"] = {m: None for m in models}
    # the win rate the fit predicts against each other model, with the length term at 0
    out["predicted_win_rate"] = _predicted(point[:k], models)
    return out


# ---------------------------------------------------------------- counts


def tally(games: Sequence[Game] | PairTables, models: Sequence[str]) -> Tally:
    """Win/tie/loss counts of each model (over all its games) and of each pair, and the win
    rate with ties as half: (wins + ties / 2) / games."""
    tables = games if isinstance(games, PairTables) else tables_from_games(games, models)
    points, played = tables.totals()
    # first's wins: its points less half its ties (halves and counts: exact in floats)
    wins_a = np.rint(points - tables.ties / 2).astype(int)
    ties = np.rint(tables.ties).astype(int)
    wins_b = np.rint(played).astype(int) - wins_a - ties
    k = len(models)
    wins = np.bincount(tables.first, wins_a, k) + np.bincount(tables.second, wins_b, k)
    losses = np.bincount(tables.first, wins_b, k) + np.bincount(tables.second, wins_a, k)
    tied = np.bincount(tables.first, ties, k) + np.bincount(tables.second, ties, k)
    counts: dict[str, Counts] = {}
    for i, m in enumerate(models):
        w, t, lost = int(wins[i]), int(tied[i]), int(losses[i])
        total = w + t + lost
        counts[m] = {"wins": w, "ties": t, "losses": lost, "games": total,
                     "win_rate": (w + t / 2) / total if total else None}
    return {"models": counts,
            "pairs": [{"a": models[i], "b": models[j], "wins_a": int(x), "ties": int(t),
                       "wins_b": int(y), "games": int(x + t + y)}
                      for i, j, x, t, y in zip(tables.first, tables.second, wins_a, ties, wins_b,
                                               strict=True)]}


def rank_games(games: Sequence[Game] | PairTables, models: Sequence[str], *, rounds: int = 1000,
               seed: int = 0, confidence: float = 0.95, length_controlled: bool = False,
               progress: Progress | None = None) -> Ranking:
    """The leaderboard of ``models`` from ``games`` (or their :class:`PairTables`, without
    the length control): one entry a model, best first (by the length-controlled rating with
    ``length_controlled``), each with its rating, interval, place interval, win rate and
    counts; the uncorrected figures beside the controlled ones. ``progress`` is told of each
    block of bootstrap rounds (``rounds``, twice with ``length_controlled``)."""
    if len(models) < 2:
        raise RankError(f"ranking needs at least 2 models, got {len(models)}")
    if rounds < 0:
        raise RankError(f"--rounds must be 0 or more, got {rounds}")
    if not 0 < confidence < 1:
        raise RankError(f"confidence must be between 0 and 1, got {confidence}")
    tables = games if isinstance(games, PairTables) else tables_from_games(games, models)
    counted = tally(tables, models)
    fit = partial(fit_bradley_terry, models=models, rounds=rounds, seed=seed,
                  confidence=confidence, progress=progress)
    plain = fit(tables)
    controlled = fit(games, length_controlled=True) if length_controlled else None
    board = []
    for m in models:
        counts = counted["models"][m]
        entry: Entry = {"model": m, "rating": plain["ratings"][m],
                        "interval": plain["intervals"][m], "place": plain["ranks"][m],
                        "predicted_win_rate": plain["predicted_win_rate"][m],
                        "wins": counts["wins"], "ties": counts["ties"], "losses": counts["losses"],
                        "games": counts["games"], "win_rate": counts["win_rate"]}
        if controlled is not None:
            entry["lc_rating"] = controlled["ratings"][m]
            entry["lc_interval"] = controlled["intervals"][m]
            entry["lc_place"] = controlled["ranks"][m]
            entry["lc_win_rate"] = controlled["predicted_win_rate"][m]
        board.append(entry)
    board.sort(key=lambda e: -e["lc_rating" if controlled is not None else "rating"])
    result: Ranking = {
        "leaderboard": board, "pairs": counted["pairs"],
        "games": int(sum(p["games"] for p in counted["pairs"])),
        "bootstrap": {"rounds": rounds, "seed": seed, "confidence": confidence,
                      "method": "percentile, rows resampled with replacement (a row's games together)"},
        "fit": {"model": "Bradley-Terry (logistic regression), ties as half a win each way",
                "scale": "Elo: 400 per factor of 10 in odds, the mean model at 1000",
                "ridge": RIDGE},
        "length_controlled": controlled is not None}
    if controlled is not None:
        result["length"] = {"feature": "tanh((length_a - length_b) / sd), lengths in characters",
                            "coefficient": controlled["length_coefficient"],
                            "interval": controlled.get("length_interval")}
    return result

# ---------------------------------------------------------------- calibrated

# Fewer labeled rows than this give no calibrated interval: the sandwich's covariances are
# then mostly noise.
MIN_LABELED = 10
ASSUMPTION = "the labeled rows are a random sample of the rows"


def _row_gradients(tables: PairTables, theta: np.ndarray) -> np.ndarray:
    """Rows x models: each row's gradient of its games' logistic loss at ``theta``."""
    p = _logistic(theta[tables.first] - theta[tables.second])
    residual = (tables.played * p - tables.points).T  # pairs x rows
    gradients = np.zeros((tables.models, tables.rows))
    np.add.at(gradients, tables.first, residual)
    np.add.at(gradients, tables.second, -residual)
    return gradients.T


def _covariance(x: np.ndarray) -> np.ndarray:
    """Columns' covariance (rows are draws), 0 for fewer than 2 rows."""
    if len(x) < 2:
        return np.zeros((x.shape[1], x.shape[1]))
    centred = x - x.mean(0)
    covariance: np.ndarray = centred.T @ centred / (len(x) - 1)
    return covariance


@dataclass(frozen=True)
class _Labeled:
    """The games of the labeled rows (human and judge) and of the other rows (judge), in
    one pair order; ``n`` labeled rows, ``unlabeled`` other rows."""

    human: PairTables
    judge: PairTables
    other: PairTables

    @property
    def n(self) -> int:
        return self.human.rows

    @property
    def unlabeled(self) -> int:
        return self.other.rows

    def fit(self, lam: float) -> np.ndarray:
        """The PPI++ point estimate for the weight ``lam``: the minimum of the labeled rows'
        human loss plus ``lam`` times (the unlabeled rows' judge loss, per row, less the
        labeled rows' judge loss, per row), scaled to n rows. The loss is linear in the
        outcomes, so the three sums of games and points per pair are all it needs."""
        n, big = self.n, max(self.unlabeled, 1)
        hp, hn = self.human.totals()
        jp, jn = self.judge.totals()
        up, un = self.other.totals()
        points = hp + lam * (n / big * up - jp)
        games = hn + lam * (n / big * un - jn)
        return _fit_pairs(self.human.first, self.human.second, points, games, self.human.models)

    def hessian(self, theta: np.ndarray) -> np.ndarray:
        """The pseudo-inverse of the human loss's Hessian per labeled row at ``theta`` (which
        pairs play on a row does not depend on who judged it). Pseudo: the ratings are only
        fixed up to a common shift, and the estimate is the one with mean 0."""
        _, games = self.human.totals()
        objective = _Pairs(self.human.first, self.human.second, np.zeros_like(games),
                           games / self.n, self.human.models)
        inverse: np.ndarray = np.linalg.pinv(objective.derivatives(theta)[1])
        return inverse

    def covariance(self, theta: np.ndarray, lam: float) -> np.ndarray:
        """The sandwich covariance of the PPI++ estimate (ppi_py's ``ppi_logistic_ci``):
        H^-1 (Cov(g - lam g_judge) + n/N Cov(lam g_unlabeled)) H^-1 / n."""
        inverse = self.hessian(theta)
        human, judge = _row_gradients(self.human, theta), _row_gradients(self.judge, theta)
        middle = _covariance(human - lam * judge)
        if self.unlabeled:
            middle = middle + self.n / self.unlabeled * _covariance(lam * _row_gradients(self.other, theta))
        covariance: np.ndarray = inverse @ middle @ inverse / self.n
        return covariance

    def tuned(self, theta: np.ndarray) -> float:
        """PPI++'s power-tuning weight (ppi_py's ``_calc_lam_glm``, overall mode): the one that
        minimises the trace of the estimate's covariance, clipped to [0, 1]."""
        inverse = self.hessian(theta)
        human, judge = _row_gradients(self.human, theta), _row_gradients(self.judge, theta)
        other = _row_gradients(self.other, theta)
        centred_h, centred_j = human - human.mean(0), judge - judge.mean(0)
        cross = (centred_h.T @ centred_j + centred_j.T @ centred_h) / self.n
        judged = _covariance(np.concatenate([judge, other]))
        denominator = 2 * (1 + self.n / self.unlabeled) * np.trace(inverse @ judged @ inverse)
        if denominator <= 0:
            return 0.0
        return float(np.clip(np.trace(inverse @ cross @ inverse) / denominator, 0.0, 1.0))

    def correlation(self) -> float | None:
        """Pearson's r of the human and the judge outcomes of the labeled rows' games that
        both played (None where either is constant)."""
        both = (self.human.played > 0) & (self.judge.played > 0)
        human, judge = self.human.points[both], self.judge.points[both]
        if human.size < 3 or human.std() == 0 or judge.std() == 0:
            return None
        return float(np.corrcoef(human, judge)[0, 1])


def _z(confidence: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(1 - (1 - confidence) / 2)


def calibrated_bradley_terry(judge: np.ndarray, human: np.ndarray, models: Sequence[str], *,
                             confidence: float = 0.95) -> Calibration:
    """The prediction-powered (PPI++) Bradley-Terry fit, as "AutoEval Done Right" (Boyeau et
    al. 2024) does it: ``judge[model, row]`` the judge's scores on every row, ``human[model,
    row]`` the human labels where given (NaN elsewhere). A row is labeled when every model
    has a label on it; those rows must be a random sample of the rows.

    The estimate minimises the labeled rows' human Bradley-Terry loss plus ``lambda`` times
    the rectifier (the unlabeled rows' judge loss less the labeled rows' judge loss, each per
    row; Angelopoulos, Duchi, Zrnic 2023), ``lambda`` tuned from the data (clipped to [0, 1]);
    it estimates the ratings the humans' games would give on all rows. Intervals: normal, from
    the sandwich covariance (as ppi_py's ``ppi_logistic_ci``). Beside it, the labels alone
    (``lambda`` 0) with their sandwich interval. When the judge's and the humans' games
    correlate no more than 1/sqrt(n - 2) (the finite-sample threshold below which PPI++ gains
    nothing), the calibrated estimate is the labels-only one and ``fallback`` says why.

    Returns ``available`` (False with ``reason`` below ``MIN_LABELED`` labeled rows),
    ``ratings``/``intervals`` (Elo scale, by model), ``human_only`` (the same), ``labeled``,
    ``unlabeled``, ``partially_labeled`` (rows some models have a label on: not used),
    ``correlation``, ``threshold``, ``lambda``, ``effective_labels`` (the labels-only sample
    size with the same mean variance), ``fallback``, ``confidence``, ``method``, ``assumption``.
    """
    judge = np.asarray(judge, dtype=float)
    human = np.asarray(human, dtype=float)
    given = ~np.isnan(human)
    labeled = given.all(0)
    n, total = int(labeled.sum()), int(labeled.size)
    out: Calibration = {
        "method": "PPI++ Bradley-Terry (prediction-powered M-estimation, power-tuned lambda); "
                  "normal intervals from the sandwich covariance",
        "assumption": ASSUMPTION, "confidence": confidence, "labeled": n, "unlabeled": total - n,
        "partially_labeled": int((given.any(0) & ~labeled).sum())}
    if n < MIN_LABELED:
        return out | {"available": False, "reason": (
            f"{n} rows have a human label for every model: a calibrated interval needs at "
            f"least {MIN_LABELED}")}
    parts = _Labeled(tables_from_scores(human[:, labeled], every_pair=True),
                     tables_from_scores(judge[:, labeled], every_pair=True),
                     tables_from_scores(judge[:, ~labeled], every_pair=True))
    z = _z(confidence)

    def board(theta: np.ndarray, covariance: np.ndarray) -> tuple[dict[str, float], dict[str, list[float]]]:
        se = np.sqrt(np.clip(np.diag(covariance), 0.0, None))
        ratings = INIT + SCALE * theta
        return ({m: float(ratings[i]) for i, m in enumerate(models)},
                {m: [float(ratings[i] - z * SCALE * se[i]), float(ratings[i] + z * SCALE * se[i])]
                 for i, m in enumerate(models)})

    alone = parts.fit(0.0)
    alone_covariance = parts.covariance(alone, 0.0)
    correlation = parts.correlation()
    threshold = 1 / math.sqrt(n - 2)
    fallback = None
    if parts.unlabeled == 0:
        fallback = "every row is labeled: the labels are the whole sample, the judge adds nothing"
    elif correlation is None or correlation <= threshold:
        shown = "undefined" if correlation is None else f"{correlation:.2f}"
        fallback = (f"the judge's and the humans' games correlate {shown}, not above "
                    f"1/sqrt(n - 2) = {threshold:.2f} with {n} labeled rows: below that "
                    "PPI++ gains nothing, so the labels alone carry the estimate")
    if fallback is None:
        lam = parts.tuned(parts.fit(1.0))
        theta = parts.fit(lam)
        covariance = parts.covariance(theta, lam)
    else:
        lam, theta, covariance = 0.0, alone, alone_covariance
    ratings, intervals = board(theta, covariance)
    human_ratings, human_intervals = board(alone, alone_covariance)
    variance, alone_variance = float(np.trace(covariance)), float(np.trace(alone_covariance))
    return out | {
        "available": True, "reason": None, "ratings": ratings, "intervals": intervals,
        "human_only": {"ratings": human_ratings, "intervals": human_intervals},
        "correlation": correlation, "threshold": threshold, "lambda": lam,
        "effective_labels": n * alone_variance / variance if variance > 0 else float(n),
        "fallback": fallback}


# ---------------------------------------------------------------- results files


# the scores grader's own formats give (the seed's formula): 0 to 5
SCORE_RANGE = (0.0, 5.0)


def _value(record: Any, path: Path, line: int) -> float | None:
    """A record's score (or score_model result) as a number, None without one (a failure
    status's null). A score no judge can have given is refused, not ranked: a non-finite
    number (NaN, Infinity: a corrupted record, never a failure status), one outside the
    seed-shaped formats' 0-5, or a value that is no number on an ``ok`` row."""
    value = record.value if record.value is not None else record.field("score")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if record.status != "ok":
            return None  # another tool's failure row, with its own placeholder
        raise RankError(f"{path}:{line}: row {record.id!r} is ok and its score {value!r} is "
                        "not a number: a corrupted record, not ranked")
    if not math.isfinite(value):
        raise RankError(f"{path}:{line}: row {record.id!r} has the score {value!r} (status "
                        f"{record.status}): not a valid number, a corrupted record, not ranked")
    low, high = SCORE_RANGE
    if isinstance(record, SeedRecord) and not low <= value <= high:
        raise RankError(f"{path}:{line}: row {record.id!r} has the score {value!r}, outside "
                        f"the {record.kind} format's range {low:g}-{high:g}: not ranked")
    return float(value)


def _length(record: Any, texts: Mapping[Any, Any] | None) -> int | None:
    text = record.field("output_text")
    if not isinstance(text, str) and texts is not None:
        text = texts.get(id_key(record.id))
    return len(text) if isinstance(text, str) else None


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


def _check_rows(files: dict[str, tuple[Path, Loaded]]) -> None:
    """Every file holds the same row ids; else one line naming the files, the rows they
    share, and the rows only one holds."""
    keys = {name: {id_key(r.id) for _, r in records} for name, (_, records) in files.items()}
    names = list(files)
    first = names[0]
    for other in names[1:]:
        if keys[other] != keys[first]:
            shared = len(keys[first] & keys[other])
            parts = [f"{len(only)} only in {files[one][0]} ({shorten(only)})"
                     for one, only in ((first, sorted(keys[first] - keys[other], key=str)),
                                       (other, sorted(keys[other] - keys[first], key=str)))
                     if only]
            raise RankError(
                f"{files[first][0]} and {files[other][0]} are over different rows: they share "
                f"{shared}; " + "; ".join(parts))


def _check_formats(files: dict[str, tuple[Path, Loaded]]) -> None:
    kinds = {name: sorted({str(r.kind) for _, r in records if r.kind}) for name, (_, records)
             in files.items()}
    seen = {tuple(k) for k in kinds.values() if k}
    if len(seen) > 1:
        described = ", ".join(f"{files[n][0]}: {'/'.join(k) or 'unknown'}" for n, k in kinds.items())
        raise RankError(f"the results files hold different formats ({described}): their scores "
                        "are not one measure")


def rank(results: Sequence[str | Path], *, names: Sequence[str] = (), data: Sequence[str] = (),
         mapping: Mapping[str, str] | None = None, id_column: str | None = None,
         rounds: int = 1000, seed: int = 0, confidence: float = 0.95,
         length_controlled: bool = False, human: str | None = None,
         progress: Callable[[int], Progress] | None = None) -> Ranking:
    """Rank the models of ``results`` (one results file a model, graded on the same rows; or
    pairwise results files, whose records name their models).

    Args:
        names: one model name a file, in order (default: each file's name without suffix).
        data: with ``length_controlled``, the answers each file graded (one a file, in order),
            for answer lengths, where the records do not hold ``output_text`` (pairwise:
            ``output_a`` and ``output_b``); without it, the dataset each run recorded in its
            summary (``run.data``), where that file is still there. With
            ``human``, the files that hold the human labels.
        human: the column of human labels 0-5 (of each ``data`` file, else of the records):
            adds the calibrated (prediction-powered) fit, :func:`calibrated_bradley_terry`,
            as ``calibration`` and each entry's ``calibrated``.
        progress: called with the number of bootstrap rounds to come; returns the bar that
            is told of them (a tqdm bar does).

    Returns the leaderboard of :func:`rank_games` and ``files``, ``rows`` (how many, how many
    every model scored, and ``incomplete``: each row some model has no score for, with the
    statuses it has there), ``notes``.
    """
    paths = [Path(p) for p in results]
    loaded, given = _load(paths, data)
    fit = partial(rank_games, rounds=rounds, seed=seed, confidence=confidence,
                  length_controlled=length_controlled)
    bar = partial(_bar, progress, rounds * (1 + length_controlled))
    if loaded and all(r.kind == "pairwise" for records in loaded for _, r in records):
        _check_pairwise_options(names, human)
        answers = ([read_answers(p, g, mapping, id_column, ("output_a", "output_b"))
                    for p, g in zip(paths, given, strict=True)] if length_controlled else None)
        return _rank_pairwise(paths, loaded, answers, fit, bar)
    files = _score_files(paths, loaded, names)
    scores = _Scores.read(files, given, mapping, id_column, length_controlled)
    # the labels are read (and refused) before the bootstrap's minutes
    labels = [_labels(path, records, g, human, mapping, id_column)
              for (path, records), g in zip(files.values(), given, strict=True)] if human else []
    # without the length term the games are only ever counted per pair: no Game is made
    games = (outcomes_from_scores(scores.scores, scores.lengths) if length_controlled
             else tables_from_scores(scores.matrix))
    with bar() as shown:
        result = fit(games, scores.models, progress=shown)
    incomplete = scores.finish(result, files)
    if human:
        sources = list(data) if data else [str(p) for p, _ in files.values()]
        _calibrate(result, scores, labels, human, sources, confidence)
    result["notes"] = _notes(result, incomplete)
    return result


def _load(paths: list[Path], data: Sequence[str]) -> tuple[list[Loaded], list[str | None]]:
    """Each results file's records, and the --data file given for each (None: none)."""
    from grader.analysis.agreement import load_records

    loaded = [load_records(p) for p in paths]
    for path, records in zip(paths, loaded, strict=True):
        if not records:
            raise RankError(f"{path}: no records: a results file of no row has no model to rank")
    if data and len(data) != len(paths):
        raise RankError(f"--data is given {len(data)} times for {len(paths)} results files: "
                        "give it once per file, in the same order")
    return loaded, list(data) if data else [None] * len(paths)


def _score_files(paths: list[Path], loaded: list[Loaded], names: Sequence[str]
                 ) -> dict[str, tuple[Path, Loaded]]:
    """Results files of absolute scores by model name, checked to be over the same rows and
    of one format."""
    if len(paths) < 2:
        raise RankError(f"rank needs at least 2 results files (one a model), got {len(paths)}")
    files = dict(zip(_model_names(paths, names), zip(paths, loaded, strict=True), strict=True))
    _check_rows(files)
    _check_formats(files)
    return files


@dataclass(frozen=True)
class _Scores:
    """Results files of absolute scores read for ranking: by model and row id, the score
    (None: none on that row), the answer's length and the status."""

    scores: dict[str, dict[Any, float | None]]
    lengths: dict[str, dict[Any, int | None]]
    statuses: dict[str, dict[Any, str]]

    @classmethod
    def read(cls, files: Mapping[str, tuple[Path, Loaded]], given: Sequence[str | None],
             mapping: Mapping[str, str] | None, id_column: str | None,
             length_controlled: bool) -> _Scores:
        texts = [_texts(path, records, g, mapping, id_column)
                 if g is not None or length_controlled else None
                 for (path, records), g in zip(files.values(), given, strict=True)]
        scores, lengths, statuses = {}, {}, {}
        for (m, (path, records)), known in zip(files.items(), texts, strict=True):
            scores[m] = {id_key(r.id): _value(r, path, line) for line, r in records}
            lengths[m] = {id_key(r.id): _length(r, known) for _, r in records}
            statuses[m] = {id_key(r.id): str(r.status) for _, r in records}
        if length_controlled:
            _check_lengths(files, scores, lengths)
        return cls(scores, lengths, statuses)

    @property
    def models(self) -> list[str]:
        return list(self.scores)

    @property
    def row_ids(self) -> list[Any]:
        return list(self.scores[self.models[0]])

    @property
    def matrix(self) -> np.ndarray:
        """models x rows, NaN where a model has no score."""
        return _matrix([self.scores[m] for m in self.models], self.row_ids)

    def finish(self, result: Ranking, files: Mapping[str, tuple[Path, Loaded]]
               ) -> dict[Any, dict[str, str]]:
        """Each entry's mean score and file, and the result's ``rows``; returns the rows some
        model has no score on, with the statuses of those models there."""
        for entry in result["leaderboard"]:
            values = [v for v in self.scores[entry["model"]].values() if v is not None]
            entry["mean_score"] = sum(values) / len(values) if values else None
            entry["file"] = str(files[entry["model"]][0])
        incomplete = {row: {m: self.statuses[m][row] for m in self.models
                            if self.scores[m][row] is None}
                      for row in self.row_ids
                      if any(self.scores[m][row] is None for m in self.models)}
        total = len(self.row_ids)
        result["rows"] = {"total": total, "scored_by_every_file": total - len(incomplete),
                          "incomplete": incomplete}
        return incomplete


def _matrix(found: Sequence[Mapping[Any, float | int | None]], row_ids: list[Any]) -> np.ndarray:
    return np.array([[np.nan if (v := values.get(row)) is None else v for row in row_ids]
                     for values in found], dtype=float).reshape(len(found), len(row_ids))


def _calibrate(result: Ranking, scores: _Scores, labels: list[dict[Any, int]], human: str,
               sources: list[str], confidence: float) -> None:
    """Add the calibrated fit to ``result``: ``calibration``, and each entry's ``calibrated``
    (None where there is no estimate)."""
    models = scores.models
    calibration = calibrated_bradley_terry(scores.matrix, _matrix(labels, scores.row_ids),
                                           models, confidence=confidence)
    calibration["human_column"] = human
    calibration["human_source"] = sources
    for entry in result["leaderboard"]:
        m = entry["model"]
        entry["calibrated"] = None
        if calibration["available"]:
            alone = calibration["human_only"]
            entry["calibrated"] = {
                "rating": calibration["ratings"][m], "interval": calibration["intervals"][m],
                "human_only": {"rating": alone["ratings"][m], "interval": alone["intervals"][m]}}
    result["calibration"] = calibration


def _check_pairwise_options(names: Sequence[str], human: str | None) -> None:
    if names:
        raise RankError("--name does not apply to pairwise results: their records name "
                        "the models (model_a, model_b)")
    if human is not None:
        raise RankError("--human applies to results files of absolute scores, one a model: "
                        "pairwise records hold no score of each answer to compare with a "
                        "human label")


def _check_lengths(files: Mapping[str, tuple[Path, Any]], scores: Mapping[str, Mapping[Any, Any]],
                   lengths: Mapping[str, Mapping[Any, int | None]]) -> None:
    """Every scored row has its answer's length (--length-controlled); else one line."""
    for m, (path, _) in files.items():
        missing = [row for row, n in lengths[m].items() if n is None and scores[m][row] is not None]
        if missing:
            raise _no_lengths(path, missing, "output_text")


def _labels(path: Path, records: Loaded, given: str | None, column: str,
            mapping: Mapping[str, str] | None, id_column: str | None) -> dict[Any, int]:
    """By row id, the human labels 0-5 of a results file's rows: from ``given`` (a label
    file, or a dataset as ``agree --data`` reads it) or from the records' ``column``; a blank
    is no label, a value that is no integer 0-5 is refused by file and line."""
    from grader.analysis.agreement import read_human_labels, read_label

    if given is None and not any(record.has(column) for _, record in records):
        raise RankError(f"{path}: no record has a {column!r} field: pass the human labels "
                        "with --data, once per results file in order")
    read = read_human_labels(path, records, column, given, mapping, id_column)
    where, rows = given or path, {id_key(record.id) for _, record in records}
    labels, elsewhere = {}, 0
    for key, value in read.scores.items():
        label, problem = read_label(value)
        if problem == "invalid":
            line, row = read.lines[key]
            raise RankError(f"{where}:{line}: row {row!r}: the human label {value!r} is not an "
                            "integer 0-5")
        if label is not None:
            if key in rows:
                labels[key] = label
            else:
                elsewhere += 1
    if elsewhere and not labels:
        raise RankError(f"{where}: none of its {elsewhere} human labels is for a row of {path}: "
                        "labels of other rows, or read with other --map/--id-column")
    return labels


Bar = AbstractContextManager[Progress | None]


@contextmanager
def _bar(progress: Callable[[int], Progress] | None, total: int) -> Iterator[Progress | None]:
    """The caller's progress bar for ``total`` bootstrap rounds, closed however the fit ends."""
    bar = progress(total) if progress is not None and total else None
    try:
        yield bar
    finally:
        if bar is not None:
            bar.close()


def _texts(path: Path, records: Loaded, given: str | None, mapping: Mapping[str, str] | None,
           id_column: str | None) -> dict[Any, Any] | None:
    """By row id, the answers of a results file whose records do not hold ``output_text``."""
    if given is None and all(isinstance(r.field("output_text"), str) for _, r in records):
        return None
    answers = read_answers(path, given, mapping, id_column, ("output_text",))
    return None if answers is None else {row: texts[0] for row, texts in answers[1].items()}


def _no_lengths(path: Path, missing: list[Any], fields: str) -> RankError:
    return RankError(
        f"{path}: --length-controlled needs each answer's length: {len(missing)} rows have no "
        f"{fields} ({shorten(missing)}) in the records or in the dataset their run recorded: "
        "pass the answers with --data, once per results file")


def _pair_lengths(path: Path, records: Loaded, answers: Answers | None
                  ) -> dict[Any, tuple[int | None, int | None]]:
    """By row id, the lengths of a pairwise file's two answers; a row with a winner and
    without both is refused."""
    lengths: dict[Any, tuple[int | None, int | None]] = {}
    missing = []
    for _, record in records:
        texts = (answers[1] if answers else {}).get(id_key(record.id), (None, None))
        pair = tuple(len(t) if isinstance(t, str) else None for t in texts)
        lengths[id_key(record.id)] = (pair[0], pair[1])
        if None in pair and record.field("winner") in POINTS:
            missing.append(record.id)
    if missing:
        raise _no_lengths(path, missing, "output_a and output_b")
    return lengths


def _rank_pairwise(paths: list[Path], loaded: list[Loaded],
                   answers: list[Answers | None] | None,
                   fit: Callable[..., Ranking], bar: Callable[[], Bar]) -> Ranking:
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
    with bar() as shown:
        result = fit(games, models, progress=shown)
    result["rows"] = {"total": sum(len(rows) for rows in loaded), "games": len(games),
                      "incomplete": unusable}
    result["source"] = "pairwise"
    result["notes"] = _notes(result, unusable)
    return result


def _notes(result: Ranking, incomplete: Mapping[Any, Any]) -> list[str]:
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
    key: Literal["lc_interval", "interval"] = (
        "lc_interval" if result["length_controlled"] else "interval")
    for upper, lower in zip(board, board[1:], strict=False):
        above, below = upper[key], lower[key]
        if above and below and below[1] >= above[0]:
            notes.append(f"{upper['model']} and {lower['model']}: their intervals overlap, "
                         "the order between them is not established")
    return notes


# ---------------------------------------------------------------- the terminal


def _interval(interval: list[float] | None) -> str:
    return "" if interval is None else f"[{interval[0]:.0f}, {interval[1]:.0f}]"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_rank(result: Ranking) -> str:
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
        # a space before the mean score however many games (593 / 348 / 259 is 15 wide)
        plain = f"{e['rating']:>8.0f}  {_interval(e['interval']):<14}{_rate(e['win_rate']):>9}  {wtl:<14} "
        line = f"{place:<3}{_name(e['model']):<20}"
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
                     f"coefficient {length['coefficient']:.3f} "
                     f"{format_interval(length['interval'])}; "
                     "LC win: the fit's win rate with equal lengths")
    lines.append("pairs (wins a / ties / wins b): " + "; ".join(
        f"{p['a']} - {p['b']} {p['wins_a']}/{p['ties']}/{p['wins_b']}" for p in result["pairs"]))
    lines.extend(_incomplete_lines(rows))
    lines.extend(f"note: {note}" for note in result["notes"])
    lines.extend(_calibration_lines(result))
    return "\n".join(lines)


def _incomplete_lines(rows: Rows) -> list[str]:
    """The first rows without a game (or a score in some file), and how many more."""
    lines = []
    for row, where in list(rows["incomplete"].items())[:NAMED]:
        if isinstance(where, Mapping):  # the models without a score on the row: their statuses
            where = ", ".join(f"{model} {status}" for model, status in where.items())
        lines.append(f"  {'no game' if 'games' in rows else 'not scored'}: {row}: {where}")
    if len(rows["incomplete"]) > NAMED:
        lines.append(f"  ... and {len(rows['incomplete']) - NAMED} more (--json lists every one)")
    return lines


def _calibration_lines(result: Ranking) -> list[str]:
    """The calibrated leaderboard beside the judge's, with what it rests on."""
    calibration = result.get("calibration")
    if calibration is None:
        return []
    column = calibration["human_column"]
    if not calibration["available"]:
        return ["", f"calibrated with human labels ({column}): no estimate: {calibration['reason']}"]
    pct = f"{round(calibration['confidence'] * 100, 1):g}%"
    lines = ["", f"calibrated with human labels ({column}): PPI++ Bradley-Terry, {pct} normal "
             f"intervals (sandwich); {calibration['labeled']} labeled rows, "
             f"{calibration['unlabeled']} judged only",
             f"{'#':<3}{'model':<20}{'calibrated':>10}  {pct + ' interval':<14}{'labels only':>11}  "
             f"{pct + ' interval':<14}{'judge only':>10}"]
    board = [(c, e) for e in result["leaderboard"] if (c := e.get("calibrated")) is not None]
    for place, (c, e) in enumerate(sorted(board, key=lambda ce: -ce[0]["rating"]), start=1):
        alone = c["human_only"]
        lines.append(f"{place:<3}{_name(e['model']):<20}{c['rating']:>10.0f}  "
                     f"{_interval(c['interval']):<14}{alone['rating']:>11.0f}  "
                     f"{_interval(alone['interval']):<14}{e['rating']:>10.0f}")
    correlation = calibration["correlation"]
    shown = "undefined" if correlation is None else f"{correlation:.2f}"
    lines.append(f"judge-human correlation of the labeled games {shown} (gains above "
                 f"{calibration['threshold']:.2f}), lambda {calibration['lambda']:.2f}: as sure as "
                 f"{calibration['effective_labels']:.0f} labels alone ({calibration['labeled']} given)")
    if calibration["fallback"]:
        lines.append(f"fallback: labels only: {calibration['fallback']}")
    if calibration["partially_labeled"]:
        lines.append(f"{calibration['partially_labeled']} rows have labels for some models only: "
                     "not used (a labeled row needs a label for every model)")
    lines.append(f"assumes {calibration['assumption']} (labels given in the data record no "
                 "sampling: not checked)")
    return lines


def _name(model: str) -> str:
    return model if len(model) <= 19 else model[:18] + "…"

