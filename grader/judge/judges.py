"""What the judge is asked and how its answers become records: the seed judge, or an OpenAI
``score_model`` grader config. Grading and rescoring use either through the one interface
:class:`Judge`; nothing outside this module asks which kind of judge it holds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from grader.io.dataset import Item
from grader.judge.confidence import confidence_problem, record_confidence
from grader.judge.prompts import Prompt, load_prompt
from grader.judge.records import (
    AGGREGATES,
    Record,
    aggregate_samples,
    failed_record,
    itemized_record,
    judged_record,
    missing_context_record,
)
from grader.judge.schema import FORMATS, format_max_chars, format_schema
from grader.judge.scoring import round_half_up
from grader.status import ZERO_SCORE, Status

if TYPE_CHECKING:
    from grader.backends import Completion


class Judge(ABC):
    """A prompt, the schema its answers are forced into, and how an answer becomes a record."""

    prompt: Prompt
    schema: dict[str, Any]
    max_tokens: int  # the longest answer the schema admits
    required: tuple[str, ...]  # fields without which a row is not sent
    value_key: str  # the record field samples are aggregated over
    checklist: bool = False  # the prompt template's `checklist` variable
    answer_format: str | None = None  # the seed judge's answer format; None for other judges
    itemized_choices: bool = False  # answers whose items' choices --confidence can read

    @abstractmethod
    def judged(
        self, item_id: Any, raw_output: str | None, finish_reason: str | None, **extra: Any
    ) -> Record:
        """The record of one answer. ``output_text`` (the graded answer, when there is one)
        and ``evidence_not_found`` (a rescore's earlier check) may be given; a judge that does
        not use them ignores them."""

    @abstractmethod
    def failed(self, item_id: Any, status: Status, error: str, **fields: Any) -> Record:
        """The record of a row without an answer to read: overflow, engine error, not sent."""

    @abstractmethod
    def describe(self) -> dict[str, Any]:
        """The judge's part of the run manifest."""

    @abstractmethod
    def _finish_aggregate(self, record: Record, value: Fraction) -> Record:
        """The representative sample's record with the aggregate value written in."""

    def attach(self, item: Item) -> bool:
        """Add what the row's prompt needs beyond its own fields; False: do not send it
        (:meth:`unsent` then says why). Only the rubric format adds anything (its rubric)."""
        return True

    def row_schema(self, item: Item) -> dict[str, Any] | None:
        """The schema this row's answer is forced into, when it is not :attr:`schema`."""
        return None

    def group_key(self, item: Item) -> str:
        """Rows with one key share their prompt's prefix: they are sent next to each other."""
        return ""

    def prompt_for(self, item: Item) -> Prompt:
        return self.prompt

    def missing(self, item: Item) -> list[str]:
        return [name for name in self.required if not item.fields.get(name)]

    def unsent(self, item: Item) -> Record:
        """The record of a row the judge never sees: missing content or unsendable text."""
        missing = self.missing(item)
        if missing:
            return self._missing_context(item, missing)
        return self.failed(item.id, Status.INVALID_INPUT, item.invalid or "invalid input")

    def _missing_context(self, item: Item, missing: list[str]) -> Record:
        return self.failed(item.id, Status.MISSING_CONTEXT, f"empty or missing {' and '.join(missing)}")

    def record(self, item: Item, completion: Completion) -> Record:
        """The record of one completion of ``item``'s prompt."""
        usage = {"prompt_tokens": completion.prompt_tokens, "output_tokens": completion.output_tokens}
        # A thinking judge's reasoning is kept beside the answer, never parsed: raw_output is
        # the JSON alone, so rescore reads it as any other answer. Without a reasoning parser
        # the record has no such field (results files keep their format).
        thinking: dict[str, Any] = {}
        if completion.reasoning is not None:
            usage["reasoning_tokens"] = completion.reasoning_tokens
            thinking["reasoning"] = completion.reasoning
        if completion.finish_reason == "error":
            return self.failed(
                item.id,
                completion.failure,
                completion.error or "the engine failed this row",
                raw_output=completion.text or None,
                finish_reason=completion.finish_reason,
                usage=usage,
                **thinking,
            )
        output_text = item.fields.get("output_text")
        record = self._judged(
            item.id,
            completion.text,
            completion.finish_reason,
            output_text=None if output_text is None else str(output_text),
            usage=usage,
            **thinking,
            **self._row_fields(item),
        )
        if completion.top_logprobs is not None and self.itemized_choices:
            # --confidence: only then does the record have these fields
            record.update(record_confidence(record, completion.tokens, completion.top_logprobs))
        return record

    def rescored(self, record: Record) -> Record | None:
        """``record`` recomputed from its ``raw_output``; None when it has none to re-read."""
        if record.get("raw_output") is None or record.get("finish_reason") == "error":
            return None
        kept = {k: record[k] for k in ("usage", "reasoning", "rubric") if k in record}
        rescored = self._judged(
            record["id"],
            record["raw_output"],
            record.get("finish_reason", "stop"),
            evidence_not_found=record.get("evidence_not_found"),
            **kept,
        )
        if "confidence" in record and self.itemized_choices:
            # The choices' probabilities were kept: the distribution is recomputed from them
            # under the current scoring, as the score is; without them it stays unknown.
            kept_confidence = record["confidence"]
            probabilities = (kept_confidence.get("probabilities")
                             if isinstance(kept_confidence, dict) else None)
            rescored.update(
                record_confidence(rescored, probabilities=probabilities)
                if probabilities is not None
                else {"confidence": None,
                      "confidence_error": record.get("confidence_error") or "no probabilities kept"}
            )
        return rescored

    def _row_fields(self, item: Item) -> dict[str, Any]:
        """What a row adds to its record's reading besides the answer (the rubric format's
        rubric)."""
        return {}

    def _judged(self, item_id: Any, raw_output: str | None, finish_reason: str | None,
                **extra: Any) -> Record:
        """``judged``, saying so when max_tokens ran out before the thinking ended."""
        record = self.judged(item_id, raw_output, finish_reason, **extra)
        if (record["status"] == Status.TRUNCATED and extra.get("reasoning") is not None
                and not raw_output):
            record["error"] = ("max_tokens ran out while the judge was still thinking: no answer "
                               "(raise --max-tokens, or cap the thinking with --thinking-budget)")
        return record

    def kept(self, item_id: Any, sample: Record) -> Record:
        """A sample the engine failed, rebuilt as it was: there is nothing to re-read.

        The judge's own fields (score, result, ...) stay the failed record's nulls: a sample
        without an answer never carries a score, whatever a hand-edited file says.
        """
        status = Status(sample["status"])
        own = set(self.failed(item_id, status, "")) - _COMMON_FIELDS
        rest = {k: v for k, v in sample.items() if k not in {"status", "error", *own}}
        return self.failed(item_id, status, sample.get("error") or "", **rest)

    def aggregate(self, samples: list[Record], method: str) -> Record:
        return aggregate_samples(samples, method, self.value_key, self._finish_aggregate)

    def unusable(self, record: Record) -> str | None:
        """Why this judge cannot rescore ``record`` (another judge's, a hand-edited file's), or
        None; each check names what would otherwise be a traceback halfway through a file."""
        if not isinstance(record.get("raw_output"), (str, type(None))):
            return "raw_output must be a string or null"
        if "confidence" in record:
            problem = confidence_problem(record["confidence"])
            if problem:
                return problem
        samples = record.get("samples")
        if samples:
            if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
                return "samples must be a list of objects"
            if record.get("aggregate", "median") not in AGGREGATES:
                return (f"unknown aggregate {record.get('aggregate')!r}: expected one of "
                        f"{', '.join(AGGREGATES)}")
            for number, sample in enumerate(samples, start=1):
                if not isinstance(sample.get("raw_output"), (str, type(None))):
                    return f"sample {number}: raw_output must be a string or null"
                rescorable = (sample.get("raw_output") is not None
                              and sample.get("finish_reason") != "error")
                if not rescorable and sample.get("status") not in _STATUSES:
                    return f"sample {number}: no raw_output to rescore and no known status to keep"
                if not rescorable and sample["status"] == Status.OK:
                    return f"sample {number}: status ok without a raw_output to rescore"
            return None
        if record.get("raw_output") is not None and record.get("finish_reason") != "error":
            return None  # rescored: whatever else it holds is replaced
        # kept as it is: the summary counts it by its status and value
        status = record.get("status")
        if not isinstance(status, str):
            return "no raw_output to rescore and no status to keep"
        if status not in _STATUSES:
            return f"unknown status {status!r}: expected one of {', '.join(_STATUSES_IN_ORDER)}"
        if status == Status.OK:
            return self._unusable_value(record.get(self.value_key))
        value = record.get(self.value_key)
        if value is not None and not (status in ZERO_SCORE and value == 0 and type(value) is int):
            return (f"status {status} with {self.value_key} {value!r}: only an ok row has a "
                    f"{self.value_key} (null here)")
        return None

    @abstractmethod
    def _unusable_value(self, value: Any) -> str | None:
        """Why ``value`` is no value of an ``ok`` record of this judge, or None."""


_STATUSES_IN_ORDER = [str(status) for status in Status]
_STATUSES = frozenset(_STATUSES_IN_ORDER)
# Fields every record has whatever its judge (records.new_record); the rest are the judge's own.
_COMMON_FIELDS = frozenset({"id", "status", "raw_output", "finish_reason", "error", "truncation",
                            "format"})

# The built-in prompt written for each answer format.
FORMAT_PROMPTS = {"rubric": "seed-check", "itemized": "seed-itemized", "seed": "seed"}
# The rubric format's first pass, once per (input, reference).
RUBRIC_PROMPT = "seed-rubric"


def resolve_format(prompt: str | None, answer_format: str | None) -> tuple[str, str]:
    """``(prompt, format)`` of a seed-judge request where either may be left out.

    Neither given: the rubric format and its check prompt. Only a format: that format's
    built-in prompt. Only a prompt: the format of a built-in format's prompt (seed-check,
    seed-itemized), else the seed's (seed, seed-verbatim and a user's prompt file ask for the
    seed's five lines).
    """
    if answer_format is not None and answer_format not in FORMATS:
        raise ValueError(f"unknown format {answer_format!r}: choose from {', '.join(FORMATS)}")
    if prompt is None:
        answer_format = answer_format or "rubric"
        return FORMAT_PROMPTS[answer_format], answer_format
    if answer_format is None:
        by_prompt = {name: f for f, name in FORMAT_PROMPTS.items()}
        answer_format = by_prompt.get(prompt, "seed")
    return prompt, answer_format


class SeedJudge(Judge):
    """The seed judge: counts -> the seed's formula, recomputed exactly.

    In the itemized format the counts are those of the judge's items, and there is no
    checklist: the item lists are the enumeration the checklist stood for. In the rubric format
    they are those of the judge's labels of the reference's rubric (:mod:`grader.judge.rubric`),
    which the run fills in :attr:`rubrics` before any row is rendered.
    """

    required = ("reference", "output_text")
    value_key = "score"

    def __init__(
        self, prompt: str | None = None, *, checklist: bool = True, answer_format: str | None = None,
        evidence: bool = False,
    ):
        prompt, answer_format = resolve_format(prompt, answer_format)
        self.prompt = load_prompt(prompt)
        self.answer_format = answer_format
        self.itemized_choices = answer_format in ("itemized", "rubric")
        self.checklist = checklist and answer_format == "seed"
        # The schema the backend is built with; the rubric format's is its rubric pass's, and
        # each check-pass row carries its own (row_schema).
        self.schema = format_schema(answer_format, self.checklist)
        self.max_tokens = format_max_chars(answer_format, self.checklist)
        self.evidence = evidence and answer_format == "rubric"
        self.rubric_prompt = load_prompt(RUBRIC_PROMPT) if answer_format == "rubric" else None
        # rubric key -> the rubric's dict, or (status, reason) when its rubric pass failed
        self.rubrics: dict[str, Any] = {}

    # -- the rubric format (grader.judge.rubric; grader.run.rubric_pass fills self.rubrics)

    def _rubric_of(self, item: Item) -> Any:
        from grader.judge.rubric import rubric_key

        return self.rubrics.get(rubric_key(item.fields.get("input"), item.fields["reference"]))

    def attach(self, item):
        if self.answer_format != "rubric":
            return True
        from grader.judge.rubric import Rubric

        rubric = self._rubric_of(item)
        if not isinstance(rubric, dict) or not rubric["facts"]:
            return False
        item.fields["rubric"] = rubric
        item.fields["rubric_items"] = Rubric.from_dict(rubric).numbered()
        item.fields["rubric_evidence"] = self.evidence
        return True

    def row_schema(self, item):
        if self.answer_format != "rubric":
            return None
        from grader.judge.rubric import RUBRIC_PASS, Rubric, check_schema, draft_schema

        if item.fields.get(RUBRIC_PASS):
            return draft_schema()
        return check_schema(Rubric.from_dict(item.fields["rubric"]).size(), self.evidence)

    def group_key(self, item):
        rubric = item.fields.get("rubric")
        return rubric["key"] if isinstance(rubric, dict) else ""

    def prompt_for(self, item):
        from grader.judge.rubric import RUBRIC_PASS

        if item.fields.get(RUBRIC_PASS):
            return self.rubric_prompt
        return self.prompt

    def record(self, item, completion):
        from grader.judge.rubric import RUBRIC_PASS

        if item.fields.get(RUBRIC_PASS):  # a rubric-pass answer: read by grader.run.rubric_pass
            return {"id": item.id, "status": str(Status.OK), "raw_output": completion.text,
                    "finish_reason": completion.finish_reason, "error": completion.error,
                    "usage": {"prompt_tokens": completion.prompt_tokens,
                              "output_tokens": completion.output_tokens}}
        return super().record(item, completion)

    def unsent(self, item):
        if self.answer_format == "rubric" and not self.missing(item) and not item.invalid:
            from grader.judge.records import empty_rubric_record

            rubric = self._rubric_of(item)
            if isinstance(rubric, dict):
                return empty_rubric_record(item.id, rubric)
            status, reason = rubric if rubric is not None else (
                Status.ENGINE_ERROR, "no rubric was written for this reference")
            return self.failed(item.id, status, f"rubric pass: {reason}")
        return super().unsent(item)

    def _row_fields(self, item):
        return {"rubric": item.fields["rubric"]} if self.answer_format == "rubric" else {}

    def judged(self, item_id, raw_output, finish_reason, *, output_text=None,
               evidence_not_found=None, **extra):
        if self.answer_format == "rubric":
            from grader.judge.records import rubric_record

            rubric = extra.pop("rubric", None)
            if not isinstance(rubric, dict):
                return self.failed(item_id, Status.PARSE_ERROR, "the record holds no rubric",
                                   raw_output=raw_output, finish_reason=finish_reason, **extra)
            return rubric_record(item_id, raw_output, finish_reason, rubric=rubric,
                                 output_text=output_text, evidence_not_found=evidence_not_found,
                                 **extra)
        if self.answer_format == "itemized":  # the judge's quotes are searched in the answer
            return itemized_record(item_id, raw_output, finish_reason, output_text=output_text,
                                   evidence_not_found=evidence_not_found, **extra)
        return judged_record(item_id, raw_output, finish_reason, **extra)

    def failed(self, item_id, status, error, **fields):
        return failed_record(item_id, status, error, self.answer_format, **fields)

    def _missing_context(self, item, missing):
        return missing_context_record(item.id, missing, self.answer_format)

    def _finish_aggregate(self, record, value):
        # score is the aggregate rounded half up; grade stays the representative sample's own
        return {**record, "score": round_half_up(value), "score_exact": float(value)}

    def unusable(self, record):
        if "result" in record:
            return "a score_model grader's record: pass its --grader-config"
        if not isinstance(record.get("format", "seed"), str) or record.get("format", "seed") not in FORMATS:
            return f"unknown format {record.get('format')!r}: expected one of {', '.join(FORMATS)}"
        return super().unusable(record)

    def _unusable_value(self, value):
        if type(value) is not int or not 0 <= value <= 5:
            return f"status ok with score {value!r}: expected an integer from 0 to 5"
        return None

    def describe(self):
        described = {"type": "seed", "checklist": self.checklist, "format": self.answer_format}
        if self.rubric_prompt is not None:
            described |= {"evidence": self.evidence,
                          "rubric_prompt": {"name": self.rubric_prompt.name,
                                            "sha256": self.rubric_prompt.sha256}}
        return described


class ScoreModelJudge(Judge):
    """An OpenAI ``score_model`` grader config run on the local judge."""

    required = ("output_text",)
    value_key = "result"

    def __init__(self, path: str):
        from grader.judge.score_model import load_grader_config

        self.grader = load_grader_config(path)
        self.prompt = self.grader.prompt
        self.schema = self.grader.schema()
        self.max_tokens = self.grader.MAX_TOKENS

    def judged(self, item_id, raw_output, finish_reason, *, output_text=None,
               evidence_not_found=None, **extra):
        return self.grader.record(item_id, raw_output, finish_reason, **extra)

    def failed(self, item_id, status, error, **fields):
        return self.grader.failed(item_id, status, error, **fields)

    def _finish_aggregate(self, record, value):
        result = float(value)
        return {**record, "result": result, "passed": self.grader.passed(result)}

    def _unusable_value(self, value):
        if type(value) not in (int, float) or value != value:
            return f"status ok with result {value!r}: expected a number"
        return None

    def describe(self):
        return self.grader.describe()


def make_judge(
    *,
    grader_config: str | None = None,
    prompt: str | None = None,
    checklist: bool = True,
    answer_format: str | None = None,
    evidence: bool = False,
) -> Judge:
    """The one place a judge is chosen: an OpenAI score_model grader config, else the seed."""
    if grader_config:
        return ScoreModelJudge(grader_config)
    return SeedJudge(prompt, checklist=checklist, answer_format=answer_format, evidence=evidence)


def rescoring_judges(grader_config: str | None) -> dict[str | None, Judge]:
    """The judges ``rescore`` reads records with, by the record's ``format`` (None: a record
    written before formats existed, in the seed's)."""
    if grader_config:
        judge = ScoreModelJudge(grader_config)
        return {None: judge, **{f: judge for f in FORMATS}}
    judges: dict[str | None, Judge] = {f: SeedJudge(answer_format=f) for f in FORMATS}
    return {None: judges["seed"], **judges}
