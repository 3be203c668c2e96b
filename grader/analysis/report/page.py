"""The report's page: one ``<section>`` per part, rendered from the Jinja2 templates in
``grader/analysis/templates/`` with autoescape on, so every string from the results is
HTML-escaped."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from grader.analysis.report.charts import Charts
from grader.analysis.report.listing import (
    KNOWN_STATUSES,
    NOT_IN_DATASET,
    Listing,
    mean_score,
    scored_rows,
    status_kind,
)
from grader.analysis.summary import Tally
from grader.io.results import SummaryError, read_summary, summary_path
from grader.status import EXPLANATIONS, Status, in_status_order

if TYPE_CHECKING:
    import jinja2

# A section's view: what its template reads, nothing read back in Python.
View = dict[str, object]

# Long judge text is cut in the page (never in the results file).
RAW_OUTPUT_CHARS = 4000
RAW_OUTPUT_INLINE = 120  # shorter judge text is shown as it is, longer behind a click
# More groups than this get a table but no chart: the bars would be unreadable.
GROUP_CHART_LIMIT = 40


@dataclass
class _Section:
    """One ``<section>``: its body is ``templates/sections/<anchor>.html.j2`` given ``view``."""

    anchor: str
    title: str
    view: View


def page_environment(package: str) -> jinja2.Environment:
    """The Jinja2 environment of grader's own HTML pages, the templates of ``package``
    (``templates/``): autoescaped, strict. (Not the sandbox of grader/judge: that one renders
    prompts; these take data only.) The report's and the label page's."""
    import jinja2

    return jinja2.Environment(loader=jinja2.PackageLoader(package, "templates"), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True)


@cache
def _environment() -> jinja2.Environment:
    env = page_environment("grader.analysis")
    env.filters["fmt"] = _fmt
    env.filters["kind"] = status_kind
    env.globals |= {"raw_chars": RAW_OUTPUT_CHARS, "raw_inline": RAW_OUTPUT_INLINE}
    return env


def render_page(results: Path, tally: Tally, listing: Listing, charts: Charts,
                audit: tuple[Path, dict[str, Any]] | None = None,
                calibration: dict[str, Any] | None = None) -> str:
    """The report's HTML: the judge check's verdict, the summary, then a section for each
    part the results (and the calibration and audit given) have, the manifest last."""
    stored = _read_summary(results)
    meta = [str(results)]
    if isinstance(stored, dict) and isinstance(stored.get("run"), dict):
        meta.append(_run_line(stored["run"]))
    scores = bool(scored_rows(tally) or not tally.results)  # a 0-5 histogram (maybe empty)
    statuses = [s for s in in_status_order(tally.statuses) if tally.statuses[s] or s == Status.OK]
    sections = [_Section("summary", "Summary", _summary(results, tally, listing, stored))]
    if calibration is not None:
        view = _calibration(calibration, charts)
        sections.append(_Section("calibration", "Calibrated mean human score", view))
    if scores:
        sections.append(_Section("scores", "Scores of ok rows", _scores(tally, charts)))
    if tally.results:
        view = _score_model(tally, listing, charts)
        sections.append(_Section("results", "score_model results", view))
    sections.append(_Section("statuses", "Statuses", _statuses(tally, statuses, charts)))
    if tally.compared:
        view = _matrix(listing.matrix)
        sections.append(_Section("matrix", "Judge score vs recomputed score", view))
    if listing.group_by is not None:
        view = _groups(tally, listing, statuses, charts, scores=scores)
        sections.append(_Section("groups", f"By {listing.group_by}", view))
    sections += _row_sections(tally, listing)
    if audit is not None:
        sections.append(_Section("audit", "Judge audit", _audit(*audit)))
    sections.append(_Section("manifest", "Run manifest", _manifest(results, stored)))
    template = _environment().get_template("report.html.j2")
    return template.render(title=f"grader report: {results.name}", meta=meta,
                           sections=sections, verdict=_verdict(results, stored))


def _row_sections(tally: Tally, listing: Listing) -> list[_Section]:
    """The rows the page lists: where samples disagree, of low confidence, the lowest, the
    failed."""
    sections = []
    if listing.sampled:
        view = {"rows": listing.widest.sorted(), "sampled": listing.sampled}
        sections.append(_Section("samples", "Rows where samples disagree most", view))
    if listing.confident or listing.unconfident:
        view = {"rows": listing.least_confident.sorted(), "confident": listing.confident,
                "unconfident": listing.unconfident}
        sections.append(_Section("confidence", "Low-confidence rows", view))
    worst = listing.lowest.sorted() if scored_rows(tally) else listing.lowest_results.sorted()
    if worst:
        view = {"rows": worst, "value": "score" if scored_rows(tally) else "result"}
        sections.append(_Section("worst", f"Lowest-scoring rows ({len(worst)})", view))
    if listing.failed_total:
        view = {"rows": listing.failed, "total": listing.failed_total}
        sections.append(_Section("failed", f"Failed rows ({listing.failed_total})", view))
    return sections


def _verdict(results: Path, stored: Any) -> View:
    """The judge check's verdict, which the page opens with: a page that showed a mean score
    and no word of a NO SIGNAL the terminal printed would mislead whoever opens only it."""
    from grader.analysis.verdict import format_verdict, stored_check

    check = stored_check(stored, summary_path(results)) if isinstance(stored, dict) else None
    if check is None:
        return {"kind": "none", "headline": "judge check: not in the summary (the run had "
                "--controls 0, or the summary is missing): nothing says how far to trust the "
                "judge's scores", "details": []}
    headline, *details = format_verdict(check).splitlines()
    kind = {"informative": "ok", "weak": "zero"}.get(check.verdict, "null")
    return {"kind": kind, "headline": headline, "details": [line.strip() for line in details]}


def _calibration(result: dict[str, Any], charts: Charts) -> View:
    """agree's calibrated estimates (grader.analysis.agreement.calibrate) as the section's
    view: the three estimates drawn as intervals, and the words beside them."""
    from grader.analysis.calibration import correlation_words

    calibrated, about = result["calibrated"], result["calibration"]

    def interval(value: list[float] | None) -> str:
        return "–" if value is None else f"[{value[0]:.2f}, {value[1]:.2f}]"

    rows_all = calibrated["labeled"] + calibrated["unlabeled"]
    effective = calibrated["effective_labels"]
    estimates = [
        ("judge only", calibrated["judge_only"], f"the judge's scores of {rows_all} rows"),
        ("labels only", calibrated["human_only"], f"{calibrated['labeled']} human labels"),
        ("calibrated (PPI++)", calibrated,
         f"both; as sure as {effective:.0f} labels alone" if effective is not None else "both"),
    ]
    chart = None
    if any(estimate["mean"] is not None for _, estimate, _ in estimates):
        chart = charts.calibration([(name, estimate["mean"], estimate["interval"])
                                    for name, estimate, _ in estimates], "mean human score (0-5)")
    return {"sentence": about["sentences"][0], "chart": chart,
            "rows": [{"name": name, "mean": _fmt(estimate["mean"], 2),
                      "interval": interval(estimate["interval"]), "source": source}
                     for name, estimate, source in estimates],
            "correlation": correlation_words(calibrated["correlation"],
                                             calibrated["correlation_rows"], none="–"),
            "lam": _fmt(calibrated["lambda"], 3), "fallback": calibrated["fallback"],
            "assumption": about["assumption"], "method": about["method"],
            "source": result["human_source"], "column": result["human_column"]}


def _summary(results: Path, tally: Tally, listing: Listing, stored: Any) -> View:
    facts: list[tuple[str, Any]] = [("rows", tally.rows), ("graded (ok)", tally.ok)]
    if scored_rows(tally) or not tally.results:
        facts.append(("mean score (ok rows)", _fmt(mean_score(tally), 2)))
    if tally.results:
        mean_result = sum(tally.results) / len(tally.results)
        facts.append(("mean result (score_model)", f"{mean_result:.4g}"))
        if tally.verdicts:
            passed, judged = sum(tally.verdicts), len(tally.verdicts)
            facts.append(("passed (score_model)", f"{passed} of {judged} ({passed / judged:.0%})"))
    if tally.compared:
        share = f"{tally.disagreements / tally.compared:.0%}"
        facts.append(("judge score ≠ recomputed",
                      f"{tally.disagreements} of {tally.compared} ok rows ({share})"))
    if listing.sampled:
        facts.append(("rows with samples", listing.sampled))
    warning = None
    counted = stored.get("rows") if isinstance(stored, dict) else None
    if isinstance(counted, int) and counted != tally.rows:
        warning = (f"{summary_path(results).name} counts {counted} rows; "
                   f"the results file holds {tally.rows}.")
    return {"facts": facts, "warning": warning}


def _scores(tally: Tally, charts: Charts) -> View:
    counts = [tally.histogram[str(score)] for score in range(6)]
    chart = charts.score_histogram(counts) if scored_rows(tally) else None
    return {"chart": chart, "counts": counts}


def _score_model(tally: Tally, listing: Listing, charts: Charts) -> View:
    passed, judged = sum(tally.verdicts), len(tally.verdicts)
    return {"passed": passed, "judged": judged,
            "pass_rate": f"{passed / judged:.1%}" if judged else None,
            "chart": charts.result_histogram(listing.points)}


def _statuses(tally: Tally, statuses: list[str], charts: Charts) -> View:
    """Counts per status; when only score_model results are graded, ok means a result."""
    results = not scored_rows(tally) and bool(tally.results)
    rows = []
    for status in statuses:
        count = tally.statuses[status]
        kind = status_kind(status)
        note = EXPLANATIONS.get(Status(status), "") if status in KNOWN_STATUSES else ""
        if status == Status.OK:
            note = "graded" if results else "graded and recomputed"
        score = {"ok": "result" if results else "0–5", "zero": "0", "null": "null"}.get(kind, "?")
        rows.append({"status": status, "count": count,
                     "share": f"{count / tally.rows:.0%}" if tally.rows else "–",
                     "score": score, "note": note})
    counts = [tally.statuses[s] for s in statuses]
    return {"rows": rows, "chart": charts.statuses(statuses, counts)}


def _matrix(matrix: Counter[Any]) -> View:
    """Rows of ``(judge score, [(count, background alpha or None) per recomputed score])``."""
    peak = max(matrix.values(), default=0) or 1
    rows = []
    for judge in range(6):
        cells = []
        for score in range(6):
            count = matrix[judge, score]
            cells.append((count, f"{0.08 + 0.72 * count / peak:.2f}" if count else None))
        rows.append((judge, cells))
    return {"rows": rows}


def _groups(tally: Tally, listing: Listing, statuses: list[str], charts: Charts, *,
            scores: bool) -> View:
    groups = listing.groups
    rows = []
    for name in sorted(groups):
        group = groups[name]
        mean = mean_score(group)
        results, verdicts = group.results, group.verdicts
        rows.append({"name": name, "rows": group.rows,
                     "mean_score": f"{mean:.2f}" if mean is not None else "–",
                     "pass_rate": f"{sum(verdicts) / len(verdicts):.0%}" if verdicts else "–",
                     "mean_result": f"{sum(results) / len(results):.3g}" if results else "–",
                     "statuses": [group.statuses[s] for s in statuses]})
    chart = None
    if 0 < len(groups) <= GROUP_CHART_LIMIT and any(scored_rows(g) for g in groups.values()):
        chart = charts.group_means(groups)
    return {"column": listing.group_by,
            "source": "the dataset" if listing.lookup is not None else "the records",
            "rows": tally.rows,
            "unmatched": groups[NOT_IN_DATASET].rows if NOT_IN_DATASET in groups else 0,
            "groups": rows, "statuses": statuses, "scores": scores,
            "results": bool(tally.results), "chart": chart}


def _audit(path: Path, audit: dict[str, Any]) -> View:
    """``grader audit``'s table (grader.analysis.audit), as the terminal shows it."""
    from grader.analysis.audit import headline, left_out, pass_rules, table_rows

    return {"headline": headline(audit), "rows": table_rows(audit),
            "rules": "; ".join(pass_rules(audit)), "source": str(path), "notes": left_out(audit)}


def _read_summary(results: Path) -> Any:
    """The summary beside the results, None, or why it cannot be read (shown on the page)."""
    try:
        return read_summary(results)
    except SummaryError as exc:
        return exc


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        out = []
        for key, inner in value.items():
            out += _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
        out = []
        for index, inner in enumerate(value):
            out += _flatten(inner, f"{prefix}[{index}]")
        return out
    if isinstance(value, (dict, list)):
        return [(prefix, json.dumps(value, ensure_ascii=False))]
    if value is None or isinstance(value, bool):
        return [(prefix, json.dumps(value))]  # null, true, false: as the JSON file says
    return [(prefix, value)]


def _run_line(run: Mapping[str, Any]) -> str:
    """The manifest in one line: model, prompt, sampling, when."""
    model, prompt, sampling = run.get("model"), run.get("prompt"), run.get("sampling")
    parts = []
    if isinstance(model, dict) and model.get("name"):
        parts.append(f"judge {model['name']}")
    elif isinstance(model, str):
        parts.append(f"judge {model}")
    if isinstance(run.get("backend"), str):
        parts.append(run["backend"])
    if isinstance(prompt, dict) and prompt.get("name"):
        parts.append(f"prompt {prompt['name']}")
    if isinstance(sampling, dict):
        parts += [f"{k} {sampling[k]}" for k in ("temperature", "seed", "n") if k in sampling]
    if run.get("finished"):
        parts.append(f"finished {run['finished']}")
    return " · ".join(str(p) for p in parts)


def _manifest(results: Path, stored: Any) -> View:
    view: View = {"name": summary_path(results).name}
    if stored is None:
        return view | {"state": "missing"}
    if isinstance(stored, Exception):
        return view | {"state": "unreadable", "error": str(stored)}
    if not isinstance(stored, dict) or not isinstance(stored.get("run"), dict):
        return view | {"state": "no run"}
    return view | {"state": "run", "pairs": _flatten(stored["run"])}


def _fmt(value: Any, digits: int = 2) -> str:
    """A value as the page shows it: – for none, floats to ``digits`` places."""
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)
