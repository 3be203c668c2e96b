"""inspect_ai's entry point into grader (``[project.entry-points.inspect_ai]`` in
pyproject.toml): importing it registers ``grader/reference_judge`` (and ``grader/grader``, the
scorer of ``grader grade --write-inspect``) with inspect_ai, which loads it when a name under
``grader/`` is asked for (``inspect score --scorer grader/reference_judge``)."""

from grader.inspect_log import judge_check, logged_scores
from grader.inspect_scorer import grader_scorer, reference_judge

__all__ = ["grader_scorer", "judge_check", "logged_scores", "reference_judge"]
