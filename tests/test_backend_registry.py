"""Backends register through the entry-point group ``grader.backends`` (pyproject.toml): a
package outside grader adds one, and ``grader grade --backend NAME`` grades with it."""

from __future__ import annotations

import json

import pytest
from conftest import EXAMPLES, cli

from grader.io.results import read_records

# A package that is not grader: one module, and its distribution's metadata with the entry point.
PLUGIN = '''
from answers import answer

from grader.backends import Backend, Completion


class EchoJudge(Backend):
    """Answers every row with the same seed-format verdict; keeps what it was sent."""

    name = "echo"
    sent = []

    def generate(self, requests):
        EchoJudge.sent.extend(requests)
        return [Completion(answer(), "stop", 10, 5) for _ in requests for _ in range(self.samples)]


class NotABackend:
    pass
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed distribution, echo-plugin, whose entry points register two backends."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "echo_plugin.py").write_text(PLUGIN, encoding="utf-8")
    info = site / "echo_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-plugin\nVersion: 1.0\n",
                                   encoding="utf-8")
    (info / "entry_points.txt").write_text(
        "[grader.backends]\n"
        "echo = echo_plugin:EchoJudge\n"
        "broken = echo_plugin:NotABackend\n"
        "vllm = echo_plugin:EchoJudge\n",  # a built-in name: not taken over
        encoding="utf-8")
    monkeypatch.syspath_prepend(str(site))
    yield site


def test_a_backend_registered_by_another_package_grades_through_the_cli(plugin, tmp_path):
    from echo_plugin import EchoJudge

    out = tmp_path / "r.jsonl"
    # the model is the plugin's to check: a name it knows, not a directory grader would ask for
    result = cli("grade", EXAMPLES / "qa.jsonl", "--model", "echo-judge-1", "-o", out,
                 "--backend", "echo", "--format", "seed", "--controls", 0)
    assert result.exit_code == 0, result.output
    records = [record for _, record in read_records(out)]
    assert records and {r.status for r in records} <= {"ok", "missing_context"}
    assert sum(r.status == "ok" for r in records) == len(EchoJudge.sent) > 0
    # every row with its context reached the plugin's generate()
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary["run"]["engine"]["backend"] == "echo"
    assert summary["run"]["model"] == {"name": "echo-judge-1"}


def test_the_registry_knows_the_built_in_backends_and_those_packages_register(plugin):
    from grader.backends import BACKENDS, EngineSettingsError, backend_class, registered

    found = registered()
    assert {name: found[name] for name in BACKENDS} == BACKENDS  # built-in names stay built in
    assert found["echo"] == "echo_plugin:EchoJudge"
    assert backend_class("echo").__name__ == "EchoJudge"
    with pytest.raises(EngineSettingsError, match="is not a grader.backends.Backend"):
        backend_class("broken")
    with pytest.raises(ValueError, match="unknown backend 'nowhere': choose from .*echo"):
        backend_class("nowhere")


def test_without_the_entry_points_installed_the_built_in_table_serves(monkeypatch):
    """A checkout run without installing it (or an install from before the group) still
    finds its own backends."""
    import importlib.metadata

    from grader.backends import BACKENDS, registered

    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [])
    assert registered() == BACKENDS


def test_an_unknown_backend_is_still_refused_in_one_line(tmp_path):
    result = cli("grade", EXAMPLES / "qa.jsonl", "--model", tmp_path, "-o", tmp_path / "r.jsonl",
                 "--backend", "nowhere")
    assert result.exit_code == 2 and "'nowhere'" in result.output


# --- what a backend declares of itself, asked before it loads (--data-parallel, --ray) -------


def test_backends_declare_their_resources_and_chunk_sizes():
    from grader.backends.openai_backend import OpenAIBackend
    from grader.backends.transformers_backend import TransformersBackend
    from grader.backends.vllm_backend import VLLMBackend
    from grader.config import OpenAIConfig, TransformersConfig, VLLMConfig

    assert VLLMBackend.resources(VLLMConfig(tensor_parallel_size=2)) == {"GPU": 2.0}
    assert VLLMBackend.default_chunk_size(VLLMConfig(chunk_size=96)) == 96
    cpu, auto, cuda = (TransformersConfig(device=d) for d in ("cpu", "auto", "cuda:1"))
    assert TransformersBackend.resources(cpu, gpus=4) == {}
    assert TransformersBackend.resources(auto, gpus=0) == {}
    assert TransformersBackend.resources(auto, gpus=4) == TransformersBackend.resources(cuda) == {
        "GPU": 1.0}
    assert TransformersBackend.default_chunk_size(TransformersConfig(batch_size=5)) == 5
    assert OpenAIBackend.default_chunk_size(OpenAIConfig(max_concurrency=3)) == 12
    assert VLLMBackend.worker_environment("2,3") == {"VLLM_CPU_OMP_THREADS_BIND": "2,3"}
    assert TransformersBackend.worker_environment("2,3") == {}
    # the capabilities each declares
    assert VLLMBackend.supports_streaming and not TransformersBackend.supports_streaming
    assert not OpenAIBackend.supports_streaming
    assert all(b.supports_stop and b.supports_logprobs and b.supports_schema
               for b in (VLLMBackend, TransformersBackend, OpenAIBackend))


def test_the_executors_ask_the_backend_not_its_name():
    """run/data_parallel.py and run/ray_cluster.py hold no backend's name: what they place
    comes from the backend's declarations."""
    from conftest import ROOT

    for module in ("data_parallel", "ray_cluster"):
        text = (ROOT / "grader" / "run" / f"{module}.py").read_text()
        assert '"vllm"' not in text and '"transformers"' not in text, module


def test_reading_a_backends_declarations_imports_no_engine():
    import subprocess
    import sys

    code = ("import sys; from grader.backends import backend_class; "
            "backend_class('vllm').resources; "
            "print('torch' in sys.modules, 'vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
