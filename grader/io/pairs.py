"""``grader grade --pair A B``: two files of answers to the same rows, paired by id into the
rows of the pairwise format (``output_a``, ``output_b``), written beside the results.

A and B are data files as ``grader grade`` reads them (``id``, ``input``, ``reference``,
``output_text``, with the same ``--map``, ``--id-column`` and ``--from``): the answers of two
models to one benchmark. A results file keeps no graded text (only the judge's), so results
files cannot be paired; their data files can. The models are named after the files
(``runs/model-x.jsonl`` -> ``model-x``). The pairs file is the run's data: its summary names it,
and a rerun that pairs the same files finds it unchanged and resumes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grader.io.dataset import Dataset, DatasetError, Item
from grader.io.foreign import Row
from grader.io.results import encode, write_atomic


def pairs_path(results: Path) -> Path:
    """``results.jsonl`` -> ``results.pairs.jsonl`` beside it."""
    return results.with_name(results.name.removesuffix(".jsonl") + ".pairs.jsonl")


def model_name(path: str) -> str:
    """The model a file of answers is named after: its name without the extension."""
    return Path(path).stem if path != "-" else "-"


def _read(path: str, **options: Any) -> dict[Any, Item]:
    """The file's rows by id (whole: a pair needs both sides at hand), ids checked unique."""
    with Dataset(path, **options) as dataset:
        items = {item.id: item for item in dataset}
        dataset.check_unique_ids()
    return items


def _same_question(a: Item, b: Item, a_path: str, b_path: str) -> None:
    """The two answers of a pair answer one question: where B's file gives an input or a
    reference, it is A's."""
    for name in ("input", "reference"):
        theirs = b.fields.get(name)
        if theirs and theirs != a.fields.get(name):
            raise DatasetError(b_path, b.line, f"id {b.id!r}: its {name} differs from {a_path}'s "
                                               f"(line {a.line}): a pair answers one question")


def pair_rows(a_path: str, b_path: str, *, mapping: Mapping[str, str] | None = None,
              id_column: str | None = None, source: str | None = None) -> list[Row]:
    """The rows of the pairwise format, in A's order: A's input and reference (B's where A has
    none), A's answer as ``output_a``, B's as ``output_b``, and the models' names.

    Raises :class:`DatasetError` for files of one name, different rows (how many ids they
    share, the first id only one has), or one id asking two questions.
    """
    names = model_name(a_path), model_name(b_path)
    if names[0] == names[1]:
        raise DatasetError(b_path, None, f"both files are named {names[0]!r}: --pair names the "
                                         "two models after their files; rename one")
    options = {"mapping": mapping, "id_column": id_column, "source": source}
    a, b = _read(a_path, **options), _read(b_path, **options)
    only_a = [key for key in a if key not in b]
    only_b = [key for key in b if key not in a]
    if only_a or only_b:
        shared = len(a) - len(only_a)
        first = f"{only_a[0]!r} is not in {b_path}" if only_a else f"{only_b[0]!r} is not in {a_path}"
        raise DatasetError(a_path, None, (
            f"{a_path} and {b_path} hold different rows: they share {shared} ids, "
            f"{len(only_a)} are only in {a_path} and {len(only_b)} only in {b_path} ({first})"))
    rows = []
    for key, item in a.items():
        other = b[key]
        _same_question(item, other, a_path, b_path)
        rows.append({"id": key, "input": item.fields["input"] or other.fields["input"],
                     "reference": item.fields["reference"] or other.fields["reference"],
                     "output_a": item.fields["output_text"],
                     "output_b": other.fields["output_text"], "model_a": names[0],
                     "model_b": names[1]})
    return rows


def write_pairs(a_path: str, b_path: str, results: Path, **options: Any) -> Path:
    """Pair A and B (:func:`pair_rows`) into the pairs file beside ``results``; rewritten only
    when its rows change (a resume finds the run's data as it was), whole or not at all."""
    rows = pair_rows(a_path, b_path, **options)
    data = encode("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    path = pairs_path(results)
    try:
        unchanged = path.read_bytes() == data
    except OSError:
        unchanged = False
    if not unchanged:
        write_atomic(path, data)
    return path
