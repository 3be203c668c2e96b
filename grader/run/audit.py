"""grader audit: a sample of the data's rows graded as given and under each perturbation and
control (:mod:`grader.judge.perturb`), in one grade run, then the numbers
(:mod:`grader.analysis.audit`).

The audit's rows (``<id>#audit:original`` and ``<id>#audit:<kind>`` for each sampled row, its
other fields unchanged) are written for the reader beside the results
(``NAME.audit-rows.jsonl``) and graded from memory by :func:`grader.run.grading.run_grade`:
one engine load; lock, ownership and resume as for ``grade``. A judge's preparation stage
makes nothing more: a row's audit rows share its input and reference. The transforms are
deterministic and the sample depends on the ids only, so a rerun writes the same rows and
resumes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from msgspec import UNSET

from grader.analysis.audit import AuditError, analyse, audit_id, audit_path
from grader.backends import Backend
from grader.io.dataset import Dataset, DatasetError, Item
from grader.io.lock import OutputLock
from grader.io.outputs import Kind, Planned, check_outputs
from grader.io.results import check_results_name, encode, read_records, write_atomic, write_json
from grader.judge.judges import DEFAULT_FORMAT
from grader.judge.perturb import AUDIT_KINDS, ORIGINAL, audit_answers, sample_keys, wrong_answers
from grader.run.executor import Executor
from grader.run.grading import check_not_input, grade_inputs, grade_outputs, run_grade
from grader.run.request import FileJob, GradeRequest

#: Rows audited when ``--rows`` is not given (all of them where the data has fewer).
DEFAULT_ROWS = 50


def rows_path(results: Path) -> Path:
    """The audit's own data file beside its results: ``audit.jsonl`` ->
    ``audit.audit-rows.jsonl``."""
    name = results.name
    stem = name.removesuffix(".jsonl") if name.endswith(".jsonl") and name != ".jsonl" else name
    return results.with_name(stem + ".audit-rows.jsonl")


def run_audit(request: GradeRequest, job: FileJob, rows: int | None = None,
              executor: Executor | None = None, *, bootstrap: int = 2000,
              backend_factory: Callable[..., Backend] | None = None) -> dict[str, Any]:
    """Audit the judge of ``request`` on ``rows`` rows of ``job.data`` (default
    :data:`DEFAULT_ROWS`, or every row where the data has fewer); the records go to
    ``job.output``, the audit (returned) to ``NAME.audit.json`` beside it.

    Raises :class:`AuditError` when ``rows`` is more than the data's rows with a reference and
    an answer, or there are none; the errors of ``run_grade`` otherwise.
    """
    if request.format == "pairwise":
        # a perturbation changes one answer and compares its score with the answer's own; a
        # pairwise verdict has no score of one answer to compare
        raise AuditError("grader audit grades answers one at a time: --format pairwise has no "
                         f"score of one answer to perturb; audit with --format {DEFAULT_FORMAT}")
    output = job.output
    check_results_name(output)
    summary_file, data_file = audit_path(output), rows_path(output)
    graded = dataclasses.replace(request, controls=0)  # as run_grade is asked below
    # Held for the whole audit: a second audit to the same -o must not rewrite the rows file
    # this one is grading (run_grade then locks the results file itself).
    with OutputLock(summary_file):
        check_outputs([*grade_outputs(graded, output),
                       Planned(summary_file, Kind.AUDIT, "beside -o"),
                       Planned(data_file, Kind.AUDIT_ROWS, "beside -o")],
                      grade_inputs(graded, job.data), overwrite=job.overwrite)
        check_not_input(job.data, output)
        sample, about = _sample(request, job.data, rows)
        check_not_input(job.data, data_file, f"is the audit's rows file for this -o "
                        f"({data_file.name}): choose another -o")
        lines = _audit_lines(sample)
        # written for the reader (what was graded); the run grades the rows held here
        write_atomic(data_file, encode("".join(lines)))
        held = Dataset.of_rows([json.loads(line) for line in lines], name=str(data_file),
                               id_column="id")
        # the audit's own controls are its rows
        rows_request = dataclasses.replace(graded, mapping={}, id_column="id", source="jsonl")
        summary = run_grade(rows_request, dataclasses.replace(job, data=str(data_file), limit=None),
                            executor, backend_factory=backend_factory, rows=held)
        run = summary.manifest
        audit = {
            "data": job.data, **about, "model": request.model,
            "backend": None if run.backend is UNSET else run.backend,
            "format": None if run.format is UNSET else run.format,
            "results": str(output), "rows_file": str(data_file),
            **analyse((record for _, record in read_records(output)), bootstrap=bootstrap),
        }
        write_json(summary_file, audit)
    audit["summary"] = str(summary_file)
    return audit


class _Sampled(TypedDict):
    """What the data held, in the audit file: its rows, those asked for and sampled, and those
    left out by reason."""

    data_rows: int
    rows_requested: int | None
    sampled: int
    skipped: dict[str, int]


def _sample(request: GradeRequest, data: str, rows: int | None) -> tuple[list[Item], _Sampled]:
    """The sampled rows of ``data``, in data order, and what the data held: rows, rows left
    out by reason."""
    skipped = {"no_reference": 0, "no_answer": 0, "invalid": 0}
    with Dataset(data, mapping=request.mapping, id_column=request.id_column,
                 source=request.source) as dataset:
        keys, total = [], 0
        for item in dataset:
            total += 1
            reason = _unusable(item)
            if reason is None:
                keys.append(str(item.id))
            else:
                skipped[reason] += 1
        dataset.check_unique_ids()
        usable = len(keys)
        if not usable:
            raise AuditError(f"{data}: no row has both a reference and an answer: "
                             "nothing to audit")
        if rows is not None and rows > usable:
            of = f" (of {total})" if usable != total else ""
            raise AuditError(f"{data}: --rows {rows} is more than the {usable} rows it "
                             f"has with a reference and an answer{of}")
        chosen = set(sample_keys(keys, rows if rows is not None else DEFAULT_ROWS))
        sample = [item for item in dataset if _unusable(item) is None and str(item.id) in chosen]
    if len(sample) != len(chosen):  # stdin or a file changed between the two reads
        raise DatasetError(data, None, "changed while it was being read")
    return sample, {"data_rows": total, "rows_requested": rows, "sampled": len(sample),
                    "skipped": skipped}


def _unusable(item: Item) -> str | None:
    """Why a row cannot be audited (a perturbation needs the answer, a control the
    reference), or None."""
    if item.invalid:
        return "invalid"
    if not item.fields["reference"]:
        return "no_reference"
    if not item.fields["output_text"]:
        return "no_answer"
    return None


def _audit_lines(sample: list[Item]) -> list[str]:
    """The rows file's lines: each sampled row as given, then under each kind."""
    wrong = wrong_answers([item.fields["reference"] for item in sample])
    lines = []
    for item, other in zip(sample, wrong, strict=True):
        answers = {ORIGINAL: item.fields["output_text"],
                   **audit_answers(item.fields["output_text"], item.fields["reference"], other)}
        for kind in (ORIGINAL, *AUDIT_KINDS):
            row = {**item.fields, "id": audit_id(item.id, kind), "output_text": answers[kind]}
            # a Parquet date or decimal in another column: as text, as the prompt renders it
            lines.append(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return lines
