"""The command line, end to end: CliRunner for behaviour, subprocesses for import hygiene."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import jsonschema
import msgspec
import pytest
from conftest import EXAMPLES, cli

from grader.io.results import read_records
from grader.judge.schema import format_schema, verdict_model, verdict_schema

# The engines and the extras (pyproject.toml): `pip install grader` alone has none of them.
HEAVY = ("torch", "transformers", "vllm", "xgrammar", "scipy", "sklearn", "krippendorff",
         "matplotlib", "ray")

# Runs the CLI in a fresh interpreter where importing any of HEAVY fails as a missing package does.
_BLOCKED_CLI = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {heavy!r}:
            raise ModuleNotFoundError("blocked by the test: " + name, name=name)
sys.meta_path.insert(0, Block())
from grader.cli import main
main(prog_name="grader")
"""


def _run_blocked(*args: str, cwd: Path, allow: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    code = _BLOCKED_CLI.format(heavy=set(HEAVY) - set(allow))
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _seed_score(counts: dict) -> int:
    """The seed's formula, written independently of grader.judge.scoring."""
    f = Fraction(counts["facts"]["matched"], counts["facts"]["total"])
    c_total = counts["conclusions"]["total"]
    t = (
        Fraction(counts["terms"]["matched"], counts["terms"]["total"])
        if counts["terms"]["total"]
        else Fraction(1)
    )
    o = 1 if counts["organization"] == "matched" else 0
    if counts["facts"]["matched"] < 1:
        exact = 5 * (Fraction("0.7") * f + Fraction("0.21") * t)
    elif c_total:
        c = Fraction(counts["conclusions"]["matched"], c_total)
        exact = 5 * (Fraction("0.4") * f + Fraction("0.3") * c + Fraction("0.21") * t + Fraction("0.09") * o)
    else:
        exact = 5 * (Fraction("0.7") * f + Fraction("0.21") * t + Fraction("0.09") * o)
    return int(exact + Fraction(1, 2))


def test_help_schema_and_rescore_work_without_the_engines_or_extras(tmp_path):
    assert _run_blocked("--help", cwd=tmp_path).returncode == 0
    schema = _run_blocked("schema", cwd=tmp_path)
    assert schema.returncode == 0, schema.stderr
    assert json.loads(schema.stdout) == format_schema("rubric")  # the default format

    results = tmp_path / "results.jsonl"
    raw = json.dumps(
        {
            "score": 1,
            "rationale": [
                "Fact: 1 of 2 correctly matched.",
                "Conclusion: 0 of 0 correctly matched.",
                "Terminology: 1 of 1 terms correctly matched.",
                "Organization: matched",
                "Score: 1 ≈ 1 = wrong",
            ],
        }
    )
    results.write_text(json.dumps({"id": "a", "raw_output": raw}) + "\n")
    done = _run_blocked("rescore", str(results), "-o", str(tmp_path / "new.jsonl"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    [(_, record)] = list(read_records(tmp_path / "new.jsonl"))
    # 5 × (0.7 × 1/2 + 0.21 × 1 + 0.09 × 1) = 3.25 -> 3, whatever the judge claimed
    assert (record.status, record.score, record.model_score) == ("ok", 3, 1)


def test_render_without_a_model_imports_nothing_heavy(tmp_path):
    done = _run_blocked("render", str(EXAMPLES / "qa.jsonl"), "-n", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("===== id") == 2
    assert "<reference>" in done.stdout and "----- system" in done.stdout


def test_agree_needs_no_extra(tmp_path):
    results = tmp_path / "results.jsonl"
    rows = [(0, 0), (1, 2), (2, 2), (3, 3), (5, 4), (4, 4)]
    results.write_text("".join(
        json.dumps({"id": i, "status": "ok", "score": judge, "label": human}) + "\n"
        for i, (human, judge) in enumerate(rows)
    ))
    # scipy is a core dependency (pyproject.toml): agree's calibrated intervals take its t
    # quantiles; the engines and the other extras stay unimported
    done = _run_blocked("agree", str(results), "--human", "label", "--json", cwd=tmp_path,
                        allow=("scipy",))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["n"] == 6 and result["exact_agreement"] == pytest.approx(4 / 6)
    assert result["kendall"] is not None and result["krippendorff_alpha"] is not None


def test_a_command_without_its_extra_says_which_in_one_line(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"id": "a", "status": "ok", "score": 3}) + "\n")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    data = str(EXAMPLES / "qa.jsonl")
    cases = [
        (("compare", str(results), str(results)), "grader compare needs scipy", "analysis"),
        (("report", str(results), "-o", "r.html"), "grader report needs matplotlib", "analysis"),
        (("grade", data, "--model", str(model), "-o", "g.jsonl", "--backend", "transformers"),
         "grader grade needs torch", "transformers"),
        (("render", data, "--model", str(model)), "grader render needs transformers", "transformers"),
    ]
    for args, needs, extra in cases:
        done = _run_blocked(*args, cwd=tmp_path)
        assert done.returncode == 3, (args, done.stderr)
        assert done.stderr == f"error: {needs}, which is not installed: pip install 'grader[{extra}]'\n"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model", "results.jsonl"]


def test_malformed_file_fails_with_one_line_and_writes_nothing(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"reference": "r", "output_text": "o"}\n\n{"reference": "r",\n')
    out = tmp_path / "results.jsonl"
    result = cli("grade", data, "--model", tmp_path, "-o", out)
    assert result.exit_code == 2
    # the model directory is checked first: an empty one is not a model
    assert result.output.strip().count("\n") == 0 and "config.json" in result.output

    (tmp_path / "config.json").write_text("{}")
    result = cli("grade", data, "--model", tmp_path, "-o", out)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: {data}:3: invalid JSON: Expecting property name enclosed in double quotes (column 19)"
    assert not out.exists() and not list(tmp_path.glob("results*"))


def test_a_model_that_is_not_on_disk_stops_with_what_to_do(tmp_path):
    result = cli("grade", EXAMPLES / "qa.jsonl", "--model", "Qwen/Qwen3-8B", "-o", "r.jsonl")
    assert result.exit_code == 2
    assert "not found locally" in result.output and "--local-dir" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_panels_later_judge_not_on_disk_stops_before_any_judge_loads(tmp_path, tiny_model):
    out = tmp_path / "r.jsonl"
    result = cli("grade", EXAMPLES / "qa.jsonl", "--model", tiny_model, "--model", "Qwen/Qwen3-8B",
                 "-o", out)
    assert result.exit_code == 2, result.output
    assert "Qwen/Qwen3-8B: model not found locally" in result.output
    assert not list(tmp_path.iterdir())  # nothing graded by the first judge


@pytest.mark.slow
# The default (rubric, no --format given) greedy, the seed's format sampled: each format once,
# each temperature once, at the cost of the two runs this test always made.
@pytest.mark.parametrize(("answer_format", "temperature"), [(None, 0.0), ("seed", 1.0)])
def test_grade_examples_with_the_tiny_model_every_answer_parses(
    tiny_model, tmp_path, answer_format, temperature
):
    out = tmp_path / "results.jsonl"
    chosen = ["--format", answer_format] if answer_format else []
    result = cli("grade", EXAMPLES / "qa.jsonl", "--model", tiny_model, "-o", out,
                 "--temperature", temperature, "--seed", 0, "--controls", 0, *chosen)
    assert result.exit_code == 0, result.output
    records = [r for _, r in read_records(out)]
    assert len(records) == 24
    sent = [r for r in records if r.status != "missing_context"]
    assert len(sent) == 21
    if answer_format == "seed":
        schema, model = verdict_schema(True), verdict_model(True)
        statuses = {"ok", "invalid_counts", "ambiguous"}
    else:  # the rubric format: labels counted, never impossible; a rubric may have no facts
        from grader.judge.rubric import check_schema

        statuses = {"ok", "empty_rubric"}
        assert summary_rubric(tmp_path)["references"] == 21
    for record in sent:
        assert record.format == (answer_format or "rubric")
        assert record.status in statuses
        if record.status == "empty_rubric":
            assert record.score is None and record.raw_output is None
            continue
        # guided decoding: 100 % of the answers are schema-valid JSON, whatever the weights
        assert record.finish_reason == "stop"
        answer = json.loads(record.raw_output)
        if answer_format is None:
            size = sum(len(record.rubric[c]) for c in ("facts", "conclusions", "terms"))
            jsonschema.validate(answer, check_schema(size))
            continue
        jsonschema.validate(answer, schema)
        model.model_validate(answer)
        assert record.usage.output_tokens > 0
    for record in sent:
        if record.status == "ok":
            assert record.score == _seed_score(msgspec.to_builtins(record.counts))
            assert record.grade["score"] == record.score
    summary = json.loads((tmp_path / "results.summary.json").read_text())
    assert summary["rows"] == 24 and summary["statuses"]["missing_context"] == 3
    assert summary["run"]["engine"]["backend"] == "transformers"
    assert "mean score (ok rows)" in result.output

    # rescoring the file reproduces every record exactly, with no model
    rescored = tmp_path / "rescored.jsonl"
    assert cli("rescore", out, "-o", rescored).exit_code == 0
    assert [r for _, r in read_records(rescored)] == records


def summary_rubric(folder: Path) -> dict:
    return json.loads((folder / "results.summary.json").read_text())["run"]["rubric"]


@pytest.mark.slow
def test_render_with_a_model_counts_tokens_with_its_chat_template(tiny_model):
    result = cli("render", EXAMPLES / "qa.csv", "--map", "output_text=response", "-n", 3,
                 "--model", tiny_model)
    assert result.exit_code == 0, result.output
    assert result.output.count("----- prompt tokens: ") == 3
    counts = [int(line.rsplit(" ", 1)[1]) for line in result.output.splitlines() if "prompt tokens" in line]
    assert all(500 < n < 4000 for n in counts)


def test_rescore_keeps_records_without_raw_output_and_rejects_bad_lines(tmp_path):
    results = tmp_path / "r.jsonl"
    kept = {"id": 1, "status": "engine_error", "score": None, "error": "boom"}
    results.write_text(json.dumps(kept) + "\n")
    out = tmp_path / "o.jsonl"
    assert cli("rescore", results, "-o", out).exit_code == 0
    assert [r.to_dict() for _, r in read_records(out)] == [kept]

    results.write_text(json.dumps(kept) + "\nnot json\n")
    result = cli("rescore", results, "-o", tmp_path / "x.jsonl")
    assert result.exit_code == 2 and f"{results}:2: invalid JSON" in result.output
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("record, reason", [
    ({"id": 1, "status": "ok", "samples": 5}, "samples must be a list of objects"),
    ({"id": 1, "status": "ok", "samples": [1, 2]}, "samples must be a list of objects"),
    ({"id": 1, "status": "ok", "samples": [{"status": "weird", "raw_output": None}]},
     "sample 1: no raw_output to rescore and no known status to keep"),
    ({"id": 1, "samples": [{"raw_output": None, "finish_reason": "error"}]},
     "sample 1: no raw_output to rescore and no known status to keep"),
    ({"id": 1, "samples": [{"status": "ok", "raw_output": 7}]}, "sample 1: raw_output must be"),
    ({"id": 1, "aggregate": "bogus", "samples": [{"raw_output": "x"}]}, "unknown aggregate 'bogus'"),
    ({"id": 1, "raw_output": 5}, "raw_output must be a string or null"),
    ({"id": 1, "raw_output": {"a": 1}}, "raw_output must be a string or null"),
    ({"id": 1}, "no raw_output to rescore and no status to keep"),
    ({"id": 1, "status": None}, "no raw_output to rescore and no status to keep"),
    ({"id": 1, "status": "ok", "score": 9}, "status ok with score 9: expected an integer from 0 to 5"),
    ({"id": 1, "status": "ok", "score": 2.5}, "status ok with score 2.5"),
    ({"id": 1, "status": "ok", "score": True}, "status ok with score True"),
    ({"id": 1, "status": "ok", "score": float("nan")}, "status ok with score nan"),
    ({"id": 1, "status": "parse_error", "score": None, "usage": float("inf")},
     "a number JSON cannot hold (NaN or Infinity)"),
])
def test_rescore_of_a_record_it_cannot_take_is_one_line_naming_it(tmp_path, record, reason):
    # Hand-edited files and other tools' files: each of these was a traceback halfway through.
    results = tmp_path / "r.jsonl"
    fine = {"id": 0, "status": "engine_error", "score": None, "error": "boom"}
    results.write_text(json.dumps(fine) + "\n" + json.dumps(record) + "\n")
    result = cli("rescore", results, "-o", tmp_path / "o.jsonl")
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {results}:2: {reason}"), result.output
    assert len(result.output.splitlines()) == 1
    assert not (tmp_path / "o.jsonl").exists()


def test_rescore_in_several_processes_writes_what_one_process_writes(tmp_path):
    from answers import answer

    from grader.judge.records import judged_record

    records = []
    for i in range(300):  # judged, unsent and failed records, varied answers
        if i % 7 == 0:
            records.append({"id": i, "status": "missing_context", "score": 0, "error": "empty"})
        elif i % 11 == 0:
            records.append({"id": i, "status": "engine_error", "score": None, "error": "boom"})
        else:
            raw = answer(facts=(i % 5, 4 + i % 3), checklist=None)
            records.append(judged_record(i, raw, "stop",
                                         usage={"prompt_tokens": i, "output_tokens": 9}).to_dict())
    source = tmp_path / "r.jsonl"
    source.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    outputs = {}
    for workers in (1, 3):
        out = tmp_path / f"o{workers}.jsonl"
        result = cli("rescore", source, "-o", out, "--workers", workers)
        assert result.exit_code == 0, result.output
        summary = json.loads((tmp_path / f"o{workers}.summary.json").read_text())
        for when_and_where in ("started", "finished", "results"):
            summary["run"].pop(when_and_where)
        outputs[workers] = (out.read_bytes(), summary)
    assert outputs[3] == outputs[1]
    assert outputs[1][1]["rows"] == 300 and outputs[1][1]["statuses"]["missing_context"] == 43
    assert [r.id for _, r in read_records(tmp_path / "o3.jsonl")] == list(range(300))

    # a bad line in the last part is named by the file's own line number, nothing written
    source.write_text(source.read_text() + "not json\n")
    result = cli("rescore", source, "-o", tmp_path / "x.jsonl", "--workers", 3)
    assert result.exit_code == 2 and f"{source}:301: invalid JSON" in result.output
    assert not (tmp_path / "x.jsonl").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".rescore")] == []


def test_map_option_must_be_field_equals_column(tmp_path):
    result = cli("render", EXAMPLES / "qa.csv", "--map", "output_text")
    assert result.exit_code == 2 and "FIELD=COLUMN" in result.output
