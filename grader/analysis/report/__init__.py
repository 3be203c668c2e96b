"""One self-contained HTML page about a results file: summary, charts, groups, worst rows.

The page works offline and alone: no scripts, no links, no fonts or styles from elsewhere;
charts are PNGs made with matplotlib and embedded as ``data:`` URIs. The page is rendered from
the Jinja2 templates in ``grader/analysis/templates/`` with autoescape on, so every string from
the results (ids, errors, the judge's rationale and checklist, raw output, the manifest) is
HTML-escaped: results hold model output, which is never markup.

The counts (statuses, the score histogram and mean, judge vs recompute, score_model results)
are :class:`grader.analysis.summary.Tally`'s, the same as the summary printed after a run;
this package keeps only what the page adds: ``listing`` (groups, the rows it lists, in one
streaming pass), ``charts`` (the PNGs) and ``page`` (the templates' views).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypedDict

from grader.analysis.audit import audit_path, read_audit
from grader.analysis.report.charts import Charts
from grader.analysis.report.listing import dataset_groups, read_listing
from grader.analysis.report.page import render_page
from grader.errors import GraderError
from grader.io.results import write_atomic


class Written(TypedDict):
    """What :func:`write_report` wrote: the page, its rows, groups, charts and bytes."""

    output: str
    rows: int
    groups: int | None
    charts: int
    bytes: int


class ReportError(GraderError, ValueError):
    """A report that cannot be made from its inputs (a ``--group-by`` column nowhere)."""


def write_report(results: Path, output: Path, *, group_by: str | None = None,
                 data: str | None = None, worst: int = 20, id_column: str | None = None,
                 audit: Path | None = None, human: str | None = None,
                 mapping: dict[str, str] | None = None) -> Written:
    """Write one self-contained HTML report about a results file.

    Args:
        results: a results JSONL file (``grader grade`` / ``grader rescore`` output).
        output: the HTML file to write (replaced atomically).
        group_by: a column to break the results down by (the model under test, a category):
            taken from ``data`` when given and it has the column, else from the records.
        data: the graded dataset, joined to the records by id, for ``group_by``.
        worst: how many of the lowest-scoring rows (and most-disagreeing samples) to list.
        id_column: the dataset's id column, as given to ``grader grade --id-column``.
        audit: a ``grader audit`` summary (``NAME.audit.json``) to show as a section; default
            the one beside ``results`` when there is one (``results`` is an audit's results).
        human: a column of human labels 0-5 (of ``data``, else of the records), as ``grader
            agree --human`` reads it: adds the calibrated mean human score section.
        mapping: ``--map`` as for grade, so ids in ``data`` match (with ``human``).

    Returns:
        ``{"output", "rows", "groups", "charts", "bytes"}``: what was written.

    Raises:
        ReportError: ``group_by`` is neither in the dataset nor in any record.
        grader.io.results.ResultsError: the results file is not valid JSONL records.
        grader.io.dataset.DatasetError: ``data`` cannot be read.
        grader.analysis.audit.AuditError: ``audit`` is not an audit summary.
    """
    results, output = Path(results), Path(output)
    lookup: dict[Any, str] | None = None
    if group_by is not None and data is not None:
        lookup = dataset_groups(data, group_by, id_column)
    tally, listing = read_listing(results, group_by, lookup, worst)
    if group_by is not None and lookup is None and not listing.group_in_records:
        where = f"in the dataset {data} or " if data is not None else ""
        hint = "" if data is not None else " (pass the dataset to join a column from it)"
        raise ReportError(f"no column {group_by!r} {where}in the records of {results}{hint}")

    if audit is None and audit_path(results).is_file():
        audit = audit_path(results)
    audited = (Path(audit), read_audit(Path(audit))) if audit is not None else None

    calibration = None
    if human is not None:
        from grader.analysis.agreement import agreement

        # agree's own reading and estimates (no bootstrap: the page shows no agreement table)
        calibration = agreement(results, human, data=data, mapping=mapping,
                                id_column=id_column, bootstrap=0)
    charts = Charts()
    text = render_page(results, tally, listing, charts, audited, calibration)
    # A lone surrogate in a record (read back from its \\udXXX escape) is shown as that escape,
    # as the results file holds it: strict UTF-8 would refuse the whole page.
    encoded = text.encode("utf-8", "backslashreplace")
    write_atomic(output, encoded)
    return {"output": str(output), "rows": tally.rows,
            "groups": len(listing.groups) if group_by is not None else None,
            "charts": charts.count, "bytes": len(encoded)}
