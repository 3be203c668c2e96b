"""The summary of a results file: counts per status, the score histogram and mean, the judge's
own arithmetic against the recompute. One tally, for ``grade``, ``rescore`` and ``report``."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction
from typing import Any, NamedTuple, TypedDict

from msgspec import UNSET, UnsetType

from grader.analysis.verdict import JudgeCheck
from grader.io.manifest import JSONObject, RunManifest
from grader.records import (
    MarkedItems,
    MarkedRecord,
    PairwiseRecord,
    Record,
    ScoreModelRecord,
    SeedRecord,
)
from grader.status import EXPLANATIONS, Status

_SCORE_KEYS = [str(score) for score in range(6)]
NO_STATUS = "(none)"  # the status of a record without one (another tool's)

# The record fields that flag an ok row for a reader (grader.judge.records.itemized_record):
# each a list, empty when the row is clean.
FLAGS = ("evidence_not_found", "count_mismatch")


def number(value: Any) -> float | None:
    """A finite int or float (not a bool) as a float, else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


class Counted(NamedTuple):
    """What the tally counts of one record, whoever wrote the file: an ok row's 0-5 score
    (and the judge's own, where it is a number) or a score_model grader's result; neither for
    a row that failed, or an ok row of another tool's that holds neither (counted as ok)."""

    status: str
    score: int | None = None
    model_score: float | None = None
    result: float | None = None
    passed: bool | None = None


def counted(record: Record) -> Counted:
    """What :class:`Tally` counts of ``record``. grader's own records count as they are;
    another tool's score that is no int 0-5 is shown on the row's card, not counted."""
    status = NO_STATUS if record.status is None else record.status
    if status != Status.OK:
        return Counted(status)
    if isinstance(record, ScoreModelRecord):
        # passed is true or false against the grader's threshold, null when it has none
        passed = record.passed if isinstance(record.passed, bool) else None
        return Counted(status, result=number(record.result), passed=passed)
    # by name in another tool's record: grader's own before formats were seed records
    score = record.score if isinstance(record, SeedRecord) else record.field("score")
    if type(score) is not int or not 0 <= score <= 5:
        return Counted(status)
    model_score = record.model_score if isinstance(record, SeedRecord) else record.field("model_score")
    return Counted(status, score, number(model_score))


class ScoreModelSummary(JSONObject, kw_only=True):
    """A score_model grader's ok rows: the mean result, and how many passed its threshold."""

    mean_result: float
    passed: int
    judged: int  # the ok rows with a pass or fail (the grader has a threshold)
    pass_rate: float | None


class Disagreement(JSONObject, kw_only=True):
    """The ok rows where the judge wrote its own score: how many differ from the recompute."""

    rows: int
    disagree: int
    rate: float | None


class Flagged(JSONObject, kw_only=True):
    """The ok rows a reader should look at before trusting their score (:data:`FLAGS`)."""

    rows: int
    evidence_not_found: int
    count_mismatch: int
    no_quote_found: int  # every quote the judge gave is absent from the answer


class Proportion(TypedDict):
    """:func:`proportion`'s: ``hits`` of ``of``, the ``rate`` and its ``interval``."""

    hits: int
    of: int
    rate: float | None
    interval: list[float] | None


class FirstPositions(Proportion):
    game_ties: int


class PairwiseSummary(JSONObject, kw_only=True):
    """The pairwise format's rows: winners, position consistency, first-position wins (each
    share a :func:`proportion`)."""

    pairs: int
    model_a: Any  # where every row names the same two
    model_b: Any
    winner: dict[str, int]
    a_win_rate: float | None  # FastChat's win rate: a tie is half a win
    position_consistency: Proportion
    first_position_win_rate: FirstPositions


class JudgeAgreement(TypedDict):
    name: str
    rows: int
    label_agreement: float | None
    score_agreement: float | None


class PanelAgreement(TypedDict):
    """The summary's ``panel`` section (:meth:`grader.analysis.panel.Agreement.result`)."""

    judges: int
    rule: str
    alpha_labels: float | None
    alpha_scores: float | None
    item_labels: int
    per_judge: list[JudgeAgreement]


class Summary(JSONObject, kw_only=True):
    """A results file's summary (``NAME.summary.json``), as :func:`summarize` makes it and
    :func:`grader.io.results.write_summary` writes it: rows per status, then one kind's
    section (``pairwise``, ``score_model``, or the 0-5 score's ``mean_score``, ``histogram``
    and ``judge_disagreement``), the flagged rows, the controls' verdict (``judge_check``),
    the run manifest (``run``) and a panel's agreement (``panel``); a section a run does not
    have is not written. ``to_dict()`` is the file's JSON object."""

    rows: int
    statuses: dict[str, int]
    graded: int  # the ok rows
    pairwise: PairwiseSummary | UnsetType = UNSET
    score_model: ScoreModelSummary | UnsetType = UNSET
    mean_score: float | None | UnsetType = UNSET
    histogram: dict[str, int] | UnsetType = UNSET
    judge_disagreement: Disagreement | UnsetType = UNSET
    flagged: Flagged | UnsetType = UNSET
    judge_check: JudgeCheck | UnsetType = UNSET
    run: RunManifest | UnsetType = UNSET
    panel: PanelAgreement | UnsetType = UNSET

    @property
    def manifest(self) -> RunManifest:
        """The run manifest (a summary :func:`summarize` made without one: an empty one)."""
        return self.run if isinstance(self.run, RunManifest) else RunManifest()


def summarize(records: Iterable[Record], *, run: RunManifest | None = None) -> Summary:
    """Counts per status; for the seed judge the mean and histogram of ok scores and the
    judge/recompute disagreement; for a score_model grader the mean result and pass rate."""
    tally = Tally()
    tally.add(records)
    return tally.summary(run=run)


class Tally:
    """What :func:`summarize` counts, kept so that tallies of consecutive parts of a file
    can be merged: ``a.merge(b)`` is the tally of a's records followed by b's."""

    def __init__(self) -> None:
        self.statuses: Counter[str] = Counter({str(s): 0 for s in Status})
        self.histogram = {str(score): 0 for score in range(6)}
        self.total = Fraction(0)
        self.rows = self.ok = self.compared = self.disagreements = 0
        self.results: list[float] = []
        self.verdicts: list[bool] = []
        # ok rows with any flag; per flag; ok rows whose every quote is absent from the answer
        self.flags: Counter[str] = Counter()
        self.pairs = _PairTally()  # the pairwise format's rows

    def add(self, records: Iterable[Record]) -> None:
        statuses, histogram, results, verdicts = (self.statuses, self.histogram, self.results,
                                                  self.verdicts)
        int_total = 0  # the scores are ints 0-5: summed as ints, Fraction(n) is n
        rows = ok = compared = disagreements = 0
        try:
            for record in records:
                rows += 1
                count = counted(record)
                statuses[count.status] += 1
                if isinstance(record, PairwiseRecord):
                    self.pairs.add(record, ok=count.status == Status.OK)
                if count.status != Status.OK:
                    continue
                ok += 1
                if count.result is not None:
                    results.append(count.result)
                    if count.passed is not None:
                        verdicts.append(count.passed)
                    continue
                if isinstance(record, MarkedRecord) and any(
                        record.field(flag) for flag in FLAGS):
                    self._flag(record)
                score = count.score
                if score is None:  # an ok row without a score (another tool's): only counted
                    continue
                histogram[_SCORE_KEYS[score]] += 1
                int_total += score
                if count.model_score is not None:
                    compared += 1
                    disagreements += count.model_score != score
        finally:
            self.total += int_total
            self.rows += rows
            self.ok += ok
            self.compared += compared
            self.disagreements += disagreements

    def _flag(self, record: MarkedRecord) -> None:
        flags = self.flags
        flags["rows"] += 1
        for flag in FLAGS:
            flags[flag] += bool(record.field(flag))
        missing = record.evidence_not_found
        items = record.items
        if missing and isinstance(items, MarkedItems):
            quoted = sum(1 for _, entries in items.by_category() for entry in entries
                         if isinstance(entry.quote, str) and entry.quote.strip())
            flags["no_quote_found"] += isinstance(missing, list) and len(missing) >= quoted > 0

    def merge(self, other: Tally) -> None:
        self.statuses.update(other.statuses)  # a status first seen in other goes after ours
        for key, count in other.histogram.items():
            self.histogram[key] += count
        self.total += other.total
        self.rows += other.rows
        self.ok += other.ok
        self.compared += other.compared
        self.disagreements += other.disagreements
        self.results += other.results
        self.verdicts += other.verdicts
        self.flags.update(other.flags)
        self.pairs.merge(other.pairs)

    def summary(self, *, run: RunManifest | None = None) -> Summary:
        ok, results, verdicts = self.ok, self.results, self.verdicts
        summary = Summary(rows=self.rows, statuses=dict(self.statuses), graded=ok)
        if self.pairs.rows:
            summary.pairwise = self.pairs.summary()
        elif results:
            summary.score_model = ScoreModelSummary(
                mean_result=round(sum(results) / len(results), 4), passed=sum(verdicts),
                judged=len(verdicts),
                pass_rate=round(sum(verdicts) / len(verdicts), 4) if verdicts else None)
        else:
            compared, disagreements = self.compared, self.disagreements
            summary.mean_score = round(float(self.total / ok), 4) if ok else None
            summary.histogram = dict(self.histogram)
            summary.judge_disagreement = Disagreement(
                rows=compared, disagree=disagreements,
                rate=round(disagreements / compared, 4) if compared else None)
        if self.flags:
            # how far to trust the ok rows: those a reader should look at before their score
            summary.flagged = Flagged(**{flag: self.flags[flag] for flag in ("rows", *FLAGS)},
                                      no_quote_found=self.flags["no_quote_found"])
        if run is not None:
            summary.run = run
        return summary


# A game's verdict as the judge wrote it, by the place of the answer it chose.
_PLACES = {"A": "first", "B": "second", "tie": "game_tie"}


class _PairTally:
    """What the summary counts of the pairwise format's rows (grader.judge.pairwise): the
    reconciled winners, how many pairs kept their verdict through the swap, and how often the
    answer shown first won a game. Only pairs both of whose games were judged are counted."""

    def __init__(self) -> None:
        self.rows = 0  # pairwise records, of any status
        self.counts: Counter[str] = Counter()
        self.models: set[tuple[Any, Any]] = set()  # (model_a, model_b), up to two kept

    def add(self, record: PairwiseRecord, *, ok: bool) -> None:
        self.rows += 1
        names = (record.model_a, record.model_b)
        if names != (None, None) and len(self.models) < 2:
            self.models.add(names)
        winner, counts = record.winner, self.counts
        if not ok or winner not in ("A", "B", "tie"):
            return
        counts["pairs"] += 1
        counts[f"winner_{winner}"] += 1
        counts["consistent"] += record.consistent is True
        games = record.games if isinstance(record.games, list) else []
        for game in games:
            # the letter as the judge wrote it: "A" is the answer shown first, whichever it was
            verdict = game.get("verdict") if isinstance(game, dict) else None
            counts[_PLACES.get(verdict, "other") if isinstance(verdict, str) else "other"] += 1

    def merge(self, other: _PairTally) -> None:
        self.rows += other.rows
        self.counts.update(other.counts)
        self.models |= other.models

    def summary(self) -> PairwiseSummary:
        counts = self.counts
        pairs, decided = counts["pairs"], counts["first"] + counts["second"]
        names = next(iter(self.models)) if len(self.models) == 1 else (None, None)
        return PairwiseSummary(
            pairs=pairs, model_a=names[0], model_b=names[1],
            winner={"A": counts["winner_A"], "tie": counts["winner_tie"], "B": counts["winner_B"]},
            a_win_rate=round((counts["winner_A"] + counts["winner_tie"] / 2) / pairs, 4)
            if pairs else None,
            position_consistency=proportion(counts["consistent"], pairs),
            # over the games with a winner: 0.5 is a judge without a favourite place
            first_position_win_rate={**proportion(counts["first"], decided),
                                     "game_ties": counts["game_tie"]})


def proportion(hits: int, total: int, level: float = 0.95) -> Proportion:
    """``hits`` of ``total``, their share and its exact (Clopper-Pearson) ``level`` interval,
    scipy's ``binomtest(...).proportion_ci``; the interval is None without a total."""
    interval = None
    if total:
        from scipy.stats import binomtest

        ci = binomtest(hits, total).proportion_ci(confidence_level=level)
        interval = [round(float(ci.low), 4), round(float(ci.high), 4)]
    return {"hits": hits, "of": total, "rate": round(hits / total, 4) if total else None,
            "interval": interval}


# The pairwise format's words for the statuses whose general line speaks of a score.
_PAIRWISE_NOTES = {Status.MISSING_CONTEXT: "one of the two answers is empty: not judged, no winner"}


def format_summary(summary: Summary) -> str:
    """The short table printed after a run."""
    lines = [f"{'rows':<22}{summary.rows:>8}"]
    pairwise = summary.pairwise
    notes = {**EXPLANATIONS, **_PAIRWISE_NOTES} if pairwise is not UNSET else EXPLANATIONS
    for status, count in summary.statuses.items():
        if count or status == Status.OK:
            note = notes.get(Status(status))
            lines.append(f"  {status:<20}{count:>8}" + (f"   {note}" if note else ""))
            if status == Status.OK and summary.flagged is not UNSET:
                lines += _flag_lines(summary.flagged)
    if pairwise is not UNSET:
        return "\n".join(lines + _pairwise_lines(pairwise))
    if summary.score_model is not UNSET:
        return "\n".join(lines + _score_model_lines(summary.score_model))
    return "\n".join(lines + _score_lines(summary))


def _score_model_lines(graded: ScoreModelSummary) -> list[str]:
    """A score_model grader's lines: its mean result and, with a pass threshold, the passes."""
    lines = [f"{'mean result (ok rows)':<22}{graded.mean_result:>8}"]
    if graded.pass_rate is not None:
        lines.append(f"{'passed':<22}{graded.passed:>8} of {graded.judged} ({graded.pass_rate:.0%})")
    return lines


def _score_lines(summary: Summary) -> list[str]:
    """The 0-5 score's lines: the mean, the histogram, and where the judge's arithmetic differs."""
    mean = summary.mean_score
    lines = [f"{'mean score (ok rows)':<22}{f'{mean:.2f}' if isinstance(mean, float) else '-':>8}"]
    histogram = summary.histogram if summary.histogram is not UNSET else {}
    lines.append(f"{'histogram':<22}" + "  ".join(f"{k}:{v}" for k, v in histogram.items()))
    dis = summary.judge_disagreement
    if dis is not UNSET and dis.rows:
        lines.append(f"{'judge != recompute':<22}{dis.disagree:>8} of {dis.rows} ok rows "
                     f"({dis.rate:.0%}): the judge's own arithmetic, kept as model_score")
    return lines


def _flag_lines(flagged: Flagged) -> list[str]:
    """Under ``ok``: the ok rows a reader should check before trusting their score."""
    if not flagged.rows:
        return []
    counts = {flag: getattr(flagged, flag) for flag in FLAGS}  # Flagged's fields of FLAGS
    kinds = ", ".join(f"{counts[flag]} {flag}" for flag in FLAGS if counts[flag])
    lines = [f"    {'ok, flagged':<18}{flagged.rows:>8}   {kinds}: look before trusting the score"]
    if flagged.no_quote_found:
        lines.append(f"    {'ok, no quote found':<18}{flagged.no_quote_found:>8}   every quote the "
                     "judge gave is absent from the answer: the items may be invented")
    return lines


def _share(part: Proportion, what: str) -> str:
    if not part["of"]:
        return f"{'-':>8}"
    ci = f", 95% CI {i[0]:.0%}-{i[1]:.0%}" if (i := part["interval"]) else ""
    return f"{part['hits']:>8} of {part['of']} {what} ({part['rate']:.0%}{ci})"


def _pairwise_lines(pairwise: PairwiseSummary) -> list[str]:
    """The pairwise format's lines: winners, position consistency, first-position wins."""
    winner = pairwise.winner
    a, b = pairwise.model_a, pairwise.model_b
    names = f" (A: {a}, B: {b})" if a or b else ""
    rate = pairwise.a_win_rate
    return [
        f"{'pairs judged':<22}{pairwise.pairs:>8}   both orders judged",
        f"{'A / tie / B':<22}{winner['A']:>8} / {winner['tie']} / {winner['B']}{names}",
        f"{'A win rate':<22}{'-' if rate is None else f'{rate:.2f}':>8}   (wins + ties / 2) / pairs",
        f"{'position consistency':<22}" + _share(pairwise.position_consistency, "pairs")
        + ": the verdict survives the swap",
        f"{'first-position wins':<22}" + _share(pairwise.first_position_win_rate, "games")
        + ": 50% is no favourite place"]
