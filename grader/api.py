"""grader from Python: the command line's verbs, with its settings and its defaults.

    import grader

    with grader.Grader("models/judge", backend="transformers") as judge:
        records = judge.grade([{"input": "...", "reference": "...", "output_text": "..."}])

Settings are the command line's options, spelled with underscores (``max_tokens`` for
``--max-tokens``); a request is built by :func:`grader.run.request.build_request`, the one way
the CLI builds it, so a setting left out means what the CLI means by it. Three differ in
spelling: ``backend`` left out reads ``GRADER_BACKEND`` as ``--backend`` does; ``map`` takes a dict ``{field: column}``, ``source`` is ``--from`` (a keyword in
Python), and ``chat_template_kwargs`` / ``engine_args`` take dicts for the repeated
``KEY=VALUE`` options. Every error is a :class:`grader.errors.GraderError` with the exit code
the CLI would exit with. Nothing here imports torch or vLLM until a model is loaded.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, PositiveInt, ValidationError

from grader.io.dataset import Dataset
from grader.io.foreign import SOURCES
from grader.io.results import read_records
from grader.judge.records import Record
from grader.run.core import LoadedJudge
from grader.run.grading import make_executor, run_grade
from grader.run.panel import MemoryPanel
from grader.run.request import (
    ENGINE_OPTIONS,
    TRUNCATE_FIELDS,
    GradeRequest,
    OptionError,
    RunPlan,
    build_request,
    check_executor_options,
    check_rubric_options,
    resolve_judge_options,
)

log = logging.getLogger(__name__)

# The settings that are not engine settings (grader.run.request.ENGINE_OPTIONS): how the rows
# are read and judged, and where the rows are graded. Names are the CLI's options.
_JUDGE_SETTINGS = frozenset({"prompt", "format", "checklist", "grader_config", "rubric", "evidence"})
_RUN_SETTINGS = frozenset({"map", "id_column", "source", "limit", "aggregate", "truncate",
                           "overwrite", "config", "samples"})
_WHERE_SETTINGS = frozenset({"data_parallel", "ray"})
SETTINGS = frozenset(
    (ENGINE_OPTIONS - {"n"}) | _JUDGE_SETTINGS | _RUN_SETTINGS | _WHERE_SETTINGS
)


class _SettingTypes(BaseModel):
    """The types the CLI's options give the settings that are not engine settings (the engine
    settings are checked by grader.config, naming the option): Click checks them on the command
    line, this here, so a wrong one is an OptionError naming it, not a TypeError from inside a
    run. Strict: ``"yes"`` is no bool and ``"2"`` no number."""

    model_config = ConfigDict(extra="ignore", strict=True)

    prompt: str | Path | None = None
    format: str | None = None
    checklist: bool | None = None
    grader_config: str | Path | None = None
    rubric: str | Path | None = None
    evidence: bool | None = None
    map: dict[str, str] | None = None
    id_column: str | None = None
    source: str | None = None  # one of grader.io.foreign.SOURCES: _check_types
    limit: PositiveInt | None = None
    aggregate: Literal["median", "mean", "majority"] | None = None
    overwrite: bool | None = None
    config: str | Path | None = None
    samples: PositiveInt | None = None
    data_parallel: PositiveInt | None = None
    ray: str | None = None


def _check_types(settings: dict[str, Any]) -> None:
    try:
        _SettingTypes.model_validate(settings)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0])  # the setting (a union's branch or a dict's key follow)
        raise OptionError(f"{name}: {first['msg']}, got {settings[name]!r}") from None
    if settings.get("source") not in (None, *SOURCES):
        raise OptionError(f"source: {settings['source']!r} is not one of {', '.join(SOURCES)}")


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

    summary: dict[str, Any]
    output: Path

    @property
    def records(self) -> list[Record]:
        """Every record of the results file, in input order (read each time it is asked for)."""
        return [record for _, record in read_records(self.output)]


def _request(data: str, output: Path, model: str | None, settings: dict[str, Any]) -> GradeRequest:
    """The CLI's request for these settings: the same checks, the same defaults."""
    unknown = sorted(set(settings) - SETTINGS)
    if unknown:
        raise OptionError(f"unknown setting{'s' if len(unknown) > 1 else ''} "
                          f"{', '.join(unknown)}: known: {', '.join(sorted(SETTINGS))}")
    _check_types(settings)
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise OptionError(f"model: expected a model directory or a served name (str), got "
                          f"{type(model).__name__}")
    prompt, checklist, answer_format = resolve_judge_options(
        settings.get("prompt"), settings.get("checklist"), settings.get("format"),
        settings.get("grader_config"))
    check_rubric_options(settings.get("rubric"), bool(settings.get("evidence")), answer_format)
    truncate = settings.get("truncate")
    if not isinstance(truncate, str | None) or truncate not in TRUNCATE_FIELDS:
        raise OptionError(f"truncate: {truncate!r} is not one of output_text, reference, both")
    engine = {name: settings.get(name) for name in ENGINE_OPTIONS - {"n"}}
    engine["n"] = settings.get("samples")
    # the command line's --backend reads this variable when the option is not given
    engine["backend"] = settings.get("backend") or os.environ.get("GRADER_BACKEND") or None
    request = build_request(
        settings.get("config"), engine, data=data, output=output, model=model, prompt=prompt,
        mapping=dict(settings.get("map") or {}), id_column=settings.get("id_column"),
        source=settings.get("source"), checklist=checklist, format=answer_format,
        limit=settings.get("limit"), truncate=TRUNCATE_FIELDS[truncate],
        overwrite=bool(settings.get("overwrite")), grader_config=settings.get("grader_config"),
        aggregate=settings.get("aggregate") or "median", rubric=settings.get("rubric"),
        evidence=bool(settings.get("evidence")),
    )
    check_executor_options(request, settings.get("ray"), settings.get("data_parallel"))
    return request


def grade_file(data: str | Path, output: str | Path, model: str | None = None,
               **settings: Any) -> GradeResult:
    """``grader grade DATA -o OUTPUT -m MODEL``: grade a file, resuming what a run of the same
    settings left in ``output``; the summary is written beside it.

    Args:
        data: a .jsonl, .csv or .parquet file, an lm-eval samples file, an inspect_ai log or a
            ``save_to_disk`` folder.
        output: the results JSONL.
        model: the judge's model directory (with ``backend="openai"``: the served name).
        settings: the CLI's options (module docstring).
    """
    if model is None and isinstance(settings.get("config"), str | os.PathLike):
        from grader.config import load_settings

        # the settings file's panel section, as the CLI runs it where --model is not given
        panel = load_settings(str(settings["config"]), {}).panel
        if panel:
            return grade_panel(data, output, [j.model for j in panel],
                               temperatures=[j.temperature for j in panel], **settings)
    request = _request(str(_as_path("data", data)), _as_path("output", output), model, settings)
    summary = run_grade(request, make_executor(settings.get("ray"), settings.get("data_parallel")))
    _log_judge_check(summary)
    return GradeResult(summary, request.output)


def grade_panel(data: str | Path, output: str | Path, models: list[str], *,
                temperatures: list[float | None] | None = None, **settings: Any) -> GradeResult:
    """``grader grade DATA -o OUTPUT -m A -m B ... [--panel-temperature T ...]``: a judge
    panel, each judge graded in turn into ``OUTPUT.judge-N.jsonl``, their labels pooled into
    ``output`` (README, "Judge panels"); ``temperatures``: one per model, or None."""
    from grader.backends.chat import check_model_path
    from grader.run.panel import PanelJudge, check_panel, run_panel

    if temperatures is not None and len(temperatures) != len(models):
        raise OptionError(f"temperatures: {len(temperatures)} for {len(models)} judges")
    judges = [PanelJudge(str(m), None if temperatures is None else temperatures[i])
              for i, m in enumerate(models)]
    if not judges:
        raise OptionError("models: a panel needs two judges or more")
    request = _request(str(_as_path("data", data)), _as_path("output", output), judges[0].model,
                       settings)
    check_panel(request, judges)
    if request.backend != "openai":
        for judge in judges[1:]:
            check_model_path(judge.model)
    summary = run_panel(request, judges, lambda: make_executor(settings.get("ray"),
                                                               settings.get("data_parallel")))
    return GradeResult(summary, request.output)


def _log_judge_check(summary: dict[str, Any]) -> None:
    """The verdict of the run's controls, as the CLI prints it: a warning unless the judge
    is informative (or too few references could be checked)."""
    check = summary.get("judge_check")
    if check:
        from grader.analysis.verdict import format_verdict

        level = logging.WARNING if check["verdict"] in ("weak", "no signal") else logging.INFO
        log.log(level, "%s", format_verdict(check))


def rescore(results: str | Path, output: str | Path, *, grader_config: str | None = None,
            workers: int | None = None, overwrite: bool = False) -> GradeResult:
    """``grader rescore RESULTS -o OUTPUT``: every score recomputed from the judge's raw text;
    no model is loaded. OUTPUT holding another run's results stops unless ``overwrite``."""
    from grader.run.rescore import rescore as rescore_results

    source, target = _as_path("results", results), _as_path("output", output)
    if not source.is_file():  # the CLI's argument must exist too
        raise OptionError(f"{source}: no such results file")
    if workers is not None and (type(workers) is not int or workers < 1):
        raise OptionError(f"workers: expected a number of processes (1 or more), got {workers!r}")
    summary = rescore_results(source, target, grader_config=grader_config, workers=workers,
                              overwrite=overwrite)
    return GradeResult(summary, target)


class Grader:
    """A judge model loaded once, grading rows held in memory, as ``grader grade`` grades a
    file: the same rendering, checks, rubric pass and records, with no file written, no lock
    and no bar (:class:`grader.run.core.LoadedJudge`).

    Use it as a context manager: the model loads at the first :meth:`grade` that sends a row
    and stays loaded for the next ones, until the ``with`` block ends (or :meth:`close`).

    In the rubric format a reference's rubric is drafted once for the Grader's life: a later
    :meth:`grade` reuses it, as a run resumes the rubric file beside its results, so ten models'
    answers to one benchmark are marked against the same items. :meth:`save_rubric` writes them
    (``rubric=`` takes such a file in a later session).

    Calls from several threads take turns: one :meth:`grade` runs at a time on the one model,
    and :meth:`save_rubric` and :meth:`close` wait for it.

    A list of models is a judge panel (README, "Judge panels"): each model grades every row
    (each loaded at its first row and kept), the later judges mark the first judge's rubric,
    and each row's records are pooled into one; :attr:`panel` holds the last call's agreement.

    Args:
        model: the judge's model directory (with ``backend="openai"``: the served name), or a
            list of them: a panel.
        settings: the CLI's options (module docstring); checked here, before any model work.
    """

    def __init__(self, model: str | list[str] | None, **settings: Any) -> None:
        self.model, self.settings = model, settings
        if settings.get("limit") is not None:  # a file run's --limit; rows are all graded
            raise OptionError("limit: grade(rows) grades every row it is given: pass rows[:N] "
                              "instead (limit is grade_file's, --limit)")
        models: list[str] | None = None
        first: str | None
        if isinstance(model, (list, tuple)):  # a panel
            models = [str(m) for m in model]
            first = models[0] if models else None
        else:
            first = model
        # the settings' errors, now; rows in memory have no data file and no results file:
        # these two names are never opened (the rows' errors name "rows")
        self._request = _request(_ROWS, Path(_ROWS), first, settings)
        self._turn = threading.Lock()  # one grade() at a time (the class docstring)
        self._core: LoadedJudge | None = None
        self._panel: MemoryPanel | None = None
        if models is not None:
            from grader.run.panel import PanelJudge

            self._panel = MemoryPanel(self._request, [PanelJudge(m) for m in models],
                                      lambda: make_executor(settings.get("ray"),
                                                            settings.get("data_parallel")))
        #: the last panel grade()'s agreement (a file panel's summary ``panel``)
        self.panel: dict[str, Any] | None = None
        #: the last grade()'s verdict on the judge (the summary's judge_check; None: no controls)
        self.judge_check: dict[str, Any] | None = None

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
        with self._turn:
            request = self._request
            dataset = Dataset.of_rows(rows, name=_ROWS, mapping=request.mapping,
                                      id_column=request.id_column)
            if self._panel is not None:
                records = self._panel.grade(dataset)
                self.panel = self._panel.agreement
                return records
            core = self._core or self._load()
            records = core.grade(dataset, controls=request.controls)
            self.judge_check = core.judge_check
            if self.judge_check is not None:
                _log_judge_check({"judge_check": self.judge_check})
            return records

    def _load(self) -> LoadedJudge:
        """The executor opened and the plan resolved (the model loads at the first row sent)."""
        from grader.run.request import judge_for

        executor = make_executor(self.settings.get("ray"), self.settings.get("data_parallel"))
        executor.open()
        try:
            backend, reason = self._request.backend, None
            if backend == "auto":
                backend, reason = executor.choose_backend("auto")
                log.info("backend: %s (%s)", backend, reason)
            self._core = LoadedJudge(RunPlan(self._request, backend, judge_for(self._request)),
                                     executor)
        except BaseException:
            executor.close()
            raise
        return self._core

    def save_rubric(self, path: str | Path) -> Path:
        """Write the rubrics drafted so far (the rubric file of ``grader rubric``) to ``path``.

        Raises:
            GraderError: nothing was drafted yet (no :meth:`grade` in the rubric format).
        """
        from grader.errors import GraderError, OutputError
        from grader.io.rubric_file import write_rubric_file

        with self._turn:
            lines = (self._panel.rubric_lines if self._panel is not None
                     else self._core.rubric_lines if self._core is not None else {})
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
        with self._turn:
            if self._core is not None:
                core, self._core = self._core, None
                core.executor.close()
            if self._panel is not None:
                self._panel.close()


# The name rows held in memory go by (in errors: "rows:3: ...").
_ROWS = "rows"
