"""Judge-human agreement: every statistic against a hand-written formula, the join, the intervals."""

from __future__ import annotations

import json
import math
import warnings
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest
from conftest import EXAMPLES

from grader.analysis.agreement import (
    STATISTICS,
    AgreementError,
    agreement,
    contingency_table,
    format_agreement,
    read_label,
    table_statistics,
)
from grader.errors import EXIT_BAD_INPUT
from grader.records import ResultsError

# Small fixed data with ties on both sides, a disagreement of 2 and one of 3.
HUMAN = [5, 3, 4, 0, 2, 5, 1, 3, 4, 2, 0, 5]
JUDGE = [4, 3, 4, 1, 2, 5, 2, 2, 5, 2, 0, 2]


def write_results(path, rows):
    """rows: dicts merged into {"id", "status": "ok"} records."""
    with open(path, "w", encoding="utf-8") as stream:
        for row in rows:
            stream.write(json.dumps({"status": "ok", **row}) + "\n")
    return path


def labelled_results(path, human=HUMAN, judge=JUDGE):
    return write_results(
        path, [{"id": i, "score": j, "label": h} for i, (h, j) in enumerate(zip(human, judge))]
    )


# --- independent formulas ---------------------------------------------------------------------


def exact(h, j):
    return Fraction(sum(a == b for a, b in zip(h, j)), len(h))


def within_one(h, j):
    return Fraction(sum(abs(a - b) <= 1 for a, b in zip(h, j)), len(h))


def quadratic_kappa(h, j):
    """1 - sum(w * O) / sum(w * E), w = (i - k)^2 / 25, O observed and E chance proportions."""
    n = len(h)
    observed = [[Fraction(0)] * 6 for _ in range(6)]
    for a, b in zip(h, j):
        observed[a][b] += Fraction(1, n)
    rows = [sum(observed[i]) for i in range(6)]
    cols = [sum(observed[i][k] for i in range(6)) for k in range(6)]
    weight = [[Fraction((i - k) ** 2, 25) for k in range(6)] for i in range(6)]
    o = sum(weight[i][k] * observed[i][k] for i in range(6) for k in range(6))
    e = sum(weight[i][k] * rows[i] * cols[k] for i in range(6) for k in range(6))
    return 1 - o / e


def pearson(x, y):
    n = len(x)
    mx, my = sum(x) / n, sum(y) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(x, y))
    return cov / math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))


def average_ranks(x):
    """1-based ranks, ties sharing the mean of the ranks they span."""
    return [sum(v < a for v in x) + (sum(v == a for v in x) + 1) / 2 for a in x]


def spearman(x, y):
    return pearson(average_ranks(x), average_ranks(y))


def kendall_tau_b(x, y):
    concordant = discordant = tied_x = tied_y = 0
    for i, k in combinations(range(len(x)), 2):
        dx, dy = x[i] - x[k], y[i] - y[k]
        if dx == 0:
            tied_x += 1
        if dy == 0:
            tied_y += 1
        if dx * dy > 0:
            concordant += 1
        elif dx * dy < 0:
            discordant += 1
    pairs = len(x) * (len(x) - 1) // 2
    return (concordant - discordant) / math.sqrt((pairs - tied_x) * (pairs - tied_y))


def krippendorff_ordinal(h, j):
    """Krippendorff (2011), two coders, no missing values: alpha = 1 - (N - 1) D_o / D_e with
    the coincidence matrix counted pair by pair and the ordinal metric over value counts."""
    coincidence = [[0] * 6 for _ in range(6)]
    for a, b in zip(h, j):  # each unit holds the ordered pairs (a, b) and (b, a)
        coincidence[a][b] += 1
        coincidence[b][a] += 1
    counts = [sum(row) for row in coincidence]
    total = sum(counts)

    def delta(c, k):
        low, high = min(c, k), max(c, k)
        return Fraction(sum(counts[low : high + 1])) - Fraction(counts[c] + counts[k], 2)

    d_o = sum(coincidence[c][k] * delta(c, k) ** 2 for c in range(6) for k in range(6))
    d_e = sum(counts[c] * counts[k] * delta(c, k) ** 2 for c in range(6) for k in range(6))
    return 1 - (total - 1) * d_o / d_e


def library_statistics(human: np.ndarray, judge: np.ndarray) -> dict[str, float]:
    """The statistics from the reference implementations (dev dependencies, not grader's)."""
    import krippendorff
    from scipy import stats
    from sklearn.metrics import cohen_kappa_score

    nan = float("nan")
    out = {name: nan for name in STATISTICS}
    if len(human) == 0:
        return out
    out["exact_agreement"] = float(np.mean(human == judge))
    out["within_one"] = float(np.mean(np.abs(human - judge) <= 1))
    out["mean_human"] = float(np.mean(human))
    out["mean_judge"] = float(np.mean(judge))
    out["mean_difference"] = float(np.mean(judge - human))
    # The libraries warn and return NaN on constant input.
    with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
        warnings.simplefilter("ignore")
        out["quadratic_weighted_kappa"] = float(
            cohen_kappa_score(human, judge, weights="quadratic", labels=list(range(6)))
        )
        if len(human) > 1 and len(set(human)) > 1 and len(set(judge)) > 1:
            out["spearman"] = float(stats.spearmanr(human, judge).statistic)
            out["kendall"] = float(stats.kendalltau(human, judge).statistic)  # tau-b
            out["pearson"] = float(stats.pearsonr(human, judge).statistic)
        if len(set(human) | set(judge)) > 1:
            out["krippendorff_alpha"] = float(
                krippendorff.alpha(
                    reliability_data=np.vstack([human, judge]),
                    level_of_measurement="ordinal",
                    value_domain=list(range(6)),
                )
            )
    return out


# --- tests --------------------------------------------------------------------------------------


def test_statistics_match_their_definitions(tmp_path):
    result = agreement(labelled_results(tmp_path / "r.jsonl"), "label", bootstrap=0)
    assert result["n"] == len(HUMAN)
    assert result["exact_agreement"] == pytest.approx(float(exact(HUMAN, JUDGE)))
    assert result["within_one"] == pytest.approx(float(within_one(HUMAN, JUDGE)))
    assert result["quadratic_weighted_kappa"] == pytest.approx(float(quadratic_kappa(HUMAN, JUDGE)))
    assert result["pearson"] == pytest.approx(pearson(HUMAN, JUDGE))
    assert result["spearman"] == pytest.approx(spearman(HUMAN, JUDGE))
    assert result["kendall"] == pytest.approx(kendall_tau_b(HUMAN, JUDGE))
    assert result["krippendorff_alpha"] == pytest.approx(float(krippendorff_ordinal(HUMAN, JUDGE)))
    assert result["mean_human"] == pytest.approx(sum(HUMAN) / len(HUMAN))
    assert result["mean_judge"] == pytest.approx(sum(JUDGE) / len(JUDGE))
    assert result["mean_difference"] == pytest.approx((sum(JUDGE) - sum(HUMAN)) / len(HUMAN))
    # the values are not accidentally trivial
    assert 0 < result["exact_agreement"] < result["within_one"] < 1
    assert result["spearman"] != pytest.approx(result["pearson"])


def test_krippendorff_alpha_by_hand():
    # Units (0, 0), (1, 2), (2, 2). Coincidences o00 = 2, o12 = o21 = 1, o22 = 2; value counts
    # n0 = 2, n1 = 1, n2 = 3, N = 6. Ordinal delta^2: (0,1) = (3 - 3/2)^2 = 9/4,
    # (1,2) = (4 - 4/2)^2 = 4, (0,2) = (6 - 5/2)^2 = 49/4. D_o = 2 * 4 = 8;
    # D_e = 2 * (2*1*9/4 + 1*3*4 + 2*3*49/4) = 180. alpha = 1 - 5 * 8 / 180 = 7/9.
    human, judge = [0, 1, 2], [0, 2, 2]
    assert krippendorff_ordinal(human, judge) == Fraction(7, 9)
    stats = library_statistics(np.array(human), np.array(judge))
    assert stats["krippendorff_alpha"] == pytest.approx(7 / 9)
    assert float(table_statistics(contingency_table(np.array(human), np.array(judge)))["krippendorff_alpha"]) == (
        pytest.approx(7 / 9)
    )


def test_confusion_matrix_rows_are_human_columns_judge(tmp_path):
    result = agreement(labelled_results(tmp_path / "r.jsonl", [1, 1, 4], [3, 1, 0]), "label", bootstrap=0)
    matrix = result["confusion_matrix"]
    assert len(matrix) == 6 and all(len(row) == 6 for row in matrix)
    assert matrix[1][3] == 1 and matrix[1][1] == 1 and matrix[4][0] == 1
    assert sum(map(sum, matrix)) == 3


def test_join_from_the_dataset(tmp_path):
    human = {}
    for line in (EXAMPLES / "qa.jsonl").read_text("utf-8").splitlines():
        row = json.loads(line)
        human[row["id"]] = row["human_score"]
    ids = sorted(human)
    assert ids[0] == "q01" and ids[-1] == "q24"
    rows = []
    for number, row_id in enumerate(ids):
        if number == 0:
            rows.append({"id": row_id, "status": "invalid_counts", "score": None})
        elif number == 1:
            rows.append({"id": row_id, "status": "missing_context", "score": 0})
        else:
            rows.append({"id": row_id, "score": (human[row_id] + number % 3 - 1) % 6})
    rows.append({"id": "q99", "score": 3})  # not in the dataset
    results = write_results(tmp_path / "r.jsonl", rows)

    result = agreement(results, "human_score", data=str(EXAMPLES / "qa.jsonl"), bootstrap=0)
    used = [r for r in rows if r["score"] is not None and r["id"] in human]
    h = [human[r["id"]] for r in used]
    j = [r["score"] for r in used]
    assert result["n"] == 23
    assert result["statuses"] == {"ok": 22, "missing_context": 1}
    assert result["excluded"] == {
        "rows": 2, "null_judge_score": 1, "invalid_judge_score": 0, "not_in_data": 1,
        "missing_human_label": 0, "invalid_human_label": 0,
    }
    assert result["data_rows_without_result"] == 0
    assert result["human_source"] == str(EXAMPLES / "qa.jsonl")
    assert result["exact_agreement"] == pytest.approx(float(exact(h, j)))
    assert result["quadratic_weighted_kappa"] == pytest.approx(float(quadratic_kappa(h, j)))
    assert result["kendall"] == pytest.approx(kendall_tau_b(h, j))


def test_dataset_ids_and_labels_read_as_grading_reads_them(tmp_path):
    # CSV cells are text: "4" and "4.0" are labels, "", "x", "7" and "2.5" are not.
    data = tmp_path / "data.csv"
    data.write_text(
        "qid,answer,reference,label\n"
        "a,x,y,4\nb,x,y,4.0\nc,x,y,\nd,x,y,x\ne,x,y,7\nf,x,y,2.5\ng,x,y,1\nh,x,y,3\n",
        encoding="utf-8",
    )
    results = write_results(
        tmp_path / "r.jsonl", [{"id": i, "score": 3} for i in "abcdefgh"[:-1]]
    )
    result = agreement(
        results, "label", data=str(data), mapping={"output_text": "answer"}, id_column="qid",
        bootstrap=0,
    )
    assert result["n"] == 3
    assert result["excluded"]["missing_human_label"] == 1
    assert result["excluded"]["invalid_human_label"] == 3
    assert result["data_rows_without_result"] == 1  # h was never graded
    assert result["confusion_matrix"][4][3] == 2 and result["confusion_matrix"][1][3] == 1

    # without an id column, grading's ids are the 0-based row numbers
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({"label": v}) + "\n" for v in (2, 5, 0)), encoding="utf-8")
    results = write_results(tmp_path / "r2.jsonl", [{"id": i, "score": 2} for i in range(3)])
    result = agreement(results, "label", data=str(plain), bootstrap=0)
    assert result["n"] == 3 and result["exact_agreement"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (4, (4, None)), (0, (0, None)), (4.0, (4, None)), ("4", (4, None)), (" 5.0 ", (5, None)),
        (None, (None, "missing")), (float("nan"), (None, "missing")), ("  ", (None, "missing")),
        (6, (None, "invalid")), (-1, (None, "invalid")), (2.5, (None, "invalid")),
        ("four", (None, "invalid")), (True, (None, "invalid")), ([3], (None, "invalid")),
    ],
)
def test_read_label(value, expected):
    assert read_label(value) == expected


def test_excluded_rows_are_counted_once_each(tmp_path):
    rows = [
        {"id": 1, "score": 3, "label": 3},
        {"id": 2, "score": 4, "label": 2},
        {"id": 3, "status": "truncated", "score": None, "label": 3},
        {"id": 4, "status": "engine_error", "label": "bad"},  # no score field at all
        {"id": 5, "score": 3.5, "label": 3},
        {"id": 6, "score": 3},  # no label
        {"id": 7, "score": 3, "label": None},
        {"id": 8, "score": 3, "label": "six"},
        {"id": 9, "score": 3, "label": 9},
        {"id": 10, "status": "ambiguous", "score": 0, "label": "0"},
    ]
    result = agreement(write_results(tmp_path / "r.jsonl", rows), "label", bootstrap=0)
    assert result["rows"] == 10 and result["n"] == 3
    assert result["statuses"] == {"ok": 2, "ambiguous": 1}
    assert result["excluded"] == {
        "rows": 7, "null_judge_score": 2, "invalid_judge_score": 1, "not_in_data": 0,
        "missing_human_label": 2, "invalid_human_label": 2,
    }


def test_intervals_contain_the_estimates_and_repeat_with_the_seed(tmp_path):
    human = HUMAN * 3
    judge = JUDGE * 3
    results = labelled_results(tmp_path / "r.jsonl", human, judge)
    first = agreement(results, "label", bootstrap=400, seed=7)
    again = agreement(results, "label", bootstrap=400, seed=7)
    other = agreement(results, "label", bootstrap=400, seed=8)
    assert first == again
    assert first["intervals"] != other["intervals"]
    assert set(first["intervals"]) == set(STATISTICS)
    for name in STATISTICS:
        low, high = first["intervals"][name]
        assert low <= first[name] <= high, name
        assert low < high, name
    assert first["bootstrap"]["resamples"] == 400
    assert all(0 < count <= 400 for count in first["bootstrap"]["valid"].values())
    assert first["bootstrap"]["valid"]["exact_agreement"] == 400
    # a wider confidence gives a wider interval, from the same resamples
    wide = agreement(results, "label", bootstrap=400, seed=7, confidence=0.99)
    low, high = first["intervals"]["quadratic_weighted_kappa"]
    wide_low, wide_high = wide["intervals"]["quadratic_weighted_kappa"]
    assert wide_low <= low and high <= wide_high


def test_constant_judge_scores_leave_correlations_undefined(tmp_path):
    results = labelled_results(tmp_path / "r.jsonl", HUMAN, [3] * len(HUMAN))
    result = agreement(results, "label", bootstrap=200)
    text = json.dumps(result, allow_nan=False)  # what --json prints: no NaN anywhere
    assert json.loads(text) == result
    for name in ("spearman", "kendall", "pearson"):
        assert result[name] is None
        assert result["intervals"][name] is None
        assert result["bootstrap"]["valid"][name] == 0
    assert any("judge's scores are all 3" in note for note in result["notes"])
    # kappa and alpha stay defined: the human labels vary
    assert result["quadratic_weighted_kappa"] == pytest.approx(float(quadratic_kappa(HUMAN, [3] * 12)))
    assert result["krippendorff_alpha"] is not None


def test_identical_constant_labels_leave_chance_corrected_statistics_undefined(tmp_path):
    result = agreement(labelled_results(tmp_path / "r.jsonl", [2] * 5, [2] * 5), "label", bootstrap=50)
    assert result["exact_agreement"] == 1.0
    for name in ("quadratic_weighted_kappa", "krippendorff_alpha", "spearman", "kendall", "pearson"):
        assert result[name] is None
    assert len(result["notes"]) == 3
    json.dumps(result, allow_nan=False)


def test_a_results_file_without_scores_is_refused_in_one_line(tmp_path):
    results = write_results(tmp_path / "r.jsonl", [{"id": 1, "score": None, "label": 3}])
    with pytest.raises(AgreementError, match="no record has a judge score 0-5") as raised:
        agreement(results, "label", bootstrap=100)
    assert raised.value.exit_code == EXIT_BAD_INPUT


def test_no_usable_rows(tmp_path):
    # scores, but no row with a human label 0-5 beside one
    results = write_results(tmp_path / "r.jsonl", [{"id": 1, "score": 3, "label": None},
                                                  {"id": 2, "score": None, "label": 3}])
    result = agreement(results, "label", bootstrap=100)
    assert result["n"] == 0
    assert all(result[name] is None for name in STATISTICS)
    assert all(interval is None for interval in result["intervals"].values())
    assert result["notes"] == ["no row has both a judge score and a human label 0-5: no statistic"]
    json.dumps(result, allow_nan=False)
    assert "compared (n)" in format_agreement(result)


def test_bad_inputs(tmp_path):
    results = write_results(tmp_path / "r.jsonl", [{"id": 1, "score": 3}])
    with pytest.raises(AgreementError, match="no record has a 'label' field"):
        agreement(results, "label")
    with pytest.raises(ResultsError, match="cannot read the file"):
        agreement(tmp_path / "missing.jsonl", "label")
    duplicate = write_results(tmp_path / "d.jsonl", [{"id": 1, "score": 3, "label": 3}] * 2)
    with pytest.raises(ResultsError, match="d.jsonl:2: duplicate id 1"):
        agreement(duplicate, "label")
    with pytest.raises(ValueError, match="no column 'nope'"):
        agreement(results, "nope", data=str(EXAMPLES / "qa.jsonl"))
    with pytest.raises(ValueError, match="confidence"):
        agreement(results, "label", confidence=95)


def test_statistics_match_the_libraries(tmp_path):
    """grader's statistics give scipy's, sklearn's and krippendorff's values, NaN (None in the
    output) where they give NaN: on random tables, and through agreement() on a file."""
    rng = np.random.default_rng(3)
    for trial in range(120):
        n = int(rng.integers(1, 30))
        human = rng.integers(0, int(rng.integers(1, 7)), n)
        judge = np.clip(human + rng.integers(-2, 3, n), 0, 5)
        if trial % 5 == 0:
            judge = np.full(n, int(rng.integers(0, 6)))
        if trial % 7 == 0:
            human = judge.copy()
        library = library_statistics(human, judge)
        table = table_statistics(contingency_table(human, judge))
        for name in STATISTICS:
            assert math.isnan(library[name]) == math.isnan(table[name]), (name, human, judge)
            if not math.isnan(library[name]):
                assert float(table[name]) == pytest.approx(library[name], abs=1e-12), name
    human = rng.integers(0, 6, 500)
    judge = np.clip(human + rng.integers(-2, 3, 500), 0, 5)
    result = agreement(labelled_results(tmp_path / "r.jsonl", human.tolist(), judge.tolist()),
                       "label", bootstrap=0)
    library = library_statistics(human, judge)
    for name in STATISTICS:
        assert result[name] == pytest.approx(library[name], abs=1e-12), name


def test_format_agreement(tmp_path):
    result = agreement(labelled_results(tmp_path / "r.jsonl"), "label", bootstrap=200)
    text = format_agreement(result)
    assert "kappa (quadratic)" in text and "Krippendorff alpha (ordinal)" in text
    assert "95% interval" in text and "200 resamples" in text
    assert "confusion matrix: rows human, columns judge" in text
    low, high = result["intervals"]["pearson"]
    assert f"[{low:.3f}, {high:.3f}]" in text
    row = next(line for line in text.splitlines() if line.startswith("human 0"))
    assert row.split() == ["human", "0", "1", "1", "0", "0", "0", "0"]
