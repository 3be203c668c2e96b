"""--ray: a Ray Data pipeline of engine actors on a local Ray instance, equal to one process."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from grader.cli import main
from grader.io.results import read_records

pytest.importorskip("ray", reason="the ray extra: pip install -e .[ray]")  # installed by setup.sh

pytestmark = pytest.mark.slow

# 8 rows: 2 batches of 4, one per actor, which is all the comparison with one process needs
ROWS = 8
ARGS = ["--format", "seed", "--no-checklist", "--batch-size", "4", "--device", "cpu", "--controls", "0",
        "--limit", str(ROWS)]


@pytest.fixture(autouse=True)
def _no_cluster(monkeypatch):
    """--ray with no address starts a local Ray instance for the run (and stops it after)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def _grade(tiny_model, output, *extra):
    return CliRunner().invoke(
        main, ["grade", str(EXAMPLES / "qa.jsonl"), "--model", str(tiny_model), *ARGS,
               "-o", str(output), *extra]
    )


def test_two_ray_actors_give_the_records_of_one_process_and_resume(tiny_model, tmp_path):
    single, on_ray = tmp_path / "single.jsonl", tmp_path / "ray.jsonl"
    assert _grade(tiny_model, single).exit_code == 0
    result = _grade(tiny_model, on_ray, "--data-parallel", "2", "--ray")
    assert result.exit_code == 0, result.output
    assert [r for _, r in read_records(on_ray)] == [r for _, r in read_records(single)]

    run = json.loads((tmp_path / "ray.summary.json").read_text())["run"]
    assert run["ray"]["replicas"] == 2 and run["ray"]["gpus_per_replica"] == 0
    assert run["engine"]["backend"] == "transformers" and run["engine"]["device"] == "cpu"
    assert run["token_budget"]["context_length"] == 8192
    assert run["rows"] == ROWS and run["resumed_rows"] == 0

    # a run cut short resumes on Ray: keep the first 3 records only and grade again
    lines = on_ray.read_text(encoding="utf-8").splitlines(keepends=True)
    on_ray.write_text("".join(lines[:3]), encoding="utf-8")
    again = _grade(tiny_model, on_ray, "--ray")
    assert again.exit_code == 0, again.output
    run = json.loads((tmp_path / "ray.summary.json").read_text())["run"]
    assert run["resumed_rows"] == 3 and run["ray"]["replicas"] == 1
    assert [r for _, r in read_records(on_ray)] == [r for _, r in read_records(single)]


def test_more_gpus_than_the_cluster_has_is_one_line_and_exit_3(tiny_model, tmp_path):
    result = _grade(tiny_model, tmp_path / "out.jsonl", "--device", "cuda", "--data-parallel", "2",
                    "--ray")
    # --device cuda: each replica asks Ray for one GPU; this cluster has none
    assert result.exit_code == 3, result.output
    assert "GPUs; the Ray cluster has 0" in result.output
    assert not (tmp_path / "out.jsonl").exists()


def test_an_address_nobody_answers_at_is_one_line_and_exit_3_in_seconds(tiny_model, tmp_path):
    import socket

    with socket.socket() as closed:  # a free port, then nobody listens on it
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = _grade(tiny_model, tmp_path / "out.jsonl", f"--ray=127.0.0.1:{port}")
    assert result.exit_code == 3, result.output
    assert result.output.startswith(f"error: --ray 127.0.0.1:{port}: cannot connect")
    assert not (tmp_path / "out.jsonl").exists()
