"""--data-parallel: worker processes, each with its own GPUs (or cores), grade blocks of rows for
one run_grade; the records equal one process's, a failed worker is one line, a rerun resumes.

The fast tests load fake backends in the workers: a worker is a spawned process, so the fakes
are module-level functions of this file, which the worker imports (tests/ is on its sys.path).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import sys
import types
from functools import partial
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES, FakeBackend, make_request

from grader.analysis.compare import compare
from grader.cli import EXIT_ENGINE, main
from grader.config import VLLMConfig
from grader.io.manifest import JUDGE_FIELDS
from grader.io.results import read_records
from grader.run import data_parallel
from grader.run.data_parallel import DataParallelError, DataParallelExecutor
from grader.run.grading import run_grade
from grader.run.request import FileJob, GradeRequest, Interrupted

# A row whose text holds one of these makes the fake backend grading it do what it says.
DIES = "the worker grading this row dies"
CTRL_C_TO_ITSELF = "the worker grading this row gets a Ctrl-C"
CTRL_C_TO_PARENT = "the run gets a Ctrl-C while this row is graded"


class _Acting(FakeBackend):
    """A fake that answers every row, and acts on a row that asks it to."""

    def reply(self, conversations, schemas=None):
        text = " ".join(m["content"] for c in conversations for m in c)
        if DIES in text:
            os._exit(9)  # what the OOM killer or a crash in native code leaves: no report
        if CTRL_C_TO_ITSELF in text:
            os.kill(os.getpid(), signal.SIGINT)
        if CTRL_C_TO_PARENT in text:
            os.kill(os.getppid(), signal.SIGINT)
        return super().reply(conversations, schemas)

    def describe(self):
        return {"backend": self.name, "cuda_visible_devices": os.getenv("CUDA_VISIBLE_DEVICES")}


def _answers(name, **options):
    return _Acting()


def _never_acts(name, **options):
    return FakeBackend()


def _cannot_load(name, **options):
    raise RuntimeError("no engine\nhere")


def _data(tmp_path: Path, marks: dict[int, str] | None = None, n: int = 24) -> Path:
    marks = marks or {}
    path = tmp_path / "data.jsonl"
    rows = [{"id": f"r{i:02d}", "reference": f"ref {i}", "output_text": marks.get(i, f"out {i}")}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _request(tmp_path: Path, data: Path, name: str = "results.jsonl",
             **settings) -> tuple[GradeRequest, FileJob]:
    return make_request(data, tmp_path / name, chunk_size=4, **settings)


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def _model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def _fake_torch(monkeypatch, gpus: int) -> None:
    """torch as the parent sees it, with ``gpus`` CUDA devices (the workers never import it)."""
    cuda = types.SimpleNamespace(is_available=lambda: gpus > 0, device_count=lambda: gpus)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))


@pytest.mark.slow
def test_two_engine_processes_give_the_records_of_one(tiny_model, tmp_path):
    args = ["grade", str(EXAMPLES / "qa.jsonl"), "--model", str(tiny_model), "--format", "seed", "--no-checklist",
            "--batch-size", "4", "--controls", "0", "--limit", "8"]  # a batch of 4 per worker
    single, double = tmp_path / "single.jsonl", tmp_path / "double.jsonl"
    assert CliRunner().invoke(main, [*args, "-o", str(single)]).exit_code == 0
    result = CliRunner().invoke(main, [*args, "-o", str(double), "--data-parallel", "2"])
    assert result.exit_code == 0, result.output
    assert [r for _, r in read_records(double)] == [r for _, r in read_records(single)]
    summary = json.loads((tmp_path / "double.summary.json").read_text())
    assert summary["run"]["data_parallel"]["workers"] == 2
    assert len(summary["run"]["data_parallel"]["environments"]) == 2
    assert summary["rows"] == 8
    # the manifest of a local run, judge and engine and all: compare sees one judge
    local = json.loads((tmp_path / "single.summary.json").read_text())["run"]
    assert set(summary["run"]) == set(local) | {"data_parallel"}
    assert {k: summary["run"][k] for k in JUDGE_FIELDS} == {k: local[k] for k in JUDGE_FIELDS}
    assert summary["run"]["engine"] == local["engine"]
    notes = compare(single, double, bootstrap=0)["notes"]
    assert not [note for note in notes if "judge" in note], notes
    assert multiprocessing.active_children() == []

    # the same command again resumes every row: nothing is graded twice
    again = CliRunner().invoke(main, [*args, "-o", str(double), "--data-parallel", "2"])
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "double.summary.json").read_text())["run"]["resumed_rows"] == 8
    assert [r for _, r in read_records(double)] == [r for _, r in read_records(single)]


def test_fake_workers_give_the_records_of_one_process_in_input_order(tmp_path):
    data = _data(tmp_path)
    one = run_grade(*_request(tmp_path, data, "one.jsonl"), backend_factory=_answers)
    two = run_grade(*_request(tmp_path, data, "two.jsonl"), DataParallelExecutor(2, _answers))
    assert [r for _, r in read_records(tmp_path / "two.jsonl")] == \
        [r for _, r in read_records(tmp_path / "one.jsonl")]
    ids = [r.id for _, r in read_records(tmp_path / "two.jsonl")]
    assert ids == [f"r{i:02d}" for i in range(24)]
    assert two["run"]["data_parallel"] == {"workers": 2, "environments": [{}, {}]}
    assert two["run"]["engine"] == one["run"]["engine"]
    assert multiprocessing.active_children() == []


def test_each_worker_gets_its_own_gpus(tmp_path, monkeypatch):
    _fake_torch(monkeypatch, 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")  # honoured: its devices are split
    request, job = _request(tmp_path, _data(tmp_path, n=8), backend="vllm",
                       vllm=VLLMConfig(tensor_parallel_size=2))
    summary = run_grade(request, job, DataParallelExecutor(2, _answers))
    assert summary["run"]["data_parallel"]["environments"] == [
        {"CUDA_VISIBLE_DEVICES": "3,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}
    ]
    # set in the worker before its backend loaded
    assert summary["run"]["engine"]["cuda_visible_devices"] == "3,5"
    assert summary["rows"] == 8


def test_gpu_groups_are_disjoint_and_too_few_gpus_are_refused(monkeypatch):
    _fake_torch(monkeypatch, 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert data_parallel.gpu_groups(4, 1) == ["0", "1", "2", "3"]
    assert data_parallel.gpu_groups(2, 2) == ["0,1", "2,3"]
    assert data_parallel.gpu_groups(1, 3) == ["0,1,2"]
    with pytest.raises(DataParallelError, match=r"3 x 2 GPU\(s\) each needs 6 GPUs; 4 are visible"):
        data_parallel.gpu_groups(3, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert data_parallel.gpu_groups(2, 1) == ["1", "0"]
    with pytest.raises(DataParallelError, match="needs 4 GPUs; 2 are visible"):
        data_parallel.gpu_groups(2, 2)
    _fake_torch(monkeypatch, 0)
    assert data_parallel.gpu_groups(2, 2) == [None, None]  # no CUDA: nothing to split


def test_auto_is_resolved_before_the_gpus_are_split(tmp_path, monkeypatch):
    # --backend auto that becomes vLLM must split GPUs by --tensor-parallel-size: two workers
    # of two GPUs each do not fit on a machine with two GPUs, and no worker starts.
    from grader import backends

    _fake_torch(monkeypatch, 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(backends, "choose_backend", lambda name: ("vllm", "a GPU is visible"))
    request, job = make_request(EXAMPLES / "qa.jsonl", tmp_path / "r.jsonl", backend="auto",
                           vllm=VLLMConfig(tensor_parallel_size=2))
    with pytest.raises(DataParallelError, match="needs 4 GPUs; 2 are visible"):
        run_grade(request, job, DataParallelExecutor(2, _answers))
    assert multiprocessing.active_children() == []
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_vllm_workers_on_cpu_get_disjoint_cores(monkeypatch):
    monkeypatch.setattr(data_parallel, "gpu_groups", lambda n, per_worker: [None] * n)
    monkeypatch.setattr(data_parallel.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert data_parallel.worker_environments(2, 1, "vllm") == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}, {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}
    ]
    # more workers than CPUs share them; transformers workers are left to torch
    seven = data_parallel.worker_environments(7, 1, "vllm")
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in seven] == ["0", "1", "2", "3", "4", "0", "1"]
    assert data_parallel.worker_environments(2, 1, "transformers") == [{}, {}]
    # the user's own binding stands
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1")
    assert data_parallel.worker_environments(2, 1, "vllm") == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    ]


def _grade(tmp_path: Path, data: Path, factory, *extra: str):
    """``grader grade --data-parallel 2`` with workers that load ``factory``."""
    model = tmp_path / "model"
    if not model.exists():
        _model_dir(tmp_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(data_parallel, "DataParallelExecutor",
                   partial(DataParallelExecutor, backend_factory=factory))
        return CliRunner().invoke(main, [
            "grade", str(data), "--model", str(model), "-o", str(tmp_path / "results.jsonl"),
            "--format", "seed", "--chunk-size", "4", "--data-parallel", "2", *extra,
        ])


def test_a_worker_that_cannot_load_its_backend_is_one_line_and_leaves_nothing(tmp_path):
    result = _grade(tmp_path, _data(tmp_path), _cannot_load)
    assert result.exit_code == EXIT_ENGINE, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1 and lines[0] in {
        f"error: data-parallel worker {k} could not load its backend: RuntimeError: no engine here"
        for k in (0, 1)
    }, result.output
    assert multiprocessing.active_children() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "model"]


def test_a_worker_that_dies_is_reported_and_the_rerun_grades_the_rows_left(tmp_path, monkeypatch):
    data = _data(tmp_path, {13: DIES})
    out, partial_log = tmp_path / "results.jsonl", tmp_path / "results.jsonl.partial"
    result = _grade(tmp_path, data, _answers)
    assert result.exit_code == EXIT_ENGINE, result.output
    assert result.output.splitlines()[-1] in {
        f"error: data-parallel worker {k} died without a report (exit code 9); the rows graded "
        "so far are saved: run the same command again to resume" for k in (0, 1)
    }, result.output
    assert multiprocessing.active_children() == []
    # whole blocks only: the worker that took the row's block had sent one before
    saved = _lines(tmp_path / "results.jsonl.partial")
    assert saved and len(saved) % 4 == 0 and len(saved) < 24 and not out.exists()
    assert all(json.loads(line)["status"] == "ok" for line in saved)
    assert "r13" not in {json.loads(line)["id"] for line in saved}

    again = _grade(tmp_path, data, _never_acts)
    assert again.exit_code == 0, again.output
    summary = json.loads((tmp_path / "results.summary.json").read_text())
    assert summary["run"]["resumed_rows"] == len(saved)
    assert not partial_log.exists()
    # what one process grades from scratch, the same load_backend for it
    monkeypatch.setattr("grader.backends.load_backend", _never_acts)
    one = CliRunner().invoke(main, ["grade", str(data), "--model", str(tmp_path / "model"),
                                    "-o", str(tmp_path / "one.jsonl"), "--format", "seed"])
    assert one.exit_code == 0, one.output
    assert [r for _, r in read_records(out)] == [r for _, r in read_records(tmp_path / "one.jsonl")]


def test_a_ctrl_c_that_reaches_a_worker_is_left_to_the_parent(tmp_path):
    # a terminal's Ctrl-C goes to every process of the group: the workers leave it to the
    # parent, which stops the run (below) or, as here where it got none, goes on
    data = _data(tmp_path, {5: CTRL_C_TO_ITSELF})
    summary = run_grade(*_request(tmp_path, data), DataParallelExecutor(2, _answers))
    assert summary["rows"] == 24 and summary["graded"] == 24


def test_ctrl_c_stops_after_a_block_and_the_rerun_resumes(tmp_path):
    data = _data(tmp_path, {5: CTRL_C_TO_PARENT})
    request, job = _request(tmp_path, data)
    with pytest.raises(Interrupted) as stopped:
        run_grade(request, job, DataParallelExecutor(2, _answers))
    assert multiprocessing.active_children() == []
    saved = _lines(stopped.value.partial)
    assert len(saved) == stopped.value.done and len(saved) % 4 == 0 and 0 < len(saved) < 24

    summary = run_grade(request, job, DataParallelExecutor(2, _never_acts))
    assert summary["run"]["resumed_rows"] == len(saved)
    one = run_grade(*_request(tmp_path, data, "one.jsonl"), backend_factory=_never_acts)
    assert one["rows"] == 24
    assert [r for _, r in read_records(job.output)] == \
        [r for _, r in read_records(tmp_path / "one.jsonl")]
