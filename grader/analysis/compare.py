"""Two models under test, graded on the same rows: paired mean difference, wins, sign test."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np
from msgspec import UNSET

from grader.analysis.agreement import (
    CalibrationAbout,
    bootstrap_manifest,
    calibration_about,
    check_bootstrap_settings,
    contingency_table,
    estimates,
    format_interval,
    id_key,
    left_out,
    load_records,
    read_label,
    table_statistics,
)
from grader.analysis.confidence import format_number
from grader.io.manifest import model_fingerprint
from grader.io.results import SummaryError, read_manifest, summary_path
from grader.records import Record
from grader.status import Status

if TYPE_CHECKING:
    from grader.analysis.calibration import CalibratedJSON


class DifferenceAbout(CalibrationAbout):
    labels: str  # which rows count as labeled


class CalibratedDifference(TypedDict):
    calibrated: CalibratedJSON
    calibration: DifferenceAbout

MEANS = ("mean_a", "mean_b", "mean_difference")
# Run settings that change what the judge says: if the two files differ in one, the difference
# between them may be the judge's, not the models'.
JUDGE_SETTINGS = ("model", "prompt", "schema_sha256", "checklist", "format", "sampling")


def _means(tables: np.ndarray) -> dict[str, np.ndarray]:
    """Mean score of A (rows), B (columns) and B - A from 6 x 6 tables of paired scores."""
    means = table_statistics(tables)
    return {"mean_a": means["mean_human"], "mean_b": means["mean_judge"],
            "mean_difference": means["mean_difference"]}


def _statuses(records: list[tuple[int, Record]]) -> dict[str, int]:
    counts = Counter(str(record.status) for _, record in records)
    known = {str(s): counts.pop(str(s), 0) for s in Status}
    return {**known, **dict(sorted(counts.items()))}


def _judge_settings(results: str | Path) -> dict[str, object] | None:
    """The judge's settings from the summary written beside a results file: None without one,
    a :class:`SummaryError` when it cannot be read. Only the settings the manifest records."""
    run = read_manifest(results)
    if run is None:
        return None
    settings = {name: getattr(run, name) for name in JUDGE_SETTINGS
                if getattr(run, name) not in (None, UNSET)}
    if isinstance(settings.get("prompt"), dict):  # the prompt's text matters, not where it lay
        settings["prompt"] = settings["prompt"].get("sha256")
    model = settings.get("model")
    if isinstance(model, dict) and "config_sha256" in model:
        # the model's files, not the path it was given by nor when it was copied there
        settings["model"] = model_fingerprint(model)
    return settings


def _judge_notes(a: str | Path, b: str | Path) -> list[str]:
    """What the two summaries say about whether one judge graded both files."""
    settings = {}
    for name, path in (("A", a), ("B", b)):
        try:
            settings[name] = _judge_settings(path)
        except SummaryError as exc:
            return [f"the summary of {name} cannot be read ({exc}): cannot tell whether one judge graded both"]
    # no summary: a file from another tool, or a summary moved away: nothing to go on
    which = " and ".join(f"{name} ({summary_path(Path(path))})"
                         for name, path in (("A", a), ("B", b)) if settings[name] is None)
    if which:
        return [f"no summary beside {which}: cannot tell whether one judge graded both"]
    of_a, of_b = settings["A"] or {}, settings["B"] or {}
    unnamed = next((name for name, of in (("A", of_a), ("B", of_b)) if not of), None)
    if unnamed:
        return [f"the summary of {unnamed} does not say which judge graded it: the judges may differ"]
    shared = of_a.keys() & of_b.keys()
    differ = [name for name in JUDGE_SETTINGS if name in shared and of_a[name] != of_b[name]]
    if differ:
        return [f"the two files were graded with different judge settings ({', '.join(differ)}): "
                "a difference may be the judge's, not the models'"]
    return []


def _record_formats(records: list[tuple[int, Record]]) -> list[str]:
    """The answer formats the records say they hold (a score_model grader's records:
    ``score_model``), in first-seen order; records that do not say are left out."""
    return list(dict.fromkeys(record.kind for _, record in records if record.kind is not None))


def _format_notes(records_a: list[tuple[int, Record]], records_b: list[tuple[int, Record]]
                  ) -> list[str]:
    """Whether the two files' scores measure the same thing: a seed-format score and an
    itemized one of the same answer are not the same measure."""
    formats = {"A": _record_formats(records_a), "B": _record_formats(records_b)}
    notes = [f"{name} holds records of several formats ({', '.join(kinds)}): its scores are "
             "not one measure" for name, kinds in formats.items() if len(kinds) > 1]
    if not notes and formats["A"] and formats["B"] and formats["A"] != formats["B"]:
        notes.append(f"the records' formats differ (A: {formats['A'][0]}, B: {formats['B'][0]}): "
                     "a difference may be the format's, not the models'")
    return notes


def compare(a: str | Path, b: str | Path, *, bootstrap: int = 2000, seed: int = 0,
            confidence: float = 0.95, human: str | None = None, data: tuple[str, ...] = (),
            mapping: Mapping[str, str] | None = None, id_column: str | None = None
            ) -> dict[str, Any]:
    """Compare the scores of two results files, row by row (joined on ``id``).

    A row counts when both files hold it with a score (the seed's 0 for ``missing_context`` and
    ``ambiguous`` included); the others are counted in ``excluded``. B is the challenger: the
    difference is B - A, and a win is a row where B scores higher.

    Returns:
        A JSON-serialisable dict: ``n`` pairs, ``mean_a``, ``mean_b``, ``mean_difference``
        (None without pairs), ``intervals`` ({name: [low, high]}, paired percentile bootstrap),
        ``bootstrap``, ``wins``/``ties``/``losses`` (B higher / equal / lower),
        ``sign_test_p`` (two-sided, ties dropped; None when every pair ties), ``statuses``
        ({"a": {...}, "b": {...}}, every record of each file), ``excluded`` and ``notes``.
        With ``human`` (a column of human labels 0-5, read as agree reads it: from ``data``,
        one dataset per file in order, or from each file's records), ``calibrated``: the
        calibrated paired difference B - A over every pair, from the rows labeled for both
        (:func:`grader.analysis.calibration.calibrated_difference`), beside its judge-only
        and labels-only figures, and ``calibration`` (method, assumption, one sentence).
    """
    from scipy.stats import binomtest

    check_bootstrap_settings(bootstrap, confidence)
    if data and human is None:
        from grader.analysis.agreement import AgreementError

        raise AgreementError("--data holds human labels: name their column with --human")
    records_a, records_b = load_records(a), load_records(b)
    pairs, paired_ids, excluded = _pair_up(records_a, records_b)
    table = contingency_table(*np.array(pairs, dtype=int).reshape(-1, 2).T)
    wins, losses = int(np.triu(table, 1).sum()), int(np.tril(table, -1).sum())
    ties = int(np.trace(table))
    values, intervals, valid = estimates(table, bootstrap, seed, confidence, _means, MEANS)
    result: dict[str, Any] = {"a": str(a), "b": str(b), "n": len(pairs), **values,
                              "intervals": intervals}
    result["bootstrap"] = bootstrap_manifest(bootstrap, valid, seed, confidence, "pairs")
    result["wins"], result["ties"], result["losses"] = wins, ties, losses
    result["sign_test_p"] = (float(binomtest(wins, wins + losses, 0.5).pvalue) if wins + losses
                             else None)
    result["statuses"] = {"a": _statuses(records_a), "b": _statuses(records_b)}
    result["excluded"] = {"rows": sum(excluded.values()), **excluded}
    notes = []
    if not pairs:
        notes.append("no row has a score in both files: nothing to compare")
    elif not wins + losses:
        notes.append("every pair ties: no sign test")
    notes += _format_notes(records_a, records_b)
    notes += _judge_notes(a, b)
    result["notes"] = notes
    if human is not None:
        result |= _calibrated(a, b, records_a, records_b, pairs, paired_ids, human, data,
                              mapping, id_column)
    return result


def _pair_up(records_a: list[tuple[int, Record]], records_b: list[tuple[int, Record]]
             ) -> tuple[list[tuple[int, int]], list[Any], dict[str, int]]:
    """The pairs of scores 0-5 of the rows both files scored (in A's order), their ids, and
    the rows left out by why."""
    # by name: another tool's records hold a score too
    scores_b = {id_key(record.id): record.field("score") for _, record in records_b}
    excluded = {"only_in_a": 0, "only_in_b": 0, "no_score_in_a": 0, "no_score_in_b": 0,
                "no_score_in_either": 0}
    pairs: list[tuple[int, int]] = []
    paired_ids: list[Any] = []
    for _, record in records_a:
        key = id_key(record.id)
        if key not in scores_b:
            excluded["only_in_a"] += 1
            continue
        score_a, _ = read_label(record.field("score"))
        score_b, _ = read_label(scores_b[key])
        if score_a is not None and score_b is not None:
            pairs.append((score_a, score_b))
            paired_ids.append(key)
        else:
            excluded["no_score_in_" + ("either" if score_a is None and score_b is None
                                       else "a" if score_a is None else "b")] += 1
    in_a = {id_key(record.id) for _, record in records_a}
    excluded["only_in_b"] = sum(key not in in_a for key in scores_b)
    return pairs, paired_ids, excluded


def _calibrated(a: str | Path, b: str | Path, records_a: list[tuple[int, Record]],
                records_b: list[tuple[int, Record]], pairs: list[tuple[int, int]],
                paired_ids: list[Any], human: str, data: tuple[str, ...],
                mapping: Mapping[str, str] | None, id_column: str | None
                ) -> CalibratedDifference:
    """The calibrated difference B - A: labels for both models on the same rows (a row
    labeled for one model only counts as unlabeled; its labels are not used)."""
    from grader.analysis.agreement import AgreementError, read_human_labels
    from grader.analysis.calibration import calibrated_difference, describe

    if data and len(data) != 2:
        raise AgreementError(f"--data: one dataset of labels per results file (2), got {len(data)}")
    read = [read_human_labels(path, records, human, data[index] if data else None, mapping,
                              id_column)
            for index, (path, records) in enumerate(((a, records_a), (b, records_b)))]
    labeled: list[tuple[int, int, int, int]] = []  # human A, human B, judge A, judge B
    others: list[tuple[int, int]] = []
    for key, (score_a, score_b) in zip(paired_ids, pairs, strict=True):
        label_a, _ = read_label(read[0].scores.get(key))
        label_b, _ = read_label(read[1].scores.get(key))
        if label_a is None or label_b is None:
            others.append((score_a, score_b))
        else:
            labeled.append((label_a, label_b, score_a, score_b))
    rows = np.array(labeled, dtype=float).reshape(-1, 4)
    rest = np.array(others, dtype=float).reshape(-1, 2)
    difference = calibrated_difference(rows[:, 0], rows[:, 1], rows[:, 2], rows[:, 3],
                                       rest[:, 0], rest[:, 1])
    about = calibration_about(all(part.random_sample for part in read),
                              [describe(difference, what="difference B - A")])
    return {"calibrated": difference.to_dict(), "calibration": DifferenceAbout(
        **about, labels="for both models on the same rows; a row labeled for one only is unlabeled")}


def format_comparison(result: dict[str, Any]) -> str:
    """The short table printed by ``grader compare``."""
    lines = [f"A: {result['a']}", f"B: {result['b']}", f"{'pairs (n)':<24}{result['n']:>8}",
             *left_out(result["excluded"], 24)]
    boot = result["bootstrap"]
    header = f"{round(boot['confidence'] * 100, 1):g}% interval" if boot["resamples"] else ""
    lines.append("")
    lines.append(f"{'':<24}{'value':>8}   {header}")
    for name, label in (("mean_a", "mean A"), ("mean_b", "mean B"), ("mean_difference", "B - A")):
        lines.append(f"{label:<24}{format_number(result[name]):>8}   {format_interval(result['intervals'][name])}")
    if boot["resamples"]:
        lines.append(f"(paired bootstrap: {boot['resamples']} resamples, seed {boot['seed']}, percentile)")
    lines.append("")
    lines.append(f"{'B better / tie / worse':<24}{result['wins']:>8} / {result['ties']} / {result['losses']}")
    p = result["sign_test_p"]
    lines.append(f"{'sign test p (two-sided)':<24}{'-' if p is None else f'{p:.4g}':>8}")
    lines.append("")
    lines.append(f"{'status':<24}{'A':>8}{'B':>8}")
    statuses = list(dict.fromkeys([*result["statuses"]["a"], *result["statuses"]["b"]]))
    for status in statuses:
        count_a = result["statuses"]["a"].get(status, 0)
        count_b = result["statuses"]["b"].get(status, 0)
        if count_a or count_b or status == Status.OK:
            lines.append(f"  {status:<22}{count_a:>8}{count_b:>8}")
    lines.extend(f"note: {note}" for note in result["notes"])
    if "calibrated" in result:
        from grader.analysis.agreement import format_calibration

        lines += format_calibration(result, title="human score B - A")
    return "\n".join(lines)
