"""The rubric file: one JSON line per (input, reference), the items every answer to it is
marked against (docs/formats.md, "The rubric format"). People read it, edit its items and reuse it across runs
(``grader grade --rubric``); a malformed file stops with ``PATH:LINE: reason`` before any
model work.

A line::

    {"key": "3f2a...", "input": "...", "reference": "...",
     "facts": ["..."], "conclusions": ["..."], "terms": ["..."],
     "ungrounded": ["facts[2]"], "dropped": [], "source": "model",
     "model": "/models/judge", "prompt_sha256": "..."}

``key`` is the hash of (input, reference) (:func:`grader.judge.rubric.rubric_key`); the items
may be edited freely, the key and the texts it hashes may not.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path
from typing import Any, ClassVar

import msgspec
from msgspec import UNSET, UnsetType

from grader.errors import OutputError
from grader.io.dataset import DatasetError, reference_key, unsendable_at
from grader.io.manifest import StageEntry

LISTS = ("facts", "conclusions", "terms")


class RubricLine(msgspec.Struct, kw_only=True, frozen=True):
    """One line of a rubric file, its fields in the file's order; one ``UNSET`` is not written
    (a drafted rubric's ``model`` and ``prompt_sha256``; ``source`` a person left out)."""

    key: str
    input: str | None = None
    reference: str
    facts: list[str]
    conclusions: list[str]
    terms: list[str]
    ungrounded: list[str] = []  # "facts[2]": kept, but flagged
    dropped: list[str] = []  # duplicates grader removed, for audit
    source: str | UnsetType = UNSET  # model, data (the row's own columns) or file (--rubric)
    model: str | UnsetType = UNSET
    prompt_sha256: str | UnsetType = UNSET
    ended_on_loop: bool | UnsetType = UNSET

    def lists(self) -> dict[str, list[str]]:
        """The items by category (:data:`LISTS`)."""
        return {"facts": self.facts, "conclusions": self.conclusions, "terms": self.terms}


class RubricStageEntry(StageEntry, kw_only=True):
    """The rubric stage's entry (``run.rubric``, :mod:`grader.run.rubric_pass`): where the
    rubrics went and where each reference's came from."""

    name: ClassVar[str] = "rubric"

    path: str  # the rubric file beside the results, or --rubric FILE where nothing was added
    references: int
    written_by_judge: int
    from_data: int
    from_file: int
    resumed: int
    failed: int
    ungrounded_items: int
    # drafts the engine ended where the judge began to repeat itself (drafted this run)
    ended_on_loop: int
    output_tokens: int
    # with --rubric FILE lacking references: how many, and FILE
    not_in_file: int | UnsetType = UNSET
    file: str | UnsetType = UNSET

    def line(self) -> str:
        """``grader rubric``'s last line."""
        return (f"rubric: {self.path}: {self.references} references, "
                f"{self.written_by_judge} written by the judge, {self.resumed} kept, "
                f"{self.from_data} from the data's columns, {self.failed} failed, "
                f"{self.ungrounded_items} items flagged ungrounded, "
                f"{self.ended_on_loop} drafts ended where the judge began to repeat itself")


# The key of a rubric: a hash of the (input, reference) pair it was written for.
rubric_key = reference_key


def rubric_path(results: Path) -> Path:
    """``results.jsonl`` -> ``results.rubric.jsonl`` beside it."""
    return results.with_name(results.name.removesuffix(".jsonl") + ".rubric.jsonl")


def read_rubric_file(path: Path | str, *, resuming: bool = False) -> dict[str, RubricLine]:
    """key -> line of a rubric file, each line checked; the first bad one raises DatasetError.

    Args:
        resuming: the file is one grader appends to as rubrics are drafted
            (:class:`RubricAppender`): a last line without its newline that is not JSON is a
            write a crash cut short, and is left out rather than refused (one that reads, as
            an editor may save it, is kept).
    """
    path = str(path)
    rubrics: dict[str, RubricLine] = {}
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise DatasetError(path, None, f"cannot be read: {exc.strerror or exc}") from None
    with handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                if resuming and not text.endswith("\n"):
                    break  # only the last line can lack its newline: a torn write, drafted again
                raise DatasetError(path, number, f"not JSON: {exc.msg}") from None
            reason = _invalid(line)
            if reason is None and line["key"] != rubric_key(line.get("input"), line["reference"]):
                reason = ("key does not match the line's input and reference (edit the items, "
                          "never the key or the texts it hashes)")
            if reason is None and line["key"] in rubrics:
                reason = f"a second rubric for key {line['key']}"
            if reason is not None:
                raise DatasetError(path, number, reason)
            try:  # a field _invalid does not check, in msgspec's words
                rubrics[line["key"]] = msgspec.convert(line, RubricLine)
            except msgspec.ValidationError as exc:
                raise DatasetError(path, number, str(exc)) from None
    return rubrics


def _invalid(line: Any) -> str | None:
    if not isinstance(line, dict):
        return f"expected a JSON object, got {type(line).__name__}"
    if not isinstance(line.get("key"), str):
        return "key must be a string"
    if not isinstance(line.get("reference"), str):
        return "reference must be a string"
    if not isinstance(line.get("input"), (str, type(None))):
        return "input must be a string or null"
    for name in LISTS:
        values = line.get(name)
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return f"{name} must be a list of strings"
        for index, value in enumerate(values):
            # an item no engine can take is the rubric file's line to fix, said before any
            # model work, not a prompt that fails to render
            found = unsendable_at(value)
            if found is not None:
                return f"{name}[{index}] contains {found[0]}, which no engine can take"
    return None


def check_writable(path: Path) -> None:
    """Raise :class:`OutputError` now when ``path``'s directory cannot take a file (read-only,
    no permission, a parent that is a file): before the model loads, not after its drafts."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError.of(path, exc) from None


def write_rubric_file(path: Path, lines: Iterable[RubricLine]) -> None:
    """Write the rubric file whole, atomically: a crash or a full disk leaves the earlier file
    as it was (an OSError is raised as :class:`OutputError`, exit 73)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise OutputError.of(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as handle:
            for line in lines:
                handle.write(_encoded(line))
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp makes the file private (0600); the rubric is a file people read and share
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException as exc:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise OutputError.of(path, exc) from None
        raise


def _encoded(line: RubricLine) -> bytes:
    # json's spacing (the file's format); a lone surrogate (a judge's odd text) becomes a
    # valid JSON escape, as in the results
    text = json.dumps(msgspec.to_builtins(line), ensure_ascii=False)
    return (text + "\n").encode("utf-8", "backslashreplace")


class RubricAppender:
    """The rubric file beside the results while its rubrics are being drafted: lines are
    appended and flushed as each block (or draft) comes back, so a crash keeps them and a
    rerun resumes them (``read_rubric_file(..., resuming=True)``); :meth:`finish` then writes
    the file whole, in its final order, atomically. A failed append (a full disk) is cut back
    to the last whole line and raises :class:`OutputError`: no torn line is left.

    Args:
        path: the rubric file.
        lines: what it holds before any draft: written whole first, replacing the file.
    """

    def __init__(self, path: Path, lines: Iterable[RubricLine]) -> None:
        self.path = path
        write_rubric_file(path, lines)
        self._fd: int | None = None
        try:
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            raise OutputError.of(path, exc) from None

    def append(self, lines: Iterable[RubricLine]) -> None:
        data = memoryview(b"".join(_encoded(line) for line in lines))
        if not data or self._fd is None:
            return
        start = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            written = 0
            while written < len(data):
                written += os.write(self._fd, data[written:])
            os.fsync(self._fd)
        except OSError as exc:
            with suppress(OSError):  # cut back to the last whole line: a rerun resumes there
                os.ftruncate(self._fd, start)
            raise OutputError.of(self.path, exc) from None

    def finish(self, lines: Iterable[RubricLine]) -> None:
        self.close()
        write_rubric_file(self.path, lines)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
