"""A results file belongs to the run that made it.

A run's identity is what decides its answers (model, judge, format, prompt, sampling, the
engine settings that change an answer) and which rows it grades (``--limit``, how many rows,
which ids). It is kept where a rerun reads it: in the summary's ``run.identity`` once a run
has finished, and in ``PATH.partial.json`` beside the log while it has not
(:meth:`grader.io.results.ResultsLog.claim`). A rerun whose identity differs stops before any
model work with one line naming the first difference; only ``--overwrite`` (or another
``-o``) starts over. Within the same identity, rows are resumed by key as before: a row whose
text changed is graded again.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from grader.errors import GraderError
from grader.io.results import ResultsLog, SummaryError, owner_path, read_summary

# The parts of an identity, in the order a difference is reported.
_SETTINGS = ("format", "judge", "prompt", "model", "backend", "sampling", "settings", "truncate",
             "aggregate")
_ROWS = ("limit", "rows", "row_ids")


class ResultsOwned(GraderError):
    """The results file was made by a run with other settings or rows: one line says which."""


def id_set_digest(id_hashes: Any) -> str:
    """An order-free digest of the rows' ids, from their 8-byte hashes (the dataset's)."""
    import numpy

    hashes = numpy.frombuffer(id_hashes, dtype=numpy.int64).copy()
    hashes.sort()
    return hashlib.sha256(hashes.tobytes()).hexdigest()


def check_owner(log: ResultsLog, output: Path, identity: dict[str, Any]) -> None:
    """Raise :class:`ResultsOwned` when ``output`` (its ``.partial`` first: the later run)
    was made by a run whose identity differs in any part ``identity`` holds."""
    earlier = log.owner()
    source = f"{output} (its unfinished run, {output.name}.partial)"
    if earlier is None and output.is_file():
        check_results_file(output)
        earlier, source = _finished_identity(output), str(output)
    if not earlier:
        return
    difference = _difference(earlier, identity)
    if difference is not None:
        was, now = difference
        raise ResultsOwned(
            f"{source} was graded with {was}; this run has {now}: "
            "use --overwrite to start over, or another -o to keep both"
        )


def check_results_file(output: Path) -> None:
    """Raise :class:`ResultsOwned` when ``output`` holds something grader did not write (a
    copy of the data, say): neither a summary beside it nor a record on its first line."""
    if _is_results_file(output):
        return
    raise ResultsOwned(
        f"{output} exists and is not a grader results file (no summary beside it, and its "
        "first line is not a record): use --overwrite to replace it, or another -o"
    )


def _is_results_file(output: Path) -> bool:
    with suppress(SummaryError):
        if read_summary(output) is not None:
            return True
    try:
        with open(output, "rb") as stream:
            first = next((line for line in stream if line.strip()), None)
    except OSError:
        return True  # unreadable: the write that follows says why
    if first is None:
        return True  # an empty file holds nothing to lose
    try:
        record = json.loads(first)
    except ValueError:
        return False
    return isinstance(record, dict) and "status" in record and "id" in record


def check_rescore_output(source: Path, output: Path) -> None:
    """``grader rescore SOURCE -o OUTPUT``: OUTPUT, where it exists, must be SOURCE itself or
    hold results of the run that graded SOURCE (an earlier rescore of it); else
    :class:`ResultsOwned`, as a grade run on another run's results stops."""
    try:
        if not output.exists() or output.samefile(source):
            return
    except OSError:
        return
    check_not_unfinished(output)
    check_results_file(output)
    mine, theirs = _finished_identity(source), _finished_identity(output)
    difference = _difference(theirs or {}, mine or {}) if theirs and mine else None
    if (theirs and not mine) or difference is not None:
        was, now = difference or ("another run", "results without a summary")
        raise ResultsOwned(
            f"{output} was graded with {was}; {source} has {now}: "
            "use --overwrite to replace it, or another -o to keep both"
        )


def check_not_unfinished(output: Path) -> None:
    """Raise :class:`ResultsOwned` when ``output`` is an unfinished grade run's log."""
    if output.with_name(output.name + ".partial").is_file() and owner_path(output).is_file():
        raise ResultsOwned(
            f"{output} belongs to an unfinished grade run ({output.name}.partial): resume it, "
            "or use --overwrite to replace it, or another -o"
        )


def summary_or_empty(results: str | Path) -> dict[str, Any]:
    """The summary beside ``results``; empty where there is none or it cannot be read."""
    try:
        return read_summary(results) or {}
    except SummaryError:
        return {}


def same_file(a: str | Path | None, b: str | Path | None) -> bool:
    """Whether ``a`` and ``b`` both name one existing file."""
    try:
        return a is not None and b is not None and os.path.samefile(a, b)
    except OSError:
        return False


def _finished_identity(output: Path) -> dict[str, Any] | None:
    """The identity in a finished file's summary; for a summary from before identities, the
    parts it holds (format, run key, rows)."""
    run = summary_or_empty(output).get("run")
    if not isinstance(run, dict):
        return None
    identity = run.get("identity")
    if isinstance(identity, dict):
        return identity
    legacy = {"format": run.get("format"), "run_key": run.get("run_key"), "rows": run.get("rows")}
    return {k: v for k, v in legacy.items() if v is not None}


def _difference(earlier: dict[str, Any], current: dict[str, Any]) -> tuple[str, str] | None:
    def differs(part: str) -> bool:
        # a part one side does not hold (an older summary, a check before the rows are
        # counted) cannot be compared
        if part not in earlier or part not in current:
            return False
        was, now = earlier[part], current[part]
        if part == "prompt" and isinstance(was, dict) and isinstance(now, dict):
            was, now = was.get("sha256"), now.get("sha256")  # a renamed copy is the same prompt
        return not _same(was, now)

    for part in (*_SETTINGS, "run_key"):
        if differs(part):
            return _describe(part, earlier[part], current[part])
    if differs("rows") or differs("row_ids"):
        # the same rows under another --limit are the same rows: only name it when they differ
        part = next(p for p in _ROWS if differs(p))
        return _describe(part, earlier[part], current[part])
    return None


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def _describe(part: str, was: Any, now: Any) -> tuple[str, str]:
    """How the earlier and the current value of a differing part of the identity are said."""
    if part in _SAID:
        return _SAID[part]
    if part in _SAYS:
        return _SAYS[part](was), _SAYS[part](now)
    if isinstance(was, dict) and isinstance(now, dict):
        if part == "prompt":
            return _prompt(was), _prompt(now)
        if part in ("judge", "sampling", "settings"):
            for name in sorted(set(was) | set(now)):
                if not _same(was.get(name), now.get(name)):
                    return f"{name}={_value(was.get(name))}", f"{name}={_value(now.get(name))}"
    return f"{part} {_value(was)}", f"{part} {_value(now)}"


def _prompt(prompt: dict[str, object]) -> str:
    return f"the prompt {prompt.get('name')} (sha256 {str(prompt.get('sha256'))[:12]})"


# Parts whose difference is said without their values (was, now), and how others say a value.
_SAID = {
    "model": ("another model", "a model whose config, weights, tokenizer or chat template differ"),
    "row_ids": ("other row ids", "these (the data's rows differ)"),
    "run_key": ("other settings (model, prompt, sampling or engine)", "these"),
}
_SAYS: dict[str, Callable[[Any], str]] = {
    "format": lambda value: f"--format {value}",
    "limit": lambda value: f"--limit {value}" if value is not None else "no --limit",
    "rows": lambda value: f"{value} rows",
}
