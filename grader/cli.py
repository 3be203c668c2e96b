"""The ``grader`` command line. Each command parses options, calls one function, prints.

Nothing here imports torch, transformers or vllm: the backends are imported when chosen.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from grader import __version__

EXIT_BAD_INPUT = 2


def _fail(message: str, code: int = EXIT_BAD_INPUT) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="grader")
def main() -> None:
    """Offline LLM-as-a-judge: score model answers against references with a local judge model."""


def _parse_map(ctx, param, value):
    from grader.dataset import parse_mapping

    try:
        return parse_mapping(value)
    except ValueError as exc:
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
        "--prompt",
        default="seed",
        show_default=True,
        help="Built-in prompt name (seed, seed-verbatim) or a prompt YAML/JSON file.",
    )(command)
    command = click.option(
        "--checklist/--no-checklist",
        default=True,
        show_default=True,
        help="Ask the judge for its 3-7 item checklist inside the JSON (--no-checklist is faster).",
    )(command)
    return command


@main.command()
@click.argument("data")
@click.option("--model", "-m", required=True, help="Local model directory (never downloaded).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="Results JSONL; the summary goes beside it as NAME.summary.json.")
@_input_options
@click.option("--backend", type=click.Choice(["transformers"]), default="transformers",
              show_default=True, help="Inference engine.")
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Rows per generate() call (transformers).")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N.")
@click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
              default="auto", show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--max-tokens", type=click.IntRange(min=1), default=None,
              help="Cap on the judge's answer [default: the longest answer the schema admits].")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Grade only the first N rows.")
def grade(data, model, output, mapping, id_column, prompt, checklist, backend, batch_size, device,
          dtype, temperature, top_p, seed, max_tokens, limit):
    """Grade DATA (.jsonl, .csv, .parquet, or - for JSONL on stdin) with a local judge model."""
    from grader.chat import ModelNotFoundError, check_model_path, require_offline
    from grader.config import SamplingConfig, TransformersConfig
    from grader.dataset import DatasetError
    from grader.pipeline import GradeRequest, run_grade
    from grader.results import format_summary, summary_path
    from grader.templates import PromptError

    require_offline()
    try:
        check_model_path(model)
        request = GradeRequest(
            data=data,
            output=output,
            model=model,
            backend=backend,
            prompt=prompt,
            mapping=mapping,
            id_column=id_column,
            checklist=checklist,
            limit=limit,
            sampling=SamplingConfig(
                temperature=temperature, top_p=top_p, seed=seed, max_tokens=max_tokens
            ),
            transformers=TransformersConfig(batch_size=batch_size, device=device, dtype=dtype),
        )
        summary = run_grade(request)
    except (DatasetError, PromptError, ModelNotFoundError) as exc:
        _fail(str(exc))
    click.echo(format_summary(summary))
    click.echo(f"results: {output}\nsummary: {summary_path(output)}")


@main.command()
@click.argument("results", type=click.Path(exists=True, dir_okay=False))
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True)
def rescore(results, output):
    """Recompute every score from the judge's raw text in RESULTS; no model, no torch."""
    from grader.pipeline import rescore as rescore_results
    from grader.results import ResultsError, format_summary

    try:
        summary = rescore_results(results, output)
    except ResultsError as exc:
        _fail(str(exc))
    click.echo(format_summary(summary))
    click.echo(f"results: {output}")


@main.command()
@click.argument("data")
@_input_options
@click.option("-n", "count", type=click.IntRange(min=1), default=1, show_default=True,
              help="How many rows to render.")
@click.option("--model", "-m", default=None, help="Model directory: apply its chat template and count tokens.")
def render(data, mapping, id_column, prompt, checklist, count, model):
    """Print the conversations the judge would see for the first N rows, without generating."""
    from grader.chat import ModelNotFoundError
    from grader.dataset import DatasetError, read_items
    from grader.pipeline import prepare_jobs
    from grader.templates import PromptError, load_prompt

    try:
        loaded = load_prompt(prompt)
        items = read_items(data, mapping=mapping, id_column=id_column)[:count]
        jobs = prepare_jobs(data, items, loaded, checklist=checklist)
        formatter = None
        if model is not None:
            from grader.chat import ChatFormatter, load_tokenizer

            formatter = ChatFormatter(load_tokenizer(model))
    except (DatasetError, PromptError, ModelNotFoundError) as exc:
        _fail(str(exc))
    for job in jobs:
        click.echo(f"===== id {job.item.id!r} (line {job.item.line})")
        if job.messages is None:
            click.echo(f"not sent to the judge: missing {', '.join(job.item.missing)}")
            continue
        messages = formatter.messages(job.messages) if formatter else job.messages
        for message in messages:
            click.echo(f"----- {message['role']}")
            click.echo(message["content"], nl=not message["content"].endswith("\n"))
        if formatter is not None:
            click.echo(f"----- prompt tokens: {formatter.count_tokens(job.messages)}")


@main.command()
@click.option("--checklist/--no-checklist", default=True, show_default=True)
def schema(checklist):
    """Print the JSON Schema the judge's answer is forced into."""
    from grader.verdict import verdict_schema

    click.echo(json.dumps(verdict_schema(checklist), indent=2, ensure_ascii=False))
