"""A judge's preparation stage: what a judge must have made before its rows can be rendered,
made once per group of rows that share it, driven by the run without knowing what it makes.

A judge that needs one names it (:attr:`grader.judge.judges.Judge.stage`: the stage's
manifest name and its class as ``"module:Class"``, imported only when a run asks,
:func:`stage_for`), so the judge layer never imports the run layer. The file run
(:mod:`grader.run.grading`), the in-memory core (:mod:`grader.run.core`) and the panel
(:mod:`grader.run.panel`) drive every stage through :class:`Stage` alone:

1. pass 1 feeds it each row (:meth:`Stage.add`), which gives the row's **group key** (rows
   with one key are rendered from one prepared value; None: the row is not sent); what the
   stage already knows of a key (:meth:`Stage.known`: a column, a given file, an earlier run)
   lets a rerun count its resumed rows before anything is made (:meth:`Stage.judge_of`);
2. :meth:`Stage.run` makes what is missing (the model loads only if something is) and returns
   a :class:`Prepared`: the judge built with it, the run manifest's entry, and which groups'
   rows are sent;
3. the file it writes beside the results (:meth:`Stage.beside`) is locked with them; a
   panel's later judges are given what the first judge's stage made (:meth:`Stage.shared`;
   in memory :meth:`Stage.given_lines`); ``grader render`` shows each row's first prompt
   (:meth:`Stage.preview`).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, cast

from grader.io.dataset import Item
from grader.io.outputs import Kind
from grader.judge.judges import Judge
from grader.run.executor import Executor
from grader.run.request import GradeRequest
from grader.run.rows import Job, Unsent

# The rows of a group key that the run sends first, rendered by ``judge`` (one built with
# that key's prepared value), for a stage whose backend runs ahead to start them early.
Checks = Callable[[str, Judge], list[Job]]


@dataclass(frozen=True)
class Prepared:
    """What a stage made: the judge the rows are rendered and read by, what the run manifest
    says of it (under :attr:`Stage.name`), and whether a group key's rows are sent."""

    judge: Judge
    entry: dict[str, Any]
    sends: Callable[[str], bool]


class Stage(ABC):
    """One judge's preparation stage over one run's rows (see the module's docstring).

    Args:
        request: the run's request.
        judge: the run's judge, as the plan built it (before the stage).
        path: the dataset's name, for errors.
        output: where its file goes [default: :meth:`beside` the results].
        kept: in memory (:class:`grader.run.core.LoadedJudge`): the lines earlier calls made,
            reused as a file run reuses its file; no file is read or written, no bar drawn.
        given: lines to use as given (a panel's later judges in memory: the first judge's)
            [default: the file the request names, if any].
    """

    #: the run manifest's entry for it (``run.NAME``)
    name: ClassVar[str]
    #: the kind of the file it writes beside the results (:mod:`grader.io.outputs`): a
    #: stage that names none writes JSON lines
    file_kind: ClassVar[Kind] = Kind.STAGE

    @abstractmethod
    def __init__(self, request: GradeRequest, judge: Judge, path: str, *,
                 output: Path | None = None,
                 kept: Mapping[str, dict[str, Any]] | None = None,
                 given: Mapping[str, dict[str, Any]] | None = None) -> None: ...

    @staticmethod
    @abstractmethod
    def beside(results: Path) -> Path:
        """The file the stage writes beside ``results`` (locked with them)."""

    @classmethod
    @abstractmethod
    def given_lines(cls, request: GradeRequest) -> dict[str, dict[str, Any]]:
        """The lines of the file ``request`` names to use as given (none: empty)."""

    @classmethod
    @abstractmethod
    def given_file(cls, request: GradeRequest) -> str | None:
        """The file ``request`` names to use as given, if any."""

    @classmethod
    @abstractmethod
    def shared(cls, request: GradeRequest, first: Path) -> GradeRequest:
        """A panel's request for its later judges, once the first judge's run (results
        ``first``) is done: given what the first judge's stage made, so that every judge
        renders its rows from the same values."""

    @classmethod
    @abstractmethod
    def preview(cls, path: str, items: list[Item], judge: Judge) -> list[Job | Unsent]:
        """``grader render``: each row's first prompt, the stage's where the row lacks what
        the stage makes, else its own (no model, no file)."""

    @abstractmethod
    def add(self, item: Item) -> str | None:
        """Pass 1: a row as read; its group key, or None for a row that is not sent."""

    @abstractmethod
    def known(self, key: str) -> object | None:
        """What ``key`` has so far (None: nothing until :meth:`run` makes it); a later row
        may still replace it (:meth:`final`)."""

    def final(self, key: str, known: object) -> bool:
        """Whether ``known`` (from :meth:`known`) is still ``key``'s."""
        return self.known(key) is known

    @abstractmethod
    def judge_of(self, key: str, known: object) -> Judge:
        """A judge that renders the rows of ``key`` from ``known`` (to count resumed rows)."""

    @abstractmethod
    def run(self, executor: Executor, start_engine: Callable[[], None],
            checks: Checks | None = None) -> Prepared:
        """Make what is missing (the model loads, through ``start_engine``, only if
        something is) and return it.

        Args:
            checks: the rows of a group key that the run sends first; a backend that runs
                ahead (vLLM's) starts them as soon as their key's value is made.
        """

    @property
    @abstractmethod
    def lines(self) -> Mapping[str, dict[str, Any]]:
        """What the stage holds after :meth:`run`, by key, as its file holds it (in memory:
        the ``kept`` of the next call)."""


def stage_for(judge: Judge) -> type[Stage] | None:
    """The preparation stage ``judge`` names (:attr:`Judge.stage`), imported now; None for a
    judge that renders its rows from the rows alone."""
    if judge.stage is None:
        return None
    module, _, name = judge.stage.target.partition(":")
    return cast("type[Stage]", getattr(importlib.import_module(module), name))
