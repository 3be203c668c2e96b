"""grade's controls and the verdict on the judge (issue 28 items 1, 2 and 5).

Through the CLI with scripted fake judges (``grader.backends.load_backend`` replaced): a judge
that marks every item present gives no signal; one that reads the answer is informative; the
controls never enter the results rows, resume like them, are off with ``--controls 0``; and
``--fail-on`` takes the verdict. The verdict's arithmetic is checked on its own at the end.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import msgspec
import pytest
from click.testing import CliRunner
from conftest import FakeBackend, check_answer

from grader.analysis.verdict import (
    ALPHA,
    FAIL_ON,
    FIRST_LOOK,
    VERDICTS,
    ControlScores,
    format_verdict,
    judge_verdict,
    looks,
    sequential_verdict,
)
from grader.cli import VERDICT_WORDS, main
from grader.errors import EXIT_BAD_INPUT, EXIT_FAIL_ON, GraderError
from grader.io.dataset import reference_key
from grader.io.results import read_records, summary_path
from grader.judge.perturb import NON_ANSWER, sample_keys
from grader.run.controls import controls_path

TOPICS = [
    ("Why is the sky blue?",
     "Sunlight scatters off nitrogen molecules. Shorter blue wavelengths scatter most strongly."),
    ("What powers the sun?",
     "Hydrogen nuclei fuse into helium deep inside its core. That fusion releases enormous energy."),
    ("Why do leaves change colour?",
     "Chlorophyll breaks down during autumn. Carotenoid pigments then show yellow and orange."),
    ("How do vaccines work?",
     "Vaccines present harmless antigens. The immune system remembers them and responds faster later."),
    ("What causes tides?",
     "Lunar gravity pulls ocean water toward the moon. Earth's rotation carries coastlines through bulges."),
    ("Why does ice float?",
     "Frozen water forms an open hexagonal lattice. That lattice is less dense than liquid water."),
    ("What is inflation?",
     "Inflation means general prices rise over time. Each currency unit then buys fewer goods."),
    ("How do bees make honey?",
     "Worker bees collect flower nectar. Enzymes and evaporation inside hives turn nectar into honey."),
]


def _rows(n: int = len(TOPICS)) -> list[dict]:
    return [{"id": f"q{i}", "input": question, "reference": reference,
             "output_text": f"an answer to question {i}"}
            for i, (question, reference) in enumerate(TOPICS[:n])]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _first_group(rows: list[dict], references: int = FIRST_LOOK) -> list[int]:
    """The rows (by index, in data order) of the first ``references`` references the
    sequential check grades (default: its first group): the sample in hash order."""
    keys = [reference_key(row["input"], row["reference"]) for row in rows]
    return sorted(keys.index(key) for key in sample_keys(keys, 50)[:references])


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0].strip()


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z']+", text.casefold()) if len(w) > 3}


class ReadingJudge(FakeBackend):
    """A judge that reads the answer: each reference's sentences are its facts, and an item is
    labelled present only when most of its content words occur in the answer the check
    prompt shows it."""

    def reply(self, conversations, schemas=None):
        from grader.backends import Completion

        self.history.append((list(conversations), list(schemas or [])))
        out = []
        for conversation, schema in zip(conversations, schemas, strict=True):
            text = conversation[-1]["content"]
            if schema["title"] == "RubricDraft":
                sentences = _between(text, "<reference>", "</reference>").split(". ")
                draft = {"facts": [s.strip(" .") for s in sentences], "conclusions": [], "terms": []}
                out.append(Completion(json.dumps(draft), "stop", 10, 5))
                continue
            self.calls.append([conversation])
            answer = _words(_between(text, "<model_output>", "</model_output>"))
            items = [line.split(": ", 1)[1]
                     for line in _between(text, "<rubric>", "</rubric>").splitlines()]
            labels = "".join("y" if len(_words(item) & answer) * 2 > len(_words(item)) else "n"
                             for item in items)
            out.append(Completion(check_answer(labels), "stop", 10, 5))
        return out


class Engine:
    """load_backend's stand-in: one scripted judge per run, every row it was sent remembered."""

    def __init__(self, judge: type[FakeBackend] = FakeBackend, **options) -> None:
        self.judge, self.options = judge, options
        self.backends: list[FakeBackend] = []

    def __call__(self, name, **options):
        backend = self.judge(chunk_size=4, **self.options)
        self.backends.append(backend)
        return backend

    @property
    def sent(self) -> list[tuple[str, str]]:
        """(reference, answer) of every check row sent, in order."""
        return [(_between(conversation[-1]["content"], "<reference>", "</reference>"),
                 _between(conversation[-1]["content"], "<model_output>", "</model_output>"))
                for backend in self.backends for call in backend.calls for conversation in call]


def _engine(monkeypatch, judge: type[FakeBackend] = FakeBackend, **options) -> Engine:
    engine = Engine(judge, **options)
    monkeypatch.setattr("grader.backends.load_backend", engine)
    return engine


def _grade(data: Path, out: Path, model: Path, *extra: str):
    args = ["grade", str(data), "--model", str(model), "-o", str(out), "--backend", "transformers",
            *extra]
    return CliRunner().invoke(main, args, prog_name="grader")


def _summary(out: Path) -> dict:
    return json.loads(summary_path(out).read_text())


def _ids(path: Path) -> list[str]:
    return [str(record.id) for _, record in read_records(path)]


def test_a_judge_that_marks_every_item_present_gives_no_signal(tmp_path, model, monkeypatch):
    _engine(monkeypatch)  # every item of every row: y
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    check = _summary(out)["judge_check"]
    # the sequential check stops at its first look: 3 of the 8 sampled references
    assert check["verdict"] == "no signal" and check["scored"] == 3
    assert (check["wrong"]["above"], check["wrong"]["tied"], check["wrong"]["below"]) == (0, 3, 0)
    assert check["wrong"]["p_value"] == 1.0
    assert check["sequential"]["stopped"] == "no_signal" and check["sequential"]["used"] == 3
    assert check["sequential"]["futility_p"] == pytest.approx(0.2 ** 3)
    assert check["controls"]["rows"] == 9 and len(_ids(controls_path(out))) == 9
    # said on the terminal, last, in words a new user reads
    lines = result.output.splitlines()
    verdict = next(i for i, line in enumerate(lines) if line.startswith("judge check:"))
    assert lines[verdict].startswith(
        "judge check: NO SIGNAL - on 3 references the judge scored the reference above a wrong "
        "answer 0 times, tied 3, below 0: it gives the same scores whatever the answer says")
    assert "use a larger judge (a 7B+ instruct model)" in lines[verdict]
    assert lines[verdict + 1] == "  reference vs a wrong answer: above 0, tied 3, below 0 of 3 (sign test p = 1)"
    assert lines[verdict + 4].startswith(
        "  stopped after 3 of 8 sampled references: the reference scored above both controls on "
        "only 0 of 3, which a judge that does so on 80% of references would show with "
        "probability 0.008 (at most 0.01), so the rest were not graded")


def test_a_judge_that_reads_the_answer_is_informative(tmp_path, model, monkeypatch):
    engine = _engine(monkeypatch, ReadingJudge)
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    result = _grade(data, out, model, "--fail-on", "weak")
    assert result.exit_code == 0, result.output
    check = _summary(out)["judge_check"]
    assert check["verdict"] == "informative", check
    # 6 of 6 at the second look: both sign tests at p = 1/64, its level; the rest not graded
    assert check["above_both"]["count"] == 6 and check["p_value"] == pytest.approx(0.5 ** 6)
    assert check["sequential"] | {"looks": None} == {
        "sampled": 8, "used": 6, "stopped": "signal", "looks": None, "look": 2,
        "alpha": 0.015625, "beta": 0.02, "futility_p": None}
    assert check["mean_scores"]["reference"] > check["mean_scores"]["wrong"]
    assert "judge check: INFORMATIVE - the judge scored the reference above both a wrong answer " \
           "and a non-answer on 6 of 6 references (100%, 95% interval 54%-100%)" in result.output
    assert "  stopped after 6 of 8 sampled references: both sign tests rejected at this look's " \
           "level (0.016) and the share reached 80%, so the rest were not graded" in result.output
    # the three controls of a reference: itself, another sampled reference, the non-answer
    references = {TOPICS[i][1] for i in _first_group(_rows(), 6)}
    controls = [(own, answer) for own, answer in engine.sent
                if not answer.startswith("an answer to question")]
    assert len(engine.sent) == 8 + 18 and len(controls) == 18
    assert sorted(own for own, answer in controls if answer == own) == sorted(references)
    assert sorted(own for own, answer in controls if answer == NON_ANSWER) == sorted(references)
    wrong = [(own, answer) for own, answer in controls if answer not in (own, NON_ANSWER)]
    assert sorted(own for own, _ in wrong) == sorted(references)
    assert {answer for _, answer in wrong} <= {reference for _, reference in TOPICS}


def test_controls_never_enter_the_results_rows(tmp_path, model, monkeypatch):
    _engine(monkeypatch, ReadingJudge)
    data = _write(tmp_path / "d.jsonl", _rows())
    with_controls, without = tmp_path / "with.jsonl", tmp_path / "without.jsonl"
    assert _grade(data, with_controls, model).exit_code == 0
    assert _grade(data, without, model, "--controls", "0").exit_code == 0
    assert with_controls.read_bytes() == without.read_bytes()
    summary, bare = _summary(with_controls), _summary(without)
    for part in ("rows", "statuses", "graded", "mean_score", "histogram"):
        assert summary[part] == bare[part]
    # the controls' own file, beside the results: three per sampled row, marked ids
    path = controls_path(with_controls)
    assert path == tmp_path / "with.controls.jsonl"
    # (the references the sequential check used: its first group, in data order)
    assert _ids(path) == [f"q{i}#control:{kind}" for i in _first_group(_rows(), 6)
                          for kind in ("reference", "wrong", "non_answer")]
    assert summary["judge_check"]["controls"] == {"requested": 50, "file": str(path), "rows": 18,
                                                  "resumed_rows": 0}
    assert not path.with_name(path.name + ".partial").exists()


def test_a_rerun_grades_no_control_again_and_a_stopped_one_resumes_the_rest(
        tmp_path, model, monkeypatch):
    import os
    import signal

    engine = _engine(monkeypatch, ReadingJudge)
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    # Ctrl-C while the last block is graded (blocks of 4 rows: its 4 rows and the first 4
    # controls): it is saved, the run stops
    real_generate = ReadingJudge.reply

    def interrupting(self, conversations, schemas=None):
        answers = real_generate(self, conversations, schemas)
        if len(engine.sent) == 12:
            os.kill(os.getpid(), signal.SIGINT)
        return answers

    monkeypatch.setattr(ReadingJudge, "reply", interrupting)
    result = _grade(data, out, model)
    assert result.exit_code == 130, result.output
    # 8 drafts in 2 calls, then the 2 blocks of rows, the last with 4 controls
    assert [len(sent) for sent, _ in engine.backends[0].history] == [4, 4, 4, 8]
    partial = controls_path(out).with_name("r.controls.jsonl.partial")
    # the sequential check's first group: 3 references, 9 rows
    assert f"4 of 9 rows are graded and saved in {partial}" in result.output
    assert not out.exists() and not controls_path(out).exists()
    # the rerun grades the 5 controls left of the first group and the second's 9, and no row
    monkeypatch.setattr(ReadingJudge, "reply", real_generate)
    before = len(engine.sent)
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    assert len(engine.sent) - before == 14
    check = _summary(out)["judge_check"]
    assert check["verdict"] == "informative" and check["controls"]["resumed_rows"] == 4
    # and the next rerun loads no model at all
    graded, loads = controls_path(out).read_bytes(), len(engine.backends)
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    assert len(engine.backends) == loads and controls_path(out).read_bytes() == graded
    assert _summary(out)["judge_check"]["controls"]["resumed_rows"] == 18


def test_overwrite_starts_the_controls_over_and_without_controls_removes_them(
        tmp_path, model, monkeypatch):
    engine = _engine(monkeypatch)
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    assert _grade(data, out, model).exit_code == 0
    before = len(engine.sent)
    assert _grade(data, out, model, "--overwrite").exit_code == 0
    assert len(engine.sent) - before == 8 + 9  # the first group's controls: no signal there
    assert _grade(data, out, model, "--overwrite", "--controls", "0").exit_code == 0
    assert not controls_path(out).exists() and "judge_check" not in _summary(out)


class HalfBlindJudge(ReadingJudge):
    """A judge that reads the answers but for one reference (:attr:`blind`), whose items it
    marks present in every answer: that reference's controls tie."""

    blind = ""

    def reply(self, conversations, schemas=None):
        answers = super().reply(conversations, schemas)
        for index, conversation in enumerate(conversations):
            text = conversation[-1]["content"]
            if ("<model_output>" in text
                    and _between(text, "<reference>", "</reference>") == self.blind):
                items = _between(text, "<rubric>", "</rubric>").splitlines()
                answers[index] = type(answers[index])(check_answer("y" * len(items)), "stop", 10, 5)
        return answers


def test_the_next_group_of_references_is_graded_only_while_the_verdict_is_open(
        tmp_path, model, monkeypatch):
    import grader
    from grader.run import grading

    rows = _rows()
    first = _first_group(rows)
    monkeypatch.setattr(HalfBlindJudge, "blind", TOPICS[first[0]][1])
    engine = _engine(monkeypatch, HalfBlindJudge)
    data, out = _write(tmp_path / "d.jsonl", rows), tmp_path / "r.jsonl"
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    check = _summary(out)["judge_check"]
    # the looks after 3 (2 of 3 above both) and 6 (5 of 6) leave it open: the last 2
    # references are graded, in a call of their own, and the last look decides on all 8
    assert check["sequential"]["stopped"] == "all" and check["sequential"]["used"] == 8
    assert check["verdict"] == "informative" and check["above_both"]["count"] == 7
    assert check["thresholds"]["p_value"] == pytest.approx(ALPHA - 1 / 64)
    assert len(engine.sent) == 8 + 24 and len(_ids(controls_path(out))) == 24
    assert [len(sent) for sent, _ in engine.backends[0].history][-2:] == [4, 2]
    assert ("  all 8 sampled references used: the looks after 3, 6 left the verdict open (sign "
            "tests at this last look's level, 0.034)") in result.output
    # in memory, the same sequential logic gives the same verdict
    made = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor", lambda *a: made(*a, backend_factory=engine))
    with grader.Grader(str(model)) as judge:
        judge.grade(rows)
        memory = judge.judge_check
    assert memory.controls and memory.controls.file is None and memory.controls.rows == 24
    assert msgspec.to_builtins(memory) | {"controls": None} == check | {"controls": None}


def test_a_rerun_resumes_the_later_group_and_judges_as_the_first_run(
        tmp_path, model, monkeypatch):
    rows = _rows()
    monkeypatch.setattr(HalfBlindJudge, "blind", TOPICS[_first_group(rows)[0]][1])
    engine = _engine(monkeypatch, HalfBlindJudge)
    data, out = _write(tmp_path / "d.jsonl", rows), tmp_path / "r.jsonl"
    assert _grade(data, out, model).exit_code == 0
    first, graded, loads = _summary(out)["judge_check"], controls_path(out).read_bytes(), len(
        engine.backends)
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    again = _summary(out)["judge_check"]
    assert len(engine.backends) == loads and controls_path(out).read_bytes() == graded
    assert again["controls"]["resumed_rows"] == 24
    assert ({k: v for k, v in again.items() if k != "controls"}
            == {k: v for k, v in first.items() if k != "controls"})


def test_too_few_controls_asked_name_the_data_s_references_and_cite_no_file(
        tmp_path, model, monkeypatch):
    engine = _engine(monkeypatch)
    rows = _rows() + [{"id": f"e{i}", "input": f"Question {i}?",
                       "reference": f"Extra reference number {i}.", "output_text": "a"}
                      for i in range(3)]
    data, out = _write(tmp_path / "d.jsonl", rows), tmp_path / "r.jsonl"
    result = _grade(data, out, model, "--controls", "3")
    assert result.exit_code == 0, result.output
    assert len(engine.sent) == 11 and not controls_path(out).exists()
    check = _summary(out)["judge_check"]
    assert (check["verdict"], check["distinct_references"], check["controls"]["file"],
            check["controls"]["rows"]) == ("too few", 11, None, 0)
    verdict = result.output[result.output.index("judge check:"):].strip()
    assert verdict == ("judge check: TOO FEW - --controls 3 asks for fewer references than the 5 "
                       "a verdict needs (the data has 11 distinct references): no verdict on this "
                       "judge")
    assert "controls file" not in result.output and ".controls.jsonl" not in result.output


def test_a_judge_panel_runs_the_judge_check_for_its_first_judge_and_says_so(
        tmp_path, model, monkeypatch):
    _engine(monkeypatch)  # every judge marks every item present: no signal
    second = tmp_path / "second"
    second.mkdir()
    (second / "config.json").write_text("{}")
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    result = _grade(data, out, model, "-m", str(second), "--fail-on", "no-signal")
    assert result.exit_code == EXIT_FAIL_ON, result.output
    check = _summary(out)["judge_check"]
    assert check["verdict"] == "no signal"
    assert check["panel_judge"] == {"name": "judge-1", "model": str(model)}
    assert check["controls"]["file"] == str(tmp_path / "r.judge-1.controls.jsonl")
    assert controls_path(tmp_path / "r.judge-1.jsonl").exists()
    assert not controls_path(tmp_path / "r.judge-2.jsonl").exists()
    assert not controls_path(out).exists()
    assert (f"  a judge panel: this check is of its first judge, judge-1 ({model}), whose "
            "controls file is beside its results") in result.output
    assert result.output.splitlines()[-1] == "error: --fail-on: judge check no signal"
    # in memory, the same: the first judge's check
    import grader
    from grader.run import grading

    engine = Engine()
    made = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor", lambda *a: made(*a, backend_factory=engine))
    with grader.Grader([str(model), str(second)]) as judges:
        judges.grade(_rows())
        memory = judges.judge_check
    assert memory.verdict == "no signal" and memory.panel_judge
    assert memory.panel_judge.name == "judge-1"


def test_controls_0_turns_them_off(tmp_path, model, monkeypatch):
    engine = _engine(monkeypatch)
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    result = _grade(data, out, model, "--controls", "0")
    assert result.exit_code == 0, result.output
    assert len(engine.sent) == 8 and "judge check" not in result.output
    assert "judge_check" not in _summary(out) and not controls_path(out).exists()
    # a verdict to fail on needs the controls: one line, before any model work
    result = _grade(data, tmp_path / "other.jsonl", model, "--controls", "0", "--fail-on", "no-signal")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.output == ("error: --fail-on no-signal is a verdict of the judge check, which "
                             "needs the controls: they are off (--controls 0)\n")
    assert len(engine.sent) == 8


def test_the_settings_file_and_the_api_set_the_controls(tmp_path, model, monkeypatch):
    import grader
    from grader.run import grading

    engine = _engine(monkeypatch)
    data = _write(tmp_path / "d.jsonl", _rows())
    settings = tmp_path / "s.toml"
    settings.write_text("controls = 5\n")
    out = tmp_path / "r.jsonl"
    assert _grade(data, out, model, "--config", str(settings)).exit_code == 0
    assert len(_ids(controls_path(out))) == 15
    # the option wins over the file
    assert _grade(data, tmp_path / "o.jsonl", model, "--config", str(settings),
                  "--controls", "6").exit_code == 0
    assert len(_ids(controls_path(tmp_path / "o.jsonl"))) == 18

    made = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor", lambda *a: made(*a, backend_factory=engine))
    result = grader.grade_file(data, tmp_path / "api.jsonl", model=str(model), controls=5)
    check = result.summary.judge_check
    assert check and check.controls and check.controls.rows == 15
    assert [r.id for r in result.records] == [f"q{i}" for i in range(8)]
    with grader.Grader(str(model), controls=0) as judge:
        judge.grade(_rows())
        assert judge.judge_check is None
    with grader.Grader(str(model)) as judge:
        judge.grade(_rows())
        assert judge.judge_check and judge.judge_check.verdict == "no signal"


def test_controls_below_zero_stop_with_one_line_and_exit_2(tmp_path, model):
    import grader

    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    result = _grade(data, out, model, "--controls", "-1")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "Invalid value for '--controls': -1 is not in the range x>=0." in result.output
    settings = tmp_path / "s.yaml"
    settings.write_text("controls: -3\n")
    result = _grade(data, out, model, "--config", str(settings))
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.output == (f"error: {settings}: controls: Input should be greater than or "
                             "equal to 0\n")
    with pytest.raises(GraderError, match="--controls: Input should be greater") as raised:
        grader.grade_file(data, out, model=str(model), controls=-1)
    assert raised.value.exit_code == EXIT_BAD_INPUT
    assert not out.exists() and not controls_path(out).exists()


def test_fail_on_takes_the_verdict(tmp_path, model, monkeypatch):
    _engine(monkeypatch)
    data = _write(tmp_path / "d.jsonl", _rows())
    for word in ("no-signal", "weak", "weak,missing_context"):
        result = _grade(data, tmp_path / "r.jsonl", model, "--fail-on", word)
        assert result.exit_code == EXIT_FAIL_ON, result.output
        assert result.output.splitlines()[-1] == "error: --fail-on: judge check no signal"
    # too-few fails only where the data gave too few references
    assert _grade(data, tmp_path / "r.jsonl", model, "--fail-on", "too-few").exit_code == 0
    few = _write(tmp_path / "few.jsonl", _rows(3))
    result = _grade(few, tmp_path / "few-r.jsonl", model, "--fail-on", "too-few")
    assert result.exit_code == EXIT_FAIL_ON
    assert result.output.splitlines()[-1] == "error: --fail-on: judge check too few"
    result = _grade(data, tmp_path / "x.jsonl", model, "--fail-on", "no_signal")
    assert result.exit_code == EXIT_BAD_INPUT and "no-signal, too-few" in result.output
    # the CLI spells the words without importing the analysis: the same words
    assert set(VERDICT_WORDS) == set(FAIL_ON)


def test_too_few_references_grade_no_control(tmp_path, model, monkeypatch):
    engine = _engine(monkeypatch)
    data, out = _write(tmp_path / "d.jsonl", _rows(4)), tmp_path / "r.jsonl"
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    assert len(engine.sent) == 4 and not controls_path(out).exists()
    check = _summary(out)["judge_check"]
    assert (check["verdict"], check["reason"], check["references"]) == ("too few", "references", 4)
    assert ("judge check: TOO FEW - the data has 4 distinct references to check the judge on "
            "(a verdict needs 5): no verdict on this judge") in result.output


def test_rows_without_a_reference_are_counted_and_said(tmp_path, model, monkeypatch):
    _engine(monkeypatch)
    rows = _rows() + [{"id": "x", "input": "?", "reference": "", "output_text": "a"},
                      {"id": "y", "input": "?", "output_text": "b"},
                      # a row without an answer is not graded: its reference is not sampled
                      {"id": "z", "input": "?", "reference": "Not graded here.", "output_text": ""}]
    data, out = _write(tmp_path / "d.jsonl", rows), tmp_path / "r.jsonl"
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    check = _summary(out)["judge_check"]
    assert (check["rows_without_reference"], check["references"], check["scored"]) == (2, 3, 3)
    assert "  2 rows have no reference: no control is possible for them" in result.output
    assert not any(i.startswith(("x#", "y#", "z#")) for i in _ids(controls_path(out)))


# Short-answer QA: every reference one sentence, so every rubric has one item (issue 38.16).
SHORT = [
    ("What is the capital of France?", "Paris is the capital of France."),
    ("Who wrote Hamlet?", "William Shakespeare wrote Hamlet."),
    ("What gas do plants absorb?", "Plants absorb carbon dioxide."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("What is the largest planet?", "Jupiter is the largest planet."),
    ("What is frozen water called?", "Frozen water is called ice."),
    ("Which metal is liquid at room temperature?", "Mercury stays liquid at room temperature."),
    ("At what temperature does water boil?", "Water boils at one hundred degrees Celsius."),
    ("Who painted the Mona Lisa?", "Leonardo da Vinci painted the Mona Lisa."),
    ("What is the chemical symbol for gold?", "Gold has the chemical symbol Au."),
]


def test_short_answer_data_with_one_item_rubrics_gets_a_verdict_said_to_be_coarse(
        tmp_path, model, monkeypatch):
    engine = _engine(monkeypatch, ReadingJudge)
    rows = [{"id": f"s{i}", "input": q, "reference": r, "output_text": "no idea"}
            for i, (q, r) in enumerate(SHORT)]
    data, out = _write(tmp_path / "d.jsonl", rows), tmp_path / "r.jsonl"
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    rubrics = [_between(conversation[-1]["content"], "<rubric>", "</rubric>")
               for backend in engine.backends for call in backend.calls for conversation in call]
    assert rubrics and all(len(rubric.splitlines()) == 1 for rubric in rubrics)
    check = _summary(out)["judge_check"]
    assert (check["verdict"], check["coarse"], check["single_item_rubrics"]) == (
        "informative", True, check["scored"])
    assert check["scored"] >= 5 and check["above_both"]["share"] == 1.0
    assert ("  every one of the 6 rubrics has a single item, so each score is all or nothing "
            "(that item present or not): coarse, but enough to tell the reference from a wrong "
            "answer") in result.output


def test_a_judge_blind_to_the_answer_on_one_item_rubrics_is_no_signal_and_coarse(
        tmp_path, model, monkeypatch):
    _engine(monkeypatch, draft={"facts": ["one fact"], "conclusions": [], "terms": []})
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    result = _grade(data, out, model)
    assert result.exit_code == 0, result.output
    check = _summary(out)["judge_check"]
    assert (check["verdict"], check["reason"], check["coarse"], check["single_item_rubrics"]) == (
        "no signal", None, True, 3)
    assert "every one of the 3 rubrics has a single item" in result.output


def test_rescore_keeps_the_judge_check(tmp_path, model, monkeypatch):
    _engine(monkeypatch)
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    assert _grade(data, out, model).exit_code == 0
    again = tmp_path / "again.jsonl"
    result = CliRunner().invoke(main, ["rescore", str(out), "-o", str(again)])
    assert result.exit_code == 0, result.output
    assert _summary(again)["judge_check"] == _summary(out)["judge_check"]


def test_a_summary_whose_judge_check_is_not_one_stops_rescore_and_report_with_one_line(
        tmp_path, model, monkeypatch):
    _engine(monkeypatch)
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    assert _grade(data, out, model).exit_code == 0
    stored = _summary(out)
    stored["judge_check"]["scored"] = "six"
    summary_path(out).write_text(json.dumps(stored), encoding="utf-8")
    for args in (["rescore", str(out), "-o", str(tmp_path / "again.jsonl")],
                 ["report", str(out), "-o", str(tmp_path / "page.html")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert result.output == (f"error: {summary_path(out)}: judge_check: Expected `int`, got "
                                 "`str` - at `$.scored`\n")
    assert not (tmp_path / "again.jsonl").exists() and not (tmp_path / "page.html").exists()


def test_a_results_name_of_a_controls_file_is_refused(tmp_path, model):
    data = _write(tmp_path / "d.jsonl", _rows())
    result = _grade(data, tmp_path / "r.controls.jsonl", model)
    assert result.exit_code == EXIT_BAD_INPUT
    assert "names ending in .controls.jsonl are for the files grader keeps" in result.output


def test_the_sample_is_the_first_keys_by_hash_whatever_the_order_and_size_of_the_data():
    from grader.io.dataset import Item
    from grader.io.rubric_file import rubric_key
    from grader.judge.judges import make_judge
    from grader.run.controls import Controls

    rows = [Item(f"r{i}", i, i + 1, {"input": f"q{i % 1500}", "reference": f"ref {i % 1500}",
                                      "output_text": "a"}) for i in range(3000)]
    keys = [rubric_key(f"q{i}", f"ref {i}") for i in range(1500)]
    for order in (rows, rows[::-1]):
        controls = Controls(7, make_judge(answer_format="seed"), Path("r.jsonl"))
        for item in order:  # past 2 x 7 + 1024 keys the candidates are pruned as they come
            controls.add(item)
        assert len(controls.candidates) < 1100
        assert set(sample_keys(list(controls.candidates), 7)) == set(sample_keys(keys, 7))
        controls.prepare("d.jsonl", offset=3000)
        # each sampled reference's first row, in data order
        firsts = sorted(keys.index(k) for k in sample_keys(keys, 7))
        shift = 0 if order is rows else 1500  # read backwards, a key's first row is its second
        assert [job.item.id.partition("#")[0] for job in controls.jobs[::3]] == [
            f"r{i + shift}" for i in firsts]


# ---------------------------------------------------------------- the verdict's arithmetic


def _scores(pairs: list[tuple[float, float, float]], items: int | None = 3) -> list[ControlScores]:
    return [ControlScores(*triple, items=items) for triple in pairs]


@pytest.mark.parametrize(("scores", "verdict"), [
    ([(5, 0, 0)] * 10, "informative"),
    ([(5, 0, 0)] * 8 + [(3, 3, 0)] * 2, "informative"),  # 0.8 above both: the threshold
    ([(5, 0, 0)] * 7 + [(3, 3, 0)] * 3, "weak"),  # above the wrong answer 7 of 7 untied: p < 0.05
    ([(5, 0, 0)] * 14 + [(3, 3, 0)] * 3 + [(2, 4, 0)] * 3, "weak"),  # 14 of 17 untied: p 0.006
    ([(5, 0, 0)] * 12 + [(3, 3, 0)] * 3 + [(2, 4, 0)] * 5, "no signal"),  # 12 of 17: p 0.07
    ([(3, 3, 3)] * 21, "no signal"),
    ([(5, 0, 0)] * 5 + [(0, 5, 0)] * 5, "no signal"),  # as often below as above
    ([(5, 0, 0)] * 4, "too few"),
])
def test_the_verdicts_thresholds(scores, verdict):
    assert judge_verdict(_scores(scores)).verdict == verdict


def test_the_verdict_counts_ties_and_reversals_apart_with_intervals():
    from scipy.stats import binomtest

    check = judge_verdict(_scores([(5, 0, 0)] * 6 + [(3, 3, 0)] * 3 + [(1, 4, 0)]
                                  + [(None, 0, 0)]), without_reference=2)
    assert (check.references, check.scored, check.rows_without_reference) == (11, 10, 2)
    wrong = check.wrong
    assert (wrong.above, wrong.tied, wrong.below) == (6, 3, 1)
    assert wrong.p_value == pytest.approx(binomtest(6, 7, alternative="greater").pvalue)
    interval = binomtest(6, 10).proportion_ci(0.95)
    assert wrong.ci95 == [round(interval.low, 4), round(interval.high, 4)]
    assert check.non_answer.above == 10 and check.above_both.count == 6
    assert check.p_value == wrong.p_value
    assert check.verdict in VERDICTS
    text = format_verdict(check)
    assert "1 of 11 references had a control without a score" in text
    assert "reference vs a non-answer: above 10, tied 0, below 0 of 10 (sign test p < 0.001)" in text


def test_single_item_rubrics_are_judged_and_called_coarse():
    check = judge_verdict(_scores([(5, 0, 0)] * 10, items=1))
    assert (check.verdict, check.reason, check.coarse) == ("informative", None, True)
    assert "so each score is all or nothing" in format_verdict(check)
    mixed = _scores([(5, 0, 0)] * 5, items=1) + _scores([(5, 0, 0)] * 5, items=4)
    check = judge_verdict(mixed)
    assert check.verdict == "informative" and check.single_item_rubrics == 5
    assert not check.coarse and "all or nothing" not in format_verdict(check)
    assert not judge_verdict(_scores([(5, 0, 0)] * 10, items=None)).coarse


def test_no_signal_names_the_comparison_that_failed():
    # the wrong answer scored low, the non-answer as high as the reference
    check = judge_verdict(_scores([(5, 0, 5)] * 10))
    assert check.verdict == "no signal"
    assert format_verdict(check).startswith(
        "judge check: NO SIGNAL - on 10 references the judge scored the reference above a "
        "non-answer 0 times, tied 10, below 0: it gives the same scores whatever the answer says")
    reversed_ = format_verdict(judge_verdict(_scores([(5, 0, 0)] * 3 + [(0, 5, 0)] * 3)
                                             + _scores([(5, 0, 0)] * 4)))
    assert "above a wrong answer 7 times, tied 0, below 3: no more often than chance would give " \
           "(sign test p = 0.172)" in reversed_


# ---------------------------------------------------------------- the sequential check


def test_the_looks_spend_at_most_five_percent_whatever_the_sample_size():
    for sampled in range(1, 301):
        plan = looks(sampled)
        assert plan[-1].references == sampled and plan[-1].beta is None
        assert sum(look.alpha for look in plan) == pytest.approx(ALPHA)
        assert sum(look.beta for look in plan[:-1]) <= 0.05 + 1e-12
        assert [look.references for look in plan] == sorted({look.references for look in plan})
        if sampled > 6:  # a futility look at 3, then 6 of 6 untied pairs reach the level at 6
            assert (plan[0].references, plan[0].alpha) == (FIRST_LOOK, 0.0)
            assert (plan[1].references, plan[1].alpha) == (6, 0.5 ** 6)
        else:  # one look, as a check all at once
            assert [(look.references, look.alpha) for look in plan] == [(sampled, ALPHA)]


def test_the_sequential_verdict_stops_early_either_way_or_waits():
    blind, reading = _scores([(3, 3, 3)] * 21), _scores([(5, 0, 0)] * 21)
    check = sequential_verdict(blind[:3], 21)
    assert check.verdict == "no signal" and check.sequential.stopped == "no_signal"
    assert check.sequential.futility_p == pytest.approx(0.2 ** 3, rel=1e-3)
    # the first look decides no signal only: a reading judge goes on to 6, then stops
    assert sequential_verdict(reading[:3], 21) is None
    check = sequential_verdict(reading[:6], 21)
    assert (check.verdict, check.sequential.stopped) == ("informative", "signal")
    # 1 of 3 tied at 3: open; 5 of 6 at 6: open; 11 of 12 untied wins at 12: p 0.0005, signal
    mixed = _scores([(5, 0, 0)] * 2 + [(3, 3, 3)] + [(5, 0, 0)] * 18)
    assert sequential_verdict(mixed[:3], 21) is None
    assert sequential_verdict(mixed[:6], 21) is None
    check = sequential_verdict(mixed[:12], 21)
    assert (check.verdict, check.references, check.sequential.look) == (
        "informative", 12, 3)


def test_a_weak_look_goes_on_and_more_references_can_make_it_informative():
    # at 12: 9 of 9 untied won (p 0.002, below the look's 0.005) but 75 % above both: weak,
    # so it goes on; on all 21 the share is 86 %
    scores = _scores([(5, 0, 0)] * 4 + [(3, 3, 3)] * 2 + [(5, 0, 0)] * 5 + [(3, 3, 3)]
                     + [(5, 0, 0)] * 9)
    assert judge_verdict(scores[:12], alpha=0.005).verdict == "weak"
    assert sequential_verdict(scores[:3], 21) is None
    assert sequential_verdict(scores[:6], 21) is None
    assert sequential_verdict(scores[:12], 21) is None
    check = sequential_verdict(scores, 21)
    assert (check.verdict, check.sequential.stopped, check.references) == (
        "informative", "all", 21)


def test_the_last_look_tests_at_what_the_earlier_looks_left_of_five_percent():
    # 12 above, 4 below, 5 tied of 21: p = 0.038, a weak verdict all at once; sequentially
    # the last look's level is 0.05 - 0 - 1/64 - 0.005 = 0.029: no signal
    scores = _scores([(5, 0, 0)] * 4 + [(2, 4, 0)] * 2 + [(5, 0, 0)] * 4 + [(2, 4, 0)] * 2
                     + [(5, 0, 0)] * 4 + [(3, 3, 0)] * 5)
    assert all(sequential_verdict(scores[:n], 21) is None for n in (3, 6, 12))
    assert judge_verdict(scores).verdict == "weak"
    check = sequential_verdict(scores, 21)
    assert (check.verdict, check.sequential.stopped) == ("no signal", "all")
    assert check.wrong.p_value == pytest.approx(0.0384, abs=1e-4)
    assert check.thresholds.p_value == pytest.approx(0.029375)
