"""The run manifest in the summary, and --fail-on: what produced the grades, and CI exit codes."""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT, make_request

import grader
from grader.cli import main
from grader.config import SamplingConfig
from grader.io.manifest import model_identity
from grader.io.results import read_records
from grader.judge.schema import verdict_schema
from grader.run.grading import run_grade

ROWS = [
    {"id": "a", "input": "Capital of France?", "reference": "Paris is the capital of France.",
     "output_text": "Paris."},
    {"id": "b", "input": "Boiling point?", "reference": "Water boils at 100 C at sea level.",
     "output_text": ""},
    {"id": "c", "input": "Largest planet?", "reference": "Jupiter.", "output_text": "Jupiter."},
]


def _data(tmp_path: Path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _parse_time(stamp: str) -> datetime:
    parsed = datetime.fromisoformat(stamp)
    assert parsed.tzinfo is not None, stamp
    return parsed


def test_the_summary_says_what_produced_the_grades(tiny_model, tmp_path, fake_backend_factory):
    out = tmp_path / "r.jsonl"
    before = datetime.now(UTC).replace(microsecond=0)
    sampling = SamplingConfig(temperature=0.5, top_p=0.9, seed=7)
    summary = run_grade(
        *make_request(_data(tmp_path), out, model=str(tiny_model), sampling=sampling, format="seed"),
        backend_factory=fake_backend_factory,
    )
    after = datetime.now(UTC)
    run = summary["run"]
    assert json.loads((tmp_path / "r.summary.json").read_text())["run"] == run

    assert run["grader_version"] == grader.__version__ == metadata.version("grader")
    # the prompt: which file, and its bytes' hash
    seed = ROOT / "prompts" / "seed.yaml"
    assert run["prompt"]["name"] == "seed"
    assert Path(run["prompt"]["path"]).resolve() == seed.resolve()
    assert run["prompt"]["sha256"] == _sha256(seed)
    # the schema the answers were forced into
    schema = verdict_schema(True)
    text = json.dumps(schema, sort_keys=True, ensure_ascii=False)
    assert run["schema_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert run["checklist"] is True
    # the model: where, its config, each weight file's size and mtime, tokenizer, chat template
    model = run["model"]
    assert model["name"] == str(tiny_model) and model["path"] == str(tiny_model.resolve())
    assert model["config_sha256"] == _sha256(tiny_model / "config.json")
    weights = sorted(tiny_model.glob("*.safetensors"))
    assert weights and model["weights"] == [
        {"file": w.name, "bytes": w.stat().st_size, "mtime": int(w.stat().st_mtime)} for w in weights
    ]
    assert len(model["tokenizer_sha256"]) == 64 and len(model["chat_template_sha256"]) == 64
    # sampling, seed included, and the answer cap
    assert run["sampling"] == sampling.model_dump() | {"max_tokens": 1505}
    assert run["sampling"]["seed"] == 7 and run["sampling"]["temperature"] == 0.5
    # the engine as the backend describes itself (device, dtype, ...: see the CLI test below)
    assert run["engine"] == {"backend": "fake"}
    assert run["token_budget"] is None  # the fake has no context to check against
    # package versions, the ones that change answers included
    versions = run["versions"]
    assert {"python", "grader", "torch", "transformers", "xgrammar", "vllm"} <= set(versions)
    assert versions["python"] == platform.python_version()
    for name in ("torch", "transformers", "xgrammar", "vllm"):
        try:
            assert versions[name] == metadata.version(name)
        except metadata.PackageNotFoundError:
            assert versions[name] is None
    # when
    started, finished = _parse_time(run["started"]), _parse_time(run["finished"])
    assert before <= started <= finished <= after
    # and the rest
    assert run["rows"] == 3 and run["resumed_rows"] == 0
    assert run["data"] == str(tmp_path / "d.jsonl") and run["results"] == str(out)
    assert set(run["host"]) == {"hostname", "platform"}
    assert len(run["run_key"]) == 64


def test_a_prompt_file_is_named_and_hashed_by_its_bytes(tmp_path, fake_backend_factory):
    prompt = tmp_path / "mine.yaml"
    content = "R: {{ item.reference }} — O: {{ item.output_text }}"
    prompt.write_bytes(f"\ufeffmessages:\n- role: user\n  content: |\n    {content}\n".encode())
    summary = run_grade(
        *make_request(_data(tmp_path), tmp_path / "r.jsonl", model="not-a-dir", prompt=str(prompt)),
        backend_factory=fake_backend_factory,
    )
    run = summary["run"]
    assert run["prompt"] == {"name": "mine", "path": str(prompt), "sha256": _sha256(prompt)}
    # a model that is not a directory still gets a manifest entry, with the reason
    assert run["model"]["name"] == "not-a-dir" and "error" in run["model"]


def test_model_identity_follows_what_changes_the_model(tiny_model, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    first = model_identity(str(model))
    assert model_identity(str(model)) == first

    (model / "chat_template.jinja").write_text("{{ messages }}")
    second = model_identity(str(model))
    assert second["chat_template_sha256"] != first["chat_template_sha256"]
    assert second["tokenizer_sha256"] == first["tokenizer_sha256"]

    tokenizer = json.loads((model / "tokenizer.json").read_text())
    tokenizer["added_tokens"][0]["content"] = "<|start|>"
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    third = model_identity(str(model))
    assert third["tokenizer_sha256"] != second["tokenizer_sha256"]

    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"\0")
    fourth = model_identity(str(model))
    assert fourth["weights"][0]["bytes"] == first["weights"][0]["bytes"] + 1
    assert fourth["config_sha256"] == first["config_sha256"]


def test_a_broken_tokenizer_config_does_not_break_the_manifest(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    identity = model_identity(str(tmp_path))
    assert identity["chat_template_sha256"] is None and identity["tokenizer_sha256"] is not None


def test_a_fully_resumed_run_keeps_the_engine_in_its_manifest(tmp_path, fake_backend_factory):
    request, job = make_request(_data(tmp_path), tmp_path / "r.jsonl", model="m")
    first = run_grade(request, job, backend_factory=fake_backend_factory)
    assert first["run"]["engine"] == {"backend": "fake"}
    summary = run_grade(request, job, backend_factory=fake_backend_factory)
    assert summary["run"]["resumed_rows"] == 3
    assert summary["run"]["engine"] == {"backend": "fake"}


@pytest.mark.parametrize("answer_format, prompt_name", [("seed", "seed"), (None, "seed-check")])
def test_rescore_carries_the_manifest_of_the_run_it_rescores(tmp_path, fake_backend_factory,
                                                             answer_format, prompt_name):
    from grader.analysis.compare import compare
    from grader.io.manifest import JUDGE_FIELDS

    graded = tmp_path / "graded.jsonl"
    run = run_grade(*make_request(_data(tmp_path), graded, model="m", format=answer_format),
                    backend_factory=fake_backend_factory)["run"]
    result = CliRunner().invoke(main, ["rescore", str(graded), "-o", str(tmp_path / "again.jsonl")])
    assert result.exit_code == 0, result.output
    rescored = json.loads((tmp_path / "again.summary.json").read_text())["run"]
    # one shape: every key of a grading run's manifest, and where it came from
    assert set(rescored) == set(run) | {"rescored_from"}
    assert {k: rescored[k] for k in JUDGE_FIELDS} == {k: run[k] for k in JUDGE_FIELDS}
    assert rescored["model"]["name"] == "m" and rescored["prompt"]["name"] == prompt_name
    assert rescored["rescored_from"] == str(graded) and rescored["rows"] == 3
    assert rescored["data"] == run["data"] and rescored["results"] == str(tmp_path / "again.jsonl")
    notes = compare(graded, tmp_path / "again.jsonl", bootstrap=0)["notes"]
    assert not [note for note in notes if "judge" in note], notes

    # a file from elsewhere, without a summary: the same keys, the judge unknown
    (tmp_path / "graded.summary.json").unlink()
    assert CliRunner().invoke(main, ["rescore", str(graded), "-o", str(tmp_path / "x.jsonl")]).exit_code == 0
    bare = json.loads((tmp_path / "x.summary.json").read_text())["run"]
    assert set(bare) == set(rescored) and all(bare[k] is None for k in JUDGE_FIELDS)


# ---------------------------------------------------------------- --fail-on, through the CLI


def _grade(data: Path, model: Path, out: Path, *args: str):
    return CliRunner().invoke(
        main,
        ["grade", str(data), "--model", str(model), "-o", str(out), "--format", "seed", "--no-checklist",
         "--batch-size", "8", "--max-tokens", "16", *args],
    )


@pytest.mark.slow
def test_fail_on_turns_statuses_into_exit_codes(tiny_model, tmp_path):
    data, out = _data(tmp_path), tmp_path / "r.jsonl"

    result = _grade(data, tiny_model, out, "--fail-on", "missing_context")
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == "error: --fail-on: 1 missing_context"
    assert "missing_context" in result.output.split("error:")[0]  # the summary came first
    records = [r.to_dict() for _, r in read_records(out)]
    assert [r["status"] for r in records][1] == "missing_context" and len(records) == 3
    run = json.loads((tmp_path / "r.summary.json").read_text())["run"]
    engine = run["engine"]
    assert engine["backend"] == "transformers" and engine["device"] in {"cpu", "cuda"}
    assert engine["model"] == str(tiny_model) and engine["context_length"] == 8192
    assert run["token_budget"]["context_length"] == 8192 and run["token_budget"]["max_tokens"] == 16
    assert run["sampling"]["max_tokens"] == 16 and run["sampling"]["seed"] == 0

    # the same run again resumes every row: no model work, and no engine_error among them
    result = _grade(data, tiny_model, out, "--fail-on", "engine_error")
    assert result.exit_code == 0, result.output
    assert "error" not in result.output

    result = _grade(data, tiny_model, out, "--fail-on", "engine_error, missing_context")
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == "error: --fail-on: 1 missing_context"


@pytest.mark.parametrize("value", ["bogus", "ok,bogus", "OK", "missing-context"])
def test_fail_on_an_unknown_status_is_a_usage_error(tmp_path, value):
    data, out = _data(tmp_path), tmp_path / "r.jsonl"
    result = _grade(data, tmp_path / "no-model", out, "--fail-on", value)
    assert result.exit_code == 2
    assert "unknown status" in result.output and "missing_context" in result.output  # the known ones
    assert not out.exists()


# ---------------------------------------------------------------- the resume key's hash


def _reference_sha256_json(value) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def test_sha256_json_of_row_keys_is_the_plain_json_hash():
    import random

    from grader.io.manifest import sha256_json

    rng = random.Random(11)
    system = {"role": "system", "content": "Grade × the answer ≈ carefully.\n" * 100}
    texts = ["Q?", "é 😀", "lone \ud800 surrogate", "", "x" * 3000, "\u2028\x00"]
    values = []
    for index in range(3000):
        user = {"content": f"Context: {rng.choice(texts)} {index % 7}", "role": "user"}
        roll = rng.random()
        if roll < 0.6:
            messages = [system, user]
        elif roll < 0.7:  # the same position, other text: must not reuse the last bytes
            messages = [{"role": "system", "content": system["content"] + "!"}, user]
        elif roll < 0.75:
            messages = [user]
        elif roll < 0.8:
            messages = []
        elif roll < 0.85:  # values that are not text, keys in another order
            messages = [{"role": "system", "content": 1}, {"role": "user", "extra": [1.5, None]}]
        elif roll < 0.9:
            messages = [{"content": system["content"], "role": "system"}, "not a dict", [1]]
        else:
            messages = [dict(system, content=system["content"].upper()), user, system]
        item_id = rng.choice((index, f"row-{index}", "é", 2**70))
        values.append([item_id, messages, rng.choice(("k" * 64, "other"))])
    mutated = {"role": "system", "content": "before"}
    values += [[1, [mutated], "k"], [1, [mutated], "k"]]
    for value in values:
        assert sha256_json(value) == _reference_sha256_json(value), value
    mutated["content"] = "after"  # changed in place after it was hashed
    assert sha256_json([1, [mutated], "k"]) == _reference_sha256_json([1, [mutated], "k"])
    for other in ({"a": 1, "b": [float("nan")]}, [1, 2], [1, [2], 3, 4], "text", None):
        assert sha256_json(other) == _reference_sha256_json(other)
