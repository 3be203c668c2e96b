"""What a result record is: its kinds as types, the one parser every reader gets records
through (:func:`parse_record`), and the one encoder (:func:`to_json`).

Below the judges (grader.judge.records builds records; grader.io.results reads and writes them),
so the results file's reader needs nothing from the judge layer.
"""

from __future__ import annotations

from pathlib import Path
from types import UnionType
from typing import Any, NoReturn, TypedDict, get_args, get_origin, get_type_hints

from grader.errors import GraderError
from grader.io.jsonlines import dumps_record


class ResultsError(GraderError, ValueError):
    """A results file that cannot be read: ``PATH:LINE: reason``."""

    def __init__(
        self, message: str, *, path: Any = None, line: int | None = None, reason: str | None = None
    ):
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


class RecordBase(TypedDict, total=False):
    """The fields every record has, in the order they are written; the judge's own fields
    (below) come between ``status`` and ``raw_output``, and ``usage``, ``key`` and the
    aggregate's fields after ``truncation`` (and ``format``). Optional keys are the ones a
    record read back from another tool's file may lack: only ``id`` is always there."""

    id: Any  # the row's id as the dataset gave it: any JSON value
    # a :class:`Status` as grader writes it; another tool's record may hold another string,
    # or null: rescore refuses those by name, the summary counts them
    status: str | None
    raw_output: str | None
    finish_reason: str | None
    error: str | None
    truncation: dict[str, Any] | None
    # {prompt_tokens, output_tokens} as grader writes it; carried through as it is, never read
    usage: Any
    key: str  # the resume key (results.ResultsLog)
    aggregate: str
    spread: dict[str, Any]
    samples: list[dict[str, Any]]
    confidence: dict[str, Any] | None


class SeedRecord(RecordBase, total=False):
    """A seed judge's record (``format`` ``seed``); ``SEED_RECORD_FIELDS`` in order."""

    score: int | None
    score_exact: float | None
    grade: dict[str, Any] | None
    model_score: int | None
    checklist: Any
    counts: dict[str, Any] | None
    formula: str | None
    format: str


class ItemizedRecord(SeedRecord, total=False):
    """``format`` ``itemized``: the seed's fields, then the judge's items and audit lists."""

    items: dict[str, list[dict[str, Any]]] | None
    judge_lines: list[str] | None
    count_mismatch: list[str]
    evidence_not_found: list[dict[str, Any]]


class RubricRecord(SeedRecord, total=False):
    """``format`` ``rubric``: the seed's fields, then each rubric item with its label."""

    items: dict[str, list[dict[str, Any]]] | None
    rubric: dict[str, Any]
    evidence_not_found: list[dict[str, Any]]


class ScoreModelRecord(RecordBase, total=False):
    """An OpenAI ``score_model`` grader's record: ``result`` and ``passed``, not a score."""

    result: float | None
    passed: bool | None


TypedRecord = SeedRecord | ItemizedRecord | RubricRecord | ScoreModelRecord
"""What a record is, for the type checker: one ``TypedDict`` per kind (:func:`record_kind`)."""

Record = dict[str, Any]
"""A result record at run time: one JSON object per input row, built by :func:`new_record` and
read back by :func:`parse_record`. The run, rescore and analysis code index it as a dict (and
add fields: ``key``, ``usage``, the aggregate's); :data:`TypedRecord` names its fields."""

def record_kind(record: Record) -> str | None:
    """What wrote ``record``, read back from a results file: ``score_model`` (an OpenAI
    score_model grader's record, the one with a ``result``), else the seed answer format it
    names (``seed``, ``itemized``, ``rubric``; None: it names none, as records written before
    formats existed, and other tools'). The one place a reader learns what a record is."""
    if "result" in record:
        return "score_model"
    answer_format = record.get("format")
    return answer_format if isinstance(answer_format, str) else None


# What each JSON type is in Python: a field whose annotation names several takes any of them.
# An ``int`` or ``float`` field takes any JSON number (not a bool): the judge's range checks
# (NaN, 25 on a 0-5 scale) are rescore's, which names the value (judges.Judge.unusable).
# Exact types, as a JSON decoder makes them: a bool is not an int here.
_JSON_TYPES: dict[Any, tuple[tuple[type, ...], str]] = {
    str: ((str,), "a string"),
    int: ((int, float), "a number"),
    float: ((int, float), "a number"),
    bool: ((bool,), "true or false"),
    dict: ((dict,), "an object"),
    list: ((list,), "a list"),
    type(None): ((type(None),), "null"),
}

_Check = tuple[frozenset[type], bool, str]


def _field_checks(kind: type) -> dict[str, _Check]:
    """``field -> (exact Python types, whether it is a list of objects, words)`` from a record
    type's annotations; ``Any`` fields are not checked."""
    checks = {}
    for field, hint in get_type_hints(kind).items():
        if hint is Any:
            continue
        types: tuple[type, ...] = ()
        words = []
        of_objects = False
        for part in get_args(hint) if get_origin(hint) is UnionType else (hint,):
            python, word = _JSON_TYPES[get_origin(part) or part]
            if get_origin(part) is list and get_origin(get_args(part)[0]) is dict:
                of_objects, word = True, "a list of objects"
            types += python
            words.append(word)
        checks[field] = (frozenset(types), of_objects, " or ".join(words))
    return checks


# The checks of each kind record_kind names; None (another tool's, or from before formats,
# or a format rescore refuses by name) checks the fields every record has.
_CHECKS = {
    None: _field_checks(RecordBase),
    "seed": _field_checks(SeedRecord),
    "itemized": _field_checks(ItemizedRecord),
    "rubric": _field_checks(RubricRecord),
    "score_model": _field_checks(ScoreModelRecord),
}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    return {str: "a string", int: "a number", float: "a number", dict: "an object",
            list: "a list"}.get(type(value), type(value).__name__)


def _refuse(where: tuple[str | Path, int], reason: str) -> NoReturn:

    raise ResultsError.at(*where, reason)


def parse_record(obj: Any, where: tuple[str | Path, int]) -> Record:
    """A record read from a file (``where``: its path and line), checked: a JSON object with
    an ``id`` whose fields, where present, are of their :data:`TypedRecord` kind's JSON
    types. The one way records enter from files (:func:`grader.io.results.read_records`);
    the object comes back as it is, so a record read back equals the one written.

    A status is only checked to be a string: the summary, report and compare count another
    tool's statuses, and rescore refuses an unknown one by name (``Judge.unusable``).

    Raises:
        grader.io.results.ResultsError: ``PATH:LINE: reason``.
    """
    if not isinstance(obj, dict) or "id" not in obj:
        _refuse(where, "expected a JSON object with an 'id'")
    checks = _CHECKS.get(record_kind(obj), _CHECKS[None])
    # one set lookup a field: every record of a results file comes through here
    for field, value in obj.items():
        check = checks.get(field)
        if check is None:
            continue
        types, of_objects, words = check
        if type(value) not in types:
            _refuse(where, f"{field} must be {words}, not {_json_type(value)}")
        if of_objects and value:
            for entry in value:
                if type(entry) is not dict:
                    _refuse(where, f"{field} must be {words}, not a list holding {_json_type(entry)}")
    return obj


def to_json(record: Record) -> str:
    """The record's JSON line (without the newline): its fields in the order they were set,
    which :func:`new_record` makes today's order. The one record encoder of results files."""
    return dumps_record(record)


# The seed judge's own fields, in the order they are written (values: their defaults).
