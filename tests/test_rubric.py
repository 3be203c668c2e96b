"""The rubric format (issue #18): a reference's items written once, each answer labelled.

The fake backend here answers from the schema each row is forced into, as a grammar would:
a rubric-pass row gets the reference's items, a check-pass row exactly as many labels as its
schema asks for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from grader.backends import Backend, Completion
from grader.cli import main
from grader.io.results import read_records
from grader.io.rubric_file import read_rubric_file, rubric_key
from grader.judge.rubric import check_schema, make_rubric, parse_labels
from grader.run.grading import run_grade
from grader.run.request import GradeRequest

DRAFT = {"facts": ["Paris is the capital of France", "the capital of France is Paris",
                   "Paris lies on the Seine"],
         "conclusions": [], "terms": ["capital"]}


class SchemaBackend(Backend):
    """Answers each row from its schema; remembers every call's conversations and schemas."""

    name = "schema-fake"
    chunk_size = 16

    def __init__(self, labels: str = "y", draft: dict | None = None):
        self.labels, self.draft = labels, draft or DRAFT
        self.calls: list[tuple[list, list]] = []

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}

    def generate(self, conversations, schemas=None):
        self.calls.append((list(conversations), list(schemas or [])))
        out = []
        for schema in schemas or [None] * len(conversations):
            if schema is None or schema.get("title") == "RubricDraft":
                text = json.dumps(self.draft, separators=(",", ":"))
            else:
                size = int(schema["properties"]["l"]["pattern"].split("{")[1].split("}")[0])
                labels = "".join(self.labels[i % len(self.labels)] for i in range(size))
                text = json.dumps({"l": labels, "o": "matched"},
                                  separators=(",", ":"))
            out.append(Completion(text, "stop", 100, len(text) // 3))
        return out


class Factory:
    def __init__(self, **options: Any):
        self.options, self.backends = options, []

    def __call__(self, name: str, **options: Any) -> SchemaBackend:
        self.backends.append(SchemaBackend(**self.options))
        return self.backends[-1]


def _data(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows() -> list[dict]:
    # two references, two answers each, interleaved: grouping by reference must reorder them
    return [
        {"id": i, "input": f"q{i % 2}", "reference": f"Paris is the capital of France, on the Seine ({i % 2}).",
         "output_text": f"reply-{i} text"}
        for i in range(4)
    ]


def _grade(tmp_path: Path, factory: Factory, **fields: Any) -> tuple[dict, list[dict]]:
    out = tmp_path / "results.jsonl"
    summary = run_grade(
        GradeRequest(data=str(tmp_path / "d.jsonl"), output=out, model="unused", **fields),
        backend_factory=factory,
    )
    return summary, [r for _, r in read_records(out)]


def test_rubric_is_written_once_per_reference_and_each_answer_only_labelled(tmp_path):
    _data(tmp_path / "d.jsonl", _rows())
    factory = Factory(labels="yn")
    summary, records = _grade(tmp_path, factory)
    (rubric_call, check_call), = [factory.backends[0].calls]
    # the rubric pass: one row per distinct (input, reference), under the draft schema
    assert len(rubric_call[0]) == 2 and {s["title"] for s in rubric_call[1]} == {"RubricDraft"}
    assert "reply-" not in json.dumps(rubric_call[0])
    # the check pass: 4 rows, grouped by reference, each with exactly as many labels as items
    conversations, schemas = check_call
    assert len(conversations) == 4
    refs = [c[1]["content"].split("<reference>")[1].split("</reference>")[0] for c in conversations]
    assert refs[0] == refs[1] and refs[2] == refs[3] and refs[1] != refs[2]
    assert all(s == check_schema(3) for s in schemas)  # 2 facts (one near duplicate) + 1 term
    # the answer comes last in the prompt: everything before it is the reference's shared prefix
    user = conversations[0][1]["content"]
    assert user.index("<rubric>") < user.index("<model_output>")
    # records in input order, each with its items, labels, counts, the seed's lines, the key
    assert [r["id"] for r in records] == [0, 1, 2, 3]
    record = records[0]
    assert record["status"] == "ok" and record["format"] == "rubric"
    assert [e["present"] for e in record["items"]["facts"]] == [True, False]
    assert record["items"]["terms"] == [{"item": "capital", "present": True}]
    assert record["counts"]["facts"] == {"matched": 1, "total": 2}
    assert record["rubric"]["key"] == rubric_key("q0", _rows()[0]["reference"])
    assert record["rubric"]["dropped"] == ["facts: the capital of France is Paris"]
    assert len(record["grade"]["rationale"]) == 5
    # 5 × (0.7 × 1/2 + 0.21 × 1 + 0.09 × 1) = 3.25
    assert record["score"] == 3 and record["score_exact"] == 3.25
    # the rubric file beside the results: one line per reference, with model and prompt hash
    rubric_file = tmp_path / "results.rubric.jsonl"
    lines = read_rubric_file(rubric_file)
    assert len(lines) == 2 and all(line["prompt_sha256"] for line in lines.values())
    assert summary["run"]["rubric"]["path"] == str(rubric_file)
    assert summary["run"]["rubric"]["written_by_judge"] == 2
    assert summary["run"]["format"] == "rubric"


def test_a_rerun_resumes_rubrics_and_rows_and_an_edited_item_regrades_its_rows(tmp_path):
    _data(tmp_path / "d.jsonl", _rows())
    _grade(tmp_path, Factory())
    again = Factory()
    summary, _ = _grade(tmp_path, again)
    assert again.backends == [] and summary["run"]["resumed_rows"] == 4
    # edit one reference's items in the rubric file and grade with it: only its rows re-graded
    path = tmp_path / "results.rubric.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["facts"] = ["Paris is the capital", "France is in Europe", "the Seine"]
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(json.dumps(line) + "\n" for line in lines))
    third = Factory()
    summary, records = _grade(tmp_path, third, rubric=str(edited))
    (check_call,) = third.backends[0].calls  # no rubric pass
    assert len(check_call[0]) == 2 and summary["run"]["resumed_rows"] == 2
    assert records[0]["counts"]["facts"]["total"] == 3 and records[1]["counts"]["facts"]["total"] == 2


def test_rubric_columns_skip_the_rubric_pass_and_no_facts_is_empty_rubric(tmp_path):
    rows = _rows()[:2]
    rows[0] |= {"facts": ["Paris is the capital"], "terms": ["Seine"]}
    rows[1] |= {"facts": [], "conclusions": [], "terms": ["capital"]}
    _data(tmp_path / "d.jsonl", rows)
    factory = Factory()
    summary, records = _grade(tmp_path, factory)
    (check_call,) = factory.backends[0].calls
    assert len(check_call[0]) == 1
    assert records[0]["status"] == "ok" and records[0]["rubric"]["source"] == "data"
    assert records[1]["status"] == "empty_rubric" and records[1]["score"] is None
    assert summary["statuses"]["empty_rubric"] == 1


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "not JSON"),
        (json.dumps({"key": "x", "input": "q", "reference": "r", "facts": "a",
                     "conclusions": [], "terms": []}), "facts must be a list of strings"),
        (json.dumps({"key": "x", "input": "q", "reference": "r", "facts": [],
                     "conclusions": [], "terms": []}), "key does not match"),
    ],
)
def test_a_malformed_rubric_file_stops_before_any_model_work(tmp_path, line, reason):
    _data(tmp_path / "d.jsonl", _rows())
    bad = tmp_path / "rubric.jsonl"
    bad.write_text("\n" + line + "\n")
    model = tmp_path / "model"  # no weights: the run must stop before it would load them
    model.mkdir()
    (model / "config.json").write_text("{}")
    result = CliRunner().invoke(main, ["grade", str(tmp_path / "d.jsonl"), "-m", str(model),
                                       "-o", str(tmp_path / "r.jsonl"), "--rubric", str(bad)])
    assert result.exit_code == 2, result.output
    assert f"{bad}:2: {reason}" in result.output
    assert not (tmp_path / "r.jsonl").exists()


def test_rescore_needs_neither_the_model_nor_the_rubric_file(tmp_path):
    _data(tmp_path / "d.jsonl", _rows())
    _grade(tmp_path, Factory(labels="yn"))
    (tmp_path / "results.rubric.jsonl").unlink()
    result = CliRunner().invoke(main, ["rescore", str(tmp_path / "results.jsonl"),
                                       "-o", str(tmp_path / "again.jsonl")])
    assert result.exit_code == 0, result.output
    before = [r for _, r in read_records(tmp_path / "results.jsonl")]
    after = [r for _, r in read_records(tmp_path / "again.jsonl")]
    assert [r["score_exact"] for r in after] == [r["score_exact"] for r in before]
    assert [r["items"] for r in after] == [r["items"] for r in before]


def test_report_shows_each_rows_items_with_their_labels(tmp_path):
    _data(tmp_path / "d.jsonl", _rows())
    _grade(tmp_path, Factory(labels="ny"))
    result = CliRunner().invoke(main, ["report", str(tmp_path / "results.jsonl"),
                                       "-o", str(tmp_path / "report.html")])
    assert result.exit_code == 0, result.output
    html = (tmp_path / "report.html").read_text()
    assert "[absent] fact: Paris is the capital of France" in html
    assert "[present] fact: Paris lies on the Seine" in html


def test_labels_are_exactly_as_many_as_the_items():
    assert parse_labels('{"l":"y","o":"matched"}', "stop", 2).status == "invalid_counts"
    parsed = parse_labels('{"l":"yn","o":"mismatched"}', "stop", 2)
    assert parsed.labels == [True, False] and parsed.organization == "mismatched"
    rubric = make_rubric("k", {"facts": ["The Moon orbits Jupiter"]}, "The Earth orbits the Sun.")
    assert rubric.facts == ["The Moon orbits Jupiter"] and rubric.ungrounded == ["facts[0]"]


def test_schema_matches_golden_file():
    from grader.judge.schema import format_schema

    golden = Path(__file__).parent / "golden" / "schema_rubric.json"
    assert json.dumps(format_schema("rubric"), indent=2, ensure_ascii=False) + "\n" == golden.read_text()


def test_the_tiny_model_writes_a_rubric_and_labels_in_few_tokens(tiny_model, tmp_path):
    """transformers + the tiny model, through the CLI: `grader rubric`, then grade with it,
    --confidence and --evidence; the check pass stays within 3 tokens an item + 10."""
    data = _data(tmp_path / "d.jsonl", _rows())
    runner = CliRunner()
    written = runner.invoke(main, ["rubric", str(data), "-m", str(tiny_model),
                                   "-o", str(tmp_path / "rubric.jsonl")])
    assert written.exit_code in (0, 1), written.output
    lines = read_rubric_file(tmp_path / "rubric.jsonl")
    # the tiny model's random items may be empty: give each reference one fact by hand
    for line in lines.values():
        line["facts"] = line["facts"] or ["Paris is the capital of France"]
    (tmp_path / "rubric.jsonl").write_text("".join(json.dumps(v) + "\n" for v in lines.values()))
    graded = runner.invoke(main, ["grade", str(data), "-m", str(tiny_model), "-o",
                                  str(tmp_path / "r.jsonl"), "--rubric", str(tmp_path / "rubric.jsonl"),
                                  "--confidence"])
    assert graded.exit_code == 0, graded.output
    records = [r for _, r in read_records(tmp_path / "r.jsonl")]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    for record in records:
        assert record["status"] == "ok", record
        size = sum(len(record["items"][c]) for c in ("facts", "conclusions", "terms"))
        # The answer as its tokenizer writes it (what a trained judge emits; the random model
        # picks any tokenization the grammar allows, up to a token a character), + the stop.
        canonical = len(tokenizer(record["raw_output"], add_special_tokens=False)["input_ids"]) + 1
        assert canonical <= 3 * size + 10
        assert record["usage"]["output_tokens"] <= len(record["raw_output"]) + 1
        assert record["confidence"] is not None, record["confidence_error"]
    evidence = runner.invoke(main, ["grade", str(data), "-m", str(tiny_model), "-o",
                                    str(tmp_path / "e.jsonl"), "--rubric",
                                    str(tmp_path / "rubric.jsonl"), "--evidence", "--limit", "1"])
    assert evidence.exit_code == 0, evidence.output
    (record,) = [r for _, r in read_records(tmp_path / "e.jsonl")]
    assert all("quote" in e for e in record["items"]["facts"])


def test_the_multi_answer_set_has_four_answers_per_reference_and_is_reproducible(tmp_path):
    from conftest import EXAMPLES, ROOT, _load_script

    script = _load_script("make_multi_answer_examples")
    rows = [json.loads(line) for line in (EXAMPLES / "qa.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("reference") and r.get("output_text")]
    built = script.multi_answer_rows(rows)
    by_reference: dict[str, dict[str, str]] = {}
    for row in built:
        by_reference.setdefault(row["reference"], {})[row["variant"]] = row["output_text"]
    for answers in by_reference.values():
        assert list(answers) == list(script.VARIANTS)
        assert len(set(answers.values())) == 4  # four different answers to each question
    shipped = (ROOT / "examples" / "qa_multi.jsonl").read_text(encoding="utf-8")
    assert shipped == "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in built)
