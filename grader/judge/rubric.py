"""The rubric format: a reference's items written once, each answer only labelled.

Two passes of one judge. The *rubric pass* writes, once per distinct (input, reference), the
reference's facts, conclusions and key terms (:class:`RubricDraft`). grader drops exact and near
duplicates and flags items that are not grounded in the reference (:func:`make_rubric`). The
*check pass* shows the judge the numbered items and one answer and forces exactly one label per
item, ``y`` (present) or ``n`` (absent), and the organization verdict
(:func:`check_schema`); grader counts the labels and scores them with the seed's formula
(:func:`rubric_record`), exactly as the other formats.

Pure: no model, no file. The rubric file is :mod:`grader.io.rubric_file`; the pass that writes
it is :mod:`grader.run.rubric_pass`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from msgspec import UNSET, UnsetType

from grader.io.rubric_file import RubricLine, rubric_key
from grader.judge.parsing import CATEGORIES, _answer_object
from grader.judge.schema import (  # noqa: F401  (the rubric format's schemas live there)
    ABSENT,
    LABELS,
    LOOPED,
    ORGANIZATION,
    ORGANIZATIONS,
    PRESENT,
    QUOTES,
    RubricDraft,
    check_max_chars,
    check_schema,
    draft_max_chars,
    draft_schema,
)
from grader.judge.words import MOST_WORDS, WORD, content_words
from grader.records import LabelledItem, MarkedItems
from grader.status import Status

# A flag on an item that grader kept although it found few of its words in the reference.
GROUNDED_SHARE = MOST_WORDS


# ---------------------------------------------------------------- the rubric itself


def normalised(text: str) -> str:
    """Case, punctuation and runs of whitespace do not make two items different."""
    return " ".join(WORD.findall(text.casefold()))


def _near(a: set[str], b: set[str]) -> bool:
    # "Near" duplicates: the same content words, or sets that overlap by 80% or more (Jaccard);
    # "the capital is Paris" and "Paris is the capital" are one item, "Paris" and "Lyon" two.
    if not a or not b:
        return a == b
    return len(a & b) / len(a | b) >= 0.8


def grounded(item: str, reference_words: set[str]) -> bool:
    """At least half of the item's content words occur in the reference (plain text overlap)."""
    words = content_words(item)
    if not words:
        return True
    return len(words & reference_words) / len(words) >= GROUNDED_SHARE


@dataclass(frozen=True)
class Rubric:
    """One reference's items, as the rubric file holds them (``grader.io.rubric_file``).

    Frozen: a rubric is made once (:func:`make_rubric`) and then only read."""

    key: str
    facts: list[str] = field(default_factory=list)
    conclusions: list[str] = field(default_factory=list)
    terms: list[str] = field(default_factory=list)
    ungrounded: list[str] = field(default_factory=list)  # "facts[2]": kept, but flagged
    dropped: list[str] = field(default_factory=list)  # duplicates grader removed, for audit
    source: str = "model"  # model, data (the row's own columns) or file (--rubric)

    def items(self) -> list[tuple[str, str]]:
        """``(category, text)`` of every item, in the order the check pass labels them."""
        return [(c, text) for c in CATEGORIES for text in getattr(self, c)]

    def size(self) -> int:
        return len(self.facts) + len(self.conclusions) + len(self.terms)

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "facts": self.facts, "conclusions": self.conclusions,
                "terms": self.terms, "ungrounded": self.ungrounded, "dropped": self.dropped,
                "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rubric:
        return cls(**{k: data[k] for k in
                      ("key", "facts", "conclusions", "terms", "ungrounded", "dropped", "source")
                      if k in data})

    @classmethod
    def of_line(cls, line: RubricLine) -> Rubric:
        """What the judge keeps of a rubric file's line: the check prompt's source."""
        return cls(line.key, line.facts, line.conclusions, line.terms, line.ungrounded,
                   line.dropped, line.source or "model")

    def line(self, input_text: str | None, reference: str, *,
                 model: str | UnsetType = UNSET, prompt_sha256: str | UnsetType = UNSET,
                 ended_on_loop: bool | UnsetType = UNSET) -> RubricLine:
        """The rubric as a rubric file's line for ``(input_text, reference)``, with a drafted
        rubric's ``model``, ``prompt_sha256`` and ``ended_on_loop``."""
        return RubricLine(key=self.key, input=input_text, reference=reference, facts=self.facts,
                          conclusions=self.conclusions, terms=self.terms,
                          ungrounded=self.ungrounded, dropped=self.dropped, source=self.source,
                          model=model, prompt_sha256=prompt_sha256, ended_on_loop=ended_on_loop)

    def context(self, evidence: bool) -> dict[str, Any]:
        """What the check prompt shows of the rubric, beside the row's own fields: the rubric
        (as its record keeps it), its numbered items and whether quotes are asked for."""
        return {"rubric": self.as_dict(), "rubric_items": self.numbered(),
                "rubric_evidence": evidence}

    def numbered(self) -> str:
        """The items as the check prompt shows them: one numbered line each, by category."""
        names = {"facts": "Fact", "conclusions": "Conclusion", "terms": "Term"}
        return "\n".join(f"{n}. {names[c]}: {text}"
                         for n, (c, text) in enumerate(self.items(), start=1))


@dataclass(frozen=True)
class RubricFailure:
    """Why a reference has no rubric: its rubric pass failed (the rows of that reference get
    this status, the reason prefixed with ``rubric pass:``)."""

    status: Status
    reason: str


RubricEntry = Rubric | RubricFailure


class Rubrics(Mapping[str, RubricEntry]):
    """The rubric pass's result: rubric key -> the reference's :class:`Rubric`, or its
    :class:`RubricFailure`. Immutable: a later stage is built with it
    (:meth:`grader.judge.judges.RubricJudge.with_rubrics`), and what is added makes a new one
    (:meth:`merged`); nothing writes into it."""

    __slots__ = ("_entries",)
    _entries: dict[str, RubricEntry]

    def __init__(self, entries: Mapping[str, RubricEntry] | None = None) -> None:
        object.__setattr__(self, "_entries", dict(entries or {}))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Rubrics is immutable: merged() makes a new one")

    def __reduce__(self) -> tuple[Any, ...]:  # pickled into a worker with its judge
        return (Rubrics, (self._entries,))

    def __getitem__(self, key: str) -> RubricEntry:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Rubrics({len(self)} references)"

    def merged(self, more: Mapping[str, RubricEntry]) -> Rubrics:
        """A new mapping: these entries, then ``more``'s over them."""
        return Rubrics({**self._entries, **more}) if more else self

    def of(self, fields: Mapping[str, Any]) -> RubricEntry | None:
        """The rubric of a row's (input, reference), or None where the pass has none."""
        return self._entries.get(rubric_key(fields.get("input"), fields["reference"]))


# A list marker a judge writes in front of an item ("1. ", "2) ", "- "): the list is the order,
# and two items that differ only in their marker are one item.
_MARKER = re.compile(r"^(?:\(?\d{1,2}[.):]|[-*\u2022])\s+")


def make_rubric(key: str, lists: Mapping[str, Sequence[str]], reference: str,
                source: str = "model") -> Rubric:
    """Items -> a rubric: a judge's list markers cut, blank, exact and near duplicates dropped
    (within a category and across), each kept item checked for grounding in ``reference``.
    Items a person wrote (``source`` other than "model") keep their text as written."""
    reference_words = content_words(reference)
    rubric = Rubric(key, source=source)
    seen: list[tuple[str, set[str]]] = []
    for category in CATEGORIES:
        kept = getattr(rubric, category)
        for text in lists.get(category) or []:
            text = " ".join(str(text).split())
            if source == "model":
                text = _MARKER.sub("", text)
            if not text:
                continue
            norm, words = normalised(text), content_words(text)
            if any(norm == n or _near(words, w) for n, w in seen):
                rubric.dropped.append(f"{category}: {text}")
                continue
            seen.append((norm, words))
            if not grounded(text, reference_words):
                rubric.ungrounded.append(f"{category}[{len(kept)}]")
            kept.append(text)
    return rubric


# In a draft's compact JSON (no string of it holds a quote or a backslash: schema.FREE): a
# list's opening, or a closed string (a list's strings are followed by a comma or a bracket;
# the draft may end right after one).
_DRAFT_TOKEN = re.compile(r'"(' + "|".join(CATEGORIES) + r')":\[|"([^"]*)"(?=[,\]]|$)')


def _items_before_loop(text: str) -> dict[str, list[str]]:
    """The complete items of a draft the engine ended mid-way: every string closed before the
    end (the item the loop cut, and the lists after it, are absent)."""
    lists: dict[str, list[str]] = {c: [] for c in CATEGORIES}
    category = None
    for match in _DRAFT_TOKEN.finditer(text):
        if match.group(1) is not None:
            category = match.group(1)
        elif category is not None:
            lists[category].append(match.group(2))
    return lists


def _same_item(a: str, b: str) -> bool:
    a, b = (normalised(_MARKER.sub("", " ".join(t.split()))) for t in (a, b))
    return bool(a) and a == b


def _until_copied(lists: dict[str, list[str]]) -> tuple[dict[str, list[str]], bool]:
    """``lists`` up to the first item that repeats the one before it in its list, its list
    marker aside (``"4. X"`` after ``"3. X"``), and whether there was one.

    Such a copy is the engine's loop (:data:`grader.judge.schema.LOOP`) with a number that
    counts up (docs/benchmarks.md). The draft ends there, as on a loop: the copy and the lists
    after it are not read."""
    kept: dict[str, list[str]] = {c: [] for c in CATEGORIES}
    for category in CATEGORIES:
        for item in lists.get(category) or []:
            if kept[category] and _same_item(kept[category][-1], item):
                return kept, True
            kept[category].append(item)
    return kept, False


def draft_looped(text: str) -> bool:
    """Whether a draft, as far as it is written, already has an item that repeats the one
    before it (:func:`_until_copied`): an engine that can stop a row mid-way stops it there
    (the vLLM backend), and the rubric is the same as if it had run to its end."""
    return _until_copied(_items_before_loop(text))[1]


def parse_draft(text: str | None, finish_reason: str | None
                ) -> tuple[dict[str, list[str]] | tuple[Status, str], bool]:
    """The rubric pass's answer as lists of strings, or ``(status, reason)``; and whether the
    draft ended on a loop.

    A draft ended on a loop (``finish_reason`` :data:`LOOPED`) keeps the items it completed
    before the loop; its copies are then dropped as duplicates (:func:`make_rubric`). A draft
    also ends, wherever the engine stopped it, at an item that repeats the one before it, its
    list number aside (:func:`_until_copied`).
    """
    if text:  # a copy ends the draft whichever way the engine ended it (cut, or run on)
        kept, copied = _until_copied(_items_before_loop(text))
        if copied or finish_reason == LOOPED:
            return kept, True
    data = _answer_object(text, finish_reason)
    if isinstance(data, tuple):
        return data, False
    lists = {}
    for category in CATEGORIES:
        values = data.get(category, [])
        if type(values) is not list or not all(type(v) is str for v in values):
            return (Status.PARSE_ERROR, f"{category} must be a list of strings"), False
        lists[category] = values
    return _until_copied(lists)


# ---------------------------------------------------------------- the check pass's answer

@dataclass(frozen=True)
class ParsedLabels:
    status: Status | None
    error: str | None = None
    labels: list[bool] | None = None
    quotes: list[str] | None = None
    organization: str | None = None


def parse_labels(text: str | None, finish_reason: str | None, size: int) -> ParsedLabels:
    """A check-pass answer: exactly ``size`` labels and an organization verdict, or a failure."""
    data = _answer_object(text, finish_reason)
    if isinstance(data, tuple):
        return ParsedLabels(*data)
    labels = data.get(LABELS)
    if type(labels) is not str or not all(v in (PRESENT, ABSENT) for v in labels):
        return ParsedLabels(Status.PARSE_ERROR,
                            f"labels must be a string of {PRESENT!r} and {ABSENT!r}, one an item")
    if len(labels) != size:
        return ParsedLabels(Status.INVALID_COUNTS, f"{len(labels)} labels for {size} rubric items")
    quotes = data.get(QUOTES)
    if quotes is not None and (type(quotes) is not list or len(quotes) != size
                               or not all(type(q) is str for q in quotes)):
        return ParsedLabels(Status.PARSE_ERROR, f"quotes must be a list of {size} strings")
    organization = data.get(ORGANIZATION)
    if organization not in ORGANIZATIONS:
        return ParsedLabels(Status.INVALID_COUNTS,
                            f"organization must be matched or mismatched, got {organization!r}")
    return ParsedLabels(None, None, [v == PRESENT for v in labels], quotes, organization)


def labelled_items(rubric: Rubric, parsed: ParsedLabels) -> MarkedItems[LabelledItem]:
    """The rubric's items with their labels (``item``, ``present``, and ``quote`` with
    --evidence), a record's ``items`` as the itemized format's are, so counts, confidence and
    reports read both."""
    items: dict[str, list[LabelledItem]] = {c: [] for c in CATEGORIES}
    assert parsed.labels is not None
    quotes = parsed.quotes
    for index, ((category, text), present) in enumerate(zip(rubric.items(), parsed.labels, strict=True)):
        if quotes is None:
            entry = LabelledItem(item=text, present=present)
        else:
            entry = LabelledItem(item=text, present=present, quote=quotes[index] if present else "")
        items[category].append(entry)
    return MarkedItems(**items)
