"""One self-contained HTML page about a results file: summary, charts, groups, worst rows.

The page works offline and alone: no scripts, no links, no fonts or styles from elsewhere;
charts are PNGs made with matplotlib and embedded as ``data:`` URIs. The page is rendered from
the Jinja2 templates in ``templates/`` with autoescape on, so every string from the results
(ids, errors, the judge's rationale and checklist, raw output, the manifest) is HTML-escaped:
results hold model output, which is never markup.

The counts (statuses, the score histogram and mean, judge vs recompute, score_model results)
are :class:`grader.analysis.summary.Tally`'s, the same as the summary printed after a run;
this module keeps only what the page adds: groups, the rows it lists, the charts.
"""

from __future__ import annotations

import base64
import heapq
import io
import itertools
import json
import math
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from grader.analysis.summary import Tally
from grader.io.results import (
    SummaryError,
    read_records,
    read_summary,
    summary_path,
    write_atomic,
)
from grader.errors import GraderError
from grader.judge.records import Record
from grader.status import EXPLANATIONS, ZERO_SCORE, Status, in_status_order

# The failed-rows section lists at most this many rows (in file order); the status table
# still counts every one. A run with thousands of engine errors needs the table, not a wall.
FAILED_ROWS_SHOWN = 200
# Long judge text is cut in the page (never in the results file).
RAW_OUTPUT_CHARS = 4000
RAW_OUTPUT_INLINE = 120  # shorter judge text is shown as it is, longer behind a click
# More groups than this get a table but no chart: the bars would be unreadable.
GROUP_CHART_LIMIT = 40

class ReportError(GraderError, ValueError):
    """A report that cannot be made from its inputs (a ``--group-by`` column nowhere)."""


NO_GROUP = "(none)"
NOT_IN_DATASET = "(not in dataset)"
NO_STATUS = "(none)"

_GREEN, _AMBER, _RED, _GREY, _BLUE = "#3a8f5c", "#d9a441", "#c8553d", "#8c8c8c", "#4a72b0"
_KNOWN = frozenset(str(s) for s in Status)
_ZERO = frozenset(str(s) for s in ZERO_SCORE)


@dataclass
class _Row:
    """What the page shows of one record (the rest of it is dropped while streaming)."""

    line: int
    id: Any
    status: str
    score: Any
    model_score: Any
    score_exact: Any
    error: Any
    rationale: list[Any]
    checklist: list[Any]
    counts_text: str
    raw_output: str | None
    group: str | None
    result: float | None = None
    passed: bool | None = None
    spread: dict[str, Any] | None = None
    samples: list[dict[str, Any]] | None = None
    confidence: dict[str, Any] | None = None  # --confidence: p_score, interval, score_expected
    items: list[str] | None = None  # rubric and itemized formats: each item with its label


def _item_lines(items: Any) -> list[str] | None:
    """``[present] category: item`` per item of a rubric or itemized record (another tool's
    record: whatever is not that shape is left out)."""
    if not isinstance(items, dict):
        return None
    lines = []
    for category in ("facts", "conclusions", "terms"):
        entries = items.get(category)
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("present"), bool):
                mark = "present" if entry["present"] else "absent"
                lines.append(f"[{mark}] {category[:-1]}: {entry.get('item')}")
    return lines or None


class _Bounded:
    """The ``limit`` smallest entries by key, kept in a heap while streaming."""

    def __init__(self, limit: int):
        self.limit = max(0, limit)
        self._heap: list[tuple[Any, _Row]] = []

    def add(self, key: tuple, row: _Row) -> None:
        if self.limit == 0:
            return
        # Max-heap on the key (negated): the root is the entry to drop first. Keys end with
        # the line number, so two entries never compare their rows.
        entry = (tuple(-k for k in key), row)
        if len(self._heap) < self.limit:
            heapq.heappush(self._heap, entry)
        elif entry[0] > self._heap[0][0]:
            heapq.heapreplace(self._heap, entry)

    def sorted(self) -> list[_Row]:
        return [row for _, row in sorted(self._heap, key=lambda e: e[0], reverse=True)]


def _number(value: Any) -> float | None:
    """A finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _group_value(value: Any) -> str:
    if value is None or value == "":
        return NO_GROUP
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False, sort_keys=True)
    return str(value)


def _dataset_groups(data: str | Path, column: str, id_column: str | None) -> dict[Any, str] | None:
    """id -> the column's value from the dataset, or None when no row has the column."""
    from grader.io.dataset import read_items

    items = read_items(str(data), id_column=id_column)
    if not any(column in item.fields for item in items):
        return None
    lookup = {item.id: _group_value(item.fields.get(column)) for item in items}
    # Results keep the dataset's ids, but a results file made elsewhere may hold them as text.
    lookup.update({str(k): v for k, v in list(lookup.items()) if str(k) not in lookup})
    return lookup


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _counted(record: Record) -> Record:
    """The record as :class:`Tally` counts it, whoever wrote the file.

    grader's own records pass as they are (the same counts as their summary). Another tool's
    may lack a status (counted as ``(none)``), hold a score grader never writes (not an int
    0-5: shown on the row's card, not counted) or an ok row with neither score nor result
    (counted as ok, nothing else): the page shows such a file rather than failing on it.
    """
    status = record.get("status")
    status = NO_STATUS if status is None else str(status)
    if status != Status.OK:
        return {"status": status}
    score = record.get("score")
    if type(score) is int and 0 <= score <= 5:
        model_score = record.get("model_score")
        return {
            "status": status,
            "score": score,
            "model_score": model_score if _number(model_score) is not None else None,
        }
    result = _number(record.get("result"))
    if result is not None and _number(score) is None:
        # An OpenAI score_model grader's record: a numeric result, no 0-5 score; passed is
        # true or false against the grader's threshold, null when it has none.
        passed = record.get("passed")
        passed = passed if isinstance(passed, bool) else None
        return {"status": status, "result": result, "passed": passed}
    return {"status": status, "score": None}


def _scored(tally: Tally) -> int:
    """ok rows with a 0-5 score: each is in the histogram once (score_model results are not)."""
    return sum(tally.histogram.values())


def _mean_score(tally: Tally) -> float | None:
    scored = _scored(tally)
    return float(tally.total / scored) if scored else None


class _Listing:
    """What the page adds to the counts, gathered in the same pass: groups (a Tally each),
    the judge-vs-recompute matrix, the rows it lists and the points of the result chart."""

    def __init__(self, group_by: str | None, lookup: dict[Any, str] | None, worst: int):
        self.group_by, self.lookup = group_by, lookup
        self.groups: dict[str, Tally] = {}
        self.group_in_records = False
        self.matrix: Counter[tuple[int, int]] = Counter()
        self.points: list[tuple[float, bool | None]] = []  # score_model: (result, passed)
        self.lowest = _Bounded(worst)
        self.lowest_results = _Bounded(worst)
        self.widest = _Bounded(worst)
        self.sampled = 0
        # --confidence: the rows least sure of their own score, and those whose could not be read
        self.least_confident = _Bounded(worst)
        self.confident = self.unconfident = 0
        self.failed: list[_Row] = []
        self.failed_total = 0

    def _group(self, record: Record) -> str | None:
        if self.group_by is None:
            return None
        if self.lookup is not None:
            item_id = record["id"]
            if not isinstance(item_id, (str, int)):
                item_id = str(item_id)  # a results file from elsewhere; never a crash here
            return self.lookup.get(item_id, self.lookup.get(str(item_id), NOT_IN_DATASET))
        self.group_in_records = self.group_in_records or self.group_by in record
        return _group_value(record.get(self.group_by))

    def add(self, line: int, record: Record, counted: Record) -> None:
        """One record, and what :func:`_counted` made of it for the tallies."""
        grade = record.get("grade")
        if not isinstance(grade, dict):
            grade = {}
        raw = record.get("raw_output")
        row = _Row(
            line=line,
            id=record["id"],
            status=counted["status"],
            score=record.get("score"),
            model_score=record.get("model_score"),
            score_exact=record.get("score_exact"),
            error=record.get("error"),
            rationale=_as_list(grade.get("rationale")),
            checklist=_as_list(record.get("checklist")),
            counts_text=_counts_text(record.get("counts")),
            raw_output=raw if isinstance(raw, str) else None,
            group=self._group(record),
            items=_item_lines(record.get("items")),
        )
        if counted.get("score") is not None:
            score, model_score = counted["score"], counted["model_score"]
            if model_score in range(6):
                self.matrix[int(model_score), score] += 1
            exact = _number(row.score_exact)
            self.lowest.add((float(score), exact if exact is not None else float(score), line), row)
        elif "result" in counted:
            row.result, row.passed = counted["result"], counted["passed"]
            self.points.append((row.result, row.passed))
            self.lowest_results.add((row.result, line), row)
        else:
            self.failed_total += 1
            if len(self.failed) < FAILED_ROWS_SHOWN:
                self.failed.append(row)
        if "confidence" in record and counted.get("score") is not None:
            self._add_confidence(line, record, row)
        spread = record.get("spread")
        width = _number(spread.get("range")) if isinstance(spread, dict) else None
        if width is not None:
            self.sampled += 1
            row.spread, row.samples = spread, _samples(record.get("samples"))
            self.widest.add((-width, line), row)
        if row.group is not None:
            self.groups.setdefault(row.group, Tally()).add((counted,))


    def _add_confidence(self, line: int, record: Record, row: _Row) -> None:
        confidence = record.get("confidence")
        if not isinstance(confidence, dict):
            confidence = {}
        p_score = _number(confidence.get("p_score"))
        if p_score is None:
            self.unconfident += 1
            return
        self.confident += 1
        interval = _as_list(confidence.get("interval"))
        row.confidence = {
            "p_score": p_score,
            "interval": interval if len(interval) == 2 else [],
            "score_expected": _number(confidence.get("score_expected")),
        }
        self.least_confident.add((p_score, line), row)


def _samples(samples: Any) -> list[dict[str, Any]]:
    """Each sample's value, and its status where it is not ok."""
    return [
        {
            "score": sample.get("score", sample.get("result")),
            "status": None if sample.get("status") in (None, Status.OK) else sample["status"],
        }
        for sample in _as_list(samples)
        if isinstance(sample, dict)
    ]


def _counts_text(counts: Any) -> str:
    if not isinstance(counts, dict):
        return ""
    parts = []
    for name in ("facts", "conclusions", "terms"):
        part = counts.get(name)
        if isinstance(part, dict):
            parts.append(f"{name} {part.get('matched')}/{part.get('total')}")
    if "organization" in counts:
        parts.append(f"organization {counts['organization']}")
    return ", ".join(parts)


def write_report(
    results: Path,
    output: Path,
    *,
    group_by: str | None = None,
    data: str | None = None,
    worst: int = 20,
    id_column: str | None = None,
) -> dict[str, Any]:
    """Write one self-contained HTML report about a results file.

    Args:
        results: a results JSONL file (``grader grade`` / ``grader rescore`` output).
        output: the HTML file to write (replaced atomically).
        group_by: a column to break the results down by (the model under test, a category):
            taken from ``data`` when given and it has the column, else from the records.
        data: the graded dataset, joined to the records by id, for ``group_by``.
        worst: how many of the lowest-scoring rows (and most-disagreeing samples) to list.
        id_column: the dataset's id column, as given to ``grader grade --id-column``.

    Returns:
        ``{"output", "rows", "groups", "charts", "bytes"}``: what was written.

    Raises:
        ReportError: ``group_by`` is neither in the dataset nor in any record.
        grader.io.results.ResultsError: the results file is not valid JSONL records.
        grader.io.dataset.DatasetError: ``data`` cannot be read.
    """
    results, output = Path(results), Path(output)
    lookup: dict[Any, str] | None = None
    if group_by is not None and data is not None:
        lookup = _dataset_groups(data, group_by, id_column)
    tally, listing = Tally(), _Listing(group_by, lookup, worst)
    for line, record in read_records(results):
        counted = _counted(record)
        tally.add((counted,))
        listing.add(line, record, counted)
    if group_by is not None and lookup is None and not listing.group_in_records:
        where = f"in the dataset {data} or " if data is not None else ""
        hint = "" if data is not None else " (pass the dataset to join a column from it)"
        raise ReportError(f"no column {group_by!r} {where}in the records of {results}{hint}")

    charts = _Charts()
    text = _render(results, tally, listing, charts)
    # A lone surrogate in a record (read back from its \\udXXX escape) is shown as that escape,
    # as the results file holds it: strict UTF-8 would refuse the whole page.
    encoded = text.encode("utf-8", "backslashreplace")
    write_atomic(output, encoded)
    return {
        "output": str(output),
        "rows": tally.rows,
        "groups": len(listing.groups) if group_by is not None else None,
        "charts": charts.count,
        "bytes": len(encoded),
    }


# --- the page -------------------------------------------------------------------------------


@dataclass
class _Section:
    """One ``<section>``: its body is ``templates/sections/<anchor>.html.j2`` given ``view``."""

    anchor: str
    title: str
    view: dict[str, Any]


@cache
def _environment() -> Any:
    # Our own templates, next to this module; autoescape on for every one of them. (Not the
    # sandbox of grader/judge: that one renders prompts; these templates take data only.)
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("grader.analysis", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["fmt"] = _fmt
    env.filters["kind"] = _kind
    env.globals |= {"raw_chars": RAW_OUTPUT_CHARS, "raw_inline": RAW_OUTPUT_INLINE}
    return env


def _render(results: Path, tally: Tally, listing: _Listing, charts: _Charts) -> str:
    stored = _read_summary(results)
    meta = [str(results)]
    if isinstance(stored, dict) and isinstance(stored.get("run"), dict):
        meta.append(_run_line(stored["run"]))
    scores = bool(_scored(tally) or not tally.results)  # a 0-5 histogram (maybe empty)
    statuses = [s for s in in_status_order(tally.statuses) if tally.statuses[s] or s == Status.OK]
    sections = [_Section("summary", "Summary", _summary(results, tally, listing, stored))]
    if scores:
        sections.append(_Section("scores", "Scores of ok rows", _scores(tally, charts)))
    if tally.results:
        view = _score_model(tally, listing, charts)
        sections.append(_Section("results", "score_model results", view))
    sections.append(_Section("statuses", "Statuses", _statuses(tally, statuses, charts)))
    if tally.compared:
        sections.append(
            _Section("matrix", "Judge score vs recomputed score", _matrix(listing.matrix))
        )
    if listing.group_by is not None:
        view = _groups(tally, listing, statuses, charts, scores=scores)
        sections.append(_Section("groups", f"By {listing.group_by}", view))
    if listing.sampled:
        view = {"rows": listing.widest.sorted(), "sampled": listing.sampled}
        sections.append(_Section("samples", "Rows where samples disagree most", view))
    if listing.confident or listing.unconfident:
        view = {"rows": listing.least_confident.sorted(), "confident": listing.confident,
                "unconfident": listing.unconfident}
        sections.append(_Section("confidence", "Low-confidence rows", view))
    worst = listing.lowest.sorted() if _scored(tally) else listing.lowest_results.sorted()
    if worst:
        view = {"rows": worst, "value": "score" if _scored(tally) else "result"}
        sections.append(_Section("worst", f"Lowest-scoring rows ({len(worst)})", view))
    if listing.failed_total:
        view = {"rows": listing.failed, "total": listing.failed_total}
        sections.append(_Section("failed", f"Failed rows ({listing.failed_total})", view))
    sections.append(_Section("manifest", "Run manifest", _manifest(results, stored)))
    title = f"grader report: {results.name}"
    template = _environment().get_template("report.html.j2")
    return template.render(title=title, meta=meta, sections=sections)


def _summary(results: Path, tally: Tally, listing: _Listing, stored: Any) -> dict[str, Any]:
    facts: list[tuple[str, Any]] = [("rows", tally.rows), ("graded (ok)", tally.ok)]
    if _scored(tally) or not tally.results:
        facts.append(("mean score (ok rows)", _fmt(_mean_score(tally), 2)))
    if tally.results:
        mean_result = sum(tally.results) / len(tally.results)
        facts.append(("mean result (score_model)", f"{mean_result:.4g}"))
        if tally.verdicts:
            passed, judged = sum(tally.verdicts), len(tally.verdicts)
            facts.append(("passed (score_model)", f"{passed} of {judged} ({passed / judged:.0%})"))
    if tally.compared:
        share = f"{tally.disagreements / tally.compared:.0%}"
        facts.append(
            (
                "judge score ≠ recomputed",
                f"{tally.disagreements} of {tally.compared} ok rows ({share})",
            )
        )
    if listing.sampled:
        facts.append(("rows with samples", listing.sampled))
    warning = None
    counted = stored.get("rows") if isinstance(stored, dict) else None
    if isinstance(counted, int) and counted != tally.rows:
        warning = (
            f"{summary_path(results).name} counts {counted} rows; "
            f"the results file holds {tally.rows}."
        )
    return {"facts": facts, "warning": warning}


def _scores(tally: Tally, charts: _Charts) -> dict[str, Any]:
    counts = [tally.histogram[str(score)] for score in range(6)]
    return {"chart": charts.score_histogram(counts) if _scored(tally) else None, "counts": counts}


def _score_model(tally: Tally, listing: _Listing, charts: _Charts) -> dict[str, Any]:
    passed, judged = sum(tally.verdicts), len(tally.verdicts)
    return {
        "passed": passed,
        "judged": judged,
        "pass_rate": f"{passed / judged:.1%}" if judged else None,
        "chart": charts.result_histogram(listing.points),
    }


def _statuses(tally: Tally, statuses: list[str], charts: _Charts) -> dict[str, Any]:
    """Counts per status; when only score_model results are graded, ok means a result."""
    results = not _scored(tally) and bool(tally.results)
    rows = []
    for status in statuses:
        count = tally.statuses[status]
        kind = _kind(status)
        note = EXPLANATIONS.get(Status(status), "") if status in _KNOWN else ""
        if status == Status.OK:
            note = "graded" if results else "graded and recomputed"
        rows.append(
            {
                "status": status,
                "count": count,
                "share": f"{count / tally.rows:.0%}" if tally.rows else "–",
                "score": {"ok": "result" if results else "0–5", "zero": "0", "null": "null"}.get(
                    kind, "?"
                ),
                "note": note,
            }
        )
    counts = [tally.statuses[s] for s in statuses]
    return {"rows": rows, "chart": charts.statuses(statuses, counts)}


def _matrix(matrix: Counter) -> dict[str, Any]:
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


def _groups(
    tally: Tally, listing: _Listing, statuses: list[str], charts: _Charts, *, scores: bool
) -> dict[str, Any]:
    groups = listing.groups
    rows = []
    for name in sorted(groups):
        group = groups[name]
        mean = _mean_score(group)
        results, verdicts = group.results, group.verdicts
        rows.append(
            {
                "name": name,
                "rows": group.rows,
                "mean_score": f"{mean:.2f}" if mean is not None else "–",
                "pass_rate": f"{sum(verdicts) / len(verdicts):.0%}" if verdicts else "–",
                "mean_result": f"{sum(results) / len(results):.3g}" if results else "–",
                "statuses": [group.statuses[s] for s in statuses],
            }
        )
    chart = None
    if 0 < len(groups) <= GROUP_CHART_LIMIT and any(_scored(g) for g in groups.values()):
        chart = charts.group_means(groups)
    return {
        "column": listing.group_by,
        "source": "the dataset" if listing.lookup is not None else "the records",
        "rows": tally.rows,
        "unmatched": groups[NOT_IN_DATASET].rows if NOT_IN_DATASET in groups else 0,
        "groups": rows,
        "statuses": statuses,
        "scores": scores,
        "results": bool(tally.results),
        "chart": chart,
    }


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


def _run_line(run: dict[str, Any]) -> str:
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


def _manifest(results: Path, stored: Any) -> dict[str, Any]:
    view: dict[str, Any] = {"name": summary_path(results).name}
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


def _kind(status: str) -> str:
    """The CSS class of a status: ok, zero (scored 0 by rule) or null (no score)."""
    if status == Status.OK:
        return "ok"
    if status in _ZERO:
        return "zero"
    if status in _KNOWN:
        return "null"
    return "other"


# --- charts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Chart:
    """One PNG for an ``<img>``: its CSS size and a ``data:`` URI made here, never from results."""

    alt: str
    width: int
    height: int
    src: str


class _Charts:
    """PNG charts as ``data:`` URIs. matplotlib is imported on first use."""

    # Rendered at twice the CSS size so they stay sharp on high-density screens.
    SCALE = 2
    DPI = 96

    def __init__(self) -> None:
        self.count = 0

    def _figure(self, width: float, height: float) -> Any:
        # Figure, not pyplot: no global state, no backend switch; savefig renders with Agg.
        from matplotlib.figure import Figure

        figure = Figure(figsize=(width, height), dpi=self.DPI)
        return figure, figure.add_subplot()

    def _img(self, figure: Any, alt: str) -> _Chart:
        width, height = figure.get_size_inches()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=self.DPI * self.SCALE, metadata={"Software": None})
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        self.count += 1
        return _Chart(
            alt, round(width * self.DPI), round(height * self.DPI), f"data:image/png;base64,{data}"
        )

    @staticmethod
    def _style(axes: Any) -> None:
        for side in ("top", "right"):
            axes.spines[side].set_visible(False)
        axes.tick_params(labelsize=10)

    @staticmethod
    def _label_bars(axes: Any, bars: Any, horizontal: bool = False) -> None:
        labels = [f"{bar.get_width() if horizontal else bar.get_height():g}" for bar in bars]
        axes.bar_label(bars, labels=labels, padding=3, fontsize=9)

    def score_histogram(self, counts: list[int]) -> _Chart:
        """``counts``: ok rows per score 0-5."""
        from matplotlib.ticker import MaxNLocator

        figure, axes = self._figure(5.2, 3.0)
        bars = axes.bar(range(6), counts, color=_BLUE, width=0.7)
        self._label_bars(axes, bars)
        axes.set_xticks(range(6))
        axes.set_xlabel("recomputed score")
        axes.set_ylabel("ok rows")
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylim(0, max(counts) * 1.18 + 0.5)
        self._style(axes)
        figure.tight_layout()
        return self._img(figure, "histogram of recomputed scores 0-5 over ok rows")

    def result_histogram(self, values: list[tuple[float, bool | None]]) -> _Chart:
        from matplotlib.ticker import MaxNLocator

        figure, axes = self._figure(6.0, 3.0)
        kinds = [
            (label, color, [v for v, p in values if p is flag])
            for label, color, flag in (
                ("passed", _GREEN, True),
                ("failed", _RED, False),
                ("no threshold", _BLUE, None),
            )
        ]
        kinds = [k for k in kinds if k[2]]
        distinct = sorted({v for v, _ in values})
        if len(distinct) <= 12:
            # Few distinct results (integer grades): one bar each rather than arbitrary bins.
            step = min((b - a for a, b in itertools.pairwise(distinct)), default=1.0)
            bottom = [0] * len(distinct)
            for label, color, chosen in kinds:
                counts = [chosen.count(v) for v in distinct]
                axes.bar(
                    distinct, counts, width=step * 0.7, bottom=bottom, color=color, label=label
                )
                bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
            axes.set_xticks(distinct)
        else:
            axes.hist(
                [k[2] for k in kinds],
                bins=20,
                stacked=True,
                color=[k[1] for k in kinds],
                label=[k[0] for k in kinds],
            )
        axes.set_xlabel("result")
        axes.set_ylabel("rows")
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
        if len(kinds) > 1 or kinds[0][0] != "no threshold":
            axes.legend(frameon=False, fontsize=9)
        self._style(axes)
        figure.tight_layout()
        return self._img(figure, "histogram of score_model results, passed and failed")

    def statuses(self, order: list[str], counts: list[int]) -> _Chart:
        colors = [{"ok": _GREEN, "zero": _AMBER, "null": _RED}.get(_kind(s), _GREY) for s in order]
        figure, axes = self._figure(4.6, 0.5 + 0.42 * len(order))
        bars = axes.barh(range(len(order)), counts, color=colors, height=0.65)
        self._label_bars(axes, bars, horizontal=True)
        axes.set_yticks(range(len(order)), labels=order)
        axes.invert_yaxis()
        axes.set_xlim(0, max(counts + [1]) * 1.15)
        axes.set_xlabel("rows")
        self._style(axes)
        figure.tight_layout()
        return self._img(figure, "rows per status")

    def group_means(self, groups: dict[str, Tally]) -> _Chart:
        names = [n for n in sorted(groups) if _scored(groups[n])]
        means = [_mean_score(groups[n]) for n in names]
        labels = [n if len(n) <= 28 else n[:27] + "…" for n in names]
        figure, axes = self._figure(7.0, 0.6 + 0.36 * len(names))
        bars = axes.barh(range(len(names)), means, color=_BLUE, height=0.6)
        axes.bar_label(
            bars,
            labels=[f"{m:.2f}  (n={_scored(groups[n])})" for m, n in zip(means, names, strict=True)],
            padding=3,
            fontsize=9,
        )
        axes.set_yticks(range(len(names)), labels=labels)
        axes.invert_yaxis()
        axes.set_xlim(0, 5.9)
        axes.set_xticks(range(6))
        axes.set_xlabel("mean recomputed score (ok rows)")
        self._style(axes)
        figure.tight_layout()
        return self._img(figure, "mean score per group")
