"""A score with a confidence, from one pass (``grader grade --confidence``). Pure.

Under the grammar the judge's answer is a chain of forced choices. At each item's ``present``
value the next token can only begin ``true`` or ``false``, and at ``organization`` only
``matched`` or ``mismatched``: the backend's top-k log-probabilities at that token give
P(present) for every item and P(organization = matched). The itemized format's score is a
function of those choices alone, so it becomes a random variable over the items, and its exact
distribution follows: each category's matched count is Poisson-binomial (a small dynamic
program over its items), the organization is a Bernoulli, and every combination of counts is
scored by :func:`grader.judge.scoring.compute_score`, exactly.

The probabilities are floats (they come from the model's floats); the scores they weigh are the
exact rationals of the seed's formula, rounded half up. A row whose probabilities cannot be read
(the tokens do not spell the answer, a choice has no allowed token among the top-k) has no
confidence and says why: never a guess.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any, TypedDict, TypeVar

import msgspec
from msgspec import UNSET

from grader.judge.parsing import CATEGORIES
from grader.judge.schema import ABSENT, LABELS, ORGANIZATION, PRESENT
from grader.judge.scoring import Counts, compute_score
from grader.records import Finding, LabelledItem, Marked, MarkedRecord, ScoreConfidence

# Top-k log-probabilities asked of the backend per output token (--confidence). Under the
# grammar a boolean position has two allowed tokens or a few (``t``, ``true``, ``tr`` ...): five
# hold them.
TOP_K = 5
# The interval holds at least this much of the rounded score's probability.
INTERVAL_MASS = 0.9
_SLACK = 1e-9  # float sums of probabilities that should be 1 may be 1 - 1e-16

# Keys as the grammar writes them (compact separators): a string value cannot hold `"`
# (schema.FREE), so `"present":` is always a key, never text inside a quote.
_CATEGORY_KEY = re.compile(r'"(facts|conclusions|terms)":')
_PRESENT_KEY = re.compile(r'"present":')
_ORGANIZATION_KEY = re.compile(r'"organization":"')

# The letter at which each choice's alternatives part, and what each letter means.
_PRESENT_LETTERS = {"t": True, "f": False}
_ORGANIZATION_LETTERS = {"a": "matched", "i": "mismatched"}  # m-a-tched / m-i-smatched
_V = TypeVar("_V")


class Unreadable(ValueError):
    """The probabilities of a choice cannot be read from the tokens: the message says why."""


@dataclass(frozen=True)
class ChoiceProbabilities:
    """P(present) per item of each category, and P(organization = matched)."""

    present: dict[str, list[float]]
    organization: float

    def as_dict(self) -> dict[str, list[float] | float]:
        return {**{c: list(self.present[c]) for c in CATEGORIES}, "organization": self.organization}

    @classmethod
    def from_dict(cls, data: object) -> ChoiceProbabilities:
        """What :meth:`as_dict` wrote; raises Unreadable for anything that is not one."""
        problem = probabilities_problem(data)
        if problem:
            raise Unreadable(problem)
        assert isinstance(data, dict)  # probabilities_problem checked it
        return cls({c: [float(p) for p in data[c]] for c in CATEGORIES}, float(data["organization"]))


def _probability(value: Any) -> bool:
    return type(value) in (int, float) and 0 <= value <= 1  # NaN compares False


def probabilities_problem(data: Any) -> str | None:
    """Why ``data`` is not the ``probabilities`` a confidence keeps, or None."""
    if not isinstance(data, dict):
        return "the kept probabilities must be an object"
    for category in CATEGORIES:
        values = data.get(category)
        if not isinstance(values, list) or not all(_probability(p) for p in values):
            return f"the kept {category} probabilities must be a list of numbers from 0 to 1"
    if not _probability(data.get("organization")):
        return "the kept organization probability must be a number from 0 to 1"
    return None


def confidence_problem(value: Any) -> str | None:
    """Why ``value`` is not a record's ``confidence`` (null, or what :func:`confidence`
    writes), or None: a hand-edited one must not carry a probability of 25 into a summary."""
    if value is None:
        return None
    if isinstance(value, ScoreConfidence):  # read by its type; its ranges are checked here
        value = msgspec.to_builtins(value)
    if not isinstance(value, dict):
        return "confidence must be an object or null"
    for name, test, complaint in _CONFIDENCE_CHECKS:
        if value.get(name) is not None and not test(value[name]):
            return complaint.format(value[name])
    kept = value.get("probabilities")
    problem = probabilities_problem(kept) if kept is not None else None
    return f"confidence: {problem}" if problem else None


def _interval(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 2
            and all(type(v) is int and 0 <= v <= 5 for v in value) and value[0] <= value[1])


# A confidence's fields that may be null: the test a value passes, and the complaint about it.
_CONFIDENCE_CHECKS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("score_expected", lambda v: type(v) in (int, float) and 0 <= v <= 5,
     "confidence score_expected {!r}: expected a number from 0 to 5"),
    ("p_score", _probability, "confidence p_score {!r}: expected a probability from 0 to 1"),
    ("distribution", lambda v: isinstance(v, dict) and all(_probability(p) for p in v.values()),
     "confidence distribution: expected an object of probabilities from 0 to 1"),
    ("interval", _interval, "confidence interval {!r}: expected [lo, hi] with 0 <= lo <= hi <= 5"),
)


def read_choices(answer: str, tokens: Sequence[str], top_logprobs: Sequence[dict[str, float]],
                 items: Marked, organization: str) -> ChoiceProbabilities:
    """P(present) of every item and P(matched) of the organization, from the answer's tokens.

    Args:
        answer: the judge's answer (the record's raw_output).
        tokens: the text of each output token, in order; joined they spell the answer, then
            perhaps a stop token. A token that splits a multi-byte character may read as
            U+FFFD, so only their ASCII characters are compared: the keys and values read
            here are ASCII, and a string value cannot hold a key (schema.FREE excludes `"`).
        top_logprobs: per output token, token text -> log-probability of the top-k at that step
            (the sampled token among them or not).
        items: the parsed answer's items (``parse_itemized``), to check the tokens against.
        organization: the parsed answer's organization.

    The choice is read at the token holding its deciding letter (``t``/``f`` of the value,
    the second letter of ``matched``/``mismatched``): alternatives that share that token's text
    up to the letter and go on past it are counted by their letter, alternatives that stop
    before it are left out, and the two masses are renormalised. So pre- or post-grammar-mask
    log-probabilities give the same answer wherever the grammar allows only the two values.

    Raises :class:`Unreadable` when the tokens do not match the answer or a choice has no mass.
    """
    spelled = _spelled(answer, tokens, top_logprobs)
    categories = [(m.start(), m.group(1)) for m in _CATEGORY_KEY.finditer(spelled.text)]
    marked: dict[str, Sequence[Finding | LabelledItem]] = dict(items.by_category())
    found: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    for match in _PRESENT_KEY.finditer(spelled.text):
        owner = [name for at, name in categories if at < match.start()]
        if not owner:
            raise Unreadable("a 'present' key before any category")
        category = owner[-1]
        index = len(found[category])
        if index >= len(marked[category]):
            raise Unreadable(f"the tokens hold more {category} than the answer")
        p, sampled = spelled.choice(match.end(), _PRESENT_LETTERS)
        if sampled != marked[category][index].present:
            raise Unreadable(f"{category} {index}: the tokens say {sampled}, the answer does not")
        found[category].append(p)
    for category in CATEGORIES:
        if len(found[category]) != len(marked[category]):
            raise Unreadable(f"{category}: {len(found[category])} 'present' values in the tokens, "
                             f"{len(marked[category])} in the answer")
    return ChoiceProbabilities(found, spelled.organization(_ORGANIZATION_KEY, organization))


_LABEL_LETTERS = {"y": True, "n": False}


def read_label_choices(answer: str, tokens: Sequence[str],
                       top_logprobs: Sequence[dict[str, float]], items: Marked,
                       organization: str) -> ChoiceProbabilities:
    """:func:`read_choices` for an answer that writes its labels as one string of letters
    (the check pass of items listed before the answer: ``"l":"yny"``): P(``y``) at each
    label, in the order of the items (facts, conclusions, terms), and P(matched)."""
    spelled = _spelled(answer, tokens, top_logprobs)
    flat = [(c, e.present) for c, entries in items.by_category() for e in entries]
    positions = label_positions(spelled.text)
    if len(positions) != len(flat):
        raise Unreadable(f"{len(positions)} labels in the tokens, {len(flat)} in the answer")
    found: dict[str, list[float]] = {c: [] for c in CATEGORIES}
    for at, (category, present) in zip(positions, flat, strict=True):
        p, sampled = spelled.choice(at, _LABEL_LETTERS)
        if sampled != present:
            raise Unreadable(f"{category}: the tokens say {sampled}, the answer does not")
        found[category].append(p)
    return ChoiceProbabilities(found, spelled.organization(_LETTERS_ORGANIZATION_KEY, organization))


_LETTERS_ORGANIZATION_KEY = re.compile(rf'"{ORGANIZATION}":"')
_LABELS = re.compile(rf'"{LABELS}":"([{PRESENT}{ABSENT}]*)"')


def label_positions(answer: str) -> list[int]:
    """The offset of each label's letter in an answer of labels as letters (compact JSON)."""
    match = _LABELS.search(answer)
    return [] if match is None else list(range(match.start(1), match.end(1)))


def _spelled(answer: str, tokens: Sequence[str],
             top_logprobs: Sequence[dict[str, float]]) -> _Spelled:
    """The tokens' text and where each token starts in it, once they are checked to spell
    ``answer`` (ASCII characters only: see :func:`read_choices`)."""
    if len(tokens) != len(top_logprobs):
        raise Unreadable(f"{len(tokens)} tokens but {len(top_logprobs)} log-probability steps")
    text = "".join(tokens)
    if not _ascii(text).startswith(_ascii(answer)):
        raise Unreadable("the tokens do not spell the answer")
    starts, offset = [], 0
    for token in tokens:
        starts.append(offset)
        offset += len(token)
    return _Spelled(text, starts, tokens, top_logprobs)


@dataclass(frozen=True)
class _Spelled:
    """An answer's tokens checked to spell it: their text, where each starts in it, and each
    one's top log-probabilities."""

    text: str
    starts: list[int]
    tokens: Sequence[str]
    top_logprobs: Sequence[dict[str, float]]

    def organization(self, key: re.Pattern[str], organization: str) -> float:
        """P(matched) at the one organization value after ``key``, checked against the answer."""
        keys = list(key.finditer(self.text))
        if len(keys) != 1:
            raise Unreadable(f"{len(keys)} organization keys in the tokens")
        p_matched, sampled = self.choice(keys[0].end() + 1, _ORGANIZATION_LETTERS)
        if sampled != organization:
            raise Unreadable(f"organization: the tokens say {sampled}, the answer {organization}")
        return p_matched

    def choice(self, at: int, letters: Mapping[str, _V]) -> tuple[float, _V]:
        """P(first value) at character ``at``, and the value the answer holds there."""
        shares, sampled = self.shares(at, letters)
        return shares[next(iter(letters))], sampled

    def shares(self, at: int, letters: Mapping[str, _V]) -> tuple[dict[str, float], _V]:
        """Each value's probability at character ``at`` (by its letter, renormalised over the
        letters), and the value the answer holds there."""
        text = self.text
        if at >= len(text) or text[at] not in letters:
            raise Unreadable(f"no choice letter at offset {at}")
        step = bisect.bisect_right(self.starts, at) - 1
        prefix = text[self.starts[step] : at]
        mass = dict.fromkeys(letters, 0.0)
        for candidate, logprob in self.top_logprobs[step].items():
            if len(candidate) > len(prefix) and candidate.startswith(prefix):
                letter = candidate[len(prefix)]
                if letter in mass and logprob > -math.inf:
                    mass[letter] += math.exp(logprob)
        total = sum(mass.values())
        if not total > 0.0:
            raise Unreadable(f"no probability for either value at token {step} ({self.tokens[step]!r})")
        return {letter: share / total for letter, share in mass.items()}, letters[text[at]]


def _ascii(text: str) -> str:
    return "".join(c for c in text if c.isascii())


# The pairwise format's verdict (schema.PairwiseVerdict): its value's first letter decides it.
_VERDICT_KEY = re.compile(r'"v":"')
_VERDICT_LETTERS = {"A": "A", "B": "B", "t": "tie"}


def read_verdict_choices(answer: str, tokens: Sequence[str],
                         top_logprobs: Sequence[dict[str, float]], verdict: str) -> dict[str, float]:
    """P(A), P(B) and P(tie) of a pairwise verdict, read at the token that decides it, as
    AlpacaEval's judge reads its preference from one token's log-probabilities: the
    alternatives' masses by their first letter, renormalised over the three.

    Args:
        verdict: the parsed answer's verdict, checked against the tokens.

    Raises :class:`Unreadable` when the tokens do not spell the answer or hold no mass there.
    """
    spelled = _spelled(answer, tokens, top_logprobs)
    keys = list(_VERDICT_KEY.finditer(spelled.text))
    if len(keys) != 1:
        raise Unreadable(f"{len(keys)} verdict keys in the tokens")
    shares, sampled = spelled.shares(keys[0].end(), _VERDICT_LETTERS)
    if sampled != verdict:
        raise Unreadable(f"the tokens say {sampled}, the answer {verdict}")
    return {_VERDICT_LETTERS[letter]: p for letter, p in shares.items()}


def poisson_binomial(probabilities: Sequence[float]) -> list[float]:
    """P(k of the items are present), k = 0..n, for independent items with these P(present)."""
    distribution = [1.0]
    for p in probabilities:
        grown = [0.0] * (len(distribution) + 1)
        for k, mass in enumerate(distribution):
            grown[k] += mass * (1.0 - p)
            grown[k + 1] += mass * p
        distribution = grown
    return distribution


@lru_cache(maxsize=4096)
def _exact(counts: Counts) -> Fraction:
    score = compute_score(counts)
    assert score.exact is not None  # counts of items are never impossible
    return score.exact


def score_distribution(choices: ChoiceProbabilities) -> dict[Fraction, float]:
    """The exact score's distribution: each score the items can give -> its probability.

    The items are independent choices (each read at its own position given the answer before
    it, as the judge wrote it). Totals are fixed by the answer; matched counts vary.
    """
    facts, conclusions, terms = (poisson_binomial(choices.present[c]) for c in CATEGORIES)
    totals = [len(choices.present[c]) for c in CATEGORIES]
    organization = {"matched": choices.organization, "mismatched": 1.0 - choices.organization}
    distribution: dict[Fraction, float] = {}
    for fm, pf in enumerate(facts):
        for cm, pc in enumerate(conclusions):
            for tm, pt in enumerate(terms):
                for org, po in organization.items():
                    p = pf * pc * pt * po
                    if p == 0.0:
                        continue
                    counts = Counts.from_numbers([fm, totals[0], cm, totals[1], tm, totals[2]], org)
                    exact = _exact(counts)
                    distribution[exact] = distribution.get(exact, 0.0) + p
    return distribution


def shortest_interval(rounded: dict[int, float], mass: float = INTERVAL_MASS) -> list[int]:
    """The shortest range ``[lo, hi]`` of rounded scores holding at least ``mass``; among
    ranges of that length, the one holding most, then the lowest."""
    best: tuple[int, float, int, int] | None = None  # (width, -held, lo, hi)
    for lo in range(6):
        held = 0.0
        for hi in range(lo, 6):
            held += rounded.get(hi, 0.0)
            if held >= mass - _SLACK:
                candidate = (hi - lo, -held, lo, hi)
                best = candidate if best is None else min(best, candidate)
                break
    assert best is not None, "the probabilities sum to less than the interval's mass"
    return [best[2], best[3]]


class ConfidenceFields(TypedDict):
    """The fields of a :class:`~grader.records.ScoreConfidence` that :func:`confidence` makes."""

    score_expected: float
    p_score: float
    interval: list[int]
    distribution: dict[str, float]
    items_read: int
    probabilities: dict[str, list[float] | float]


def confidence(choices: ChoiceProbabilities, reported: int) -> ConfidenceFields:
    """The record's ``confidence`` field for an answer whose rounded score is ``reported``.

    ``score_expected``: the expectation of the exact score; ``p_score``: the probability of the
    reported rounded score; ``interval``: the shortest range of rounded scores holding at least
    90% of the probability; ``distribution``: P(rounded score) for 0..5; ``items_read``: how many
    choices were read (the items and the organization); ``probabilities``: what was read, so a
    rescore recomputes the rest without the model.
    """
    exact = score_distribution(choices)
    rounded = dict.fromkeys(range(6), 0.0)
    for value, p in exact.items():
        # round_half_up, in integers (an exact score is never negative)
        rounded[(2 * value.numerator + value.denominator) // (2 * value.denominator)] += p
    total = sum(rounded.values())
    expected = sum(float(value) * p for value, p in exact.items()) / total
    distribution = {str(k): p / total for k, p in rounded.items()}
    return {"score_expected": expected, "p_score": distribution[str(reported)],
            "interval": shortest_interval({k: p / total for k, p in rounded.items()}),
            "distribution": distribution,
            "items_read": sum(len(v) for v in choices.present.values()) + 1,
            "probabilities": choices.as_dict()}


def record_confidence(record: MarkedRecord, tokens: Sequence[str] | None = None,
                      top_logprobs: Sequence[dict[str, float]] | None = None,
                      probabilities: object = None) -> tuple[ScoreConfidence | None, str | None]:
    """``(confidence, confidence_error)``, the record's fields, for a record of marked items.

    From the answer's tokens and their top-k log-probabilities (grading), or from the
    ``probabilities`` an earlier confidence kept (rescoring). ``confidence`` is None, and
    ``confidence_error`` says why, when the record has no score or the choices cannot be read.
    """
    items = record.items
    if record.score is None or items is None or items is UNSET:
        return None, f"no score to weigh (status {record.status})"
    try:
        if probabilities is not None:
            choices = ChoiceProbabilities.from_dict(probabilities)
            for category, entries in items.by_category():
                if len(choices.present[category]) != len(entries):
                    raise Unreadable(f"the kept probabilities do not fit the {category} items")
        elif not tokens or not top_logprobs:
            raise Unreadable("the backend returned no log-probabilities")
        else:
            # a record with a score has the answer it was read from, and its counts
            assert record.raw_output is not None and record.counts is not None
            answer, organization = record.raw_output, record.counts.organization
            if record.labels_as_letters:
                choices = read_label_choices(answer, tokens, top_logprobs, items, organization)
            else:
                choices = read_choices(answer, tokens, top_logprobs, items, organization)
    except (Unreadable, KeyError, TypeError, ValueError) as exc:
        return None, str(exc)
    assert isinstance(record.score, int)  # a record the judge built: its score rounded to an int
    return ScoreConfidence(**confidence(choices, record.score)), None
