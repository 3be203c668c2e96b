"""What a result record is: one class per kind, the one parser every reader gets records
through (:func:`parse_record`), and the one encoder (:meth:`Record.to_json`).

Records are ``msgspec.Struct`` classes, cheap to build (about 10^6 in a big run) and not
validated on the way in: the file boundary is checked once, by :func:`parse_record`. They are
encoded by ``json.dumps`` (:func:`dumps_record`), not msgspec, for the bytes results files have.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, Union

import msgspec
from msgspec import UNSET, UnsetType

from grader.errors import GraderError


class ResultsError(GraderError, ValueError):
    """A results file that cannot be read: ``PATH:LINE: reason``."""

    def __init__(self, message: str, *, path: Any = None, line: int | None = None,
                 reason: str | None = None):
        super().__init__(message)
        self.path, self.line, self.reason = path, line, reason

    @classmethod
    def at(cls, path: Any, line: int, reason: str) -> ResultsError:
        return cls(f"{path}:{line}: {reason}", path=path, line=line, reason=reason)

    def shifted(self, lines: int) -> ResultsError:
        """This error as it reads for a part of the file that starts ``lines`` lines in."""
        if self.line is None or self.reason is None:
            return self
        return ResultsError.at(self.path, self.line + lines, self.reason)


# json.dumps' own encoder, built once; encode() starts fresh markers per call (thread-safe)
_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def dumps_record(record: Any) -> str:
    """``json.dumps(record, ensure_ascii=False, allow_nan=False)``, exactly: the bytes of a
    results line."""
    return _encode(record)


# A record's JSON line: _HEAD, the judge's own fields (Record.own_fields), _BODY, the kind's
# later fields (Record.after_fields), then _TAIL, each there once set, in the order a run sets it.
_HEAD = ("id", "status")
_BODY = ("raw_output", "finish_reason", "error", "truncation")
_TAIL = ("usage", "reasoning", "confidence", "confidence_error", "aggregate", "spread", "samples",
         "key")
# What a record keeps of each of its samples, after its own value, status and fields.
_SAMPLE_BODY = ("raw_output", "finish_reason", "error", "usage")

_R = TypeVar("_R", bound="Record")
# A JSON object as a file holds it, carried through: a record's JSON, another tool's fields.
JSONFields = dict[str, Any]


# The categories of items, in the order records write them (grader.judge.parsing.CATEGORIES).
ITEM_CATEGORIES = ("facts", "conclusions", "terms")
#: The field of a record that holds the item lists its items were marked against
#: (:meth:`Record.listed_items`).
LISTED_ITEMS_FIELD = "rubric"


class Finding(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One item the itemized judge enumerated, in its schema's order (a judge answering without
    the schema may leave out the item or the quote)."""

    item: str | UnsetType = UNSET
    quote: str | UnsetType = UNSET
    present: bool


class LabelledItem(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One item of the reference's fixed list with the judge's label, and its quote (--evidence)."""

    item: str
    present: bool
    quote: str | UnsetType = UNSET


_E = TypeVar("_E", Finding, LabelledItem)


class MarkedItems(msgspec.Struct, Generic[_E], forbid_unknown_fields=True):
    """A record's ``items``: each category's items with the judge's mark on each, as
    :class:`Finding` (itemized) or :class:`LabelledItem` (listed before the answer was read)."""

    facts: list[_E]
    conclusions: list[_E]
    terms: list[_E]

    def by_category(self) -> tuple[tuple[str, list[_E]], ...]:
        """``(category, its items)`` for each category, in order."""
        return tuple((category, getattr(self, category)) for category in ITEM_CATEGORIES)

    def labels(self) -> list[bool]:
        """Every item's ``present``, in order (facts, conclusions, terms)."""
        return [entry.present for _, entries in self.by_category() for entry in entries]

    def numbers(self) -> list[int]:
        """``[present, of how many]`` per category, in order: the counts the score is made of."""
        return [number for _, entries in self.by_category()
                for number in (sum(entry.present for entry in entries), len(entries))]


class MissingEvidence(msgspec.Struct, forbid_unknown_fields=True):
    """An item whose quote is not found in the graded answer (``evidence_not_found``)."""

    category: str
    index: int
    quote: str


class MatchCount(msgspec.Struct, forbid_unknown_fields=True):
    """How many of a category's reference items the answer matched, of how many."""

    matched: int
    total: int


class RecordCounts(msgspec.Struct, forbid_unknown_fields=True):
    """A seed-shaped record's ``counts``: each category's :class:`MatchCount`, then the
    organization verdict (``matched`` / ``mismatched``). Read strictly, as every Struct here:
    an undeclared field would not be written back."""

    facts: MatchCount
    conclusions: MatchCount
    terms: MatchCount
    organization: str


class Usage(msgspec.Struct, forbid_unknown_fields=True):
    """A grader record's ``usage``: the answer's token counts as the backend gave them (null
    where not counted; ``reasoning_tokens`` only for a thinking judge), each written only where
    set. Another tool's record (:class:`ForeignRecord`) keeps its usage as it is."""

    prompt_tokens: int | None | UnsetType = UNSET
    output_tokens: int | None | UnsetType = UNSET
    reasoning_tokens: int | None | UnsetType = UNSET

    @classmethod
    def total(cls, usages: Iterable[Usage | None | UnsetType]) -> Usage | None:
        """The counts of ``usages`` added up field by field; None where none holds a count."""
        sums: dict[str, int] = {}
        for usage in usages:
            for name in usage.__struct_fields__ if isinstance(usage, Usage) else ():
                value = getattr(usage, name)
                if type(value) is int:
                    sums[name] = sums.get(name, 0) + value
        return cls(**sums) if sums else None


class ScoreConfidence(msgspec.Struct, forbid_unknown_fields=True):
    """The ``confidence`` of an itemized or rubric record (``--confidence``, built by
    grader.judge.confidence), each field written only where set; the ranges are rescore's to
    check (``confidence_problem``)."""

    # the expectation of the exact score; the probability of the reported rounded score; the
    # shortest range of rounded scores holding 90% of it; P(rounded score) by score
    score_expected: float | None | UnsetType = UNSET
    p_score: float | None | UnsetType = UNSET
    interval: list[int] | None | UnsetType = UNSET
    distribution: dict[str, float] | None | UnsetType = UNSET
    items_read: int | UnsetType = UNSET  # the choices read
    probabilities: dict[str, Any] | None | UnsetType = UNSET  # what was read: rescore recomputes


class Sample(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a record keeps of one of its samples (``--samples``): its class's
    :attr:`Record.sample_fields`, each written only where set, in that order; one subclass per
    kind."""

    def get(self, name: str, default: Any = None) -> Any:
        """The field ``name`` (``default`` where not set), read as another tool's plain sample."""
        value = getattr(self, name, UNSET) if name in self.__struct_fields__ else UNSET
        return default if value is UNSET else value

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name, UNSET) is not UNSET


class SeedSample(Sample, kw_only=True, forbid_unknown_fields=True):
    """A sample of a seed-shaped record (seed, itemized, rubric): its score and the judge's
    own, its counts, its answer, and the itemized and rubric formats' audit lists."""

    score: int | float | None | UnsetType = UNSET
    status: str | None | UnsetType = UNSET
    score_exact: float | int | None | UnsetType = UNSET
    model_score: int | float | None | UnsetType = UNSET
    counts: RecordCounts | None | UnsetType = UNSET
    raw_output: str | None | UnsetType = UNSET
    finish_reason: str | None | UnsetType = UNSET
    error: str | None | UnsetType = UNSET
    usage: Usage | None | UnsetType = UNSET
    evidence_not_found: list[MissingEvidence] | UnsetType = UNSET  # itemized, rubric
    count_mismatch: list[str] | UnsetType = UNSET  # itemized


class ScoreModelSample(Sample, kw_only=True, forbid_unknown_fields=True):
    """A sample of a score_model grader's record."""

    result: float | int | None | UnsetType = UNSET
    status: str | None | UnsetType = UNSET
    passed: bool | None | UnsetType = UNSET
    raw_output: str | None | UnsetType = UNSET
    finish_reason: str | None | UnsetType = UNSET
    error: str | None | UnsetType = UNSET
    usage: Usage | None | UnsetType = UNSET


class PairwiseSample(Sample, kw_only=True, forbid_unknown_fields=True):
    """A sample of a pairwise record."""

    winner: str | None | UnsetType = UNSET
    status: str | None | UnsetType = UNSET
    raw_output: str | None | UnsetType = UNSET
    finish_reason: str | None | UnsetType = UNSET
    error: str | None | UnsetType = UNSET
    usage: Usage | None | UnsetType = UNSET


class TextCut(msgspec.Struct, forbid_unknown_fields=True):
    """What the token budget cut of one text field: its length in characters, how many kept."""

    chars: int
    kept: int


# forbid_unknown_fields: a line with a field no class declares goes through parse_record
class Record(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A result record: one JSON object per input row, built by the judges or read by
    :func:`parse_record`, written by :meth:`to_json`; one subclass per kind.

    A field typed ``... | UnsetType`` is left out of the JSON while ``UNSET``; the others are
    always written (null while None). ``extra`` holds the fields no class declares (another
    tool's columns), which a read -> write round trip keeps.
    """

    kind: ClassVar[str | None] = None  # what wrote it: a judge's answer format, or score_model
    own_fields: ClassVar[tuple[str, ...]] = ()  # the judge's own, between status and raw_output
    after_fields: ClassVar[tuple[str, ...]] = ()  # the kind's fields after truncation
    value_field: ClassVar[str | None] = None  # the field samples are aggregated over
    # the fields that hold a Struct (usage, counts), written as its JSON object (to_builtins)
    nested: ClassVar[tuple[str, ...]] = ("truncation", "usage", "samples")
    sample_fields: ClassVar[tuple[str, ...]] = ("status", *_SAMPLE_BODY)  # kept of each sample
    # the class of what it keeps of each sample, with its sample_fields (None: a plain object)
    sample_type: ClassVar[type[Sample] | None] = None
    # every field but extra and order, in the order written; the same as a set (_place_fields)
    field_order: ClassVar[tuple[str, ...]]
    known: ClassVar[frozenset[str]]
    # the fields a constructor takes: known but the tag (``format``), plus extra and order
    settable: ClassVar[frozenset[str]]

    id: Any  # the row's id as the dataset gave it: any JSON value
    # a :class:`Status` as grader writes it; another tool's record may hold another string,
    # or null: rescore refuses those by name, the summary counts them
    status: str | None = None
    raw_output: str | None = None
    finish_reason: str | None = None
    error: str | None = None
    # the text fields the token budget cut, by name (None: nothing cut)
    truncation: dict[str, TextCut] | None = None
    usage: Usage | None | UnsetType = UNSET  # the answer's token counts
    reasoning: Any = UNSET  # a thinking judge's thinking, kept beside the answer, never read
    # --confidence's weights (None: none could be read, confidence_error says why): each
    # kind declares its own (SeedRecord: ScoreConfidence; PairwiseRecord: an object)
    confidence: Any = UNSET
    confidence_error: Any = UNSET  # str or None beside confidence; carried through unread
    aggregate: str | UnsetType = UNSET
    spread: dict[str, Any] | UnsetType = UNSET
    # what it kept of each sample: each kind declares its Sample (another tool's: as read)
    samples: Any = UNSET
    key: str | UnsetType = UNSET  # the resume key (results.ResultsLog)
    extra: JSONFields = {}  # fields of no class, in the order read
    # a read record's fields in the file's order, kept when written back (None: a record grader
    # built, written in field_order); only built records are changed in place
    order: tuple[str, ...] | None = None

    @classmethod
    def build(cls: type[_R], **fields: Any) -> _R:
        """A record of this class from its JSON fields by name: the builders' one way in, so a
        caller's further fields (a column to group by) are kept, in ``extra``."""
        if fields.keys() <= cls.settable:
            return cls(**fields)
        fields.pop("format", None)  # a tagged class's tag: its class says it
        extra = {name: fields.pop(name) for name in list(fields) if name not in cls.known}
        return cls(**fields, extra=extra)

    @property
    def value(self) -> int | float | None:
        """The number this record grades its row with (its :attr:`value_field`), or None."""
        return None

    def to_dict(self) -> JSONFields:
        """The record as its JSON object, fields in the order they are written."""
        if self.order is not None:
            known, extra = self.known, self.extra
            fields = {name: getattr(self, name) if name in known else extra[name]
                      for name in self.order}
        else:
            fields = {name: value for name in self.field_order
                      if (value := getattr(self, name)) is not UNSET}
            if self.extra:
                fields.update(self.extra)
        for name in self.nested:
            value = fields.get(name)
            if value is not None:  # a Struct, or a dict of them (truncation)
                fields[name] = msgspec.to_builtins(value)
        return fields

    def to_json(self) -> str:
        """The record's JSON line (without the newline): ``json.dumps`` of :meth:`to_dict`."""
        return dumps_record(self.to_dict())

    def field(self, name: str) -> Any:
        """The JSON field ``name`` (None where the record has none): for a column grader does
        not know (agree's --human, report's --group-by) or another tool's record's fields."""
        if name in self.known:
            value = getattr(self, name)
            return None if value is UNSET else value
        return self.extra.get(name)

    def marked(self) -> Marked | None:
        """The items the judge marked on this row (its ``items``); None where it has none (a
        record of another kind, or a row the judge did not answer)."""
        return None

    def listed_items(self) -> dict[str, list[str]] | None:
        """The item lists the row's items were marked against, by category, from the record's
        :data:`LISTED_ITEMS_FIELD`; None where it holds none (the itemized judge's own lists)."""
        lists = self.field(LISTED_ITEMS_FIELD)
        if not isinstance(lists, dict) or not lists:
            return None
        return {c: [str(t) for t in lists.get(c) or []] for c in ITEM_CATEGORIES}

    def has(self, name: str) -> bool:
        """Whether the record holds the JSON field ``name`` (a read one: whether its file did)."""
        if self.order is not None:
            return name in self.order
        if name in self.known:
            return getattr(self, name) is not UNSET
        return name in self.extra

    def with_fields_of(self, fresh: _R) -> _R:
        """This record with ``fresh``'s fields written over it, of ``fresh``'s kind, in this
        record's order (rescore's: the resume key and another tool's columns stay)."""
        return _build(type(fresh), self.to_dict() | fresh.to_dict())


def _place_fields(cls: type[Record]) -> None:
    """``field_order`` and ``known`` of a record class, checked against its fields."""
    cls.field_order = (*_HEAD, *cls.own_fields, *_BODY, *cls.after_fields, *_TAIL)
    cls.known = frozenset(cls.field_order)
    cls.settable = frozenset(cls.__struct_fields__)
    declared = set(cls.__struct_fields__) - {"extra", "order"}
    tag = cls.__struct_config__.tag_field
    if tag is not None:  # msgspec's tag, a class attribute, written as a field
        declared.add(tag)
    if declared != cls.known or len(cls.field_order) != len(declared):
        raise TypeError(f"{cls.__name__}: field_order {cls.field_order} is not its fields {declared}")
    missing = set(cls.sample_fields) - cls.known
    if missing:
        raise TypeError(f"{cls.__name__}: sample_fields names no field {sorted(missing)}")
    kept = cls.sample_type.__struct_fields__ if cls.sample_type else cls.sample_fields
    if [name for name in kept if name in cls.sample_fields] != list(cls.sample_fields):
        raise TypeError(f"{cls.__name__}: {cls.sample_type} does not hold {cls.sample_fields} in order")


class SeedRecord(Record, kw_only=True, tag_field="format", tag="seed"):
    """A seed judge's record: the seed's score, exactly recomputed, and the judge's own
    arithmetic beside it. ``format`` (the answer format asked for) is msgspec's tag of the
    tagged union :func:`parse_record` reads into, a class attribute written like a field."""

    kind = "seed"
    own_fields = ("score", "score_exact", "grade", "model_score", "checklist", "counts", "formula")
    after_fields: ClassVar[tuple[str, ...]] = ("format",)
    value_field = "score"
    nested = (*Record.nested, "counts", "confidence")
    sample_fields: ClassVar[tuple[str, ...]] = (
        "score", "status", "score_exact", "model_score", "counts", *_SAMPLE_BODY)
    sample_type: ClassVar[type[Sample] | None] = SeedSample

    # Any JSON number where read, kept as read (an int stays an int, a float a float: written
    # back the same); grader writes an int 0-5. Rescore names a score that is no such int.
    score: int | float | None = None
    score_exact: float | int | None = None
    grade: dict[str, Any] | None = None
    model_score: int | float | None = None
    checklist: Any = None
    counts: RecordCounts | None = None
    formula: str | None = None
    confidence: ScoreConfidence | None | UnsetType = UNSET
    samples: list[SeedSample] | UnsetType = UNSET
    format: ClassVar[str] = "seed"  # the tag: the answer format the judge was asked for

    @property
    def value(self) -> int | float | None:
        return self.score

    def marked(self) -> Marked | None:
        items = getattr(self, "items", None)  # itemized and rubric records'
        return items if isinstance(items, MarkedItems) else None


class ItemizedRecord(SeedRecord, kw_only=True, tag="itemized"):
    """``format`` ``itemized``: the seed's fields, then the judge's items and audit lists (a
    row the judge never answered has none of them)."""

    kind = "itemized"
    # items a Struct, evidence_not_found a list of them: written as their JSON (to_builtins)
    nested = (*SeedRecord.nested, "items", "evidence_not_found")
    # how the judge's answer marks each item: a ``present`` in each item's object (False), or
    # one string of letters, one per item of a list given before the answer (True)
    labels_as_letters: ClassVar[bool] = False
    after_fields = ("format", "items", "judge_lines", "count_mismatch", "evidence_not_found")
    sample_fields = (*SeedRecord.sample_fields, "evidence_not_found", "count_mismatch")

    format: ClassVar[str] = "itemized"
    items: MarkedItems[Finding] | None | UnsetType = UNSET
    judge_lines: list[str] | None | UnsetType = UNSET
    count_mismatch: list[str] | UnsetType = UNSET
    evidence_not_found: list[MissingEvidence] | UnsetType = UNSET


class RubricRecord(SeedRecord, kw_only=True, tag="rubric"):
    """``format`` ``rubric``: the seed's fields, then each rubric item with its label and the
    row's rubric (a row the judge never answered has no items)."""

    kind = "rubric"
    nested = (*SeedRecord.nested, "items", "evidence_not_found")
    labels_as_letters: ClassVar[bool] = True  # the check pass's ``"l":"yny"``
    after_fields = ("format", "items", "rubric", "evidence_not_found")
    sample_fields = (*SeedRecord.sample_fields, "evidence_not_found")

    format: ClassVar[str] = "rubric"
    items: MarkedItems[LabelledItem] | None | UnsetType = UNSET
    rubric: dict[str, Any] | UnsetType = UNSET
    evidence_not_found: list[MissingEvidence] | UnsetType = UNSET


Marked = MarkedItems[Finding] | MarkedItems[LabelledItem]
"""A record's ``items``, of either kind of item."""
MarkedRecord = ItemizedRecord | RubricRecord
"""A record whose judge marked items (its ``items``), and scored their counts."""


class ScoreModelRecord(Record, kw_only=True):
    """An OpenAI ``score_model`` grader's record: ``result`` and ``passed``, not a score."""

    kind = "score_model"
    own_fields = ("result", "passed")
    value_field = "result"
    sample_fields = ("result", "status", "passed", *_SAMPLE_BODY)
    sample_type = ScoreModelSample

    result: float | int | None = None  # as read: an int stays an int
    passed: bool | None = None
    samples: list[ScoreModelSample] | UnsetType = UNSET

    @property
    def value(self) -> int | float | None:
        return self.result


# What each verdict of the pairwise format is worth to answer A: a win, half a win (FastChat's
# win rate counts a tie as half), a loss.
PAIRWISE_POINTS = {"A": 1.0, "tie": 0.5, "B": 0.0}


class PairwiseRecord(Record, kw_only=True, tag_field="format", tag="pairwise"):
    """``format`` ``pairwise``: two answers to one row judged side by side, in both orders.

    ``verdicts`` are the two games' verdicts in the row's own labels (``A`` is ``output_a``):
    A shown first, then B. ``winner`` is their reconciliation as FastChat's llm_judge makes it
    (the verdict both agree on, else a tie); ``consistent`` says whether they agreed; ``games``
    keeps each game as the judge answered it. A row one of whose games could not be judged has
    that game's status and no winner. While one game is read (never written), a record holds
    that game alone: ``winner`` is the letter the judge wrote, in the game's own places.
    """

    kind = "pairwise"
    own_fields = ("winner", "verdicts", "consistent", "model_a", "model_b")
    after_fields = ("format", "games")
    value_field = "winner"
    sample_fields = ("winner", *Record.sample_fields)
    sample_type = PairwiseSample

    winner: str | None = None
    verdicts: list[Any] | None = None
    consistent: bool | None = None
    model_a: str | None = None
    model_b: str | None = None
    format: ClassVar[str] = "pairwise"  # the tag, as SeedRecord's
    games: list[dict[str, Any]] | UnsetType = UNSET
    # p (the mean of the games' P(A), P(B), P(tie)), p_winner and each game's, in the row's
    # labels; while one game is read, that game's P(A), P(B), P(tie)
    confidence: dict[str, Any] | None | UnsetType = UNSET
    samples: list[PairwiseSample] | UnsetType = UNSET

    @property
    def value(self) -> int | float | None:
        """A's points: 1 for a win, 0.5 for a tie, 0 for a loss; None without a winner."""
        return PAIRWISE_POINTS.get(self.winner) if isinstance(self.winner, str) else None


class ForeignRecord(Record, kw_only=True):
    """A record of no kind grader knows, read from a file (another tool's, or grader's from
    before answer formats): its other fields are in ``extra``, read by name (:meth:`Record.field`);
    its ``usage`` and ``truncation`` are carried through as the file holds them."""

    truncation: Any = None
    usage: Any = UNSET
    samples: list[JSONFields] | UnsetType = UNSET  # read by name (Sample.get reads alike)


class DraftRecord(Record, kw_only=True):
    """The rubric pass's answer for one reference, as the run hands it back to be drafted into
    a rubric (grader.run.rubric_pass); never written to a results file."""

    kind = "rubric_draft"

    samples: list[dict[str, Any]] | UnsetType = UNSET  # each as its JSON object


for _kind in (Record, SeedRecord, ItemizedRecord, RubricRecord, ScoreModelRecord, PairwiseRecord,
              ForeignRecord, DraftRecord):
    _place_fields(_kind)

SEED_KINDS: dict[str, type[SeedRecord]] = {
    str(cls.kind): cls for cls in (SeedRecord, ItemizedRecord, RubricRecord)}
"""The record class of each answer format (``schema.ANSWER_FORMATS``)."""


# The tagged union of the record classes that name their kind in ``format``; a record of another
# format, or none, is a score_model grader's where it has a ``result``, else a ForeignRecord.
_TAGGED: Any = Union[tuple(SEED_KINDS.values()) + (PairwiseRecord,)]  # noqa: UP007
_TAGS = frozenset((*SEED_KINDS, "pairwise"))
_READ_KINDS: tuple[type[Record], ...] = (*SEED_KINDS.values(), ScoreModelRecord, PairwiseRecord,
                                         ForeignRecord)
_BY_FORMAT: dict[str, type[Record]] = {**SEED_KINDS, "pairwise": PairwiseRecord}


def _build(cls: type[_R], obj: JSONFields) -> _R:
    """A record of class ``cls`` holding the JSON object ``obj``, in its order (rescore's
    :meth:`Record.with_fields_of`; a file's records come through :func:`parse_record`)."""
    settable, known = cls.settable, cls.known
    if obj.keys() <= settable:
        return cls(**obj, order=tuple(obj))
    fields, extra = {}, {}
    for name, value in obj.items():
        if name in settable:
            fields[name] = value
        elif name not in known:  # known but not settable: the class's tag
            extra[name] = value
    return cls(**fields, extra=extra, order=tuple(obj))


_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw]).decode
_DECODE_TAGGED = msgspec.json.Decoder(_TAGGED).decode
_DECODE_SCORE_MODEL = msgspec.json.Decoder(ScoreModelRecord).decode
_DECODE_FOREIGN = msgspec.json.Decoder(ForeignRecord).decode
# As grader.io.jsonlines.fast_loads: a line that may nest this deep is json's to decide.
_SHALLOW = 256


def decode_record(line: bytes) -> Record | None:
    """The record of a results line decoded by msgspec straight into its class, as
    :func:`parse_record` reads it, in about half the time; None where msgspec cannot decide (a
    line it refuses, or with fields no class declares): the caller then decodes it with ``json``
    and reads it through :func:`parse_record`, which names the reason or keeps those fields.
    """
    if len(line) >= 2 * _SHALLOW and line.count(b"[") + line.count(b"{") >= _SHALLOW:
        return None
    try:
        keys = _KEYS(line)  # the fields in the line's order, their values not decoded
        if "id" not in keys:
            return None
        if "result" in keys:
            record: Record = _DECODE_SCORE_MODEL(line)
        elif "format" in keys:
            record = _DECODE_TAGGED(line)
        else:
            record = _DECODE_FOREIGN(line)
    except Exception:  # msgspec.DecodeError, ValidationError, UnicodeDecodeError, RecursionError
        return None
    record.order = tuple(keys)  # every field known: msgspec refuses the others
    return record


def parse_record(obj: Any, where: tuple[str | Path, int]) -> Record:
    """A record read from a file (``where``: its path and line), checked: a JSON object with
    an ``id`` whose fields are of the JSON types its kind's class declares (a status only a
    string), kept in the file's order. The one way records enter from files. A record whose
    ``format`` names a class is read into it; one with a ``result`` is a score_model grader's;
    any other a :class:`ForeignRecord`.

    Raises:
        grader.records.ResultsError: ``PATH:LINE: reason``.
    """
    if type(obj) is not dict or "id" not in obj:
        raise ResultsError.at(*where, "expected a JSON object with an 'id'")
    target: Any
    cls: type[Record]
    if "result" in obj:
        cls = target = ScoreModelRecord
    else:
        answer_format = obj.get("format")
        if type(answer_format) is str and answer_format in _TAGS:
            cls, target = _BY_FORMAT[answer_format], _TAGGED  # msgspec picks the class by tag
        else:
            cls = target = ForeignRecord
    order = tuple(obj)
    extra = None
    if not obj.keys() <= cls.known:  # another tool's columns, kept in extra
        known = cls.known
        extra = {name: value for name, value in obj.items() if name not in known}
        obj = {name: value for name, value in obj.items() if name in known}
    try:
        record: Record = msgspec.convert(obj, target)
    except msgspec.ValidationError as exc:
        raise ResultsError.at(*where, _reason(exc)) from None
    record.order = order
    if extra is not None:
        record.extra = extra
    return record


# msgspec's names of JSON's types in grader's words; its refusal of a field's type (or of an
# entry of a list): "Expected `int | float | null`, got `str` - at `$.score`" ("`$.samples[1]`")
_WORDS = {"str": "a string", "int": "a number", "float": "a number", "bool": "true or false",
          "null": "null", "object": "an object", "array": "a list"}
_MISMATCH = re.compile(r"Expected `([a-z| ]+)`, got `([a-z]+)` - at `\$\.(\w+)(\[\d+\])?`")


def _object_lists(kinds: Iterable[type[Record]]) -> frozenset[str]:
    """The fields of ``kinds`` that hold a list of objects (Structs or dicts)."""
    inspect, fields = msgspec.inspect, set()
    for kind in kinds:
        info = inspect.type_info(kind)
        for field in info.fields if isinstance(info, inspect.StructType) else ():
            union = field.type
            for part in union.types if isinstance(union, inspect.UnionType) else (union,):
                if isinstance(part, inspect.ListType) and isinstance(
                        part.item_type, (inspect.StructType, inspect.DictType)):
                    fields.add(field.encode_name)
    return frozenset(fields)


_OBJECT_LISTS = _object_lists(_READ_KINDS)


def _reason(exc: msgspec.ValidationError) -> str:
    """Why msgspec refused a record, in grader's words where a field (or an entry of a list of
    objects) is of another JSON type (``score must be a number or null, not a string``);
    else msgspec's own message, after the path of the value it names."""
    found = _MISMATCH.fullmatch(str(exc))
    if found is not None and set(found[1].split(" | ")) | {found[2]} <= _WORDS.keys():
        expected, got, field, entry = found.groups()
        list_words = "a list of objects" if field in _OBJECT_LISTS else "a list"
        words = dict.fromkeys(list_words if name == "array" else _WORDS[name]
                              for name in expected.split(" | "))
        if entry is None and _WORDS[got] not in words:
            return f"{field} must be {' or '.join(words)}, not {_WORDS[got]}"
        if entry is not None and expected == "object" and field in _OBJECT_LISTS:
            return f"{field} must be {list_words}, not a list holding {_WORDS[got]}"
    message, _, at = str(exc).partition(" - at `$.")
    return f"{at.rstrip('`')}: {message}" if at else message
