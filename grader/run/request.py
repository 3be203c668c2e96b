"""How ``grader grade`` was asked to judge (:class:`GradeRequest`), resolved the one way the
CLI and the Python API resolve it (:func:`resolve`); a file run's data and results
(:class:`FileJob`); the run's plan (:class:`RunPlan`); and how a stopped run says so."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grader.config import (
    GradeSettings,
    OpenAIConfig,
    SamplingConfig,
    TransformersConfig,
    VLLMConfig,
    load_settings,
)
from grader.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, GraderError
from grader.judge.judges import (
    Judge,
    check_options,
    either,
    formats_taking,
    make_judge,
    resolve_format,
)


def _default(name: str) -> Any:
    """The default of the grade setting ``name`` (:class:`grader.config.GradeSettings`)."""
    return GradeSettings.model_fields[name].get_default(call_default_factory=True)


@dataclass
class GradeRequest:
    """How ``grader grade`` was asked to judge, rows from a file or in memory: the grade
    settings (their defaults are :class:`grader.config.GradeSettings`' own) resolved, with the
    settings file's sections.

    A request built directly (a test, a script) with no ``backend`` has ``auto``, as the
    command line and the settings file do.
    """

    model: str
    backend: str = _default("backend")
    prompt: str | None = _default("prompt")  # None: the format's own prompt (judges.resolve_format)
    mapping: dict[str, str] = field(default_factory=dict)  # the setting ``map``
    id_column: str | None = _default("id_column")
    source: str | None = _default("source")  # --from (grader.io.foreign.SOURCES); None: detected
    checklist: bool = True  # the setting ``checklist`` resolved (resolve_judge_options)
    format: str | None = _default("format")  # None: the format of the --prompt (resolve_format)
    rubric: str | None = _default("rubric")  # --format rubric: a rubric file to use
    evidence: bool = _default("evidence")  # --format rubric: a quote per item marked present
    chunk_size: int | None = None  # rows per block, where a test or script sets it
    truncate: tuple[str, ...] = ()  # the setting ``truncate``: TRUNCATE_FIELDS
    grader_config: str | None = _default("grader_config")  # an OpenAI score_model grader
    aggregate: str = _default("aggregate")  # how a row's samples (sampling.n > 1) become one value
    # grader.run.controls: references whose controls are graded beside the rows; 0: none
    controls: int = _default("controls")
    # model_validate({}): each section's defaults, as the settings file's absence gives them
    # (mypy without pydantic's plugin reads Field(None, ...) as no default)
    sampling: SamplingConfig = field(default_factory=lambda: SamplingConfig.model_validate({}))
    transformers: TransformersConfig = field(
        default_factory=lambda: TransformersConfig.model_validate({}))
    vllm: VLLMConfig = field(default_factory=lambda: VLLMConfig.model_validate({}))
    # --backend openai: the server
    openai: OpenAIConfig = field(default_factory=lambda: OpenAIConfig.model_validate({}))

    def settings_for(self, backend: str) -> TransformersConfig | VLLMConfig | OpenAIConfig | None:
        """The settings section of ``backend`` (None: a backend without one, as a test's fake)."""
        sections: dict[str, TransformersConfig | VLLMConfig | OpenAIConfig] = {
            "transformers": self.transformers, "vllm": self.vllm, "openai": self.openai}
        return sections.get(backend)


@dataclass(frozen=True)
class FileJob:
    """What a file run reads and writes beside its :class:`GradeRequest`: the data (``-``:
    JSONL on stdin), the results file, whether results an earlier run left there are replaced
    rather than resumed, and how many of the data's rows are read (None: every row)."""

    data: str
    output: Path
    overwrite: bool = False
    limit: int | None = None


class Interrupted(GraderError):
    """The run stopped after a Ctrl-C or a SIGTERM, its finished chunks saved for a resume."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, done: int, total: int, partial: Path, *, terminated: bool = False,
                 overwrite: bool = False):
        self.done, self.total, self.partial = done, total, partial
        if terminated:
            self.exit_code = EXIT_TERMINATED
        # run again with overwrite, the run would start over and drop what is saved; the
        # command line replaces this part with the command that resumes, so it speaks Python
        again = "run the same call again without overwrite=True" if overwrite else (
            "run the same command again")
        super().__init__(f"{'stopped by SIGTERM' if terminated else 'interrupted'}: {done} of "
                         f"{total} rows are graded and saved in {partial}; {again} to resume")


class OptionError(GraderError):
    """Options that contradict each other, or one the command does not know: one line."""


class OptionUsageError(OptionError):
    """An option missing or written wrong: the CLI shows its usage line with it."""


def resolve_judge_options(prompt: str | None, checklist: bool | None, answer_format: str | None,
                          grader_config: str | None = None) -> tuple[str | None, bool, str | None]:
    """``(prompt, checklist, format)`` as the judge will use them: the one place a format left
    out is resolved (:func:`grader.judge.judges.resolve_format`) and a contradiction stops.

    A ``grader_config`` grader has no format: ``(prompt, checklist, None)``.
    """
    if grader_config:
        if answer_format is not None:
            raise OptionError("--format is for the seed judge, not a --grader-config grader")
        return prompt, True if checklist is None else checklist, None
    try:
        prompt, answer_format = resolve_format(prompt, answer_format)
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    if answer_format == "seed":
        return prompt, True if checklist is None else checklist, answer_format
    if checklist is not None:
        # --no-checklist too: it is the seed format's option, and must not quietly mean
        # something else in another format
        flag = "--checklist" if checklist else "--no-checklist"
        raise OptionError(f"{flag} is for --format seed: in the {answer_format} format the "
                          "judge's item lists take the checklist's place")
    return prompt, False, answer_format


# --truncate's choices -> the fields a row may be cut in.
TRUNCATE_FIELDS: dict[str | None, tuple[str, ...]] = {
    None: (), "output_text": ("output_text",), "reference": ("reference",),
    "both": ("output_text", "reference"),
}


def resolve(settings: GradeSettings, model: str | None) -> GradeRequest:
    """The one way a :class:`GradeRequest` is made from the settings given (the command line's
    and the Python API's alike: :attr:`GradeSettings.model_fields_set` are the given ones): the
    judge's options resolved, the settings file read under them, the model checked.

    Raises:
        OptionError: options that contradict each other; OptionUsageError: ``--model`` missing.
        SettingsError: a settings file or a setting it holds that cannot be used.
    """
    from grader.backends.chat import check_model

    prompt, checklist, answer_format = resolve_judge_options(
        _str(settings.prompt), settings.checklist, settings.format, _str(settings.grader_config))
    try:  # --evidence and --rubric belong to the formats whose judges take them (Judge.options)
        check_options(answer_format, evidence=settings.evidence, rubric=_str(settings.rubric))
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    sampling: Mapping[str, object] = {}
    if settings.grader_config:  # the grader's own sampling_params, under explicit options
        from grader.judge.score_model import load_grader_config

        sampling = load_grader_config(settings.grader_config).sampling_overrides()
    if settings.confidence:  # the top-k log-probabilities --confidence reads
        from grader.judge.confidence import TOP_K

        sampling = {**sampling, "logprobs": TOP_K}
    engine = load_settings(_str(settings.config), settings, sampling)
    if engine.backend == "openai":
        from grader.backends.openai_backend import resolve_served_model

        # The server's id for the model, asked before anything else: it is the resume key's
        # model, and a URL where nothing listens fails here, in one line.
        model = resolve_served_model(engine.openai, model)
    elif model is None:
        raise OptionUsageError("Missing option '--model' / '-m'.")
    else:
        check_model(engine.backend, model)
    if engine.sampling.logprobs is not None:
        _check_confidence(answer_format, bool(settings.grader_config), engine.sampling.n)
    request = GradeRequest(
        model=model, backend=engine.backend, prompt=prompt, mapping=dict(settings.map or {}),
        id_column=settings.id_column, source=settings.source, checklist=checklist,
        format=answer_format, rubric=_str(settings.rubric), evidence=settings.evidence,
        truncate=TRUNCATE_FIELDS[settings.truncate], grader_config=_str(settings.grader_config),
        aggregate=settings.aggregate, controls=engine.controls, sampling=engine.sampling,
        transformers=engine.transformers, vllm=engine.vllm, openai=engine.openai)
    if request.backend == "openai" and (settings.ray is not None or (settings.data_parallel or 1) > 1):
        # one server takes the rows: more engines are not its to start
        raise OptionError("--backend openai sends the rows to one server: raise --max-concurrency "
                          "instead of --data-parallel or --ray")
    return request


def _str(path: str | Path | None) -> str | None:
    return None if path is None else str(path)


def _check_confidence(answer_format: str | None, grader_config: bool, samples: int) -> None:
    """--confidence (sampling.logprobs) reads the choices of one answer (the formats whose
    judges take it: :attr:`grader.judge.judges.Judge.options`), or a verdict."""
    formats = formats_taking("confidence")
    if grader_config or answer_format not in formats:
        raise OptionError(f"--confidence (sampling.logprobs) needs --format {either(formats)}: "
                          "the confidence is read from each item's present choice, "
                          "or from the verdict")
    if samples > 1:
        raise OptionError("--confidence reads one answer's probabilities: with --samples the "
                          "samples' spread is the measure of doubt")


@dataclass(frozen=True)
class RunPlan:
    """What a run does, resolved once from its :class:`GradeRequest`: the backend (``auto``
    chosen where the backends run), the judge and its schema, the answer's token cap.

    Frozen, and picklable for a ``--data-parallel`` worker or a Ray actor: a pickle carries
    the request and the resolved choices, and the judge (its compiled templates do not pickle)
    is built again from the request on the other side.
    """

    request: GradeRequest
    backend: str
    judge: Judge = field(compare=False, repr=False)

    @classmethod
    def build(cls, request: GradeRequest, backend: str) -> RunPlan:
        return cls(request, backend, judge_for(request))

    @property
    def schema(self) -> dict[str, Any]:
        """The schema the backend is built with (a row may carry its own: Judge.row_schema)."""
        return self.judge.schema

    @property
    def max_tokens(self) -> int:
        """The cap on the judge's answer: the setting, else the longest the schema admits."""
        return self.request.sampling.max_tokens or self.judge.max_tokens

    @property
    def settings(self) -> TransformersConfig | VLLMConfig | OpenAIConfig | None:
        """The backend's own settings section of the request."""
        return self.request.settings_for(self.backend)

    def __reduce__(self) -> tuple[Any, ...]:
        return RunPlan.build, (self.request, self.backend)


def judge_for(request: GradeRequest) -> Judge:
    """The request's judge: its OpenAI score_model grader, else the seed judge."""
    pairwise = request.format == "pairwise" and not request.grader_config
    if pairwise and request.sampling.n > 1:
        raise OptionError("--samples is not for --format pairwise: each pair is judged twice "
                          "already, once in each order, and a verdict is no number to aggregate")
    return make_judge(grader_config=request.grader_config, prompt=request.prompt,
                      checklist=request.checklist, answer_format=request.format,
                      evidence=request.evidence, rubric=request.rubric if pairwise else None)
