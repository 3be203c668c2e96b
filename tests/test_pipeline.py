"""grade() orchestration against a fake backend: order, chunking, failures, files written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import EXAMPLES, check_answer, make_request

from grader.backends import Completion
from grader.io.dataset import DatasetError
from grader.io.outputs import OutputRefused
from grader.io.results import read_records, summary_path
from grader.run.executor import LocalExecutor
from grader.run.grading import run_grade


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _rows(n: int) -> list[dict]:
    # one question and reference: one rubric, and the check pass sends the rows in input order
    return [
        {"id": f"r{i}", "input": "question", "reference": "ref", "output_text": f"out {i}"}
        for i in range(n)
    ]


def test_records_come_back_in_input_order_with_recomputed_scores(tmp_path, fake_backend_factory):
    data = _write_jsonl(tmp_path / "d.jsonl", _rows(6))
    # each row gets different labels so order mix-ups show (the draft: 2 facts, 1 term)
    present = ["nnn", "ynn", "yyn", "yyy", "nyn", "nyy"]
    fake_backend_factory.replies = [check_answer(p) for p in present]
    out = tmp_path / "out" / "results.jsonl"
    summary = run_grade(*make_request(data, out, chunk_size=4), backend_factory=fake_backend_factory)
    records = [r for _, r in read_records(out)]
    assert [r.id for r in records] == [f"r{i}" for i in range(6)]
    assert [r.counts.facts.matched for r in records] == [0, 1, 2, 2, 1, 1]
    assert all(r.status == "ok" and r.format == "rubric" for r in records)
    # 5 × (0.7·facts/2 + 0.21·terms/1 + 0.09), rounded: 0.45, 2.2, 3.95, 5, 2.2, 3.25
    assert [r.score for r in records] == [0, 2, 4, 5, 2, 3]
    assert json.loads(summary_path(out).read_text())["rows"] == 6
    assert summary["graded"] == 6
    # one rubric pass, then the check pass chunked 4 + 2; the conversation sent is the rendered
    # check prompt, the answer last
    backend = fake_backend_factory.backend
    assert [len(c) for c in backend.rubric_calls] == [1]
    assert [len(c) for c in backend.calls] == [4, 2]
    assert [m["role"] for m in backend.calls[0][0]] == ["system", "user"]
    assert backend.calls[0][0][1]["content"].rstrip().endswith("<model_output>\nout 0\n</model_output>")


def test_missing_context_rows_are_not_sent_and_score_zero(tmp_path, fake_backend_factory):
    rows = _rows(3)
    rows[1]["output_text"] = "   "
    del rows[2]["reference"]
    data = _write_jsonl(tmp_path / "d.jsonl", rows)
    out = tmp_path / "r.jsonl"
    summary = run_grade(
        *make_request(data, out), backend_factory=fake_backend_factory
    )
    records = [r for _, r in read_records(out)]
    assert [r.status for r in records] == ["ok", "missing_context", "missing_context"]
    assert [r.score for r in records[1:]] == [0, 0]
    assert "output_text" in records[1].grade["rationale"][0]
    assert "reference" in records[2].error
    assert sum(len(c) for c in fake_backend_factory.backend.calls) == 1
    assert summary["statuses"]["missing_context"] == 2


def test_an_exception_in_one_chunk_marks_only_that_chunk(tmp_path, fake_backend_factory):
    data = _write_jsonl(tmp_path / "d.jsonl", _rows(6))
    fake_backend_factory.replies = [check_answer()] * 4 + [RuntimeError("CUDA out of memory")]
    out = tmp_path / "r.jsonl"
    run_grade(
        *make_request(data, out, chunk_size=4),
        backend_factory=fake_backend_factory,
    )
    records = [r for _, r in read_records(out)]
    assert [r.status for r in records] == ["ok"] * 4 + ["engine_error"] * 2
    assert records[4].score is None and "CUDA out of memory" in records[4].error


def test_a_row_the_engine_failed_alone_is_an_engine_error(tmp_path, fake_backend_factory):
    data = _write_jsonl(tmp_path / "d.jsonl", _rows(2))
    fake_backend_factory.replies = [Completion("", "error", 10, 0, error="grammar failed"), check_answer()]
    out = tmp_path / "r.jsonl"
    run_grade(*make_request(data, out), backend_factory=fake_backend_factory)
    first, second = [r for _, r in read_records(out)]
    assert (first.status, first.score, first.error) == ("engine_error", None, "grammar failed")
    assert second.status == "ok"


def test_truncated_and_unparseable_answers_get_no_score(tmp_path, fake_backend_factory):
    data = _write_jsonl(tmp_path / "d.jsonl", _rows(3))
    fake_backend_factory.replies = [
        Completion(check_answer(), "length", 10, 99),  # parses, but was cut: never graded
        "I think the answer deserves a 4.",
        check_answer("yyyy"),  # a label more than the rubric has items
    ]
    out = tmp_path / "r.jsonl"
    run_grade(*make_request(data, out), backend_factory=fake_backend_factory)
    records = [r for _, r in read_records(out)]
    assert [r.status for r in records] == ["truncated", "parse_error", "invalid_counts"]
    assert all(r.score is None and r.grade is None and r.error for r in records)
    assert records[1].raw_output == "I think the answer deserves a 4."


def test_bad_input_fails_before_the_backend_is_built(tmp_path, fake_backend_factory):
    data = tmp_path / "d.jsonl"
    data.write_text('{"reference": "a", "output_text": "b"}\n{"reference": "a", oops}\n')
    out = tmp_path / "r.jsonl"
    with pytest.raises(DatasetError, match=r"d\.jsonl:2: invalid JSON"):
        run_grade(*make_request(data, out), backend_factory=fake_backend_factory)
    assert fake_backend_factory.backend is None
    assert list(tmp_path.iterdir()) == [data]


def test_examples_grade_end_to_end_with_a_fake_judge(fake_backend_factory, tmp_path):
    out = tmp_path / "r.jsonl"
    summary = run_grade(
        *make_request(EXAMPLES / "qa.jsonl", out),
        backend_factory=fake_backend_factory,
    )
    assert summary["rows"] == 24
    assert summary["statuses"]["missing_context"] == 3
    assert summary["statuses"]["ok"] == 21
    assert summary["mean_score"] == 5.0  # every item of every rubric labelled present


def test_grading_stdin_leaves_no_copy_of_it(tmp_path, fake_backend_factory, monkeypatch):
    import io
    import sys
    import tempfile

    spool = tmp_path / "tmp"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))

    class FakeStdin:
        buffer = io.BytesIO("".join(json.dumps(r) + "\n" for r in _rows(3)).encode())

    monkeypatch.setattr(sys, "stdin", FakeStdin())
    summary = run_grade(*make_request("-", tmp_path / "r.jsonl"),
                        backend_factory=fake_backend_factory)
    assert summary["rows"] == 3 and summary["run"]["data"] == "-"
    assert list(spool.iterdir()) == []


def test_the_output_cannot_be_the_input(tmp_path, fake_backend_factory):
    data = _write_jsonl(tmp_path / "d.jsonl", _rows(2))
    before = data.read_bytes()
    # grader.io.outputs: a file the run reads is never its output, even with overwrite
    with pytest.raises(OutputRefused, match="which this command reads"):
        run_grade(*make_request(data, tmp_path / "." / "d.jsonl", overwrite=True),
                  backend_factory=fake_backend_factory)
    assert data.read_bytes() == before and fake_backend_factory.backend is None


@pytest.mark.parametrize("answer_format", ["seed", None])
def test_a_data_file_that_changes_during_the_run_is_one_line_not_a_traceback(
    tmp_path, fake_backend_factory, answer_format
):
    data = _write_jsonl(tmp_path / "d.jsonl", _rows(4))
    out = tmp_path / "r.jsonl"
    for rows in (_rows(9), _rows(1)):  # rows added, rows removed
        def factory(name, rows=rows, **options):
            # the engine loads between the first pass (4 rows) and the second
            _write_jsonl(data, rows)
            return fake_backend_factory(name, **options)

        _write_jsonl(data, _rows(4))
        with pytest.raises(DatasetError, match=r"d.jsonl: changed while it was being graded"):
            run_grade(*make_request(data, out, overwrite=True, format=answer_format),
                      backend_factory=factory)
        assert not out.exists()  # what was graded stays in the log for a rerun


class _Recorded(LocalExecutor):
    """A local executor that records whether the run opened and closed it."""

    def open(self):
        self.opened = True

    def close(self):
        self.closed = True
        super().close()


@pytest.mark.parametrize("answer_format", ["seed", None])
def test_the_executor_is_closed_when_the_data_check_fails(tmp_path, fake_backend_factory,
                                                          answer_format):
    # a Ray cluster (or data-parallel workers) must not be left open by a bad row found late
    data = _write_jsonl(tmp_path / "d.jsonl", [*_rows(2), _rows(1)[0]])  # a duplicate id
    executor = _Recorded(fake_backend_factory)
    with pytest.raises(DatasetError, match="duplicate id"):
        run_grade(*make_request(data, tmp_path / "r.jsonl", format=answer_format), executor)
    assert executor.opened and executor.closed and fake_backend_factory.backend is None


def test_a_fresh_run_renders_each_row_once(tmp_path, fake_backend_factory, monkeypatch):
    # pass 1 vouches for the seed's plain prompt without rendering; pass 2 renders to send
    import grader.run.rows

    rendered = []
    render = grader.run.rows.render_messages
    monkeypatch.setattr(grader.run.rows, "render_messages",
                        lambda *args, **kwargs: rendered.append(1) or render(*args, **kwargs))
    data = _write_jsonl(tmp_path / "d.jsonl", _rows(5))
    run_grade(*make_request(data, tmp_path / "r.jsonl", format="seed"),
              backend_factory=fake_backend_factory)
    assert len(rendered) == 5 and sum(len(c) for c in fake_backend_factory.backend.calls) == 5


@pytest.mark.parametrize("template", ["Q: {{ item.question }}", "Q: {{ item.question | upper }}"])
def test_a_row_the_prompt_cannot_render_stops_pass_1(tmp_path, fake_backend_factory, template):
    # plain or not, the prompt is rendered where it may fail: the row that lacks the field
    prompt = tmp_path / "p.yaml"
    prompt.write_text(json.dumps({"messages": [{"role": "user", "content": template}]}))
    rows = [{**row, "question": "q"} for row in _rows(3)]
    del rows[1]["question"]
    data = _write_jsonl(tmp_path / "d.jsonl", rows)
    with pytest.raises(DatasetError, match=r"d\.jsonl:2: prompt p: .*'question'"):
        run_grade(*make_request(data, tmp_path / "r.jsonl", format="seed", prompt=str(prompt)),
                  backend_factory=fake_backend_factory)
    assert fake_backend_factory.backend is None


def test_a_run_takes_what_was_there_before_it_out_of_the_collectors_full_passes(
        tmp_path, fake_backend_factory, monkeypatch):
    # a full pass over what torch and transformers made at import took 0.3 s of a 10k-row run;
    # frozen for the run only: after it, a dropped backend (and its watchdog) is collected
    import gc

    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
    run_grade(*make_request(_write_jsonl(tmp_path / "d.jsonl", _rows(2)), format="seed"),
              backend_factory=fake_backend_factory)
    assert "freeze" in calls and calls[-1] == "unfreeze"
