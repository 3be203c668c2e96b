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
from conftest import FakeBackend, StubOpenAIHandler, make_request

from grader.cli import main
from grader.io.results import read_records
from grader.io.rubric_file import read_rubric_file, rubric_key
from grader.judge.rubric import check_schema, make_rubric, parse_labels
from grader.records import LabelledItem, MatchCount
from grader.run.grading import run_grade

DRAFT = {"facts": ["Paris is the capital of France", "the capital of France is Paris",
                   "Paris lies on the Seine"],
         "conclusions": [], "terms": ["capital"]}


class Factory:
    def __init__(self, **options: Any):
        self.options, self.backends = options, []

    def __call__(self, name: str, **options: Any) -> FakeBackend:
        # this file's own draft (the conftest one has other words) unless a test gives one
        self.backends.append(FakeBackend(chunk_size=16, **({"draft": DRAFT} | self.options)))
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
        *make_request(tmp_path / "d.jsonl", out, **fields),
        backend_factory=factory,
    )
    return summary, [r for _, r in read_records(out)]


def test_rubric_is_written_once_per_reference_and_each_answer_only_labelled(tmp_path):
    _data(tmp_path / "d.jsonl", _rows())
    factory = Factory(labels="yn")
    summary, records = _grade(tmp_path, factory)
    (rubric_call, check_call), = [factory.backends[0].history]
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
    assert [r.id for r in records] == [0, 1, 2, 3]
    record = records[0]
    assert record.status == "ok" and record.format == "rubric"
    assert [e.present for e in record.items.facts] == [True, False]
    assert record.items.terms == [LabelledItem(item="capital", present=True)]
    assert record.counts.facts == MatchCount(matched=1, total=2)
    assert record.rubric["key"] == rubric_key("q0", _rows()[0]["reference"])
    assert record.rubric["dropped"] == ["facts: the capital of France is Paris"]
    assert len(record.grade["rationale"]) == 5
    # 5 × (0.7 × 1/2 + 0.21 × 1 + 0.09 × 1) = 3.25
    assert record.score == 3 and record.score_exact == 3.25
    # the rubric file beside the results: one line per reference, with model and prompt hash
    rubric_file = tmp_path / "results.rubric.jsonl"
    lines = read_rubric_file(rubric_file)
    assert len(lines) == 2 and all(line.prompt_sha256 for line in lines.values())
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
    (check_call,) = third.backends[0].history  # no rubric pass
    assert len(check_call[0]) == 2 and summary["run"]["resumed_rows"] == 2
    assert records[0].counts.facts.total == 3 and records[1].counts.facts.total == 2


def test_rubric_columns_skip_the_rubric_pass_and_no_facts_is_empty_rubric(tmp_path):
    rows = _rows()[:2]
    rows[0] |= {"facts": ["Paris is the capital"], "terms": ["Seine"]}
    rows[1] |= {"facts": [], "conclusions": [], "terms": ["capital"]}
    _data(tmp_path / "d.jsonl", rows)
    factory = Factory()
    summary, records = _grade(tmp_path, factory)
    (check_call,) = factory.backends[0].history
    assert len(check_call[0]) == 1
    assert records[0].status == "ok" and records[0].rubric["source"] == "data"
    assert records[1].status == "empty_rubric" and records[1].score is None
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
    assert [r.score_exact for r in after] == [r.score_exact for r in before]
    assert [r.items for r in after] == [r.items for r in before]


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
    lines = [json.loads(line) for line in (tmp_path / "rubric.jsonl").read_text().splitlines()]
    # the tiny model's random items may be empty: give each reference one fact by hand
    for line in lines:
        line["facts"] = line["facts"] or ["Paris is the capital of France"]
    (tmp_path / "rubric.jsonl").write_text("".join(json.dumps(v) + "\n" for v in lines))
    graded = runner.invoke(main, ["grade", str(data), "-m", str(tiny_model), "-o",
                                  str(tmp_path / "r.jsonl"), "--rubric", str(tmp_path / "rubric.jsonl"),
                                  "--confidence"])
    assert graded.exit_code == 0, graded.output
    records = [r for _, r in read_records(tmp_path / "r.jsonl")]
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    for record in records:
        assert record.status == "ok", record
        size = len(record.items.labels())
        # The answer as its tokenizer writes it (what a trained judge emits; the random model
        # picks any tokenization the grammar allows, up to a token a character), + the stop.
        canonical = len(tokenizer(record.raw_output, add_special_tokens=False)["input_ids"]) + 1
        assert canonical <= 3 * size + 10
        assert record.usage.output_tokens <= len(record.raw_output) + 1
        assert record.confidence is not None, record.confidence_error
    evidence = runner.invoke(main, ["grade", str(data), "-m", str(tiny_model), "-o",
                                    str(tmp_path / "e.jsonl"), "--rubric",
                                    str(tmp_path / "rubric.jsonl"), "--evidence", "--limit", "1"])
    assert evidence.exit_code == 0, evidence.output
    (record,) = [r for _, r in read_records(tmp_path / "e.jsonl")]
    assert all(isinstance(e.quote, str) for e in record.items.facts)


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


def test_a_rubric_file_missing_a_reference_has_it_drafted_beside_the_results(tmp_path, capsys):
    _data(tmp_path / "d.jsonl", _rows())
    _grade(tmp_path, Factory())
    beside = tmp_path / "results.rubric.jsonl"
    first, second = [json.loads(line) for line in beside.read_text().splitlines()]
    mine = tmp_path / "mine.jsonl"
    mine.write_text(json.dumps(first | {"facts": ["Paris is the capital"]}) + "\n")
    before = mine.read_text()
    beside.unlink()
    factory = Factory()
    summary, records = _grade(tmp_path, factory, rubric=str(mine), overwrite=True)
    rubric_call, _ = factory.backends[0].history
    assert len(rubric_call[0]) == 1  # only the reference the file lacks
    assert mine.read_text() == before  # the user's file is never written
    (drafted,) = read_rubric_file(beside).values()  # only what grader wrote goes beside
    assert drafted.key == second["key"] and drafted.source == "model"
    assert [r.rubric["source"] for r in records] == ["file", "model", "file", "model"]
    about = summary["run"]["rubric"]
    assert (about["from_file"], about["written_by_judge"], about["not_in_file"]) == (1, 1, 1)
    assert about["path"] == str(beside)
    assert f"rubric: 1 references are not in {mine}: 1 drafted by the judge" in capsys.readouterr().err
    # a rerun keeps the drafted rubric: no model work at all
    again = Factory()
    _grade(tmp_path, again, rubric=str(mine))
    assert again.backends == []


class _Crash(BaseException):  # not an Exception: grade_pending makes those engine_error rows
    pass


def test_the_rubric_file_is_written_as_rubrics_are_drafted_and_a_rerun_resumes_it(tmp_path):
    rows = [{"id": i, "input": f"q{i}", "reference": f"Paris is the capital of France ({i}).",
             "output_text": f"reply-{i}"} for i in range(3)]
    rows.insert(0, rows[0] | {"id": 9, "facts": ["Paris is the capital"]})  # a row's own items
    rows[1]["reference"] = rows[0]["reference"] + " Also Lyon."
    _data(tmp_path / "d.jsonl", rows)

    class OneAtATime(Factory):
        def __call__(self, name: str, **options: Any) -> FakeBackend:
            backend = super().__call__(name, **options)
            backend.chunk_size = 1
            calls = backend.reply

            def reply(conversations, schemas=None):
                if self.crash_at is not None and len(backend.history) == self.crash_at:
                    raise _Crash
                return calls(conversations, schemas)

            backend.reply = reply  # type: ignore[method-assign]
            return backend

    straight = OneAtATime()
    straight.crash_at = None
    _grade(tmp_path, straight)
    whole = (tmp_path / "results.rubric.jsonl").read_text()
    # the order a run without a crash writes: kept rubrics first, then the drafted ones
    assert [json.loads(line)["source"] for line in whole.splitlines()] == ["data", "model", "model", "model"]

    crashing = OneAtATime()
    crashing.crash_at = 2  # the third rubric-pass call
    with pytest.raises(_Crash):
        _grade(tmp_path, crashing, overwrite=True)
    kept = read_rubric_file(tmp_path / "results.rubric.jsonl")
    assert [line.source for line in kept.values()] == ["data", "model", "model"]
    # a torn last line (a kill mid-write) is drafted again, not refused
    with open(tmp_path / "results.rubric.jsonl", "a") as handle:
        handle.write('{"key": "tor')
    rerun = OneAtATime()
    rerun.crash_at = None
    summary, records = _grade(tmp_path, rerun)
    assert summary["run"]["rubric"]["resumed"] == 2 and summary["run"]["rubric"]["written_by_judge"] == 1
    assert all(r.status == "ok" for r in records)
    assert len(read_rubric_file(tmp_path / "results.rubric.jsonl")) == 4


def test_grader_rubric_writes_through_an_openai_compatible_server(tmp_path):
    """A scripted server (as in tests/test_openai_backend.py): it forces nothing itself but
    answers the probe and each draft as a schema-forcing server would."""
    import threading
    from http.server import ThreadingHTTPServer

    posted: list[dict] = []

    class Server(StubOpenAIHandler):
        def do_GET(self) -> None:  # a vLLM server says its version
            if self.path == "/version":
                self._send(200, {"version": "0.32.0"})
            else:
                super().do_GET()

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posted.append(body)
            schema = body["response_format"]["json_schema"]["schema"]
            answer = ({"probe": schema["properties"]["probe"]["enum"][0]}
                      if "probe" in schema["properties"] else DRAFT)
            self._send(200, {"choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant",
                                                      "content": json.dumps(answer)}}],
                             "usage": {"prompt_tokens": 7, "completion_tokens": 30}})

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        data = _data(tmp_path / "d.jsonl", _rows())
        result = CliRunner().invoke(main, [
            "rubric", str(data), "-o", str(tmp_path / "rubric.jsonl"), "--backend", "openai",
            "--base-url", f"http://127.0.0.1:{httpd.server_address[1]}/v1",
            "--max-concurrency", "2", "--request-timeout", "30"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert result.exit_code == 0, result.output
    assert "2 references, 2 written by the judge" in result.output
    lines = read_rubric_file(tmp_path / "rubric.jsonl")
    assert len(lines) == 2 and {line.model for line in lines.values()} == {"judge"}
    drafts = [b for b in posted if "probe" not in json.dumps(b["response_format"])]
    assert len(drafts) == 2 and all(b["model"] == "judge" for b in drafts)
    # the server is asked to end a draft on a loop; the schema it forces has no annotation
    from grader.judge.schema import END_ON_LOOP, LOOP

    assert all(b["repetition_detection"] == LOOP for b in drafts)
    assert not any(END_ON_LOOP in json.dumps(b["response_format"]) for b in posted)
    assert not any("repetition_detection" in b for b in posted if b not in drafts)


def _labelling(name: str, **options: Any) -> FakeBackend:
    """A module-level factory: --data-parallel workers are spawned and import it from here."""
    return FakeBackend(chunk_size=16, labels="yn", draft=DRAFT)


def test_data_parallel_workers_give_the_rubric_and_records_of_one_process(tmp_path):
    from grader.run.data_parallel import DataParallelExecutor

    rows = [r | {"id": f"{r['id']}-{n}"} for n in range(3) for r in _rows()]
    data = _data(tmp_path / "d.jsonl", rows)

    def request(name: str) -> Any:
        return make_request(data, tmp_path / name, chunk_size=2)

    run_grade(*request("one.jsonl"), backend_factory=_labelling)
    summary = run_grade(*request("two.jsonl"), DataParallelExecutor(2, _labelling))
    assert [r for _, r in read_records(tmp_path / "two.jsonl")] == \
        [r for _, r in read_records(tmp_path / "one.jsonl")]
    assert (tmp_path / "two.rubric.jsonl").read_text() == (tmp_path / "one.rubric.jsonl").read_text()
    assert summary["run"]["rubric"]["written_by_judge"] == 2


@pytest.mark.slow
def test_the_tiny_model_with_samples_and_data_parallel_in_the_rubric_format(tiny_model, tmp_path):
    """--samples N: one rubric a reference (the first draft that reads), each of the N samples
    labelled against it; --data-parallel 2: the records and rubric of one process."""
    runner = CliRunner()
    args = ["grade", str(_data(tmp_path / "d.jsonl", _rows())), "-m", str(tiny_model),
            "--backend", "transformers", "--temperature", "1"]
    sampled = runner.invoke(main, [*args, "-o", str(tmp_path / "s.jsonl"), "--samples", "3"])
    assert sampled.exit_code == 0, sampled.output
    rubrics = read_rubric_file(tmp_path / "s.rubric.jsonl")
    assert len(rubrics) == 2
    for _, record in read_records(tmp_path / "s.jsonl"):
        if record.status == "empty_rubric":  # random items: a rubric may have no facts
            continue
        rubric = rubrics[record.rubric["key"]]
        size = sum(len(items) for items in rubric.lists().values())
        assert len(record.samples) == 3
        assert all(sum(getattr(s.counts, c).total for c in ("facts", "conclusions", "terms"))
                   == size for s in record.samples if s.counts)
    summary = json.loads((tmp_path / "s.summary.json").read_text())
    assert summary["run"]["rubric"]["output_tokens"] > 0

    one = runner.invoke(main, [*args, "-o", str(tmp_path / "one.jsonl")])
    two = runner.invoke(main, [*args, "-o", str(tmp_path / "two.jsonl"), "--data-parallel", "2"])
    assert one.exit_code == 0 and two.exit_code == 0, two.output
    assert [r for _, r in read_records(tmp_path / "two.jsonl")] == \
        [r for _, r in read_records(tmp_path / "one.jsonl")]
    assert (tmp_path / "two.rubric.jsonl").read_text() == (tmp_path / "one.rubric.jsonl").read_text()


def test_only_a_torn_last_line_is_left_out_on_resume(tmp_path):
    line = {"key": rubric_key("q", "r"), "input": "q", "reference": "r", "facts": ["r"],
            "conclusions": [], "terms": []}
    path = tmp_path / "rubric.jsonl"
    path.write_text(json.dumps(line))  # saved by an editor without its last newline: kept
    assert list(read_rubric_file(path, resuming=True)) == [line["key"]]
    path.write_text(json.dumps(line) + "\n" + '{"key": "to')  # cut short by a crash: left out
    assert list(read_rubric_file(path, resuming=True)) == [line["key"]]
    with pytest.raises(Exception, match="not JSON"):  # a file the user gave is never guessed at
        read_rubric_file(path)


def test_a_judges_list_markers_are_cut_and_the_items_they_made_distinct_are_one():
    # SmolLM2 numbers its items ("2. The boiling point ...", "3. The boiling point ..."): the
    # marker is list order, not content, and the repeats cost a label each in every answer
    rubric = make_rubric("k", {"facts": ["1. Water boils lower up high.", "2) Everest is 8,849 m"],
                               "terms": ["2. boiling point at the top", "3. boiling point at the top",
                                         "- pressure cooker"]},
                         "Water boils lower up high. Everest is 8,849 m: the boiling point at "
                         "the top is lower, so climbers use a pressure cooker.")
    assert rubric.facts == ["Water boils lower up high.", "Everest is 8,849 m"]
    assert rubric.terms == ["boiling point at the top", "pressure cooker"]
    assert rubric.dropped == ["terms: boiling point at the top"]
    # a person's own items keep their text as written
    assert make_rubric("k", {"facts": ["1. As written"]}, "As written", "file").facts == ["1. As written"]


def test_the_rubric_bar_hears_each_draft_finish_in_a_local_run(tmp_path, monkeypatch):
    # a streaming backend's call reports each draft as it finishes, so a long rubric pass
    # shows progress inside its one call (the tick is passed with the call: grader.run.ahead)
    from grader.run.rubric_pass import _Bar

    ticks, tick = [], _Bar.tick

    def heard(bar, rows):
        ticks.append(rows)
        tick(bar, rows)

    monkeypatch.setattr(_Bar, "tick", heard)

    class Streaming(FakeBackend):
        supports_streaming = True

    data = _data(tmp_path / "d.jsonl", _rows())
    summary = run_grade(*make_request(data, tmp_path / "r.jsonl"),
                        backend_factory=lambda name, **o: Streaming(chunk_size=512))
    assert ticks == [1] * summary["run"]["rubric"]["written_by_judge"] and ticks
    # a backend that does not stream moves the bar per block: no tick within a call
    ticks.clear()
    run_grade(*make_request(data, tmp_path / "again.jsonl"),
              backend_factory=lambda name, **o: FakeBackend(chunk_size=512))
    assert ticks == []


def test_a_draft_the_engine_ended_on_a_loop_keeps_the_items_before_it(tmp_path):
    # SmolLM2 fills every item the grammar admits with copies; the engine ends the draft at
    # the second copy, mid-list, and grader keeps what was complete before the cut
    from grader.backends import Completion

    looped = ('{"facts":["Paris is the capital of France","Paris lies on the Seine",'
              '"Paris lies on the Seine","Paris lies on')
    _data(tmp_path / "d.jsonl", _rows())
    factory = Factory(draft=Completion(looped, "repetition", 50, 30))
    summary, records = _grade(tmp_path, factory)
    record = records[0]
    assert record.status == "ok"
    assert [e.item for e in record.items.facts] == ["Paris is the capital of France",
                                                   "Paris lies on the Seine"]
    assert record.items.conclusions == [] and record.items.terms == []
    assert record.rubric["dropped"] == []  # the copy ended the draft: nothing after it is read
    lines = read_rubric_file(tmp_path / "results.rubric.jsonl")
    assert all(line.ended_on_loop is True for line in lines.values())
    assert summary["run"]["rubric"]["ended_on_loop"] == 2
    # a loop before the first fact was complete leaves no fact: a typed status, no score
    again = tmp_path / "again"
    again.mkdir()
    _data(again / "d.jsonl", _rows())
    _, records = _grade(again, Factory(draft=Completion('{"facts":["Paris is', "repetition", 50, 30)))
    assert {r.status for r in records} == {"empty_rubric"} and {r.score for r in records} == {None}


def test_a_draft_ends_at_an_item_that_repeats_the_one_before_it_its_list_number_aside(tmp_path):
    # SmolLM2 numbers its copies ("3. X", "4. X"): no verbatim repeat for the engine to find,
    # so the draft ran to all 20 items the grammar admits. grader reads it to the first copy,
    # whichever way the engine ended it, and the rest is never read.
    from grader.backends import Completion
    from grader.judge.rubric import draft_looped, parse_draft

    numbered = ('{"facts":["1. Paris is the capital of France","2. Paris lies on the Seine",'
                '"3. Paris lies on the Seine","4. Paris lies on the Seine"],'
                '"conclusions":["1. Paris lies on the Seine"],"terms":["Seine"]}')
    _data(tmp_path / "d.jsonl", _rows())
    summary, records = _grade(tmp_path, Factory(draft=Completion(numbered, "stop", 50, 90)))
    assert {r.status for r in records} == {"ok"}
    assert [e.item for e in records[0].items.facts] == ["Paris is the capital of France",
                                                       "Paris lies on the Seine"]
    assert records[0].items.conclusions == [] and records[0].items.terms == []
    assert summary["run"]["rubric"]["ended_on_loop"] == 2
    # an engine that watches the draft stops it once the copy is closed, and reads the same
    cut = numbered[:numbered.index('"4.')]
    assert draft_looped(cut) and not draft_looped(cut[:cut.index('"3.')])
    assert not draft_looped(cut[:-3])  # the copy not yet closed: it may still differ
    assert parse_draft(cut, "repetition") == parse_draft(numbered, "stop")
    # or that ran on past the copy into max_tokens: the copy ends it all the same
    assert parse_draft(numbered[:-20], "length") == parse_draft(numbered, "stop")
    # items that differ, or copies that are not next to each other, are not a loop
    spread = '{"facts":["1. A is B","2. C is D","3. A is B"],"conclusions":[],"terms":["A is B"]}'
    assert parse_draft(spread, "stop") == ({"facts": ["1. A is B", "2. C is D", "3. A is B"],
                                            "conclusions": [], "terms": ["A is B"]}, False)


def test_the_draft_schema_asks_to_end_on_a_loop_and_its_request_carries_it_as_a_stop_rule():
    from grader.backends import REPETITION, LoopStop, loop_end
    from grader.judge.judges import DraftJudge
    from grader.judge.rubric import draft_looped
    from grader.judge.schema import END_ON_LOOP, LOOP, LOOPED, draft_schema
    from grader.run.rows import generate_request

    schema = draft_schema()
    drafts = DraftJudge()
    request = generate_request([{"role": "user", "content": "q"}], drafts.schema, drafts.loop_test)
    assert request.stop == LoopStop(**LOOP, copied=draft_looped) and drafts.schema == schema
    assert END_ON_LOOP not in request.schema and END_ON_LOOP in schema  # the judge's is kept
    check = generate_request([{"role": "user", "content": "q"}], check_schema(3))
    assert check.schema == check_schema(3) and check.stop is None
    assert REPETITION == LOOPED  # the backends' finish reason is the word the judge reads
    # the loop as vLLM's scheduler finds it: after the token that completes the second copy
    loop = LoopStop(**LOOP)
    item = [7, 8, 9, 10, 11]  # an item and its separator, five tokens
    assert loop_end([1, 2, *item, *item, 3, 4], loop) == 12
    assert loop_end([1, 2, *item, 3, *item], loop) is None
    assert loop_end([5] * 7, loop) is None and loop_end([5] * 9, loop) == 8
    assert loop_end([1, 2, 3, 1, 2, 3], loop) is None  # three tokens: shorter than a loop


@pytest.mark.parametrize("seed", range(5))
def test_loop_end_finds_the_end_vllms_scheduler_finds(seed):
    # CI installs vLLM: a missing vllm fails this test, it never skips it
    import random

    from vllm.sampling_params import RepetitionDetectionParams
    from vllm.v1.core.sched import utils as vllm_utils

    from grader.backends import LoopStop, loop_end
    from grader.judge.schema import LOOP

    rng = random.Random(seed)
    params = RepetitionDetectionParams(**LOOP)
    for _ in range(200):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        # vLLM checks after each token it appends and stops at the first hit
        expected = next((n for n in range(1, len(tokens) + 1)
                         if vllm_utils.check_sequence_repetition(tokens[:n], params)), None)
        assert loop_end(tokens, LoopStop(**LOOP)) == expected, tokens
