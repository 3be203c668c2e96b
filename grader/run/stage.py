"""A judge's preparation stage: what a judge must have made before its rows can be rendered,
made once per group of rows that share it, driven by the run without knowing what it makes.

A judge that needs one names it (:attr:`grader.judge.judges.Judge.stage`, imported only when
a run asks: :func:`stage_for`), so the judge layer never imports the run layer. The file run
(:mod:`grader.run.grading`), the in-memory core (:mod:`grader.run.core`) and the panel
(:mod:`grader.run.panel`) drive every stage through :class:`Stage` alone: pass 1 feeds it
each row (:meth:`Stage.add`: the row's group key; rows with one key are rendered from one
prepared value), then :meth:`Stage.run` makes what is missing (the model loads only if
something is). What a file run or a panel does with the stage's files beyond its own is its
:class:`StageFiles`, apart from the stage itself.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

from typing_extensions import TypeVar

from grader.io.dataset import Item
from grader.io.manifest import StageEntry
from grader.io.outputs import Kind
from grader.judge.judges import Judge
from grader.run.executor import Executor
from grader.run.request import GradeRequest
from grader.run.rows import Job, Unsent

# The rows of a group key that the run sends first, rendered by ``judge`` (one built with
# that key's prepared value), for a stage whose backend runs ahead to start them early.
Checks = Callable[[str, Judge], list[Job]]

# A stage's line: what it holds of one group key, as its file holds it.
LineT = TypeVar("LineT", default=Any)
LineT_co = TypeVar("LineT_co", covariant=True, default=Any)


@dataclass(frozen=True)
class Prepared:
    """What a stage made: the judge the rows are rendered and read by, what the run manifest
    says of it (under its :attr:`StageEntry.name`), and whether a group key's rows are sent."""

    judge: Judge
    entry: StageEntry
    sends: Callable[[str], bool]


class StageFiles(Protocol[LineT_co]):
    """A stage's file policy beyond where its own file lies: the file a request names to use
    as given, and what a panel's later judges are given."""

    #: the kind of the file the stage writes beside the results (:mod:`grader.io.outputs`)
    kind: Kind

    def given_file(self, request: GradeRequest) -> str | None:
        """The file ``request`` names to use as given, if any."""

    def given_lines(self, request: GradeRequest) -> Mapping[str, LineT_co]:
        """The lines of that file (none: empty)."""

    def shared(self, request: GradeRequest, first: Path, output: Path) -> GradeRequest:
        """A panel's request for its later judges, once the first judge's run (results
        ``first``) is done: given what the first judge's stage made (a file of it: beside
        ``output``), so that every judge renders its rows from the same values."""


class Stage(Protocol[LineT]):
    """One judge's preparation stage over one run's rows (see the module's docstring).

    Args:
        request: the run's request.
        judge: the run's judge, as the plan built it (before the stage).
        path: the dataset's name, for errors.
        output: its file (a file run's: :meth:`beside` the results); None: in memory.
        overwrite: the file's earlier lines are not reused.
        kept: in memory (:class:`grader.run.core.LoadedJudge`): the lines earlier calls made,
            reused as a file run reuses its file; no file is read or written, no bar drawn.
        given: lines to use as given (a panel's later judges in memory: the first judge's)
            [default: the file the request names, if any].
    """

    #: the run manifest's entry for it (``run.NAME``)
    name: ClassVar[str]
    files: ClassVar[StageFiles]

    def __init__(self, request: GradeRequest, judge: Judge, path: str, *,
                 output: Path | None = None, overwrite: bool = False,
                 kept: Mapping[str, LineT] | None = None,
                 given: Mapping[str, LineT] | None = None) -> None: ...

    @staticmethod
    def beside(results: Path) -> Path:
        """The file the stage writes beside ``results`` (locked with them)."""

    @classmethod
    def preview(cls, path: str, items: list[Item], judge: Judge) -> list[Job | Unsent]:
        """``grader render``: each row's first prompt, the stage's where the row lacks what
        the stage makes, else its own (no model, no file)."""

    def add(self, item: Item) -> str | None:
        """Pass 1: a row as read; its group key, or None for a row that is not sent."""

    def known(self, key: str) -> LineT | None:
        """What ``key`` has so far (None: nothing until :meth:`run` makes it); a later row
        may still replace it (:meth:`final`)."""

    def final(self, key: str, known: LineT) -> bool:
        """Whether ``known`` (from :meth:`known`) is still ``key``'s."""
        return self.known(key) is known

    def judge_of(self, key: str, known: LineT) -> Judge:
        """A judge that renders the rows of ``key`` from ``known`` (to count resumed rows)."""

    def run(self, executor: Executor, start_engine: Callable[[], None],
            checks: Checks | None = None) -> Prepared:
        """Make what is missing (the model loads, through ``start_engine``, only if
        something is) and return it.

        Args:
            checks: the rows of a group key that the run sends first; a backend that runs
                ahead (vLLM's) starts them as soon as their key's value is made.
        """

    @property
    def lines(self) -> Mapping[str, LineT]:
        """What the stage holds after :meth:`run`, by key, as its file holds it (in memory:
        the ``kept`` of the next call)."""


def stage_for(judge: Judge) -> type[Stage] | None:
    """The preparation stage ``judge`` names (:attr:`Judge.stage`), imported now; None for a
    judge that renders its rows from the rows alone."""
    if judge.stage is None:
        return None
    module, _, name = judge.stage.target.partition(":")
    return cast("type[Stage]", getattr(importlib.import_module(module), name))
