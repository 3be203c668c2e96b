"""grade's controls: answers whose right score is known, graded in every run to check the judge.

For a deterministic sample of distinct references (``controls``, default 50; 0 turns them off),
the run also grades, by the same judge and under the same settings, three answers
(:mod:`grader.judge.perturb`): the reference itself, a fluent wrong answer (another sampled
question's reference) and a non-answer. They go to ``NAME.controls.jsonl`` beside the results
(:func:`controls_path`), never into the results rows, with ids ``<row id>#control:<kind>``; the
verdict on the judge (:mod:`grader.analysis.verdict`) goes to the summary's ``judge_check``.

The sample is drawn in pass 1 as the rows stream past (a row's reference key, the hash of its
input and reference, decides: :func:`grader.judge.perturb.sample_keys`), so a grown or
reordered file keeps most of its sample. Control rows resume like results rows (the same
resume key, a crash-safe log of their own); with a judge's preparation stage
(:mod:`grader.run.stage`) they are rows of references whose prepared value the run already
has: nothing more is made.

The sampled references are checked **sequentially** (:func:`grader.analysis.verdict.looks`):
in the sample's hash order, a first group of references, then the next group only while the
verdict is open (:meth:`Controls.next_group`). The first group's rows go with pass 2's last
block (one engine batch with the last rows: docs/judging.md), and a backend that runs rows
ahead (vLLM's) starts them as soon as their reference's value is made; a later group is a call
of its own, after the verdict on the groups before it. The controls file holds the rows of the
groups used. With fewer than :data:`grader.analysis.verdict.MIN_REFERENCES` references to
sample, no verdict is possible and nothing is graded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from msgspec.structs import replace

from grader.analysis.verdict import (
    MIN_REFERENCES,
    ControlScores,
    ControlsRun,
    JudgeCheck,
    Sequential,
    judge_verdict,
    looks,
    sequential_verdict,
)
from grader.io.dataset import Item, reference_key
from grader.io.outputs import Kind, is_own
from grader.io.results import Location, ResultsLog, read_records
from grader.judge.judges import Judge, items_given
from grader.judge.perturb import CONTROL_KINDS, NON_ANSWER, sample_keys, wrong_answers
from grader.records import Record
from grader.run.rows import Job, Unsent, prepare_jobs, sort_jobs
from grader.status import Status

log = logging.getLogger(__name__)

# An id's mark: "<row id>#control:<kind>".
MARK = "#control:"


def controls_path(results: Path) -> Path:
    """``results.jsonl`` -> ``results.controls.jsonl`` beside it."""
    return results.with_name(results.name.removesuffix(".jsonl") + ".controls.jsonl")


def discard_controls(results: Path) -> None:
    """Remove the controls file of ``results`` and its log (``--overwrite`` without controls:
    they were the earlier run's); a file there that is not a controls file is not grader's
    to remove (:mod:`grader.io.outputs`)."""
    path = controls_path(results)
    if path.is_file() and not is_own(path, Kind.CONTROLS):
        return
    for stale in (path, path.with_name(path.name + ".partial"),
                  path.with_name(path.name + ".partial.json")):
        stale.unlink(missing_ok=True)


class Controls:
    """A run's controls: sampled in pass 1 (:meth:`add`), rendered once the judge is prepared
    (:meth:`prepare`), resumed (:meth:`open`), graded with pass 2's last block (the run sends
    them; :meth:`take` keeps their records), put in place and judged (:meth:`finish`).

    Args:
        output: the results file, beside which the controls file goes (a file run).
        open_log: the controls file's log, opened for the results' run (a file run; None:
            the records kept in memory only).
    """

    def __init__(self, count: int, judge: Judge, output: Path | None = None,
                 open_log: Callable[[Path], ResultsLog] | None = None) -> None:
        self.count, self.judge, self.open_log = count, judge, open_log
        self.path = controls_path(output) if output is not None else None
        # reference key -> the first row with it, while it may be in the sample
        self.candidates: dict[str, Item] = {}
        self.without_reference = 0
        self.pruned = False  # candidates were pruned: more distinct references than kept
        self.jobs: list[Job | Unsent] = []
        self._wrong: dict[str, str] | None = None  # the sample, once pass 1 is done
        # the sequential check: each sampled key's and each job's group (its look), the groups
        # released so far, and the rows of those not released yet
        self._group: dict[str, int] = {}
        self.job_groups: list[int] = []
        self.released = 0
        self.waiting: dict[int, list[tuple[Job, str]]] = {}
        self.decided: JudgeCheck | None = None
        # records graded or not sent, by control position (resumed ones are read back)
        self.records: dict[int, Record] = {}
        self._resumed: set[int] = set()  # control positions an earlier run graded
        self.offset = 0
        self.log: ResultsLog | None = None
        self.locations: list[Location | None] = []
        self.unsent: list[tuple[int, Record]] = []
        self.resumed = self.pending = 0

    def add(self, item: Item) -> None:
        """Pass 1: a row, as read (before the judge adds to its fields)."""
        if item.invalid:
            return
        reference = item.fields.get("reference")
        if reference is None or not str(reference).strip():
            self.without_reference += 1
            return
        if self.judge.missing(item):  # not graded (no answer): the controls check the judge
            return  # on the references the run grades
        key = reference_key(item.fields.get("input"), reference)
        if key in self.candidates:
            return
        self.candidates[key] = Item(item.id, item.index, item.line, dict(item.fields))
        if len(self.candidates) > 2 * self.count + 1024:
            # the sample of the keys so far keeps every key of the final sample: a key among
            # the first n of all keys is among the first n of any subset holding it
            kept = sample_keys(list(self.candidates), self.count)
            self.candidates = {k: self.candidates[k] for k in kept}
            self.pruned = True

    @property
    def sampled(self) -> int:
        return min(self.count, len(self.candidates))

    @property
    def distinct(self) -> int | None:
        """The data's distinct references that could be sampled (None: more than were kept)."""
        return None if self.pruned else len(self.candidates)

    def _sample(self) -> dict[str, str]:
        """The sampled reference keys, in data order, each with its wrong answer (another sampled
        reference): empty where too few references give no verdict. Each key's group
        (:attr:`_group`) is its look's: the first :data:`~grader.analysis.verdict.FIRST_LOOK`
        keys in hash order (a random order) the first group, and so on."""
        if self._wrong is None:
            self._wrong = {}
            if self.sampled >= MIN_REFERENCES:
                keys = sample_keys(list(self.candidates), self.count)
                wrong = wrong_answers([str(self.candidates[k].fields["reference"]) for k in keys])
                ends = [look.references for look in looks(len(keys))]
                self._group = {key: next(g for g, end in enumerate(ends) if rank < end)
                               for rank, key in enumerate(keys)}
                for key, answer in sorted(zip(keys, wrong, strict=True),
                                          key=lambda pair: self.candidates[pair[0]].index):
                    self._wrong[key] = answer
        return self._wrong

    def _items(self, keys: list[str], offset: int) -> list[Item]:
        """The three control rows of each of ``keys``' sampled rows, from position ``offset``."""
        items: list[Item] = []
        for key in keys:
            row = self.candidates[key]
            answers = (str(row.fields["reference"]), self._sample()[key], NON_ANSWER)
            for kind, answer in zip(CONTROL_KINDS, answers, strict=True):
                items.append(Item(f"{row.id}{MARK}{kind}", offset + len(items), row.line,
                                  dict(row.fields) | {"output_text": answer}))
        return items

    def checks_for(self, key: str, path: str, judge: Judge) -> list[Job]:
        """The control rows of reference key ``key`` as :meth:`prepare` renders them, for the
        judge's stage to start ahead as soon as that reference's value is made (a backend that
        runs ahead, vLLM's), rendered by ``judge`` (one built with that value); none if not
        sampled."""
        if key not in self._sample():
            return []
        return [job for job in prepare_jobs(path, self._items([key], 0), judge)
                if isinstance(job, Job)]

    def prepare(self, path: str, offset: int, judge: Judge | None = None) -> None:
        """The control rows, rendered by the run's ``judge`` [default: the one they were
        sampled with] (with a stage: the one it prepared): for each sampled row, in
        data order, its three controls. Their positions start at ``offset`` (the results' rows
        come first), so that the executor's records of both can be told apart (:meth:`take`).
        Too few references to sample: none."""
        self.offset, self.judge = offset, judge or self.judge
        keys = list(self._sample())
        self.jobs = prepare_jobs(path, self._items(keys, offset), self.judge)
        self.job_groups = [self._group[key] for key in keys for _ in CONTROL_KINDS]

    def open(self, key: Callable[[Job | Unsent], str]) -> list[tuple[Job, str]]:
        """The controls' log opened (a file run's) and the rows an earlier run graded resumed
        (nothing is written yet: :meth:`begin`, once the engine has loaded); returns the first
        group's rows left to grade, each with its resume key (the later groups' wait for
        :meth:`next_group`)."""
        if not self.jobs:
            return []
        lookup = None
        if self.open_log is not None:
            assert self.path is not None
            self.log = log_ = self.open_log(self.path)
            self.locations = [None] * len(self.jobs)
            lookup = log_.lookup if log_.resumable > 0 else None
        rows = sort_jobs(self.jobs, key, self.judge, lookup)
        for position, location in rows.resumed:
            self.locations[position - self.offset] = location
        self._resumed = {position - self.offset for position, _ in rows.resumed}
        self.unsent += rows.unsent
        return self._release(rows.pending)

    def _release(self, pending: list[tuple[Job, str]]) -> list[tuple[Job, str]]:
        """The rows to grade held by group; the first group's returned."""
        for job, key in pending:
            group = self.job_groups[job.item.index - self.offset]
            self.waiting.setdefault(group, []).append((job, key))
        return self._next()

    def _next(self) -> list[tuple[Job, str]]:
        """The next group released: its rows to grade, its resumed rows counted."""
        group, self.released = self.released, self.released + 1
        self.resumed += sum(self.job_groups[i] == group for i in self._resumed)
        rows = self.waiting.pop(group, [])
        self.pending = len(rows)
        return rows

    def _released_positions(self) -> list[int]:
        """The control positions (from 0) of the groups released so far, in control order."""
        return [i for i, group in enumerate(self.job_groups) if group < self.released]

    def next_group(self) -> list[tuple[Job, str]] | None:
        """Once the released groups are graded: None if the verdict is decided (or the sample
        spent), else the next group released and its rows to grade (none where an earlier run
        graded them all: call again)."""
        if self.decided is not None or self.released >= len(set(self.job_groups)):
            return None
        self.decided = sequential_verdict(self._ordered_scores(), self.sampled,
                                          without_reference=self.without_reference)
        if self.decided is not None:
            return None
        rows = self._next()
        if rows:
            log.info("controls: the judge check is still open after %d references: %d more "
                     "control answers", self.total // len(CONTROL_KINDS), len(rows))
        return rows

    def _ordered_scores(self) -> list[ControlScores]:
        """The released groups' references' scores, group by group (the looks' order)."""
        positions = self._released_positions()
        records, size = self._records_at(positions), len(CONTROL_KINDS)
        starts = sorted(range(0, len(records), size), key=lambda s: self.job_groups[positions[s]])
        return [_scores(records[start:start + size], self.judge) for start in starts]

    def _records_at(self, positions: list[int]) -> list[Record]:
        """The records at control ``positions``, each graded by now (resumed ones read back
        from the log)."""
        records = []
        for position in positions:
            record = self.records.get(position)
            if record is None:
                location = self.locations[position]
                assert location is not None and self.log is not None, "graded by now"
                source, offset = location
                file = self.log.partial if source == ResultsLog.PARTIAL else self.log.path
                record = next(read_records(file, start=offset, end=offset + 1))[1]
            records.append(record)
        return records

    def begin(self) -> None:
        """Once the engine has loaded (if it had to): the rows not sent written, the rows to
        grade announced."""
        self._write(self.unsent)
        self.unsent = []
        if self.pending:
            log.info("controls: %d control answers (the reference, a wrong answer and a "
                     "non-answer for the first %d of %d sampled references; more only while "
                     "the judge check is open) are graded with the last rows, into %s",
                     self.pending, self.total // len(CONTROL_KINDS), self.sampled,
                     self.path if self.log is not None else "memory")

    @property
    def total(self) -> int:
        """The control rows of the groups released so far."""
        return sum(group < self.released for group in self.job_groups)

    @property
    def done(self) -> int:
        return sum(i in self.records or i in self._resumed for i in self._released_positions())

    def take(self, records: list[tuple[int, Record]]) -> list[tuple[int, Record]]:
        """A block's records: the controls' kept (and written to their log, in a file run), the
        results' returned."""
        mine = [(p, r) for p, r in records if p >= self.offset]
        if not mine:
            return records
        self._write(mine)
        return [(p, r) for p, r in records if p < self.offset]

    def close(self) -> None:
        if self.log is not None:
            self.log.close()

    def _write(self, records: list[tuple[int, Record]]) -> None:
        if not records:
            return
        if self.log is not None:
            for (position, _), location in zip(records, self.log.write(r for _, r in records),
                                               strict=True):
                self.locations[position - self.offset] = location
        for position, record in records:
            self.records[position - self.offset] = record

    def finish(self) -> JudgeCheck:
        """The controls file put in place, in control order, with the rows of the groups the
        sequential check used; the verdict on the judge (the summary's ``judge_check``)."""
        if self.jobs:
            check = self.decided or sequential_verdict(self._ordered_scores(), self.sampled,
                                                       without_reference=self.without_reference)
            assert check is not None, "every group graded, or the verdict decided"
            if self.log is not None:
                used = [location for i in self._released_positions()
                        if (location := self.locations[i]) is not None]
                assert len(used) == self.total, "every control graded is located"
                for _ in self.log.assemble(used):
                    pass
                self.log.commit()
        else:  # nothing graded: the references the data had are what was sampled
            check = replace(judge_verdict([], without_reference=self.without_reference),
                            references=self.sampled, distinct_references=self.distinct)
        file = str(self.path) if self.log is not None else None
        return replace(check, controls=ControlsRun(self.count, file, self.total, self.resumed))


def _scores(records: list[Record], judge: Judge) -> ControlScores:
    """One reference's three control records -> their scores (None: no score), with how many
    items the judge gave them to mark (:func:`~grader.judge.judges.items_given`)."""
    values = [record.value if record.status == Status.OK else None for record in records]
    items = next((n for r in records if (n := items_given(r)) is not None), None)
    reference, wrong, non_answer = (None if v is None else float(v) for v in values)
    return ControlScores(reference, wrong, non_answer, items)



def recomputed_verdict(records: list[Record], judges: dict[str | None, Judge],
                       earlier: JudgeCheck) -> JudgeCheck:
    """The verdict of a finished run's controls read again (``grader rescore``): ``records``,
    each recomputed from its raw text by the caller (:func:`grader.run.rescore.recompute`),
    judged as :meth:`Controls.finish` judges them; what the earlier check said of the file and
    of the rows without a reference is kept."""
    judge = judges.get(records[0].kind, judges[None]) if records else judges[None]
    size = len(CONTROL_KINDS)
    scores = [_scores(records[start:start + size], judge)
              for start in range(0, len(records) - size + 1, size)]
    without = earlier.rows_without_reference
    sampled = earlier.sequential.sampled if earlier.sequential else None
    # judged as the run judged them: sequentially, on the references the file holds (those
    # the check used, in the sample's order)
    check = sequential_verdict(scores, sampled, without_reference=without) if sampled else None
    if check is None:
        check = judge_verdict(scores, without_reference=without)
        if sampled:  # the recomputed scores leave the check open where the run's had stopped
            check.sequential = Sequential(sampled, len(scores), "open")
    return replace(check, references=check.references if scores else earlier.references,
                   controls=earlier.controls)
