"""The numbers of ``grader audit``: for each perturbation and control, how the judge's score
moved against the row as given. Pure: records in, one JSON-ready dict out (and its table).

Each audit row's id is ``<id>#audit:<kind>``, ``kind`` one of ``original`` (the row as given)
and :data:`grader.judge.perturb.AUDIT_KINDS`. For each kind, over the sampled rows where both
the kind's answer and the original got a score: the share raised, lowered and unchanged, the
mean shift with a bootstrap 95 % interval (seeded), the robustness rate (the share unchanged,
as CALM, arXiv 2410.02736, defines it) and a pass rate, which is what a sound judge does with
that kind (:data:`grader.judge.perturb.EXPECTED`): unchanged for padding, injection and
authority (the robustness rate itself), lowered for truncation and contradiction, the top score
for the reference, below the reference's own score for the wrong answer and the non-answer.
Rows where either side has no score are counted apart and named.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

from grader.analysis.summary import counted
from grader.errors import GraderError
from grader.judge.perturb import AUDIT_KINDS, AUDIT_MEANING, EXPECTED, ORIGINAL
from grader.records import Record, SeedRecord

#: The separator between a row's id and its kind in an audit row's id.
ID_MARK = "#audit:"
TOP_SCORE = 5
#: What each expectation's pass rate counts, in words (the table's legend and the JSON's).
PASS_RULES = {"same": "unchanged (the robustness rate)", "lower": "lowered",
              "top": f"the top score ({TOP_SCORE})",
              "low": "below the reference's score on the same row"}
#: The expectation as the table's column says it.
_EXPECT_WORDS = {"same": "unchanged", "lower": "lower", "top": "top score", "low": "low"}


class AuditError(GraderError):
    """An audit that cannot be run or read: more rows asked for than the data has, an audit
    summary that is not one."""


def audit_id(row_id: Any, kind: str) -> str:
    """The id of ``kind``'s audit row for the data row ``row_id``."""
    return f"{row_id}{ID_MARK}{kind}"


def split_audit_id(record_id: Any) -> tuple[str, str] | None:
    """``"q01#audit:padding"`` -> ``("q01", "padding")``; None for an id of no audit row."""
    row, mark, kind = str(record_id).rpartition(ID_MARK)
    if not mark or kind not in (ORIGINAL, *AUDIT_KINDS):
        return None
    return row, kind


def audit_path(results: Path) -> Path:
    """The audit summary beside an audit's results: ``audit.jsonl`` -> ``audit.audit.json``."""
    name = results.name
    stem = name.removesuffix(".jsonl") if name.endswith(".jsonl") and name != ".jsonl" else name
    return results.with_name(stem + ".audit.json")


class _Score(NamedTuple):
    """One audit row's outcome: its status, its 0-5 score and its exact value (None: no score)."""

    status: str
    score: int | None
    value: float | None

    @classmethod
    def of(cls, record: Record) -> _Score:
        count = counted(record)
        if count.score is None:
            return cls(count.status, None, None)
        exact = record.score_exact if isinstance(record, SeedRecord) else None
        # the exact value where the record holds it: a one-item change shows
        value = exact if isinstance(exact, (int, float)) else count.score
        return cls(count.status, count.score, float(value))


def analyse(records: Iterable[Record], *, bootstrap: int = 2000, seed: int = 0) -> dict[str, Any]:
    """The audit of an audit run's records: the original rows' scores and one entry per kind.

    Args:
        records: the audit run's records (ids ``<id>#audit:<kind>``; others are left out and
            counted).
        bootstrap: resamples for each mean shift's 95 % interval (0: none).
        seed: the bootstrap's seed.
    """
    rows: dict[str, dict[str, _Score]] = {}
    foreign = 0
    for record in records:
        parts = split_audit_id(record.id)
        if parts is None:
            foreign += 1
            continue
        rows.setdefault(parts[0], {})[parts[1]] = _Score.of(record)
    originals = [row[ORIGINAL] for row in rows.values() if ORIGINAL in row]
    scored = [score.value for score in originals if score.value is not None]
    audit: dict[str, Any] = {
        "rows": len(rows),
        "original": {
            "rows": len(originals), "scored": len(scored),
            "mean_score": sum(scored) / len(scored) if scored else None,
            # not compared in any kind: each kind's "unscored" names them too
            "unscored": [{"id": row_id, "status": row[ORIGINAL].status}
                         for row_id, row in rows.items()
                         if ORIGINAL in row and row[ORIGINAL].value is None],
        },
        "kinds": [_kind(kind, rows, bootstrap, seed) for kind in AUDIT_KINDS],
        "bootstrap": {"resamples": bootstrap, "seed": seed, "confidence": 0.95,
                      "method": "percentile, rows resampled with replacement"}}
    if foreign:
        audit["records_not_of_the_audit"] = foreign
    return audit


def _kind(kind: str, rows: dict[str, dict[str, _Score]], bootstrap: int, seed: int) -> dict[str, Any]:
    expect = EXPECTED[kind]
    shifts: list[float] = []
    unscored: list[dict[str, Any]] = []
    passed = judged = total = 0
    for row_id, row in rows.items():
        if kind not in row or ORIGINAL not in row:
            continue
        total += 1
        original, changed = row[ORIGINAL], row[kind]
        if original.value is None or changed.value is None:
            unscored.append({"id": row_id, ORIGINAL: original.status, kind: changed.status})
        else:
            shifts.append(changed.value - original.value)
        verdict = _passes(expect, original, changed, row.get("reference"))
        if verdict is not None:
            judged += 1
            passed += verdict
    raised = sum(shift > 0 for shift in shifts)
    lowered = sum(shift < 0 for shift in shifts)
    compared = len(shifts)
    unchanged = compared - raised - lowered
    return {"kind": kind, "expect": expect, "meaning": AUDIT_MEANING[kind], "rows": total,
            "compared": compared, "raised": _share(raised, compared),
            "lowered": _share(lowered, compared), "unchanged": _share(unchanged, compared),
            "counts": {"raised": raised, "lowered": lowered, "unchanged": unchanged},
            "mean_shift": sum(shifts) / compared if compared else None,
            "interval": _interval(shifts, bootstrap, seed),
            "robustness": _share(unchanged, compared),
            "pass": {"rule": PASS_RULES[expect], "passed": passed, "of": judged,
                     "rate": _share(passed, judged)},
            "unscored": unscored}


def _passes(expect: str, original: _Score, changed: _Score, reference: _Score | None) -> bool | None:
    """Whether the judge did with this row what a sound judge does; None: it cannot be told
    (a score missing)."""
    if changed.value is None:
        return None
    if expect == "top":
        return changed.score == TOP_SCORE
    if expect == "low":
        if reference is None or reference.value is None:
            return None
        return changed.value < reference.value
    if original.value is None:
        return None
    if expect == "lower":
        return changed.value < original.value
    return changed.value == original.value


def _share(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _interval(shifts: list[float], resamples: int, seed: int) -> list[float] | None:
    """The percentile 95 % interval of the mean shift over ``resamples`` bootstrap resamples
    of the rows (None without rows or resamples)."""
    if not shifts or resamples <= 0:
        return None
    import numpy as np

    values = np.asarray(shifts, dtype=float)
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, len(values), size=(resamples, len(values)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return [float(low), float(high)]


# ------------------------------------------------------------------------- table


def table_rows(audit: dict[str, Any]) -> list[dict[str, str]]:
    """Each kind's line of the table, as text (the terminal's and the report's)."""
    out = []
    for entry in audit["kinds"]:
        interval = entry["interval"]
        test = entry["pass"]
        out.append({
            "kind": entry["kind"], "expect": _EXPECT_WORDS[entry["expect"]],
            "rows": str(entry["rows"]), "raised": _percent(entry["raised"]),
            "lowered": _percent(entry["lowered"]), "unchanged": _percent(entry["unchanged"]),
            "shift": _signed(entry["mean_shift"]),
            "interval": (f"[{_signed(interval[0])}, {_signed(interval[1])}]"
                         if interval is not None else ""),
            "pass": (f"{_percent(test['rate'])} ({test['passed']}/{test['of']})"
                     if test["of"] else "-"),
            "meaning": entry["meaning"]})
    return out


_COLUMNS = (("kind", "", "<", 14), ("expect", "sound judge", "<", 12), ("rows", "rows", ">", 5),
            ("raised", "raised", ">", 7), ("lowered", "lowered", ">", 8),
            ("unchanged", "unchanged", ">", 10), ("shift", "mean shift", ">", 11),
            ("interval", "95% interval", "<", 17), ("pass", "pass", "<", 0))


def format_audit(audit: dict[str, Any]) -> str:
    """The table ``grader audit`` prints, with what its pass column counts and the rows left
    out."""
    lines = [headline(audit), ""]
    lines.append(" ".join(f"{title:{align}{width}}" if width else title
                          for _, title, align, width in _COLUMNS).rstrip())
    for row in table_rows(audit):
        lines.append(" ".join(f"{row[key]:{align}{width}}" if width else row[key]
                              for key, _, align, width in _COLUMNS).rstrip())
    lines.append("")
    lines.append("shift: the score's change against the row as given (exact values); pass: the "
                 "share of rows where the judge did what a sound judge does:")
    lines.extend(f"  {rule}" for rule in pass_rules(audit))
    lines.extend(left_out(audit))
    return "\n".join(lines)


def pass_rules(audit: dict[str, Any]) -> list[str]:
    """What the pass column counts, one line per expectation: "truncation, contradiction:
    lowered"."""
    by_rule: dict[str, list[str]] = {}
    for entry in audit["kinds"]:
        by_rule.setdefault(entry["expect"], []).append(entry["kind"])
    return [f"{', '.join(kinds)}: {PASS_RULES[expect]}" for expect, kinds in by_rule.items()]


def headline(audit: dict[str, Any]) -> str:
    """The table's first line: what was audited, and the rows' own mean score."""
    original = audit["original"]
    about = [f"{audit['rows']} rows"]
    if audit.get("data"):
        about[0] += f" of {audit['data']}"
    if audit.get("model"):
        about.append(f"judge {audit['model']}")
    if audit.get("format"):
        about.append(f"format {audit['format']}")
    mean = original["mean_score"]
    graded = (f"the rows as given: mean score {mean:.2f} ({original['scored']} of "
              f"{original['rows']} scored)" if mean is not None
              else f"the rows as given: none of {original['rows']} scored")
    return f"audit: {', '.join(about)}; {graded}"


def left_out(audit: dict[str, Any]) -> list[str]:
    """The rows not compared, named: the rows as given without a score (in no kind), then
    per kind the rows whose own answer got none; and the data's rows not audited."""
    lines = []
    original = audit["original"].get("unscored") or []
    if original:
        lines.append(f"the rows as given: {len(original)} without a score, so compared in no "
                     f"kind ({_named([(row['id'], row['status']) for row in original])})")
    for entry in audit["kinds"]:
        kind = entry["kind"]
        unscored = [(row["id"], f"{kind} {row[kind]}") for row in entry["unscored"]
                    if row[ORIGINAL] == "ok"]
        if unscored:
            lines.append(f"{kind}: {len(unscored)} rows without a score, not compared "
                         f"({_named(unscored)})")
    skipped = audit.get("skipped") or {}
    reasons = {"no_reference": "without a reference", "no_answer": "without an answer",
               "invalid": "that cannot be sent (invalid_input)"}
    said = [f"{count} {reasons.get(name, name)}" for name, count in skipped.items() if count]
    if said:
        lines.append(f"not audited: {', '.join(said)} of the {audit.get('data_rows', '?')} rows "
                     "in the data (no perturbation or control is possible without them)")
    return lines


def _named(rows: list[tuple[str, str]], shown: int = 5) -> str:
    """``q01 parse_error; q12 truncated; and 3 more``."""
    named = "; ".join(f"{row_id} {why}" for row_id, why in rows[:shown])
    return named + (f"; and {len(rows) - shown} more" if len(rows) > shown else "")


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+.2f}"


# ------------------------------------------------------------------------- files


def read_audit(path: Path) -> dict[str, Any]:
    """An audit summary (``NAME.audit.json``) as ``grader audit`` wrote it; an
    :class:`AuditError` naming the file when it is not one."""
    try:
        audit = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise AuditError(f"{path}: cannot read the audit summary: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise AuditError(f"{path}: not an audit summary: not JSON ({exc})") from None
    kinds = audit.get("kinds") if isinstance(audit, dict) else None
    if not (isinstance(audit, dict) and isinstance(kinds, list) and all(map(_is_entry, kinds))
            and isinstance(audit.get("original"), dict) and "mean_score" in audit["original"]):
        raise AuditError(f"{path}: not an audit summary (grader audit writes NAME.audit.json)")
    return audit


_ENTRY_KEYS = frozenset({"kind", "expect", "meaning", "rows", "raised", "lowered", "unchanged",
                         "mean_shift", "interval", "pass", "unscored"})


def _is_entry(entry: Any) -> bool:
    return (isinstance(entry, dict) and _ENTRY_KEYS <= entry.keys()
            and entry["expect"] in PASS_RULES and isinstance(entry["pass"], dict)
            and {"rate", "passed", "of"} <= entry["pass"].keys()
            and isinstance(entry["unscored"], list))
