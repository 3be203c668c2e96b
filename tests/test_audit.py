"""grader audit: perturbations and controls graded by scripted judges, through the CLI.

Each judge reads the check prompt it is sent (the rubric's items and the answer) and labels
each item by a rule, as a real judge would by reading: a sound one (an item is present when
the answer states it, not negated), one that follows an instruction injected into the answer,
and one that only matches words. The audit must tell them apart: the injection-following
judge is caught by the injection, the word-matcher passes the controls but is caught by the
contradiction, the sound judge passes everything. The rubric pass's draft is each reference's
sentences, one fact each.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, FakeBackend, check_answer, cli

from grader.analysis.audit import audit_path
from grader.backends import Completion
from grader.errors import EXIT_BAD_INPUT
from grader.judge.perturb import (
    AUDIT_KINDS,
    CITATION,
    INJECTION,
    NON_ANSWER,
    contradict,
    pad,
    truncate,
)
from grader.judge.rubric import content_words
from grader.run.audit import rows_path

# Six questions on six topics; every sentence of a reference states one fact (one rubric item).
REFERENCES = [
    "Water boils at 100 degrees at sea level. The boiling point is lower on a high mountain. "
    "Food therefore takes longer to cook up there.",
    "Carbon-14 has a half-life of about 5,730 years. Living organisms take it up from the "
    "atmosphere. Its decay after death dates organic remains.",
    "Granite is an igneous rock formed from cooled magma. Sandstone is a sedimentary rock made "
    "of cemented grains. Marble is a metamorphic rock formed from limestone.",
    "The sky is blue because air scatters short wavelengths. Violet light is scattered even "
    "more strongly. Sunsets are red because the light crosses more air.",
    "Photosynthesis turns carbon dioxide and water into sugar. It is powered by sunlight "
    "absorbed by chlorophyll. Oxygen is released as a by-product.",
    "The heart has four chambers. Its right side pumps blood to the lungs. Its left side pumps "
    "blood to the rest of the body.",
]
# The answers under test: the whole reference, or a preamble and its first fact (so that the
# answer's first half holds no fact).
ANSWERS = [
    "Water boils at 100 degrees at sea level. The boiling point is lower on a high mountain. "
    "Food therefore takes longer to cook up there.",
    "In short, and leaving all of the details aside for now: Carbon-14 has a half-life of "
    "about 5,730 years.",
    "Granite is an igneous rock formed from cooled magma. Sandstone is a sedimentary rock made "
    "of cemented grains. Marble is a metamorphic rock formed from limestone.",
    "In short, and leaving all of the details aside for now: The sky is blue because air "
    "scatters short wavelengths.",
    "Photosynthesis turns carbon dioxide and water into sugar. It is powered by sunlight "
    "absorbed by chlorophyll. Oxygen is released as a by-product.",
    "In short, and leaving all of the details aside for now: The heart has four chambers.",
]


def _rows(count: int = 6) -> list[dict]:
    return [{"id": f"q{i}", "input": f"Question {i}?", "reference": REFERENCES[i],
             "output_text": ANSWERS[i]} for i in range(count)]


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _between(text: str, tag: str) -> str:
    return text.split(f"<{tag}>\n", 1)[1].split(f"\n</{tag}>", 1)[0]


def _words(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.casefold()))


class ScriptedJudge(FakeBackend):
    """A judge that reads its prompts: each reference's sentences as its rubric's facts, and
    each item labelled by :meth:`present` on the answer it is sent."""

    def reply(self, conversations, schemas=None):
        self.history.append((list(conversations), list(schemas or [])))
        out = []
        for conversation, schema in zip(conversations, schemas or [None] * len(conversations),
                                        strict=True):
            text = conversation[-1]["content"]
            if schema is not None and schema.get("title") == "RubricDraft":
                facts = re.split(r"(?<=\.)\s+", _between(text, "reference").strip())
                reply = json.dumps({"facts": facts, "conclusions": [], "terms": []})
            else:
                self.calls.append([list(conversation)])
                items = [line.split(": ", 1)[1] for line in _between(text, "rubric").splitlines()]
                answer = _between(text, "model_output")
                reply = check_answer("".join("y" if self.present(item, answer) else "n"
                                             for item in items))
            out.append(Completion(reply, "stop", 10, 5))
        return out

    def present(self, item: str, answer: str) -> bool:
        """Sound: the answer states the item, and does not say it is untrue."""
        said, item = _words(answer), _words(item)
        return item in said and f"not true that {item}" not in said


class InjectionFollower(ScriptedJudge):
    """Reads the answer, unless it holds an instruction to the grader: then all present."""

    def present(self, item: str, answer: str) -> bool:
        return "note to the grader" in answer.casefold() or super().present(item, answer)


class WordMatcher(ScriptedJudge):
    """An item is present when most of its content words occur in the answer: negation and
    order mean nothing to it."""

    def present(self, item: str, answer: str) -> bool:
        words = content_words(item)
        return len(words & content_words(answer)) > len(words) / 2


@pytest.fixture
def judges(monkeypatch):
    """``judges(cls)`` makes ``cls`` the judge every run loads; the list holds each one."""
    loaded: list[ScriptedJudge] = []
    chosen: list[type[ScriptedJudge]] = [ScriptedJudge]

    def load(name, **options):
        loaded.append(chosen[0](chunk_size=16))
        return loaded[-1]

    monkeypatch.setattr("grader.backends.load_backend", load)

    def use(cls: type[ScriptedJudge]) -> list[ScriptedJudge]:
        chosen[0] = cls
        return loaded

    return use


def _audit(data: Path, model: Path, out: str = "audit.jsonl", *extra):
    return cli("audit", data, "--model", model, "-o", out, "--backend", "transformers", *extra)


def _kinds(audit: dict) -> dict[str, dict]:
    return {entry["kind"]: entry for entry in audit["kinds"]}


def test_a_sound_judge_passes_every_perturbation_and_control(tmp_path, model, judges):
    judges(ScriptedJudge)
    result = _audit(_write(tmp_path / "data.jsonl", _rows()), model, "audit.jsonl", "--json")
    assert result.exit_code == 0, result.output
    kinds = _kinds(json.loads(result.stdout))
    assert [kind for kind in kinds] == list(AUDIT_KINDS)
    for kind, entry in kinds.items():
        assert entry["rows"] == entry["compared"] == 6, kind
        assert entry["pass"] == {"rule": entry["pass"]["rule"], "passed": 6, "of": 6, "rate": 1.0}, kind
    for kind in ("padding", "injection", "authority"):
        assert kinds[kind]["robustness"] == 1.0 and kinds[kind]["mean_shift"] == 0.0
        assert kinds[kind]["interval"] == [0.0, 0.0]
    for kind in ("truncation", "contradiction", "wrong", "non_answer"):
        assert kinds[kind]["lowered"] == 1.0 and kinds[kind]["mean_shift"] < 0
        low, high = kinds[kind]["interval"]
        assert low <= kinds[kind]["mean_shift"] <= high < 0


def test_an_injection_following_judge_is_caught_by_the_injection(tmp_path, model, judges):
    judges(InjectionFollower)
    data = _write(tmp_path / "data.jsonl", _rows())
    result = _audit(data, model, "audit.jsonl")
    assert result.exit_code == 0, result.output
    kinds = _kinds(json.loads(audit_path(Path("audit.jsonl")).read_text()))
    injection = kinds["injection"]
    # the three answers with one fact of three go to the top score; the three whole ones stay
    assert injection["counts"] == {"raised": 3, "lowered": 0, "unchanged": 3}
    assert injection["robustness"] == 0.5 < 1
    assert injection["mean_shift"] > 0 and injection["interval"][0] > 0
    # nothing else moves it: the other perturbations pass as for a sound judge
    for kind in ("padding", "authority", "truncation", "contradiction", "reference", "wrong"):
        assert kinds[kind]["pass"]["rate"] == 1.0, kind
    # the table's line: a sound judge leaves it unchanged; rows, raised, lowered, unchanged,
    # mean shift, its interval, the pass rate
    cells = next(line for line in result.stdout.splitlines() if line.startswith("injection")).split()
    assert cells[:7] == ["injection", "unchanged", "6", "50%", "0%", "50%", "+1.17"]
    assert cells[-2:] == ["50%", "(3/6)"]


def test_a_word_matching_judge_passes_the_controls_but_not_the_contradiction(tmp_path, model,
                                                                                judges):
    judges(WordMatcher)
    result = _audit(_write(tmp_path / "data.jsonl", _rows()), model, "audit.jsonl", "--json")
    assert result.exit_code == 0, result.output
    kinds = _kinds(json.loads(result.stdout))
    for control in ("reference", "wrong", "non_answer"):
        assert kinds[control]["pass"]["rate"] == 1.0, control
    contradiction = kinds["contradiction"]
    assert contradiction["pass"]["rate"] == 0.0 and contradiction["lowered"] == 0.0
    # the negated reference holds every word of the reference: the top score, raised from the
    # answers that had one fact of three
    assert contradiction["counts"] == {"raised": 3, "lowered": 0, "unchanged": 3}


def test_the_audit_is_deterministic_and_a_rerun_resumes(tmp_path, model, judges):
    loaded = judges(ScriptedJudge)
    data = _write(tmp_path / "data.jsonl", _rows())
    first = _audit(data, model, "a.jsonl", "--rows", "4", "--json")
    second = _audit(data, model, "b.jsonl", "--rows", "4", "--json")
    assert first.exit_code == second.exit_code == 0
    a, b = json.loads(first.stdout), json.loads(second.stdout)
    paths = ("results", "rows_file", "summary")
    assert {k: v for k, v in a.items() if k not in paths} == {k: v for k, v in b.items() if k not in paths}
    assert rows_path(Path("a.jsonl")).read_bytes() == rows_path(Path("b.jsonl")).read_bytes()
    assert Path("a.jsonl").read_bytes() == Path("b.jsonl").read_bytes()
    # 4 rows of 6, chosen by id: 9 audit rows each (as given, 5 perturbations, 3 controls)
    ids = [json.loads(line)["id"] for line in Path("a.jsonl").read_text().splitlines()]
    assert len(ids) == 36 and len({i.partition("#")[0] for i in ids}) == 4
    assert a["sampled"] == 4 and a["rows_requested"] == 4 and a["data_rows"] == 6
    # the same audit again: every row resumed, no model loaded, the same audit
    again = _audit(data, model, "a.jsonl", "--rows", "4", "--json")
    assert again.exit_code == 0 and len(loaded) == 2
    assert json.loads(again.stdout) == a


def test_the_json_output_is_the_audit_file_and_holds_every_kind(tmp_path, model, judges):
    judges(ScriptedJudge)
    rows = _rows() + [{"id": "q6", "input": "?", "reference": "", "output_text": "An answer."},
                      {"id": "q7", "input": "?", "reference": "A reference.", "output_text": ""}]
    result = _audit(_write(tmp_path / "data.jsonl", rows), model, "audit.jsonl", "--json",
                    "--bootstrap", "500")
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    stored = json.loads(audit_path(Path("audit.jsonl")).read_text())
    assert printed == stored | {"summary": str(audit_path(Path("audit.jsonl")))}
    assert {"data", "data_rows", "sampled", "skipped", "model", "backend", "format", "results",
            "rows_file", "rows", "original", "kinds", "bootstrap"} <= printed.keys()
    assert printed["skipped"] == {"no_reference": 1, "no_answer": 1, "invalid": 0}
    assert printed["data_rows"] == 8 and printed["sampled"] == printed["rows"] == 6
    assert printed["format"] == "rubric" and printed["backend"] == "transformers"
    assert printed["bootstrap"]["resamples"] == 500
    assert printed["original"]["rows"] == printed["original"]["scored"] == 6
    for entry in printed["kinds"]:
        assert {"kind", "expect", "meaning", "rows", "compared", "raised", "lowered", "unchanged",
                "counts", "mean_shift", "interval", "robustness", "pass", "unscored"} <= entry.keys()
        assert entry["expect"] in ("same", "lower", "top", "low")
    # the terminal says the rows it could not audit
    table = _audit(tmp_path / "data.jsonl", model, "audit.jsonl", "--bootstrap", "500")
    assert "not audited: 1 without a reference, 1 without an answer of the 8 rows" in table.output


def test_rows_without_a_score_are_counted_apart_and_named(tmp_path, model, judges, monkeypatch):
    class Unreadable(ScriptedJudge):
        """Cannot answer for the padded answers: its reply is cut off."""

        def reply(self, conversations, schemas=None):
            out = super().reply(conversations, schemas)
            return [Completion('{"l":"y', "length", 10, 5)
                    if "To put it another way" in c[-1]["content"] else o
                    for c, o in zip(conversations, out, strict=True)]

    judges(Unreadable)
    result = _audit(_write(tmp_path / "data.jsonl", _rows(3)), model)
    assert result.exit_code == 0, result.output
    padding = _kinds(json.loads(audit_path(Path("audit.jsonl")).read_text()))["padding"]
    assert padding["compared"] == 0 and padding["rows"] == 3 and padding["mean_shift"] is None
    assert [row["id"] for row in padding["unscored"]] == ["q0", "q1", "q2"]
    assert {row["padding"] for row in padding["unscored"]} == {"truncated"}
    assert "padding: 3 rows without a score, not compared (q0 padding truncated; q1 padding " \
        "truncated; q2 padding truncated)" in result.stdout


def test_more_rows_than_the_data_has_is_one_line_and_writes_nothing(tmp_path, model, judges):
    loaded = judges(ScriptedJudge)
    data = _write(tmp_path / "data.jsonl", _rows(3) + [{"id": "x", "reference": "", "output_text": "a"}])
    result = _audit(data, model, "audit.jsonl", "--rows", "4")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.output == (f"error: {data}: --rows 4 is more than the 3 rows it has with a "
                             "reference and an answer (of 4)\n")
    assert not loaded and sorted(p.name for p in Path().iterdir()) == ["data.jsonl", "model"]
    # no --rows: every row, where the data has fewer than 50
    assert _audit(data, model, "audit.jsonl").exit_code == 0



def test_a_pairwise_audit_is_refused_in_one_line(tmp_path, model, judges):
    loaded = judges(ScriptedJudge)
    data = _write(tmp_path / "data.jsonl", _rows(3))
    result = _audit(data, model, "audit.jsonl", "--format", "pairwise")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.output.count("\n") == 1 and "--format pairwise" in result.output
    assert not loaded and not Path("audit.jsonl").exists()


def test_audit_takes_every_engine_option_of_grade():
    from grader.cli import audit, grade
    from grader.config import FILE_SETTINGS, dest_of

    # --controls is grade's: an audit grades the controls as three of its kinds
    engine = {p.name for p in grade.params if p.name in map(dest_of, FILE_SETTINGS)} - {"controls"}
    assert engine and engine <= {p.name for p in audit.params}
    assert not {"limit", "fail_on", "grader_config", "controls"} & {p.name for p in audit.params}


def test_the_report_shows_the_audit_beside_its_results(tmp_path, model, judges):
    judges(ScriptedJudge)
    assert _audit(_write(tmp_path / "data.jsonl", _rows(3)), model).exit_code == 0
    assert cli("report", "audit.jsonl", "-o", "report.html").exit_code == 0
    page = Path("report.html").read_text()
    assert "<h2>Judge audit</h2>" in page and "<code>contradiction</code>" in page
    # a results file of grade's with an audit named; a file that is no audit: one line
    Path("bad.json").write_text('{"kinds": 3}')
    bad = cli("report", "audit.jsonl", "-o", "report.html", "--audit", "bad.json")
    assert bad.exit_code == EXIT_BAD_INPUT
    assert bad.output == "error: bad.json: not an audit summary (grader audit writes NAME.audit.json)\n"


# ----------------------------------------------------------------- the text transforms


def test_the_perturbations_are_what_they_say():
    answer = "Water boils at 100 degrees. It boils lower up a mountain, where the air is thin."
    padded = pad(answer)
    assert padded.startswith(answer) and len(padded) >= 2 * len(answer)
    assert not content_words(padded[len(answer):]) & content_words(answer) - {"up"}
    assert truncate(answer) == "Water boils at 100 degrees. It boils lower"  # 8 of 16 words
    assert truncate("One") == "One"
    assert pad(answer) == padded and truncate(answer) == truncate(answer)
    assert INJECTION.startswith("Note to the grader") and CITATION.startswith("(Source:")
    assert NON_ANSWER == "I don't know."


@pytest.mark.parametrize("reference, negated", [
    ("The sky is blue.", "The sky is not blue."),
    ("Cats are not dogs. Birds can fly.", "Cats are dogs. Birds can not fly."),
    ("It isn't hot. They won't go.", "It is hot. They will go."),
    ("Water boils at 100 degrees.", "It is not true that water boils at 100 degrees."),
    ("DNA carries genes.", "It is not true that DNA carries genes."),
    ("Heat, e.g. from the sun, has an effect.", "Heat, e.g. from the sun, has not an effect."),
])
def test_the_contradiction_negates_each_sentence_by_one_rule(reference, negated):
    assert contradict(reference) == negated


# ----------------------------------------------------------------- the real engine


@pytest.mark.slow
def test_the_real_judge_is_audited_on_vllm(judge_model, tmp_path):
    """SmolLM2-135M-Instruct on vLLM's CPU engine: two rows of the examples, every kind graded
    and analysed (what it scores is its own business: docs/judging.md has the figures)."""
    out = tmp_path / "audit.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "grader", "audit", str(EXAMPLES / "qa.jsonl"), "--model",
         str(judge_model), "-o", str(out), "--backend", "vllm", "--enforce-eager", "--rows", "2",
         "--json"],
        capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    audit = json.loads(result.stdout)
    assert audit["sampled"] == 2 and audit["backend"] == "vllm" and audit["format"] == "rubric"
    assert [entry["kind"] for entry in audit["kinds"]] == list(AUDIT_KINDS)
    assert all(entry["rows"] == 2 for entry in audit["kinds"])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 18
    assert not {r["status"] for r in records} & {"parse_error", "engine_error"}
