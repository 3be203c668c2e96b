"""The result record: one per input row, built from a judge answer or a reason there is none.

Shared by ``grade`` and ``rescore`` so a rescored record is byte-for-byte what grading the same
raw text would have produced.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from typing import Any, TypeVar

import msgspec
from msgspec import UNSET
from msgspec.structs import replace

from grader.judge.parsing import claimed_counts, parse_itemized, parse_verdict
from grader.judge.schema import ABSENT, LABELS, ORGANIZATION, PRESENT
from grader.judge.scoring import (
    COUNT_LINES,
    Counts,
    Score,
    compute_score,
    format_decimal,
    score_line,
)
from grader.records import (
    SEED_KINDS,
    Finding,
    ItemizedRecord,
    LabelledItem,
    MarkedItems,
    MissingEvidence,
    Record,
    RubricRecord,
    Sample,
    SeedRecord,
)
from grader.status import Status

_Seed = TypeVar("_Seed", bound=SeedRecord)

# A sample as a record keeps it: its kind's Sample, or a plain object where the record is
# another tool's (both read by name).
AnySample = Sample | dict[str, Any]
# An earlier check of the quotes that a rescore keeps: a record's, or a sample's as its JSON.
KeptEvidence = Sequence[MissingEvidence | dict[str, Any]]


def seed_record(item_id: Any, status: Status, answer_format: str = "seed",
                **values: Any) -> SeedRecord:
    """A seed judge's record of the class of ``answer_format``, the format the judge was asked
    for (the itemized and rubric records are seed records with their own fields after
    ``format``)."""
    return SEED_KINDS[answer_format].build(id=item_id, status=str(status), **values)


def judged_record(item_id: Any, raw_output: str | None, finish_reason: str | None,
                  **extra: Any) -> SeedRecord:
    """Parse a judge answer in the seed's format and recompute its score exactly.

    Args:
        item_id: the row's id.
        raw_output: the judge's text, kept verbatim so a rescore needs no model.
        finish_reason: the backend's ``"stop"`` / ``"length"``.
        extra: further fields stored as they are (token usage, for instance).
    """
    parsed = parse_verdict(raw_output, finish_reason)
    common = {"raw_output": raw_output, "finish_reason": finish_reason,
              "model_score": parsed.model_score, "checklist": parsed.checklist, **extra}
    if parsed.counts is None:
        assert parsed.status is not None  # a verdict without counts is a failure
        return seed_record(item_id, parsed.status, error=parsed.error, **common)
    score = compute_score(parsed.counts)
    if score.status is Status.INVALID_COUNTS:
        return seed_record(item_id, score.status, error=score.reason,
                           counts=parsed.counts.as_record(), **common)
    assert parsed.rationale is not None  # counts are read from it
    return _scored(SEED_KINDS["seed"], item_id, parsed.counts, score,
                   [*parsed.rationale[:4], score_line(score)], **common)


def itemized_record(item_id: Any, raw_output: str | None, finish_reason: str | None, *,
                    output_text: str | None = None, evidence_not_found: KeptEvidence | None = None,
                    **extra: Any) -> ItemizedRecord:
    """An itemized answer -> counts of its items -> the seed's formula, exactly.

    The judge's own count lines and score are kept for audit; a line that claims other counts
    than its items is listed in ``count_mismatch``. An item whose quote is not in the model
    output is listed in ``evidence_not_found`` and still counts as the judge said: the flag is
    for a reader, and the score stays a function of ``raw_output`` alone, so ``rescore`` (which
    has no dataset) recomputes it exactly.

    Args:
        output_text: the graded answer, to search each quote in; None (a rescore) keeps
            ``evidence_not_found`` as given, the check made when the row was graded (a
            record's, or a sample's as its JSON).
    """
    parsed = parse_itemized(raw_output, finish_reason)
    common = {"raw_output": raw_output, "finish_reason": finish_reason,
              "model_score": parsed.model_score, "items": parsed.items,
              "judge_lines": parsed.judge_lines, "count_mismatch": [], "evidence_not_found": [],
              **extra}
    if parsed.counts is None:
        assert parsed.status is not None  # an answer without counts is a failure
        return ItemizedRecord.build(id=item_id, status=str(parsed.status), error=parsed.error, **common)
    assert parsed.items is not None  # counted from them
    common["evidence_not_found"] = (missing_evidence(parsed.items, output_text)
                                    if output_text is not None else kept_evidence(evidence_not_found))
    common["count_mismatch"] = count_mismatch(parsed.judge_lines, parsed.counts)
    score = compute_score(parsed.counts)  # counts of items are never impossible
    return _scored(ItemizedRecord, item_id, parsed.counts, score,
                   _seed_lines(parsed.counts, score), **common)


def _scored(kind: type[_Seed], item_id: Any, counts: Counts, score: Score, rationale: list[str],
            **common: Any) -> _Seed:
    """A record of ``kind`` whose counts scored: the seed's fields of ``score``, ``rationale``
    its grade's five lines."""
    assert score.exact is not None  # a score was computed
    return kind.build(id=item_id, status=str(score.status), score=score.rounded,
                      score_exact=float(score.exact),
                      grade={"score": score.rounded, "rationale": rationale},
                      counts=counts.as_record(), formula=score.formula, error=score.reason,
                      **common)


def _seed_lines(counts: Counts, score: Score) -> list[str]:
    """The seed's five rationale lines, written from counts grader made itself."""
    fact, conclusion, terminology = (line.text(*counts.of(line.category)) for line in COUNT_LINES)
    if not counts.facts_total:
        fact += " Ambiguous: the judge listed no facts in the reference."
    return [fact, conclusion, terminology, f"Organization: {counts.organization}", score_line(score)]


def rubric_record(item_id: Any, raw_output: str | None, finish_reason: str | None, *,
                  rubric: Mapping[str, Any], output_text: str | None = None,
                  evidence_not_found: KeptEvidence | None = None, **extra: Any) -> RubricRecord:
    """A check-pass answer (one label per rubric item) -> counts -> the seed's formula, exactly.

    ``rubric`` (the row's rubric, :meth:`grader.judge.rubric.Rubric.as_dict`) is kept in the
    record, so ``rescore`` recounts the labels without the model and without the rubric file.
    ``items`` pairs each rubric item with its label (:class:`~grader.records.LabelledItem`).
    """
    from grader.judge.rubric import Rubric, labelled_items, parse_labels

    table = Rubric.from_dict(rubric)
    parsed = parse_labels(raw_output, finish_reason, table.size())
    common = {"raw_output": raw_output, "finish_reason": finish_reason, "items": None,
              "rubric": rubric, "evidence_not_found": [], **extra}
    if parsed.labels is None:
        assert parsed.status is not None  # an answer without labels is a failure
        return RubricRecord.build(id=item_id, status=str(parsed.status), error=parsed.error, **common)
    items = labelled_items(table, parsed)
    common["items"] = items
    if parsed.quotes is not None:
        common["evidence_not_found"] = (missing_evidence(items, output_text) if output_text
                                        is not None else kept_evidence(evidence_not_found))
    assert parsed.organization is not None  # parse_labels checked it
    counts = Counts.from_numbers(items.numbers(), parsed.organization)
    score = compute_score(counts)  # counts of labels are never impossible
    return _scored(RubricRecord, item_id, counts, score, _seed_lines(counts, score), **common)


def relabelled_record(like: Record, labels: Sequence[bool], organization: str,
                      **extra: Any) -> Record:
    """``like``'s listed items marked with ``labels`` (in order: facts, conclusions, terms)
    and ``organization`` instead of its judge's: the record its judge would have built from
    that answer, scored exactly (a panel's pooled record). ``like`` must be a record of items
    listed before the answer (:meth:`~grader.records.Record.listed_items`)."""
    if not isinstance(like, RubricRecord) or not isinstance(like.rubric, dict):
        raise TypeError(f"{type(like).__name__} has no listed items to mark again")
    answer = json.dumps({LABELS: "".join(PRESENT if x else ABSENT for x in labels),
                         ORGANIZATION: organization}, separators=(",", ":"))
    return rubric_record(like.id, answer, "stop", rubric=like.rubric, **extra)


def empty_rubric_record(item_id: Any, rubric: Mapping[str, Any]) -> RubricRecord:
    """A row whose reference's rubric has no facts: not sent, no score (the seed's formula
    divides by the facts; a score here would be invented)."""
    return RubricRecord.build(id=item_id, status=str(Status.EMPTY_RUBRIC), rubric=rubric, error=(
        "the reference's rubric has no facts: nothing to mark the answer against"))


def _searchable(text: str) -> str:
    # The judge read the output as the prompt renders it: `<` of a delimiter tag as `&lt;`, a
    # WORD JOINER inside special-token text. Case and runs of whitespace are not evidence.
    text = text.replace("&lt;", "<").replace("\u2060", "")
    return " ".join(text.casefold().split())


def missing_evidence(items: MarkedItems[Finding] | MarkedItems[LabelledItem],
                     output_text: str) -> list[MissingEvidence]:
    """Each item whose non-empty quote is not found in ``output_text`` by plain string search."""
    haystack = _searchable(output_text)
    missing = []
    by_category: tuple[tuple[str, Sequence[Finding | LabelledItem]], ...] = items.by_category()
    for category, entries in by_category:
        for index, entry in enumerate(entries):
            quote = entry.quote
            if isinstance(quote, str) and quote.strip() and _searchable(quote) not in haystack:
                missing.append(MissingEvidence(category, index, quote))
    return missing


def kept_evidence(given: KeptEvidence | None) -> list[MissingEvidence]:
    """An earlier check of the quotes, kept by a rescore: a record's, or a sample's as its JSON
    (a sample keeps its fields as JSON objects)."""
    return [entry if isinstance(entry, MissingEvidence) else msgspec.convert(entry, MissingEvidence)
            for entry in given or ()]


def count_mismatch(judge_lines: list[str] | None, counts: Counts) -> list[str]:
    """The judge's count lines that claim other counts than its own items."""
    derived = {line.label: counts.of(line.category) for line in COUNT_LINES}
    differ = []
    for line in judge_lines or []:
        claimed = claimed_counts(line)
        if claimed is not None and claimed[1:] != derived[claimed[0]]:
            differ.append(line)
    return differ


def missing_context_record(item_id: Any, missing: list[str], answer_format: str = "seed") -> SeedRecord:
    """A row not sent to the judge: the seed assigns 0 when content is missing."""
    what = " and ".join(missing)
    note = f"Missing context: {what} is empty, so the row was not sent to the judge."
    grade = {"score": 0, "rationale": [
        f"{COUNT_LINES[0].text(0, 0)} {note}", *(line.text(0, 0) for line in COUNT_LINES[1:]),
        "Organization: mismatched",
        f"Score: 0 ≈ {format_decimal(Fraction(0))} = missing {what}: the seed assigns 0"]}
    return seed_record(item_id, Status.MISSING_CONTEXT, answer_format, score=0, score_exact=0.0,
                       grade=grade, error=f"empty or missing {what}")


def failed_record(item_id: Any, status: Status, error: str, answer_format: str = "seed",
                  **fields: Any) -> SeedRecord:
    """A row the seed judge could not grade (overflow, engine error): no score, a reason."""
    return seed_record(item_id, status, answer_format, error=error, **fields)


AGGREGATES = ("median", "mean", "majority")


def aggregate_values(values: list[Fraction], method: str) -> Fraction:
    """Several samples' values -> one, exactly.

    ``median`` of an even count is the mean of the middle two; ``majority`` is the most
    frequent value, a tie going to the lower one (the conservative grade).
    """
    if method == "mean":
        return statistics.mean(values)  # Fractions in, an exact Fraction out
    if method == "median":
        return statistics.median(values)
    if method == "majority":
        counts = Counter(values)
        best = max(counts.values())
        return min(v for v, n in counts.items() if n == best)
    raise ValueError(f"unknown aggregate {method!r}: choose from {', '.join(AGGREGATES)}")


def spread(values: list[Fraction]) -> dict[str, float | None]:
    """How far the samples' values lie apart (population standard deviation)."""
    if not values:
        return {"n": 0, "min": None, "max": None, "range": None, "stdev": None}
    variance = statistics.pvariance(values)  # exact, as the values are
    low, high = min(values), max(values)
    return {"n": len(values), "min": float(low), "max": float(high), "range": float(high - low),
            "stdev": round(math.sqrt(variance), 4)}


def sample_summary(record: Record) -> AnySample:
    """What a record keeps of each of its samples: its class's ``sample_fields`` it holds, as
    its class's :attr:`~grader.records.Record.sample_type` (a plain object for a draft's)."""
    kept = {name: getattr(record, name) for name in record.sample_fields
            if getattr(record, name) is not UNSET}
    if record.sample_type is not None:
        return record.sample_type(**kept)
    for name in record.nested:  # as its JSON object, as a sample read from a file holds it
        if isinstance(kept.get(name), (msgspec.Struct, list)):
            kept[name] = msgspec.to_builtins(kept[name])
    return kept


def aggregate_samples(samples: list[Record], method: str,
                      finish: Callable[[Any, Fraction], Any] | None = None) -> Record:
    """One record from a row's samples: the aggregate value, each sample, and their spread.

    The record's other fields (grade, counts, raw_output) are those of the sample whose value
    lies closest to the aggregate, so each stays consistent with its own counts. A row none of
    whose samples has a value keeps the first sample's failure.

    Args:
        samples: one record per sample, built by the judge.
        method: ``median``, ``mean`` or ``majority``.
        finish: ``(record, aggregate Fraction) -> record``: the judge's own last touch.
    """
    valued = [(s, Fraction(s.value)) for s in samples if s.value is not None]
    values = [v for _, v in valued]
    if not values:
        record = replace(samples[0])
    else:
        value = aggregate_values(values, method)
        closest = min(valued, key=lambda pair: abs(pair[1] - value))[0]
        record = finish(closest, value) if finish else replace(closest)
    record.aggregate = method
    record.spread = spread(values)
    record.samples = [sample_summary(s) for s in samples]
    return record
