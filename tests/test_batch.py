"""grader batch: export a run's requests for vLLM's batch runner, import its answers.

The batch runner is stood in for by :func:`run_batch`, which answers each request of a
requests file as guided decoding would under the request's own schema (conftest's
``_schema_answer``, the fake backend's answers) and writes the runner's output format
(vLLM 0.32.0 entrypoints/launchers/run_batch.py, BatchRequestOutput). The real runner is
tests/test_batch_vllm.py's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import DRAFT, EXAMPLES, _schema_answer, cli, make_request

from grader.errors import EXIT_BAD_INPUT
from grader.io.results import read_records
from grader.run.grading import run_grade

DATA = EXAMPLES / "qa.jsonl"


def _answer_line(custom_id: str, text: str, finish: str = "stop") -> dict[str, Any]:
    body = {"id": "chatcmpl-1", "object": "chat.completion", "model": "model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}
    return {"id": "vllm-1", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": "vllm-batch-1", "body": body},
            "error": None}


def run_batch(requests: Path, answers: Path,
              reply: Callable[[int, dict[str, Any]], str | None] | None = None) -> list[dict]:
    """The batch runner's output for ``requests``: each answer schema-valid, unless ``reply``
    (request number, its body -> a text, or None for the default; "" drops the answer)."""
    lines = []
    for number, raw in enumerate(requests.read_text().splitlines()):
        request = json.loads(raw)
        schema = request["body"]["response_format"]["json_schema"]["schema"]
        text = reply(number, request["body"]) if reply is not None else None
        if text == "":
            continue
        lines.append(_answer_line(request["custom_id"],
                                  _schema_answer(schema, DRAFT) if text is None else text))
    answers.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def _export(model: Path, out: str, *options: Any) -> Any:
    result = cli("batch", "export", DATA, "-m", model, "-o", out, *options)
    assert result.exit_code == 0, result.output
    return result


def _two_rounds(model: Path, *options: Any) -> tuple[Path, Path]:
    """The rubric format's two rounds, each run by the stand-in runner: (round 1's answers,
    round 2's)."""
    first = _export(model, "drafts.jsonl", *options)
    assert "round 1 of 2" in first.output and "--answers drafts.answers.jsonl" in first.output
    run_batch(Path("drafts.jsonl"), Path("drafts.answers.jsonl"))
    second = _export(model, "rows.jsonl", "--answers", "drafts.answers.jsonl", *options)
    assert "round 2 of 2" in second.output
    assert "grader batch import rows.answers.jsonl" in second.output
    run_batch(Path("rows.jsonl"), Path("rows.answers.jsonl"))
    return Path("drafts.answers.jsonl"), Path("rows.answers.jsonl")


def _records(path: Path) -> list[dict[str, Any]]:
    return [r.to_dict() for _, r in read_records(path)]


def _without_key(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # the resume key holds the backend's name: batch here, the fake's there
    return [{k: v for k, v in r.items() if k != "key"} for r in records]


def test_the_rubric_format_round_trips_to_the_records_grade_writes(model, fake_backend_factory):
    _, answers = _two_rounds(model, "--controls", "0")
    result = cli("batch", "import", answers, "-o", "results.jsonl")
    assert result.exit_code == 0, result.output
    assert "21 of 21 requests answered, 0 missing" in result.output

    run_grade(*make_request(DATA, Path("graded.jsonl"), model=str(model)),
              backend_factory=fake_backend_factory)
    batch, graded = _records(Path("results.jsonl")), _records(Path("graded.jsonl"))
    assert _without_key(batch) == _without_key(graded)
    assert {r["status"] for r in batch} == {"ok", "missing_context"}
    summary = json.loads(Path("results.summary.json").read_text())
    assert summary["run"]["engine"]["backend"] == "batch"
    assert Path("results.rubric.jsonl").is_file()  # the drafts, as grade keeps them


def test_the_controls_are_part_of_the_batch_and_the_import_gives_the_judge_check(model):
    _, answers = _two_rounds(model)
    # 21 graded rows and the reference, a wrong answer and a non-answer of 21 references
    assert len(Path("rows.jsonl").read_text().splitlines()) == 21 + 3 * 21
    result = cli("batch", "import", answers, "-o", "results.jsonl")
    assert result.exit_code == 0, result.output
    assert "judge check:" in result.output
    assert Path("results.controls.jsonl").is_file()


def test_a_format_without_a_stage_is_one_round_with_the_openai_backends_body(model):
    result = _export(model, "requests.jsonl", "--format", "seed", "--controls", "0",
                     "--temperature", "0.5", "--seed", "7", "--top-k", "20")
    assert "round 1 of 1" in result.output and "grader batch import" in result.output
    assert "--structured-outputs-config" in result.output
    lines = [json.loads(line) for line in Path("requests.jsonl").read_text().splitlines()]
    assert len(lines) == 21  # 24 rows, 3 of them not sent (missing_context)
    first = lines[0]
    assert first["method"] == "POST" and first["url"] == "/v1/chat/completions"
    body = first["body"]
    assert body["response_format"]["type"] == "json_schema"
    assert body["structured_outputs"] == {"json": body["response_format"]["json_schema"]["schema"]}
    assert (body["temperature"], body["seed"], body["top_k"], body["n"]) == (0.5, 7, 20, 1)
    assert body["model"] == str(model) and body["skip_special_tokens"] is False
    run_batch(Path("requests.jsonl"), Path("answers.jsonl"))
    imported = cli("batch", "import", "answers.jsonl", "-o", "results.jsonl")
    assert imported.exit_code == 0, imported.output
    records = _records(Path("results.jsonl"))
    assert {r["format"] for r in records} == {"seed"} and len(records) == 24


def test_answers_missing_are_graded_as_missing_counted_and_filled_by_a_later_file(model):
    _export(model, "requests.jsonl", "--format", "seed", "--controls", "0")
    run_batch(Path("requests.jsonl"), Path("answers.jsonl"),
              reply=lambda number, body: "" if number < 3 else None)
    result = cli("batch", "import", "answers.jsonl", "-o", "results.jsonl")
    assert result.exit_code == 0, result.output
    assert "18 of 21 requests answered, 3 missing" in result.output
    missing = [r for r in _records(Path("results.jsonl")) if r["status"] == "engine_error"]
    assert len(missing) == 3
    assert all(r["score"] is None and "no answer to this request" in r["error"] for r in missing)

    # the runner run again on every request: the import resumes and grades the three
    run_batch(Path("requests.jsonl"), Path("rerun.jsonl"))
    again = cli("batch", "import", "answers.jsonl", "rerun.jsonl", "-o", "results.jsonl")
    assert again.exit_code == 0, again.output
    assert {r["status"] for r in _records(Path("results.jsonl"))} == {"ok", "missing_context"}
    summary = json.loads(Path("results.summary.json").read_text())
    assert summary["run"]["resumed_rows"] == 21 - 3 + 3  # the graded and the unsent kept


def test_an_answer_not_in_the_schema_is_a_parse_error_never_a_score(model):
    _export(model, "requests.jsonl", "--format", "seed", "--controls", "0")
    free = "The answer is mostly right. Score: 4"  # what a runner that ignored the schema writes
    run_batch(Path("requests.jsonl"), Path("answers.jsonl"),
              reply=lambda number, body: free if number < 2 else None)
    result = cli("batch", "import", "answers.jsonl", "-o", "results.jsonl")
    assert result.exit_code == 0, result.output
    assert "2 not in their schema (parse_error)" in result.output
    bad = [r for r in _records(Path("results.jsonl")) if r["status"] == "parse_error"]
    assert len(bad) == 2
    assert all(r["score"] is None and r["raw_output"] == free for r in bad)
    assert all("did not enforce response_format" in r["error"] for r in bad)


def test_most_answers_not_in_the_schema_stop_the_import_before_anything_is_written(model):
    _export(model, "requests.jsonl", "--format", "seed", "--controls", "0")
    run_batch(Path("requests.jsonl"), Path("answers.jsonl"),
              reply=lambda number, body: "Score: 4" if number < 11 else None)
    result = cli("batch", "import", "answers.jsonl", "-o", "results.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "11 of the 21 finished answers are not in their request's JSON schema" in result.output
    assert "did not enforce response_format" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not list(Path().glob("results*"))


def test_a_cut_answer_is_truncated_not_counted_against_the_runner(model):
    _export(model, "requests.jsonl", "--format", "seed", "--controls", "0")
    lines = run_batch(Path("requests.jsonl"), Path("answers.jsonl"))
    for line in lines[:15]:  # cut at max_tokens: not whole JSON, and not the runner's fault
        choice = line["response"]["body"]["choices"][0]
        choice["message"]["content"] = choice["message"]["content"][:20]
        choice["finish_reason"] = "length"
    Path("answers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = cli("batch", "import", "answers.jsonl", "-o", "results.jsonl")
    assert result.exit_code == 0, result.output
    statuses = [r["status"] for r in _records(Path("results.jsonl"))]
    assert statuses.count("truncated") == 15


def test_the_first_rounds_answers_are_not_imported_the_second_export_is_named(model):
    _export(model, "drafts.jsonl", "--controls", "0")
    run_batch(Path("drafts.jsonl"), Path("drafts.answers.jsonl"))
    result = cli("batch", "import", "drafts.answers.jsonl", "-o", "results.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "round 1 of 2" in result.output and "--answers drafts.answers.jsonl" in result.output
    assert not Path("results.jsonl").exists()


def _one_round(model: Path, name: str = "requests.jsonl", *options: Any) -> Path:
    _export(model, name, "--format", "seed", "--controls", "0", *options)
    answers = Path(name.removesuffix(".jsonl") + ".answers.jsonl")
    run_batch(Path(name), answers)
    return answers


def test_answers_for_another_export_are_refused_by_its_digest(model):
    _one_round(model, "a.jsonl")
    answers_b = _one_round(model, "b.jsonl", "--temperature", "0.5")
    result = cli("batch", "import", answers_b, "-o", "results.jsonl", "--requests", "a.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "answers for another export" in result.output and "b.answers.jsonl" in result.output
    assert not Path("results.jsonl").exists()


def test_answers_of_two_exports_together_are_refused(model):
    answers_a = _one_round(model, "a.jsonl")
    answers_b = _one_round(model, "b.jsonl", "--temperature", "0.5")
    result = cli("batch", "import", answers_a, answers_b, "-o", "results.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "b.answers.jsonl:1:" in result.output and "answers of two exports" in result.output


def test_a_duplicate_custom_id_is_refused_with_its_line(model):
    answers = _one_round(model)
    lines = answers.read_text().splitlines()
    answers.write_text("\n".join([*lines, lines[4]]) + "\n")
    result = cli("batch", "import", answers, "-o", "results.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT
    assert f"requests.answers.jsonl:{len(lines) + 1}:" in result.output
    assert "first at line 5" in result.output and "duplicate custom_ids" in result.output


@pytest.mark.parametrize(("change", "expected"), [
    (lambda lines: [lines[0], "{not json"], ":2: invalid JSON"),
    (lambda lines: [lines[0].replace('"custom_id": "grader-', '"custom_id": "mine-')],
     "is not one grader batch export wrote"),
])
def test_a_broken_answers_line_is_one_line_naming_it(model, change, expected):
    answers = _one_round(model)
    answers.write_text("\n".join(change(answers.read_text().splitlines())) + "\n")
    result = cli("batch", "import", answers, "-o", "results.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT
    assert expected in result.output and len(result.output.strip().splitlines()) == 1


def test_the_requests_file_given_as_answers_is_named_for_what_it_is(model):
    _one_round(model)
    result = cli("batch", "import", "requests.jsonl", "-o", "results.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "a request, not an answer" in result.output


def test_data_changed_since_the_export_is_refused(model, tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_bytes(DATA.read_bytes())
    assert cli("batch", "export", data, "-m", model, "-o", "requests.jsonl", "--format",
               "seed", "--controls", "0").exit_code == 0
    run_batch(Path("requests.jsonl"), Path("answers.jsonl"))
    data.write_bytes(DATA.read_bytes().replace(b"Everest", b"K2"))
    result = cli("batch", "import", "answers.jsonl", "-o", "results.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "changed since the export" in result.output


def test_the_import_finds_its_export_from_another_directory_only_with_requests(model, tmp_path):
    answers = _one_round(model)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = elsewhere / "answers.jsonl"
    moved.write_bytes(answers.read_bytes())
    Path("requests.grader-batch.json").rename(elsewhere / "kept.json")
    result = cli("batch", "import", moved, "-o", "results.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT and "--requests" in result.output
    (elsewhere / "kept.json").rename("requests.grader-batch.json")
    found = cli("batch", "import", moved, "-o", "results.jsonl")  # the manifest is here
    assert found.exit_code == 0, found.output


def test_an_export_that_answers_none_of_the_runs_requests_is_refused(model):
    answers = _one_round(model)
    result = cli("batch", "export", DATA, "-m", model, "-o", "again.jsonl", "--format", "itemized",
                 "--controls", "0", "--answers", answers)
    assert result.exit_code == EXIT_BAD_INPUT
    assert "none of its 21 answers answers a request of this export" in result.output


def test_stdin_cannot_be_exported(model):
    result = cli("batch", "export", "-", "-m", model, "-o", "r.jsonl", input=DATA.read_text())
    assert result.exit_code == EXIT_BAD_INPUT and "stdin" in result.output


def test_the_rubric_format_with_every_rubric_given_is_one_round(model):
    _, answers = _two_rounds(model, "--controls", "0")
    assert cli("batch", "import", answers, "-o", "results.jsonl").exit_code == 0
    # the rubrics the first import drafted, given: nothing waits on a draft
    result = _export(model, "again.jsonl", "--controls", "0", "--rubric", "results.rubric.jsonl")
    assert "round 1 of 1" in result.output and "grader batch import" in result.output
    assert len(Path("again.jsonl").read_text().splitlines()) == 21
    run_batch(Path("again.jsonl"), Path("again.answers.jsonl"))
    imported = cli("batch", "import", "again.answers.jsonl", "-o", "again-results.jsonl")
    assert imported.exit_code == 0, imported.output
    def graded(path: str) -> list[tuple]:  # the rubric's source is the file now, not the model
        return [(r["id"], r["status"], r["score"], r["raw_output"]) for r in _records(Path(path))]

    assert graded("again-results.jsonl") == graded("results.jsonl")


def test_export_and_import_keep_files_not_graders_own(model):
    # grader.io.outputs, the one policy: a file there that grader did not write is kept
    # unless --overwrite; a file the command reads is never written
    Path("mine.jsonl").write_text("my own notes\n")
    result = cli("batch", "export", DATA, "-m", model, "-o", "mine.jsonl", "--format", "seed")
    assert result.exit_code == EXIT_BAD_INPUT and "--overwrite" in result.output
    assert Path("mine.jsonl").read_text() == "my own notes\n"
    _export(model, "mine.jsonl", "--format", "seed", "--controls", "0", "--overwrite")
    _export(model, "mine.jsonl", "--format", "seed", "--controls", "0")  # grader's own now
    answers = Path("mine.answers.jsonl")
    run_batch(Path("mine.jsonl"), answers)
    before = answers.read_bytes()
    for read in (answers, Path("mine.jsonl")):
        result = cli("batch", "import", answers, "-o", read, "--overwrite")
        assert result.exit_code == EXIT_BAD_INPUT and "which this command reads" in result.output
    assert answers.read_bytes() == before
    Path("results.jsonl").write_text("my own notes\n")
    result = cli("batch", "import", answers, "-o", "results.jsonl")
    assert result.exit_code == EXIT_BAD_INPUT and "--overwrite" in result.output
    assert Path("results.jsonl").read_text() == "my own notes\n"
