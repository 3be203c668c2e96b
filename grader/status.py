"""The one set of record statuses."""

from collections.abc import Iterable
from enum import StrEnum


class Status(StrEnum):
    """Why a record has the score it has. Only ``ok`` rows carry a judge-derived score."""

    OK = "ok"
    MISSING_CONTEXT = "missing_context"  # empty reference or output: not sent, score 0 (seed)
    INVALID_INPUT = "invalid_input"  # cannot be sent (NUL byte, lone surrogate, a grammar xgrammar refuses): null
    AMBIGUOUS = "ambiguous"  # the judge found no reference facts: score 0 (seed)
    INVALID_COUNTS = "invalid_counts"  # matched > total, or counts that do not parse: null
    PARSE_ERROR = "parse_error"  # the judge's text is not a verdict: null
    TRUNCATED = "truncated"  # the answer hit max_tokens: null
    CONTEXT_OVERFLOW = "context_overflow"  # prompt + answer exceed the context: null
    ENGINE_ERROR = "engine_error"  # the backend failed on this row: null
    EMPTY_RUBRIC = "empty_rubric"  # --format rubric: the reference's rubric has no facts: null


def in_status_order(statuses: Iterable[str]) -> list[str]:
    """The one order statuses are shown in: ``Status``'s own, then unknown ones (another
    tool's records) alphabetically."""
    given = set(statuses)
    known = [str(s) for s in Status if str(s) in given]
    return known + sorted(given - set(known))


# Statuses whose score is the seed's 0 rather than null.
ZERO_SCORE = frozenset({Status.MISSING_CONTEXT, Status.AMBIGUOUS})


# One line each, printed under the summary table for the statuses a run produced.
EXPLANATIONS = {
    Status.MISSING_CONTEXT: "empty reference or output_text: not sent to the judge, score 0",
    Status.INVALID_INPUT: "the row's text holds a NUL byte or a lone surrogate, or its answer's grammar does not compile (see each record's error): not sent, no score",
    Status.AMBIGUOUS: "the judge found no facts in the reference: score 0, as the seed asks",
    Status.INVALID_COUNTS: "the judge's numbers are impossible (matched > total, a result out of range) or unreadable: no score",
    Status.PARSE_ERROR: "the judge's text is not a verdict (only without guided decoding): no score",
    Status.TRUNCATED: "the answer hit max_tokens before it ended: no score (raise --max-tokens)",
    Status.CONTEXT_OVERFLOW: "prompt + longest answer exceed the model's context: no score",
    Status.ENGINE_ERROR: "the engine failed on these rows (see each record's error): no score",
    Status.EMPTY_RUBRIC: "the reference's rubric has no facts (edit the rubric file): not sent, no score",
}
