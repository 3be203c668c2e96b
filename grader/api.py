"""grader from Python: the command line's verbs, with its settings and its defaults.

    import grader

    with grader.Grader("models/judge", backend="transformers") as judge:
        records = judge.grade([{"input": "...", "reference": "...", "output_text": "..."}])

Settings are the command line's options spelled with underscores (``max_tokens`` for
``--max-tokens``), resolved as the CLI resolves them, so a setting left out (or None) means
what the CLI means by it; ``backend`` left out reads ``GRADER_BACKEND``. ``map`` takes a dict
``{field: column}``, ``source`` is ``--from``, and ``chat_template_kwargs`` / ``engine_args``
take dicts for the repeated ``KEY=VALUE``. They are the fields of :class:`grader.GradeSettings`,
which may be given as one object too (``settings=``), a keyword winning over it. Every error is
a :class:`grader.errors.GraderError` with the CLI's exit code. Nothing here imports torch or
vLLM until a model is loaded.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

from msgspec import UNSET
from pydantic import ValidationError

from grader.analysis.summary import PanelAgreement, Summary
from grader.analysis.verdict import JudgeCheck, format_verdict
from grader.backends.lifetime import refuse_reimport
from grader.config import (
    FILE_SETTINGS,
    GradeSettings,
    GradeSettingsDict,
    option_of,
    setting_choices,
)
from grader.errors import GraderError
from grader.io.dataset import Dataset
from grader.io.results import read_records
from grader.records import Record
from grader.run.core import Lines, LoadedJudge
from grader.run.grading import make_executor, run_grade
from grader.run.panel import MemoryPanel
from grader.run.request import FileJob, GradeRequest, OptionError, resolve

log = logging.getLogger(__name__)

SETTINGS = frozenset(GradeSettings.model_fields)


def _settings(settings: GradeSettings | None, options: Mapping[str, object]) -> GradeSettings:
    """The settings given: those set in ``settings`` under keyword ``options`` (None: not
    given), checked strictly (``"yes"`` is no bool): a wrong one is an OptionError naming it."""
    if settings is not None and not isinstance(settings, GradeSettings):
        raise OptionError(f"settings: expected a grader.GradeSettings, got {type(settings).__name__}")
    given = {**(settings.model_dump(exclude_unset=True) if settings else {}), **options}
    unknown = sorted(set(given) - SETTINGS)
    if unknown:
        raise OptionError(f"unknown setting{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)}: known: {', '.join(sorted(SETTINGS))}")
    given = {name: value for name, value in given.items() if value is not None}
    if "backend" not in given and os.environ.get("GRADER_BACKEND"):
        given["backend"] = os.environ["GRADER_BACKEND"]
    try:
        return GradeSettings.model_validate(given)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0])  # the setting (a union's branch or a dict's key follow)
        value = given[name]
        if first["type"] == "literal_error":
            choices = ", ".join(setting_choices(name))
            raise OptionError(f"{name}: {value!r} is not one of {choices}") from None
        # a value the settings file could hold is named by its option, as the file's check does
        where = option_of(name) if name in FILE_SETTINGS else name
        raise OptionError(f"{where}: {first['msg']}, got {value!r}") from None


def _as_path(name: str, value: Any) -> Path:
    """A path argument, or an OptionError naming it."""
    if not isinstance(value, (str, os.PathLike)):
        raise OptionError(f"{name}: expected a path (str or pathlib.Path), got "
                          f"{type(value).__name__}")
    return Path(value)


@dataclass(frozen=True)
class GradeResult:
    """What :func:`grade_file` and :func:`rescore` return: the summary (also written beside the
    results) and the results file; :attr:`records` reads it."""

    summary: Summary  # its to_dict() is the summary file's JSON object
    output: Path

    @property
    def records(self) -> list[Record]:
        """Every record of the results file, in input order (read each time it is asked for)."""
        return [record for _, record in read_records(self.output)]


def _request(model: str | None, settings: GradeSettings) -> GradeRequest:
    """The CLI's request for these settings: the same checks, the same defaults."""
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise OptionError(f"model: expected a model directory or a served name (str), got "
                          f"{type(model).__name__}")
    return resolve(settings, None if model is None else str(model))


def _job(data: str | Path, output: str | Path, settings: GradeSettings) -> FileJob:
    return FileJob(str(_as_path("data", data)), _as_path("output", output), settings.overwrite,
                   settings.limit)


# The command line's words in a refusal, and a Python caller's for them.
_CLI_WORDS = re.compile(r"--overwrite|(?<![\w-])-o(?![\w-])")
_PYTHON_WORDS = {"--overwrite": "overwrite=True", "-o": "output"}


@contextlib.contextmanager
def _python_words() -> Iterator[None]:
    """A refusal worded for the command line (``--overwrite``, ``-o``) in a Python caller's
    words (``overwrite=True``, ``output``)."""
    try:
        yield
    except GraderError as exc:
        exc.args = tuple(_CLI_WORDS.sub(lambda m: _PYTHON_WORDS[m.group()], arg)
                         if isinstance(arg, str) else arg for arg in exc.args)
        raise


def grade_file(data: str | Path, output: str | Path, model: str | None = None, *,
               settings: GradeSettings | None = None,
               **options: Unpack[GradeSettingsDict]) -> GradeResult:
    """``grader grade DATA -o OUTPUT -m MODEL``: grade a file, resuming what a run of the same
    settings left in ``output``; the summary is written beside it.

    Args:
        data: a .jsonl, .csv or .parquet file, an lm-eval samples file, an inspect_ai log or a
            ``save_to_disk`` folder.
        output: the results JSONL.
        model: the judge's model directory (with ``backend="openai"``: the served name).
        settings: the settings as one object (those set in it; ``options`` win).
        options: the CLI's options (module docstring), each a :class:`GradeSettings` field.
    """
    with _python_words():
        given = _settings(settings, dict(options))
        refuse_reimport()  # before the lock: the script re-run in the engine's process
        if model is None and given.config is not None:
            from grader.config import load_settings

            # the settings file's panel section, as the CLI runs it where --model is not given
            panel = load_settings(str(given.config)).panel
            if panel:
                return _grade_panel(data, output, [j.model for j in panel],
                                    [j.temperature for j in panel], given)
        job = _job(data, output, given)
        summary = run_grade(_request(model, given), job,
                            make_executor(given.ray, given.data_parallel))
    if summary.judge_check is not UNSET:
        log_judge_check(summary.judge_check)
    return GradeResult(summary, job.output)


def grade_panel(data: str | Path, output: str | Path, models: list[str], *,
                temperatures: list[float | None] | None = None,
                settings: GradeSettings | None = None,
                **options: Unpack[GradeSettingsDict]) -> GradeResult:
    """``grader grade DATA -o OUTPUT -m A -m B ...``: a judge panel, each judge graded in turn
    into ``OUTPUT.judge-N.jsonl``, their labels pooled into ``output``; ``temperatures``: one
    per model, or None; ``settings`` and ``options`` as for :func:`grade_file`."""
    with _python_words():
        return _grade_panel(data, output, models, temperatures,
                            _settings(settings, dict(options)))


def _grade_panel(data: str | Path, output: str | Path, models: list[str],
                 temperatures: list[float | None] | None, settings: GradeSettings) -> GradeResult:
    from grader.run.panel import PanelJudge, check_panel, check_panel_models, run_panel

    refuse_reimport()
    if temperatures is not None and len(temperatures) != len(models):
        raise OptionError(f"temperatures: {len(temperatures)} for {len(models)} judges")
    judges = [PanelJudge(str(m), None if temperatures is None else temperatures[i])
              for i, m in enumerate(models)]
    if not judges:
        raise OptionError("models: a panel needs two judges or more")
    job = _job(data, output, settings)
    request = _request(judges[0].model, settings)
    check_panel(request, judges)
    check_panel_models(request, judges)
    summary = run_panel(request, job, judges, lambda: make_executor(settings.ray,
                                                                    settings.data_parallel))
    return GradeResult(summary, job.output)


def log_judge_check(check: JudgeCheck) -> None:
    """The verdict of the run's controls (a summary's judge_check), as the CLI prints it: a
    warning unless the judge is informative (or too few references could be checked)."""
    level = logging.WARNING if check.verdict in ("weak", "no signal") else logging.INFO
    log.log(level, "%s", format_verdict(check))


def rescore(results: str | Path, output: str | Path, *, grader_config: str | None = None,
            workers: int | None = None, overwrite: bool = False) -> GradeResult:
    """``grader rescore RESULTS -o OUTPUT``: every score recomputed from the judge's raw text;
    no model is loaded. OUTPUT holding another run's results stops unless ``overwrite``."""
    from grader.run.rescore import rescore as rescore_results

    refuse_reimport()
    source, target = _as_path("results", results), _as_path("output", output)
    if not source.is_file():  # the CLI's argument must exist too
        raise OptionError(f"{source}: no such results file")
    if workers is not None and (type(workers) is not int or workers < 1):
        raise OptionError(f"workers: expected a number of processes (1 or more), got {workers!r}")
    with _python_words():
        summary = rescore_results(source, target, grader_config=grader_config, workers=workers,
                                  overwrite=overwrite)
    return GradeResult(summary, target)


class Grader:
    """A judge model loaded once, grading rows held in memory as ``grader grade`` grades a file
    (the same rendering, checks, rubric pass and records), with no file written.

    Use it as a context manager: the model loads at the first :meth:`grade` that sends a row
    and stays loaded until the ``with`` block ends (or :meth:`close`). Calls from several
    threads take turns.

    In the rubric format a reference's rubric is drafted once for the Grader's life, so every
    later :meth:`grade` marks answers against the same items; :meth:`save_rubric` writes them
    (``rubric=`` takes such a file in a later session).

    A list of models is a judge panel (docs/usage.md, "Judge panels"): each model grades every
    row, the later judges mark the first judge's rubric, and each row's records are pooled into
    one; :attr:`panel` holds the last call's agreement.

    Args:
        model: the judge's model directory (with ``backend="openai"``: the served name), or a
            list of them: a panel.
        settings: the settings as one object (those set in it; ``options`` win).
        options: the CLI's options (module docstring), each a :class:`GradeSettings` field;
            checked here, before any model work.
    """

    def __init__(self, model: str | list[str] | None, *, settings: GradeSettings | None = None,
                 **options: Unpack[GradeSettingsDict]) -> None:
        self.model, self.settings = model, _settings(settings, dict(options))
        if self.settings.limit is not None:  # a file run's --limit; rows are all graded
            raise OptionError("limit: grade(rows) grades every row it is given: pass rows[:N] "
                              "instead (limit is grade_file's, --limit)")
        if isinstance(model, (list, tuple)):  # a panel
            models: list[str] | None = [str(m) for m in model]
            first = models[0] if models else None
        else:
            models, first = None, model
        request = _request(first, self.settings)  # the settings' errors, now
        panel: MemoryPanel | None = None
        if models is not None:
            from grader.run.panel import PanelJudge

            where = self.settings
            panel = MemoryPanel(request, [PanelJudge(m) for m in models],
                                lambda: make_executor(where.ray, where.data_parallel))
        self._engines = _Engines(request, self.settings, panel)
        # a Grader dropped without close() closes its engine when collected, or at exit
        weakref.finalize(self, self._engines.close)

    @property
    def panel(self) -> PanelAgreement | None:
        """The last panel grade()'s agreement (a file panel's summary ``panel``)."""
        return self._engines.agreement

    @property
    def judge_check(self) -> JudgeCheck | None:
        """The last grade()'s verdict on the judge (the summary's judge_check; None: no
        controls)."""
        return self._engines.judge_check

    @property
    def _core(self) -> LoadedJudge | None:
        return self._engines.core

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def grade(self, rows: Iterable[dict[str, Any]]) -> list[Record]:
        """One record per row, in the rows' order.

        Args:
            rows: dicts with the fields a data file's rows have (``input``, ``reference``,
                ``output_text``, an ``id``; ``map`` names other columns).
        """
        try:
            rows = list(rows)
        except TypeError:
            raise OptionError(f"rows: expected dicts (a list of them), got "
                              f"{type(rows).__name__}") from None
        if not rows:  # no run: an empty file is no dataset to the reader
            return []
        # a script re-run in the engine's process grades no further (a Grader made there is fine)
        refuse_reimport()
        engines = self._engines
        # the engine may start in this call, and a library that keeps a traceback of its start
        # keeps every frame's locals: without the Grader there, it can still be collected
        del self
        return engines.grade(rows)

    def save_rubric(self, path: str | Path, *, overwrite: bool = False) -> Path:
        """Write the rubrics drafted so far (the rubric file of ``grader rubric``) to ``path``;
        ``overwrite``: replace a file there that is not a rubric file.

        Raises:
            GraderError: nothing was drafted yet, or ``path`` holds another file (without
                ``overwrite``) or is a directory.
        """
        from grader.errors import OutputError
        from grader.io.outputs import Kind, Planned, check_outputs
        from grader.io.rubric_file import write_rubric_file

        with _python_words():
            check_outputs([Planned(Path(path), Kind.RUBRIC, "path")], overwrite=overwrite)
        engines = self._engines
        with engines.turn:
            panel, core = engines.panel, engines.core
            lines: Lines = (panel.prepared_lines if panel is not None
                            else core.prepared_lines if core is not None else {})
            if not lines:
                raise GraderError("no rubric yet: grade rows in the rubric format first")
            target = Path(path)
            try:
                write_rubric_file(target, list(lines.values()))
            except OSError as exc:
                raise OutputError.of(path, exc) from None
            return target

    def close(self) -> None:
        """Stop the model's engine (vLLM's processes, the data-parallel workers, Ray) and
        drop the rubrics drafted (:meth:`save_rubric` keeps them)."""
        with self._engines.turn:
            self._engines.close()


class _Engines:
    """What a :class:`Grader` grades with, closed by its finalizer too (which must not hold the
    Grader: it would never be collected)."""

    def __init__(self, request: GradeRequest, settings: GradeSettings,
                 panel: MemoryPanel | None) -> None:
        self.request, self.settings, self.panel = request, settings, panel
        self.turn = threading.Lock()  # one grade() at a time (Grader's docstring)
        self.core: LoadedJudge | None = None
        self.agreement: PanelAgreement | None = None
        self.judge_check: JudgeCheck | None = None

    def grade(self, rows: list[dict[str, Any]]) -> list[Record]:
        """:meth:`Grader.grade`'s rows graded, the model loaded at the first that sends one."""
        with self.turn:
            request = self.request
            dataset = Dataset.of_rows(rows, name=_ROWS, mapping=request.mapping,
                                      id_column=request.id_column)
            if self.panel is not None:  # its judge check: the first judge's controls
                records = self.panel.grade(dataset)
                self.agreement, self.judge_check = self.panel.agreement, self.panel.judge_check
            else:
                core = self.core or self._load()
                records = core.grade(dataset, controls=request.controls)
                self.judge_check = core.judge_check
            if self.judge_check is not None:
                log_judge_check(self.judge_check)
            return records

    def _load(self) -> LoadedJudge:
        """The executor opened and the plan resolved (the model loads at the first row sent)."""
        executor = make_executor(self.settings.ray, self.settings.data_parallel)
        self.core = LoadedJudge.open(self.request, executor)
        return self.core

    def close(self) -> None:
        """Stop the engine; a later grade() loads it again."""
        if self.core is not None:
            core, self.core = self.core, None
            core.executor.close()
        if self.panel is not None:
            self.panel.close()


# The name rows held in memory go by (in errors: "rows:3: ...").
_ROWS = "rows"
