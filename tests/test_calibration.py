"""Calibrated estimates (grader.analysis.calibration): validity shown by simulation, the
reference implementation's numbers, and the fallbacks.

The simulations draw human scores 0-5 from a known distribution, so the truth (the mean
human score of the population the rows come from) is known, and judges with known bias and
correlation score every row. Each case runs >= 2,000 simulated evaluations at once (numpy
over a leading axis), through the same code the commands use (``calibrated_means`` is
``calibrated_mean``'s core; a test below holds the two together).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from grader.analysis.calibration import (
    MIN_LABELS,
    calibrated_difference,
    calibrated_mean,
    calibrated_means,
    calibrated_moments,
    calibrated_pass_rate,
    describe,
    plan_labels,
    ppi_means,
    threshold,
)

HUMAN_P = np.array([0.10, 0.15, 0.20, 0.25, 0.20, 0.10])  # P(human score = 0..5)
TRUTH = float(np.arange(6) @ HUMAN_P)
RUNS = 2000


def judge_of(kind: str, human: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A synthetic judge's integer scores 0-5 for these human scores."""
    noise = rng.standard_normal(human.shape, dtype=np.float32)
    if kind == "strong":  # reads the answers, overrates by about a point (r ~ 0.8)
        raw = human + 1 + 0.8 * noise
    elif kind == "weak":  # r ~ 0.25
        raw = 0.3 * human + 2 + 1.2 * noise
    elif kind == "none":  # does not read the answers
        raw = 3 + 1.2 * noise
    else:  # "length": overrates more the longer the answer (lengths exponential, mean 1)
        length = rng.exponential(1.0, human.shape).astype(np.float32)
        raw = human + 0.8 * length + 0.8 * noise
    return np.clip(np.rint(raw), 0, 5)


def judge_marginal(kind: str) -> np.ndarray:
    """P(judge score = 0..5) of :func:`judge_of`, exactly: the unlabeled rows of a simulated
    run are drawn as counts per score from it (100,000 rows cost six numbers)."""
    from scipy import stats

    edges = np.array([-np.inf, 0.5, 1.5, 2.5, 3.5, 4.5, np.inf])
    marginal = np.zeros(6)
    for human, p in enumerate(HUMAN_P):
        if kind == "length":  # N(human, 0.8) + 0.8 * Exp(1): an exponentially modified normal
            cdf = stats.exponnorm.cdf(edges, 1.0, loc=human, scale=0.8)
        else:
            slope, shift, spread = {"strong": (1, 1, 0.8), "weak": (0.3, 2, 1.2),
                                    "none": (0, 3, 1.2)}[kind]
            cdf = stats.norm.cdf(edges, loc=slope * human + shift, scale=spread)
        marginal += p * np.diff(cdf)
    return marginal


def simulate(kind: str, n: int, big_n: int, runs: int = RUNS, seed: int = 0) -> dict[str, np.ndarray]:
    """``runs`` evaluations of ``n`` labeled rows (human and judge drawn row by row) and
    ``big_n`` unlabeled rows (judge scores drawn as counts from the judge's exact marginal):
    the calibrated estimate and the labels-only interval's width of each."""
    from scipy import stats

    rng = np.random.default_rng(seed)
    human = rng.choice(6, size=(runs, n), p=HUMAN_P).astype(np.float32)
    judge = judge_of(kind, human, rng)
    counts = rng.multinomial(big_n, judge_marginal(kind), size=runs)
    values = np.arange(6)
    mean_u = counts @ values / big_n
    var_u = (counts @ values**2 - big_n * mean_u**2) / (big_n - 1)
    out = calibrated_moments(human, judge, mean_u, var_u, big_n)
    out["labels_width"] = 2 * stats.t.ppf(0.975, n - 1) * human.std(-1, ddof=1) / math.sqrt(n)
    return out


CASES = [
    (kind, n, big_n)
    for kind in ("strong", "weak", "none", "length")
    for n, big_n in ((30, 1_000), (100, 10_000), (300, 100_000), (500, 1_000))
]


@pytest.mark.parametrize(("kind", "n", "big_n"), CASES)
def test_the_calibrated_95_interval_covers_the_truth_in_93_to_97_percent_of_runs(kind, n, big_n):
    out = simulate(kind, n, big_n)
    covered = (out["low"] <= TRUTH) & (TRUTH <= out["high"])
    assert 0.93 <= covered.mean() <= 0.97, (kind, n, big_n, covered.mean())
    width = out["high"] - out["low"]
    if kind in ("strong", "length"):  # a judge that reads the answers narrows the interval
        assert np.median(width / out["labels_width"]) < 0.8
        assert out["fallback"].mean() < 0.01
    if kind == "none":
        # no correlation: never narrower than the labels alone by more than a rounding
        assert np.median(width / out["labels_width"]) >= 0.995
        assert np.mean(width / out["labels_width"]) >= 0.99


def test_the_judge_alone_misses_the_truth_that_the_calibrated_estimate_covers():
    rng = np.random.default_rng(7)
    human = rng.choice(6, size=3000, p=HUMAN_P).astype(float)
    judge = judge_of("strong", human, rng)
    result = calibrated_mean(human[:200], judge[:200], judge[200:])
    assert result.judge_only.interval is not None and result.interval is not None
    assert result.judge_only.interval[0] > TRUTH + 0.5  # overrates by about a point
    assert result.interval[0] <= TRUTH <= result.interval[1]
    assert result.fallback is None and 0 < result.lam <= 1
    assert result.effective_labels > 300  # 200 labels with this judge count as many more
    calibrated_width = result.interval[1] - result.interval[0]
    assert result.human_only.interval is not None
    labels_width = result.human_only.interval[1] - result.human_only.interval[0]
    assert result.effective_labels == pytest.approx(200 * (labels_width / calibrated_width) ** 2)
    sentence = describe(result)
    assert sentence.startswith("the judge overrates by ")
    assert f"with 200 labels the mean is {result.mean:.2f}" in sentence
    assert f"as sure as {result.effective_labels:.0f} labels alone" in sentence


def test_the_batch_core_and_the_one_run_function_agree():
    rng = np.random.default_rng(3)
    human = rng.choice(6, size=(5, 400), p=HUMAN_P).astype(float)
    judge = judge_of("length", human, rng)
    batch = calibrated_means(human[:, :60], judge[:, :60], judge[:, 60:])
    for run in range(5):
        one = calibrated_mean(human[run, :60], judge[run, :60], judge[run, 60:])
        assert one.interval == pytest.approx((batch["low"][run], batch["high"][run]))
        assert one.mean == pytest.approx(batch["mean"][run])
        assert one.lam == pytest.approx(batch["lambda"][run])


def test_to_dict_is_the_json_key_for_key():
    rng = np.random.default_rng(1)
    human = rng.choice(6, size=500, p=HUMAN_P).astype(float)
    judge = judge_of("strong", human, rng)
    out = calibrated_mean(human[:100], judge[:100], judge[100:]).to_dict()
    assert list(out) == ["mean", "interval", "judge_only", "human_only", "correlation", "lambda",
                         "effective_labels", "labeled", "unlabeled", "fallback",
                         "correlation_rows"]
    assert list(out["judge_only"]) == ["mean", "interval"] == list(out["human_only"])
    assert (out["labeled"], out["unlabeled"], out["fallback"]) == (100, 400, None)
    assert len(out["interval"]) == 2 and out["interval"][0] < out["mean"] < out["interval"][1]


def test_a_judge_under_the_finite_sample_threshold_leaves_the_labels_alone_and_says_why():
    rng = np.random.default_rng(2)
    human = rng.choice(6, size=1000, p=HUMAN_P).astype(float)
    judge = judge_of("none", human, rng)
    result = calibrated_mean(human[:50], judge[:50], judge[50:])
    assert result.correlation is not None and result.correlation < threshold(50)
    assert (result.mean, result.interval) == (result.human_only.mean, result.human_only.interval)
    assert result.lam == 0.0 and result.effective_labels == 50
    assert result.fallback is not None and "under 1/sqrt(n-2) = 0.14" in result.fallback
    assert "from the labels alone" in describe(result)


def test_constant_scores_and_no_unlabeled_rows_fall_back_with_their_reason():
    human = np.array([3, 4, 2, 5, 1, 3, 4, 2, 3, 4, 5, 0], dtype=float)
    flat = calibrated_mean(human, np.full(12, 4.0), np.full(30, 4.0))
    assert flat.correlation is None and "the judge's scores" in (flat.fallback or "")
    everything = calibrated_mean(human, human, [])
    assert "every scored row is labeled" in (everything.fallback or "")
    assert everything.mean == pytest.approx(human.mean())


def test_fewer_than_ten_labels_give_no_calibrated_interval():
    result = calibrated_mean([3, 4, 2, 5, 1, 3, 4, 2, 3], [4, 5, 3, 5, 2, 4, 5, 3, 4], [4] * 50)
    assert MIN_LABELS == 10
    assert (result.mean, result.interval, result.lam) == (None, None, None)
    assert result.fallback == "fewer than 10 labels (9): no calibrated interval"
    assert result.human_only.interval is not None  # the labels' own interval is still shown
    assert describe(result) == "no calibrated mean: fewer than 10 labels (9): no calibrated interval"


def test_a_pass_rate_is_the_mean_of_passes_cut_to_0_1():
    rng = np.random.default_rng(4)
    human = rng.choice(6, size=2000, p=HUMAN_P).astype(float)
    judge = judge_of("strong", human, rng)
    result = calibrated_pass_rate(human[:150], judge[:150], judge[150:], 4)
    direct = calibrated_mean((human[:150] >= 4).astype(float), (judge[:150] >= 4).astype(float),
                             (judge[150:] >= 4).astype(float), bounds=(0.0, 1.0))
    assert result == direct
    assert result.interval is not None and 0 <= result.interval[0] <= result.interval[1] <= 1
    assert result.interval[0] <= HUMAN_P[4:].sum() <= result.interval[1]


def test_the_paired_difference_covers_the_true_difference():
    rng = np.random.default_rng(5)
    runs, n, big_n = RUNS, 100, 2000
    p_b = np.array([0.05, 0.10, 0.20, 0.25, 0.25, 0.15])  # model B: better by this much
    truth = float(np.arange(6) @ p_b) - TRUTH
    human_a = rng.choice(6, size=(runs, n + big_n), p=HUMAN_P).astype(np.float32)
    human_b = rng.choice(6, size=(runs, n + big_n), p=p_b).astype(np.float32)
    judge_a, judge_b = judge_of("strong", human_a, rng), judge_of("strong", human_b, rng)
    diff_h, diff_j = human_b - human_a, judge_b - judge_a
    out = calibrated_means(diff_h[:, :n], diff_j[:, :n], diff_j[:, n:])
    covered = (out["low"] <= truth) & (truth <= out["high"])
    assert 0.93 <= covered.mean() <= 0.97
    one = calibrated_difference(human_a[0, :n], human_b[0, :n], judge_a[0, :n], judge_b[0, :n],
                                judge_a[0, n:], judge_b[0, n:])
    assert one.mean == pytest.approx(out["mean"][0]) and one.fallback is None


def test_the_power_analysis_predicts_the_width_it_plans_for():
    rng = np.random.default_rng(6)
    rows = 20_000
    human = rng.choice(6, size=rows, p=HUMAN_P).astype(float)
    judge = judge_of("strong", human, rng)
    plan = plan_labels(human[:80], judge[:80], judge[80:], 0.1)
    assert plan.labels is not None and plan.labels_alone is not None
    assert plan.labels < plan.labels_alone  # a judge that reads the answers saves labels
    # the planned number of labels gives about the planned half-width
    n = plan.labels
    result = calibrated_mean(human[:n], judge[:n], judge[n:])
    assert result.interval is not None
    assert (result.interval[1] - result.interval[0]) / 2 == pytest.approx(0.1, rel=0.15)
    assert plan_labels(human[:80], judge[:80], judge[80:4000], 0.001).labels is None


def test_plain_ppi_plus_plus_is_the_paper_s_formula_written_out():
    """PPI++ for a mean (Angelopoulos, Duchi, Zrnic 2023, Example 6.1), written out here by
    hand: lambda = cov(Y, Yhat) / ((1 + n/N) var(all Yhat)), clipped to [0, 1]; the estimate
    lambda * mean(Yhat_unlabeled) + mean(Y - lambda * Yhat); the variance
    var(Y - lambda * Yhat)/n + lambda^2 var(Yhat_unlabeled)/N (population variances, as
    ppi_py); a normal interval. grader's cross-fitted variant is this with lambda from the
    other folds and a t interval."""
    from statistics import NormalDist, fmean, pvariance

    rng = np.random.default_rng(10)
    human = rng.choice(6, size=900, p=HUMAN_P).astype(float)
    judge = judge_of("strong", human, rng).astype(float)
    y, yh, yu = human[:80].tolist(), judge[:80].tolist(), judge[80:].tolist()
    n, big_n = len(y), len(yu)
    my, mh = fmean(y), fmean(yh)
    cov = sum((a - my) * (b - mh) for a, b in zip(y, yh)) / n
    everything = yh + yu
    mean_all = fmean(everything)
    var_all = sum((v - mean_all) ** 2 for v in everything) / (len(everything) - 1)
    lam = min(1.0, max(0.0, cov / ((1 + n / big_n) * var_all)))
    theta = lam * fmean(yu) + fmean([a - lam * b for a, b in zip(y, yh)])
    se = math.sqrt(pvariance([a - lam * b for a, b in zip(y, yh)]) / n
                   + lam**2 * pvariance(yu) / big_n)
    z = NormalDist().inv_cdf(0.975)
    ours = ppi_means(y, yh, yu, folds=None)
    assert float(ours["lambda"]) == pytest.approx(lam, rel=1e-12)
    assert float(ours["mean"]) == pytest.approx(theta, rel=1e-12)
    assert (float(ours["low"]), float(ours["high"])) == pytest.approx(
        (theta - z * se, theta + z * se), rel=1e-12)


def test_plain_ppi_plus_plus_is_ppi_py_s_to_the_last_digit():
    """Where ppi_py (ppi-python 0.2.3, the reference implementation) is installed: the same
    numbers on the same inputs. Not a dev dependency (pyproject.toml says why); run once with
    it installed on 2026-11-28: equal to 12 digits."""
    ppi_py = pytest.importorskip("ppi_py")
    rng = np.random.default_rng(8)
    human = rng.choice(6, size=1500, p=HUMAN_P).astype(float)
    judge = judge_of("length", human, rng).astype(float)
    y, yh, yu = human[:120], judge[:120], judge[120:]
    ours = ppi_means(y, yh, yu, folds=None)
    low, high = ppi_py.ppi_mean_ci(y, yh, yu, alpha=0.05)
    point = ppi_py.ppi_mean_pointestimate(y, yh, yu)
    assert float(ours["mean"]) == pytest.approx(float(np.ravel(point)[0]), rel=1e-12)
    assert (float(ours["low"]), float(ours["high"])) == pytest.approx(
        (float(np.ravel(low)[0]), float(np.ravel(high)[0])), rel=1e-12)
    fixed = ppi_means(y, yh, yu, folds=None, lam=1.0)
    low1, high1 = ppi_py.ppi_mean_ci(y, yh, yu, alpha=0.05, lam=1.0)
    assert (float(fixed["low"]), float(fixed["high"])) == pytest.approx(
        (float(np.ravel(low1)[0]), float(np.ravel(high1)[0])), rel=1e-12)
    # the cross-fitted variant grader reports: the same estimate to within its own error
    crossfit = calibrated_mean(y, yh, yu)
    assert crossfit.mean == pytest.approx(float(ours["mean"]), abs=float(ours["se"]))


def test_the_simulation_s_exact_judge_marginal_is_what_the_judge_draws():
    """The counts the simulations draw for unlabeled rows come from the judge's real law."""
    rng = np.random.default_rng(9)
    human = rng.choice(6, size=400_000, p=HUMAN_P).astype(np.float32)
    for kind in ("strong", "weak", "none", "length"):
        drawn = np.bincount(judge_of(kind, human, rng).astype(int), minlength=6) / human.size
        assert drawn == pytest.approx(judge_marginal(kind), abs=0.004)


# --- the commands -------------------------------------------------------------------------------


def _graded(tmp_path, name="results.jsonl", rows=3000, labeled=200, seed=11, shift=0.0):
    """A results file of a judge that overrates by a point, and a dataset with human labels on
    a random ``labeled`` of its rows (the others blank). Returns (results, data, truth)."""
    import json

    rng = np.random.default_rng(seed)
    human = rng.choice(6, size=rows, p=HUMAN_P)
    judge = judge_of("strong", human.astype(float) + shift, rng).astype(int)
    chosen = set(rng.choice(rows, labeled, replace=False).tolist())
    results, data = tmp_path / name, tmp_path / f"labels-{name}"
    with open(results, "w", encoding="utf-8") as out, open(data, "w", encoding="utf-8") as lab:
        for i in range(rows):
            out.write(json.dumps({"id": f"r{i}", "status": "ok", "score": int(judge[i])}) + "\n")
            lab.write(json.dumps({"id": f"r{i}", "input": "q", "reference": "r", "output_text": "a",
                                  "human": int(human[i]) if i in chosen else ""}) + "\n")
    return results, data, human, judge, sorted(chosen)


def test_agree_reports_the_three_estimates_the_sentence_and_the_assumption(tmp_path):
    import json

    from conftest import cli

    results, data, human, judge, chosen = _graded(tmp_path)
    done = cli("agree", results, "--human", "human", "--data", data, "--bootstrap", "100",
               "--json", "--pass-at", "4", "--plan", "0.1")
    assert done.exit_code == 0, done.output
    out = json.loads(done.output)
    calibrated = out["calibrated"]
    assert (calibrated["labeled"], calibrated["unlabeled"]) == (200, 2800)
    assert calibrated["interval"][0] <= TRUTH <= calibrated["interval"][1]
    assert calibrated["judge_only"]["mean"] == pytest.approx(judge.mean())
    assert calibrated["human_only"]["mean"] == pytest.approx(human[chosen].mean())
    assert calibrated["fallback"] is None and calibrated["effective_labels"] > 200
    # the same numbers as the Python API on the same rows (labeled rows in file order)
    unlabeled = np.delete(judge, chosen)
    api = calibrated_mean(human[chosen], judge[chosen], unlabeled)
    assert calibrated == json.loads(json.dumps(api.to_dict()))
    assert out["calibrated_pass_rate"] == json.loads(json.dumps(
        calibrated_pass_rate(human[chosen], judge[chosen], unlabeled, 4).to_dict()))
    assert out["calibration"]["random_sample"] is False
    assert out["calibration"]["assumption"] == "assumes the labeled rows are a random sample of the graded ones"
    assert out["label_plan"]["labels"] < out["label_plan"]["labels_alone"]

    text = cli("agree", results, "--human", "human", "--data", data, "--bootstrap", "100")
    assert text.exit_code == 0
    assert "calibrated (PPI++)" in text.output and "labels only" in text.output
    assert f"calibrated: the judge overrates by {judge.mean() - api.mean:.2f}; with 200 labels " \
        f"the mean is {api.mean:.2f}" in text.output
    assert "assumes the labeled rows are a random sample of the graded ones" in text.output


def test_agree_with_fewer_than_ten_labels_says_there_is_no_calibrated_interval(tmp_path):
    import json

    from conftest import cli

    results, data, *_ = _graded(tmp_path, rows=200, labeled=8)
    done = cli("agree", results, "--human", "human", "--data", data, "--bootstrap", "100")
    assert done.exit_code == 0
    assert "calibrated: no calibrated mean: fewer than 10 labels (8): no calibrated interval" \
        in done.output
    out = json.loads(cli("agree", results, "--human", "human", "--data", data, "--bootstrap",
                         "100", "--json").output)
    assert out["calibrated"]["mean"] is None and out["calibrated"]["interval"] is None


def test_agree_refuses_a_pass_threshold_off_the_scale(tmp_path):
    from conftest import cli

    results, data, *_ = _graded(tmp_path, rows=50, labeled=20)
    done = cli("agree", results, "--human", "human", "--data", data, "--pass-at", "7")
    assert done.exit_code == 2 and "--pass-at" in done.output


def test_compare_gives_the_calibrated_difference_beside_the_judge_only_one(tmp_path):
    import json

    from conftest import cli

    results_a, data_a, human_a, judge_a, chosen = _graded(tmp_path, "a.jsonl", rows=2000,
                                                          labeled=150, seed=3)
    # B: the same rows labeled (same seed for the choice), answers a point better by the judge
    results_b, data_b, human_b, judge_b, chosen_b = _graded(tmp_path, "b.jsonl", rows=2000,
                                                            labeled=150, seed=3, shift=1.0)
    assert chosen == chosen_b
    done = cli("compare", results_a, results_b, "--bootstrap", "100", "--json",
               "--human", "human", "--data", data_a, "--data", data_b)
    assert done.exit_code == 0, done.output
    out = json.loads(done.output)
    calibrated = out["calibrated"]
    assert (calibrated["labeled"], calibrated["unlabeled"]) == (150, 1850)
    assert calibrated["judge_only"]["mean"] == pytest.approx(out["mean_difference"])
    expected = calibrated_difference(human_a[chosen], human_b[chosen], judge_a[chosen],
                                     judge_b[chosen], np.delete(judge_a, chosen),
                                     np.delete(judge_b, chosen))
    assert calibrated == json.loads(json.dumps(expected.to_dict()))
    assert calibrated["human_only"]["mean"] == 0  # the same human labels: no difference
    text = cli("compare", results_a, results_b, "--bootstrap", "100",
               "--human", "human", "--data", data_a, "--data", data_b)
    assert "human score B - A" in text.output and "calibrated (PPI++)" in text.output
    one = cli("compare", results_a, results_b, "--human", "human", "--data", data_a)
    assert one.exit_code == 2 and "one dataset of labels per results file (2), got 1" in one.output
    unnamed = cli("compare", results_a, results_b, "--data", data_a, "--data", data_b)
    assert unnamed.exit_code == 2 and "--human" in unnamed.output


def test_the_report_opens_with_the_judge_check_and_draws_the_three_estimates(tmp_path):
    import json

    import msgspec
    from conftest import cli

    from grader.analysis.verdict import ControlScores, judge_verdict

    results, data, human, judge, chosen = _graded(tmp_path, rows=600, labeled=100)
    # a judge that ties every control: NO SIGNAL, as SmolLM2's check says on the demo
    check = judge_verdict([ControlScores(4, 4, 4, 3)] * 12)
    assert check.verdict == "no signal"
    (tmp_path / "results.summary.json").write_bytes(
        msgspec.json.encode({"rows": 600, "judge_check": check}))
    page = tmp_path / "page.html"
    done = cli("report", results, "-o", page, "--human", "human", "--data", data)
    assert done.exit_code == 0, done.output
    html = page.read_text(encoding="utf-8")
    verdict = html.index("judge check: NO SIGNAL")
    assert verdict < html.index("<nav>") < html.index("mean score (ok rows)")
    section = html[html.index("<section id='calibration'>"):]
    section = section[:section.index("</section>")]
    api = calibrated_mean(human[chosen], judge[chosen], np.delete(judge, chosen))
    assert api.interval is not None
    assert f"with 100 labels the mean is {api.mean:.2f}" in section
    assert f"[{api.interval[0]:.2f}, {api.interval[1]:.2f}]" in section
    assert section.count("<img class='chart'") == 1
    assert "judge only" in section and "labels only" in section
    assert "random sample of the graded ones" in section

    # no judge check in the summary: the page says so first, and no calibration section
    (tmp_path / "results.summary.json").write_text(json.dumps({"rows": 600}), encoding="utf-8")
    assert cli("report", results, "-o", page).exit_code == 0
    html = page.read_text(encoding="utf-8")
    assert html.index("judge check: not in the summary") < html.index("<nav>")
    assert "id='calibration'" not in html


def test_the_fallback_is_decided_on_the_rows_the_judge_graded_not_a_rules_zeros():
    # A judge that reads nothing (its scores unrelated to the humans') beside rows without an
    # answer, which the seed's rule scores 0 and a human scores 0 too: over every labeled row
    # the correlation looks useful; over the judge's own rows it is what it is, nothing.
    rng = np.random.default_rng(3)
    human = np.concatenate([rng.integers(2, 6, 20), np.zeros(4)]).astype(float)
    judge = np.concatenate([rng.integers(2, 6, 20), np.zeros(4)]).astype(float)
    judged = np.arange(24) < 20
    others = rng.integers(0, 6, 200).astype(float)
    assert calibrated_mean(human, judge, others).fallback is None  # the zeros alone carry r
    own = calibrated_mean(human, judge, others, judged=judged)
    assert own.fallback is not None and "the 20 labeled rows the judge graded" in own.fallback
    assert own.mean == own.human_only.mean and own.labeled == 24


def test_agree_says_its_correlation_is_over_the_labeled_rows_the_judge_graded(tmp_path):
    # Rows the seed's rule scored 0 (no context to grade), which a human scores 0 too: agree's
    # table counts them in its Pearson r; the calibration's correlation leaves them out, and
    # its line says over how many rows it is, so the two numbers are not read as one.
    import json

    from conftest import cli

    rng = np.random.default_rng(5)
    results, data = tmp_path / "results.jsonl", tmp_path / "labels.jsonl"
    with open(results, "w", encoding="utf-8") as out, open(data, "w", encoding="utf-8") as lab:
        for i in range(60):
            rule = i < 4
            score = 0 if rule else int(rng.integers(2, 6))
            out.write(json.dumps({"id": f"r{i}", "status": "missing_context" if rule else "ok",
                                  "score": score}) + "\n")
            human = 0 if rule else int(rng.integers(2, 6))
            lab.write(json.dumps({"id": f"r{i}", "input": "q", "reference": "r",
                                  "output_text": "a", "human": human if i < 30 else ""}) + "\n")
    done = cli("agree", results, "--human", "human", "--data", data, "--bootstrap", "100", "--json")
    assert done.exit_code == 0, done.output
    calibrated = json.loads(done.output)["calibrated"]
    assert (calibrated["labeled"], calibrated["correlation_rows"]) == (30, 26)
    text = cli("agree", results, "--human", "human", "--data", data, "--bootstrap", "100")
    assert text.exit_code == 0, text.output
    r = f"{calibrated['correlation']:.3f}"
    assert f"correlation judge-human {r} (on the 26 labeled rows the judge graded)" in text.output
