"""rescore: re-read each record's ``raw_output`` and recompute it; no model is loaded."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grader.analysis.summary import Summary, Tally
from grader.analysis.verdict import JudgeCheck, stored_check
from grader.io.lock import OutputLock
from grader.io.manifest import now, run_manifest
from grader.io.outputs import check_outputs, results_files
from grader.io.results import (
    ResultsWriter,
    commit_with_summary,
    line_number,
    read_records,
    split_lines,
    summary_path,
)
from grader.judge.judges import JUDGE_CLASSES, Answer, Judge, rescoring_judges
from grader.records import Record, ResultsError
from grader.run.owner import check_rescore_output, same_file, summary_or_empty

# A rescore of a file at least this big runs in several processes (one per part, at most one
# per CPU, 8 at most): below it, starting them costs more than they save.
RESCORE_PARALLEL_BYTES = 32 * 2**20


def rescore(source: str | Path, output: Path, *, grader_config: str | None = None,
            workers: int | None = None, overwrite: bool = False) -> Summary:
    """Re-parse each record's ``raw_output`` (each sample's, for several) and recompute it; no
    model is loaded.

    Records without ``raw_output`` (missing context, engine errors) keep their status. Fields
    other than the recomputed ones (usage, extra columns) are carried over. Records of an
    OpenAI score_model grader need its config (``grader_config``) to be read again.

    A big file is cut into line-aligned parts rescored by ``workers`` processes (default:
    one per CPU from RESCORE_PARALLEL_BYTES up); their records are joined in file order and
    their tallies merged, so the output and summary are those of one process.

    ``output``, where it exists, must be ``source`` or results of the run that graded it
    (:func:`grader.run.owner.check_rescore_output`) unless ``overwrite``. The results and
    their summary are both written before either is put in place: a full disk changes neither.
    """
    started = now()
    # in place is allowed (the records are read whole before the file is replaced); any other
    # file rescore reads is never its output
    in_place = same_file(source, output)
    reads = [grader_config] + ([] if in_place else [source, summary_path(Path(source))])
    with OutputLock(output):  # a second run on the same output stops first
        check_outputs(results_files(output)[:3], reads, overwrite=overwrite)
        if not overwrite:
            check_rescore_output(Path(source), output)
        if workers is None:
            big = os.path.getsize(source) >= RESCORE_PARALLEL_BYTES
            workers = min(len(os.sched_getaffinity(0)), 8) if big else 1
        parts = split_lines(source, workers) if workers > 1 else []
        # The judge that wrote the raw outputs is the source's: its manifest carries over.
        earlier = summary_or_empty(source)
        graded = earlier.get("run") or {}
        writer = ResultsWriter(output)
        try:
            if len(parts) <= 1:
                tally = _rescore_part(source, 0, None, grader_config, writer)
            else:
                tally = _rescore_in_processes(source, parts, grader_config, writer)
            run = run_manifest(
                started=started, data=graded.get("data"), results=str(output), rows=tally.rows,
                resumed_rows=None, judge=graded, engine=graded.get("engine"),
                token_budget=graded.get("token_budget"),
                # the rescored file belongs to the run that graded the records it holds
                identity=graded.get("identity"), rescored_from=str(source),
                # what the graded run's preparation stage made (what the records were
                # marked against), as its manifest has it; unknown (None) for a file of a
                # judge with a stage without its summary
                **_stage_entries(source, graded))
            # the summary is made before the records are put in place: if it cannot be, no
            # output appears at all (never records without their summary)
            summary = tally.summary(run=run)
            check = stored_check(earlier, summary_path(Path(source)))
            if check is not None:
                # the grade run's verdict on its judge, recomputed from its controls' raw
                # text as the results are (the controls file itself is not rewritten)
                summary.judge_check = _judge_check(Path(source), check, grader_config)
            run.finished = now()
            commit_with_summary(writer, summary_path(output), summary)
        except BaseException:
            writer.abort()
            raise
    return summary


def _judge_check(source: Path, earlier: JudgeCheck, grader_config: str | None) -> JudgeCheck:
    """The judge check of ``source``'s run, recomputed from its controls file (beside it);
    the stored one where that file is gone or cannot be read."""
    from grader.run.controls import controls_path, recomputed_verdict

    path = controls_path(source)
    if not path.is_file():
        return earlier
    try:
        records = [record for _, record in read_records(path)]
    except ResultsError:
        return earlier
    judges = rescoring_judges(grader_config)
    return recomputed_verdict([recompute(record, judges)[1] for record in records], judges, earlier)


def _stage_entries(source: str | Path, graded: dict[str, Any]) -> dict[str, Any]:
    """The graded run's manifest entries of a preparation stage (:attr:`Judge.stage`): each
    one the manifest has, and the stage of the judge of ``source``'s first record (a run has
    one format), None where the manifest lacks it."""
    names = {judge.stage.name for judge in JUDGE_CLASSES.values() if judge.stage is not None}
    own = None
    for _, record in read_records(source):
        # a kind without a judge of its own is the seed judge's, as rescoring_judges has it
        stage = JUDGE_CLASSES.get(record.kind or "seed", JUDGE_CLASSES["seed"]).stage
        own = stage.name if stage is not None else None
        break
    return {name: graded.get(name) for name in sorted(names) if name in graded or name == own}


def _rescore_part(source: str | Path, start: int, end: int | None, grader_config: str | None,
                  writer: ResultsWriter) -> Tally:
    """Rescore the records in bytes [start, end) of ``source`` into ``writer``."""
    judges = rescoring_judges(grader_config)

    def rescored() -> Iterator[Record]:
        # streamed: a million records are never in memory at once
        for line, record in read_records(source, start=start, end=end):
            problem, new = recompute(record, judges)
            if problem:
                raise ResultsError.at(source, line, problem)
            try:
                writer.write([new])
            except ValueError:  # NaN or Infinity: what json.loads reads and a strict writer refuses
                raise ResultsError.at(source, line, "a number JSON cannot hold (NaN or Infinity)") from None
            yield new

    tally = Tally()
    try:
        tally.add(rescored())
    except ResultsError as exc:
        if start:  # a later part numbers its lines from 1: name the file's own line
            raise exc.shifted(line_number(source, start) - 1) from None
        raise
    return tally


def recompute(record: Record, judges: dict[str | None, Judge]) -> tuple[str | None, Record]:
    """``record`` with every field its judge reads from its raw text recomputed (rescore's
    one code path, also a resumed run's: :func:`distrusts`); ``(problem, record)``, where a
    problem (a record its judge cannot read again) leaves the record as it was.

    Args:
        judges: :func:`grader.judge.judges.rescoring_judges`.
    """
    # a record that names no format (written before formats existed, or a hand-edited list)
    # is the seed judge's, to read or to refuse
    judge = judges.get(record.kind, judges[None])
    problem = judge.unusable(record)
    if problem:
        return problem, record
    fresh: Record | None
    if record.samples:
        # a sample keeps its own answer; what the row gave every sample (the items its labels
        # are counted against) lies on the record
        samples = [_reread(judge, Answer.of_sample(record, sample)) or judge.kept(record.id, sample)
                   for sample in record.samples]
        fresh = judge.aggregate(samples, record.aggregate or "median")
    else:
        fresh = _reread(judge, Answer.of_record(record))
    return None, record if fresh is None else record.with_fields_of(fresh)


def distrusts(record: Record, judges: dict[str | None, Judge]) -> bool:
    """Whether a kept record says other than its own raw text: a field its judge recomputes
    (the score, the items, the counts) edited since, or a record its judge cannot read."""
    problem, fresh = recompute(record, judges)
    return problem is not None or fresh.to_dict() != record.to_dict()


def _reread(judge: Judge, answer: Answer | None) -> Record | None:
    """The record of a kept answer, read again; None when there is none to re-read."""
    return None if answer is None else judge.read(answer)


def _rescore_worker(source: str, start: int, end: int, grader_config: str | None, part: str
                    ) -> Tally:
    writer = ResultsWriter(Path(part))
    try:
        tally = _rescore_part(source, start, end, grader_config, writer)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    return tally


def _rescore_in_processes(source: str | Path, parts: list[tuple[int, int]],
                          grader_config: str | None, writer: ResultsWriter) -> Tally:
    from concurrent.futures import ProcessPoolExecutor

    folder = Path(tempfile.mkdtemp(prefix=".rescore-", dir=writer.path.parent))
    files = [folder / f"part-{index:04d}.jsonl" for index in range(len(parts))]
    try:
        with ProcessPoolExecutor(len(parts)) as pool:
            futures = [pool.submit(_rescore_worker, str(source), s, e, grader_config, str(file))
                       for (s, e), file in zip(parts, files, strict=True)]
            tally = Tally()
            # in file order: the first failing part's error is the one a single process meets
            for future, file in zip(futures, files, strict=True):
                tally.merge(future.result())
                writer.append_file(file)
                file.unlink()
        return tally
    finally:
        shutil.rmtree(folder, ignore_errors=True)
