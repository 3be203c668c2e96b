"""Settings, options and templates that could only fail every row (or hang, or crash) are
refused before any model loads, each with one line and exit 2 (issue 19, items 8, 13, 15)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from grader.cli import main
from grader.config import RESERVED_CHAT_TEMPLATE_KWARGS, GradeSettings, SettingsError, load_settings


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
            load_settings(None, GradeSettings(chat_template_kwargs={key: 1}))
    settings = load_settings(None, GradeSettings(chat_template_kwargs={"enable_thinking": False}))
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


def _broken(tiny_model: Path, tmp_path: Path, how: str) -> Path:
    model = tmp_path / f"broken-{how}"
    shutil.copytree(tiny_model, model)
    weights = model / "model.safetensors"
    if how == "config not JSON":
        (model / "config.json").write_text('{"model_type": ')
    elif how == "unknown model type":
        config = json.loads((model / "config.json").read_text())
        (model / "config.json").write_text(json.dumps({**config, "model_type": "bogus"}))
    elif how == "no tokenizer":
        (model / "tokenizer.json").unlink()
        (model / "tokenizer_config.json").unlink()
    elif how == "tokenizer not JSON":
        (model / "tokenizer.json").write_text("garbage")
    elif how == "weights cut short":
        with open(weights, "r+b") as stream:
            stream.truncate(weights.stat().st_size - 1000)
    elif how == "weights header cut":
        with open(weights, "r+b") as stream:
            stream.truncate(100)
    elif how == "no weights":
        weights.unlink()
    return model


@pytest.mark.parametrize("how, reason", [
    ("config not JSON", "config.json cannot be read: Expecting value"),
    ("unknown model type", "config.json cannot be used: ValueError: "),
    ("no tokenizer", "its tokenizer cannot be loaded: "),
    ("tokenizer not JSON", "its tokenizer cannot be loaded: "),
    ("weights cut short", "model.safetensors is truncated ("),
    ("weights header cut", "model.safetensors is truncated (100 bytes: no complete header)"),
    ("no weights", "its weights cannot be loaded: OSError: "),
])
def test_a_broken_model_directory_is_one_line_naming_it(tiny_model, tmp_path, data, how, reason):
    model = _broken(tiny_model, tmp_path, how)
    out = tmp_path / "r.jsonl"
    line = _refused(str(data), "-m", str(model), "-o", str(out), "--backend", "transformers")
    assert line.startswith(f"error: {model}: {reason}"), line
    assert not out.exists()


@pytest.mark.parametrize("how", ["config not JSON", "weights cut short", "weights header cut"])
def test_the_model_check_both_backends_share_finds_what_vllm_would_hide(tiny_model, tmp_path, how):
    # vLLM loads in its engine process and reports only "Engine core initialization failed":
    # check_model_path (called by both backends and by the CLI before the data pass) finds these
    from grader.backends.chat import ModelError, check_model_path

    model = _broken(tiny_model, tmp_path, how)
    with pytest.raises(ModelError, match=f"^{model}: "):
        check_model_path(str(model))
    assert check_model_path(str(tiny_model)) == str(tiny_model)


def test_a_huge_prompt_is_counted_in_pieces_to_the_same_count(tiny_model, monkeypatch):
    # one 10 MB row took 2.5 GB when its prompt went to the tokenizer whole (issue 19, item 16)
    from grader.backends import chat

    formatter = chat.ChatFormatter(chat.load_tokenizer(str(tiny_model)))
    text = " ".join(f"The sky is blue, said witness {i}." for i in range(400))
    messages = [{"role": "user", "content": text}]
    exact = formatter.count_many([messages])[0]
    backend, longest = formatter.tokenizer.backend_tokenizer, []

    class Recording:  # the Rust tokenizer, noting the longest text it is given
        def encode(self, piece, **options):
            longest.append(len(piece))
            return backend.encode(piece, **options)

    class Tokenizer:  # the real one, with the recording Rust tokenizer
        def __init__(self, real):
            self.real, self.backend_tokenizer = real, Recording()

        def __getattr__(self, name):
            return getattr(self.real, name)

        def __call__(self, *args, **kwargs):
            return self.real(*args, **kwargs)

    monkeypatch.setattr(chat, "HUGE_PROMPT_CHARS", 2000)
    monkeypatch.setattr(chat, "PIECE_CHARS", 500)
    formatter.tokenizer = Tokenizer(formatter.tokenizer)
    assert formatter.count_many([messages, [{"role": "user", "content": "short"}]])[0] == exact
    assert len(longest) > 20 and max(longest) <= 500


def test_key_values_are_strict_json_or_strings():
    # a summary records engine arguments: Infinity there would make it invalid JSON
    from grader.config import parse_key_values

    parsed = parse_key_values(["a=Infinity", "b=NaN", "c=1e999", "d=[1, 2.5]", "e=" + "[" * 100_000,
                               "f=false"], "--engine-arg")
    assert parsed == {"a": "Infinity", "b": "NaN", "c": "1e999", "d": [1, 2.5],
                      "e": "[" * 100_000, "f": False}
