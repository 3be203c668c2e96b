"""The ``grader`` command line. Each command parses options, calls one function, prints.

Nothing here imports torch, transformers or vllm: the backends are imported when chosen.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from grader import __version__
from grader.backends.chat import quiet_engine_process
from grader.config import (
    GradeSettings,
    SettingExtra,
    dest_of,
    option_of,
    setting_choices,
    setting_extra,
    setting_type,
)
from grader.errors import (
    EXIT_BAD_INPUT,
    EXIT_ENGINE,
    EXIT_FAIL_ON,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    GraderError,
    Terminated,
)

# vLLM's spawned engine processes import this module (the parent's __main__) first: quiet vLLM's
# import-time lines there; in grader's own process it does nothing until the backend asks.
quiet_engine_process()

if TYPE_CHECKING:
    from grader.analysis.summary import Summary
    from grader.run.panel import PanelJudge
    from grader.run.request import FileJob, GradeRequest

_F = TypeVar("_F", bound=Callable[..., Any])


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


# The extra that installs each optional package (vllm and ray name theirs where imported).
EXTRAS = {"torch": "transformers", "transformers": "transformers", "xgrammar": "transformers",
          "scipy": "analysis", "matplotlib": "analysis", "inspect_ai": "inspect"}


class _EchoHandler(logging.Handler):
    """Each log record as one line on the stderr of the moment (as Click's runner sees it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(self.format(record), err=True)
        except Exception:
            self.handleError(record)


def _configure_logging() -> None:
    """The library logs under ``grader``; a command shows INFO and above as bare lines, once."""
    logger = logging.getLogger("grader")
    if not any(isinstance(handler, _EchoHandler) for handler in logger.handlers):
        logger.addHandler(_EchoHandler())
    logger.setLevel(logging.INFO)


class _BackendName(click.Choice[str]):
    """``--backend``: a built-in name, or a backend an installed package registers."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from grader.config import known_backend

        if isinstance(value, str) and value not in self.choices and known_backend(value):
            return value
        return super().convert(value, param, ctx)


class _Group(click.Group):
    """Commands, with every way one stops early turned into one line and an exit code
    (docs/runs.md, "Exit codes"); an internal error's traceback is saved to a file."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_ARGV] = list(args)  # the command line as typed, for the resume line
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        _configure_logging()
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except GraderError as exc:
            _fail(str(exc), exc.exit_code)
        except KeyboardInterrupt as exc:
            # not click's "Aborted!" and exit 1: 1 is --fail-on's code
            terminated = isinstance(exc, Terminated)
            _fail("stopped by SIGTERM" if terminated else "interrupted",
                  EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)
        except Exception as exc:
            module = (getattr(exc, "name", None) or "").partition(".")[0]
            if isinstance(exc, ModuleNotFoundError) and module in EXTRAS:
                _fail(f"grader {ctx.invoked_subcommand} needs {module}, which is not installed: "
                      f"pip install 'grader[{EXTRAS[module]}]'", EXIT_ENGINE)
            _internal_error(exc)


_ARGV = "grader.argv"


def _internal_error(exc: Exception) -> NoReturn:
    """A bug: one line, the traceback saved to a file (GRADER_DEBUG=1 prints it), exit 70."""
    import os
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(exc))
    where = "printed above"
    if os.environ.get("GRADER_DEBUG", "") in ("", "0"):
        with contextlib.suppress(OSError):  # an unwritable temp dir: printed instead
            fd, path = tempfile.mkstemp(prefix="grader-traceback-", suffix=".txt")
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as stream:
                stream.write(text)
            where = f"saved in {path}"
    if where == "printed above":
        click.echo(text, err=True, nl=False)
    message = " ".join(str(exc).split())
    if len(message) > 200:
        message = message[:200] + "..."
    _fail(f"internal error (a bug in grader, please report it): {type(exc).__name__}: {message} "
          f"(the traceback is {where}; GRADER_DEBUG=1 prints it)", EXIT_INTERNAL)


def _resume_command() -> str:
    """The command line that resumes this run: the one typed, without --overwrite."""
    import shlex

    ctx = click.get_current_context()
    root = ctx.find_root()
    args = [a for a in root.meta.get(_ARGV, sys.argv[1:]) if a != "--overwrite"]
    return shlex.join([*(root.info_name or "grader").split(), *args])


@click.group(cls=_Group,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="grader")
def main() -> None:
    """Offline LLM-as-a-judge: score model answers against references with a local judge model."""


# --fail-on's words for the judge check's verdict (grader.analysis.verdict.FAIL_ON, spelled out
# so that --help imports no analysis module; a test compares them)
VERDICT_WORDS = ("weak", "no-signal", "too-few")


def _parse_statuses(ctx: click.Context, param: click.Parameter,
                    value: str | None) -> frozenset[str]:
    from grader.status import Status

    if not value:
        return frozenset()
    names = {name.strip() for name in value.split(",") if name.strip()}
    unknown = names - {str(s) for s in Status} - set(VERDICT_WORDS)
    if unknown:
        known = ", ".join(str(s) for s in Status)
        raise click.BadParameter(f"unknown status {', '.join(sorted(unknown))}; known: {known}; "
                                 f"or a verdict of the judge check: {', '.join(VERDICT_WORDS)}")
    return frozenset(names)


def _check_fail_on(summary: Summary, fail_on: frozenset[str]) -> None:
    hits = {s: n for s, n in summary.statuses.items() if s in fail_on and n}
    listed = [f"{n} {s}" for s, n in hits.items()]
    verdict = summary.judge_check.verdict if summary.judge_check else None
    if verdict is not None:
        from grader.analysis.verdict import FAIL_ON

        if any(verdict in FAIL_ON[word] for word in fail_on & set(VERDICT_WORDS)):
            listed.append(f"judge check {verdict}")
    if listed:
        _fail(f"--fail-on: {', '.join(listed)}", EXIT_FAIL_ON)


def _parse_map(ctx: click.Context, param: click.Parameter,
               value: tuple[str, ...]) -> dict[str, str]:
    from grader.io.dataset import MappingError, parse_mapping

    try:
        return parse_mapping(value)
    except MappingError as exc:
        raise click.BadParameter(str(exc)) from None


# options several commands declare, each with its own help
_output = functools.partial(click.option, "--output", "-o", required=True,
                            type=click.Path(dir_okay=False, path_type=Path))
_map_option = functools.partial(click.option, "--map", "mapping", multiple=True,
                                callback=_parse_map, metavar="FIELD=COLUMN")
_overwrite = functools.partial(click.option, "--overwrite", is_flag=True)


# every grade setting, in GradeSettings' order; the first are those that read the rows and choose
# the judge (render takes them too)
_SETTINGS = tuple(GradeSettings.model_fields)
_INPUT_SETTINGS = _SETTINGS[:_SETTINGS.index("config")]


def _settings_options(*names: str, helps: dict[str, str] | None = None) -> Callable[[_F], _F]:
    """The Click options of the grade settings ``names``, in that order, generated from their
    :class:`GradeSettings` fields; ``helps``: a command's own help for an option. One the
    settings file holds too defaults to None (not given: the file's value, else the field's)."""

    def decorate(command: _F) -> _F:
        for name in reversed(names):
            command = _setting_option(name, (helps or {}).get(name))(command)
        return command

    return decorate


def _setting_option(name: str, help_text: str | None = None) -> Callable[[_F], _F]:
    """The Click option of the grade setting ``name``."""
    info, extra = GradeSettings.model_fields[name], setting_extra(name)
    default = info.get_default(call_default_factory=True)
    declarations = [*extra.get("option", [option_of(name)]), dest_of(name)]
    attributes: dict[str, Any] = {
        "default": None if "sections" in extra else default,
        "help": _setting_help(info.description or "", extra, default, help_text),
        **{key: extra[key] for key in ("metavar", "multiple", "envvar", "flag_value") if key in extra},
        "show_envvar": "envvar" in extra,
    }
    if "flag_value" in extra:
        attributes["is_flag"] = False
    if name == "map":
        attributes["callback"] = _parse_map
    kind = _setting_type(name)
    if kind is bool:
        if "/" not in declarations[0]:
            attributes["is_flag"] = True
    elif kind is not None:
        attributes["type"] = kind
    return click.option(*declarations, **attributes)


def _setting_help(description: str, extra: SettingExtra, default: Any,
                  help_text: str | None) -> str | None:
    """The field's description, with ``[default: ...]`` where it has one to show and
    ``Repeatable.`` for an option given once per value."""
    text = help_text or description
    shown = extra.get("default_help")
    if shown is None and default is not None and not isinstance(default, (bool, dict)):
        shown = f"{default:g}" if isinstance(default, float) else str(default)
    if shown is not None and help_text is None:
        text = (f"{text[:-1]} [default: {shown}]." if text.endswith(".")
                else f"{text} [default: {shown}]".strip())
    if extra.get("multiple"):
        text += " Repeatable."
    return text or None


def _setting_type(name: str) -> Any:
    """The Click type of the grade setting ``name``: bool for a flag, None for text."""
    extra, kind = setting_extra(name), setting_type(name)
    if extra.get("path") is not None:
        return click.Path(exists=extra["path"] == "file", dir_okay=False)
    if name == "backend":  # a built-in name, or one an installed package registers
        return _BackendName(setting_choices(name))
    if setting_choices(name):
        return click.Choice(setting_choices(name))
    if kind in (int, float):
        return _number_type(name, kind)
    return bool if kind is bool else None


def _number_type(name: str, kind: type) -> Any:
    """The Click type of the number setting ``name``, with its field's bounds."""
    import annotated_types

    low: float | None = None
    high: float | None = None
    above = False  # x > low, not x >= low
    for bound in GradeSettings.model_fields[name].metadata:
        if isinstance(bound, annotated_types.Ge):
            low = _whole(bound.ge)
        elif isinstance(bound, annotated_types.Gt):
            low, above = _whole(bound.gt), True
        elif isinstance(bound, annotated_types.Le):
            high = _whole(bound.le)
    if low is None and high is None:
        return click.INT if kind is int else click.FLOAT
    if kind is int:  # x > 0 is x >= 1, as the help says it
        return click.IntRange(min=None if low is None else int(low) + above,
                              max=None if high is None else int(high))
    return click.FloatRange(min=low, max=high, min_open=above)


def _whole(bound: object) -> float:
    """A pydantic bound as Click's help should show it: ``[x>=0]``, not ``[x>=0.0]``."""
    assert isinstance(bound, int | float), bound
    return int(bound) if bound == int(bound) else bound


@main.command()
@click.argument("data", required=False)
@click.option("--model", "-m", multiple=True,
              help="Local model directory (never downloaded); with --backend openai the name the "
              "server serves [default there: its only model]. Given twice or more: a judge "
              "panel (docs/usage.md, \"Judge panels\").")
@click.option("--panel-temperature", "panel_temperatures", multiple=True,
              type=click.FloatRange(min=0), metavar="T",
              help="A judge panel: each judge's temperature, one per --model in order (the same "
              "model twice at two temperatures stands in for two judges) [default: --temperature].")
@_output(help="Results JSONL; the summary goes beside it as NAME.summary.json (for NAME.jsonl).")
@click.option("--pair", nargs=2, type=click.Path(exists=True), default=None, metavar="A B",
              help="Instead of DATA: two data files of answers to the same rows (by id), judged "
              "against each other (--format pairwise; the models are named after the files); the "
              "pairs are written beside the results as NAME.pairs.jsonl.")
@_settings_options(*_SETTINGS[:_SETTINGS.index("controls")])
@click.option("--fail-on", "fail_on", default=None, callback=_parse_statuses,
              metavar="STATUS[,STATUS...]",
              help="Exit 1 when any row ends with one of these statuses, or when the judge "
              "check's verdict is one of weak (weak or no signal), no-signal, too-few (for CI "
              "pipelines).")
@_settings_options(*_SETTINGS[_SETTINGS.index("controls"):])
@click.option("--write-inspect", "write_inspect", type=click.Path(dir_okay=False, path_type=Path),
              default=None, metavar="OUT.eval",
              help="DATA an inspect_ai log: also write a copy of it with a `grader` score on every "
              "sample and grader's metrics in its results, for inspect view and inspect's log "
              "tools (docs/formats.md, \"inspect_ai\"); DATA is never modified.")
def grade(data: str | None, model: tuple[str, ...], output: Path, pair: tuple[str, str] | None,
          panel_temperatures: tuple[float, ...], fail_on: frozenset[str],
          write_inspect: Path | None, **options: Any) -> None:
    """Grade DATA (.jsonl, .csv, .parquet, - for JSONL on stdin, an lm-eval samples file, an
    inspect_ai log or a save_to_disk folder) with a local judge model; or two models' answers
    against each other (--pair A B)."""
    from grader.backends.chat import require_offline
    from grader.run.grading import make_executor, run_grade

    given = _given(options)
    panel = _panel_judges(model, panel_temperatures, pair, given.config)
    judge_model = panel[0].model if panel else model[0] if model else None
    graded, settings = _grade_input(data, pair, output, given)
    _check_write_inspect(write_inspect, data, pair, given)
    require_offline()
    with _grade_failures(graded, output):
        request, job = _resolve(settings, judge_model, graded, output)
        _check_fail_on_controls(request.controls, fail_on)
        if pair:  # once the options are known good
            _write_pairs(request, job, pair, given)
        if panel:
            summary = _grade_panel(request, job, panel, given)
        else:
            summary = run_grade(request, job, make_executor(given.ray, given.data_parallel))
    _print_graded(summary, output, bool(panel))
    _write_inspect(write_inspect, graded, output, summary)
    _check_fail_on(summary, fail_on)


def _given(options: dict[str, Any], **fixed: object) -> GradeSettings:
    """The grade settings given among a command's Click parameters ``options`` (None or empty:
    not given), with ``fixed`` the command's own; repeated ``KEY=VALUE`` read as a dict."""
    from grader.config import parse_key_values

    given: dict[str, object] = {}
    for name in GradeSettings.model_fields:
        value = options.get(dest_of(name))
        if value is None or value == ():
            continue
        if setting_extra(name).get("key_value"):
            try:
                value = parse_key_values(value, option_of(name))
            except ValueError as exc:
                raise click.UsageError(str(exc)) from None
        given[name] = value
    # not validated again: Click checked each option, and Settings checks the file's with them
    given.update(fixed)
    return GradeSettings.model_construct(set(given), **given)


def _grade_input(data: str | None, pair: tuple[str, str] | None, output: Path,
                 given: GradeSettings) -> tuple[str, GradeSettings]:
    """The data the run grades and its settings: DATA as given, or with --pair the pairs
    written beside the results, in the pairwise format."""
    if not pair:
        if data is None:
            raise click.UsageError("Missing argument 'DATA' (or --pair A B).")
        return data, given
    if data is not None:
        raise click.UsageError("give DATA or --pair A B, not both")
    if given.format not in (None, "pairwise") or given.grader_config:
        raise click.UsageError("--pair judges two answers side by side: --format pairwise")
    from grader.io.pairs import pairs_path

    return str(pairs_path(output)), given.model_copy(
        update={"format": "pairwise", "map": None, "id_column": None, "source": None})


def _write_pairs(request: GradeRequest, job: FileJob, pair: tuple[str, str],
                 given: GradeSettings) -> None:
    """--pair: A's and B's answers joined by id into the pairs the run grades."""
    from grader.io.pairs import write_pairs
    from grader.run.grading import check_grade_outputs

    check_grade_outputs(request, job, pair)  # A and B are read: never written
    write_pairs(pair[0], pair[1], job.output, mapping=dict(given.map or {}),
                id_column=given.id_column, source=given.source)


def _print_graded(summary: Summary, output: Path, panel: bool) -> None:
    """A grade run's summary, its panel's agreement, its files and the judge check."""
    from grader.analysis.summary import format_summary
    from grader.io.results import summary_path

    click.echo(format_summary(summary))
    if panel and summary.panel:  # a panel's summary holds its agreement
        from grader.analysis.panel import format_panel

        click.echo(format_panel(summary.panel))
    click.echo(f"results: {output}\nsummary: {summary_path(output)}")
    from grader.io.rubric_file import RubricStageEntry

    about = summary.manifest.entry(RubricStageEntry)
    if about:
        looped = about.ended_on_loop
        click.echo(f"rubric: {about.path}" + (
            f" ({looped} of the {about.written_by_judge} drafts ended where the judge began "
            "to repeat itself)" if looped else ""))
    if summary.judge_check:
        from grader.analysis.verdict import format_verdict

        click.echo(format_verdict(summary.judge_check))


def _check_write_inspect(write_inspect: Path | None, data: str | None,
                         pair: tuple[str, str] | None, given: GradeSettings) -> None:
    """``--write-inspect``'s checks, before any model work (grader.inspect_log)."""
    if write_inspect is None:
        return
    if pair or data is None:
        raise click.UsageError("--write-inspect scores an inspect_ai log given as DATA, not --pair")
    from grader.inspect_log import check_output

    check_output(data, given.source, write_inspect, given.id_column, overwrite=given.overwrite)


def _write_inspect(write_inspect: Path | None, data: str, output: Path, summary: Summary) -> None:
    """``--write-inspect``: the scored copy of the inspect_ai log DATA, once the run is done."""
    if write_inspect is None:
        return
    from grader.inspect_log import write_scored_log

    write_scored_log(data, output, write_inspect, summary.judge_check or None)
    click.echo(f"inspect log: {write_inspect}")


def _panel_judges(models: tuple[str, ...], temperatures: tuple[float, ...],
                  pair: tuple[str, str] | None,
                  config_file: str | Path | None = None) -> list[PanelJudge]:
    """``--model`` given twice or more (else the settings file's ``panel`` section) -> the
    panel's judges; one: no panel ([])."""
    if not models and not temperatures and config_file:
        from grader.config import load_settings
        from grader.run.panel import PanelJudge

        configured = load_settings(str(config_file)).panel
        if configured:
            if pair:
                raise click.UsageError(f"{config_file}: panel: a judge panel is not for --pair")
            if len(configured) < 2:
                raise click.UsageError(f"{config_file}: panel: a panel needs two judges or more")
            return [PanelJudge(j.model, j.temperature) for j in configured]
    if len(models) < 2:
        if temperatures:
            raise click.UsageError("--panel-temperature is for a judge panel (--model twice or more)")
        return []
    if pair:
        raise click.UsageError("a judge panel (--model twice or more) is not for --pair: "
                               "pairwise verdicts do not pool item by item")
    if temperatures and len(temperatures) != len(models):
        raise click.UsageError(f"--panel-temperature given {len(temperatures)} times for "
                               f"{len(models)} judges: once per --model, or not at all")
    from grader.run.panel import PanelJudge

    return [PanelJudge(m, temperatures[i] if temperatures else None) for i, m in enumerate(models)]


def _grade_panel(request: GradeRequest, job: FileJob, panel: list[PanelJudge],
                 given: GradeSettings) -> Summary:
    """Each judge graded in turn (one loaded at a time), then their labels pooled."""
    from grader.run.grading import make_executor
    from grader.run.panel import check_panel, check_panel_models, run_panel
    from grader.run.request import OptionError

    try:
        check_panel(request, panel)
    except OptionError as exc:
        raise click.UsageError(str(exc)) from None
    check_panel_models(request, panel)
    return run_panel(request, job, panel, lambda: make_executor(given.ray, given.data_parallel))


def _check_fail_on_controls(controls: int, fail_on: frozenset[str]) -> None:
    """--fail-on with a verdict needs the controls the verdict comes from."""
    words = sorted(fail_on & set(VERDICT_WORDS))
    if words and not controls:
        from grader.run.request import OptionError

        raise OptionError(f"--fail-on {','.join(words)} is a verdict of the judge check, which "
                          "needs the controls: they are off (--controls 0)")


@main.command("rubric")
@click.argument("data")
@click.option("--model", "-m", default=None,
              help="Local model directory (never downloaded); with --backend openai the name the "
              "server serves [default there: its only model].")
@_output(help="The rubric file (JSONL, one line per (input, reference)); kept lines of the same "
              "model and prompt are reused.")
@_settings_options("map", "id_column", "limit", "config", "backend", "base_url", "api_key_env",
                   "max_concurrency", "request_timeout", "tokenizer", "overwrite",
                   helps={"limit": "Only the first N rows.", "overwrite": "Write every rubric again."})
def rubric_command(data: str, model: str | None, output: Path, **options: Any) -> None:
    """Write the rubric of each distinct (input, reference) of DATA: the items every answer is
    then marked against (grade --rubric FILE). Read it, edit its items, reuse it."""
    from grader.backends.chat import require_offline
    from grader.run.rubric_pass import run_rubric

    require_offline()
    with _grade_failures(data, output, rubric=output):
        about = run_rubric(*_resolve(_given(options, format="rubric"), model, data, output))
    click.echo(about.line())
    if about.failed:
        _fail("some rubrics could not be written (see the judge's output); run again to retry", 1)


@main.command()
@click.argument("data")
@_output(help="The audit's results JSONL (every audit row's record); beside it NAME.audit.json "
              "(the audit), NAME.audit-rows.jsonl (the rows graded), the summary and, in the "
              "rubric format, the rubric file.")
@click.option("--rows", type=click.IntRange(min=1), default=None,
              help="Rows of DATA to audit, chosen deterministically by id [default: 50, or "
              "every row where DATA has fewer].")
@click.option("--bootstrap", type=click.IntRange(min=0), default=2000, show_default=True,
              help="Resamples for each mean shift's 95 % interval (seed 0).")
@click.option("--json", "as_json", is_flag=True, help="Print the audit as one JSON object.")
def audit(data: str, output: Path, rows: int | None, bootstrap: int, as_json: bool,
          model: tuple[str, ...], **options: Any) -> None:
    """Audit the judge on a sample of DATA's rows: each graded as given, padded, with an
    instruction to the grader, with a fake citation, cut in half; the reference contradicted,
    the reference itself, another question's reference and a non-answer (docs/usage.md, "Auditing
    the judge"). A table of how each moved the score; no second model."""
    from grader.analysis.audit import format_audit
    from grader.backends.chat import require_offline
    from grader.run.audit import run_audit

    if len(model) > 1:
        raise click.UsageError("audit takes one --model (a judge panel is for grade)")
    given = _given(options)
    require_offline()
    with _grade_failures(data, output):
        request, job = _resolve(given, model[0] if model else None, data, output)
        result = run_audit(request, job, rows, bootstrap=bootstrap)
    if as_json:
        click.echo(json.dumps(result, ensure_ascii=False))
        return
    click.echo(format_audit(result))
    click.echo(f"results: {output}\naudit: {result['summary']}")


# grade's options that `grader audit` takes too, in grade's order after audit's own: --model and
# every grade setting but --limit (--rows picks the rows), --grader-config (the audit reads 0-5
# scores), --data-parallel or --ray (a few hundred rows) and --controls (three of its kinds).
_AUDIT_FROM_GRADE = {"model"} | {dest_of(name) for name in _SETTINGS} - {
    "limit", "grader_config", "data_parallel", "ray_address", "controls"}
audit.params.extend(p for p in grade.params if p.name in _AUDIT_FROM_GRADE)


def _resolve(given: GradeSettings, model: str | None, data: str,
             output: Path) -> tuple[GradeRequest, FileJob]:
    """The request of the settings ``given`` (as the API resolves it) and the job of DATA and
    -o; a missing option shows the command's usage."""
    from grader.io.outputs import Kind, Planned, check_outputs
    from grader.run.request import FileJob, OptionUsageError, resolve

    try:
        request = resolve(given, model)
    except OptionUsageError as exc:
        raise click.UsageError(str(exc)) from None
    # the settings file is read: never the output, even with --overwrite
    check_outputs([Planned(output, Kind.RESULTS)], [given.config], overwrite=True)
    return request, FileJob(data, output, given.overwrite, given.limit)


@contextlib.contextmanager
def _grade_failures(data: str, output: Path, rubric: Path | None = None) -> Iterator[None]:
    """A stopped run -> one line that says what is saved and the command that resumes (every
    other error is the group's); ``rubric``: the file the run drafts into, if not beside output."""
    from grader.io.rubric_file import rubric_path
    from grader.run.request import Interrupted

    stdin = " (with the same data on stdin)" if data == "-" else ""
    try:
        yield
    except Interrupted as exc:
        _fail(f"{str(exc).rpartition(';')[0]}; to resume: {_resume_command()}{stdin}",
              exc.exit_code)
    except KeyboardInterrupt as exc:  # a second Ctrl-C, or one before grading started
        terminated = isinstance(exc, Terminated)
        partial = output.with_name(output.name + ".partial")
        rubrics = rubric or rubric_path(output)
        # a judge panel's first judge (grader.run.panel.judge_results): the panel's work so far
        first_judge = output.with_name(output.name.removesuffix(".jsonl") + ".judge-1.jsonl")
        resume = f"; to resume: {_resume_command()}{stdin}"
        if partial.is_file():
            saved = f"what was graded before is saved in {partial}{resume}"
        elif first_judge.is_file() or first_judge.with_name(first_judge.name + ".partial").is_file():
            saved = ("the panel's judges' work so far is saved beside it "
                     f"({first_judge.name}, ...){resume}")
        elif rubrics.is_file():  # stopped in the rubric pass: its drafts are kept and reused
            saved = (f"{'no row is graded yet; ' if rubric is None else ''}the rubrics "
                     f"drafted so far are saved in {rubrics}{resume}")
        else:
            saved = "nothing was graded"
        _fail(f"{'stopped by SIGTERM' if terminated else 'interrupted'}: {saved}",
              EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@_output()
@click.option("--grader-config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The score_model grader definition the results were graded with.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes, each rescoring a part of the file [default: one per CPU (8 at "
                   "most) from 32 MiB of input, else 1].")
@_overwrite(help="Replace OUTPUT even where it holds another run's results or another file.")
def rescore(results: str, output: Path, grader_config: str | None, workers: int | None,
            overwrite: bool) -> None:
    """Recompute every score from the judge's raw text in RESULTS; no model, no torch."""
    from grader.analysis.summary import format_summary
    from grader.run.rescore import rescore as rescore_results

    summary = rescore_results(results, output, grader_config=grader_config, workers=workers,
                              overwrite=overwrite)
    click.echo(format_summary(summary))
    click.echo(f"results: {output}")


@main.command()
@click.argument("data")
@_settings_options(*_INPUT_SETTINGS)
@click.option("-n", "count", type=click.IntRange(min=1), default=1, show_default=True,
              help="How many rows to render.")
@click.option("--model", "-m", default=None, help="Model directory: apply its chat template and count tokens.")
def render(data: str, mapping: dict[str, str], id_column: str | None, source: str | None,
           prompt: str | None, answer_format: str | None, checklist: bool | None,
           grader_config: str | None, count: int, model: str | None) -> None:
    """Print the conversations the judge would see for the first N rows, without generating."""
    from grader.io.dataset import read_items
    from grader.judge.judges import make_judge
    from grader.run.request import resolve_judge_options
    from grader.run.rows import prepare_jobs
    from grader.run.stage import stage_for

    prompt, with_checklist, answer_format = resolve_judge_options(
        prompt, checklist, answer_format, grader_config)
    judge = make_judge(grader_config=grader_config, prompt=prompt, checklist=with_checklist,
                       answer_format=answer_format)
    items = read_items(data, mapping=mapping, id_column=id_column, source=source)[:count]
    stage = stage_for(judge)  # with a stage: a row's first prompt, the stage's or its own
    jobs = stage.preview(data, items, judge) if stage else prepare_jobs(data, items, judge)
    formatter = None
    if model is not None:
        from grader.backends.chat import ChatFormatter, load_tokenizer

        formatter = ChatFormatter(load_tokenizer(model))
    for job in jobs:
        click.echo(f"===== id {job.item.id!r} (line {job.item.line})")
        if job.messages is None:
            reason = job.item.invalid or "missing " + ", ".join(judge.missing(job.item))
            click.echo(f"not sent to the judge: {reason}")
            continue
        for number, view in enumerate((job, *job.more)):
            if number:  # the pairwise format's swapped order
                click.echo(f"===== id {job.item.id!r}, conversation {number + 1} (answers swapped)")
            assert view.messages is not None  # a sent row's conversations are rendered
            messages = formatter.messages(view.messages) if formatter else view.messages
            for message in messages:
                click.echo(f"----- {message['role']}")
                click.echo(message["content"], nl=not message["content"].endswith("\n"))
            if formatter is not None:
                click.echo(f"----- prompt tokens: {formatter.count_tokens(view.messages)}")


@main.command()
@click.option("--format", "answer_format",
              type=click.Choice(["rubric", "itemized", "seed", "pairwise"]),
              default="rubric", show_default=True,
              help="rubric: the rubric pass's schema (the check pass's has one label per item: "
              "docs/formats.md, \"The rubric format\").")
@click.option("--checklist/--no-checklist", default=None,
              help="--format seed: with or without the checklist [default: with].")
def schema(answer_format: str, checklist: bool | None) -> None:
    """Print the JSON Schema the judge's answer is forced into."""
    from grader.judge.schema import format_schema
    from grader.run.request import resolve_judge_options

    _, with_checklist, resolved = resolve_judge_options(None, checklist, answer_format)
    assert resolved is not None  # a format given (its default: rubric)
    click.echo(json.dumps(format_schema(resolved, with_checklist), indent=2, ensure_ascii=False))


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--human", required=True, metavar="COLUMN", help="The column of human labels (0-5).")
@click.option("--data", default=None, help="The input dataset holding COLUMN, joined by id.")
@_map_option(help="As for grade, so ids in --data match the graded ones.")
@click.option("--id-column", default=None, help="As for grade.")
@click.option("--bootstrap", type=click.IntRange(min=100), default=1000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--pass-at", "pass_at", type=click.FloatRange(0, 5), default=None, metavar="T",
              help="Also estimate the share of scored rows a human would score at least T.")
@click.option("--plan", type=click.FloatRange(0, 5, min_open=True), default=None, metavar="W",
              help="Also say how many labels a calibrated 95% interval of +/- W needs with this "
              "judge (the labels given as the pilot).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def agree(results: str, human: str, data: str | None, mapping: dict[str, str],
          id_column: str | None, bootstrap: int, seed: int, pass_at: float | None,
          plan: float | None, as_json: bool) -> None:
    """How well the judge agrees with human labels (kappa, correlations, alpha, intervals),
    and the mean human score over every scored row: judge only, labels only, calibrated."""
    from grader.analysis.agreement import agreement, format_agreement

    result = agreement(results, human, data=data, mapping=mapping, id_column=id_column,
                       bootstrap=bootstrap, seed=seed, pass_at=pass_at, plan=plan)
    click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_agreement(result))


@main.command("label")
@click.argument("results", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_output(help="The labels file (JSONL): created, or resumed where it stopped.")
@click.option("--data", default=None,
              help="The graded dataset, for the rows' question, reference and answer [default: "
              "the dataset the run recorded in its summary, else the records' own fields].")
@_map_option(help="As for grade, for --data.")
@click.option("--id-column", default=None, help="As for grade, for --data.")
@click.option("--sample", type=click.IntRange(min=1), default=None, metavar="N",
              help="Offer N rows of the random order, not all [default: all; on a resume, the "
              "labels file's].")
@click.option("--seed", type=click.IntRange(min=0), default=None, metavar="S",
              help="The seed of the random order [default: 0; on a resume, the labels file's].")
@click.option("--port", type=click.IntRange(0, 65535), default=0,
              help="The port on 127.0.0.1 [default: a free one].")
@click.option("--no-browser", is_flag=True, help="Print the page's URL only; open no browser.")
@_overwrite(help="Replace OUTPUT where it holds other labels or another file.")
def label(results: Path, output: Path, data: str | None, mapping: dict[str, str],
          id_column: str | None, sample: int | None, seed: int | None, port: int,
          no_browser: bool, overwrite: bool) -> None:
    """Label RESULTS by hand in a local page: one row at a time, 0-5, saved as given."""
    from grader.label.server import serve_labels

    state = serve_labels(results, output, data=data, mapping=mapping, id_column=id_column,
                         seed=seed, sample=sample, overwrite=overwrite, port=port,
                         open_browser=not no_browser, announce=click.echo)
    click.echo(f"labels: {output} ({state['labeled']} labeled, {state['skipped']} skipped of "
               f"{state['total']})")


@main.command()
@click.argument("a", type=click.Path(exists=True, dir_okay=False))
@click.argument("b", type=click.Path(exists=True, dir_okay=False))
@click.option("--bootstrap", type=click.IntRange(min=100), default=2000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--human", default=None, metavar="COLUMN",
              help="Human labels 0-5 of both models' answers (as for agree): adds the "
              "calibrated difference B - A over every pair.")
@click.option("--data", "data", multiple=True, metavar="FILE",
              help="--human: the dataset of labels of A's answers, then of B's, joined by id "
              "[default: the records' own COLUMN].")
@_map_option(help="As for grade, for --data.")
@click.option("--id-column", default=None, help="As for grade, for --data.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def compare(a: str, b: str, bootstrap: int, seed: int, human: str | None, data: tuple[str, ...],
            mapping: dict[str, str], id_column: str | None, as_json: bool) -> None:
    """Two models under test, graded on the same rows: paired differences, win/tie/loss, sign test."""
    from grader.analysis.compare import compare as compare_results
    from grader.analysis.compare import format_comparison

    result = compare_results(a, b, bootstrap=bootstrap, seed=seed, human=human, data=data,
                             mapping=mapping, id_column=id_column)
    click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_comparison(result))


def _rank_bar(total: int) -> Any:
    """rank's bootstrap bar, on stderr as grade's rows bar."""
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="round", desc="bootstrap", file=sys.stderr, dynamic_ncols=True)


_overwrite_page = _overwrite(
    help="Replace the page's file even where it holds something grader did not write.")


def _check_page(page: Path | None, kind: str, option: str, results: Any, others: Any,
                overwrite: bool) -> None:
    """A page's file is new or a page of its kind (unless --overwrite), and never a file the
    command reads: a RESULTS file, its summary, the audit beside it, a --data or --audit file."""
    if page is None:
        return
    from grader.analysis.audit import audit_path
    from grader.io.outputs import Kind, Planned, check_outputs
    from grader.io.results import recorded_data, summary_path

    reads = [p for r in map(Path, results)
             for p in (r, summary_path(r), audit_path(r), recorded_data(r))]
    check_outputs([Planned(page, Kind[kind], option)], [*reads, *others], overwrite=overwrite)


@main.command()
@click.argument("results", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--name", "names", multiple=True, metavar="MODEL",
              help="The model of each RESULTS file, once per file in order [default: the file names].")
@click.option("--rounds", type=click.IntRange(min=0), default=1000, show_default=True,
              help="Bootstrap rounds over rows for the intervals (0: none).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--length-controlled", is_flag=True,
              help="Also fit the AlpacaEval-style length correction; the uncorrected figures beside.")
@click.option("--data", "data", multiple=True, metavar="FILE",
              help="--length-controlled: the answers each RESULTS file graded, once per file in "
              "order, where the records hold no output_text [default: the dataset each run "
              "recorded in its summary]. --human: the files with the labels, once per file.")
@click.option("--human", default=None, metavar="COLUMN",
              help="Human labels 0-5 in this column (of each --data file, else of the records) "
              "on a random sample of rows: adds the calibrated (PPI++) Bradley-Terry fit.")
@_map_option(help="As for grade, for --data.")
@click.option("--id-column", default=None, help="As for grade, for --data.")
@click.option("--html", "html", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the leaderboard as an HTML page with an interval plot.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_overwrite_page
def rank(results: tuple[str, ...], names: tuple[str, ...], rounds: int, seed: int,
         length_controlled: bool, data: tuple[str, ...], human: str | None,
         mapping: dict[str, str], id_column: str | None, html: Path | None, as_json: bool,
         overwrite: bool) -> None:
    """Rank the models of N results files graded on the same rows: Bradley-Terry, intervals."""
    from grader.analysis.rank import format_rank
    from grader.analysis.rank import rank as rank_results

    _check_page(html, "RANK_PAGE", "--html", results, data, overwrite)

    result = rank_results(results, names=names, data=data, mapping=mapping, id_column=id_column,
                          rounds=rounds, seed=seed, length_controlled=length_controlled,
                          human=human, progress=_rank_bar)
    if html is not None:
        from grader.analysis.report.rank_page import write_rank_page

        write_rank_page(result, html)
    click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_rank(result))
    if html is not None and not as_json:
        click.echo(f"page: {html}")


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@_output(help="The HTML file to write (self-contained, offline).")
@click.option("--group-by", default=None, metavar="COLUMN",
              help="Break scores down by a column of the results or of --data.")
@click.option("--data", default=None,
              help="The input dataset, joined by id, for --group-by and --human.")
@click.option("--id-column", default=None, help="As for grade, so ids in --data match.")
@click.option("--human", default=None, metavar="COLUMN",
              help="Human labels 0-5 (of --data, else of the records), as for agree: adds the "
              "calibrated mean human score, judge only, labels only and calibrated.")
@_map_option(help="As for grade, for --data with --human.")
@click.option("--worst", type=click.IntRange(min=0), default=20, show_default=True,
              help="How many of the lowest-scoring rows to show.")
@click.option("--audit", "audit_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="A `grader audit` summary (NAME.audit.json) to show as a "
              "section [default: the one beside RESULTS, if any].")
@_overwrite_page
def report(results: str, output: Path, group_by: str | None, data: str | None,
           id_column: str | None, human: str | None, mapping: dict[str, str], worst: int,
           audit_file: Path | None, overwrite: bool) -> None:
    """An HTML report of RESULTS: histogram, statuses, judge vs recompute, groups, worst rows."""
    from grader.analysis.report import write_report

    _check_page(output, "REPORT", "-o", (results,), (data, audit_file), overwrite)

    written = write_report(Path(results), output, group_by=group_by, data=data,
                           worst=worst, id_column=id_column, audit=audit_file, human=human,
                           mapping=mapping)
    click.echo(f"report: {written['output']} ({written['rows']} rows)")


@main.group()
def batch() -> None:
    """Grade through vLLM's offline batch runner (docs/engines.md, "vLLM's batch runner"):
    export the requests, run them, import the answers."""


@batch.command("export")
@click.argument("data")
@click.option("--model", "-m", required=True,
              help="The judge's local model directory; run the batch runner with the same "
              "--model.")
@_output(help="The OpenAI Batch requests (JSONL); the manifest goes beside it as "
              "NAME.grader-batch.json.")
@click.option("--answers", "answers", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The first round's answers (the batch runner's output), for the second "
              "round's export. Repeatable.")
@_overwrite(help="Replace a requests file (or its manifest) that grader did not write.")
@_settings_options(*_INPUT_SETTINGS, "config", "limit", "samples", "aggregate", "truncate",
                   "controls", "rubric", "evidence", "confidence", "temperature", "top_p",
                   "top_k", "seed", "max_tokens", "chat_template_kwargs", "tokenizer")
def batch_export(data: str, model: str, output: Path, answers: tuple[Path, ...], overwrite: bool,
                 **options: Any) -> None:
    """Write DATA's grading requests for vLLM's batch runner (OpenAI Batch JSONL)."""
    import dataclasses

    from grader.backends.chat import require_offline
    from grader.run.batch import export_batch, runner_command

    given = _given(options, backend="vllm", overwrite=overwrite)
    require_offline()
    # the requests are vLLM's: its engine's model checks, then the batch runner's backend
    request, job = _resolve(given, model, data, output)
    exported = export_batch(dataclasses.replace(request, backend="batch"), job, answers)
    stem = output.name.removesuffix(".jsonl")
    runner_out = output.with_name(f"{stem}.answers.jsonl")
    rounds = f"round {exported.round} of {2 if exported.round == 2 or not exported.final else 1}"
    click.echo(f"batch: {exported.count} requests ({rounds}) in {exported.requests}"
               + (f"; {exported.answered} answered by --answers" if answers else "")
               + f"\nmanifest: {exported.manifest}")
    click.echo(f"run them: {runner_command(exported, str(runner_out), model)}")
    if exported.final:
        click.echo(f"then: grader batch import {runner_out} -o RESULTS.jsonl")
    else:
        click.echo(f"then: the same export with --answers {runner_out} -o "
                   f"{output.with_name(stem + '-2.jsonl')} (round 2: the rows, from what "
                   "round 1 made)")


@batch.command("import")
@click.argument("answers", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_output(help="Results JSONL, as grade writes it; the summary beside it.")
@click.option("--requests", "requests_file", default=None,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The export's requests file [default: the export whose manifest, beside "
              "ANSWERS or here, the answers' custom_ids name].")
@_overwrite(help="Replace the results instead of resuming them.")
def batch_import(answers: tuple[Path, ...], output: Path, requests_file: Path | None,
                 overwrite: bool) -> None:
    """Grade from the batch runner's ANSWERS (its output files: a later file's answer replaces
    an earlier one's), as grade does: records, resume, summary, judge check."""
    from grader.analysis.summary import format_summary
    from grader.io.results import summary_path
    from grader.run.batch import import_batch

    with _grade_failures(str(answers[0]), output):
        imported = import_batch(answers, output, requests=requests_file, overwrite=overwrite)
    summary = imported.summary
    click.echo(format_summary(summary))
    click.echo(f"batch: {imported.answers} of {imported.requests} requests answered, "
               f"{imported.missing} missing (their rows engine_error: run those requests again "
               f"and import both answers files), {imported.failed} failed in the runner, "
               f"{imported.not_in_schema} not in their schema (parse_error)")
    click.echo(f"results: {output}\nsummary: {summary_path(output)}")
    if summary.judge_check:
        from grader.analysis.verdict import format_verdict

        click.echo(format_verdict(summary.judge_check))
