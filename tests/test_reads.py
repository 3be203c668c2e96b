"""A file run opens its data at most twice, counted as opens of the path (Python's "open"
audit event, and the paths handed to pyarrow): pass 1 validates, collects the references for
the rubric pass and counts the rows left; pass 2 grades. Nothing opens the data a third time:
not the format's sniff, not the column check, not the rubric pass, not the rows the rubric
pass starts ahead, not the count of the rows left to grade."""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FakeBackend, cli

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


# -- opens of the data path, at the OS's level ------------------------------------------------

_OPENED: list[str] | None = None  # while a test counts: every path Python opened


def _audit(event: str, args: tuple[Any, ...]) -> None:
    # "open" is raised by open(), io.open() and os.open() alike (zipfile's too): every way
    # Python code opens a file, whatever module does it; only opens for reading count
    if event != "open" or _OPENED is None or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path, mode, flags = args
    writes = (flags & (os.O_WRONLY | os.O_RDWR)) if mode is None else set(str(mode)) & set("wax+")
    if not writes:
        _OPENED.append(os.fsdecode(path))


sys.addaudithook(_audit)  # hooks cannot be removed: it counts only while _OPENED is a list




class Reads:
    """Every open of the data file (``d.jsonl``) for reading, and the backends loaded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.opened: list[str] = []
        self.backends: list[FakeBackend] = []
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

    @property
    def reads(self) -> list[str]:
        return [path for path in self.opened if os.path.basename(path) == "d.jsonl"]

    def reset(self) -> None:
        self.opened.clear()
        self.renders.clear()
        self.backends.clear()
        self.ahead.clear()


class AheadBackend(FakeBackend):
    """As vLLM's backend, it streams: the run hands each finished draft to the rubric pass's
    follow-up, which starts that reference's first check rows beside the drafts still running
    (grader.run.ahead); the check pass's identical rows are answered from them."""

    supports_streaming = True


@pytest.fixture
def reads(monkeypatch) -> Iterator[Reads]:
    global _OPENED
    reads = Reads(monkeypatch)
    _OPENED = reads.opened
    try:
        yield reads
    finally:
        _OPENED = None


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
    run_grade(*make_request(data, tmp_path / "one.jsonl", chunk_size=4), backend_factory=_answers)
    run_grade(*make_request(data, tmp_path / "two.jsonl", chunk_size=4),
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


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every open of a file path during the test; and, as an open too, every path handed to
    pyarrow itself (its C++ reader opens files where Python's audit hook cannot see)."""
    global _OPENED
    import pyarrow.parquet as pq

    opened: list[str] = []
    real = pq.ParquetFile

    def parquet_file(source: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(source, (str, os.PathLike)):
            opened.append(os.fspath(source))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(pq, "ParquetFile", parquet_file)
    monkeypatch.setattr("grader.backends.load_backend",
                        lambda *a, **k: FakeBackend(chunk_size=4))
    _OPENED = opened
    try:
        yield opened
    finally:
        _OPENED = None


def _csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _parquet(path: Path, rows: list[dict[str, Any]]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5)
    return path


def _lm_eval(path: Path, rows: list[dict[str, Any]]) -> Path:
    samples = [{"doc_id": n, "doc": {"question": row["input"]}, "target": row["reference"],
                "arguments": {"gen_args_0": {"arg_0": row["input"], "arg_1": {}}},
                "filtered_resps": [row["output_text"]]} for n, row in enumerate(rows)]
    return _write(path, samples)


def _inspect(path: Path, rows: list[dict[str, Any]]) -> Path:
    samples = [{"id": row["id"], "epoch": 1, "input": row["input"], "target": row["reference"],
                "output": {"completion": row["output_text"]}} for row in rows]
    path.write_text(json.dumps({"eval": {"task": "t"}, "samples": samples}), encoding="utf-8")
    return path


WRITERS = {"d.jsonl": _write, "d.csv": _csv, "d.parquet": _parquet,
           "samples_t.jsonl": _lm_eval, "log.json": _inspect}


@pytest.mark.parametrize("name", list(WRITERS))
@pytest.mark.parametrize("extra", [(), ("--format", "seed"), ("--map", "output_text=answer")],
                         ids=["rubric", "seed", "mapped"])
def test_a_file_run_opens_its_data_at_most_twice(tmp_path, model, opens, name, extra):
    """Fresh and resumed, each format: pass 1 and pass 2 open the data path; nothing else does
    (not the format's sniff, not the column check, not the rubric pass)."""
    rows = [{**row, "answer": row["output_text"]} for row in _rows()]
    data = str(WRITERS[name](tmp_path / name, rows))
    out = tmp_path / "r.jsonl"
    if extra[:1] == ("--map",) and name in ("samples_t.jsonl", "log.json"):
        extra = ("--map", "output_text=input")  # a foreign file's own columns
    for run in ("fresh", "resumed"):
        opens.clear()
        _grade(data, out, model, *extra)
        assert opens.count(data) <= 2, (run, opens.count(data))
        assert opens.count(data) >= 1  # the hook sees the reads: the test can fail
