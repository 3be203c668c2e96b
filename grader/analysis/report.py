"""One self-contained HTML page about a results file: summary, charts, groups, worst rows.

The page works offline and alone: no scripts, no links, no fonts or styles from elsewhere;
charts are PNGs made with matplotlib and embedded as ``data:`` URIs. Every string from the
results (ids, errors, the judge's rationale and checklist, raw output, the manifest) is
HTML-escaped: results hold model output, which is never markup.
"""

from __future__ import annotations

import base64
import heapq
import html
import io
import itertools
import json
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from grader.judge.records import Record
from grader.io.results import SummaryError, read_records, read_summary, summary_path
from grader.status import EXPLANATIONS, ZERO_SCORE, Status

# The failed-rows section lists at most this many rows (in file order); the status table
# still counts every one. A run with thousands of engine errors needs the table, not a wall.
FAILED_ROWS_SHOWN = 200
# Long judge text is cut in the page (never in the results file).
RAW_OUTPUT_CHARS = 4000
RAW_OUTPUT_INLINE = 120  # shorter judge text is shown as it is, longer behind a click
# More groups than this get a table but no chart: the bars would be unreadable.
GROUP_CHART_LIMIT = 40

NO_GROUP = "(none)"
NOT_IN_DATASET = "(not in dataset)"

_GREEN, _AMBER, _RED, _GREY, _BLUE = "#3a8f5c", "#d9a441", "#c8553d", "#8c8c8c", "#4a72b0"


@dataclass
class _Row:
    """What the page needs of one record (the rest of it is dropped while streaming)."""

    line: int
    id: Any
    status: str
    score: Any
    model_score: Any
    score_exact: Any
    error: Any
    rationale: list[Any]
    checklist: list[Any]
    counts: Any
    raw_output: Any
    group: str | None
    result: Any = None
    passed: Any = None
    spread: dict[str, Any] | None = None
    samples: list[Any] | None = None


@dataclass
class _Group:
    rows: int = 0
    scored: int = 0  # ok rows with a 0-5 score (not score_model results)
    total: Fraction = Fraction(0)
    statuses: Counter = field(default_factory=Counter)
    results: int = 0  # score_model rows with a result
    result_sum: float = 0.0
    passed: int = 0
    thresholded: int = 0  # rows whose record says passed true or false (a threshold was set)


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


class _Tally:
    """Everything the page shows, gathered in one pass over the records."""

    def __init__(self, group_by: str | None, lookup: dict[Any, str] | None, worst: int):
        self.group_by, self.lookup = group_by, lookup
        self.rows = 0
        self.statuses: Counter[str] = Counter()
        self.histogram: Counter[int] = Counter({s: 0 for s in range(6)})
        self.total = Fraction(0)
        self.scored = self.compared = self.disagree = 0  # ok rows with a score; judge checks
        self.matrix: Counter[tuple[int, int]] = Counter()
        self.groups: dict[str, _Group] = defaultdict(_Group)
        self.group_in_records = False
        self.results: list[tuple[float, bool | None]] = []  # score_model: (result, passed)
        self.lowest = _Bounded(worst)
        self.lowest_results = _Bounded(worst)
        self.widest = _Bounded(worst)
        self.sampled = 0
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

    def add(self, line: int, record: Record) -> None:
        self.rows += 1
        status = record.get("status")
        status = str(status) if status is not None else None
        score, result = record.get("score"), _number(record.get("result"))
        grade = record.get("grade") if isinstance(record.get("grade"), dict) else {}
        row = _Row(
            line=line,
            id=record["id"],
            status=status if status is not None else "(none)",
            score=score,
            model_score=record.get("model_score"),
            score_exact=record.get("score_exact"),
            error=record.get("error"),
            rationale=_as_list(grade.get("rationale")),
            checklist=_as_list(record.get("checklist")),
            counts=record.get("counts"),
            raw_output=record.get("raw_output"),
            group=self._group(record),
        )
        self.statuses[row.status] += 1
        scored = status == Status.OK and _number(score) is not None
        if scored:
            self._add_score(row, score)
        if result is not None and _number(score) is None and status in (None, Status.OK):
            # An OpenAI score_model grader's record: a numeric result, no 0-5 score; passed is
            # true or false against the grader's threshold, null when it has none.
            passed = record.get("passed")
            row.result, row.passed = result, passed if isinstance(passed, bool) else None
            self.results.append((result, row.passed))
            self.lowest_results.add((result, line), row)
        elif not scored:
            self.failed_total += 1
            if len(self.failed) < FAILED_ROWS_SHOWN:
                self.failed.append(row)
        spread = record.get("spread")
        if isinstance(spread, dict) and _number(spread.get("range")) is not None:
            self.sampled += 1
            row.spread, row.samples = spread, _as_list(record.get("samples"))
            self.widest.add((-_number(spread["range"]), line), row)
        if row.group is not None:
            entry = self.groups[row.group]
            entry.rows += 1
            entry.statuses[row.status] += 1
            if scored:
                entry.scored += 1
                entry.total += Fraction(score)
            if row.result is not None:
                entry.results += 1
                entry.result_sum += row.result
                entry.thresholded += row.passed is not None
                entry.passed += row.passed is True

    def _add_score(self, row: _Row, score: Any) -> None:
        self.scored += 1
        self.total += Fraction(score)
        if isinstance(score, int) and 0 <= score <= 5:
            self.histogram[score] += 1
        model_score = _number(row.model_score)
        if model_score is not None:
            self.compared += 1
            self.disagree += model_score != score
            if isinstance(score, int) and model_score in range(6):
                self.matrix[int(model_score), score] += 1
        exact = _number(row.score_exact)
        self.lowest.add((float(score), exact if exact is not None else float(score), row.line), row)


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
        ValueError: ``group_by`` is neither in the dataset nor in any record.
        grader.io.results.ResultsError: the results file is not valid JSONL records.
        grader.io.dataset.DatasetError: ``data`` cannot be read.
    """
    results, output = Path(results), Path(output)
    lookup: dict[Any, str] | None = None
    if group_by is not None and data is not None:
        lookup = _dataset_groups(data, group_by, id_column)
    tally = _Tally(group_by, lookup, worst)
    for line, record in read_records(results):
        tally.add(line, record)
    if group_by is not None and lookup is None and not tally.group_in_records:
        where = f"in the dataset {data} or " if data is not None else ""
        hint = "" if data is not None else " (pass the dataset to join a column from it)"
        raise ValueError(f"no column {group_by!r} {where}in the records of {results}{hint}")

    charts = _Charts()
    text = _render(results, tally, charts)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(output.name + ".partial")
    # A lone surrogate in a record (read back from its \\udXXX escape) is shown as that escape,
    # as the results file holds it: strict UTF-8 would refuse the whole page.
    encoded = text.encode("utf-8", "backslashreplace")
    partial.write_bytes(encoded)
    os.replace(partial, output)
    return {
        "output": str(output),
        "rows": tally.rows,
        "groups": len(tally.groups) if group_by is not None else None,
        "charts": charts.count,
        "bytes": len(encoded),
    }


def _render(results: Path, tally: _Tally, charts: _Charts) -> str:
    page = _Page(results.name)
    page.add(f"<p class='meta'>{_e(results)}</p>")
    stored = _read_summary(results)
    if isinstance(stored, dict) and isinstance(stored.get("run"), dict):
        page.add(f"<p class='meta'>{_e(_run_line(stored['run']))}</p>")
    page.section("Summary", _summary(tally))
    counted = stored.get("rows") if isinstance(stored, dict) else None
    if isinstance(counted, int) and counted != tally.rows:
        page.add(
            f"<p class='warn'>{_e(summary_path(results).name)} counts {counted} rows; "
            f"the results file holds {tally.rows}.</p>"
        )
    if tally.scored or not tally.results:
        page.section("Scores of ok rows", _scores(tally, charts), anchor="scores")
    if tally.results:
        page.section("score_model results", _score_model(tally, charts), anchor="results")
    only_results = not tally.scored and bool(tally.results)
    table = _status_table(tally.statuses, tally.rows, results=only_results)
    chart = charts.statuses(tally.statuses)
    page.section("Statuses", f"<div class='row'>{chart}{table}</div>", anchor="statuses")
    if tally.compared:
        page.section(
            "Judge score vs recomputed score",
            "<p>ok rows; rows are the judge's own score (<code>model_score</code>, kept for "
            "audit), columns the score recomputed from its counts. Off the diagonal the judge's "
            "arithmetic disagrees with its own counts.</p>" + _matrix_table(tally.matrix),
            anchor="matrix",
        )
    if tally.group_by is not None:
        page.section(f"By {tally.group_by}", _groups(tally, charts), anchor="groups")
    if tally.sampled:
        widest = tally.widest.sorted()
        page.section(
            "Rows where samples disagree most",
            f"<p>{len(widest)} of {tally.sampled} rows with samples, widest score range "
            "first.</p>" + _spread_table(widest),
            anchor="samples",
        )
    worst = tally.lowest.sorted() if tally.scored else tally.lowest_results.sorted()
    if worst:
        page.section(
            f"Lowest-scoring rows ({len(worst)})",
            f"<p>Lowest {'score' if tally.scored else 'result'} first.</p>"
            + "".join(_row_card(r) for r in worst),
            anchor="worst",
        )
    if tally.failed_total:
        shown, total = len(tally.failed), tally.failed_total
        note = (
            f"<p>First {shown} of {total}, in file order.</p>"
            if total > shown
            else "<p>Rows without a judge-derived score (none, or 0 by the seed's rule), "
            "in file order.</p>"
        )
        page.section(
            f"Failed rows ({total})",
            note + "".join(_row_card(r) for r in tally.failed),
            anchor="failed",
        )
    page.section("Run manifest", _manifest(results, stored), anchor="manifest")
    return page.render()


def _summary(tally: _Tally) -> str:
    facts: list[tuple[str, Any]] = [("rows", tally.rows), ("graded (ok)", tally.statuses["ok"])]
    if tally.scored or not tally.results:
        mean = float(tally.total / tally.scored) if tally.scored else None
        facts.append(("mean score (ok rows)", _fmt(mean, 2)))
    if tally.results:
        mean_result = sum(v for v, _ in tally.results) / len(tally.results)
        facts.append(("mean result (score_model)", f"{mean_result:.4g}"))
        verdicts = [p for _, p in tally.results if p is not None]
        if verdicts:
            passed = sum(verdicts)
            share = f"{passed / len(verdicts):.0%}"
            facts.append(("passed (score_model)", f"{passed} of {len(verdicts)} ({share})"))
    if tally.compared:
        share = f"{tally.disagree / tally.compared:.0%}"
        facts.append(
            ("judge score ≠ recomputed", f"{tally.disagree} of {tally.compared} ok rows ({share})")
        )
    if tally.sampled:
        facts.append(("rows with samples", tally.sampled))
    return _kv_table(facts)


def _scores(tally: _Tally, charts: _Charts) -> str:
    if tally.scored:
        chart = charts.score_histogram(tally.histogram)
    else:
        chart = "<p>No ok rows: nothing to plot.</p>"
    heads = "".join(f"<th>{s}</th>" for s in range(6))
    cells = "".join(f"<td>{tally.histogram[s]}</td>" for s in range(6))
    table = (
        f"<table class='hist'><tr><th>score</th>{heads}</tr>"
        f"<tr><th>ok rows</th>{cells}</tr></table>"
    )
    return f"<div class='row'>{chart}{table}</div>"


def _score_model(tally: _Tally, charts: _Charts) -> str:
    verdicts = [p for _, p in tally.results if p is not None]
    if verdicts:
        passed = sum(verdicts)
        text = (
            f"<p class='big'>pass rate <b>{passed / len(verdicts):.1%}</b> "
            f"({passed} of {len(verdicts)} rows with a result)</p>"
        )
    else:
        text = "<p>The grader has no pass threshold: no pass rate.</p>"
    return text + charts.result_histogram(tally.results)


def _groups(tally: _Tally, charts: _Charts) -> str:
    assert tally.group_by is not None
    groups = tally.groups
    source = "the dataset" if tally.lookup is not None else "the records"
    column = f"<code>{_e(tally.group_by)}</code>"
    body = f"<p>{len(groups)} groups of {column}, taken from {source}.</p>"
    unmatched = groups[NOT_IN_DATASET].rows if NOT_IN_DATASET in groups else 0
    if unmatched:
        body += (
            f"<p class='warn'>{unmatched} of {tally.rows} rows have an id that is not in the "
            "dataset (was it graded with another --id-column?).</p>"
        )
    body += _group_table(
        groups,
        tally.group_by,
        tally.statuses,
        scores=bool(tally.scored or not tally.results),
        results=bool(tally.results),
    )
    if 0 < len(groups) <= GROUP_CHART_LIMIT and any(g.scored for g in groups.values()):
        body += charts.group_means(groups)
    return body


# --- HTML -----------------------------------------------------------------------------------

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial,
       sans-serif; color: #222; background: #fafafa; margin: 0; line-height: 1.45; }
main { max-width: 1120px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 26px; margin: 8px 0 2px; }
h2 { font-size: 20px; margin: 36px 0 10px; padding-bottom: 4px; border-bottom: 2px solid #ddd; }
nav { font-size: 14px; margin: 6px 0 0; }
nav a { color: #4a72b0; margin-right: 14px; text-decoration: none; white-space: nowrap; }
.meta { color: #666; font-size: 13px; margin: 0; word-break: break-all; }
table { border-collapse: collapse; font-size: 14px; background: #fff; }
th, td { border: 1px solid #ddd; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; font-weight: 600; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
table.hist td { text-align: right; min-width: 28px; font-variant-numeric: tabular-nums; }
table.matrix td { text-align: center; min-width: 38px; font-variant-numeric: tabular-nums; }
table.matrix td.diag { outline: 2px solid #3a8f5c; outline-offset: -2px; }
table.kv td:first-child { color: #555; white-space: nowrap; }
table.kv td { word-break: break-word; }
.row { display: flex; flex-wrap: wrap; gap: 24px; align-items: flex-start; }
.row img { flex: none; }
.row > table.statuses { flex: 1 1 380px; }
img.chart { max-width: 100%; height: auto; }
.card { background: #fff; border: 1px solid #ddd; border-left: 5px solid #8c8c8c;
        border-radius: 4px; padding: 8px 14px; margin: 10px 0; font-size: 14px; }
.card.ok { border-left-color: #3a8f5c; } .card.zero { border-left-color: #d9a441; }
.card.null { border-left-color: #c8553d; }
.card .head { font-weight: 600; }
.card .head code { font-size: 15px; }
.card ol, .card ul { margin: 2px 0; padding-left: 22px; }
.card .body { display: grid; grid-template-columns: minmax(0, 3fr) minmax(0, 2fr); gap: 0 24px; }
.card .samples { color: #555; }
.card .error { color: #a33; }
.card .label { color: #666; font-size: 12px; text-transform: uppercase; letter-spacing: .04em;
               margin-top: 6px; }
.badge { display: inline-block; padding: 0 8px; border-radius: 10px; font-size: 12px;
         font-weight: 600; color: #fff; background: #8c8c8c; margin-left: 6px; }
.badge.ok { background: #3a8f5c; } .badge.zero { background: #b7862a; }
.badge.null { background: #c8553d; }
.muted { color: #777; }
.warn { color: #a33; font-weight: 600; }
.big { font-size: 18px; }
pre { background: #f4f4f4; padding: 8px; overflow-x: auto; white-space: pre-wrap;
      word-break: break-word; font-size: 12px; max-height: 320px; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
"""


def _e(value: Any) -> str:
    """Any value as escaped HTML text."""
    return html.escape(str(value), quote=True)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return _e(value)


def _kind(status: str) -> str:
    """The CSS class of a status: ok, zero (scored 0 by rule) or null (no score)."""
    if status == Status.OK:
        return "ok"
    if status in {str(s) for s in ZERO_SCORE}:
        return "zero"
    if status in {str(s) for s in Status}:
        return "null"
    return "other"


class _Page:
    def __init__(self, name: str):
        self.name = name
        self.parts: list[str] = []
        self.toc: list[tuple[str, str]] = []

    def add(self, fragment: str) -> None:
        self.parts.append(fragment)

    def section(self, title: str, body: str, *, anchor: str = "") -> None:
        anchor = anchor or title.lower().replace(" ", "-")
        self.toc.append((anchor, title))
        self.parts.append(f"<section id='{_e(anchor)}'><h2>{_e(title)}</h2>{body}</section>")

    def render(self) -> str:
        # Newlines between the links are where the line may wrap (each link is nowrap).
        nav = "\n".join(f"<a href='#{_e(a)}'>{_e(t)}</a>" for a, t in self.toc)
        title = f"grader report: {self.name}"
        return (
            "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{_STYLE}</style></head><body><main>"
            f"<h1>{_e(title)}</h1>"
            + self.parts[0]
            + f"<nav>{nav}</nav>"
            + "".join(self.parts[1:])
            + "</main></body></html>\n"
        )


def _kv_table(pairs: list[tuple[str, Any]]) -> str:
    body = "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in pairs)
    return f"<table class='kv'>{body}</table>"


def _status_order(statuses: Counter) -> list[str]:
    known = [str(s) for s in Status if statuses[str(s)] or s is Status.OK]
    return known + sorted(s for s in statuses if s not in {str(k) for k in Status})


def _status_table(statuses: Counter, rows: int, *, results: bool = False) -> str:
    """Counts per status; ``results``: ok rows hold score_model results, not 0-5 scores."""
    body = ""
    for status in _status_order(statuses):
        count = statuses[status]
        share = f"{count / rows:.0%}" if rows else "–"
        score = {"ok": "result" if results else "0–5", "zero": "0", "null": "null"}.get(
            _kind(status), "?"
        )
        note = EXPLANATIONS.get(Status(status), "") if status in {str(s) for s in Status} else ""
        if status == Status.OK:
            note = "graded" if results else "graded and recomputed"
        body += (
            f"<tr><td><span class='badge {_kind(status)}'>{_e(status)}</span></td>"
            f"<td class='n'>{count}</td><td class='n'>{share}</td><td>{score}</td>"
            f"<td class='muted'>{_e(note)}</td></tr>"
        )
    head = (
        "<tr><th>status</th><th class='n'>rows</th><th class='n'>share</th><th>score</th>"
        "<th>meaning</th></tr>"
    )
    return f"<table class='statuses'>{head}{body}</table>"


def _matrix_table(matrix: Counter) -> str:
    peak = max(matrix.values(), default=0) or 1
    head = "".join(f"<th>{s}</th>" for s in range(6))
    body = ""
    for judge in range(6):
        cells = ""
        for score in range(6):
            count = matrix[judge, score]
            shade = (
                f" style='background: rgba(74,114,176,{0.08 + 0.72 * count / peak:.2f})'"
                if count
                else ""
            )
            diag = " class='diag'" if judge == score else ""
            cells += f"<td{diag}{shade}>{count}</td>"
        body += f"<tr><th>judge {judge}</th>{cells}</tr>"
    return f"<table class='matrix'><tr><th>judge ↓ / recomputed →</th>{head}</tr>{body}</table>"


def _group_table(
    groups: dict[str, _Group], column: str, statuses: Counter, *, scores: bool, results: bool
) -> str:
    order = _status_order(statuses)
    head = (
        f"<tr><th>{_e(column)}</th><th class='n'>rows</th>"
        + ("<th class='n'>mean score</th>" if scores else "")
        + ("<th class='n'>pass rate</th><th class='n'>mean result</th>" if results else "")
        + "".join(f"<th class='n'>{_e(s)}</th>" for s in order)
        + "</tr>"
    )
    body = ""
    for name in sorted(groups):
        entry = groups[name]
        mean = f"{float(entry.total / entry.scored):.2f}" if entry.scored else "–"
        extra = f"<td class='n'>{mean}</td>" if scores else ""
        if results:
            n, t = entry.results, entry.thresholded
            rate = f"{entry.passed / t:.0%}" if t else "–"
            mean_result = f"{entry.result_sum / n:.3g}" if n else "–"
            extra += f"<td class='n'>{rate}</td><td class='n'>{mean_result}</td>"
        body += (
            f"<tr><td>{_e(name)}</td><td class='n'>{entry.rows}</td>{extra}"
            + "".join(f"<td class='n'>{entry.statuses[s]}</td>" for s in order)
            + "</tr>"
        )
    return f"<table class='groups'>{head}{body}</table>"


def _spread_table(rows: list[_Row]) -> str:
    head = (
        "<tr><th>id</th><th>status</th><th class='n'>score</th><th class='n'>range</th>"
        "<th class='n'>min</th><th class='n'>max</th><th class='n'>stdev</th><th>samples</th></tr>"
    )
    body = ""
    for row in rows:
        spread = row.spread or {}
        body += (
            f"<tr><td><code>{_e(row.id)}</code></td>"
            f"<td><span class='badge {_kind(row.status)}'>{_e(row.status)}</span></td>"
            f"<td class='n'>{_fmt(row.score)}</td>"
            + "".join(
                f"<td class='n'>{_fmt(spread.get(k))}</td>"
                for k in ("range", "min", "max", "stdev")
            )
            + f"<td>{_samples_text(row.samples or [])}</td></tr>"
        )
    return f"<table class='spread'>{head}{body}</table>"


def _samples_text(samples: list[Any]) -> str:
    """Each sample's value, and its status where it is not ok: ``4, 3, – (truncated)``."""
    texts = []
    for sample in samples:
        if not isinstance(sample, dict):
            continue
        text = _fmt(sample.get("score", sample.get("result")))
        if sample.get("status") not in (None, Status.OK):
            text += f" <span class='muted'>({_e(sample.get('status'))})</span>"
        texts.append(text)
    return ", ".join(texts)


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


def _row_card(row: _Row) -> str:
    kind = _kind(row.status)
    head = f"<code>{_e(row.id)}</code><span class='badge {kind}'>{_e(row.status)}</span>"
    if row.result is not None:
        verdict = {True: " · passed", False: " · failed"}.get(row.passed, "")
        head += f" &nbsp; result {row.result:.4g}{verdict}"
    else:
        exact = f" ({_fmt(row.score_exact)})" if isinstance(row.score_exact, float) else ""
        head += f" &nbsp; score {_fmt(row.score)}{exact}"
    if row.model_score is not None:
        head += f" · judge said {_fmt(row.model_score)}"
    if row.group is not None:
        head += f" · <span class='muted'>{_e(row.group)}</span>"
    parts = [f"<div class='head'>{head}</div>"]
    if row.error:
        parts.append(f"<div class='error'>{_e(row.error)}</div>")
    if row.samples:
        parts.append(f"<div class='samples'>samples: {_samples_text(row.samples)}</div>")
    counts = _counts_text(row.counts)
    if counts and not row.rationale:
        parts.append(f"<div class='muted'>counts: {_e(counts)}</div>")
    columns = []
    if row.rationale:
        items = "".join(f"<li>{_e(line)}</li>" for line in row.rationale)
        columns.append(f"<div><div class='label'>rationale</div><ol>{items}</ol></div>")
    if row.checklist:
        items = "".join(f"<li>{_e(line)}</li>" for line in row.checklist)
        columns.append(f"<div><div class='label'>checklist</div><ul>{items}</ul></div>")
    if columns:
        parts.append(f"<div class='{'body' if len(columns) == 2 else ''}'>{''.join(columns)}</div>")
    raw = row.raw_output
    if isinstance(raw, str) and raw and not row.rationale and len(raw) <= RAW_OUTPUT_INLINE:
        parts.append(f"<div class='muted'>judge output: <code>{_e(raw)}</code></div>")
    elif isinstance(raw, str) and raw and not row.rationale:
        cut = (
            f"\n[… {len(raw) - RAW_OUTPUT_CHARS} more characters in the results file]"
            if len(raw) > RAW_OUTPUT_CHARS
            else ""
        )
        parts.append(
            f"<details><summary class='muted'>raw judge output ({len(raw)} characters)</summary>"
            f"<pre>{_e(raw[:RAW_OUTPUT_CHARS] + cut)}</pre></details>"
        )
    return f"<div class='card {kind}'>{''.join(parts)}</div>"


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


def _manifest(results: Path, stored: Any) -> str:
    name = summary_path(results).name
    if stored is None:
        return f"<p class='muted'>No {_e(name)} beside the results file.</p>"
    if isinstance(stored, Exception):
        return f"<p class='warn'>{_e(name)} could not be read: {_e(stored)}</p>"
    if not isinstance(stored, dict) or not isinstance(stored.get("run"), dict):
        return f"<p class='muted'>{_e(name)} holds no run manifest.</p>"
    return f"<p class='muted'>From {_e(name)}.</p>" + _kv_table(_flatten(stored["run"]))


# --- charts ---------------------------------------------------------------------------------


class _Charts:
    """PNG charts as ``<img>`` tags with ``data:`` URIs. matplotlib is imported on first use."""

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

    def _img(self, figure: Any, alt: str) -> str:
        width, height = figure.get_size_inches()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=self.DPI * self.SCALE, metadata={"Software": None})
        data = base64.b64encode(buffer.getvalue()).decode("ascii")
        self.count += 1
        return (
            f"<img class='chart' alt='{_e(alt)}' width='{round(width * self.DPI)}' "
            f"height='{round(height * self.DPI)}' src='data:image/png;base64,{data}'>"
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

    def score_histogram(self, histogram: Counter) -> str:
        from matplotlib.ticker import MaxNLocator

        figure, axes = self._figure(5.2, 3.0)
        counts = [histogram[s] for s in range(6)]
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

    def result_histogram(self, values: list[tuple[float, bool | None]]) -> str:
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
                bottom = [b + c for b, c in zip(bottom, counts)]
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

    def statuses(self, statuses: Counter) -> str:
        order = [s for s in _status_order(statuses)]
        counts = [statuses[s] for s in order]
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

    def group_means(self, groups: dict[str, _Group]) -> str:
        names = [n for n in sorted(groups) if groups[n].scored]
        means = [float(groups[n].total / groups[n].scored) for n in names]
        labels = [n if len(n) <= 28 else n[:27] + "…" for n in names]
        figure, axes = self._figure(7.0, 0.6 + 0.36 * len(names))
        bars = axes.barh(range(len(names)), means, color=_BLUE, height=0.6)
        axes.bar_label(
            bars,
            labels=[f"{m:.2f}  (n={groups[n].scored})" for m, n in zip(means, names)],
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
