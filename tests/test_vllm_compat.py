"""vLLM's private state in one module (grader.backends.vllm_compat): the probe that checks it
at engine start, and the rule that only that module names vLLM versions."""

import re

import pytest
from conftest import ROOT


def test_only_the_compat_module_names_vllm_versions():
    version = re.compile(r"(?i)\bvllm\s*(?:serve``\s*)?v?0\.\d+|\b0\.(?:1\d|2\d|3\d)\.\d\b")
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in sorted((ROOT / "grader" / "backends").glob("*.py"))
             + [ROOT / "grader" / "run" / "data_parallel.py", ROOT / "grader" / "run" / "ray_cluster.py"]
             if path.name != "vllm_compat.py"
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if version.search(line)]
    assert found == []


def test_the_probe_passes_on_the_installed_vllm_and_names_the_version_when_a_name_is_missing(
        monkeypatch):
    from vllm.v1.engine.llm_engine import LLMEngine

    from grader.backends import EngineUnavailable
    from grader.backends.vllm_compat import probe, vllm_version

    probe()  # the installed vLLM has every name grader steps its engine with
    monkeypatch.delattr(LLMEngine, "abort_request")
    with pytest.raises(EngineUnavailable) as caught:
        probe()
    message = str(caught.value)
    assert "LLMEngine.abort_request" in message and f"found vllm {vllm_version()}" in message
    assert "\n" not in message


def test_a_missing_engine_internal_stops_the_backend_before_any_engine_starts(
        tiny_model, tmp_path, monkeypatch):
    """The probe runs when the backend loads, before vllm.LLM: one line, exit code 3."""
    import vllm
    from click.testing import CliRunner
    from vllm.v1.engine.llm_engine import LLMEngine

    from grader.cli import main

    started = []
    monkeypatch.setattr(vllm, "LLM", lambda *a, **k: started.append(1))
    monkeypatch.delattr(LLMEngine, "step")
    result = CliRunner().invoke(main, ["grade", str(ROOT / "examples" / "qa.jsonl"), "-m",
                                       str(tiny_model), "--backend", "vllm", "--format", "seed",
                                       "-o", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 3, result.output
    assert "LLMEngine.step" in result.output and started == []
