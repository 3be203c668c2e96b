"""The pairwise format (issue 30): two answers a row, each pair judged in both orders.

Scripted judges read the two answers they are shown and answer as a judge of a kind would: a
sound one picks the better answer wherever it stands, a position-biased one always picks the
answer shown first. The swap must catch the second (every pair a tie, consistency 0) and keep
the first's verdicts. The schema is pinned by tests/golden/schema_pairwise.json; regenerate it
with GRADER_UPDATE_GOLDEN=1 after an intended change and review the diff.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FakeBackend, make_request

from grader.backends import Completion
from grader.cli import main
from grader.config import SamplingConfig
from grader.errors import EXIT_BAD_INPUT
from grader.io.results import read_records, summary_path
from grader.judge.pairwise import game_record, pair_record, reconcile
from grader.judge.schema import format_max_chars, format_schema
from grader.records import PairwiseRecord
from grader.run.grading import run_grade
from grader.run.request import OptionError

GOLDEN = Path(__file__).parent / "golden" / "schema_pairwise.json"


def verdict(letter: str) -> str:
    """A pairwise answer as guided decoding writes it."""
    return json.dumps({"v": letter}, separators=(",", ":"))


def shown(conversation: list[dict]) -> tuple[str, str]:
    """The two answers a conversation shows, first and second (the prompt's delimiters)."""
    user = conversation[-1]["content"]
    first = user.split("<answer_a>\n", 1)[1].split("\n</answer_a>", 1)[0]
    second = user.split("<answer_b>\n", 1)[1].split("\n</answer_b>", 1)[0]
    return first, second


def sound(first: str, second: str) -> str:
    """A judge that prefers the answer saying "good", wherever it is shown."""
    if ("good" in first) == ("good" in second):
        return "tie"
    return "A" if "good" in first else "B"


def biased(first: str, second: str) -> str:
    """A judge that always prefers the answer shown first."""
    return "A"


class ScriptedJudge(FakeBackend):
    """A fake engine whose answer to each conversation is ``decide(first, second)`` on the two
    answers it shows; ``finish`` replaces the finish reason of the conversations it names."""

    supports_streaming = True  # as vLLM's backend: each row heard as it finishes

    def __init__(self, decide, *, chunk_size: int = 4, finish=None):
        super().__init__(chunk_size=chunk_size)
        self.decide, self.finish = decide, finish or {}

    def reply(self, conversations, schemas=None):
        self.calls.append([list(c) for c in conversations])
        self.schemas.append(schemas)
        return [Completion(verdict(self.decide(*shown(c))), self.finish.get(shown(c), "stop"), 10, 5)
                for c in conversations]


def _rows(n: int = 4, *, good_in: str = "ab") -> list[dict]:
    """Pairs whose better answer (it says "good") is A in even rows and B in odd ones, with
    ``good_in`` listing the columns that may hold it."""
    rows = []
    for i in range(n):
        good = "a" if i % 2 == 0 else "b"
        texts = {side: (f"a good answer {i}" if side == good and side in good_in
                        else f"a poor answer {i}") for side in "ab"}
        rows.append({"id": f"p{i}", "input": f"question {i}", "reference": f"reference {i}",
                     "output_a": texts["a"], "output_b": texts["b"],
                     "model_a": "left", "model_b": "right"})
    return rows


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _grade(tmp_path: Path, judge: FakeBackend, rows: list[dict] | None = None, **request):
    data = _write(tmp_path / "pairs.jsonl", _rows() if rows is None else rows)
    out = tmp_path / "r.jsonl"
    summary = run_grade(*make_request(data, out, format="pairwise", **request),
                        backend_factory=lambda name, **options: judge)
    return summary, [r for _, r in read_records(out)]


# ---------------------------------------------------------------- the schema and the rules


def test_schema_matches_golden_file():
    text = json.dumps(format_schema("pairwise"), indent=2, ensure_ascii=False) + "\n"
    if os.environ.get("GRADER_UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(text, encoding="utf-8")
    assert text == GOLDEN.read_text(encoding="utf-8")
    assert format_max_chars("pairwise") == len(verdict("tie"))


def test_the_cli_prints_the_schema():
    result = CliRunner().invoke(main, ["schema", "--format", "pairwise"])
    assert result.exit_code == 0 and json.loads(result.output) == format_schema("pairwise")


@pytest.mark.parametrize(
    ("first", "swapped", "verdicts", "winner"),
    [
        # the swapped game's letter is its own: its "B" is the row's A
        ("A", "B", ["A", "A"], "A"),
        ("B", "A", ["B", "B"], "B"),
        ("tie", "tie", ["tie", "tie"], "tie"),
        ("A", "A", ["A", "B"], "tie"),  # the answer shown first both times: position, a tie
        ("B", "B", ["B", "A"], "tie"),
        ("A", "tie", ["A", "tie"], "tie"),  # FastChat: a tie in either game is a tie
        ("tie", "A", ["tie", "B"], "tie"),
    ],
)
def test_two_games_are_reconciled_as_fastchat_does(first, swapped, verdicts, winner):
    games = [game_record("r", verdict(first), "stop"), game_record("r", verdict(swapped), "stop")]
    record = pair_record("r", games, "x", "y")
    assert (record.status, record.verdicts, record.winner) == ("ok", verdicts, winner)
    assert record.consistent is (verdicts[0] == verdicts[1])
    assert [g["verdict"] for g in record.games] == [first, swapped]  # as written
    assert [g["order"] for g in record.games] == ["AB", "BA"]
    assert (record.model_a, record.model_b) == ("x", "y")
    assert record.value == {"A": 1.0, "tie": 0.5, "B": 0.0}[winner]
    assert reconcile(*verdicts) == winner


@pytest.mark.parametrize(
    ("raw", "finish", "status"),
    [(verdict("A")[:-2], "length", "truncated"), ('{"v":"C"}', "stop", "parse_error"),
     ("", "stop", "parse_error")],
)
def test_a_game_without_a_verdict_gives_the_pair_its_status_and_no_winner(raw, finish, status):
    for games in ([game_record("r", raw, finish), game_record("r", verdict("B"), "stop")],
                  [game_record("r", verdict("B"), "stop"), game_record("r", raw, finish)]):
        record = pair_record("r", games)
        assert record.status == status and record.winner is None and record.consistent is None
        assert "shown first" in record.error
        # the other game's verdict is kept, never promoted to the pair's
        assert [g["status"] for g in record.games].count("ok") == 1


# ---------------------------------------------------------------- both orders, through a run


def test_each_pair_is_sent_in_both_orders_in_one_call(tmp_path):
    judge = ScriptedJudge(sound)
    summary, records = _grade(tmp_path, judge)
    assert [len(call) for call in judge.calls] == [8]  # 4 rows, 2 games each, one call
    conversations = judge.calls[0]
    for row in range(4):
        first, second = conversations[2 * row], conversations[2 * row + 1]
        assert shown(second) == shown(first)[::-1]
        # everything but the answers is the same prompt
        assert first[0] == second[0]
    assert summary["rows"] == 4 and [r.id for r in records] == ["p0", "p1", "p2", "p3"]


def test_the_progress_bar_counts_pairs_not_games(tmp_path):
    from grader.io.dataset import read_items
    from grader.judge.judges import make_judge
    from grader.run.ahead import Watch
    from grader.run.rows import grade_chunk, prepare_jobs

    data = _write(tmp_path / "pairs.jsonl", _rows(3))
    judge = make_judge(answer_format="pairwise")
    backend, ticks = ScriptedJudge(sound), []
    records = grade_chunk(prepare_jobs(str(data), read_items(str(data)), judge), backend, judge,
                          watch=Watch(progress=ticks.append))
    assert len(records) == 3 and sum(ticks) == 3  # 6 games finished: 3 rows


def test_a_sound_judges_verdict_survives_the_swap(tmp_path):
    summary, records = _grade(tmp_path, ScriptedJudge(sound))
    assert [r.winner for r in records] == ["A", "B", "A", "B"]
    assert all(r.consistent for r in records)
    assert [r.verdicts for r in records] == [["A", "A"], ["B", "B"]] * 2
    pairwise = summary["pairwise"]
    assert pairwise["winner"] == {"A": 2, "tie": 0, "B": 2}
    assert pairwise["position_consistency"]["rate"] == 1.0
    assert pairwise["first_position_win_rate"]["rate"] == 0.5  # half its wins were shown first
    assert (pairwise["model_a"], pairwise["model_b"]) == ("left", "right")
    lo, hi = pairwise["position_consistency"]["interval"]
    assert 0 < lo < 1 == hi


def test_a_position_biased_judge_is_caught_by_the_swap(tmp_path):
    summary, records = _grade(tmp_path, ScriptedJudge(biased))
    # every verdict flips with the order: the pair is a tie, whatever the answers
    assert [r.winner for r in records] == ["tie"] * 4
    assert [r.verdicts for r in records] == [["A", "B"]] * 4
    assert not any(r.consistent for r in records)
    pairwise = summary["pairwise"]
    assert pairwise["position_consistency"] | {"interval": None} == {
        "hits": 0, "of": 4, "rate": 0.0, "interval": None}
    assert pairwise["first_position_win_rate"]["rate"] == 1.0
    assert pairwise["first_position_win_rate"]["of"] == 8
    assert pairwise["a_win_rate"] == 0.5
    # the 95% interval of 8 of 8 excludes an unbiased judge's 50%
    assert pairwise["first_position_win_rate"]["interval"][0] > 0.5


def test_a_truncated_game_leaves_the_pair_truncated_never_decided_by_the_other(tmp_path):
    rows = _rows(2)
    # the swapped game of the first row is cut at max_tokens
    cut = (rows[0]["output_b"], rows[0]["output_a"])
    summary, records = _grade(tmp_path, ScriptedJudge(sound, finish={cut: "length"}), rows)
    assert [r.status for r in records] == ["truncated", "ok"]
    assert records[0].winner is None and records[0].verdicts == ["A", None]
    assert records[1].winner == "B"
    assert summary["statuses"]["truncated"] == 1 and summary["pairwise"]["pairs"] == 1


def test_an_engine_error_fails_both_games_and_a_rerun_retries_the_pairs(tmp_path):
    judge = FakeBackend([RuntimeError("CUDA out of memory")], chunk_size=2, default=verdict("A"))
    summary, records = _grade(tmp_path, judge)
    assert [r.status for r in records] == ["engine_error"] * 2 + ["ok"] * 2
    assert [len(call) for call in judge.calls] == [4, 4]  # 2 rows a chunk, 2 games a row
    again = ScriptedJudge(sound, chunk_size=2)
    summary, records = _grade(tmp_path, again)
    assert [len(call) for call in again.calls] == [4]  # only the failed pairs, both games
    assert [r.status for r in records] == ["ok"] * 4


def test_a_finished_run_resumes_without_a_model_and_a_torn_one_regrades_the_rest(tmp_path):
    out = tmp_path / "r.jsonl"
    _grade(tmp_path, ScriptedJudge(sound))
    full = out.read_bytes()
    idle = ScriptedJudge(sound)
    summary, _ = _grade(tmp_path, idle)
    assert idle.calls == [] and out.read_bytes() == full and summary["run"]["resumed_rows"] == 4
    # what a SIGKILL in the middle of the third write leaves
    lines = full.decode().splitlines(keepends=True)
    out.with_name(out.name + ".partial").write_text("".join(lines[:2]) + lines[2][:40])
    out.unlink()
    rest = ScriptedJudge(sound)
    summary, _ = _grade(tmp_path, rest)
    assert [len(call) for call in rest.calls] == [4]  # two pairs, two games each
    assert out.read_bytes() == full


def test_a_pair_missing_an_answer_is_missing_context_with_no_winner(tmp_path):
    rows = _rows(3)
    rows[1]["output_b"] = "   "
    del rows[2]["output_a"]
    judge = ScriptedJudge(sound)
    summary, records = _grade(tmp_path, judge, rows)
    assert [r.status for r in records] == ["ok", "missing_context", "missing_context"]
    assert records[1].error == "empty or missing output_b" and records[1].winner is None
    assert records[2].error == "empty or missing output_a"
    # rank counts the failure against the pair it belongs to
    assert (records[1].model_a, records[1].model_b) == ("left", "right")
    assert [len(call) for call in judge.calls] == [2]


def test_samples_are_refused_one_answer_per_order(tmp_path):
    with pytest.raises(OptionError, match="--samples is not for --format pairwise"):
        _grade(tmp_path, ScriptedJudge(sound), sampling=SamplingConfig(n=2, temperature=1))


# ---------------------------------------------------------------- --confidence


def _verdict_with_logprobs(letter: str, probabilities: dict[str, float]) -> Completion:
    """A verdict, tokenized as a tokenizer with one token per verdict value would, and the top
    alternatives at the deciding token."""
    tokens = ('{"', 'v', '":"', {"A": "A", "B": "B", "tie": "tie"}[letter], '"}')
    top = [{t: 0.0} for t in tokens]
    top[3] = {value: math.log(p) for value, p in probabilities.items()}
    return Completion(verdict(letter), "stop", 10, 5, tokens=tokens, top_logprobs=tuple(top))


def test_confidence_reads_the_verdicts_probabilities_in_the_rows_labels(tmp_path):
    judge = FakeBackend([
        _verdict_with_logprobs("A", {"A": 0.6, "B": 0.3, "tie": 0.1}),
        # the swapped game: its B is the row's A
        _verdict_with_logprobs("B", {"A": 0.2, "B": 0.8}),
    ])
    _, (record,) = _grade(tmp_path, judge, _rows(1), sampling=SamplingConfig(logprobs=5))
    assert record.winner == "A" and record.confidence_error is None
    games = record.confidence["games"]
    assert games[0] == pytest.approx({"A": 0.6, "B": 0.3, "tie": 0.1})
    assert games[1] == pytest.approx({"A": 0.8, "B": 0.2, "tie": 0.0})
    assert record.confidence["p"] == pytest.approx({"A": 0.7, "B": 0.25, "tie": 0.05})
    assert record.confidence["p_winner"] == pytest.approx(0.7)


def test_confidence_that_cannot_be_read_says_why(tmp_path):
    judge = FakeBackend([Completion(verdict("A"), "stop", 10, 5, tokens=("x",),
                                    top_logprobs=({"x": 0.0},)),
                         _verdict_with_logprobs("B", {"A": 0.5, "B": 0.5})])
    _, (record,) = _grade(tmp_path, judge, _rows(1), sampling=SamplingConfig(logprobs=5))
    assert record.status == "ok" and record.confidence is None
    assert "do not spell the answer" in record.confidence_error


# ---------------------------------------------------------------- the command line


@pytest.fixture
def engine(monkeypatch):
    judge = ScriptedJudge(sound)
    monkeypatch.setattr("grader.backends.load_backend", lambda name, **options: judge)
    return judge


def _cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args], prog_name="grader")
    return result.exit_code, result.output


def test_the_cli_prints_consistency_and_first_position_wins(tmp_path, model, engine):
    data = _write(tmp_path / "pairs.jsonl", _rows())
    code, output = _cli("grade", data, "-m", model, "-o", tmp_path / "r.jsonl", "--format",
                        "pairwise")
    assert code == 0, output
    assert "position consistency         4 of 4 pairs (100%, 95% CI 40%-100%)" in output
    assert "first-position wins          4 of 8 games (50%" in output
    assert "A / tie / B                  2 / 0 / 2 (A: left, B: right)" in output


def test_answers_in_other_columns_are_mapped(tmp_path, model, engine):
    rows = [{"id": r["id"], "input": r["input"], "reference": r["reference"],
             "left": r["output_a"], "right": r["output_b"]} for r in _rows(2)]
    data = _write(tmp_path / "pairs.jsonl", rows)
    code, output = _cli("grade", data, "-m", model, "-o", tmp_path / "r.jsonl", "--format",
                        "pairwise", "--map", "output_a=left", "--map", "output_b=right")
    assert code == 0, output
    assert [r.winner for _, r in read_records(tmp_path / "r.jsonl")] == ["A", "B"]


def test_a_file_without_an_answer_column_is_one_line_and_exit_2(tmp_path, model, engine):
    rows = [{k: v for k, v in r.items() if k != "output_b"} for r in _rows(2)]
    data = _write(tmp_path / "pairs.jsonl", rows)
    code, output = _cli("grade", data, "-m", model, "-o", tmp_path / "r.jsonl", "--format",
                        "pairwise")
    assert code == EXIT_BAD_INPUT
    assert output == (f"error: {data}: no column 'output_b': --format pairwise reads two answers "
                      "a row, output_a and output_b (another column: --map output_b=COLUMN)\n")
    assert engine.calls == [] and not (tmp_path / "r.jsonl").exists()


def _answers(path: Path, rows: list[dict], side: str) -> Path:
    """One model's answers, as a data file of the absolute formats."""
    return _write(path, [{"id": r["id"], "input": r["input"], "reference": r["reference"],
                          "output_text": r[f"output_{side}"]} for r in rows])


def test_pair_judges_two_files_of_answers_by_id(tmp_path, model, engine):
    rows = _rows(4)
    a = _answers(tmp_path / "model-x.jsonl", rows, "a")
    # B's file in another order: pairs are made by id
    b = _answers(tmp_path / "model-y.jsonl", rows[::-1], "b")
    out = tmp_path / "r.jsonl"
    code, output = _cli("grade", "--pair", a, b, "-m", model, "-o", out)
    assert code == 0, output
    records = [r for _, r in read_records(out)]
    assert all(isinstance(r, PairwiseRecord) for r in records)
    assert [r.winner for r in records] == ["A", "B", "A", "B"]
    assert {(r.model_a, r.model_b) for r in records} == {("model-x", "model-y")}
    pairs = tmp_path / "r.pairs.jsonl"
    summary = json.loads(summary_path(out).read_text())
    assert summary["run"]["data"] == str(pairs)
    # a rerun finds the pairs as they were and resumes
    before = pairs.stat().st_mtime_ns
    code, output = _cli("grade", "--pair", a, b, "-m", model, "-o", out)
    assert code == 0 and pairs.stat().st_mtime_ns == before
    assert json.loads(summary_path(out).read_text())["run"]["resumed_rows"] == 4


def test_pair_refuses_files_of_other_rows_or_one_name(tmp_path, model, engine):
    rows = _rows(4)
    a = _answers(tmp_path / "x.jsonl", rows, "a")
    b = _answers(tmp_path / "y.jsonl", rows[:3], "b")
    code, output = _cli("grade", "--pair", a, b, "-m", model, "-o", tmp_path / "r.jsonl")
    assert code == EXIT_BAD_INPUT
    assert output == (f"error: {a}: {a} and {b} hold different rows: they share 3 ids, 1 are "
                      f"only in {a} and 0 only in {b} ('p3' is not in {b})\n")
    (tmp_path / "other").mkdir()
    same = _answers(tmp_path / "other" / "x.jsonl", rows, "b")
    code, output = _cli("grade", "--pair", a, same, "-m", model, "-o", tmp_path / "r.jsonl")
    assert code == EXIT_BAD_INPUT and "both files are named 'x'" in output
    changed = [dict(r, reference="another reference") if r["id"] == "p2" else r for r in rows]
    c = _answers(tmp_path / "z.jsonl", changed, "b")
    code, output = _cli("grade", "--pair", a, c, "-m", model, "-o", tmp_path / "r.jsonl")
    assert code == EXIT_BAD_INPUT
    assert output == (f"error: {c}:3: id 'p2': its reference differs from {a}'s (line 3): a "
                      "pair answers one question\n")
    code, output = _cli("grade", "--pair", a, b, "--format", "rubric", "-m", model, "-o",
                        tmp_path / "r.jsonl")
    assert code == EXIT_BAD_INPUT and "--format pairwise" in output
    assert engine.calls == [] and not list(tmp_path.glob("r.*"))


def test_a_rubric_file_shows_its_items_to_the_judge(tmp_path, model, engine):
    from grader.io.rubric_file import rubric_key

    rows = _rows(2)
    line = {"key": rubric_key("question 0", "reference 0"), "input": "question 0",
            "reference": "reference 0", "facts": ["water boils at 71 degrees"],
            "conclusions": [], "terms": ["pressure"]}
    rubric = tmp_path / "rubric.jsonl"
    rubric.write_text(json.dumps(line) + "\n")
    data = _write(tmp_path / "pairs.jsonl", rows)
    code, output = _cli("grade", data, "-m", model, "-o", tmp_path / "r.jsonl", "--format",
                        "pairwise", "--rubric", rubric)
    assert code == 0, output
    users = [c[-1]["content"] for c in engine.calls[0]]
    assert "<rubric>\n1. Fact: water boils at 71 degrees\n2. Term: pressure\n</rubric>" in users[0]
    assert "<rubric>" in users[1] and "<rubric>" not in users[2]  # row 2's reference has none


def test_rescore_keeps_pairwise_records_and_their_summary(tmp_path):
    _grade(tmp_path, ScriptedJudge(biased))
    code, output = _cli("rescore", tmp_path / "r.jsonl", "-o", tmp_path / "again.jsonl")
    assert code == 0, output
    assert (tmp_path / "again.jsonl").read_bytes() == (tmp_path / "r.jsonl").read_bytes()
    summary = json.loads(summary_path(tmp_path / "again.jsonl").read_text())
    assert summary["pairwise"]["position_consistency"]["hits"] == 0
    edited = (tmp_path / "r.jsonl").read_text().replace('"winner": "tie"', '"winner": "C"', 1)
    (tmp_path / "edited.jsonl").write_text(edited)
    code, output = _cli("rescore", tmp_path / "edited.jsonl", "-o", tmp_path / "x.jsonl")
    assert code == EXIT_BAD_INPUT
    assert "status ok with winner 'C': expected one of A, B, tie" in output


class ShortContextJudge(ScriptedJudge):
    """A scripted judge whose context holds 2,000 tokens, a token being 10 characters."""

    context_length = 2_000

    def count_tokens(self, conversations):
        return [sum(len(m["content"]) for m in c) // 10 for c in conversations]


@pytest.mark.parametrize("truncate", [(), ("output_text",)])
def test_truncate_output_text_cuts_a_pairs_answers_to_fit_the_context(tmp_path, truncate):
    rows = _rows(2)
    rows[1]["output_a"] = "a good answer 1"
    rows[1]["output_b"] = "a poor answer, padded " + "and padded " * 10_000  # 110 k characters
    judge = ShortContextJudge(lambda first, second: "A" if "good" in first else "B")
    summary, records = _grade(tmp_path, judge, rows, truncate=truncate)
    long = records[1]
    assert records[0].status == "ok" and records[0].truncation is None
    if not truncate:  # too long for the context: not sent, no verdict made up
        assert long.status == "context_overflow" and long.winner is None
        return
    # both games sent with output_b cut in the middle; the short output_a stays whole
    assert long.status == "ok" and long.winner == "A"
    assert list(long.truncation) == ["output_b"]
    cut = long.truncation["output_b"]
    assert cut.chars == len(rows[1]["output_b"]) and 0 < cut.kept < cut.chars
    sent = [c for call in judge.calls for c in call if "padded" in c[-1]["content"]]
    assert len(sent) == 2 and all(rows[1]["output_a"] in c[-1]["content"] for c in sent)
    assert all(sum(len(m["content"]) for m in c) // 10 <= 2_000 for c in sent)
