"""Issue 38 item 15's remainders that are read from the data, refused before a model loads:
a NUL byte in a data rubric column (15a) and an inspect_ai log's ``epochs`` written as text
(15c)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import FakeBackend

from grader.cli import main
from grader.errors import EXIT_BAD_INPUT
from grader.io.dataset import read_items


class Engine:
    def __init__(self) -> None:
        self.backends: list[FakeBackend] = []

    def __call__(self, name: str, **options: Any) -> FakeBackend:
        self.backends.append(FakeBackend(chunk_size=4))
        return self.backends[-1]


@pytest.fixture
def engine(monkeypatch) -> Engine:
    fake = Engine()
    monkeypatch.setattr("grader.backends.load_backend", fake)
    return fake


def _run(*args: Any):
    return CliRunner().invoke(main, [str(a) for a in args], prog_name="grader")


# --- 15a ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("as_text", [False, True])  # a JSONL list, or a list as JSON text (CSV)
def test_a_nul_byte_in_a_data_rubric_column_stops_in_pass_one_naming_file_line_and_column(
        tmp_path, engine, model, as_text):
    facts = ["Paris is the capital.", "It lies on the Sei\x00ne."]
    rows = [{"id": "q1", "input": "Capital?", "reference": "Paris, on the Seine.",
             "output_text": "Paris", "facts": json.dumps(facts) if as_text else facts}]
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "r.jsonl"
    result = _run("grade", data, "-m", model, "-o", out, "--backend", "transformers")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"{data}:1:" in result.output and "facts[1]" in result.output
    assert "NUL" in result.output and "prompt" not in result.output
    assert engine.backends == []  # before any model loads
    assert not out.exists()


# --- 15c ----------------------------------------------------------------------------------------

def _inspect_log(path: Path, epochs: Any, rounds: int = 2) -> Path:
    samples = [{"id": i, "epoch": e, "input": f"question {i}", "target": f"answer {i}",
                "output": {"completion": f"reply {i}/{e}"}}
               for i in (1, 2) for e in range(1, rounds + 1)]
    config = {} if epochs is None else {"epochs": epochs}
    path.write_text(json.dumps({"eval": {"config": config, "dataset": {"sample_ids": [1, 2]}},
                                "samples": samples}))
    return path


@pytest.mark.parametrize("epochs", [2, "2", 2.0])
def test_inspect_epochs_written_as_text_is_read_as_that_number(tmp_path, epochs):
    items = read_items(str(_inspect_log(tmp_path / "log.json", epochs)))
    assert [item.id for item in items] == ["1/1", "1/2", "2/1", "2/2"]


@pytest.mark.parametrize("epochs", ["two", 1.5, 0, -1, True, [2]])
def test_inspect_epochs_that_is_not_a_whole_number_is_refused_naming_the_file(
        tmp_path, engine, model, epochs):
    log = _inspect_log(tmp_path / "log.json", epochs)
    result = _run("grade", log, "-m", model, "-o", tmp_path / "r.jsonl", "--backend",
                  "transformers", "--format", "seed")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"{log}: " in result.output and "not a whole number of epochs" in result.output
    assert engine.backends == []


def test_inspect_log_without_epochs_is_one_epoch(tmp_path):
    items = read_items(str(_inspect_log(tmp_path / "log.json", None, rounds=1)))
    assert [item.id for item in items] == [1, 2]  # one epoch: the sample ids as they are
