"""What the judge is asked and how its answers become records: the seed judge, or an OpenAI
``score_model`` grader config. The pipeline grades with either through this one shape."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from grader.io.dataset import Item
from grader.judge.records import (
    Record,
    aggregate_samples,
    failed_record,
    itemized_record,
    judged_record,
    missing_context_record,
)
from grader.judge.scoring import round_half_up
from grader.status import Status
from grader.judge.prompts import Prompt, load_prompt
from grader.judge.schema import FORMATS, format_max_chars, format_schema


@dataclass(frozen=True)
class Judge:
    """A prompt, the schema its answers are forced into, and the record-building functions."""

    kind: str  # "seed" | "score_model"
    prompt: Prompt
    schema: dict[str, Any]
    max_tokens: int  # the longest answer the schema admits
    required: tuple[str, ...]  # fields without which a row is not sent
    value_key: str  # the record field samples are aggregated over
    judged: Callable[..., Record]  # (id, raw_output, finish_reason, **extra) -> record
    failed: Callable[..., Record]  # (id, status, error, **extra) -> record
    finish_aggregate: Callable[[Record, Fraction], Record]
    checklist: bool = False  # the prompt template's `checklist` variable
    format: str = "seed"  # the seed judge's answer format: "seed" or "itemized"
    sampling: dict[str, Any] = field(default_factory=dict)  # the config's own sampling settings
    manifest: dict[str, Any] = field(default_factory=dict)

    def missing(self, item: Item) -> list[str]:
        return [name for name in self.required if not item.fields.get(name)]

    def unsent(self, item: Item) -> Record:
        """The record of a row the judge never sees: missing content or unsendable text."""
        missing = self.missing(item)
        if missing:
            if self.kind == "seed":
                return missing_context_record(item.id, missing, self.format)
            return self.failed(item.id, Status.MISSING_CONTEXT, f"empty or missing {' and '.join(missing)}")
        return self.failed(item.id, Status.INVALID_INPUT, item.invalid or "invalid input")

    def aggregate(self, samples: list[Record], method: str) -> Record:
        return aggregate_samples(samples, method, self.value_key, self.finish_aggregate)


def _finish_seed(record: Record, value: Fraction) -> Record:
    # score is the aggregate rounded half up; grade stays the representative sample's own
    return {**record, "score": round_half_up(value), "score_exact": float(value)}


# The built-in prompt written for each answer format.
FORMAT_PROMPTS = {"itemized": "seed-itemized", "seed": "seed"}


def resolve_format(prompt: str | None, answer_format: str | None) -> tuple[str, str]:
    """``(prompt, format)`` of a seed-judge request where either may be left out.

    Neither given: the itemized format and its prompt. Only a format: that format's built-in
    prompt. Only a prompt: the itemized format for the itemized prompt, else the seed's format
    (seed, seed-verbatim and a user's prompt file ask for the seed's five lines).
    """
    if answer_format is not None and answer_format not in FORMATS:
        raise ValueError(f"unknown format {answer_format!r}: choose from {', '.join(FORMATS)}")
    if prompt is None:
        answer_format = answer_format or "itemized"
        return FORMAT_PROMPTS[answer_format], answer_format
    if answer_format is None:
        answer_format = "itemized" if prompt == FORMAT_PROMPTS["itemized"] else "seed"
    return prompt, answer_format


def seed_judge(
    prompt: str | None = "seed", *, checklist: bool = True, answer_format: str | None = None
) -> Judge:
    """The seed judge: counts -> the seed's formula, recomputed exactly.

    In the itemized format the counts are those of the judge's items, and there is no
    checklist: the item lists are the enumeration the checklist stood for.
    """
    prompt, answer_format = resolve_format(prompt, answer_format)
    loaded = load_prompt(prompt)
    itemized = answer_format == "itemized"
    checklist = checklist and not itemized

    def failed(item_id, status, error, **fields):
        return failed_record(item_id, status, error, **{"format": answer_format, **fields})

    return Judge(
        kind="seed",
        prompt=loaded,
        schema=format_schema(answer_format, checklist),
        max_tokens=format_max_chars(answer_format, checklist),
        required=("reference", "output_text"),
        value_key="score",
        judged=itemized_record if itemized else judged_record,
        failed=failed,
        finish_aggregate=_finish_seed,
        checklist=checklist,
        format=answer_format,
        manifest={"type": "seed", "checklist": checklist, "format": answer_format},
    )


def score_model_judge(path: str) -> Judge:
    """An OpenAI ``score_model`` grader config run on the local judge."""
    from grader.judge.score_model import load_grader_config

    grader = load_grader_config(path)

    def finish(record: Record, value: Fraction) -> Record:
        result = float(value)
        return {**record, "result": result, "passed": grader.passed(result)}

    return Judge(
        kind="score_model",
        prompt=grader.prompt,
        schema=grader.schema(),
        max_tokens=grader.MAX_TOKENS,
        required=("output_text",),
        value_key="result",
        judged=grader.record,
        failed=grader.failed,
        finish_aggregate=finish,
        sampling=grader.sampling_overrides(),
        manifest=grader.describe(),
    )
