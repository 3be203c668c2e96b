"""What ``grader grade`` was asked to do, and how a run that was stopped says so."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from grader.config import OpenAIConfig, SamplingConfig, TransformersConfig, VLLMConfig
from grader.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, GraderError
from grader.judge.judges import Judge, make_judge


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
    source: str | None = None  # --from: the data's format (grader.io.foreign.SOURCES); None: detected
    checklist: bool = True
    format: str | None = None  # None: the format of the --prompt (judges.resolve_format)
    rubric: str | None = None  # --format rubric: a rubric file to use (grader.io.rubric_file)
    evidence: bool = False  # --format rubric: a quote per item marked present
    limit: int | None = None
    chunk_size: int | None = None
    truncate: tuple[str, ...] = ()
    overwrite: bool = False
    grader_config: str | None = None  # an OpenAI score_model grader instead of the seed judge
    aggregate: str = "median"  # how a row's samples (sampling.n > 1) become one value
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    transformers: TransformersConfig = field(default_factory=TransformersConfig)
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    openai: OpenAIConfig = field(default_factory=OpenAIConfig)  # --backend openai: the server


class Interrupted(GraderError):
    """The run stopped after a Ctrl-C or a SIGTERM, its finished chunks saved for a resume."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, done: int, total: int, partial: Path, *, terminated: bool = False,
                 overwrite: bool = False):
        self.done, self.total, self.partial = done, total, partial
        if terminated:
            self.exit_code = EXIT_TERMINATED
        # run again with --overwrite, the run would start over and drop what is saved
        again = "run the same command again without --overwrite" if overwrite else (
            "run the same command again")
        super().__init__(
            f"{'stopped by SIGTERM' if terminated else 'interrupted'}: {done} of {total} rows "
            f"are graded and saved in {partial}; {again} to resume"
        )


def judge_for(request: GradeRequest) -> Judge:
    """The request's judge: its OpenAI score_model grader, else the seed judge."""
    return make_judge(
        grader_config=request.grader_config,
        prompt=request.prompt,
        checklist=request.checklist,
        answer_format=request.format,
        evidence=request.evidence,
    )
