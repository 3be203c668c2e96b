"""--data-parallel: shards in separate engine processes, merged, equal to one process's run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from grader.cli import main
from grader.analysis.compare import compare
from grader.io.manifest import JUDGE_FIELDS
from grader.io.dataset import Dataset
from grader.io.results import read_records


def test_shards_are_disjoint_round_robin_and_keep_file_ids_and_lines():
    mapping = {"output_text": "response"}
    whole = list(Dataset(str(EXAMPLES / "qa.csv"), mapping=mapping))
    shards = [list(Dataset(str(EXAMPLES / "qa.csv"), mapping=mapping, shard=(k, 3)))
              for k in range(3)]
    ids = [item.id for shard in shards for item in shard]
    assert sorted(ids) == sorted(f"q{i:02d}" for i in range(1, 25))
    assert [item.id for item in shards[1]][:3] == ["q02", "q05", "q08"]
    assert [item.index for item in shards[1]][:3] == [0, 1, 2]  # positions within the shard
    # lines and fields are the file's, as a whole read gives them
    assert [(i.line, i.fields) for i in shards[1]] == [(i.line, i.fields) for i in whole[1::3]]


@pytest.mark.slow
def test_two_engine_processes_give_the_records_of_one(tiny_model, tmp_path):
    args = ["grade", str(EXAMPLES / "qa.jsonl"), "--model", str(tiny_model), "--format", "seed", "--no-checklist",
            "--batch-size", "4"]
    single, double = tmp_path / "single.jsonl", tmp_path / "double.jsonl"
    assert CliRunner().invoke(main, [*args, "-o", str(single)]).exit_code == 0
    result = CliRunner().invoke(main, [*args, "-o", str(double), "--data-parallel", "2"])
    assert result.exit_code == 0, result.output
    assert [r for _, r in read_records(double)] == [r for _, r in read_records(single)]
    summary = json.loads((tmp_path / "double.summary.json").read_text())
    assert summary["run"]["data_parallel"] == 2 and len(summary["run"]["shards"]) == 2
    assert summary["rows"] == 24
    # the manifest of a local run, judge and all: compare sees one judge
    local = json.loads((tmp_path / "single.summary.json").read_text())["run"]
    assert set(summary["run"]) == set(local) | {"data_parallel", "shards"}
    assert {k: summary["run"][k] for k in JUDGE_FIELDS} == {k: local[k] for k in JUDGE_FIELDS}
    notes = compare(single, double, bootstrap=0)["notes"]
    assert not [note for note in notes if "judge" in note], notes

    # the same command again resumes every shard: nothing is graded twice
    again = CliRunner().invoke(main, [*args, "-o", str(double), "--data-parallel", "2"])
    assert again.exit_code == 0, again.output
    assert json.loads((tmp_path / "double.summary.json").read_text())["run"]["resumed_rows"] == 24
    assert [r for _, r in read_records(double)] == [r for _, r in read_records(single)]


def _report(queue, k):
    queue.put(((k, 2), None))


def _die(queue, k):
    import os

    os._exit(9)  # what the OOM killer or a native crash leaves: no report


def test_a_worker_that_dies_without_a_report_is_reported_not_waited_for():
    import multiprocessing

    from grader.run.data_parallel import _outcomes

    context = multiprocessing.get_context("fork")  # no CUDA here; quick to start
    queue = context.Queue()
    processes = [context.Process(target=target, args=(queue, k))
                 for k, target in enumerate((_report, _die))]
    for process in processes:
        process.start()
    outcomes = _outcomes(processes, queue)
    assert outcomes == {0: None, 1: "the worker died without a report (exit code 9)"}


def test_auto_is_resolved_before_the_gpus_are_split(tmp_path, monkeypatch):
    # --backend auto that becomes vLLM must split GPUs by --tensor-parallel-size: two workers
    # of two GPUs each do not fit on a machine with two GPUs, and no worker starts.
    import torch

    from grader import backends
    from grader.run import data_parallel as parallel
    from grader.config import VLLMConfig
    from grader.run.request import GradeRequest

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(backends, "choose_backend", lambda name: ("vllm", "a GPU is visible"))
    request = GradeRequest(
        data=str(EXAMPLES / "qa.jsonl"), output=tmp_path / "r.jsonl", model="unused",
        backend="auto", vllm=VLLMConfig(tensor_parallel_size=2),
    )
    with pytest.raises(parallel.ShardFailed, match="needs 4 GPUs; 2 are visible"):
        parallel.run_grade_parallel(request, 2)
    assert not (tmp_path / "r.jsonl.shards").exists()


def test_vllm_workers_on_cpu_get_disjoint_cores(monkeypatch):
    from grader.run import data_parallel as parallel

    monkeypatch.setattr(parallel, "gpu_groups", lambda n, per_worker: [None] * n)
    monkeypatch.setattr(parallel.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4})
    assert parallel.worker_environments(2, 1, "vllm") == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0,1"}, {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}
    ]
    # more workers than CPUs share them; transformers workers are left to torch
    assert [e["VLLM_CPU_OMP_THREADS_BIND"] for e in parallel.worker_environments(7, 1, "vllm")] \
        == ["0", "1", "2", "3", "4", "0", "1"]
    assert parallel.worker_environments(2, 1, "transformers") == [{}, {}]
