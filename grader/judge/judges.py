"""What the judge is asked and how its answers become records: one judge per answer shape (the
seed's five lines, the itemized format, the rubric format, an OpenAI ``score_model`` grader
config). Grading and rescoring both build an :class:`Answer` and call :meth:`Judge.read`;
nothing outside this module asks which kind of judge it holds.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypedDict

from msgspec import UNSET
from msgspec.structs import replace

from grader.io.dataset import Dataset, Item
from grader.judge.confidence import confidence_problem, record_confidence
from grader.judge.prompts import Prompt, load_prompt
from grader.judge.records import (
    AGGREGATES,
    AnySample,
    KeptEvidence,
    aggregate_samples,
    failed_record,
    itemized_record,
    judged_record,
    missing_context_record,
)
from grader.judge.schema import (
    ANSWER_FORMATS,
    VERDICTS,
    JsonSchema,
    format_max_chars,
    format_schema,
)
from grader.judge.scoring import round_half_up
from grader.records import (
    ITEM_CATEGORIES,
    SEED_KINDS,
    DraftRecord,
    ForeignRecord,
    ItemizedRecord,
    PairwiseRecord,
    Record,
    RubricRecord,
    Sample,
    ScoreConfidence,
    ScoreModelRecord,
    SeedRecord,
    Usage,
)
from grader.status import ZERO_SCORE, Status

if TYPE_CHECKING:
    from grader.backends import Completion
    from grader.judge.rubric import Rubric, Rubrics


class Stored(TypedDict, total=False):
    """What a record stores of an answer as it is, in this order: the token usage, and a
    thinking judge's reasoning (kept beside the answer, never parsed)."""

    usage: Any  # a Usage; another tool's record's as its file holds it
    reasoning: str | None


def _stored(usage: Any, reasoning: Any) -> Stored:
    """The fields of ``usage`` and ``reasoning`` that are set (UNSET: absent)."""
    stored = Stored()
    if usage is not UNSET:
        stored["usage"] = usage
    if reasoning is not UNSET:
        stored["reasoning"] = reasoning
    return stored


class JudgeEntry(TypedDict, total=False):
    """The run manifest's ``judge`` entry: the fields each judge writes of itself."""

    type: str  # seed, pairwise or score_model
    checklist: bool
    format: str | None
    evidence: bool  # the rubric format's, and its rubric pass's prompt (name, sha256)
    rubric_prompt: dict[str, str]
    rubric: str | None  # the pairwise format's rubric file
    # a score_model grader config's
    name: str
    path: str
    sha256: str
    range: list[float]
    pass_threshold: float | None
    hosted_model_ignored: str | None


class StageRef(NamedTuple):
    """A judge's preparation stage (:mod:`grader.run.stage`), named without importing it (the
    run layer is above the judge's): its run-manifest entry and its class, ``"module:Class"``."""

    name: str
    target: str


@dataclass(frozen=True)
class Answer:
    """What a judge reads: one answer of the judge and what the record keeps beside it.

    Grading builds it from a completion (:meth:`of_completion`), rescoring from a results
    record (:meth:`of_record`); :meth:`Judge.read` turns either into the same record.
    """

    id: Any
    raw_output: str | None
    finish_reason: str | None
    stored: Stored = field(default_factory=Stored)
    output_text: str | None = None  # the graded answer; None on a rescore (no dataset)
    # a rescore's earlier check of the quotes: a record's, or a sample's JSON
    evidence_not_found: KeptEvidence | None = None
    rubric: Any = None  # the row's rubric (the rubric format), as the record keeps it
    error: str | None = None  # finish_reason "error": why, and which status
    failure: Status = Status.ENGINE_ERROR
    # --confidence: the answer's tokens and their top log-probabilities (grading), or the
    # probabilities an earlier confidence kept (rescoring; kept_confidence True).
    tokens: tuple[str, ...] | None = None
    top_logprobs: tuple[dict[str, float], ...] | None = None
    kept_confidence: bool = False
    kept_probabilities: object = None
    kept_confidence_error: str | None = None

    @classmethod
    def of_completion(cls, item: Item, completion: Completion,
                      fields: Mapping[str, Any] | None = None) -> Answer:
        """The answer to ``item``'s prompt, rendered from ``fields`` [default: the row's own;
        the rubric format's add the row's rubric: :meth:`Judge.context`]."""
        fields = item.fields if fields is None else fields
        usage = Usage(prompt_tokens=completion.prompt_tokens, output_tokens=completion.output_tokens)
        stored = Stored(usage=usage)
        if completion.reasoning is not None:  # else the record has no such field
            usage.reasoning_tokens = completion.reasoning_tokens
            stored["reasoning"] = completion.reasoning
        output_text = fields.get("output_text")
        return cls(item.id, completion.text, completion.finish_reason, stored,
                   output_text=None if output_text is None else str(output_text),
                   rubric=fields.get("rubric"), error=completion.error, failure=completion.failure,
                   tokens=completion.tokens, top_logprobs=completion.top_logprobs)

    @classmethod
    def of_record(cls, record: Record) -> Answer | None:
        """The answer a results record keeps; None when it has none to re-read."""
        if record.raw_output is None or record.finish_reason == "error":
            return None
        evidence_not_found = rubric = None
        if isinstance(record, (ItemizedRecord, RubricRecord)) and record.evidence_not_found is not UNSET:
            evidence_not_found = record.evidence_not_found
        if isinstance(record, RubricRecord) and record.rubric is not UNSET:
            rubric = record.rubric
        kept = record.confidence
        # a record from before finish reasons were kept was a stopped answer
        finish_reason = record.finish_reason if record.has("finish_reason") else "stop"
        return cls(record.id, record.raw_output, finish_reason,
                   _stored(record.usage, record.reasoning), evidence_not_found=evidence_not_found,
                   rubric=rubric, kept_confidence=kept is not UNSET,
                   kept_probabilities=_kept_probabilities(kept),
                   kept_confidence_error=record.field("confidence_error"))

    @classmethod
    def of_sample(cls, record: Record, sample: AnySample) -> Answer | None:
        """The answer one of ``record``'s samples keeps (what the record keeps of it, and the
        rubric every sample's labels are counted against); None when it has none to re-read.
        A sample is its record's :class:`~grader.records.Sample`, or a plain object where the
        record is another tool's (both read by name)."""
        raw_output = sample.get("raw_output")
        if raw_output is None or sample.get("finish_reason") == "error":
            return None
        kept = sample.get("confidence")
        rubric = record.rubric if isinstance(record, RubricRecord) else UNSET
        return cls(record.id, raw_output, sample.get("finish_reason", "stop"),
                   _stored(sample.get("usage", UNSET), sample.get("reasoning", UNSET)),
                   evidence_not_found=sample.get("evidence_not_found"),
                   rubric=None if rubric is UNSET else rubric,
                   kept_confidence="confidence" in sample,
                   kept_probabilities=_kept_probabilities(kept),
                   kept_confidence_error=sample.get("confidence_error"))


class Judge(ABC):
    """A prompt, the schema its answers are forced into, and how an answer becomes a record.

    Grading and rescoring call :meth:`read`; grading also asks :meth:`unsent` for a row it
    does not send and :meth:`aggregate` for a row's samples. What only some formats do is
    data (:attr:`stage`, :attr:`options`, :attr:`key_fields`, :attr:`loop_test`), or a method
    only their judge overrides (:meth:`context` to :meth:`check_fields`).
    """

    prompt: Prompt
    schema: JsonSchema
    max_tokens: int  # the longest answer the schema admits
    required: tuple[str, ...]  # fields without which a row is not sent
    # the class of the records it writes
    record_type: type[SeedRecord] | type[ScoreModelRecord] | type[PairwiseRecord]
    checklist: bool = False  # the prompt template's `checklist` variable
    answer_format: str | None = None  # the seed judge's answer format; None for other judges
    #: what must be made before its rows can be rendered, once per group of rows
    #: (:mod:`grader.run.stage`); None: each row is rendered from its own fields
    stage: ClassVar[StageRef | None] = None
    #: the fields that hold the answers it judges: what ``--truncate output_text`` cuts
    answer_fields: ClassVar[tuple[str, ...]] = ("output_text",)
    #: the format options its judge takes (--rubric, --evidence, --confidence), by name
    options: ClassVar[frozenset[str]] = frozenset()
    #: what the judge adds to the run's resume key (:func:`grader.run.core.run_key`)
    key_fields: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: where its schema asks to end an answer on a loop (schema.END_ON_LOOP), the test that
    #: says whether the text so far already copies itself: the request's stop rule carries it
    #: (grader.run.rows.generate_request) for an engine that stops a row mid-way
    loop_test: Callable[[str], bool] | None = None

    @abstractmethod
    def _parsed(self, answer: Answer) -> Record:
        """The record of one answer: parse and score."""

    @abstractmethod
    def failed(self, item_id: Any, status: Status, error: str, **fields: Any) -> Record:
        """The record of a row without an answer to read: overflow, engine error, not sent."""

    @abstractmethod
    def describe(self) -> JudgeEntry:
        """The judge's part of the run manifest."""

    @abstractmethod
    def aggregate(self, samples: list[Record], method: str) -> Record:
        """One record from a row's samples (:func:`~grader.judge.records.aggregate_samples`)."""

    def read(self, answer: Answer) -> Record:
        """The record of one answer: parse, score, and with --confidence weigh its choices."""
        if answer.finish_reason == "error":
            return self.failed(answer.id, answer.failure, answer.error or "the engine failed this row",
                               raw_output=answer.raw_output or None,
                               finish_reason=answer.finish_reason, **answer.stored)
        record = self._parsed(answer)
        if (record.status == Status.TRUNCATED and answer.stored.get("reasoning") is not None
                and not answer.raw_output):
            record.error = ("max_tokens ran out while the judge was still thinking: no answer "
                            "(raise --max-tokens, or cap the thinking with --thinking-budget)")
        if isinstance(record, (ItemizedRecord, RubricRecord)):  # answers whose choices it weighs
            weighed = _weighed(record, answer)
            if weighed is not None:
                record.confidence, record.confidence_error = weighed
        return record

    def context(self, item: Item) -> Mapping[str, Any] | None:
        """The fields the row's prompt is rendered from and its answer read against: the row's
        own, or a new mapping where the judge adds to them (the rubric format: the row's
        rubric; the pairwise format: its answers as text and the reference's items), never
        written into the row; None: the row is not sent (:meth:`unsent` says why)."""
        return item.fields

    @classmethod
    def fields_to_cut(cls, truncate: Sequence[str]) -> tuple[str, ...]:
        """The row fields ``--truncate``'s choice lets a row too long for the context be cut
        in: ``output_text`` names the judge's :attr:`answer_fields` (both answers of a pair)."""
        return tuple(dict.fromkeys(
            name for field in truncate
            for name in (cls.answer_fields if field == "output_text" else (field,))))

    def row_schema(self, item: Item) -> JsonSchema | None:
        """The schema this row's answer is forced into, when it is not :attr:`schema`."""
        return None

    def group_key(self, item: Item) -> str:
        """Rows with one key share their prompt's prefix: they are sent next to each other."""
        return ""

    def more_views(self, item: Item) -> tuple[Item, ...]:
        """The row's further conversations' items, each rendered, sent and read like a row of
        its own and then joined with the row's own into its one record (:meth:`join`); only
        the pairwise format has one (its swapped order)."""
        return ()

    def join(self, item: Item, records: list[Record]) -> Record:
        """The row's record from the records of its conversations (its own, then
        :meth:`more_views`'), in that order."""
        return records[0]

    def missing(self, item: Item) -> list[str]:
        return [name for name in self.required if not item.fields.get(name)]

    def check_fields(self, dataset: Dataset) -> None:
        """Refuse a dataset that lacks a column this judge cannot do without (one row without
        a text is a row's status; a file without the column is a mistake). Only the pairwise
        format refuses one: the seed's formats count a missing text as a missing_context row."""
        return None

    def unsent(self, item: Item) -> Record:
        """The record of a row the judge never sees: missing content or unsendable text."""
        missing = self.missing(item)
        if missing:
            return self.failed(item.id, Status.MISSING_CONTEXT, f"empty or missing {' and '.join(missing)}")
        return self.failed(item.id, Status.INVALID_INPUT, item.invalid or "invalid input")

    def kept(self, item_id: Any, sample: AnySample) -> Record:
        """A sample the engine failed, rebuilt as it was: there is nothing to re-read.

        The judge's own fields (score, result, ...) stay the failed record's nulls: a sample
        without an answer never carries a score, whatever a hand-edited file says.
        """
        status = Status(str(sample.get("status")))  # a known status (unusable checked it)
        dropped = {"id", "status", "error", *self.record_type.own_fields}
        fields = sample if isinstance(sample, dict) else {
            name: sample.get(name) for name in sample.__struct_fields__ if name in sample}
        rest = {k: v for k, v in fields.items() if k not in dropped}
        return self.failed(item_id, status, sample.get("error") or "", **rest)

    def unusable(self, record: Record) -> str | None:
        """Why this judge cannot rescore ``record`` (another judge's, a hand-edited file's), or
        None; each check names what would otherwise be a traceback halfway through a file."""
        if record.confidence is not UNSET:
            problem = confidence_problem(record.confidence)
            if problem:
                return problem
        if record.samples:
            return _unusable_samples(record)
        if record.raw_output is not None and record.finish_reason != "error":
            return None  # rescored: whatever else it holds is replaced
        # by name: a record of another kind (another tool's) is kept with this judge's value
        name = self.record_type.value_field
        assert name is not None  # each judge's records grade with a value
        return _unusable_kept(record, name)


def _weighed(record: ItemizedRecord | RubricRecord,
             answer: Answer) -> tuple[ScoreConfidence | None, str | None] | None:
    """``(confidence, confidence_error)`` where --confidence asked for them, else None."""
    if answer.top_logprobs is not None:  # only then does the record have these fields
        return record_confidence(record, answer.tokens, answer.top_logprobs)
    if not answer.kept_confidence:
        return None
    # The choices' probabilities were kept: the distribution is recomputed from them under
    # the current scoring, as the score is; without them it stays unknown.
    if answer.kept_probabilities is not None:
        return record_confidence(record, probabilities=answer.kept_probabilities)
    return None, answer.kept_confidence_error or "no probabilities kept"


# What the value of an ``ok`` record must be, by the record's value field: the test, in words.
_VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "score": (lambda v: type(v) is int and 0 <= v <= 5, "an integer from 0 to 5"),
    "result": (lambda v: type(v) in (int, float) and v == v, "a number"),  # NaN != NaN
    "winner": (lambda v: v in VERDICTS, f"one of {', '.join(VERDICTS)}"),
}


def _unusable_kept(record: Record, name: str) -> str | None:
    """Why ``record``, kept as it is, is no record of a judge whose value is ``name``: the
    summary counts it by its status and value."""
    status = record.status
    if not isinstance(status, str):
        return "no raw_output to rescore and no status to keep"
    if status not in _STATUSES:
        return f"unknown status {status!r}: expected one of {', '.join(_STATUSES_IN_ORDER)}"
    value = record.field(name)
    if status == Status.OK:
        test, expected = _VALUES[name]
        return None if test(value) else f"status ok with {name} {value!r}: expected {expected}"
    if value is not None and not (status in ZERO_SCORE and value == 0 and type(value) is int):
        return f"status {status} with {name} {value!r}: only an ok row has a {name} (null here)"
    return None


def items_given(record: Record) -> int | None:
    """How many items ``record``'s answer was marked against where the judge gave them (the
    rubric format's; the controls' verdict weighs them); None where it gave none."""
    if not isinstance(record, RubricRecord) or not isinstance(record.rubric, dict):
        return None
    return sum(len(record.rubric.get(name) or ()) for name in ITEM_CATEGORIES)


def _unusable_samples(record: Record) -> str | None:
    """Why the samples of ``record`` cannot be rescored, or None."""
    samples = record.samples
    if not isinstance(samples, list) or not all(isinstance(s, (dict, Sample)) for s in samples):
        return "samples must be a list of objects"
    if record.aggregate is not UNSET and record.aggregate not in AGGREGATES:
        return f"unknown aggregate {record.aggregate!r}: expected one of {', '.join(AGGREGATES)}"
    for number, sample in enumerate(samples, start=1):
        if not isinstance(sample.get("raw_output"), (str, type(None))):
            return f"sample {number}: raw_output must be a string or null"
        rescorable = sample.get("raw_output") is not None and sample.get("finish_reason") != "error"
        if not rescorable and sample.get("status") not in _STATUSES:
            return f"sample {number}: no raw_output to rescore and no known status to keep"
        if not rescorable and sample.get("status") == Status.OK:
            return f"sample {number}: status ok without a raw_output to rescore"
    return None


_STATUSES_IN_ORDER = [str(status) for status in Status]
_STATUSES = frozenset(_STATUSES_IN_ORDER)

# The answer format of a request that names neither a format nor a prompt.
DEFAULT_FORMAT = "rubric"
# The built-in prompt written for each answer format.
FORMAT_PROMPTS = {"rubric": "seed-check", "itemized": "seed-itemized", "seed": "seed",
                  "pairwise": "seed-pairwise"}
# The rubric format's first pass, once per (input, reference).
RUBRIC_PROMPT = "seed-rubric"


def resolve_format(prompt: str | None, answer_format: str | None) -> tuple[str, str]:
    """``(prompt, format)`` of a seed-judge request where either may be left out.

    Neither given: the rubric format and its check prompt. Only a format: that format's
    built-in prompt. Only a prompt: the format of a built-in format's prompt (seed-check,
    seed-itemized), else the seed's (seed, seed-verbatim and a user's prompt file ask for the
    seed's five lines).
    """
    if answer_format is not None and answer_format not in ANSWER_FORMATS:
        raise ValueError(f"unknown format {answer_format!r}: choose from {', '.join(ANSWER_FORMATS)}")
    if prompt is None:
        answer_format = answer_format or DEFAULT_FORMAT
        return FORMAT_PROMPTS[answer_format], answer_format
    if answer_format is None:
        by_prompt = {name: f for f, name in FORMAT_PROMPTS.items()}
        answer_format = by_prompt.get(prompt, "seed")
    return prompt, answer_format


class _SeedShapedJudge(Judge):
    """What the seed's answer formats share: counts -> the seed's formula, recomputed exactly,
    into a record with the seed's fields and ``format``."""

    required = ("reference", "output_text")
    answer_format: str
    record_type: type[SeedRecord]

    def __init__(self, prompt: str | None = None):
        self.record_type = SEED_KINDS[self.answer_format]
        self.prompt = load_prompt(prompt or FORMAT_PROMPTS[self.answer_format])
        # The schema the backend is built with; the rubric format's is its rubric pass's, and
        # each check-pass row carries its own (row_schema).
        self.schema = format_schema(self.answer_format, self.checklist)
        self.max_tokens = format_max_chars(self.answer_format, self.checklist)

    def failed(self, item_id: Any, status: Status, error: str, **fields: Any) -> Record:
        return failed_record(item_id, status, error, self.answer_format, **fields)

    def unsent(self, item: Item) -> Record:
        missing = self.missing(item)
        if missing:
            return missing_context_record(item.id, missing, self.answer_format)
        return super().unsent(item)

    def aggregate(self, samples: list[Record], method: str) -> Record:
        # score is the aggregate rounded half up; grade stays the representative sample's own
        return aggregate_samples(samples, method, lambda record, value: replace(
            record, score=round_half_up(value), score_exact=float(value)))

    def unusable(self, record: Record) -> str | None:
        if isinstance(record, ScoreModelRecord):
            return "a score_model grader's record: pass its --grader-config"
        if isinstance(record, ForeignRecord) and record.has("format"):  # a format of no class
            return f"unknown format {record.field('format')!r}: expected one of {', '.join(ANSWER_FORMATS)}"
        return super().unusable(record)

    def describe(self) -> JudgeEntry:
        return {"type": "seed", "checklist": self.checklist, "format": self.answer_format}


class SeedJudge(_SeedShapedJudge):
    """The seed judge: the seed's five rationale lines, whose counts grader re-reads."""

    answer_format = "seed"

    def __init__(self, prompt: str | None = None, *, checklist: bool = True):
        self.checklist = checklist
        super().__init__(prompt)

    def _parsed(self, answer: Answer) -> Record:
        return judged_record(answer.id, answer.raw_output, answer.finish_reason, **answer.stored)


class ItemizedJudge(_SeedShapedJudge):
    """The itemized format: the counts are those of the judge's items, and there is no
    checklist: the item lists are the enumeration the checklist stood for."""

    answer_format = "itemized"
    options = frozenset({"confidence"})

    def _parsed(self, answer: Answer) -> Record:
        # the judge's quotes are searched in the answer
        return itemized_record(answer.id, answer.raw_output, answer.finish_reason,
                               output_text=answer.output_text,
                               evidence_not_found=answer.evidence_not_found, **answer.stored)


class RubricJudge(_SeedShapedJudge):
    """The rubric format's check pass: the counts are those of the judge's labels of the
    reference's rubric (:mod:`grader.judge.rubric`). It is built with the rubric pass's
    :class:`~grader.judge.rubric.Rubrics` (:meth:`with_rubrics`: a new judge, this one
    unchanged) and renders each row's prompt from its reference's rubric there
    (:meth:`context`); its drafts are :class:`DraftJudge`'s (:attr:`drafts`)."""

    answer_format = "rubric"
    stage = StageRef("rubric", "grader.run.rubric_pass:RubricPass")
    # --rubric FILE: rubrics to mark; --evidence: a quote per item marked present
    options = frozenset({"rubric", "evidence", "confidence"})
    # a results file graded in another format is re-graded, never mixed in
    key_fields = MappingProxyType({"format": "rubric"})

    def __init__(self, prompt: str | None = None, *, evidence: bool = False,
                 rubrics: Rubrics | None = None) -> None:
        from grader.judge.rubric import Rubrics

        super().__init__(prompt)
        self.evidence = evidence
        self.rubric_prompt = load_prompt(RUBRIC_PROMPT)
        self.rubrics: Rubrics = Rubrics() if rubrics is None else rubrics
        self.drafts = DraftJudge()

    def with_rubrics(self, rubrics: Rubrics) -> RubricJudge:
        """This judge built with ``rubrics`` (this one keeps its own)."""
        judge = copy.copy(self)
        judge.rubrics = rubrics
        return judge

    def _rubric_of(self, item: Item) -> Rubric | None:
        from grader.judge.rubric import Rubric

        rubric = self.rubrics.of(item.fields)
        return rubric if isinstance(rubric, Rubric) else None

    def context(self, item: Item) -> Mapping[str, Any] | None:
        rubric = self._rubric_of(item)
        if rubric is None or not rubric.facts:  # no rubric, or no facts: not sent (unsent)
            return None
        return {**item.fields, **rubric.context(self.evidence)}

    def row_schema(self, item: Item) -> JsonSchema | None:
        from grader.judge.schema import check_schema

        rubric = self._rubric_of(item)
        assert rubric is not None  # a row without one is not sent
        return check_schema(rubric.size(), self.evidence)

    def group_key(self, item: Item) -> str:
        from grader.io.rubric_file import rubric_key

        # the rubric's key: rows checked against one rubric share their prompt's prefix
        return rubric_key(item.fields.get("input"), item.fields["reference"])

    def unsent(self, item: Item) -> Record:
        if not self.missing(item) and not item.invalid:
            from grader.judge.records import empty_rubric_record
            from grader.judge.rubric import RubricFailure

            rubric = self.rubrics.of(item.fields)
            if rubric is None:
                return self.failed(item.id, Status.ENGINE_ERROR,
                                   "rubric pass: no rubric was written for this reference")
            if isinstance(rubric, RubricFailure):
                return self.failed(item.id, rubric.status, f"rubric pass: {rubric.reason}")
            return empty_rubric_record(item.id, rubric.as_dict())
        return super().unsent(item)

    def _parsed(self, answer: Answer) -> Record:
        from grader.judge.records import rubric_record

        if not isinstance(answer.rubric, dict):
            return self.failed(answer.id, Status.PARSE_ERROR, "the record holds no rubric",
                               raw_output=answer.raw_output, finish_reason=answer.finish_reason,
                               **answer.stored)
        return rubric_record(answer.id, answer.raw_output, answer.finish_reason,
                             rubric=answer.rubric, output_text=answer.output_text,
                             evidence_not_found=answer.evidence_not_found, **answer.stored)

    def describe(self) -> JudgeEntry:
        prompt = {"name": self.rubric_prompt.name, "sha256": self.rubric_prompt.sha256}
        return super().describe() | {"evidence": self.evidence, "rubric_prompt": prompt}


def _kept_probabilities(kept: Any) -> object:
    """The probabilities an earlier confidence kept (a record's, or a sample's object)."""
    if isinstance(kept, ScoreConfidence):
        return kept.probabilities if isinstance(kept.probabilities, dict) else None
    return kept.get("probabilities") if isinstance(kept, dict) else None


def _draft_usage(usage: object) -> Usage | None:
    """A draft's usage: the prompt's and the answer's token counts (no reasoning's)."""
    if not isinstance(usage, Usage):
        return None
    return Usage(prompt_tokens=usage.prompt_tokens, output_tokens=usage.output_tokens)


class DraftJudge(_SeedShapedJudge):
    """The rubric pass's judge: one prompt per distinct (input, reference), its answer forced
    into :class:`~grader.judge.rubric.RubricDraft` and handed back unparsed, as a
    :class:`DraftRecord`, for :mod:`grader.run.rubric_pass` to make a rubric of."""

    answer_format = "rubric"

    def __init__(self) -> None:
        from grader.judge.rubric import draft_looped
        from grader.judge.schema import draft_max_chars, draft_schema

        self.record_type = SEED_KINDS[self.answer_format]
        self.prompt = load_prompt(RUBRIC_PROMPT)
        self.schema = draft_schema()
        self.max_tokens = draft_max_chars()
        self.loop_test = draft_looped

    def __reduce__(self) -> tuple[Any, ...]:
        # sent with its drafts to a worker process or a Ray actor: a prompt's compiled
        # templates do not pickle, so it is built again there
        return DraftJudge, ()

    def row_schema(self, item: Item) -> JsonSchema | None:
        return self.schema

    def read(self, answer: Answer) -> Record:
        # a draft the engine failed (a server's HTTP 500 or malformed answer, a prompt vLLM
        # refused) keeps the engine's status and words: read as text it was "empty answer"
        status = answer.failure if answer.finish_reason == "error" else Status.OK
        return DraftRecord(id=answer.id, status=str(status), raw_output=answer.raw_output,
                           finish_reason=answer.finish_reason, error=answer.error,
                           usage=_draft_usage(answer.stored.get("usage")))

    def _parsed(self, answer: Answer) -> Record:
        return self.read(answer)


class ScoreModelJudge(Judge):
    """An OpenAI ``score_model`` grader config run on the local judge."""

    required = ("output_text",)
    record_type = ScoreModelRecord

    def __init__(self, path: str):
        from grader.judge.score_model import load_grader_config

        self.grader = load_grader_config(path)
        self.prompt = self.grader.prompt
        self.schema = self.grader.schema()
        self.max_tokens = self.grader.MAX_TOKENS

    def _parsed(self, answer: Answer) -> Record:
        return self.grader.record(answer.id, answer.raw_output, answer.finish_reason,
                                  **answer.stored)

    def failed(self, item_id: Any, status: Status, error: str, **fields: Any) -> Record:
        return self.grader.failed(item_id, status, error, **fields)

    def aggregate(self, samples: list[Record], method: str) -> Record:
        return aggregate_samples(samples, method, lambda record, value: replace(
            record, result=float(value), passed=self.grader.passed(float(value))))

    def describe(self) -> JudgeEntry:
        return self.grader.describe()


class PairwiseJudge(Judge):
    """The pairwise format (:mod:`grader.judge.pairwise`): the row's two answers side by side,
    judged in the row's order and swapped (:meth:`more_views`), the two games read one by
    one and joined into the row's record (:meth:`join`).

    Args:
        prompt: a prompt of the format's fields (``output_a``, ``output_b``, ``input``,
            ``reference``, ``rubric_items``) [default: seed-pairwise].
        rubric: a rubric file (``grader rubric``): a row whose (input, reference) it holds is
            shown its items; the others none.
    """

    answer_format = "pairwise"
    options = frozenset({"rubric", "confidence"})  # --rubric FILE: the reference's items shown
    required = ("output_a", "output_b")
    answer_fields = ("output_a", "output_b")
    record_type = PairwiseRecord

    def __init__(self, prompt: str | None = None, *, rubric: str | None = None):
        from grader.io.rubric_file import read_rubric_file

        self.prompt = load_prompt(prompt or FORMAT_PROMPTS[self.answer_format])
        self.schema = format_schema(self.answer_format)
        self.max_tokens = format_max_chars(self.answer_format)
        self.rubric = rubric
        self.rubrics = read_rubric_file(rubric) if rubric else {}

    def missing(self, item: Item) -> list[str]:
        from grader.io.dataset import cell_text

        # an answer of blanks, or a JSON null, is no answer (the dataset's rule for its own fields)
        return [name for name in self.required if cell_text(item.fields.get(name)) is None]

    def check_fields(self, dataset: Dataset) -> None:
        for name in self.required:
            dataset.require_field(name, (
                f"no column {name!r}: --format pairwise reads two answers a row, "
                f"output_a and output_b (another column: --map {name}=COLUMN)"))

    def context(self, item: Item) -> Mapping[str, Any]:
        from grader.io.dataset import cell_text
        from grader.io.rubric_file import rubric_key
        from grader.judge.pairwise import ANSWERS, MODELS

        fields = dict(item.fields)
        for name in (*ANSWERS, *MODELS):  # as the dataset reads its own fields: text
            if name in fields:
                fields[name] = cell_text(fields[name]) or ""
        from grader.judge.rubric import Rubric

        line = self.rubrics.get(rubric_key(fields.get("input"), fields.get("reference") or ""))
        fields["rubric_items"] = "" if line is None else Rubric.of_line(line).numbered()
        return fields

    def more_views(self, item: Item) -> tuple[Item, ...]:
        from grader.judge.pairwise import swapped_fields

        return (Item(item.id, item.index, item.line, swapped_fields(self.context(item)),
                     item.invalid),)

    def _parsed(self, answer: Answer) -> Record:
        from grader.judge.pairwise import game_confidence, game_record

        record = game_record(answer.id, answer.raw_output, answer.finish_reason, **answer.stored)
        if answer.top_logprobs is not None:  # --confidence
            record.confidence, record.confidence_error = game_confidence(
                record, answer.tokens, answer.top_logprobs)
        return record

    def join(self, item: Item, records: list[Record]) -> Record:
        from grader.judge.pairwise import model_names, pair_record

        games = [record for record in records if isinstance(record, PairwiseRecord)]
        assert len(games) == len(records)  # _parsed and failed build only PairwiseRecords
        return pair_record(item.id, games, *model_names(item.fields))

    def unsent(self, item: Item) -> Record:
        from grader.judge.pairwise import model_names

        record = super().unsent(item)
        assert isinstance(record, PairwiseRecord)  # failed() builds one
        record.model_a, record.model_b = model_names(item.fields)
        return record

    def failed(self, item_id: Any, status: Status, error: str, **fields: Any) -> Record:
        return PairwiseRecord.build(id=item_id, status=str(status), error=error, **fields)

    def aggregate(self, samples: list[Record], method: str) -> Record:
        # --samples is refused with this format (grader.run.request.judge_for): each row is
        # judged twice already, once in each order
        raise NotImplementedError("the pairwise format judges one answer per order")

    def describe(self) -> JudgeEntry:
        return {"type": "pairwise", "format": self.answer_format, "rubric": self.rubric}


# Each answer format's judge class, in ANSWER_FORMATS' order (make_judge builds them).
JUDGE_CLASSES: dict[str, type[Judge]] = {"rubric": RubricJudge, "itemized": ItemizedJudge,
                                         "seed": SeedJudge, "pairwise": PairwiseJudge}


def formats_taking(option: str) -> list[str]:
    """The answer formats whose judge takes ``option`` (:attr:`Judge.options`), in
    :data:`ANSWER_FORMATS`' order."""
    return [f for f, judge in JUDGE_CLASSES.items() if option in judge.options]


def either(formats: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return " or ".join(filter(None, [", ".join(formats[:-1]), formats[-1]]))


def check_options(answer_format: str | None, **given: Any) -> None:
    """Each option ``given`` (a value, not None or False) must be one the format's judge takes
    (:attr:`Judge.options`); raises ValueError naming the formats that take it."""
    for option, value in given.items():
        formats = formats_taking(option)
        if value and answer_format not in formats:
            raise ValueError(f"--{option} is for --format {either(formats)}")


def make_judge(*, grader_config: str | None = None, prompt: str | None = None,
               checklist: bool = True, answer_format: str | None = None, evidence: bool = False,
               rubric: str | None = None) -> Judge:
    """The one place a judge is chosen: an OpenAI score_model grader config, else the judge of
    the seed's answer format that ``prompt`` and ``answer_format`` resolve to.

    Args:
        rubric: the pairwise format's rubric file (the rubric format reads its own in its
            rubric pass, grader.run.rubric_pass).
    """
    if grader_config:
        return ScoreModelJudge(grader_config)
    prompt, answer_format = resolve_format(prompt, answer_format)
    if answer_format == "pairwise":
        return PairwiseJudge(prompt, rubric=rubric)
    if answer_format == "seed":
        return SeedJudge(prompt, checklist=checklist)
    if answer_format == "rubric":
        return RubricJudge(prompt, evidence=evidence)
    return ItemizedJudge(prompt)


def rescoring_judges(grader_config: str | None) -> dict[str | None, Judge]:
    """The judges ``rescore`` reads records with, by their :attr:`Record.kind`; a kind without
    a judge of its own (None: a record written before formats existed) goes to ``None``'s."""
    if grader_config:
        judge = ScoreModelJudge(grader_config)
        return {None: judge, **{f: judge for f in ANSWER_FORMATS}}
    judges: dict[str | None, Judge] = {f: make_judge(answer_format=f) for f in ANSWER_FORMATS}
    return {None: judges["seed"], **judges}
