"""grade(items, backend) -> records, chunk by chunk, resumable; and rescore, which needs no model."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.backends import Backend, Completion, Message
from grader.backends.budget import Fitted, Overflow, TokenBudget
from grader.config import SamplingConfig, TransformersConfig, VLLMConfig, answer_settings
from grader.io.dataset import Dataset, DatasetError, Item
from grader.io.manifest import model_fingerprint, model_identity, now, run_manifest, sha256_json
from grader.judge.judges import Judge, score_model_judge, seed_judge
from grader.io.lock import OutputLock
from grader.judge.records import AGGREGATES, Record, itemized_record, judged_record
from grader.io.results import (
    ResultsError,
    ResultsLog,
    ResultsWriter,
    SummaryError,
    line_number,
    read_records,
    read_summary,
    split_lines,
    summary_path,
    write_summary,
)
from grader.analysis.summary import Tally, summarize
from grader.status import Status
from grader.judge.prompts import RenderError, render_messages


@dataclass
class Job:
    """A row ready for the judge: its item and its rendered conversation (None: not sent)."""

    item: Item
    messages: list[Message] | None


def prepare_jobs(path: str, items: Sequence[Item], judge: Judge) -> list[Job]:
    """Render every row up front, so a template that does not fit the data fails before any model work."""
    jobs = []
    for item in items:
        if judge.missing(item) or item.invalid:
            jobs.append(Job(item, None))
            continue
        try:
            messages = render_messages(judge.prompt, item.fields, checklist=judge.checklist)
        except RenderError as exc:
            raise DatasetError(path, item.line, str(exc)) from None
        jobs.append(Job(item, messages))
    return jobs


def _completion_record(judge: Judge, item: Item, completion: Completion) -> Record:
    item_id = item.id
    usage = {"prompt_tokens": completion.prompt_tokens, "output_tokens": completion.output_tokens}
    if completion.finish_reason == "error":
        return judge.failed(
            item_id,
            completion.failure,
            completion.error or "the engine failed this row",
            raw_output=completion.text or None,
            finish_reason=completion.finish_reason,
            usage=usage,
        )
    if judge.format == "itemized":  # the judge's quotes are searched in the graded answer
        output_text = item.fields.get("output_text")
        evidence = {"output_text": None if output_text is None else str(output_text)}
    else:
        evidence = {}
    return judge.judged(item_id, completion.text, completion.finish_reason, usage=usage, **evidence)


def _row_record(
    judge: Judge, item: Item, completions: Sequence[Completion], aggregate: str
) -> Record:
    """One row's record from its completion, or from its samples' aggregate."""
    records = [_completion_record(judge, item, c) for c in completions]
    return records[0] if len(records) == 1 else judge.aggregate(records, aggregate)


def grade_chunk(
    jobs: Sequence[Job],
    backend: Backend,
    judge: Judge,
    budget: TokenBudget | None = None,
    rerender: Callable[[Item, dict[str, str]], list[Message]] | None = None,
    *,
    samples: int = 1,
    aggregate: str = "median",
) -> list[Record]:
    """Grade one chunk of rows; records come back in the chunk's order.

    Rows that do not fit the token budget become ``context_overflow`` (or are cut, when the
    budget allows); an exception from the backend marks the rows it was sent ``engine_error``.
    """
    records: list[Record | None] = [None] * len(jobs)
    sent: list[int] = []
    fitted: dict[int, Fitted] = {}
    for position, job in enumerate(jobs):
        if job.messages is None:
            records[position] = judge.unsent(job.item)
        else:
            sent.append(position)
    if budget is not None and sent:
        def fit(positions: list[int]) -> list[Fitted | Overflow]:
            return budget.fit(
                [jobs[p].messages for p in positions],  # type: ignore[misc]
                lambda i, cut: rerender(jobs[positions[i]].item, cut),  # type: ignore[misc]
                [jobs[p].item.fields for p in positions],
            )

        try:
            checked: list[Fitted | Overflow | Exception] = list(fit(sent))
        except Exception:  # a text the tokenizer cannot take: find it, and fail that row only
            checked = []
            for p in sent:
                try:
                    checked.extend(fit([p]))
                except Exception as exc:
                    checked.append(exc)
        still_sent = []
        for position, result in zip(sent, checked):
            if isinstance(result, Exception):
                records[position] = judge.failed(
                    jobs[position].item.id,
                    Status.ENGINE_ERROR,
                    f"counting prompt tokens failed: {type(result).__name__}: {result}",
                )
            elif isinstance(result, Fitted):
                fitted[position] = result
                still_sent.append(position)
            else:
                records[position] = judge.failed(
                    jobs[position].item.id,
                    Status.CONTEXT_OVERFLOW,
                    result.reason,
                    usage={"prompt_tokens": result.prompt_tokens, "output_tokens": None},
                )
        sent = still_sent
    if sent:
        conversations = [fitted[p].messages if p in fitted else jobs[p].messages for p in sent]
        try:
            completions = backend.generate(conversations)  # type: ignore[arg-type]
            if len(completions) != len(sent) * samples:
                raise RuntimeError(
                    f"backend returned {len(completions)} completions for {len(sent)} prompts"
                    f" x {samples} samples"
                )
        except Exception as exc:  # one failing chunk must not cost the run
            error = f"{type(exc).__name__}: {exc}"
            for p in sent:
                records[p] = judge.failed(jobs[p].item.id, Status.ENGINE_ERROR, error)
        else:
            for i, p in enumerate(sent):
                row = completions[i * samples : (i + 1) * samples]
                records[p] = _row_record(judge, jobs[p].item, row, aggregate)
                if p in fitted and fitted[p].truncation:
                    records[p]["truncation"] = fitted[p].truncation
    return records  # type: ignore[return-value]


def grade_jobs(
    jobs: Sequence[Job], backend: Backend, judge: Judge, chunk_size: int
) -> Iterator[list[Record]]:
    """Grade rows in chunks of ``chunk_size`` without a token budget; yields each chunk's records."""
    for start in range(0, len(jobs), chunk_size):
        yield grade_chunk(jobs[start : start + chunk_size], backend, judge)


@dataclass
class GradeRequest:
    """Everything ``grader grade`` was asked to do."""

    data: str
    output: Path
    model: str
    backend: str = "transformers"
    prompt: str | None = None  # None: the format's own prompt (judges.resolve_format)
    mapping: dict[str, str] = field(default_factory=dict)
    id_column: str | None = None
    checklist: bool = True
    format: str | None = None  # None: itemized for the itemized prompt, else the seed's (judges.py)
    limit: int | None = None
    chunk_size: int | None = None
    truncate: tuple[str, ...] = ()
    overwrite: bool = False
    grader_config: str | None = None  # an OpenAI score_model grader instead of the seed judge
    aggregate: str = "median"  # how a row's samples (sampling.n > 1) become one value
    shard: tuple[int, int] | None = None  # (k, n): grade rows k, k+n, k+2n, ... only
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    transformers: TransformersConfig = field(default_factory=TransformersConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)


class Interrupted(Exception):
    """The run stopped after a Ctrl-C, its finished chunks saved for a resume."""

    def __init__(self, done: int, total: int, partial: Path):
        self.done, self.total, self.partial = done, total, partial
        super().__init__(
            f"interrupted: {done} of {total} rows are graded and saved in {partial}; "
            "run the same command again to resume"
        )


class _FinishChunkOnInterrupt:
    """The first Ctrl-C asks the run to stop after the chunk in flight; a second stops at once."""

    def __enter__(self) -> _FinishChunkOnInterrupt:
        self.requested = False
        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        print(
            "\ninterrupt: finishing the current chunk, then stopping (Ctrl-C again to stop now)",
            file=sys.stderr,
        )

    def __exit__(self, *exc_info: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _progress(total: int, initial: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total, initial=initial, unit="row", desc="grading", file=sys.stderr, dynamic_ncols=True
    )


def _model_key(model: str) -> dict[str, Any]:
    """The model's part of the resume key: what it is, not where it lies or when it was copied."""
    try:
        identity = model_identity(model)
    except OSError:
        return {"model": model}
    return model_fingerprint(identity)


def _backend_config(request: GradeRequest, backend: str) -> TransformersConfig | VLLMConfig | None:
    return {"transformers": request.transformers, "vllm": request.vllm}.get(backend)


def judge_for(request: GradeRequest) -> Judge:
    """The seed judge, or the request's OpenAI score_model grader."""
    if request.grader_config:
        return score_model_judge(request.grader_config)
    return seed_judge(request.prompt, checklist=request.checklist, answer_format=request.format)


def load_engine(
    request: GradeRequest,
    backend_name: str,
    schema: dict[str, Any],
    max_tokens: int,
    backend_factory: Callable[..., Backend] | None = None,
) -> tuple[Backend, TokenBudget | None]:
    """The request's backend, loaded, and its token budget (None: it cannot count tokens).

    The one place a backend is built: in this process, in a ``--data-parallel`` worker, and
    in each Ray actor of ``--ray``.
    """
    if backend_factory is None:
        from grader.backends import load_backend as backend_factory
    config = _backend_config(request, backend_name)
    backend = backend_factory(
        backend_name,
        model=request.model,
        schema=schema,
        sampling=request.sampling,
        max_tokens=max_tokens,
        **({"config": config} if config is not None else {}),
    )
    budget = None
    if getattr(backend, "context_length", None):
        budget = TokenBudget(
            backend.count_tokens,  # type: ignore[attr-defined]
            context_length=backend.context_length,  # type: ignore[attr-defined]
            max_tokens=max_tokens,
            truncate=request.truncate,
            upper_bounds=getattr(backend, "token_upper_bounds", None),
        )
    return backend, budget


def grade_pending(
    pending: Sequence[tuple[Job, str]],
    backend: Backend,
    judge: Judge,
    budget: TokenBudget | None,
    request: GradeRequest,
) -> list[tuple[int, Record]]:
    """Grade rows (job, resume key); each record comes back keyed, with its row's position."""

    def rerender(item: Item, cut: dict[str, str]) -> list[Message]:
        return render_messages(judge.prompt, item.fields | cut, checklist=judge.checklist)

    graded = grade_chunk(
        [job for job, _ in pending],
        backend,
        judge,
        budget,
        rerender,
        samples=request.sampling.n,
        aggregate=request.aggregate,
    )
    return [
        (job.item.index, record | {"key": job_key})
        for (job, job_key), record in zip(pending, graded)
    ]


class LocalEngine:
    """Grades in this process, block by block as the dataset streams past."""

    def __init__(self, backend: Backend, budget: TokenBudget | None, judge: Judge, request: GradeRequest):
        self.backend, self.budget, self.judge, self.request = backend, budget, judge, request
        self.chunk_size = request.chunk_size or backend.chunk_size

    def grade(self, blocks: Iterable[list[tuple[Job, str]]]) -> Iterator[list[tuple[int, Record]]]:
        for pending in blocks:
            if pending:
                yield grade_pending(pending, self.backend, self.judge, self.budget, self.request)

    def describe(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """The engine and token budget, for the run manifest."""
        return self.backend.describe(), self.budget.describe() if self.budget else None

    def close(self) -> None:
        """Stop the backend's engine processes, if it has any (vLLM's), before the run returns."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


def run_grade(
    request: GradeRequest,
    *,
    backend_factory: Callable[..., Backend] | None = None,
    ray_address: str | None = None,
    replicas: int | None = None,
) -> dict[str, Any]:
    """Read, render, grade and write, resuming what an earlier run of the same job finished.

    The dataset is streamed twice and never held whole: a first pass validates and renders
    every row (bad input fails before any model work) and counts the rows left to grade (the
    model loads only if there are any); a second grades them block by block. Memory stays
    flat in the number of rows: 9 bytes a row say where each record lies in the log.

    With ``ray_address`` the rows are graded by a Ray Data pipeline of ``replicas`` engine
    actors (:mod:`grader.run.ray_cluster`); everything else, resume included, is the same.

    Returns the summary (also written beside the results). ``backend_factory`` replaces
    :func:`grader.backends.load_backend` (tests pass a fake). Raises :class:`Interrupted` after
    a Ctrl-C, once the chunk in flight is saved.
    """
    started = now()
    if request.aggregate not in AGGREGATES:
        raise ValueError(f"unknown aggregate {request.aggregate!r}: choose from {AGGREGATES}")
    # Taken before anything is read or written: a second run on the same output stops here.
    with OutputLock(request.output), contextlib.ExitStack() as opened:
        return _run_grade(request, started, opened, backend_factory, ray_address, replicas)


def _run_grade(
    request: GradeRequest,
    started: str,
    opened: contextlib.ExitStack,
    backend_factory: Callable[..., Backend] | None,
    ray_address: str | None,
    replicas: int | None,
) -> dict[str, Any]:
    """run_grade's work, under the output's lock; ``opened`` closes the dataset, the cluster
    and the engine."""
    judge = judge_for(request)
    check_not_input(request.data, request.output)
    dataset = opened.enter_context(
        Dataset(
            request.data,
            mapping=request.mapping,
            id_column=request.id_column,
            limit=request.limit,
            shard=request.shard,
        )
    )

    schema = judge.schema
    max_tokens = request.sampling.max_tokens or judge.max_tokens
    backend_name, reason = request.backend, None
    cluster = None
    if ray_address is not None:
        from grader.run.ray_cluster import RayCluster

        cluster = RayCluster(ray_address)
        # closed however the run ends: a bad row found below must not leave a cluster open
        opened.callback(cluster.close)
        if backend_name == "auto":
            backend_name, reason = cluster.choose_backend()
    elif backend_name == "auto":
        from grader.backends import choose_backend

        backend_name, reason = choose_backend("auto")
    config = _backend_config(request, backend_name)
    # Everything that changes an answer is in the key: a changed prompt, model, sampling,
    # schema or engine setting re-grades the affected rows on resume; batch sizes do not.
    run_key = sha256_json(
        {
            "model": _model_key(request.model),
            "backend": backend_name,
            "sampling": request.sampling.model_dump() | {"max_tokens": max_tokens},
            "schema": sha256_json(schema),
            "settings": answer_settings(backend_name, config),
            "truncate": sorted(request.truncate),
            "aggregate": request.aggregate if request.sampling.n > 1 else None,
        }
    )

    def key(job: Job) -> str:
        return sha256_json([job.item.id, job.messages, run_key])

    log = ResultsLog(request.output, overwrite=request.overwrite)
    # Pass 1: every row validated and rendered before any model work; what is left to grade.
    total = to_grade = 0
    resuming = log.resumable > 0  # a fresh run needs no keys until it writes
    for item in dataset:
        job = prepare_jobs(dataset.name, [item], judge)[0]
        total += 1
        to_grade += job.messages is not None and not (resuming and log.lookup(key(job)))
    dataset.check_unique_ids()

    engine: Any = None
    if to_grade:  # a backend that fails to load leaves no file behind: nothing is written yet
        if reason:
            print(f"backend: {backend_name} ({reason})", file=sys.stderr)
        if cluster is not None:
            engine = cluster.engine(request, backend_name, schema, max_tokens, replicas=replicas)
        else:
            backend, budget = load_engine(request, backend_name, schema, max_tokens, backend_factory)
            engine = LocalEngine(backend, budget, judge, request)
            opened.callback(engine.close)
    chunk_size = engine.chunk_size if engine else (request.chunk_size or 1024)

    # Pass 2: blocks of rows; each record's place in the log is kept, by row, in two arrays.
    sources, offsets = array("b", [-1]) * total, array("q", [0]) * total
    resumed = done = 0

    def place(records: list[tuple[int, Record]]) -> None:
        nonlocal done
        if not records:  # a write is a flush and an fsync: none for nothing
            return
        for (position, _), (source, offset) in zip(records, log.write(r for _, r in records)):
            sources[position], offsets[position] = source, offset
        done += len(records)
        bar.update(len(records))

    def pending_blocks() -> Iterator[list[tuple[Job, str]]]:
        # Rows resumed or never sent are placed here; the rest go to the engine.
        nonlocal resumed, done
        seen = 0
        for block in _blocks(dataset, chunk_size):
            unsent: list[tuple[int, Record]] = []
            pending: list[tuple[Job, str]] = []
            seen += len(block)
            if seen > total:
                raise DatasetError(dataset.name, None, "changed while it was being graded")
            for job in prepare_jobs(dataset.name, block, judge):
                job_key, position = key(job), job.item.index
                earlier = log.lookup(job_key)
                if earlier is not None:
                    sources[position], offsets[position] = earlier
                    resumed += 1
                    done += 1
                    bar.update(1)
                elif job.messages is None:
                    unsent.append((position, judge.unsent(job.item) | {"key": job_key}))
                else:
                    pending.append((job, job_key))
            place(unsent)
            if pending and engine is None:
                # rows the first pass did not see: what is graded so far stays for a rerun
                raise DatasetError(dataset.name, None, "changed while it was being graded")
            yield pending
        if seen != total:  # rows gone since the first pass: their places would stay empty
            raise DatasetError(dataset.name, None, "changed while it was being graded")

    try:
        with _FinishChunkOnInterrupt() as interrupt, _progress(total, 0) as bar:
            if engine is None:
                for _ in pending_blocks():
                    pass
            else:
                for graded in engine.grade(pending_blocks()):
                    place(graded)
                    if interrupt.requested and done < total:
                        raise Interrupted(done, total, log.partial)
    finally:
        log.close()

    if engine is not None:
        engine_info, token_budget = engine.describe()
    else:
        # Every row was resumed: what graded them is in the summary of the run that did.
        earlier_run = _earlier_run(request.output, run_key)
        engine_info, token_budget = earlier_run.get("engine"), earlier_run.get("token_budget")
    judge_fields = {
        "judge": judge.manifest,
        "prompt": {
            "name": judge.prompt.name,
            "path": str(judge.prompt.path),
            "sha256": judge.prompt.sha256,
        },
        "schema_sha256": sha256_json(schema),
        "checklist": judge.checklist,
        "format": judge.format if judge.kind == "seed" else None,
        "aggregate": request.aggregate if request.sampling.n > 1 else None,
        "model": {"name": request.model, **_model_manifest(request.model)},
        "sampling": request.sampling.model_dump() | {"max_tokens": max_tokens},
        "backend": backend_name,
        "run_key": run_key,
    }
    run = run_manifest(
        started=started,
        data=request.data,
        results=str(request.output),
        rows=total,
        resumed_rows=resumed,
        judge=judge_fields,
        engine=engine_info,
        token_budget=token_budget,
        **({"ray": cluster.describe()} if cluster is not None else {}),
    )
    # The results file is written in input order while the summary reads it.
    summary = summarize(log.finish(zip(sources, offsets)), run=run)
    summary["run"]["finished"] = now()
    write_summary(summary_path(request.output), summary)
    return summary


def check_not_input(data: str, output: Path) -> None:
    """A results file that is the input file would replace the data it is graded from."""
    try:
        same = data != "-" and os.path.samefile(data, output)
    except OSError:  # either one does not exist (yet): they are not the same file
        same = False
    if same:
        raise DatasetError(data, None, f"is also the results file -o {output}: grading would overwrite it")


def _blocks(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    """``items`` in lists of ``size`` (itertools.batched, which needs Python 3.12)."""
    iterator = iter(items)
    while block := list(itertools.islice(iterator, size)):
        yield block


def _earlier_run(results: Path, run_key: str) -> dict[str, Any]:
    try:
        run = (read_summary(results) or {}).get("run") or {}
    except SummaryError:
        return {}
    return run if run.get("run_key") == run_key else {}


def _model_manifest(model: str) -> dict[str, Any]:
    try:
        return model_identity(model)
    except OSError as exc:
        return {"error": str(exc)}


# A rescore of a file at least this big runs in several processes (one per part, at most one
# per CPU, 8 at most): below it, starting them costs more than they save.
RESCORE_PARALLEL_BYTES = 32 * 2**20


def rescore(
    source: str | Path, output: Path, *, grader_config: str | None = None, workers: int | None = None
) -> dict[str, Any]:
    """Re-parse each record's ``raw_output`` (each sample's, for several) and recompute it; no
    model is loaded.

    Records without ``raw_output`` (missing context, engine errors) keep their status. Fields
    other than the recomputed ones (usage, extra columns) are carried over. Records of an
    OpenAI score_model grader need its config (``grader_config``) to be read again.

    A big file is cut into line-aligned parts rescored by ``workers`` processes (default:
    one per CPU from RESCORE_PARALLEL_BYTES up); their records are joined in file order and
    their tallies merged, so the output and summary are those of one process.
    """
    started = now()
    with OutputLock(output):
        if workers is None:
            big = os.path.getsize(source) >= RESCORE_PARALLEL_BYTES
            workers = min(len(os.sched_getaffinity(0)), 8) if big else 1
        parts = split_lines(source, workers) if workers > 1 else [(0, None)]
        # The judge that wrote the raw outputs is the source's: its manifest carries over.
        try:
            graded = (read_summary(source) or {}).get("run") or {}
        except SummaryError:
            graded = {}
        writer = ResultsWriter(output)
        try:
            if len(parts) == 1:
                tally = _rescore_part(source, 0, None, grader_config, writer)
            else:
                tally = _rescore_in_processes(source, parts, grader_config, writer)
            writer.commit()
        except BaseException:
            writer.abort()
            raise
        run = run_manifest(
            started=started,
            data=graded.get("data"),
            results=str(output),
            rows=tally.rows,
            resumed_rows=None,
            judge=graded,
            engine=graded.get("engine"),
            token_budget=graded.get("token_budget"),
            rescored_from=str(source),
        )
        summary = tally.summary(run=run)
        summary["run"]["finished"] = now()
        write_summary(summary_path(output), summary)
    return summary


def _rescore_part(
    source: str | Path,
    start: int,
    end: int | None,
    grader_config: str | None,
    writer: ResultsWriter,
) -> Tally:
    """Rescore the records in bytes [start, end) of ``source`` into ``writer``."""
    judge = score_model_judge(grader_config) if grader_config else seed_judge(answer_format="seed")

    def again(record: Record, answer_format: str) -> Record | None:
        if record.get("raw_output") is None or record.get("finish_reason") == "error":
            return None
        usage = {"usage": record["usage"]} if "usage" in record else {}
        finish = record.get("finish_reason", "stop")
        if judge.kind == "seed" and answer_format == "itemized":
            # no dataset here to search quotes in: the check made when it was graded stands
            return itemized_record(
                record["id"], record["raw_output"], finish,
                evidence_not_found=record.get("evidence_not_found"), **usage,
            )
        return judge.judged(record["id"], record["raw_output"], finish, **usage)

    def kept(item_id: Any, sample: Record) -> Record:
        # a sample the engine failed: rebuilt as it was, with nothing to re-parse
        rest = {k: v for k, v in sample.items() if k not in {"status", "error"}}
        return judge.failed(item_id, Status(sample["status"]), sample.get("error") or "", **rest)

    def rescored() -> Iterator[Record]:
        # streamed: a million records are never in memory at once
        for line, record in read_records(source, start=start, end=end):
            if "result" in record and judge.kind != "score_model":
                raise ResultsError.at(
                    source, line, "a score_model grader's record: pass its --grader-config"
                )
            problem = _unusable(record, judge.value_key)
            if problem:
                raise ResultsError.at(source, line, problem)
            # a record written before formats existed is in the seed's format
            answer_format = record.get("format") or "seed"
            if record.get("samples"):
                samples = [
                    again({"id": record["id"], **sample}, answer_format)
                    or kept(record["id"], sample)
                    for sample in record["samples"]
                ]
                fresh = judge.aggregate(samples, record.get("aggregate", "median"))
            else:
                fresh = again(record, answer_format)
            new = record if fresh is None else {**record, **fresh}
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


_STATUSES = frozenset(str(status) for status in Status)


def _unusable(record: Record, value_key: str) -> str | None:
    """Why rescore cannot take this record (a hand-edited file, another tool's), or None.

    Each check names what would otherwise be a traceback halfway through the file.
    """
    if not isinstance(record.get("raw_output"), (str, type(None))):
        return "raw_output must be a string or null"
    samples = record.get("samples")
    if samples:
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            return "samples must be a list of objects"
        if record.get("aggregate", "median") not in AGGREGATES:
            return f"unknown aggregate {record.get('aggregate')!r}: expected one of {', '.join(AGGREGATES)}"
        for number, sample in enumerate(samples, start=1):
            if not isinstance(sample.get("raw_output"), (str, type(None))):
                return f"sample {number}: raw_output must be a string or null"
            rescorable = sample.get("raw_output") is not None and sample.get("finish_reason") != "error"
            if not rescorable and sample.get("status") not in _STATUSES:
                return f"sample {number}: no raw_output to rescore and no known status to keep"
        return None
    if record.get("raw_output") is not None and record.get("finish_reason") != "error":
        return None  # rescored: whatever else it holds is replaced
    # kept as it is: the summary counts it by its status and score
    status = record.get("status")
    if not isinstance(status, str):
        return "no raw_output to rescore and no status to keep"
    value = record.get(value_key)
    if status == Status.OK and value_key == "score" and (
        type(value) is not int or not 0 <= value <= 5
    ):
        return f"status ok with score {value!r}: expected an integer from 0 to 5"
    if status == Status.OK and value_key == "result" and (
        type(value) not in (int, float) or value != value
    ):
        return f"status ok with result {value!r}: expected a number"
    return None


def _rescore_worker(
    source: str, start: int, end: int, grader_config: str | None, part: str
) -> Tally:
    writer = ResultsWriter(Path(part))
    try:
        tally = _rescore_part(source, start, end, grader_config, writer)
        writer.commit()
    except BaseException:
        writer.abort()
        raise
    return tally


def _rescore_in_processes(
    source: str | Path,
    parts: list[tuple[int, int]],
    grader_config: str | None,
    writer: ResultsWriter,
) -> Tally:
    from concurrent.futures import ProcessPoolExecutor

    folder = Path(tempfile.mkdtemp(prefix=".rescore-", dir=writer.path.parent))
    files = [folder / f"part-{index:04d}.jsonl" for index in range(len(parts))]
    try:
        with ProcessPoolExecutor(len(parts)) as pool:
            futures = [
                pool.submit(_rescore_worker, str(source), start, end, grader_config, str(file))
                for (start, end), file in zip(parts, files)
            ]
            tally = Tally()
            # in file order: the first failing part's error is the one a single process meets
            for future, file in zip(futures, files):
                tally.merge(future.result())
                writer.append_file(file)
                file.unlink()
        return tally
    finally:
        shutil.rmtree(folder, ignore_errors=True)
