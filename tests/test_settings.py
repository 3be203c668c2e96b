"""One settings schema (grader.config.GradeSettings) for the command line, the Python API and
the settings file: each setting's type, default and help are written once, the command line's
options are generated from it, and the request, the CLI and the file default alike."""

from __future__ import annotations

import json
import re
import typing

import click
import pytest
from conftest import EXAMPLES, ROOT, cli

import grader
from grader.config import (
    ANSWER_FORMATS,
    FILE_SETTINGS,
    GradeSettings,
    GradeSettingsDict,
    Settings,
    dest_of,
    option_of,
    setting_extra,
)
from grader.run.request import FileJob, GradeRequest, resolve


def _default(name: str):
    return GradeSettings.model_fields[name].get_default(call_default_factory=True)


def _model_dir(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


def test_a_setting_the_file_holds_is_the_file_sections_field():
    defaults = Settings()
    for name in FILE_SETTINGS:
        extra = setting_extra(name)
        for section in extra["sections"]:
            held = defaults if section == "" else getattr(defaults, section)
            if name == "confidence":  # on: sampling.logprobs = 5; off: not asked for
                assert held.logprobs is None and _default(name) is False
                continue
            assert getattr(held, extra["key"]) == _default(name), (name, section)
        if name != "confidence":  # the help beside the field, written once
            first = extra["sections"][0]
            section_model = type(defaults) if first == "" else type(getattr(defaults, first))
            assert (section_model.model_fields[extra["key"]].description
                    == GradeSettings.model_fields[name].description), name


def test_the_request_the_cli_and_the_settings_file_default_to_auto(tmp_path, monkeypatch):
    monkeypatch.delenv("GRADER_BACKEND", raising=False)
    assert Settings().backend == GradeSettings().backend == "auto"
    assert GradeRequest(model="m").backend == "auto"
    built = resolve(GradeSettings(), str(_model_dir(tmp_path)))
    assert built.backend == "auto"
    # the option given is None (the file's value wins), its help names the schema's default
    from grader.cli import grade

    [backend] = [p for p in grade.params if p.name == "backend"]
    assert backend.default is None and "[default: auto]" in (backend.help or "")
    # every request field that is a setting defaults as the setting does
    shared = {"backend", "prompt", "id_column", "source", "format", "rubric", "evidence",
              "grader_config", "aggregate", "controls"}
    request = GradeRequest(model="m")
    assert {n: getattr(request, n) for n in shared} == {n: _default(n) for n in shared}
    job = FileJob("d.jsonl", tmp_path / "r.jsonl")  # and every file job's field
    assert (job.overwrite, job.limit) == (_default("overwrite"), _default("limit"))


def _options(command: click.Command) -> dict[str, click.Option]:
    return {p.name: p for p in command.params if isinstance(p, click.Option) and p.name}


@pytest.mark.parametrize("command", ["grade", "rubric", "audit", "render"])
def test_every_option_that_is_a_setting_is_the_schemas(command):
    from grader import cli as commands

    options = _options(getattr(commands, "rubric_command" if command == "rubric" else command))
    settings = {dest_of(name): name for name in GradeSettings.model_fields}
    checked = 0
    for dest, option in options.items():
        if dest not in settings:
            continue  # not a setting: --model, --output, --fail-on, --pair, ...
        name, checked = settings[dest], checked + 1
        info, extra = GradeSettings.model_fields[name], setting_extra(name)
        assert option_of(name) in option.opts, (name, option.opts)
        # not given: None where the settings file may hold a value, else the field's default
        expected = None if name in FILE_SETTINGS else info.get_default(call_default_factory=True)
        assert option.default == expected or (option.multiple and not option.default), name
        if command != "rubric" or name not in ("limit", "overwrite"):  # rubric's own words
            assert (option.help or "").startswith((info.description or "").rstrip(".")), name
        assert bool(option.multiple) == bool(extra.get("multiple")), name
        bounds = {type(m).__name__: m for m in info.metadata}
        if isinstance(option.type, click.IntRange | click.FloatRange):
            low = getattr(bounds.get("Ge"), "ge", None)
            if low is None and "Gt" in bounds:
                low = bounds["Gt"].gt + (1 if isinstance(option.type, click.IntRange) else 0)
            assert option.type.min == low, name
        else:
            assert not {"Ge", "Gt", "Le"} & set(bounds), name
        if isinstance(option.type, click.Choice):
            annotation = info.annotation
            choices = extra.get("choices") or [
                a for arg in typing.get_args(annotation) or (annotation,)
                for a in typing.get_args(arg) or (arg,) if a is not type(None)]
            assert list(option.type.choices) == list(choices), name
    assert checked >= 7
    if command == "grade":  # grade takes every setting
        assert set(settings) <= set(options)


def test_grade_help_shows_each_setting_once_with_its_default():
    shown = cli("grade", "--help").output
    for name in GradeSettings.model_fields:
        assert len(re.findall(rf"(?<![\w-]){re.escape(option_of(name))}\b(?!-)\s", shown)) >= 1, name
    assert "--samples INTEGER RANGE" in shown and "--from [jsonl|csv|" in shown
    assert "Rows per generate() call [default: 8]." in shown


def test_the_keyword_settings_type_is_the_schema():
    hints = typing.get_type_hints(GradeSettingsDict)
    assert hints == {name: info.annotation for name, info in GradeSettings.model_fields.items()}


def test_the_answer_formats_are_the_judges():
    from grader.judge.schema import ANSWER_FORMATS as JUDGES

    assert tuple(ANSWER_FORMATS) == tuple(JUDGES)


def test_a_settings_object_is_taken_as_keywords_are(tmp_path, fake_backend_factory, monkeypatch):
    from grader.run import grading
    from tests.answers import answer

    fake_backend_factory.default = answer()
    made = grading.make_executor
    monkeypatch.setattr("grader.api.make_executor",
                        lambda *a: made(*a, backend_factory=fake_backend_factory))
    model = str(_model_dir(tmp_path))
    typed = grader.grade_file(EXAMPLES / "qa.jsonl", tmp_path / "typed.jsonl", model,
                              settings=grader.GradeSettings(format="seed", limit=2, controls=0))
    keywords = grader.grade_file(EXAMPLES / "qa.jsonl", tmp_path / "kw.jsonl", model,
                                 format="seed", limit=2, controls=0)
    assert [r.to_dict() for r in typed.records] == [r.to_dict() for r in keywords.records]
    assert typed.summary["rows"] == 2
    # a keyword wins over the object; an object's unset field is not "given"
    with pytest.raises(grader.GraderError, match="--evidence is for --format rubric"):
        grader.Grader(model, settings=grader.GradeSettings(format="seed"), evidence=True)
    with pytest.raises(grader.GraderError, match="settings: expected a grader.GradeSettings"):
        grader.Grader(model, settings={"format": "seed"})  # type: ignore[arg-type]


def test_a_settings_object_leaves_the_settings_file_its_values(tmp_path):
    config = tmp_path / "judge.yaml"
    config.write_text("sampling: {temperature: 0.5, n: 2}\nvllm: {seed: 9}\n")
    from grader.api import _request

    given = grader.GradeSettings(config=str(config), top_k=3)
    request = _request(str(_model_dir(tmp_path)), given)
    assert (request.sampling.temperature, request.sampling.n, request.sampling.top_k) == (0.5, 2, 3)
    assert request.vllm.seed == 9


@pytest.mark.parametrize(("settings", "message"), [
    ({"temperature": "hot"}, "--temperature: Input should be a valid number, got 'hot'"),
    ({"samples": 0}, "--samples: Input should be greater than or equal to 1, got 0"),
    ({"dtype": "int3"}, "dtype: 'int3' is not one of auto, float32, bfloat16, float16"),
    ({"source": "excel"}, "source: 'excel' is not one of jsonl, csv, parquet"),
    ({"backend": "tgi"}, "--backend: unknown backend 'tgi'"),
])
def test_a_mistyped_setting_is_one_option_error_naming_it(tmp_path, settings, message):
    with pytest.raises(grader.GraderError, match=re.escape(message)) as raised:
        grader.Grader(str(_model_dir(tmp_path)), **settings)
    assert raised.value.exit_code == 2


def test_none_is_a_setting_not_given(tmp_path):
    grader.Grader(str(_model_dir(tmp_path)), temperature=None, samples=None).close()  # type: ignore[arg-type]


def test_the_schema_is_json_schema_with_the_clis_spelling():
    schema = GradeSettings.model_json_schema()
    assert schema["properties"]["samples"]["sections"] == ["sampling"]
    assert schema["properties"]["samples"]["key"] == "n"
    assert schema["properties"]["source"]["option"] == ["--from"]
    json.dumps(schema)


def test_a_type_checker_checks_the_keyword_settings(tmp_path, monkeypatch):
    api = pytest.importorskip("mypy.api")
    monkeypatch.setenv("MYPYPATH", str(ROOT))  # this checkout's grader (py.typed: typed)
    script = tmp_path / "uses_grader.py"
    script.write_text(
        "import grader\n"
        "grader.Grader('m', temperature=0.5, samples=2, format='seed')\n"
        "grader.grade_file('d', 'o', 'm', settings=grader.GradeSettings(top_k=3), backend='vllm')\n"
        "grader.Grader('m', temprature=0.5)\n"
        "grader.Grader('m', temperature='hot')\n"
        "grader.grade_file('d', 'o', 'm', source='excel')\n"
    )
    out, _, _ = api.run(["--strict", "--cache-dir", str(tmp_path / "cache"), str(script)])
    wrong = sorted(int(line.split(":")[1]) for line in out.splitlines() if ": error:" in line)
    assert wrong == [4, 5, 6], out


def test_the_cli_and_the_api_resolve_the_same_request(tmp_path, monkeypatch):
    """grade's options and grade_file's keywords go through one resolve: the same settings file
    under the same settings make equal requests."""

    monkeypatch.delenv("GRADER_BACKEND", raising=False)
    config = tmp_path / "judge.yaml"
    config.write_text("sampling: {temperature: 0.5}\nvllm: {seed: 9, max_model_len: 2048}\n")
    model, out = str(_model_dir(tmp_path)), tmp_path / "r.jsonl"
    made: list[tuple[GradeRequest, FileJob]] = []

    class Resolved(grader.GraderError):
        pass

    def capture(request, job, *args, **kwargs):
        made.append((request, job))
        raise Resolved("resolved")

    monkeypatch.setattr("grader.run.grading.run_grade", capture)
    monkeypatch.setattr("grader.api.run_grade", capture)
    result = cli("grade", str(EXAMPLES / "qa.jsonl"), "-m", model, "-o", str(out), "--config",
                 str(config), "--format", "itemized", "--top-k", "3", "--samples", "2",
                 "--chat-template-kwarg", "enable_thinking=false", "--map", "output_text=answer",
                 "--controls", "4", "--truncate", "both", "--backend", "vllm")
    assert result.output == "error: resolved\n" and len(made) == 1, result.output
    with pytest.raises(Resolved):
        grader.grade_file(EXAMPLES / "qa.jsonl", out, model, config=str(config), format="itemized",
                          top_k=3, samples=2, chat_template_kwargs={"enable_thinking": False},
                          map={"output_text": "answer"}, controls=4, truncate="both",
                          backend="vllm")
    (cli_request, cli_job), (api_request, api_job) = made
    assert cli_request == api_request and cli_job == api_job
    assert (api_request.sampling.temperature, api_request.sampling.n, api_request.vllm.seed,
            api_request.vllm.chat_template_kwargs, api_request.truncate, api_request.controls) == (
        0.5, 2, 9, {"enable_thinking": False}, ("output_text", "reference"), 4)
