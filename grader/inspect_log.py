"""inspect_ai's side of grader's records: a record as inspect's ``Score``, grader's metrics
(mean, stderr and the judge check as the ``judge_check`` metric group), and a scored copy of an
inspect_ai log (``grader grade LOG.eval ... --write-inspect OUT.eval``).

The copy is made with inspect_ai's own scoring pass over a scorer that hands each sample its
record's score; the input log is only read. The scorer that grades inside inspect is
:mod:`grader.inspect_scorer`.

inspect_ai is imported here, never by ``import grader`` (the ``inspect`` extra).
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inspect_ai.scorer import (
    Metric,
    SampleScore,
    Score,
    Scorer,
    Target,
    Value,
    mean,
    metric,
    scorer,
    stderr,
)
from inspect_ai.solver import TaskState

from grader.analysis.verdict import JudgeCheck
from grader.errors import GraderError, OutputError
from grader.records import Record
from grader.run.request import OptionError
from grader.status import Status

# The score metadata's key naming the scorer run, for the judge_check metric to find its check.
RUN_KEY = "grader_run"
# The record fields a score's metadata keeps (the rest is the score's value and explanation).
METADATA_FIELDS = ("status", "score_exact", "counts", "formula", "format", "items",
                   "finish_reason", "error", "raw_output", "result", "passed")


def score_of(record: Record, run: str | None = None) -> Score:
    """A grader record as inspect's :class:`Score`: the record's value, or the unscored value
    (NaN, left out of every metric) with the status as the reason where it has none."""
    data = record.to_dict()
    metadata: dict[str, Any] = {name: data[name] for name in METADATA_FIELDS if name in data}
    rubric = data.get("rubric")
    if isinstance(rubric, dict):
        metadata["rubric_key"] = rubric.get("key")
    if run is not None:
        metadata[RUN_KEY] = run
    grade = data.get("grade")
    rationale = grade.get("rationale") if isinstance(grade, dict) else None
    explanation = "\n".join(str(line) for line in rationale) if isinstance(rationale, list) else None
    value = record.value
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        why = record.status if record.status != Status.OK else "no score"
        return Score.unscored(reason="grader_failed",
                              explanation=f"{why}: {record.error}" if record.error else why,
                              metadata=metadata)
    if record.status == Status.MISSING_CONTEXT:  # grader's 0 for a row with no answer, not sent
        return Score(value=value, reason="no_response", metadata=metadata,
                     explanation=f"{record.status}: {record.error}" if record.error else None)
    return Score(value=value, explanation=explanation, metadata=metadata)


# Where the judge_check metric finds each scorer run's check (RUN_KEY in the scores).
CHECKS: dict[str, Callable[[], JudgeCheck | None]] = {}


@metric(name="judge_check")
def judge_check() -> Metric:
    """grader's judge check as metrics: the verdict's name (``informative``, ``weak``,
    ``no_signal``, ``too_few``) with the number of references checked, ``above_both`` (the
    share scored above both controls) with its 95 % interval (``ci95_low``, ``ci95_high``),
    and the larger sign-test ``p_value`` (docs/judging.md, "Can I trust this judge?")."""

    def compute(scores: list[SampleScore]) -> Value:
        runs = {str(s.score.metadata[RUN_KEY]) for s in scores
                if s.score.metadata and RUN_KEY in s.score.metadata}
        found = [check for run in sorted(runs) if run in CHECKS
                 if (check := CHECKS[run]()) is not None]
        if len(found) != 1:  # a log read again elsewhere, or no controls: no check to show
            return {}
        return check_metrics(found[0])

    return compute


def check_metrics(check: JudgeCheck) -> dict[str, float | None]:
    """A judge check as the judge_check metric's values (None: left out)."""
    low, high = check.above_both.ci95 or (None, None)
    values: dict[str, float | None] = {
        check.verdict.replace(" ", "_"): float(check.scored), "above_both": check.above_both.share,
        "ci95_low": low, "ci95_high": high, "p_value": check.p_value}
    return {k: float(v) for k, v in values.items() if v is not None and math.isfinite(v)}


# -- a scored copy of a log (grader grade --write-inspect) ---------------------------------

# Each results file's records by id, and its run's name, by path (the `grader` scorer's param)
_LOGGED: dict[str, tuple[dict[str, Record], str]] = {}


def _records(results: str) -> dict[str, Record]:
    from grader.io.results import read_records

    return {str(record.id): record for _, record in read_records(results)}


@scorer(metrics=[mean(), stderr(), judge_check()], name="grader")
def logged_scores(results: str) -> Scorer:
    """The scores of a results file that ``grader grade`` wrote from this log, each put on its
    sample (row id ``ID``, or ``ID/EPOCH``); a sample without one is unscored ("not graded")."""
    records, run = _LOGGED.get(results) or (_records(results), uuid.uuid4().hex)

    async def score(state: TaskState, target: Target) -> Score:
        sample = str(state.sample_id)
        record = records.get(f"{sample}/{state.epoch}") or records.get(sample)
        if record is None:
            return Score.unscored(reason="scoring_failed", metadata={RUN_KEY: run},
                                  explanation=f"not graded: no record in {results}")
        return score_of(record, run)

    return score


def check_output(data: str, source: str | None, output: Path, id_column: str | None = None,
                 *, overwrite: bool = False) -> None:
    """``--write-inspect OUTPUT``'s checks before a run: DATA an inspect_ai log read by its
    sample ids, OUTPUT a log name (``.eval`` or ``.json``), not DATA, new unless ``overwrite``."""
    if id_column is not None:
        raise OptionError("--write-inspect puts each record on its sample by the sample's id: "
                          "leave out --id-column")
    if source not in (None, "inspect") or (
            source is None and Path(data).suffix.lower() not in (".eval", ".json")):
        raise OptionError(f"--write-inspect: {data} is not an inspect_ai log (.eval or .json, "
                          "or --from inspect)")
    if output.suffix.lower() not in (".eval", ".json"):
        raise OptionError(f"--write-inspect: {output}: an inspect_ai log is named .eval or .json")
    if output.exists() and output.resolve() == Path(data).resolve():
        raise OptionError(f"--write-inspect: {output} is the input log, which grader never "
                          "modifies: name another file")
    from grader.io.outputs import Kind, Planned, check_outputs

    check_outputs([Planned(output, Kind.SCORED_LOG, "--write-inspect")], [data],
                  overwrite=overwrite)


def write_scored_log(data: str | Path, results: str | Path, output: str | Path,
                     judge_check: JudgeCheck | None = None) -> Path:
    """A copy of the inspect_ai log ``data`` with a ``grader`` score on every sample (from
    ``results``) and grader's metrics in its results, written to ``output`` whole or not at all.

    Raises:
        GraderError: ``data`` holds no samples (exit 2); OutputError: ``output`` cannot be
            written (73).
    """
    from inspect_ai import score as score_log
    from inspect_ai.log import read_eval_log, write_eval_log

    source, target = Path(data), Path(output)
    log_ = read_eval_log(str(source))
    if not log_.samples:
        raise GraderError(f"{source}: the inspect_ai log holds no samples (a header-only log?): "
                          "nothing to score")
    run, name = uuid.uuid4().hex, str(results)
    CHECKS[run] = lambda: judge_check
    _LOGGED[name] = (_records(name), run)
    try:
        # mockllm stands in for the log's model, which scoring never calls
        scored = score_log(log_, logged_scores(results=name), action="append", display="none",
                           model="mockllm/model", copy=False)
    finally:
        del _LOGGED[name], CHECKS[run]
    partial = target.with_name(f".{target.stem}.{os.getpid()}.partial{target.suffix}")
    try:
        write_eval_log(scored, str(partial), format="json" if target.suffix.lower() == ".json"
                       else "eval")
        os.replace(partial, target)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise OutputError.of(target, exc) from None
    return target
