"""grader: an offline LLM-as-a-judge.

The Python API (:mod:`grader.api`) is imported on first use: ``import grader`` loads nothing
else, and nothing here imports torch or vLLM.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
_RECORDS = ("Record", "SeedRecord", "ItemizedRecord", "RubricRecord", "PairwiseRecord",
            "ScoreModelRecord", "ForeignRecord")
__all__ = ["Grader", "GradeResult", "GraderError", "grade_file", "rescore", "GradeSettings",
           "Item", "Status", "Record", "SeedRecord", "ItemizedRecord", "RubricRecord",
           "PairwiseRecord", "ScoreModelRecord", "ForeignRecord", "Summary", "JudgeCheck"]

if TYPE_CHECKING:
    from grader.analysis.summary import Summary
    from grader.analysis.verdict import JudgeCheck
    from grader.api import Grader, GradeResult, grade_file, rescore
    from grader.config import GradeSettings
    from grader.errors import GraderError
    from grader.io.dataset import Item
    from grader.records import (
        ForeignRecord,
        ItemizedRecord,
        PairwiseRecord,
        Record,
        RubricRecord,
        ScoreModelRecord,
        SeedRecord,
    )
    from grader.status import Status

_LAZY = {"Grader": "grader.api", "GradeResult": "grader.api", "grade_file": "grader.api",
         "rescore": "grader.api", "GraderError": "grader.errors",
         "GradeSettings": "grader.config", "Item": "grader.io.dataset", "Status": "grader.status",
         "Summary": "grader.analysis.summary", "JudgeCheck": "grader.analysis.verdict",
         **dict.fromkeys(_RECORDS, "grader.records")}


def __getattr__(name: str) -> Any:
    # PEP 562: the API's modules load when first named (importlib, not an import statement:
    # grader.api's own imports reach back to this package for its __version__)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'grader' has no attribute {name!r}")
