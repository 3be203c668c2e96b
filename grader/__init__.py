"""grader: an offline LLM-as-a-judge."""

__version__ = "0.1.0"
