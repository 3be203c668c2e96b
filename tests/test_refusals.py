"""Settings, options and templates that could only fail every row (or hang, or crash) are
refused before any model loads, each with one line and exit 2 (issue 19, items 8, 13, 15)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from grader.cli import main
from grader.config import RESERVED_CHAT_TEMPLATE_KWARGS, SettingsError, load_settings


@pytest.fixture
def not_a_model(tmp_path) -> Path:
    """Enough of a model directory for the CLI's first check; these runs stop before loading it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "d.jsonl"
    path.write_text('{"id": 1, "reference": "r", "output_text": "o"}\n')
    return path


def _refused(*args: str) -> str:
    """Runs ``grader grade ARGS``; asserts one line, exit 2, no traceback; returns the line."""
    result = CliRunner().invoke(main, ["grade", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert result.exit_code == 2, result.output
    [line] = result.output.strip().splitlines()
    assert line.startswith("error: ")
    return line


@pytest.mark.parametrize("content, reason", [
    (b"sampling: 5\n", "sampling: expected a mapping of settings, got int 5"),
    (b"vllm: [1, 2]\n", "vllm: expected a mapping of settings, got list"),
    (b'backend: "\xff"\n', "not valid UTF-8 (byte 10)"),
    (b"backend: bogus\n", "backend: unknown backend 'bogus'"),
    (b"transformers:\n  device: gpu\n", "transformers.device: unknown device 'gpu'"),
    (b"sampling:\n  temperature: .inf\n", "sampling.temperature: Input should be a finite number"),
    (b"sampling:\n  temperature: .nan\n", "sampling.temperature: Input should be a finite number"),
    (b"vllm:\n  chat_template_kwargs: {tokenize: true}\n",
     "vllm.chat_template_kwargs: chat template argument 'tokenize' cannot be set"),
])
def test_a_bad_settings_file_is_one_line(tmp_path, data, not_a_model, monkeypatch, content, reason):
    monkeypatch.delenv("GRADER_BACKEND")  # the tests' own choice would override the file's
    settings = tmp_path / "s.yaml"
    settings.write_bytes(content)
    out = tmp_path / "r.jsonl"
    line = _refused(str(data), "-m", str(not_a_model), "-o", str(out), "--config", str(settings))
    assert line == f"error: {settings}: {reason}" or (line.startswith(f"error: {settings}: ")
                                                        and reason in line), line
    assert not out.exists() and not (tmp_path / "r.jsonl.partial").exists()


@pytest.mark.parametrize("option, reason", [
    (["--device", "gpu"], "--device: unknown device 'gpu': expected auto, cpu, cuda, cuda:N or mps"),
    (["--temperature", "inf"], "--temperature: Input should be a finite number"),
    (["--temperature", "nan"], "--temperature: Input should be a finite number"),
    (["--chat-template-kwarg", "tokenize=true"], "--chat-template-kwarg: chat template argument 'tokenize'"),
    (["--chat-template-kwarg", "conversation=[]"], "argument 'conversation' cannot be set"),
    (["--chat-template-kwarg", "add_generation_prompt=false"], "argument 'add_generation_prompt'"),
])
def test_an_option_that_would_fail_every_row_is_refused(tmp_path, data, not_a_model, option, reason):
    line = _refused(str(data), "-m", str(not_a_model), "-o", str(tmp_path / "r.jsonl"), *option)
    assert reason in line, line


def test_every_reserved_chat_template_argument_is_refused_and_others_pass():
    for key in RESERVED_CHAT_TEMPLATE_KWARGS:
        with pytest.raises(SettingsError, match=f"--chat-template-kwarg: chat template argument '{key}'"):
            load_settings(None, {"transformers": {"chat_template_kwargs": {key: 1}}})
    settings = load_settings(None, {"vllm": {"chat_template_kwargs": {"enable_thinking": False}}})
    assert settings.vllm.chat_template_kwargs == {"enable_thinking": False}


@pytest.mark.parametrize("grader, reason", [
    ('{"range": [0, Infinity]}', "range.1: Input should be a finite number"),
    ('{"pass_threshold": NaN}', "pass_threshold: Input should be a finite number"),
    ('{"sampling_params": {"temperature": Infinity}}', "Input should be a finite number"),
])
def test_a_grader_config_with_infinity_or_nan_is_one_line(tmp_path, data, not_a_model, grader, reason):
    config = tmp_path / "g.json"
    body = json.loads(grader.replace("Infinity", '"INF"').replace("NaN", '"NAN"'))
    config.write_text(json.dumps({
        "type": "score_model", "input": [{"role": "user", "content": "{{ sample.output_text }}"}],
        **body}).replace('"INF"', "Infinity").replace('"NAN"', "NaN"))
    line = _refused(str(data), "-m", str(not_a_model), "-o", str(tmp_path / "r.jsonl"),
                    "--grader-config", str(config))
    assert line.startswith(f"error: {config}: ") and reason in line, line


@pytest.mark.parametrize("template, reason", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
     "the template's loops ran more than 1,000,000 steps for one row (nested loops?)"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
     "the template's loops ran more than 1,000,000 steps for one row (nested loops?)"),
    ("{{ 'x' * 10**10 }}", "a sequence repeated 10000000000 times is too long"),
    ("{{ 10 ** (10 ** 10) }}", "10 ** 10000000000 is too large a number"),
    ("{{ 'x'|center(10**10) }}", "center(10000000000) is too wide"),
    ("{% for i in range(99999) %}{{ item.output_text * 1000 }}{% endfor %}",
     "the rendered text passed 16,777,216 characters for one row"),
    ("{{ '\\ud800' }}", "the template printed a lone surrogate (U+D800), which no engine can take"),
    ("{{ '\\x00' }}", "the template printed a NUL byte, which no engine can take"),
])
def test_a_template_that_would_hang_or_fail_every_row_stops_with_one_line(
        tmp_path, data, not_a_model, template, reason):
    prompt = tmp_path / "bomb.json"
    prompt.write_text(json.dumps({"messages": [{"role": "user", "content": template}]}))
    line = _refused(str(data), "-m", str(not_a_model), "-o", str(tmp_path / "r.jsonl"),
                    "--prompt", str(prompt))
    assert line == f"error: {data}:1: prompt bomb ({prompt}): user message: {reason}", line


def test_a_template_with_loops_and_arithmetic_within_bounds_renders():
    from grader.judge.prompts import compile_prompt, render_messages

    prompt = compile_prompt("ok", Path("ok.yaml"), "0", [("user", (
        "{% for i in range(3) %}{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %}"
        "{{ 2 ** 10 }} {{ 'ab' * 2 }} {{ [0] * 2 }} {{ item.output_text|center(7) }}"
        "{% for c in item.output_text %}{{ c|upper }}{% endfor %}"))])
    [message] = render_messages(prompt, {"output_text": "abc"})
    assert message["content"] == "1/3 2/3 3/3 1024 abab [0, 0]   abc  ABC"


def test_a_chat_template_that_prints_a_lone_surrogate_is_refused_before_the_model_loads(
        tiny_model, tmp_path, data):
    model = tmp_path / "surrogate-model"
    shutil.copytree(tiny_model, model)
    template = model / "chat_template.jinja"
    template.write_text(template.read_text().replace("'<|im_start|>assistant\\n'",
                                                     "'<|im_start|>assistant\\ud800\\n'"))
    assert "\\ud800" in template.read_text()
    line = _refused(str(data), "-m", str(model), "-o", str(tmp_path / "r.jsonl"),
                    "--backend", "transformers")
    assert "the model's chat template prints a lone surrogate (U+D800)" in line, line
