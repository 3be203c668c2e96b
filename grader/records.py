"""The result record: one per input row, built from a judge answer or a reason there is none.

Shared by ``grade`` and ``rescore`` so a rescored record is byte-for-byte what grading the same
raw text would have produced.
"""

from __future__ import annotations

from typing import Any

from grader.parsing import parse_verdict
from grader.scoring import compute_score, format_decimal, score_line
from grader.status import Status

Record = dict[str, Any]


def _record(item_id: Any, status: Status, **fields: Any) -> Record:
    record: Record = {
        "id": item_id,
        "status": str(status),
        "score": None,
        "score_exact": None,
        "grade": None,
        "model_score": None,
        "checklist": None,
        "counts": None,
        "formula": None,
        "raw_output": None,
        "finish_reason": None,
        "error": None,
        "truncation": None,
    }
    record.update(fields)
    return record


def judged_record(
    item_id: Any, raw_output: str | None, finish_reason: str | None, **extra: Any
) -> Record:
    """Parse a judge answer and recompute its score exactly.

    Args:
        item_id: the row's id.
        raw_output: the judge's text, kept verbatim so a rescore needs no model.
        finish_reason: the backend's ``"stop"`` / ``"length"``.
        extra: further fields stored as they are (token usage, for instance).
    """
    parsed = parse_verdict(raw_output, finish_reason)
    common = {"raw_output": raw_output, "finish_reason": finish_reason, **extra}
    audit = {"model_score": parsed.model_score, "checklist": parsed.checklist}
    if parsed.counts is None:
        return _record(item_id, parsed.status, error=parsed.error, **audit, **common)

    counts = parsed.counts.as_dict()
    score = compute_score(parsed.counts)
    if score.status is Status.INVALID_COUNTS:
        return _record(
            item_id, score.status, error=score.reason, counts=counts, **audit, **common
        )
    assert score.exact is not None and parsed.rationale is not None
    grade = {"score": score.rounded, "rationale": [*parsed.rationale[:4], score_line(score)]}
    return _record(
        item_id,
        score.status,
        score=score.rounded,
        score_exact=float(score.exact),
        grade=grade,
        counts=counts,
        formula=score.formula,
        error=score.reason,
        **audit,
        **common,
    )


def missing_context_record(item_id: Any, missing: list[str]) -> Record:
    """A row not sent to the judge: the seed assigns 0 when content is missing."""
    what = " and ".join(missing)
    note = f"Missing context: {what} is empty, so the row was not sent to the judge."
    grade = {
        "score": 0,
        "rationale": [
            f"Fact: 0 of 0 correctly matched. {note}",
            "Conclusion: 0 of 0 correctly matched.",
            "Terminology: 0 of 0 terms correctly matched.",
            "Organization: mismatched",
            f"Score: 0 ≈ {format_decimal(0)} = missing {what}: the seed assigns 0",
        ],
    }
    return _record(
        item_id,
        Status.MISSING_CONTEXT,
        score=0,
        score_exact=0.0,
        grade=grade,
        error=f"empty or missing {what}",
    )


def failed_record(item_id: Any, status: Status, error: str, **fields: Any) -> Record:
    """A row the judge could not grade (overflow, engine error): no score, a reason."""
    return _record(item_id, status, error=error, **fields)
