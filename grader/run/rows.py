"""Rows -> records: render each row's prompt, fit it to the context, send a chunk to a backend,
turn each completion into a record. The same code grades in this process, in a
``--data-parallel`` worker and in a Ray actor."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grader.backends import Backend, Completion, GenerateRequest, LoopStop, Message
from grader.backends.budget import Fitted, Overflow, TokenBudget
from grader.io.dataset import DatasetError, Item
from grader.io.results import Location
from grader.judge.judges import Answer, Judge
from grader.judge.prompts import RenderError, render_messages, renders
from grader.judge.schema import END_ON_LOOP
from grader.records import Record, Usage
from grader.run.ahead import Runner, Watch
from grader.run.request import GradeRequest, judge_for
from grader.status import Status


@dataclass
class Unsent:
    """A row the judge never sees (missing content, invalid input): the judge records why
    (:meth:`Judge.unsent`)."""

    item: Item
    messages: None = None  # in its resume key as a sent row's conversation is
    more: tuple[Job, ...] = ()


@dataclass
class Job:
    """A row ready for the judge: its item and its rendered conversation."""

    item: Item
    messages: list[Message]
    schema: dict[str, Any] | None = None  # this row's own schema (Judge.row_schema)
    # The row's further conversations (Judge.more_views: the pairwise format's swapped order),
    # each sent and read like a row of its own, then joined with this one into the row's one
    # record (Judge.join). The row stays one row for everything around the chunk: its resume
    # key, its place in the results, the progress bar.
    more: tuple[Job, ...] = ()
    # The fields its prompt was rendered from where the judge added to the row's own
    # (Judge.context: what the judge's stage prepared); its answer is read, and its prompt cut to
    # fit, against them. None: the row's own.
    fields: Mapping[str, Any] | None = None
    # The judge that reads its answer where it is not the run's (a preparation stage's own
    # rows, grader.run.stage); a block holds one judge's rows.
    judge: Judge | None = None

    @property
    def context(self) -> Mapping[str, Any]:
        return self.item.fields if self.fields is None else self.fields


def prepare_jobs(path: str, items: Sequence[Item], judge: Judge) -> list[Job | Unsent]:
    """Render every row up front, so a template that does not fit the data fails before any model work."""
    jobs: list[Job | Unsent] = []
    for item in items:
        fields = None if judge.missing(item) or item.invalid else judge.context(item)
        if fields is None:
            jobs.append(Unsent(item))
            continue
        try:
            messages = render_messages(judge.prompt, _as_dict(fields), checklist=judge.checklist)
            more = tuple(
                Job(view, render_messages(judge.prompt, view.fields, checklist=judge.checklist),
                    judge.row_schema(view))
                for view in judge.more_views(item)
            )
        except RenderError as exc:
            raise DatasetError(path, item.line, str(exc)) from None
        jobs.append(Job(item, messages, judge.row_schema(item), more,
                        None if fields is item.fields else fields))
    return jobs


def sends(path: str, item: Item, judge: Judge) -> bool:
    """Whether the row is sent, checked as :func:`prepare_jobs` checks it (a template that
    cannot render it raises the same :class:`DatasetError`), rendered only where the prompt
    may fail on it: a plain prompt over the row's own text, checked as it was read
    (:attr:`Item.invalid`), cannot (:func:`renders`)."""
    if (not item.invalid and not judge.missing(item) and judge.context(item) is item.fields
            and not judge.more_views(item) and renders(judge.prompt, item.fields)):
        return True
    return isinstance(prepare_jobs(path, [item], judge)[0], Job)


@dataclass
class Sorted:
    """A block's rows sorted by what becomes of them (:func:`sort_jobs`)."""

    resumed: list[tuple[int, Location]]  # position, where its record lies in the log
    unsent: list[tuple[int, Record]]  # position, its record (keyed): not sent
    pending: list[tuple[Job, str]]  # to grade, with its resume key


def sort_jobs(jobs: Sequence[Job | Unsent], key: Callable[[Job | Unsent], str], judge: Judge,
              lookup: Callable[[str], Location | None] | None = None) -> Sorted:
    """Rows as every run sorts them: those a results log holds (``lookup``: resumed), those
    not sent (the judge's record of why, with its key), and those left to grade."""
    sorted_ = Sorted([], [], [])
    for job in jobs:
        job_key, position = key(job), job.item.index
        earlier = lookup(job_key) if lookup is not None else None
        if earlier is not None:
            sorted_.resumed.append((position, earlier))
        elif isinstance(job, Unsent):
            record = judge.unsent(job.item)
            record.key = job_key
            sorted_.unsent.append((position, record))
        else:
            sorted_.pending.append((job, job_key))
    return sorted_


def _as_dict(fields: Mapping[str, Any]) -> dict[str, Any]:
    return fields if isinstance(fields, dict) else dict(fields)


def _row_record(judge: Judge, job: Job, completions: Sequence[Completion], aggregate: str
                ) -> Record:
    """One row's record from its completion, or from its samples' aggregate."""
    records = [judge.read(Answer.of_completion(job.item, c, job.fields)) for c in completions]
    return records[0] if len(records) == 1 else judge.aggregate(records, aggregate)


def grade_chunk(jobs: Sequence[Job], backend: Backend | Runner, judge: Judge,
                budget: TokenBudget | None = None, *, samples: int = 1, aggregate: str = "median",
                watch: Watch | None = None) -> list[Record]:
    """Grade one chunk of rows; records come back in the chunk's order.

    Rows that do not fit the token budget become ``context_overflow`` (or are cut, when the
    budget allows); an exception from the backend marks the rows it was sent ``engine_error``.
    A row with further conversations (:attr:`Job.more`) is graded as that many rows, sent in
    the same call, and joined into its one record by the judge. ``backend``: a backend, or the
    run's :class:`~grader.run.ahead.Runner` around it; ``watch``: what the call hears as each
    row finishes (a streaming backend's).
    """
    with contextlib.ExitStack() as scope:
        if not isinstance(backend, Runner):  # a runner for this chunk alone
            backend = scope.enter_context(contextlib.closing(Runner(backend)))
        if not any(job.more for job in jobs):
            return _grade_views(jobs, backend, judge, budget, samples, aggregate, watch)
        views = [view for job in jobs for view in (job, *job.more)]
        if watch is not None and watch.progress is not None:
            # the bar counts rows: a sent row is this many conversations
            size = max(1 + len(job.more) for job in jobs)
            watch = dataclasses.replace(watch, progress=_RowsOf(watch.progress, size))
        graded = iter(_grade_views(views, backend, judge, budget, samples, aggregate, watch))
    joined = []
    for job in jobs:
        first = next(graded)
        joined.append(judge.join(job.item, [first, *(next(graded) for _ in job.more)])
                      if job.more else first)
    return joined


class _RowsOf:
    """A call's progress tick, heard as each conversation finishes, turned into rows of
    ``size`` conversations for the run's bar."""

    def __init__(self, report: Callable[[int], None], size: int) -> None:
        self.report, self.size, self.finished = report, size, 0

    def __call__(self, conversations: int) -> None:
        before = self.finished // self.size
        self.finished += conversations
        if self.finished // self.size > before:
            self.report(self.finished // self.size - before)


def _grade_views(jobs: Sequence[Job], backend: Runner, judge: Judge, budget: TokenBudget | None,
                 samples: int, aggregate: str, watch: Watch | None) -> list[Record]:
    """:func:`grade_chunk` for conversations each read into a record of its own."""
    records: dict[int, Record] = {}
    sent = list(range(len(jobs)))
    fitted: dict[int, Fitted] = {}
    if budget is not None and sent:
        fitted = _fit(jobs, sent, budget, judge, records)
        sent = list(fitted)
    if sent:
        _generate(jobs, sent, fitted, backend, judge, records, samples, aggregate, watch)
    return [records[position] for position in range(len(jobs))]


def _fit(jobs: Sequence[Job], sent: list[int], budget: TokenBudget, judge: Judge,
         records: dict[int, Record]) -> dict[int, Fitted]:
    """The rows of ``sent`` that fit the budget (cut, where it allows), by position; the
    others get their record here: ``context_overflow``, or ``engine_error`` for a text the
    tokenizer cannot take."""
    fitted: dict[int, Fitted] = {}
    for position, result in zip(sent, _check_budget(jobs, sent, budget, judge), strict=True):
        item = jobs[position].item
        if isinstance(result, Fitted):
            fitted[position] = result
        elif isinstance(result, Exception):
            records[position] = judge.failed(
                item.id, Status.ENGINE_ERROR,
                f"counting prompt tokens failed: {type(result).__name__}: {result}")
        else:
            records[position] = judge.failed(
                item.id, Status.CONTEXT_OVERFLOW, result.reason,
                usage=Usage(prompt_tokens=result.prompt_tokens, output_tokens=None))
    return fitted


def _check_budget(jobs: Sequence[Job], sent: list[int], budget: TokenBudget, judge: Judge
                  ) -> list[Fitted | Overflow | Exception]:
    """Each sent row fitted to the budget (a row cut where it allows: rendered again from its
    cut fields), or why it does not fit; a text the tokenizer cannot take fails that row only."""

    def rerender(job: Job, cut: dict[str, str]) -> list[Message]:
        return render_messages(judge.prompt, {**job.context, **cut}, checklist=judge.checklist)

    def fit(positions: list[int]) -> list[Fitted | Overflow]:
        return budget.fit([jobs[p].messages for p in positions],
                          lambda i, cut: rerender(jobs[positions[i]], cut),
                          [jobs[p].item.fields for p in positions])

    try:
        return list(fit(sent))
    except Exception:  # one row at a time, to find the one that fails
        checked: list[Fitted | Overflow | Exception] = []
        for p in sent:
            try:
                checked.extend(fit([p]))
            except Exception as exc:
                checked.append(exc)
        return checked


def _generate(jobs: Sequence[Job], sent: list[int], fitted: dict[int, Fitted], backend: Runner,
              judge: Judge, records: dict[int, Record], samples: int, aggregate: str,
              watch: Watch | None) -> None:
    """Send the rows of ``sent`` in one call and record each one's answer; an exception from
    the backend marks them all ``engine_error``."""
    conversations = [fitted[p].messages if p in fitted else jobs[p].messages for p in sent]
    try:
        completions = backend.generate(
            [generate_request(c, jobs[p].schema, judge.loop_test)
             for c, p in zip(conversations, sent, strict=True)], watch)
        if len(completions) != len(sent) * samples:
            raise RuntimeError(f"backend returned {len(completions)} completions for "
                               f"{len(sent)} prompts x {samples} samples")
    except Exception as exc:  # one failing chunk must not cost the run
        error = f"{type(exc).__name__}: {exc}"
        for p in sent:
            records[p] = judge.failed(jobs[p].item.id, Status.ENGINE_ERROR, error)
        return
    for i, p in enumerate(sent):
        row = completions[i * samples : (i + 1) * samples]
        record = records[p] = _row_record(judge, jobs[p], row, aggregate)
        if p in fitted and fitted[p].truncation:
            record.truncation = fitted[p].truncation


def generate_request(messages: list[Message], schema: dict[str, Any] | None,
                     loop_test: Callable[[str], bool] | None = None) -> GenerateRequest:
    """A row's request to the backend: its conversation and schema, where the schema's
    end-on-loop annotation (END_ON_LOOP: the rubric pass's draft schema) becomes the request's
    stop rule, with the judge's test for a text that copies itself (:attr:`Judge.loop_test`)."""
    if schema is None or END_ON_LOOP not in schema:
        return GenerateRequest(messages, schema)
    plain = {k: v for k, v in schema.items() if k != END_ON_LOOP}
    return GenerateRequest(messages, plain, LoopStop(**schema[END_ON_LOOP], copied=loop_test))


def open_backend(request: GradeRequest, backend_name: str, schema: dict[str, Any], max_tokens: int,
                 backend_factory: Callable[..., Backend] | None = None
                 ) -> tuple[Backend, TokenBudget | None]:
    """The request's backend, loaded, and its token budget (None: it cannot count tokens).

    The one place a backend is built: in this process, in a ``--data-parallel`` worker, and
    in each Ray actor of ``--ray``.
    """
    if backend_factory is None:
        from grader.backends import load_backend

        backend_factory = load_backend
    config = request.settings_for(backend_name)
    backend = backend_factory(backend_name, model=request.model, schema=schema,
                              sampling=request.sampling, max_tokens=max_tokens,
                              **({"config": config} if config is not None else {}))
    # The imports and the load leave hundreds of thousands of objects (torch, transformers,
    # vLLM) that live as long as the process. Frozen, they are out of the collector's full
    # passes: one over them took 0.3 s of a 10,000-row run (docs/benchmarks.md).
    gc.freeze()
    budget = None
    if backend.context_length:
        budget = TokenBudget(
            backend.count_tokens,
            context_length=backend.context_length,
            # a thinking judge's backend raises max_tokens by the thinking budget: room for it
            max_tokens=backend.max_tokens or max_tokens,
            truncate=judge_for(request).fields_to_cut(request.truncate),
            # Asked of the loaded backend (its tokenizer decides): an empty call answers None
            # where it has no byte bound, and every row is then counted.
            upper_bounds=(backend.token_upper_bounds
                          if backend.token_upper_bounds([]) is not None else None),
        )
    return backend, budget


def grade_pending(pending: Sequence[tuple[Job, str]], backend: Backend | Runner, judge: Judge,
                  budget: TokenBudget | None, request: GradeRequest, watch: Watch | None = None
                  ) -> list[tuple[int, Record]]:
    """Grade rows (job, resume key); each record comes back keyed, with its row's position
    (``watch``: what the call hears as each row finishes, :func:`grade_chunk`)."""

    # a block holds one judge's rows: the run's, or a preparation stage's (Job.judge)
    judge = next((job.judge for job, _ in pending if job.judge is not None), judge)

    # Rows that share a prompt prefix (one group key's) go out next to each other, so an
    # engine's prefix cache computes the shared part once: vLLM schedules requests in the order
    # they are added and does not group them itself (vllm-project/vllm#12080). Records carry
    # their row's position: the results file keeps input order.
    pending = sorted(pending, key=lambda p: judge.group_key(p[0].item))

    graded = grade_chunk([job for job, _ in pending], backend, judge, budget,
                         samples=request.sampling.n, aggregate=request.aggregate, watch=watch)
    keyed = []
    for (job, job_key), record in zip(pending, graded, strict=True):
        record.key = job_key  # the last field written: the record is complete
        keyed.append((job.item.index, record))
    return keyed
