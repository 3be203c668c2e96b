"""grader rank: Bradley-Terry, bootstrap intervals, counts, length control,
bad input, the page."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import cli

from grader.analysis.rank import Game, outcomes_from_pairwise, rank_games
from grader.io.results import read_records


def write_results(path, scores, status=None, fmt="rubric", texts=None):
    """A results file: one record a row, ``scores[i]`` the score of row ``r{i}`` (None: a
    parse_error with no score)."""
    with open(path, "w", encoding="utf-8") as out:
        for i, score in enumerate(scores):
            record = {"id": f"r{i}", "status": "ok" if score is not None else "parse_error",
                      "score": score, "format": fmt}
            if texts is not None:
                record["output_text"] = texts[i]
            out.write(json.dumps(record) + "\n")
    return path


def rank_json(*args):
    result = cli("rank", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)  # the bootstrap's bar is on stderr


def test_bradley_terry_true_order_and_a_planted_tie(tmp_path):
    """Four scripted models: best > (tie_a = tie_b) > worst. The fit puts them in that order,
    and the two tied models' intervals each cover the other's rating."""
    rng = np.random.default_rng(7)
    rows = 120
    plans = {"best": (2, 6), "tie_a": (1, 5), "tie_b": (1, 5), "worst": (0, 4)}
    paths = []
    for name, (low, high) in plans.items():
        paths.append(write_results(tmp_path / f"{name}.jsonl", rng.integers(low, high, rows).tolist()))
    result = rank_json(*paths, "--rounds", 300)
    board = result["leaderboard"]
    order = [e["model"] for e in board]
    assert order[0] == "best" and order[-1] == "worst" and set(order[1:3]) == {"tie_a", "tie_b"}
    ratings = {e["model"]: e["rating"] for e in board}
    intervals = {e["model"]: e["interval"] for e in board}
    for a, b in (("tie_a", "tie_b"), ("tie_b", "tie_a")):
        assert intervals[a][0] <= ratings[b] <= intervals[a][1]
    assert intervals["best"][0] > intervals["worst"][1]  # the true gap is established
    assert any("tie_a and tie_b" in n or "tie_b and tie_a" in n for n in result["notes"])
    assert result["bootstrap"]["rounds"] == 300
    # seeded: the same figures again
    assert rank_json(*paths, "--rounds", 300)["leaderboard"] == board


def test_win_tie_loss_counts_and_win_rate(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [5, 3, 2, 4])
    b = write_results(tmp_path / "b.jsonl", [4, 3, 3, 4])
    c = write_results(tmp_path / "c.jsonl", [1, 1, 1, 5])
    result = rank_json(a, b, c, "--rounds", 0)
    pairs = {(p["a"], p["b"]): (p["wins_a"], p["ties"], p["wins_b"]) for p in result["pairs"]}
    assert pairs == {("a", "b"): (1, 2, 1), ("a", "c"): (3, 0, 1), ("b", "c"): (3, 0, 1)}
    models = {e["model"]: e for e in result["leaderboard"]}
    assert (models["a"]["wins"], models["a"]["ties"], models["a"]["losses"]) == (4, 2, 2)
    assert (models["c"]["wins"], models["c"]["ties"], models["c"]["losses"]) == (2, 0, 6)
    assert models["a"]["win_rate"] == pytest.approx((4 + 2 / 2) / 8)
    assert models["c"]["win_rate"] == pytest.approx(2 / 8)
    assert models["a"]["mean_score"] == pytest.approx(3.5)
    assert models["a"]["interval"] is None  # --rounds 0: no intervals
    text = cli("rank", a, b, c, "--rounds", 0).output
    assert "a - b 1/2/1" in text and "4 / 2 / 2" in text


def test_rows_missing_in_one_file_are_named(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [5, 3, 2, 4])
    b = write_results(tmp_path / "b.jsonl", [4, 3, 3])
    result = cli("rank", a, b)
    assert result.exit_code == 2
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in message
    assert "are over different rows: they share 3" in message and "1 only in" in message
    assert "(r3)" in message and str(a) in message


def test_failed_rows_are_counted_and_named(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [5, 3, None, 4])
    b = write_results(tmp_path / "b.jsonl", [4, 3, 3, 4])
    c = write_results(tmp_path / "c.jsonl", [4, 2, 3, 1])
    result = rank_json(a, b, c, "--rounds", 0)
    assert result["rows"]["scored_by_every_file"] == 3
    assert result["rows"]["incomplete"] == {"r2": {"a": "parse_error"}}
    # r2's b - c game still plays: 4 rows x 3 pairs, less a's two games on r2
    assert result["games"] == 10
    text = cli("rank", a, b, c, "--rounds", 0).output
    assert "not scored: r2: a parse_error" in text
    assert "1 rows are not scored by every file" in text


def test_many_failed_rows_are_counted_past_the_named(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [None] * 12 + [3])
    b = write_results(tmp_path / "b.jsonl", [4] * 13)
    result = rank_json(a, b, "--rounds", 0)
    assert len(result["rows"]["incomplete"]) == 12 and result["games"] == 1
    text = cli("rank", a, b, "--rounds", 0).output
    assert text.count("not scored: ") == 10 and "... and 2 more (--json lists every one)" in text
    assert "12 rows are not scored by every file" in text and "r0, r1," in text


@pytest.mark.parametrize("args, words", [
    (("--name", "x", "--name", "x"), "have the same model name 'x'"),
    (("--name", "x"), "--name is given 1 times for 2 results files"),
])
def test_same_name_and_name_count_refused(tmp_path, args, words):
    a = write_results(tmp_path / "a.jsonl", [5, 3])
    b = write_results(tmp_path / "b.jsonl", [4, 3])
    result = cli("rank", a, b, *args)
    assert result.exit_code == 2 and words in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_same_file_name_in_two_folders_refused(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    a = write_results(tmp_path / "one" / "model.jsonl", [5, 3])
    b = write_results(tmp_path / "two" / "model.jsonl", [4, 3])
    result = cli("rank", a, b)
    assert result.exit_code == 2 and "same model name 'model'" in result.output


def test_fewer_than_two_files_and_other_formats_refused(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [5, 3])
    one = cli("rank", a)
    assert one.exit_code == 2 and "at least 2 results files" in one.output
    none = cli("rank")
    assert none.exit_code == 2 and "got 0" in none.output
    b = write_results(tmp_path / "b.jsonl", [4, 3], fmt="seed")
    other = cli("rank", a, b)
    assert other.exit_code == 2 and "different formats" in other.output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    nothing = cli("rank", a, empty)
    assert nothing.exit_code == 2 and nothing.output == f"error: {empty}: no records: a results " \
        "file of no row has no model to rank\n"


def planted_length_games():
    """``long`` is only longer: on rows of equal length ``short`` wins 15 of 20; on rows where
    ``long``'s answer is longer, ``long`` wins 35 of 40 (a judge that likes length)."""
    games = []
    for i in range(20):
        games.append(Game(f"e{i}", "long", "short", 0.0 if i < 15 else 1.0, 500, 500))
    for i in range(40):
        games.append(Game(f"l{i}", "long", "short", 1.0 if i < 35 else 0.0, 900 + i, 400))
    return games


def test_length_control_reverses_a_model_that_is_only_longer():
    games = planted_length_games()
    result = rank_games(games, ["long", "short"], rounds=200, length_controlled=True)
    board = result["leaderboard"]
    assert [e["model"] for e in board] == ["short", "long"]  # controlled: short first
    by = {e["model"]: e for e in board}
    assert by["long"]["rating"] > by["short"]["rating"]  # uncorrected: long first
    assert by["long"]["win_rate"] == pytest.approx(40 / 60)
    assert by["short"]["lc_win_rate"] > 0.5 > by["long"]["lc_win_rate"]
    assert result["length"]["coefficient"] > 0  # the judge's taste for length, estimated
    plain = rank_games(games, ["long", "short"], rounds=0)
    assert [e["model"] for e in plain["leaderboard"]] == ["long", "short"]


def test_length_controlled_through_the_cli_needs_lengths(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [5, 3, 4])
    b = write_results(tmp_path / "b.jsonl", [4, 3, 2])
    refused = cli("rank", a, b, "--length-controlled")
    assert refused.exit_code == 2 and "--length-controlled needs each answer's length" in refused.output
    data = []
    for name, texts in (("a", ["x" * 50, "y" * 10, "z" * 30]), ("b", ["x", "y" * 10, "z"])):
        path = tmp_path / f"{name}.data.jsonl"
        path.write_text("".join(json.dumps({"id": f"r{i}", "reference": "r", "output_text": t}) + "\n"
                                for i, t in enumerate(texts)))
        data.append(path)
    result = rank_json(a, b, "--length-controlled", "--data", data[0], "--data", data[1],
                       "--rounds", 50)
    assert result["length_controlled"] and "lc_rating" in result["leaderboard"][0]
    text = cli("rank", a, b, "--length-controlled", "--data", data[0], "--data", data[1],
               "--rounds", 50).output
    assert "LC rating" in text and "rating" in text and "LC: length-controlled" in text


def test_html_page_renders(tmp_path):
    a = write_results(tmp_path / "a.jsonl", [5, 3, 2, 4, 5], texts=["aaaa", "b", "cc", "d", "e"])
    b = write_results(tmp_path / "b.jsonl", [4, 3, 3, 2, 1], texts=["a", "b", "c", "d", "e"])
    page = tmp_path / "rank.html"
    result = cli("rank", a, b, "--name", "<b>model</b>", "--name", "plain", "--rounds", 50,
                 "--length-controlled", "--html", page)
    assert result.exit_code == 0, result.output
    assert f"page: {page}" in result.output
    html = page.read_text(encoding="utf-8")
    assert "<h2>Leaderboard</h2>" in html and "<h2>Games per pair</h2>" in html
    assert html.count("src='data:image/png;base64,") == 2  # plain and length-controlled plots
    assert "&lt;b&gt;model&lt;/b&gt;" in html and "<b>model</b>" not in html
    assert "LC rating" in html


def test_pairwise_records_are_ranked(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [("x", "y", "A"), ("x", "y", "A"), ("x", "y", "tie"), ("y", "z", "A"),
            ("x", "z", "A"), ("y", "z", None)]
    path.write_text("".join(json.dumps(
        {"id": i, "status": "ok" if w else "parse_error", "winner": w, "model_a": a,
         "model_b": b, "format": "pairwise"}) + "\n" for i, (a, b, w) in enumerate(rows)))
    games, unusable = outcomes_from_pairwise(record for _, record in read_records(path))
    assert [(g.a, g.b, g.points) for g in games][:3] == [("x", "y", 1.0)] * 2 + [("x", "y", 0.5)]
    assert unusable == {5: "no winner (status parse_error)"}
    result = rank_json(path, "--rounds", 50)
    assert [e["model"] for e in result["leaderboard"]] == ["x", "y", "z"]
    assert result["source"] == "pairwise" and result["rows"]["games"] == 5
    text = cli("rank", path, "--rounds", 0).output
    assert "no game: 5: no winner (status parse_error)" in text
    assert "1 pairwise records have no winner" in text
    nameless = tmp_path / "nameless.jsonl"
    nameless.write_text(json.dumps({"id": 1, "status": "ok", "winner": "A", "format": "pairwise"}) + "\n")
    refused = cli("rank", nameless)
    assert refused.exit_code == 2 and "does not name two models" in refused.output
    named = cli("rank", path, "--name", "x")
    assert named.exit_code == 2 and "--name does not apply to pairwise results" in named.output


def test_fit_matches_hunters_mm_iteration():
    """The fit against an independent formula: Hunter's (2004) MM iteration for Bradley-Terry,
    p_i <- W_i / sum_j n_ij / (p_i + p_j), with a tie half a win each way."""
    outcomes = {("a", "b"): (7, 2, 3), ("a", "c"): (6, 1, 5), ("b", "c"): (4, 4, 4),
                ("a", "d"): (9, 0, 3), ("b", "d"): (5, 3, 4), ("c", "d"): (6, 2, 4)}
    games = []
    for (x, y), (wins, ties, losses) in outcomes.items():
        games += [Game(len(games) + i, x, y, 1.0) for i in range(wins)]
        games += [Game(len(games) + i, x, y, 0.5) for i in range(ties)]
        games += [Game(len(games) + i, x, y, 0.0) for i in range(losses)]
    models = ["a", "b", "c", "d"]
    fitted = rank_games(games, models, rounds=0)
    index = {m: i for i, m in enumerate(models)}
    won = np.zeros((4, 4))
    played = np.zeros((4, 4))
    for g in games:
        i, j = index[g.a], index[g.b]
        won[i, j] += g.points
        won[j, i] += 1 - g.points
        played[i, j] += 1
        played[j, i] += 1
    p = np.ones(4)
    for _ in range(5000):
        p = won.sum(1) / (played / (p[:, None] + p[None, :])).sum(1)
        p /= np.exp(np.log(p).mean())
    expected = 1000 + 400 / np.log(10) * np.log(p)
    got = {e["model"]: e["rating"] for e in fitted["leaderboard"]}
    for m in models:
        assert got[m] == pytest.approx(expected[index[m]], abs=0.5)


def test_three_results_files_of_qa_multi(tmp_path, capsys):
    """Three results files of examples/qa_multi.jsonl (made with no
    model by scripts/make_rank_example.py) get a leaderboard with intervals and a page."""
    import importlib.util

    from conftest import ROOT

    spec = importlib.util.spec_from_file_location("make_rank_example",
                                                  ROOT / "scripts" / "make_rank_example.py")
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(tmp_path)
    files = [tmp_path / "results" / f"{v}.jsonl" for v in ("original", "truncated", "dropped")]
    page = tmp_path / "rank.html"
    result = cli("rank", *files, "--rounds", 200, "--html", page)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[1].split()[:2] == ["1", "original"]  # the full answers first
    assert all(line.count("[") == 1 for line in lines[1:4])  # each with its interval
    assert "rows 21, scored by every file 21, games 63" in result.output
    assert "<h2>Leaderboard</h2>" in page.read_text(encoding="utf-8")
    # the answers' lengths from the datasets the runs recorded in their summaries, as --data
    recorded = rank_json(*files, "--rounds", 50, "--length-controlled")
    data = [a for v in ("original", "truncated", "dropped")
            for a in ("--data", tmp_path / "data" / f"{v}.jsonl")]
    assert recorded == rank_json(*files, "--rounds", 50, "--length-controlled", *data)
    assert recorded["length"]["coefficient"] > 0


def test_pairwise_results_of_grade_pair_are_ranked(tmp_path, monkeypatch):
    """rank reads pairwise results: three models' answers, judged two by two
    with ``grade --pair`` (a scripted judge that prefers the answer saying "good", wherever it
    is shown), give three pairwise results files that rank orders x > y > z."""
    from test_pairwise import ScriptedJudge, sound

    monkeypatch.setattr("grader.backends.load_backend",
                        lambda name, **options: ScriptedJudge(sound))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    good = {"x": lambda i: True, "y": lambda i: i % 2 == 0, "z": lambda i: False}
    answers = {}
    for name, says_good in good.items():
        answers[name] = tmp_path / f"{name}.jsonl"
        answers[name].write_text("".join(json.dumps(
            {"id": f"q{i}", "input": f"question {i}", "reference": f"reference {i}",
             "output_text": f"a {'good' if says_good(i) else 'poor'} answer {i} by {name}"}) + "\n"
            for i in range(12)))
    results = []
    for a, b in (("x", "y"), ("x", "z"), ("y", "z")):
        out = tmp_path / f"{a}-{b}.results.jsonl"
        graded = cli("grade", "--pair", answers[a], answers[b], "-m", model, "-o", out,
                     "--controls", 0)
        assert graded.exit_code == 0, graded.output
        results.append(out)
    result = rank_json(*results, "--rounds", 100)
    assert result["source"] == "pairwise" and result["rows"]["games"] == 36
    assert [e["model"] for e in result["leaderboard"]] == ["x", "y", "z"]
    pairs = {(p["a"], p["b"]): (p["wins_a"], p["ties"], p["wins_b"]) for p in result["pairs"]}
    assert pairs == {("x", "y"): (6, 6, 0), ("x", "z"): (12, 0, 0), ("y", "z"): (6, 6, 0)}
    # the length control reads the answers from the pairs each run recorded (NAME.pairs.jsonl)
    controlled = rank_json(*results, "--rounds", 20, "--length-controlled")
    assert controlled["length_controlled"] and "lc_rating" in controlled["leaderboard"][0]
    (tmp_path / "x-y.results.pairs.jsonl").unlink()
    refused = cli("rank", *results, "--length-controlled")
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1
    assert "x-y.results.jsonl: --length-controlled needs each answer's length: 12 rows have no " \
        "output_a and output_b" in refused.output


def test_the_fit_per_pair_equals_the_fit_per_game():
    """The plain fit sums the games per pair (a resample is two products); the length-
    controlled fit keeps every game. With every answer of one length the length term is 0,
    so both fits, point and bootstrap intervals, must give the same ratings."""
    rng = np.random.default_rng(3)
    models = ["a", "b", "c", "d"]
    games = [Game(row, x, y, float(rng.choice([0.0, 0.5, 1.0], p=[0.3 - i / 20, 0.3, 0.4 + i / 20])),
                  100, 100)
             for row in range(80) for i, x in enumerate(models) for y in models[i + 1:]]
    result = rank_games(games, models, rounds=100, length_controlled=True)
    for entry in result["leaderboard"]:
        assert entry["lc_rating"] == pytest.approx(entry["rating"], abs=1e-6)
        assert entry["lc_interval"] == pytest.approx(entry["interval"], abs=1e-6)
    assert result["length"]["coefficient"] == pytest.approx(0, abs=1e-9)


def test_the_length_controlled_fit_is_the_penalised_maximum_likelihood():
    """The length-controlled fit (summed by model index, never a games x models matrix) held
    to scipy's L-BFGS on the same loss written out as a dense logistic regression."""
    from scipy.optimize import minimize

    from grader.analysis.rank import RIDGE, SCALE

    games = planted_length_games() + [Game(f"m{i}", "mid", "short" if i % 2 else "long",
                                           [1.0, 0.5, 0.0][i % 3], 600 + 7 * i, 450 + 3 * i)
                                      for i in range(30)]
    models = ["long", "short", "mid"]
    result = rank_games(games, models, rounds=0, length_controlled=True)
    diff = np.array([g.length_a - g.length_b for g in games], dtype=float)
    matrix = np.zeros((len(games), 4))
    for i, g in enumerate(games):
        matrix[i, models.index(g.a)], matrix[i, models.index(g.b)] = 1.0, -1.0
    matrix[:, 3] = np.tanh(diff / diff.std())
    y = np.array([g.points for g in games])

    def loss(params):
        z = matrix @ params
        return np.sum(np.logaddexp(0, z) - y * z) + RIDGE * params @ params / 2

    fitted = minimize(loss, np.zeros(4), method="L-BFGS-B", options={"ftol": 1e-14, "gtol": 1e-10}).x
    fitted[:3] -= fitted[:3].mean()
    got = {e["model"]: e["lc_rating"] for e in result["leaderboard"]}
    for i, m in enumerate(models):
        assert got[m] == pytest.approx(1000 + SCALE * fitted[i], abs=0.05)
    assert result["length"]["coefficient"] == pytest.approx(fitted[3], abs=1e-4)


def test_rank_at_scale_shows_its_bootstrap_progress_on_stderr(tmp_path):
    """The bootstrap has a bar (stderr, as grade's), stdout stays the JSON,
    and the Python API's progress hook is told of every round (twice with the length
    control: two fits)."""
    from grader.analysis.rank import rank

    a = write_results(tmp_path / "a.jsonl", [5, 3, 2, 4, 1], texts=["aa", "b", "ccc", "d", "e"])
    b = write_results(tmp_path / "b.jsonl", [4, 3, 3, 2, 2], texts=["a", "bb", "c", "d", "ee"])
    result = cli("rank", a, b, "--rounds", 130, "--json")
    assert result.exit_code == 0, result.output
    assert "bootstrap" in result.stderr and "130/130" in result.stderr
    assert json.loads(result.stdout)["bootstrap"]["rounds"] == 130

    class Bar:
        def __init__(self, total):
            self.total, self.done, self.closed = total, 0, False

        def update(self, n=1):
            self.done += n

        def close(self):
            self.closed = True

    bars = []
    rank([a, b], rounds=150, length_controlled=True,
         progress=lambda total: bars.append(Bar(total)) or bars[-1])
    assert [(bar.total, bar.done, bar.closed) for bar in bars] == [(300, 300, True)]
    bars.clear()
    rank([a, b], rounds=0, progress=lambda total: bars.append(Bar(total)) or bars[-1])
    assert bars == []  # no bootstrap, no bar


def test_rank_from_score_tables_equals_rank_from_games(tmp_path):
    """Results files are ranked from their pair tables (no Game is made, a
    bootstrap round is a product of its row weights with the tables); the leaderboard, the
    intervals and the counts are the games' to rounding, failures and all."""
    from grader.analysis.rank import outcomes_from_scores

    rng = np.random.default_rng(11)
    models = ["m0", "m1", "m2", "m3", "m4"]
    scores = {m: [None if rng.random() < 0.05 else int(min(5, max(0, round(2 + i / 2 + rng.normal()))))
                  for _ in range(60)] for i, m in enumerate(models)}
    paths = [write_results(tmp_path / f"{m}.jsonl", scores[m]) for m in models]
    from_files = rank_json(*paths, "--rounds", 200, "--seed", 4)
    by_row = {m: {f"r{i}": (None if v is None else float(v)) for i, v in enumerate(s)}
              for m, s in scores.items()}
    from_games = rank_games(outcomes_from_scores(by_row), models, rounds=200, seed=4)
    assert from_files["games"] == from_games["games"]
    assert {(p["a"], p["b"], p["wins_a"], p["ties"], p["wins_b"]) for p in from_files["pairs"]} == \
        {(p["a"], p["b"], p["wins_a"], p["ties"], p["wins_b"]) for p in from_games["pairs"]}
    for x, y in zip(from_files["leaderboard"], from_games["leaderboard"], strict=True):
        assert x["model"] == y["model"] and x["place"] == y["place"]
        assert (x["wins"], x["ties"], x["losses"]) == (y["wins"], y["ties"], y["losses"])
        assert x["rating"] == pytest.approx(y["rating"], abs=1e-6)
        assert x["interval"] == pytest.approx(y["interval"], abs=1e-6)


@pytest.mark.parametrize("score, words", [
    (-3, "has the score -3, outside the rubric format's range 0-5"),
    (99, "has the score 99, outside the rubric format's range 0-5"),
    (1e308, "has the score 1e+308, outside the rubric format's range 0-5"),
    (float("nan"), "has the score nan (status ok): not a valid number"),
    (float("inf"), "has the score inf (status ok): not a valid number"),
])
def test_rank_refuses_impossible_scores(tmp_path, score, words):
    """A score no judge gives is refused with one line naming the file and
    line, never ranked (99 once came first, 1e308 printed as a 300-digit mean), and NaN or
    Infinity on an ok row is a corrupted record, not a failure status."""
    a = write_results(tmp_path / "a.jsonl", [5, 3, 4])
    lines = a.read_text().splitlines()
    record = json.loads(lines[1])
    record["score"] = score
    lines[1] = json.dumps(record)  # NaN and Infinity as Python's json writes them
    a.write_text("\n".join(lines) + "\n")
    b = write_results(tmp_path / "b.jsonl", [4, 3, 3])
    result = cli("rank", a, b)
    assert result.exit_code == 2
    assert result.output == f"error: {a}:2: row 'r1' {words}" + result.output.split(words)[1]
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_rank_keeps_another_tools_scale(tmp_path):
    """Another tool's records (no grader format) have their own scale: 99 ranks there; only a
    number that is no number is refused."""
    a = write_results(tmp_path / "a.jsonl", [99, 30, 40], fmt="their-tool")
    b = write_results(tmp_path / "b.jsonl", [40, 30, 50], fmt="their-tool")
    result = rank_json(a, b, "--rounds", 0)
    assert {e["model"]: e["wins"] for e in result["leaderboard"]} == {"a": 1, "b": 1}
