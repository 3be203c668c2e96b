"""A rubric-format file run reads its data at most twice (issue 31): pass 1 validates, collects
the references for the rubric pass and counts the rows left; pass 2 grades. Nothing reads the
data a third time: not the rubric pass, not the rows the rubric pass starts ahead, not the
count of the rows left to grade."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeBackend, cli

from grader.io.dataset import Dataset
from grader.io.results import read_records
from grader.io.rubric_file import read_rubric_file

REFERENCES = 6  # more than the controls' minimum (analysis.verdict.MIN_REFERENCES): they run


def _rows(references: int = REFERENCES, answers: int = 2, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"r{i}", "input": f"question {i % references}",
             "reference": f"The answer to question {i % references} is {i % references}.",
             "output_text": f"answer {i}"}
            for i in range(start, start + references * answers)]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


class Reads:
    """Every full read of a dataset (a :class:`Dataset` iterated), and the backends loaded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: list[str] = []
        self.backends: list[FakeBackend] = []
        real = Dataset.__iter__

        def counted(dataset: Dataset) -> Any:
            self.reads.append(dataset.name)
            return real(dataset)

        monkeypatch.setattr(Dataset, "__iter__", counted)
        # each data row's check prompt rendered (the controls' rows, whose output_text is
        # grader's own, are not counted)
        self.renders: list[str] = []
        from grader.run import rows as rows_module

        render = rows_module.render_messages
        answers = {row["output_text"]: row["id"] for row in _rows()}

        def rendering(prompt: Any, fields: Any, **options: Any) -> Any:
            if prompt.name == "seed-check" and fields.get("output_text") in answers:
                self.renders.append(answers[fields["output_text"]])
            return render(prompt, fields, **options)

        monkeypatch.setattr(rows_module, "render_messages", rendering)
        monkeypatch.setattr("grader.backends.load_backend", lambda *a, **k: self.load(*a, **k))
        # the rows the rubric pass's follow-up starts ahead, as it returns them
        self.ahead: list[Any] = []
        from grader.run.rubric_pass import _RunAhead

        follow_up = _RunAhead.follow_up

        def spied(ahead: Any, conversation: Any, completions: Any) -> Any:
            rows = follow_up(ahead, conversation, completions)
            self.ahead += [row.messages for row in rows]
            return rows

        monkeypatch.setattr(_RunAhead, "follow_up", spied)

    def load(self, name: str, **options: Any) -> FakeBackend:
        self.backends.append(AheadBackend(chunk_size=4))
        return self.backends[-1]

    def reset(self) -> None:
        self.reads.clear()
        self.renders.clear()
        self.backends.clear()
        self.ahead.clear()


class AheadBackend(FakeBackend):
    """As vLLM's backend, it streams: the run hands each finished draft to the rubric pass's
    follow-up, which starts that reference's first check rows beside the drafts still running
    (grader.run.ahead); the check pass's identical rows are answered from them."""

    supports_streaming = True


@pytest.fixture
def reads(monkeypatch) -> Reads:
    return Reads(monkeypatch)


def _grade(data: Path, out: Path, model: Path, *extra: Any) -> Any:
    result = cli("grade", data, "-o", out, "-m", model, "--backend", "transformers", *extra)
    assert result.exit_code == 0, result.output
    return result


def _sent(backend: FakeBackend) -> list[Any]:
    return [conversation for call in backend.calls for conversation in call]


def test_a_rubric_run_reads_its_data_twice_fresh_and_resumed(tmp_path, model, reads):
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    _grade(data, out, model)
    assert reads.reads == [str(data)] * 2
    (backend,) = reads.backends
    assert sum(map(len, backend.rubric_calls)) == REFERENCES  # one draft per reference
    records = [r for _, r in read_records(out)]
    assert len(records) == 2 * REFERENCES and {r.status for r in records} == {"ok"}
    # the rows started ahead of the check pass (the first block's, and the controls') are the
    # rows the check pass sends, rendered alike: the first block was not read again for them,
    # and each row reached the engine once (the check pass took them from what ran ahead)
    sent = [json.dumps(messages) for messages in _sent(backend)]
    assert reads.ahead and all(json.dumps(messages) in sent for messages in reads.ahead)
    assert len(sent) == len(set(sent)) == 2 * REFERENCES + 3 * REFERENCES  # rows and controls
    assert len(read_rubric_file(tmp_path / "r.rubric.jsonl")) == REFERENCES

    # each row's check prompt rendered once: the rows started ahead are sent as rendered then
    assert sorted(reads.renders) == sorted(row["id"] for row in _rows())

    # a rerun of a finished run: everything resumed from pass 1's count, no model loaded
    reads.reset()
    _grade(data, out, model)
    assert reads.reads == [str(data)] * 2 and reads.backends == []


class _Crash(BaseException):
    """Not an engine error (which grade_chunk records): the run dies here."""


def test_a_run_stopped_mid_way_resumes_its_rows_and_rubrics_in_two_reads(tmp_path, model, reads):
    data, out = _write(tmp_path / "d.jsonl", _rows()), tmp_path / "r.jsonl"
    crash = [_Crash()]

    class Crashing(AheadBackend):
        def reply(self, conversations: Any, schemas: Any = None) -> Any:
            # the second check block crashes: the first block's records are in the log
            if crash and any("answer 4" in json.dumps(c) for c in conversations):
                raise crash[0]
            return super().reply(conversations, schemas)

    def load(name: str, **options: Any) -> FakeBackend:
        backend = Crashing(chunk_size=4)
        reads.backends.append(backend)
        return backend

    reads.load = load  # type: ignore[method-assign]
    with pytest.raises(_Crash):
        cli("grade", data, "-o", out, "-m", model, "--backend", "transformers",
            catch_exceptions=False)
    assert reads.reads == [str(data)] * 2
    reads.reset()
    crash.clear()
    _grade(data, out, model)
    assert reads.reads == [str(data)] * 2
    (backend,) = reads.backends
    assert backend.rubric_calls == []  # every rubric resumed from the file beside the results
    # the rows the first run did not finish, and the controls
    assert len(_sent(backend)) == 2 * REFERENCES - 4 + 3 * REFERENCES
    records = [r for _, r in read_records(out)]
    assert [r.id for r in records] == [row["id"] for row in _rows()]


def test_a_given_rubric_file_and_its_resume_read_the_data_twice(tmp_path, model, reads):
    data = _write(tmp_path / "d.jsonl", _rows())
    rubric = tmp_path / "mine.rubric.jsonl"
    assert cli("rubric", data, "-o", rubric, "-m", model, "--backend", "transformers").exit_code == 0
    assert reads.reads == [str(data)]  # `grader rubric`: one read
    reads.reset()
    out = tmp_path / "r.jsonl"
    _grade(data, out, model, "--rubric", rubric)
    assert reads.reads == [str(data)] * 2
    (backend,) = reads.backends
    assert backend.rubric_calls == []  # every rubric from the file: none drafted
    assert len(_sent(backend)) == 2 * REFERENCES + 3 * REFERENCES  # rows and controls
    reads.reset()
    _grade(data, out, model, "--rubric", rubric)
    assert reads.reads == [str(data)] * 2 and reads.backends == []


def test_the_rubric_format_on_worker_processes_gives_the_records_of_one(tmp_path):
    """The drafts (read by their own judge, pickled with them) and the check rows (their
    rubric carried with each row, never written into the row) graded in worker processes."""
    from conftest import make_request
    from test_data_parallel import _answers, _data

    from grader.run.data_parallel import DataParallelExecutor
    from grader.run.grading import run_grade

    data = _data(tmp_path)
    run_grade(make_request(data, tmp_path / "one.jsonl", chunk_size=4), backend_factory=_answers)
    run_grade(make_request(data, tmp_path / "two.jsonl", chunk_size=4),
              DataParallelExecutor(2, _answers))
    one = [r.to_dict() for _, r in read_records(tmp_path / "one.jsonl")]
    assert [r.to_dict() for _, r in read_records(tmp_path / "two.jsonl")] == one
    assert {r["status"] for r in one} == {"ok"} and one[0]["rubric"]["source"] == "model"


def test_an_audit_grades_its_rows_in_memory_and_reads_the_data_twice(tmp_path, model, reads,
                                                                       monkeypatch):
    """grader audit: the data read twice (the sample: its ids, then the rows chosen), its own
    rows graded from memory, never read back from the rows file it writes for the reader."""
    from grader.io import dataset as dataset_module

    opened: list[str] = []
    jsonl = dataset_module._jsonl_rows

    def reading(path: str) -> Any:
        opened.append(path)
        return jsonl(path)

    monkeypatch.setattr(dataset_module, "_jsonl_rows", reading)
    data = _write(tmp_path / "d.jsonl", _rows())
    out = tmp_path / "a.jsonl"
    result = cli("audit", data, "--model", model, "-o", out, "--backend", "transformers",
                 "--rows", "3")
    assert result.exit_code == 0, result.output
    rows_file = tmp_path / "a.audit-rows.jsonl"
    assert rows_file.is_file() and str(rows_file) not in opened
    assert reads.reads.count(str(data)) == 2
    assert len([r for _, r in read_records(out)]) == len(rows_file.read_text().splitlines())
