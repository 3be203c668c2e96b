"""Results JSONL and the summary file beside it. The only module that writes results.

A results file is written under a temporary name, flushed and fsynced chunk by chunk, and
renamed into place at the end: a failed run never leaves a file that looks complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from grader.io.jsonlines import dumps_record, loads
from grader.status import Status

if TYPE_CHECKING:  # the record's type is the judge's; the file is this layer's
    from grader.judge.records import Record


class ResultsError(ValueError):
    """A results file that cannot be read: ``PATH:LINE: reason``."""

    def __init__(
        self, message: str, *, path: Any = None, line: int | None = None, reason: str | None = None
    ):
        super().__init__(message)
        self.path, self.line, self.reason = path, line, reason

    @classmethod
    def at(cls, path: Any, line: int, reason: str) -> ResultsError:
        return cls(f"{path}:{line}: {reason}", path=path, line=line, reason=reason)

    def shifted(self, lines: int) -> ResultsError:
        """This error as it reads for a part of the file that starts ``lines`` lines in."""
        if self.line is None or self.reason is None:
            return self
        return ResultsError.at(self.path, self.line + lines, self.reason)


def summary_path(results: Path) -> Path:
    """``results.jsonl`` -> ``results.summary.json`` beside it."""
    return results.with_name(results.name.removesuffix(".jsonl") + ".summary.json")


def _dump(record: Record) -> str:
    return dumps_record(record) + "\n"  # json.dumps(ensure_ascii=False, allow_nan=False)


def encode(text: str) -> bytes:
    """JSON text -> the bytes of every file grader writes (results, log, summary): one encoder.

    A lone surrogate (from an engine's error text, or a record read back from such a file)
    becomes a valid \\udXXX JSON escape, which reads back as the same string, instead of
    crashing the writer: json.dumps(ensure_ascii=False) leaves it raw, and strict UTF-8 refuses it.
    """
    return text.encode("utf-8", "backslashreplace")


class ResultsWriter:
    """Writes records to ``PATH.partial`` (buffered) and renames it to ``PATH`` on :meth:`commit`.

    For derived files (rescore), cheap to write again: grading's crash-safe log is ResultsLog.
    """

    def __init__(self, path: Path):
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[bytes] | None = open(self.partial, "wb")

    def write(self, records: Iterable[Record]) -> None:
        assert self._file is not None
        if type(records) is list and len(records) == 1:  # rescore writes one at a time
            self._file.write(encode(_dump(records[0])))
        else:
            self._file.write(encode("".join(_dump(r) for r in records)))

    def append_file(self, part: Path) -> None:
        """Append the bytes of ``part`` (records a worker wrote) as they are."""
        assert self._file is not None
        self._file.flush()
        with open(part, "rb") as stream:
            shutil.copyfileobj(stream, self._file, 1 << 20)
        self._file.flush()

    def commit(self) -> None:
        """Flush, fsync once, and put the file in place."""
        assert self._file is not None
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self.partial, self.path)

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self.partial.unlink(missing_ok=True)


# Statuses worth another try on resume: the engine failed, not the judge.
RETRY_ON_RESUME = frozenset({Status.ENGINE_ERROR})


Location = tuple[int, int]  # (source, byte offset) of one record line


class ResultsLog:
    """Crash-safe results of a grading run, written and resumed without holding them in memory.

    Graded records are appended to ``PATH.partial`` chunk by chunk, flushed and fsynced, each
    with its ``key`` (a hash of rendered prompt, model identity, sampling and schema). A rerun
    of the same command indexes ``PATH.partial`` (an interrupted run) and ``PATH`` (a finished
    one) by key and reuses every record it would produce again; a SIGKILL mid-write leaves at
    most a torn last line, which is dropped. :meth:`write` returns where each record went;
    :meth:`finish` copies the records to ``PATH`` in input order from those locations and
    removes the log.
    """

    PARTIAL, FINAL = 0, 1  # sources of a Location

    def __init__(self, path: Path, *, overwrite: bool = False):
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)
        self._previous: dict[str, Location] = {}
        if overwrite:
            self.partial.unlink(missing_ok=True)
        else:
            self._drop_torn_tail()
            for source, file in ((self.FINAL, path), (self.PARTIAL, self.partial)):
                if file.is_file():
                    self._index(source, file)
        self._file: IO[bytes] | None = None

    def _index(self, source: int, file: Path) -> None:
        with open(file, "rb") as stream:
            offset = 0
            for raw in stream:
                try:
                    record = loads(raw)
                except ValueError:  # a torn line from a killed run, or a file that is not ours
                    record = None
                if (
                    isinstance(record, dict)
                    and isinstance(record.get("key"), str)
                    and record.get("status") not in RETRY_ON_RESUME
                ):
                    self._previous[record["key"]] = (source, offset)
                offset += len(raw)

    def _drop_torn_tail(self) -> None:
        if not self.partial.is_file():
            return
        with open(self.partial, "rb+") as stream:
            data = stream.read()
            end = data.rfind(b"\n") + 1
            if end != len(data):
                stream.truncate(end)

    @property
    def resumable(self) -> int:
        """How many earlier records a rerun could reuse (0 on a fresh run)."""
        return len(self._previous)

    def lookup(self, key: str) -> Location | None:
        """Where an earlier run left the record this key produces, if it is reusable."""
        return self._previous.get(key)

    def write(self, records: Iterable[Record]) -> list[Location]:
        """Append records, flushed and fsynced; returns where each one went."""
        if self._file is None:
            self._file = open(self.partial, "ab")
        locations = []
        for record in records:
            locations.append((self.PARTIAL, self._file.tell()))
            self._file.write(encode(_dump(record)))
        self._file.flush()
        os.fsync(self._file.fileno())
        return locations

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def finish(self, locations: Iterable[Location]) -> Iterator[Record]:
        """Write ``PATH`` atomically, one record per location in that order, and yield each;
        once the iteration ends, ``PATH`` is in place and the log is gone."""
        self.close()
        readers = {
            source: open(file, "rb")
            for source, file in ((self.PARTIAL, self.partial), (self.FINAL, self.path))
            if file.is_file()
        }
        final = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(final, "wb") as stream:
                for source, offset in locations:
                    reader = readers[source]
                    reader.seek(offset)
                    line = reader.readline()
                    stream.write(line)
                    yield loads(line)
                stream.flush()
                os.fsync(stream.fileno())
        finally:
            for reader in readers.values():
                reader.close()
        os.replace(final, self.path)
        self.partial.unlink(missing_ok=True)


def read_records(
    path: str | Path, *, start: int = 0, end: int | None = None
) -> Iterator[tuple[int, Record]]:
    """``(line, record)`` for each record of a results JSONL file.

    ``start`` and ``end`` (byte offsets at line starts, see :func:`split_lines`) read one part
    of the file; its lines are then numbered from 1 at ``start`` (:meth:`ResultsError.shifted`
    and :func:`line_number` give the file's own numbers back).
    """
    with open(path, "rb") as stream:
        lines: Iterator[bytes] = stream
        if start or end is not None:
            stream.seek(start)
            lines = _lines_until(stream, start, end)
        for number, raw in enumerate(lines, start=1):
            if raw.isspace():  # not raw.strip(), without copying the line
                continue
            try:
                record = loads(raw, bom=number == 1 and not start)
            except ValueError as exc:  # bad syntax or bytes, a 5000-digit number, deep nesting
                raise ResultsError.at(path, number, str(exc)) from None
            if not isinstance(record, dict) or "id" not in record:
                raise ResultsError.at(path, number, "expected a JSON object with an 'id'")
            yield number, record


def _lines_until(stream: IO[bytes], position: int, end: int | None) -> Iterator[bytes]:
    for raw in stream:
        if end is not None and position >= end:
            return
        position += len(raw)
        yield raw


def split_lines(path: str | Path, parts: int) -> list[tuple[int, int]]:
    """``(start, end)`` byte ranges that cut the file into about ``parts`` equal parts, each
    cut at the start of a line; fewer when the file has fewer lines."""
    size = os.path.getsize(path)
    bounds = [0]
    with open(path, "rb") as stream:
        for index in range(1, max(1, parts)):
            stream.seek(max(size * index // parts - 1, bounds[-1]))
            stream.readline()  # to the start of the next line
            if stream.tell() < size and stream.tell() > bounds[-1]:
                bounds.append(stream.tell())
    bounds.append(size)
    return list(zip(bounds, bounds[1:]))


def line_number(path: str | Path, offset: int) -> int:
    """The line that starts at byte ``offset``: 1 + the newlines before it."""
    newlines = 0
    with open(path, "rb") as stream:
        while offset > 0:
            block = stream.read(min(offset, 1 << 24))
            if not block:
                break
            newlines += block.count(b"\n")
            offset -= len(block)
    return newlines + 1


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_bytes(encode(json.dumps(summary, indent=2, ensure_ascii=False) + "\n"))
    os.replace(partial, path)


class SummaryError(ValueError):
    """A summary file that exists but cannot be read as one."""


def read_summary(results: str | Path) -> dict[str, Any] | None:
    """The summary written beside a results file (None when there is none): the one reader
    of summaries, for rescore, compare and report.

    Raises :class:`SummaryError` when it exists but is not a JSON object with a ``run``
    object (a ``run`` may be missing: a summary from another tool).
    """
    path = summary_path(Path(results))
    if not path.is_file():
        return None
    try:
        summary = loads(path.read_bytes(), bom=True)
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise SummaryError(f"{path}: {exc}") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("run", {}), dict):
        raise SummaryError(f"{path}: not a grader summary (a JSON object with a 'run' object)")
    return summary
