"""The verdict on a judge from its controls (:mod:`grader.run.controls`): did it score each
sampled reference, given as the answer, above a fluent wrong answer and above a non-answer?

Pure: scores in, a JSON-ready dict out (the summary's ``judge_check``), and the words the
terminal prints. scipy (the sign test, its interval) is imported inside the function.

The verdict, one of :data:`VERDICTS` (docs/judging.md, "Can I trust this judge?"):

- ``informative``: the reference scored above both controls on at least
  :data:`INFORMATIVE_SHARE` of the references, and both sign tests give p < :data:`ALPHA`;
- ``weak``: both sign tests give p < :data:`ALPHA`, but the share is lower;
- ``no signal``: otherwise (a judge that gives every answer the same labels ties every pair);
- ``too few``: fewer than :data:`MIN_REFERENCES` references with all three controls scored
  (no sign test on so few can reach p < 0.05), or every sampled reference's list of items has
  a single item (a score then only says whether that one item is present).
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


def judge_verdict(controls: Sequence[ControlScores], *, without_reference: int = 0) -> dict[str, Any]:
    """The verdict on a judge from its controls' scores, as the summary's ``judge_check``.

    Args:
        controls: one per sampled reference.
        without_reference: rows of the data that have no reference (no control possible).

    Returns a JSON-ready dict: ``verdict`` (one of :data:`VERDICTS`), ``reason`` (for ``too
    few``: ``references`` or ``rubric_items``), ``references`` (sampled), ``scored`` (all
    three controls scored), per comparison (``wrong``, ``non_answer``) the reference's
    ``above`` / ``tied`` / ``below`` counts, ``share_above`` with its 95 % interval and the
    one-sided sign test's ``p_value`` (ties dropped); ``above_both`` (count, share, interval);
    ``p_value`` (the larger of the two); ``mean_scores``; ``single_item_rubrics``;
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
    check["thresholds"] = {"informative_share": INFORMATIVE_SHARE, "p_value": ALPHA,
                           "min_references": MIN_REFERENCES}
    check["verdict"], check["reason"] = _verdict(check, sizes)
    return check


def _verdict(check: dict[str, Any], sizes: list[int]) -> tuple[str, str | None]:
    if check["scored"] < MIN_REFERENCES:
        return "too few", "references"
    if sizes and len(sizes) == check["scored"] and all(size <= 1 for size in sizes):
        return "too few", "rubric_items"
    if check["p_value"] >= ALPHA:
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
    """The verdict in words a new user understands: a headline, then the counts."""
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
    unscored = check["references"] - scored
    if unscored:
        lines.append(f"  {unscored} of {check['references']} references had a control without "
                     "a score (see its status in the controls file): left out")
    without = check["rows_without_reference"]
    if without:
        lines.append(f"  {without} {'row has' if without == 1 else 'rows have'} no reference: "
                     "no control is possible for " + ("it" if without == 1 else "them"))
    return "\n".join(lines)


def _headline(check: dict[str, Any]) -> str:
    verdict, scored, both = check["verdict"], check["scored"], check["above_both"]
    if verdict == "too few" and check["reason"] == "rubric_items":
        return (f"every one of the {scored} sampled rubrics has a single item, so a score only "
                "says whether that one item is present: too coarse to tell answers apart. Give "
                "the references more content, or mark them against a richer rubric (--rubric)")
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
    kind = "wrong" if check["wrong"]["p_value"] >= ALPHA else "non_answer"
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
