"""The in-memory core: a judge loaded over a run plan and its executor, rows in, records out.

:class:`LoadedJudge` grades rows held in memory: what the judge's preparation stage
(:mod:`grader.run.stage`) lacks made (what it made kept as a new read-only mapping per call),
every row rendered, sent through the executor in blocks and read into its record, with the run's
controls and their verdict. It writes no file, takes no lock and draws no bar: those belong to
the file run around it (:func:`grader.run.grading.run_grade`: dataset, resume, results log,
summary). The Python API's :meth:`grader.Grader.grade` is a few lines over it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from grader.io.dataset import Dataset
from grader.io.manifest import model_fingerprint, model_identity, sha256_json
from grader.judge.judges import Judge
from grader.records import Record
from grader.run.ahead import Watch
from grader.run.controls import Controls
from grader.run.executor import Executor, Graded, Pending
from grader.run.request import RunPlan
from grader.run.rows import Job, prepare_jobs, sort_jobs
from grader.run.stage import Stage, stage_for


def model_key(model: str, backend_name: str = "") -> dict[str, Any]:
    """The model's part of the resume key: what it is, not where it lies or when it was copied."""
    if backend_name == "openai":
        # the id the server serves it under (/v1/models), even where it names a local directory:
        # the server's weights are not these files
        return {"served_model": model}
    try:
        identity = model_identity(model)
    except OSError:
        return {"model": model}
    return model_fingerprint(identity)


def run_key(plan: RunPlan) -> str:
    """Everything that changes an answer is in the key: a changed prompt, model, sampling,
    schema or engine setting re-grades the affected rows on resume; batch sizes do not."""
    from grader.config import answer_settings

    request, backend_name = plan.request, plan.backend
    return sha256_json(
        {
            "model": model_key(request.model, backend_name),
            "backend": backend_name,
            "sampling": request.sampling.model_dump() | {"max_tokens": plan.max_tokens},
            "schema": sha256_json(plan.schema),
            "settings": answer_settings(backend_name, plan.settings),
            "truncate": sorted(request.truncate),
            "aggregate": request.aggregate if request.sampling.n > 1 else None,
            **plan.judge.key_fields(),
        }
    )


def with_controls(blocks: Iterable[tuple[Pending, bool]], controls: Pending,
                  chunk_size: int) -> Iterator[Pending]:
    """Each block of rows to grade (with whether it is the last), ``controls`` joining the last
    one, as many as a block holds, the rest after it: one engine batch with the last rows, where
    a batch of their own ran at under half the rows/s of big batches (vLLM CPU,
    docs/judging.md). Lazy: a file run's blocks are read as they are asked for."""
    size = max(chunk_size, 1)
    for pending, last in blocks:
        if last and controls:
            yield pending + controls[:size]
            for start in range(size, len(controls), size):
                yield controls[start:start + size]
        else:
            yield pending


def later_groups(controls: Controls, chunk_size: int) -> Iterator[list[Pending]]:
    """The sequential check's later groups of control rows (:meth:`Controls.next_group`), each
    in blocks, each asked for only once the groups before it are graded and taken: a call of
    the executor's of its own per group, as an executor may read every block of a call before
    it grades any (Ray's, a data-parallel one's queue)."""
    size = max(chunk_size, 1)
    while (rows := controls.next_group()) is not None:
        if rows:
            yield [rows[start:start + size] for start in range(0, len(rows), size)]


class LoadedJudge:
    """A judge model loaded once (lazily, at the first row it must send) over ``plan`` and
    ``executor``: :meth:`grade` turns rows into records in memory.

    With a preparation stage it keeps what the stage made so far (:attr:`prepared_lines`, a
    new read-only mapping after each call, never changed in place): a later call makes only
    what the earlier ones did not. One call at a time: the caller takes turns
    (:class:`grader.Grader` holds a lock).
    """

    def __init__(self, plan: RunPlan, executor: Executor) -> None:
        self.plan, self.executor = plan, executor
        self.run_key = run_key(plan)
        self.started = False
        #: what the judge's stage made so far, as its file holds it
        self.prepared_lines: Mapping[str, Any] = MappingProxyType({})
        #: the last call's verdict on the judge from its controls (None: no controls)
        self.judge_check: dict[str, Any] | None = None

    def start(self) -> None:
        """Load the backend(s), once."""
        if not self.started:
            self.executor.start(self.plan)
            self.started = True

    def grade_blocks(self, blocks: Iterable[Pending], watch: Watch | None = None
                     ) -> Iterator[Graded]:
        """Blocks of rows (each with its resume key) graded, the backend(s) loaded first;
        each block's records with their rows' positions (a file run's pass 2; ``watch``:
        what a local backend's calls report as each row finishes, its bar)."""
        self.start()
        return self.executor.grade(blocks, watch)

    def key(self, job: Job) -> str:
        """A row's resume key, as a file run's (grader.run.grading)."""
        return sha256_json([job.item.id, job.messages, self.run_key])

    def grade(self, dataset: Dataset, *, controls: int = 0,
              given: Mapping[str, dict[str, Any]] | None = None) -> list[Record]:
        """One record per row of ``dataset`` (in memory: :meth:`Dataset.of_rows`), in its
        order; with ``controls``, the run's controls (their first group with the last block,
        the later ones while the sequential check is open) and their verdict in
        :attr:`judge_check`; ``given``: the stage's lines to use as given, as the
        file the request names (:class:`grader.run.stage.Stage`)."""
        judge: Judge = self.plan.judge
        judge.check_fields(dataset)
        items = list(dataset)
        dataset.check_unique_ids()
        checks = Controls(controls, judge, Path(dataset.name)) if controls else None  # no file
        if checks is not None:
            for item in items:
                checks.add(item)
        stage_class = stage_for(judge)
        if stage_class is not None:
            stage = stage_class(self.plan.request, judge, dataset.name,
                                kept=self.prepared_lines, given=given)
            judge = self._prepared(stage, items)
        records: list[Record | None] = [None] * len(items)
        rows = sort_jobs(prepare_jobs(dataset.name, items, judge), self.key, judge)
        for position, record in rows.unsent:
            records[position] = record
        pending = rows.pending
        extra: Pending = []
        if checks is not None:
            checks.prepare(dataset.name, offset=len(items), judge=judge)
            extra = checks.open_in_memory(self.key)
        if pending or extra:
            self.start()
            size = max(self.executor.chunk_size, 1)
            blocks = ((pending[start:start + size], start + size >= len(pending))
                      for start in range(0, max(len(pending), 1), size))
            for graded in self.grade_blocks(with_controls(blocks, extra, size)):
                for position, record in checks.take(graded) if checks is not None else graded:
                    records[position] = record
        if checks is not None:  # the next group of references only while the verdict is open
            size = self.executor.chunk_size or self.plan.request.chunk_size or 1024
            for group in later_groups(checks, size):
                for graded in self.grade_blocks(group):
                    checks.take(graded)
        self.judge_check = checks.finish() if checks is not None else None
        assert all(record is not None for record in records)
        return records  # type: ignore[return-value]  # every position is filled above

    def _prepared(self, stage: Stage, items: list[Any]) -> Judge:
        """The stage in memory: the rows fed to it, what it lacks made."""
        for item in items:
            stage.add(item)
        prepared = stage.run(self.executor, self.start)
        self.prepared_lines = MappingProxyType(dict(stage.lines))
        return prepared.judge
