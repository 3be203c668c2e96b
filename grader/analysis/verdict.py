"""The verdict on a judge from its controls (:mod:`grader.run.controls`): did it score each
sampled reference, given as the answer, above a fluent wrong answer and above a non-answer?

Pure: scores in, a :class:`JudgeCheck` out (the summary's ``judge_check``), and the words
the terminal prints. scipy (the sign test, its interval) is imported inside the function.

The verdict, one of :data:`VERDICTS` (docs/judging.md, "Can I trust this judge?"):

- ``informative``: the reference scored above both controls on at least
  :data:`INFORMATIVE_SHARE` of the references, and both sign tests reject at the look's level;
- ``weak``: both sign tests reject, but the share is lower;
- ``no signal``: otherwise (a judge that gives every answer the same labels ties every pair),
  or stopped early because it scored the reference above both controls too rarely for a
  judge that reads the answers;
- ``too few``: fewer than :data:`MIN_REFERENCES` references with all three controls scored
  (no sign test on so few can reach p < 0.05).

A rubric of a single item still tells the reference (its item present) from a wrong answer
(absent): the verdict is given, and ``coarse`` says that every score was all or nothing.

**Sequential** (:func:`sequential_verdict`, :func:`looks`): the sampled references are graded
in groups, in the sample's hash order (a random order), and the verdict is looked at after
each group: after 3 references (for futility only), then 6, 12, 24 and all of them. At a
look the run stops with ``informative`` when both sign tests reject at that look's level
and the share reaches :data:`INFORMATIVE_SHARE` (``weak`` waits for the last look); with
``no signal`` when the reference scored above both controls so rarely that a judge doing so
on :data:`INFORMATIVE_SHARE` of the references would score that low with probability at
most the look's futility level; else it grades the next group. The levels are spent by
Bonferroni's inequality, which holds whatever the ties and the discreteness: the efficacy
levels sum to :data:`ALPHA` (a judge with no signal is called informative or weak with
probability at most 5 %), the futility levels to 5 % (a judge that scores the reference
above both on 80 % of the references is stopped as ``no signal`` with probability at most
5 %). A futility stop may come before :data:`MIN_REFERENCES` references: it rests on the
binomial bound, not on the sign tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

#: The verdicts, best first.
VERDICTS = ("informative", "weak", "no signal", "too few")
#: The share of references scored above both controls an informative judge reaches.
INFORMATIVE_SHARE = 0.8
#: The sign tests' level.
ALPHA = 0.05
#: The fewest references with all three controls scored that can give a verdict: a one-sided
#: sign test on 4 pairs, all won, gives p = 1/16 > 0.05.
MIN_REFERENCES = 5
#: The looks before the last, each (references graded by then, the sign tests' level, the
#: futility level): the first a futility look only (a judge blind to the answers ties the
#: first 3 references most of the time, and one that scores the reference above both on
#: 80 % of them shows 0 of 3 with probability 0.008); at 6, 6 of 6 untied pairs won is
#: p = 1/64, the level. The last look (all the sample) gets what is left of ALPHA and gives
#: the verdict whatever it is. The levels: 0 + 1/64 + 2 x 0.005 < ALPHA for the sign
#: tests, 0.01 + 0.02 + 2 x 0.01 = 0.05 for futility.
EARLY_LOOKS = ((3, 0.0, 0.01), (6, 1 / 64, 0.02), (12, 0.005, 0.01), (24, 0.005, 0.01))
#: The references graded before the first look.
FIRST_LOOK = EARLY_LOOKS[0][0]
#: A sample this size or smaller is checked in one look, at ALPHA: all at once.
ONE_LOOK = 6
#: The two comparisons, by control kind (grader.judge.perturb.CONTROL_KINDS), as the terminal
#: words them.
COMPARED = {"wrong": "a wrong answer", "non_answer": "a non-answer"}

_ADVICE = "use a larger judge (a 7B+ instruct model) and run again"


@dataclass(frozen=True)
class ControlScores:
    """One sampled reference's three control scores (None: that control got no score) and
    the number of items its answers were marked against (None: no list of items given before
    the answers, as the itemized and seed formats have)."""

    reference: float | None
    wrong: float | None
    non_answer: float | None
    items: int | None = None

    @property
    def scores(self) -> tuple[float, float, float] | None:
        """The reference's, the wrong answer's and the non-answer's scores; None unless all
        three were scored."""
        if self.reference is None or self.wrong is None or self.non_answer is None:
            return None
        return self.reference, self.wrong, self.non_answer


class Comparison(msgspec.Struct):
    """The reference against one control: its ``above``/``tied``/``below`` counts, the share
    above with its 95 % interval, and the one-sided sign test's p-value (ties dropped)."""

    above: int
    tied: int
    below: int
    share_above: float | None
    ci95: list[float] | None
    p_value: float


class Share(msgspec.Struct):
    """``count`` references of those scored, as a share with its 95 % interval."""

    count: int
    share: float | None
    ci95: list[float] | None


class MeanScores(msgspec.Struct):
    reference: float | None
    wrong: float | None
    non_answer: float | None


class Thresholds(msgspec.Struct):
    informative_share: float
    p_value: float
    min_references: int


class Look(msgspec.Struct, frozen=True):
    """One look of the sequential check: after ``references`` references are graded (counted
    from the first), the sign tests' level ``alpha`` and the futility level ``beta`` (None: the
    last look, which gives the verdict whatever it is)."""

    references: int
    alpha: float
    beta: float | None


class Sequential(msgspec.Struct):
    """How the sequential check ended: the references ``used`` of those ``sampled``, why it
    ``stopped`` (``signal``, ``no_signal``, ``all``; ``open`` for a rescore's check that the
    recomputed scores leave open, which has no look), and the looks."""

    sampled: int
    used: int
    stopped: str
    looks: list[Look] | UnsetType = UNSET
    look: int | UnsetType = UNSET
    alpha: float | UnsetType = UNSET
    beta: float | None | UnsetType = UNSET
    futility_p: float | None | UnsetType = UNSET


class ControlsRun(msgspec.Struct):
    """The controls' run (added by :mod:`grader.run.controls`): the references asked for, the
    controls file (None: in memory), its rows (0: none graded) and the rows resumed."""

    requested: int | None
    file: str | None
    rows: int
    resumed_rows: int


class FirstJudge(msgspec.Struct):
    """A judge panel's check is its first judge's: that judge's name and model."""

    name: str
    model: str


class JudgeCheck(msgspec.Struct):
    """The verdict on a judge from its controls (:func:`judge_verdict`); the fields in the
    order the summary's ``judge_check`` has its keys, the last four only where set."""

    verdict: str
    reason: str | None
    references: int
    scored: int
    rows_without_reference: int
    wrong: Comparison
    non_answer: Comparison
    above_both: Share
    p_value: float
    mean_scores: MeanScores
    single_item_rubrics: int
    coarse: bool
    thresholds: Thresholds
    sequential: Sequential | UnsetType = UNSET
    distinct_references: int | None | UnsetType = UNSET
    controls: ControlsRun | UnsetType = UNSET
    panel_judge: FirstJudge | UnsetType = UNSET


def stored_check(summary: Mapping[str, Any], path: Path) -> JudgeCheck | None:
    """The ``judge_check`` of a summary file read back (:func:`grader.io.results.read_summary`'s
    object, from ``path``); None where it has none.

    Raises :class:`grader.io.results.SummaryError` where it is not a judge check."""
    try:
        return msgspec.convert(summary.get("judge_check"), JudgeCheck | None)
    except msgspec.ValidationError as exc:
        from grader.io.results import SummaryError

        raise SummaryError(f"{path}: judge_check: {exc}") from None


def looks(sampled: int) -> list[Look]:
    """The looks of a check on ``sampled`` references: each of :data:`EARLY_LOOKS` below
    ``sampled``, then after all of them. The efficacy levels sum to :data:`ALPHA`
    (Bonferroni); a sample of :data:`ONE_LOOK` or fewer is one look at :data:`ALPHA`, as a
    check all at once."""
    if sampled <= ONE_LOOK:
        return [Look(sampled, ALPHA, None)]
    early = [Look(n, alpha, beta) for n, alpha, beta in EARLY_LOOKS if n < sampled]
    return [*early, Look(sampled, ALPHA - sum(look.alpha for look in early), None)]


def sequential_verdict(controls: Sequence[ControlScores], sampled: int, *,
                       without_reference: int = 0) -> JudgeCheck | None:
    """The verdict of the sequential check once the first ``len(controls)`` of ``sampled``
    references are graded (in the sample's order), or None: it is still open, and the next
    group of references is needed.

    Each look up to ``len(controls)`` is taken in turn (:func:`looks`): the first that stops
    gives the verdict, judged on its references only, with ``sequential`` saying how many of
    the sample were used and why it stopped: ``signal`` (informative: both sign tests
    rejected at the look's level and the share reached :data:`INFORMATIVE_SHARE`),
    ``no_signal`` (the futility bound), or ``all`` (the last look).
    """
    plan = looks(sampled)
    planned = [Look(n.references, round(n.alpha, 6), n.beta) for n in plan]
    for index, look in enumerate(plan):
        if look.references > len(controls):
            return None
        check = judge_verdict(controls[:look.references], without_reference=without_reference,
                              alpha=look.alpha)
        stopped, futility = None, None
        if look.beta is None:
            stopped = "all"
        elif check.verdict == "informative":
            # a weak verdict does not stop early: on more references its share may reach
            # 80 % (a judge above both on 90 % shows 9 of 12 a quarter of the time)
            stopped = "signal"
        elif check.scored >= FIRST_LOOK:
            futility = _below_informative(check.above_both.count, check.scored)
            if futility <= look.beta:
                stopped = "no_signal"
                check.verdict, check.reason = "no signal", None
        if stopped is not None:
            check.sequential = Sequential(
                sampled, look.references, stopped, planned, index + 1, planned[index].alpha,
                look.beta, None if futility is None else round(futility, 6))
            return check
    return None


def _below_informative(count: int, scored: int) -> float:
    """P(at most ``count`` of ``scored`` references above both controls) for a judge that
    scores the reference above both on :data:`INFORMATIVE_SHARE` of them: the futility
    bound's p-value."""
    from scipy.stats import binom

    return float(binom.cdf(count, scored, INFORMATIVE_SHARE))


def judge_verdict(controls: Sequence[ControlScores], *, without_reference: int = 0,
                  alpha: float = ALPHA) -> JudgeCheck:
    """The verdict on a judge from its controls' scores, all judged at once, as the summary's
    ``judge_check`` (:func:`sequential_verdict` judges each look so).

    Args:
        controls: one per sampled reference.
        without_reference: rows of the data that have no reference (no control possible).
        alpha: the sign tests' level (:data:`ALPHA`; a sequential look's own, lower).

    Returns the :class:`JudgeCheck`: ``verdict`` (one of :data:`VERDICTS`), ``reason`` (for
    ``too few``: ``references``), ``references`` (sampled), ``scored`` (all three controls
    scored), per comparison (``wrong``, ``non_answer``) the reference's ``above`` / ``tied`` /
    ``below`` counts, ``share_above`` with its 95 % interval and the one-sided sign test's
    ``p_value`` (ties dropped); ``above_both`` (count, share, interval); ``p_value`` (the larger
    of the two); ``mean_scores``; ``single_item_rubrics`` and ``coarse`` (every scored
    reference's rubric had a single item: all-or-nothing scores); ``rows_without_reference``;
    ``thresholds``.
    """
    scored = [s for c in controls if (s := c.scores) is not None]
    n = len(scored)
    wrong, non_answer = (_compare([(s[0], s[i]) for s in scored]) for i in (1, 2))
    both = sum(reference > max(w, na) for reference, w, na in scored)
    means = [round(sum(s[i] for s in scored) / n, 4) if scored else None for i in range(3)]
    single, coarse = _single_items(controls, n)
    check = JudgeCheck(
        verdict="", reason=None, references=len(controls), scored=n,
        rows_without_reference=without_reference, wrong=wrong, non_answer=non_answer,
        above_both=Share(both, *_share(both, n)), p_value=max(wrong.p_value, non_answer.p_value),
        mean_scores=MeanScores(*means), single_item_rubrics=single, coarse=coarse,
        thresholds=Thresholds(INFORMATIVE_SHARE, alpha, MIN_REFERENCES))
    check.verdict, check.reason = _verdict(check, alpha)
    return check


def _single_items(controls: Sequence[ControlScores], scored: int) -> tuple[int, bool]:
    """The scored references whose rubric had a single item, and whether every one had: one
    item still tells the reference (present) from a wrong answer (absent), so the check is
    judged, and said to be coarse."""
    sizes = [c.items for c in controls if c.scores is not None and c.items is not None]
    coarse = bool(sizes) and len(sizes) == scored and all(size <= 1 for size in sizes)
    return sum(size <= 1 for size in sizes), coarse


def _compare(pairs: list[tuple[float, float]]) -> Comparison:
    """The reference's score against a control's, over the scored references."""
    above = sum(reference > control for reference, control in pairs)
    below = sum(reference < control for reference, control in pairs)
    return Comparison(above, len(pairs) - above - below, below, *_share(above, len(pairs)),
                      _sign_test(above, below))


def _verdict(check: JudgeCheck, alpha: float) -> tuple[str, str | None]:
    if check.scored < MIN_REFERENCES:
        return "too few", "references"
    if check.p_value > alpha:  # rejected at p <= alpha: 6 of 6 at the first look is 1/64
        return "no signal", None
    if (check.above_both.share or 0.0) >= INFORMATIVE_SHARE:
        return "informative", None
    return "weak", None


def _sign_test(above: int, below: int) -> float:
    """One-sided sign test, ties dropped: P(at least ``above`` wins of ``above + below``) when
    the reference were no likelier to score higher than lower."""
    if above + below == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(above, above + below, 0.5, alternative="greater").pvalue)


def _share(count: int, total: int) -> tuple[float | None, list[float] | None]:
    """``count`` of ``total`` as a share with its exact (Clopper-Pearson) 95 % interval."""
    if total == 0:
        return None, None
    from scipy.stats import binomtest

    interval = binomtest(count, total).proportion_ci(confidence_level=0.95)
    return round(count / total, 4), [round(float(interval.low), 4), round(float(interval.high), 4)]


def format_verdict(check: JudgeCheck) -> str:
    """The verdict in words a new user understands: a headline, then the counts, and how many
    references the sequential check used and why it stopped."""
    scored = check.scored
    lines = [f"judge check: {check.verdict.upper()} - {_headline(check)}"]
    if scored:
        for c, words in _compared(check):
            lines.append(f"  reference vs {words}: above {c.above}, tied {c.tied}, "
                         f"below {c.below} of {scored} (sign test {_p(c.p_value)})")
        means = check.mean_scores
        lines.append(f"  mean score: reference {means.reference:.2f}, wrong answer "
                     f"{means.wrong:.2f}, non-answer {means.non_answer:.2f}")
    if check.sequential:
        lines.append(f"  {_stopped(check, check.sequential)}")
    if check.panel_judge:
        lines.append(f"  a judge panel: this check is of its first judge, {check.panel_judge.name} "
                     f"({check.panel_judge.model}), whose controls file is beside its results; "
                     "the others are compared with it in the panel's agreement")
    if check.coarse:
        lines.append(f"  every one of the {scored} rubrics has a single item, so each score is "
                     "all or nothing (that item present or not): coarse, but enough to tell the "
                     "reference from a wrong answer")
    unscored = check.references - scored
    graded = check.controls.rows if check.controls else 1  # 0: no control graded, no file
    if unscored and graded:
        lines.append(f"  {unscored} of {check.references} references had a control without "
                     "a score (see its status in the controls file): left out")
    without = check.rows_without_reference
    if without:
        lines.append(f"  {without} {'row has' if without == 1 else 'rows have'} no reference: "
                     "no control is possible for " + ("it" if without == 1 else "them"))
    return "\n".join(lines)


def _stopped(check: JudgeCheck, sequential: Sequential) -> str:
    """How many of the sampled references the sequential check used, and why it stopped."""
    used, sampled = sequential.used, sequential.sampled
    if sequential.stopped == "open":
        return (f"the rescored controls leave the sequential check open after {used} of "
                f"{sampled} sampled references: judged on those at once")
    if sequential.stopped == "signal":
        why = (f"both sign tests rejected at this look's level ({_level(sequential.alpha)}) and "
               f"the share reached {INFORMATIVE_SHARE:.0%}")
    elif sequential.stopped == "no_signal":
        why = (f"the reference scored above both controls on only {check.above_both.count} of "
               f"{check.scored}, which a judge that does so on {INFORMATIVE_SHARE:.0%} of "
               f"references would show with probability {_level(sequential.futility_p)} (at "
               f"most {sequential.beta:g})")
    else:
        planned = sequential.looks or []
        if len(planned) == 1:
            return f"all {sampled} sampled references used, in one look (sign tests at p <= 0.05)"
        earlier = ", ".join(str(look.references) for look in planned[:-1])
        return (f"all {sampled} sampled references used: the looks after {earlier} left the "
                f"verdict open (sign tests at this last look's level, {_level(sequential.alpha)})")
    return (f"stopped after {used} of {sampled} sampled references: {why}, so the rest were "
            "not graded")


def _level(value: float | None | UnsetType) -> str:
    assert isinstance(value, float), "a look that stopped has its levels"
    return f"{value:.2g}" if value >= 0.001 else f"{value:.1e}"


def _too_few(check: JudgeCheck) -> str:
    """Why there is no verdict: too few references asked for, in the data, or scored."""
    requested = check.controls.requested if check.controls else None
    if requested is not None and requested < MIN_REFERENCES:
        distinct = check.distinct_references
        has = f" (the data has {distinct} distinct references)" if isinstance(distinct, int) else ""
        why = (f"--controls {requested} asks for fewer references than the {MIN_REFERENCES} a "
               f"verdict needs{has}")
    elif check.references < MIN_REFERENCES:
        why = (f"the data has {check.references} distinct references to check the judge on "
               f"(a verdict needs {MIN_REFERENCES})")
    else:
        why = (f"only {check.scored} of {check.references} references had all three controls "
               f"scored (a verdict needs {MIN_REFERENCES})")
    return f"{why}: no verdict on this judge"


def _headline(check: JudgeCheck) -> str:
    verdict, scored, both = check.verdict, check.scored, check.above_both
    if verdict == "too few":
        return _too_few(check)
    interval = both.ci95 or [0.0, 0.0]
    above_both = (f"the judge scored the reference above both a wrong answer and a non-answer "
                  f"on {both.count} of {scored} references ({both.share or 0.0:.0%}, 95% "
                  f"interval {interval[0]:.0%}-{interval[1]:.0%})")
    if verdict == "informative":
        return f"{above_both}: its scores follow what the answers say"
    if verdict == "weak":
        return (f"{above_both}: better than chance, but its scores follow what the answers say "
                f"only in part; read its scores with care, or {_ADVICE}")
    # the comparison that failed: the wrong answer's where it did
    c, words = _compared(check)[0 if check.wrong.p_value > check.thresholds.p_value else 1]
    same = c.tied * 2 >= scored
    return (f"on {scored} references the judge scored the reference above {words} "
            f"{c.above} times, tied {c.tied}, below {c.below}: "
            + ("it gives the same scores whatever the answer says" if same else
               f"no more often than chance would give (sign test {_p(c.p_value)})")
            + f". Its scores do not show what the answers say: {_ADVICE}")


def _compared(check: JudgeCheck) -> list[tuple[Comparison, str]]:
    """The two comparisons, each with its words (:data:`COMPARED`)."""
    return [(check.wrong, COMPARED["wrong"]), (check.non_answer, COMPARED["non_answer"])]


def _p(value: float) -> str:
    return "p < 0.001" if value < 0.001 else f"p = {value:.3g}"


#: --fail-on's verdict words (the CLI's spelling) and the verdicts each one fails on: ``weak``
#: fails on a weak verdict or worse.
FAIL_ON = {"weak": ("weak", "no signal"), "no-signal": ("no signal",), "too-few": ("too few",)}
