"""The verdict on a judge from its controls (:mod:`grader.run.controls`): did it score each
sampled reference, given as the answer, above a fluent wrong answer and above a non-answer?

Pure: scores in, a JSON-ready dict out (the summary's ``judge_check``), and the words the
terminal prints. scipy (the sign test, its interval) is imported inside the function.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
    def scored(self) -> bool:
        return None not in (self.reference, self.wrong, self.non_answer)


@dataclass(frozen=True)
class Look:
    """One look of the sequential check: after ``references`` references are graded (counted
    from the first), the sign tests' level ``alpha`` and the futility level ``beta`` (None: the
    last look, which gives the verdict whatever it is)."""

    references: int
    alpha: float
    beta: float | None


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
                       without_reference: int = 0) -> dict[str, Any] | None:
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
    for index, look in enumerate(plan):
        if look.references > len(controls):
            return None
        used = controls[:look.references]
        check = judge_verdict(used, without_reference=without_reference, alpha=look.alpha)
        stopped, futility = None, None
        if look.beta is None:
            stopped = "all"
        elif check["verdict"] == "informative":
            # a weak verdict does not stop early: on more references its share may reach
            # 80 % (a judge above both on 90 % shows 9 of 12 a quarter of the time)
            stopped = "signal"
        elif check["scored"] >= FIRST_LOOK:
            futility = _below_informative(check["above_both"]["count"], check["scored"])
            if futility <= look.beta:
                stopped = "no_signal"
                check["verdict"], check["reason"] = "no signal", None
        if stopped is None:
            continue
        check["sequential"] = {
            "sampled": sampled, "used": look.references, "stopped": stopped,
            "looks": [{"references": n.references, "alpha": round(n.alpha, 6),
                       "beta": n.beta} for n in plan],
            "look": index + 1, "alpha": round(look.alpha, 6), "beta": look.beta,
            "futility_p": None if futility is None else round(futility, 6),
        }
        return check
    return None


def _below_informative(count: int, scored: int) -> float:
    """P(at most ``count`` of ``scored`` references above both controls) for a judge that
    scores the reference above both on :data:`INFORMATIVE_SHARE` of them: the futility
    bound's p-value."""
    from scipy.stats import binom

    return float(binom.cdf(count, scored, INFORMATIVE_SHARE))


def judge_verdict(controls: Sequence[ControlScores], *, without_reference: int = 0,
                  alpha: float = ALPHA) -> dict[str, Any]:
    """The verdict on a judge from its controls' scores, all judged at once, as the summary's
    ``judge_check`` (:func:`sequential_verdict` calls it at each look).

    Args:
        controls: one per sampled reference.
        without_reference: rows of the data that have no reference (no control possible).
        alpha: the sign tests' level (:data:`ALPHA`; a sequential look's own, lower).

    Returns a JSON-ready dict: ``verdict`` (one of :data:`VERDICTS`), ``reason`` (for ``too
    few``: ``references`` or ``rubric_items``), ``references`` (sampled), ``scored`` (all
    three controls scored), per comparison (``wrong``, ``non_answer``) the reference's
    ``above`` / ``tied`` / ``below`` counts, ``share_above`` with its 95 % interval and the
    one-sided sign test's ``p_value`` (ties dropped); ``above_both`` (count, share, interval);
    ``p_value`` (the larger of the two); ``mean_scores``; ``single_item_rubrics`` and
    ``coarse`` (every scored reference's rubric had a single item: all-or-nothing scores);
    ``rows_without_reference``; ``thresholds``.
    """
    scored = [c for c in controls if c.scored]
    check: dict[str, Any] = {
        "verdict": None,
        "reason": None,
        "references": len(controls),
        "scored": len(scored),
        "rows_without_reference": without_reference,
    }
    p_values = []
    for kind in COMPARED:
        above = sum(c.reference > getattr(c, kind) for c in scored)
        below = sum(c.reference < getattr(c, kind) for c in scored)
        share = _share(above, len(scored))
        comparison = {"above": above, "tied": len(scored) - above - below, "below": below,
                      "share_above": share["share"], "ci95": share["ci95"],
                      "p_value": _sign_test(above, below)}
        p_values.append(comparison["p_value"])
        check[kind] = comparison
    both = sum(c.reference > c.wrong and c.reference > c.non_answer  # type: ignore[operator]
               for c in scored)
    check["above_both"] = {"count": both, **_share(both, len(scored))}
    check["p_value"] = max(p_values)
    check["mean_scores"] = {
        kind: (round(sum(getattr(c, kind) for c in scored) / len(scored), 4) if scored else None)
        for kind in ("reference", *COMPARED)
    }
    sizes = [c.items for c in scored if c.items is not None]
    check["single_item_rubrics"] = sum(size <= 1 for size in sizes)
    # one item still tells the reference (present) from a wrong answer (absent): judged, and
    # said to be coarse
    check["coarse"] = bool(sizes) and len(sizes) == len(scored) and all(s <= 1 for s in sizes)
    check["thresholds"] = {"informative_share": INFORMATIVE_SHARE, "p_value": alpha,
                           "min_references": MIN_REFERENCES}
    check["verdict"], check["reason"] = _verdict(check, alpha)
    return check


def _verdict(check: dict[str, Any], alpha: float) -> tuple[str, str | None]:
    if check["scored"] < MIN_REFERENCES:
        return "too few", "references"
    if check["p_value"] > alpha:  # rejected at p <= alpha: 6 of 6 at the first look is 1/64
        return "no signal", None
    if check["above_both"]["share"] >= INFORMATIVE_SHARE:
        return "informative", None
    return "weak", None


def _sign_test(above: int, below: int) -> float:
    """One-sided sign test, ties dropped: P(at least ``above`` wins of ``above + below``) when
    the reference were no likelier to score higher than lower."""
    if above + below == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(above, above + below, 0.5, alternative="greater").pvalue)


def _share(count: int, total: int) -> dict[str, Any]:
    """``count`` of ``total`` as a share with its exact (Clopper-Pearson) 95 % interval."""
    if total == 0:
        return {"share": None, "ci95": None}
    from scipy.stats import binomtest

    interval = binomtest(count, total).proportion_ci(confidence_level=0.95)
    return {"share": round(count / total, 4),
            "ci95": [round(float(interval.low), 4), round(float(interval.high), 4)]}


def format_verdict(check: dict[str, Any]) -> str:
    """The verdict in words a new user understands: a headline, then the counts, and how many
    references the sequential check used and why it stopped."""
    verdict, scored = check["verdict"], check["scored"]
    lines = [f"judge check: {verdict.upper()} - {_headline(check)}"]
    if scored:
        for kind, words in COMPARED.items():
            c = check[kind]
            lines.append(f"  reference vs {words}: above {c['above']}, tied {c['tied']}, "
                         f"below {c['below']} of {scored} (sign test {_p(c['p_value'])})")
        means = check["mean_scores"]
        lines.append(f"  mean score: reference {means['reference']:.2f}, wrong answer "
                     f"{means['wrong']:.2f}, non-answer {means['non_answer']:.2f}")
    sequential = check.get("sequential")
    if sequential:
        lines.append(f"  {_stopped(check, sequential)}")
    panel = check.get("panel_judge")
    if panel:
        lines.append(f"  a judge panel: this check is of its first judge, {panel['name']} "
                     f"({panel['model']}), whose controls file is beside its results; the "
                     "others are compared with it in the panel's agreement")
    if check.get("coarse"):
        lines.append(f"  every one of the {scored} rubrics has a single item, so each score is "
                     "all or nothing (that item present or not): coarse, but enough to tell the "
                     "reference from a wrong answer")
    unscored = check["references"] - scored
    graded = (check.get("controls") or {}).get("rows", 1)  # 0: no control graded, no file
    if unscored and graded:
        lines.append(f"  {unscored} of {check['references']} references had a control without "
                     "a score (see its status in the controls file): left out")
    without = check["rows_without_reference"]
    if without:
        lines.append(f"  {without} {'row has' if without == 1 else 'rows have'} no reference: "
                     "no control is possible for " + ("it" if without == 1 else "them"))
    return "\n".join(lines)


def _stopped(check: dict[str, Any], sequential: dict[str, Any]) -> str:
    """How many of the sampled references the sequential check used, and why it stopped."""
    used, sampled = sequential["used"], sequential["sampled"]
    if sequential["stopped"] == "signal":
        return (f"stopped after {used} of {sampled} sampled references: both sign tests "
                f"rejected at this look's level ({_level(sequential['alpha'])}) and the share "
                f"reached {INFORMATIVE_SHARE:.0%}, so the rest were not graded")
    if sequential["stopped"] == "no_signal":
        both = check["above_both"]["count"]
        return (f"stopped after {used} of {sampled} sampled references: the reference scored "
                f"above both controls on only {both} of {check['scored']}, which a judge that "
                f"does so on {INFORMATIVE_SHARE:.0%} of references would show with probability "
                f"{_level(sequential['futility_p'])} (at most {sequential['beta']:g}), so the "
                "rest were not graded")
    if len(sequential["looks"]) == 1:
        return f"all {sampled} sampled references used, in one look (sign tests at p <= 0.05)"
    earlier = ", ".join(str(look["references"]) for look in sequential["looks"][:-1])
    return (f"all {sampled} sampled references used: the looks after {earlier} left the verdict "
            f"open (sign tests at this last look's level, {_level(sequential['alpha'])})")


def _level(value: float) -> str:
    return f"{value:.2g}" if value >= 0.001 else f"{value:.1e}"


def _headline(check: dict[str, Any]) -> str:
    verdict, scored, both = check["verdict"], check["scored"], check["above_both"]
    controls = check.get("controls") or {}
    requested, distinct = controls.get("requested"), check.get("distinct_references")
    if verdict == "too few" and requested is not None and requested < MIN_REFERENCES:
        has = ("" if distinct is None else
               f" (the data has {distinct} distinct references)")
        return (f"--controls {requested} asks for fewer references than the {MIN_REFERENCES} a "
                f"verdict needs{has}: no verdict on this judge")
    if verdict == "too few" and check["references"] < MIN_REFERENCES:
        return (f"the data has {check['references']} distinct references to check the judge on "
                f"(a verdict needs {MIN_REFERENCES}): no verdict on this judge")
    if verdict == "too few":
        return (f"only {scored} of {check['references']} references had all three controls "
                f"scored (a verdict needs {MIN_REFERENCES}): no verdict on this judge")
    interval = both["ci95"]
    above_both = (f"the judge scored the reference above both a wrong answer and a non-answer "
                  f"on {both['count']} of {scored} references ({both['share']:.0%}, 95% interval "
                  f"{interval[0]:.0%}-{interval[1]:.0%})")
    if verdict == "informative":
        return f"{above_both}: its scores follow what the answers say"
    if verdict == "weak":
        return (f"{above_both}: better than chance, but its scores follow what the answers say "
                f"only in part; read its scores with care, or {_ADVICE}")
    # the comparison that failed: the wrong answer's where it did
    alpha = check["thresholds"]["p_value"]
    kind = "wrong" if check["wrong"]["p_value"] > alpha else "non_answer"
    c = check[kind]
    same = c["tied"] * 2 >= scored
    return (f"on {scored} references the judge scored the reference above {COMPARED[kind]} "
            f"{c['above']} times, tied {c['tied']}, below {c['below']}: "
            + ("it gives the same scores whatever the answer says" if same else
               f"no more often than chance would give (sign test {_p(c['p_value'])})")
            + f". Its scores do not show what the answers say: {_ADVICE}")


def _p(value: float) -> str:
    return "p < 0.001" if value < 0.001 else f"p = {value:.3g}"


#: --fail-on's verdict words (the CLI's spelling) and the verdicts each one fails on: ``weak``
#: fails on a weak verdict or worse.
FAIL_ON = {"weak": ("weak", "no signal"), "no-signal": ("no signal",), "too-few": ("too few",)}
