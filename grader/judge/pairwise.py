"""The pairwise format: two answers to one row, judged side by side in both orders.

A row holds two answers, ``output_a`` and ``output_b``. The judge sees them as "A" (shown
first) and "B" (shown second) and answers one verdict under the grammar
(:class:`grader.judge.schema.PairwiseVerdict`): ``A``, ``B`` or ``tie``. Every row is judged
twice, in its own order (A first) and swapped (B first), because a judge favours a place
as well as an answer (FastChat's llm_judge, Arena-Hard and OpenCompass all swap). The two
verdicts are turned into the row's labels and reconciled as FastChat's
``show_result.py`` does: the games agree, that is the winner; they disagree, a tie.

Pure: parse, swap, reconcile, join. The judge that renders the two games and reads them is
:class:`grader.judge.judges.PairwiseJudge`; the run sends a row's two games in one call
(:class:`grader.run.rows.Job` ``more``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from msgspec import UNSET, to_builtins

from grader.io.dataset import cell_text
from grader.judge.parsing import _answer_object
from grader.judge.schema import VERDICT, VERDICTS
from grader.records import PairwiseRecord, Usage
from grader.status import Status

# The fields a pairwise row holds two of: the answers, and the models that wrote them.
ANSWERS = ("output_a", "output_b")
MODELS = ("model_a", "model_b")
# The two games of a row: the row's own order (A shown first), then swapped (B shown first).
ORDERS = ("AB", "BA")
# A verdict of the swapped game in the row's labels: its "A" (shown first) is the row's B.
SWAPPED = {"A": "B", "B": "A", "tie": "tie"}


def swapped_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A row's fields with its two answers (and their models) exchanged: the second game."""
    swapped = dict(fields)
    for a, b in (ANSWERS, MODELS):
        if a in fields or b in fields:
            swapped[a], swapped[b] = fields.get(b), fields.get(a)
    return swapped


def model_names(fields: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """``(model_a, model_b)`` as the row names them, as text; None where it does not."""
    a, b = (cell_text(fields.get(name)) for name in MODELS)
    return a, b


def parse_pair_verdict(text: str | None,
                       finish_reason: str | None) -> tuple[str | None, Status | None, str | None]:
    """``(verdict, failure status, reason)`` of one game's answer: the verdict, or why none."""
    data = _answer_object(text, finish_reason)
    if isinstance(data, tuple):
        return None, *data
    verdict = data.get(VERDICT)
    if verdict not in VERDICTS:
        return None, Status.PARSE_ERROR, (
            f"the verdict {VERDICT!r} must be one of {', '.join(VERDICTS)}, got {verdict!r}")
    return verdict, None, None


def reconcile(first: str, second: str) -> str:
    """The row's winner from its two verdicts, both in the row's labels (FastChat's
    ``show_result.py``: a tie where either game says tie or the games disagree)."""
    return first if first == second else "tie"


def game_record(item_id: Any, raw_output: str | None, finish_reason: str | None,
                **stored: Any) -> PairwiseRecord:
    """One game's answer read: its verdict as written (in the game's own places), or why none."""
    verdict, status, error = parse_pair_verdict(raw_output, finish_reason)
    return PairwiseRecord.build(
        id=item_id, status=str(status or Status.OK), winner=verdict, error=error,
        raw_output=raw_output, finish_reason=finish_reason, **stored)


def game_confidence(record: PairwiseRecord, tokens: Sequence[str] | None,
                    top_logprobs: Sequence[dict[str, float]]
                    ) -> tuple[dict[str, float] | None, str | None]:
    """``(confidence, confidence_error)`` of one game: P(A), P(B), P(tie) as the game wrote
    them, read at the token that decides the verdict; None and why, where they cannot be."""
    from grader.judge.confidence import Unreadable, read_verdict_choices

    if record.winner is None or record.raw_output is None:
        return None, f"no verdict to weigh (status {record.status})"
    if not tokens or not top_logprobs:
        return None, "the backend returned no log-probabilities"
    try:
        return read_verdict_choices(record.raw_output, tokens, top_logprobs, record.winner), None
    except Unreadable as exc:
        return None, str(exc)


# What each game keeps of its record, beside its order (absent fields are left out).
_GAME_FIELDS = ("status", "raw_output", "finish_reason", "error", "usage", "reasoning",
                "confidence", "confidence_error")


def _game(record: PairwiseRecord, order: str) -> dict[str, object]:
    game: dict[str, object] = {"order": order, "verdict": record.winner}
    for name in _GAME_FIELDS:
        value = getattr(record, name)
        if value is not UNSET and not (name == "error" and value is None):
            game[name] = to_builtins(value) if name == "usage" else value
    return game


def _in_row_labels(probabilities: dict[str, float], order: str) -> dict[str, float]:
    """A game's P(A), P(B), P(tie) with A and B the row's answers, whichever was shown first."""
    if order == "AB":
        return {verdict: probabilities[verdict] for verdict in VERDICTS}
    return {verdict: probabilities[SWAPPED[verdict]] for verdict in VERDICTS}


class _PairConfidence(TypedDict, total=False):
    confidence: dict[str, object] | None
    confidence_error: str | None


def _confidence(games: Sequence[PairwiseRecord], winner: str | None) -> _PairConfidence:
    """The pair's ``confidence`` and ``confidence_error`` fields, where --confidence read the
    games: each game's probabilities in the row's labels, their mean (``p``, AlpacaEval's
    preference averaged over the two orders) and ``p_winner``, the mean's share of the
    reconciled winner (low for a tie of two games that disagreed: the judge never said tie)."""
    if all(game.confidence is UNSET for game in games):
        return {}
    read = [game.confidence for game in games if isinstance(game.confidence, dict)]
    if winner is None or len(read) < len(games):
        errors = [game.confidence_error for game in games if isinstance(game.confidence_error, str)]
        return {"confidence": None,
                "confidence_error": errors[0] if errors else "no verdict to weigh"}
    labelled = [_in_row_labels(p, order) for p, order in zip(read, ORDERS, strict=True)]
    mean = {verdict: sum(p[verdict] for p in labelled) / len(labelled) for verdict in VERDICTS}
    return {"confidence": {"p": mean, "p_winner": mean[winner], "games": labelled},
            "confidence_error": None}


def pair_record(item_id: Any, games: Sequence[PairwiseRecord], model_a: str | None = None,
                model_b: str | None = None) -> PairwiseRecord:
    """A row's record from its two games' (the row's order, then swapped): both verdicts in
    the row's labels, the winner reconciled, each game kept. A game that could not be judged
    gives the row its status (the first such game's) and no winner."""
    first, second = games
    kept = [_game(game, order) for game, order in zip(games, ORDERS, strict=True)]
    failed = [(game, order) for game, order in zip(games, ORDERS, strict=True)
              if game.status != Status.OK or game.winner is None]
    verdicts = [first.winner, SWAPPED.get(second.winner) if second.winner is not None else None]
    usage = Usage.total(game.usage for game in games)  # where the games have them
    fields: dict[str, object] = {
        "id": item_id, "model_a": model_a, "model_b": model_b, "verdicts": verdicts, "games": kept,
        "truncation": first.truncation or second.truncation,
        **({"usage": usage} if usage is not None else {})}
    if failed:
        game, order = failed[0]
        shown = "A" if order == "AB" else "B"
        fields |= {"status": str(game.status),
                   "error": f"the game with {shown} shown first: {game.error or game.status}"}
        winner = None
    else:
        a, b = verdicts
        assert a is not None and b is not None  # both games gave a verdict
        winner = reconcile(a, b)
        fields |= {"status": str(Status.OK), "winner": winner, "consistent": a == b}
    return PairwiseRecord.build(**fields, **_confidence(games, winner))
