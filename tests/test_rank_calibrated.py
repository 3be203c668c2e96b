"""grader rank with human labels: the calibrated (prediction-powered, PPI++)
Bradley-Terry fit beside the judge-only leaderboard; its intervals' coverage by simulation,
its estimating equation, ppi_py on two models, the fallback, bad labels."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import cli

from grader.analysis.rank import (
    INIT,
    SCALE,
    _fit_pairs,
    calibrated_bradley_terry,
    tables_from_scores,
)

QUALITY = np.array([0.0, 0.4, 0.8, 1.2])  # four models under test, the humans' view
MODELS = [f"m{i}" for i in range(len(QUALITY))]


def simulate(rng, rows, bias=1.0, noise=0.8, signal=True):
    """Human scores 0-5 of each model on each row (a shared row difficulty, so a row's games
    are correlated), and a judge that overrates by ``bias`` with ``noise`` (``signal`` False:
    the judge's scores are unrelated to the humans')."""
    difficulty = rng.normal(0, 1, rows)
    human = np.clip(np.round(2 + QUALITY[:, None] + difficulty + rng.normal(0, 1, (4, rows))), 0, 5)
    base = human if signal else np.clip(np.round(2.5 + rng.normal(0, 1.3, (4, rows))), 0, 5)
    judge = np.clip(np.round(base + bias + rng.normal(0, noise, (4, rows))), 0, 5)
    return human, judge


@pytest.fixture(scope="module")
def truth():
    """The ratings the humans' games give on the whole population (400,000 rows)."""
    human, _ = simulate(np.random.default_rng(123), 400_000)
    tables = tables_from_scores(human)
    return INIT + SCALE * _fit_pairs(tables.first, tables.second, *tables.totals(), 4)


def label_sample(rng, human, n):
    labeled = np.full_like(human, np.nan)
    rows = rng.choice(human.shape[1], n, replace=False)
    labeled[:, rows] = human[:, rows]
    return labeled


def run_simulation(truth, runs, rows, n, signal, seed):
    rng = np.random.default_rng(seed)
    covered, covered_alone, widths, widths_alone, fallbacks = [], [], [], [], 0
    for _ in range(runs):
        human, judge = simulate(rng, rows, signal=signal)
        result = calibrated_bradley_terry(judge, label_sample(rng, human, n), MODELS)
        interval = np.array([result["intervals"][m] for m in MODELS])
        alone = np.array([result["human_only"]["intervals"][m] for m in MODELS])
        covered.append((interval[:, 0] <= truth) & (truth <= interval[:, 1]))
        covered_alone.append((alone[:, 0] <= truth) & (truth <= alone[:, 1]))
        widths.append(interval[:, 1] - interval[:, 0])
        widths_alone.append(alone[:, 1] - alone[:, 0])
        fallbacks += result["fallback"] is not None
    return (np.mean(covered, 0), np.mean(covered_alone, 0), np.mean(widths), np.mean(widths_alone),
            fallbacks)


def test_calibrated_intervals_cover_the_humans_ratings(truth):
    """300 simulated runs (1,000 rows, 100 labeled at random; a judge overrating by a point,
    correlated with the humans): the calibrated 95 % intervals cover the humans' ratings on
    the population in 91-99 % of runs for every model (300 runs: a binomial 95 % band of
    about +-2.5 points), and are narrower than the labels' alone."""
    covered, covered_alone, width, width_alone, fallbacks = run_simulation(
        truth, runs=300, rows=1000, n=100, signal=True, seed=1)
    assert fallbacks == 0
    assert np.all((0.91 <= covered) & (covered <= 0.99)), covered
    assert 0.93 <= covered.mean() <= 0.97, covered
    assert np.all(covered_alone >= 0.91), covered_alone
    assert width < 0.9 * width_alone  # the judge's rows help: about 0.77 here


def test_a_judge_without_signal_costs_nothing(truth):
    """A judge unrelated to the humans: the calibrated interval is the labels' (a fallback
    below the correlation threshold, else lambda near 0), never narrower than the labels'
    alone by more than a rounding, and it still covers."""
    covered, _, width, width_alone, fallbacks = run_simulation(
        truth, runs=150, rows=1000, n=100, signal=False, seed=2)
    assert fallbacks > 75  # most runs fall back, the rest tune lambda to near 0
    assert width >= 0.99 * width_alone
    assert 0.91 <= covered.mean() <= 0.99, covered


def test_the_estimate_solves_the_ppi_estimating_equation():
    """Held to the definition, by a per-game loop independent of the pair tables: at the
    calibrated ratings, the labeled rows' human gradient plus lambda times (the unlabeled
    rows' judge gradient less the labeled rows', each a mean per row) is zero (to the ridge)."""
    rng = np.random.default_rng(9)
    human, judge = simulate(rng, 300)
    labels = label_sample(rng, human, 60)
    result = calibrated_bradley_terry(judge, labels, MODELS)
    lam = result["lambda"]
    assert 0 < lam <= 1 and result["fallback"] is None
    theta = (np.array([result["ratings"][m] for m in MODELS]) - INIT) / SCALE
    labeled = ~np.isnan(labels).any(0)

    def gradient(scores, rows):
        g = np.zeros(4)
        for r in rows:
            for a in range(4):
                for b in range(a + 1, 4):
                    y = 1.0 if scores[a, r] > scores[b, r] else 0.5 if scores[a, r] == scores[b, r] else 0.0
                    residual = 1 / (1 + math.exp(-(theta[a] - theta[b]))) - y
                    g[a] += residual
                    g[b] -= residual
        return g / len(rows)

    inside, outside = np.flatnonzero(labeled), np.flatnonzero(~labeled)
    equation = gradient(human, inside) + lam * (gradient(judge, outside) - gradient(judge, inside))
    assert np.abs(equation).max() < 1e-3
    assert np.abs(gradient(human, inside)).max() > 1e-2  # and the labels alone are not solved


def test_two_models_match_ppi_py():
    """Two models, no ties (one scores even, the other odd): the Bradley-Terry fit is
    ppi_py's logistic regression on one feature, so its PPI++ point estimate and 95 %
    interval (the rating difference) must be ppi_py's (dev-only: skipped without ppi_py)."""
    ppi = pytest.importorskip("ppi_py")
    rng = np.random.default_rng(4)
    rows = 800
    human = np.stack([2 * rng.integers(0, 3, rows), 2 * rng.integers(0, 3, rows) + 1]).astype(float)
    flip = rng.random(rows) < 0.25
    judge = np.where(flip, human[::-1], human)  # the judge swaps a quarter of the games
    labels = label_sample(rng, human, 150)
    result = calibrated_bradley_terry(judge, labels, ["a", "b"])
    labeled = ~np.isnan(labels).any(0)
    y = (human[0] > human[1]).astype(float)
    yhat = (judge[0] > judge[1]).astype(float)
    x = np.ones((rows, 1))
    point = ppi.ppi_logistic_pointestimate(x[labeled], y[labeled], yhat[labeled], x[~labeled],
                                           yhat[~labeled])
    low, high = ppi.ppi_logistic_ci(x[labeled], y[labeled], yhat[labeled], x[~labeled],
                                    yhat[~labeled], alpha=0.05)
    # our ratings: a = 1000 + SCALE d / 2, its interval half the difference's
    assert result["ratings"]["a"] == pytest.approx(INIT + SCALE * point[0] / 2, abs=0.05)
    assert result["intervals"]["a"] == pytest.approx(
        [INIT + SCALE * low[0] / 2, INIT + SCALE * high[0] / 2], abs=0.05)


def write_files(tmp_path, human, judge, labeled_rows, column="human"):
    results, labels = [], []
    for i in range(human.shape[0]):
        results.append(tmp_path / f"m{i}.jsonl")
        labels.append(tmp_path / f"m{i}.labels.jsonl")
        results[-1].write_text("".join(json.dumps(
            {"id": f"r{r}", "status": "ok", "score": int(judge[i, r]), "format": "rubric"}) + "\n"
            for r in range(human.shape[1])))
        labels[-1].write_text("".join(json.dumps({"id": f"r{r}", column: int(human[i, r])}) + "\n"
                                      for r in labeled_rows))
    return results, [a for path in labels for a in ("--data", path)]


def test_rank_with_labels_through_the_cli(tmp_path):
    """``grader rank A B C D --human human --data ...``: the judge's leaderboard as before,
    and beside it the calibrated one, with its intervals, correlation, lambda, effective
    labels and assumption; ``--json`` gains ``calibration`` and each model's ``calibrated``."""
    rng = np.random.default_rng(5)
    human, judge = simulate(rng, 400)
    files, data = write_files(tmp_path, human, judge, rng.choice(400, 80, replace=False).tolist())
    result = cli("rank", *files, *data, "--human", "human", "--rounds", 100, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    plain = json.loads(cli("rank", *files, "--rounds", 100, "--json").stdout)
    assert [e["rating"] for e in out["leaderboard"]] == [e["rating"] for e in plain["leaderboard"]]
    calibration = out["calibration"]
    assert calibration["available"] and calibration["labeled"] == 80 and calibration["unlabeled"] == 320
    assert calibration["fallback"] is None and 0 < calibration["lambda"] <= 1
    assert calibration["effective_labels"] > 80 and calibration["correlation"] > calibration["threshold"]
    assert "random sample" in calibration["assumption"]
    for entry in out["leaderboard"]:
        low, high = entry["calibrated"]["interval"]
        assert low < entry["calibrated"]["rating"] < high
        alone = entry["calibrated"]["human_only"]["interval"]
        assert high - low < alone[1] - alone[0]
    best = max(out["leaderboard"], key=lambda e: e["calibrated"]["rating"])
    assert best["model"] == "m3"
    text = cli("rank", *files, *data, "--human", "human", "--rounds", 100).stdout
    assert "calibrated with human labels (human): PPI++ Bradley-Terry, 95% normal intervals" in text
    assert "80 labeled rows, 320 judged only" in text and "labels only" in text
    assert "as sure as" in text and "assumes the labeled rows are a random sample" in text


def test_labels_in_the_records_and_the_fallback(tmp_path):
    """Labels read from the records' own column (as agree without --data); a judge unrelated
    to the humans: the labels alone carry the estimate, and the output says why."""
    rng = np.random.default_rng(6)
    human, judge = simulate(rng, 300, signal=False)
    labeled = set(rng.choice(300, 60, replace=False).tolist())
    files = []
    for i in range(4):
        files.append(tmp_path / f"m{i}.jsonl")
        files[-1].write_text("".join(json.dumps(
            {"id": f"r{r}", "status": "ok", "score": int(judge[i, r]), "format": "rubric",
             "label": int(human[i, r]) if r in labeled else None}) + "\n" for r in range(300)))
    out = json.loads(cli("rank", *files, "--human", "label", "--rounds", 0, "--json").stdout)
    calibration = out["calibration"]
    if calibration["fallback"] is None:  # a chance correlation above the threshold
        pytest.fail(f"expected a fallback, correlation {calibration['correlation']}")
    assert calibration["lambda"] == 0 and "PPI++ gains nothing" in calibration["fallback"]
    for entry in out["leaderboard"]:
        assert entry["calibrated"]["rating"] == entry["calibrated"]["human_only"]["rating"]
    text = cli("rank", *files, "--human", "label", "--rounds", 0).stdout
    assert "fallback: labels only: the judge's and the humans' games correlate" in text


def test_too_few_labels_give_no_calibrated_estimate(tmp_path):
    rng = np.random.default_rng(7)
    human, judge = simulate(rng, 100)
    files, data = write_files(tmp_path, human, judge, list(range(9)))
    out = json.loads(cli("rank", *files, *data, "--human", "human", "--rounds", 0, "--json").stdout)
    assert out["calibration"]["available"] is False and out["calibration"]["labeled"] == 9
    assert all(e["calibrated"] is None for e in out["leaderboard"])
    text = cli("rank", *files, *data, "--human", "human", "--rounds", 0).stdout
    assert "no estimate: 9 rows have a human label for every model: a calibrated interval needs " \
        "at least 10" in text


def test_rows_labeled_for_some_models_only_are_counted_not_used(tmp_path):
    rng = np.random.default_rng(8)
    human, judge = simulate(rng, 200)
    files, data = write_files(tmp_path, human, judge, list(range(40)))
    extra = data[-1]
    with open(extra, "a") as out:  # m3 alone has labels on five more rows
        out.write("".join(json.dumps({"id": f"r{r}", "human": 3}) + "\n" for r in range(40, 45)))
    out = json.loads(cli("rank", *files, *data, "--human", "human", "--rounds", 0, "--json").stdout)
    assert out["calibration"]["labeled"] == 40 and out["calibration"]["partially_labeled"] == 5


@pytest.mark.parametrize("label, words", [
    (7, ":2: row 'r1': the human label 7 is not an integer 0-5"),
    ("good", ":2: row 'r1': the human label 'good' is not an integer 0-5"),
])
def test_bad_labels_are_refused_by_file_and_line(tmp_path, label, words):
    rng = np.random.default_rng(9)
    human, judge = simulate(rng, 30)
    files, data = write_files(tmp_path, human, judge, list(range(20)))
    lines = data[1].read_text().splitlines()
    lines[1] = json.dumps({"id": "r1", "human": label})
    data[1].write_text("\n".join(lines) + "\n")
    result = cli("rank", *files, *data, "--human", "human")
    assert result.exit_code == 2 and result.output == f"error: {data[1]}{words}\n"


def test_labels_of_other_rows_or_no_column_are_refused(tmp_path):
    rng = np.random.default_rng(10)
    human, judge = simulate(rng, 30)
    files, data = write_files(tmp_path, human, judge, list(range(20)))
    data[1].write_text("".join(json.dumps({"id": f"x{r}", "human": 3}) + "\n" for r in range(20)))
    other = cli("rank", *files, *data, "--human", "human")
    assert other.exit_code == 2
    assert f"error: {data[1]}: none of its 20 human labels is for a row of {files[0]}" in other.output
    missing = cli("rank", *files, *data, "--human", "verdict")
    assert missing.exit_code == 2 and f"{data[1]}: no column 'verdict' with the human labels" in missing.output
    records = cli("rank", *files, "--human", "verdict")
    assert records.exit_code == 2 and "no record has a 'verdict' field" in records.output


def test_pairwise_results_with_labels_are_refused(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"id": 1, "status": "ok", "winner": "A", "model_a": "x",
                                "model_b": "y", "format": "pairwise"}) + "\n")
    result = cli("rank", path, "--human", "human")
    assert result.exit_code == 2 and "--human applies to results files of absolute scores" in result.output


def test_every_row_labeled_needs_no_judge(tmp_path):
    rng = np.random.default_rng(12)
    human, judge = simulate(rng, 40)
    files, data = write_files(tmp_path, human, judge, list(range(40)))
    out = json.loads(cli("rank", *files, *data, "--human", "human", "--rounds", 0, "--json").stdout)
    calibration = out["calibration"]
    assert calibration["unlabeled"] == 0 and calibration["lambda"] == 0
    assert calibration["fallback"].startswith("every row is labeled")
    assert calibration["effective_labels"] == pytest.approx(40)


def test_rank_with_labels_needs_no_engine_and_no_scipy(tmp_path):
    """The calibrated fit is numpy and the standard library: `grader rank --human` runs where
    torch, vLLM, scipy and the other extras cannot be imported."""
    from test_cli import _run_blocked

    rng = np.random.default_rng(13)
    human, judge = simulate(rng, 60)
    files, data = write_files(tmp_path, human, judge, list(range(30)))
    result = _run_blocked("rank", *map(str, files), *map(str, data), "--human", "human",
                          "--rounds", "20", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "calibrated with human labels (human)" in result.stdout
