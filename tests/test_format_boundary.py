"""The rubric format is one stage: only the modules listed here may know it (issue 31).

A module *knows* the format when its code, not its comments, imports one of the format's
modules, names one of its classes, or names ``"rubric"`` as a string literal (a format, a
manifest entry, a setting). The run layer drives the format's preparation stage through
:class:`grader.run.stage.Stage` without knowing it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GRADER = Path(__file__).resolve().parent.parent / "grader"

FORMAT_MODULES = frozenset({"grader.judge.rubric", "grader.io.rubric_file", "grader.run.rubric_pass"})
FORMAT_NAMES = frozenset({"RubricJudge", "DraftJudge", "RubricRecord", "DraftRecord", "RubricPass",
                          "Rubric", "Rubrics", "RubricFailure", "RubricEntry", "RubricDraft"})

# the format itself (FORMAT_MODULES' files): a rubric's items, its draft and how a draft is
# read; the rubric file; the rubric stage (grader.run.stage.Stage) and `grader rubric`
FORMAT_FILES = frozenset({"judge/rubric.py", "io/rubric_file.py", "run/rubric_pass.py"})

ALLOWED = {
    # the format's judges, schemas and records
    "judge/judges.py": "RubricJudge and DraftJudge; the pairwise judge shows a rubric file's items",
    "judge/schema.py": "each answer format's JSON schema, the rubric's draft and check schemas",
    "judge/records.py": "each format's record builder",
    # public names
    "__init__.py": "exports RubricRecord",
    "records.py": "the record classes, RubricRecord among them",
    "cli.py": "the `grader rubric` command and the --rubric option",
    "config.py": "the --rubric setting",
    "api.py": "Grader.save_rubric",
    "run/request.py": "GradeRequest's field of the --rubric setting",
    "inspect_log.py": "an inspect_ai Score's metadata names the record's rubric key",
}


def reasons(source: str) -> set[str]:
    """What in ``source``'s code knows the rubric format (empty: nothing)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
            found |= {f"imports {m}" for m in modules & FORMAT_MODULES}
            found |= {f"names {alias.name}" for alias in node.names if alias.name in FORMAT_NAMES}
        elif isinstance(node, ast.Import):
            found |= {f"imports {a.name}" for a in node.names if a.name in FORMAT_MODULES}
        elif isinstance(node, ast.Name) and node.id in FORMAT_NAMES:
            found.add(f"names {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORMAT_NAMES:
            found.add(f"names {node.attr}")
        elif isinstance(node, ast.Constant) and node.value == "rubric":
            found.add('names "rubric"')
    return found


def _knowing() -> dict[str, set[str]]:
    modules = {}
    for path in sorted(GRADER.rglob("*.py")):
        found = reasons(path.read_text(encoding="utf-8"))
        if found:
            modules[path.relative_to(GRADER).as_posix()] = found
    return modules


def test_only_the_listed_modules_know_the_rubric_format() -> None:
    others = {m: sorted(r) for m, r in _knowing().items() if m not in set(ALLOWED) | FORMAT_FILES}
    assert not others, f"modules that know the rubric format and are not allowed to: {others}"


def test_every_listed_module_still_knows_it() -> None:
    # the list stays as short as is true: a module that no longer knows the format leaves it
    assert FORMAT_FILES <= {p.relative_to(GRADER).as_posix() for p in GRADER.rglob("*.py")}
    stale = sorted(set(ALLOWED) - set(_knowing()))
    assert not stale, f"no longer know the rubric format, remove from ALLOWED: {stale}"


@pytest.mark.parametrize("source", [
    "from grader.run.rubric_pass import RubricPass",
    "import grader.judge.rubric",
    "from grader.io import rubric_file",
    "from grader.judge.judges import RubricJudge",
    "isinstance(judge, judges.RubricJudge)",
    "if judge.answer_format == 'rubric': pass",
])
def test_code_that_knows_the_format_is_found(source: str) -> None:
    assert reasons(source)


def test_comments_docstrings_and_generic_stages_are_not_counted() -> None:
    source = '''
"""The rubric stage, in words only."""
# a rubric is mentioned here
from grader.run.stage import stage_for
def run(judge, request):
    """What a rubric needs."""
    stage = stage_for(judge)
    return request.rubric, "--format rubric"
'''
    assert reasons(source) == set()
