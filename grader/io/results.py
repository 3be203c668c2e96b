"""Results JSONL and the summary file beside it. The only module that writes results.

A results file is written under a temporary name, flushed and fsynced chunk by chunk, and
renamed into place at the end: a failed run never leaves a file that looks complete.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
from array import array
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from grader.errors import GraderError, OutputError
from grader.io.jsonlines import loads
from grader.io.manifest import JSONObject, RunManifest
from grader.records import JSONFields, Record, ResultsError, decode_record, parse_record
from grader.status import Status


def summary_path(results: Path) -> Path:
    """The summary beside a results file: ``results.jsonl`` -> ``results.summary.json``;
    ``results`` -> ``results.grader-summary.json`` (a name not ending in ``.jsonl`` is kept)."""
    name = results.name
    if name.endswith(".jsonl") and len(name) > len(".jsonl"):
        return results.with_name(name.removesuffix(".jsonl") + ".summary.json")
    return results.with_name(name + ".grader-summary.json")


# The names of the files grader keeps beside a results file: a results file of such a name
# would be another one's summary, log, owner, lock or temporary file.
_OWN_SUFFIXES = (".summary.json", ".grader-summary.json", ".partial", ".partial.json", ".lock",
                 ".tmp", ".controls.jsonl")


def check_results_name(results: Path) -> None:
    """A results file may not take the name of a file grader keeps beside another one."""
    for suffix in _OWN_SUFFIXES:
        if results.name.endswith(suffix):
            raise GraderError(
                f"-o {results}: names ending in {suffix} are for the files grader keeps beside "
                "a results file; choose another name (results.jsonl, say)"
            )


def encode(text: str) -> bytes:
    """JSON text -> the bytes of every file grader writes (results, log, summary).

    A lone surrogate (an engine's error text) becomes a valid \\udXXX JSON escape, which reads
    back as the same string: json.dumps(ensure_ascii=False) leaves it raw, and UTF-8 refuses it.
    """
    return text.encode("utf-8", "backslashreplace")


class ResultsWriter:
    """Writes records to ``PATH.partial`` (buffered) and renames it to ``PATH`` on :meth:`commit`.

    For derived files (rescore), cheap to write again: grading's crash-safe log is ResultsLog.
    """

    def __init__(self, path: Path):
        self.path = path
        self.partial = path.with_name(path.name + ".partial")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[bytes] | None = open(self.partial, "wb")
        except OSError as exc:
            raise OutputError.of(path, exc) from None

    def write(self, records: Iterable[Record]) -> None:
        assert self._file is not None
        try:
            if type(records) is list and len(records) == 1:  # rescore writes one at a time
                self._file.write(encode(records[0].to_json() + "\n"))
            else:
                self._file.write(encode("".join(r.to_json() + "\n" for r in records)))
        except OSError as exc:  # a full disk: the caller aborts, which removes the file
            raise OutputError.of(self.path, exc) from None

    def append_file(self, part: Path) -> None:
        """Append the bytes of ``part`` (records a worker wrote) as they are."""
        assert self._file is not None
        try:
            self._file.flush()
            with open(part, "rb") as stream:
                shutil.copyfileobj(stream, self._file, 1 << 20)
            self._file.flush()
        except OSError as exc:
            raise OutputError.of(self.path, exc) from None

    def commit(self) -> None:
        """Flush, fsync once, and put the file in place."""
        assert self._file is not None
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            os.replace(self.partial, self.path)
        except OSError as exc:
            self.abort()
            raise OutputError.of(self.path, exc) from None

    def abort(self) -> None:
        if self._file is not None:
            # a full disk: the buffer it could not flush goes with the file
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        self.partial.unlink(missing_ok=True)


# Statuses worth another try on resume: the engine failed, not the judge.
RETRY_ON_RESUME = frozenset({Status.ENGINE_ERROR})


Location = tuple[int, int]  # (source, byte offset) of one record line

_OFFSET_BITS = 62  # a Location packed in one int64: source above, offset below
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1


def owner_path(results: Path) -> Path:
    """``results.jsonl`` -> ``results.jsonl.partial.json``: which run the ``.partial`` log
    belongs to (:meth:`ResultsLog.owner`), while there is one."""
    return results.with_name(results.name + ".partial.json")


def cut_to_last_line(stream: IO[bytes]) -> None:
    """Cut a file open for update back to just after its last newline (to nothing, where it
    has none), reading only its end."""
    end = position = stream.seek(0, os.SEEK_END)
    while position > 0:
        step = min(position, 1 << 16)
        stream.seek(position - step)
        newline = stream.read(step).rfind(b"\n")
        if newline >= 0:
            position = position - step + newline + 1
            break
        position -= step
    if position != end:
        stream.truncate(position)


def _key_hash(key: str) -> int | None:
    """The first 8 bytes of a record's key (a sha256 hex digest), or None for another shape."""
    try:
        return int(key[:16], 16) if len(key) >= 16 else None
    except ValueError:
        return None


class ResultsLog:
    """Crash-safe results of a grading run, written and resumed without holding them in memory.

    Graded records are appended to ``PATH.partial`` chunk by chunk, flushed and fsynced, each
    with its ``key`` (a hash of rendered prompt, model identity, sampling and schema). A rerun
    of the same command indexes ``PATH.partial`` (an interrupted run) and ``PATH`` (a finished
    one) by key and reuses every record it would produce again; a SIGKILL mid-write leaves at
    most a torn last line, which is dropped. Both files are streamed, and the index keeps 16
    bytes a record (the key's first 8 bytes and where the record lies: two keys of 300,000
    sharing their first 8 bytes is a 1 in 10^8 chance). :meth:`write` returns where each record
    went; :meth:`assemble` writes the records to ``PATH.tmp`` in input order from those
    locations, and :meth:`commit` puts it in place and removes the log.

    A failed write (a full disk) is cut back to the last whole record and raises
    :class:`grader.errors.OutputError`: the log never holds a torn record it wrote itself.
    ``PATH.partial.json`` (:func:`owner_path`) says which run the log belongs to: written by
    :meth:`claim` before the first record, read back by :meth:`owner`.
    """

    PARTIAL, FINAL = 0, 1  # sources of a Location

    def __init__(self, path: Path, *, overwrite: bool = False,
                 distrusts: Callable[[Record], bool] | None = None):
        self.path = path
        # a kept record that says other than its own raw text (rescore's recomputation, which
        # the run passes in): never reused; the rows a lookup then misses are graded again
        # and named (regraded)
        self._distrusts = distrusts
        self._distrusted: dict[int, str] = {}
        self.regraded: dict[str, None] = {}  # ids, in the order the run met them
        self.partial = path.with_name(path.name + ".partial")
        self.owner_file = owner_path(path)
        self._claim: dict[str, Any] | None = None
        import numpy

        self._uint64 = numpy.uint64
        self._keys = numpy.empty(0, dtype=numpy.uint64)
        self._places = numpy.empty(0, dtype=numpy.int64)
        # --overwrite: the earlier log is replaced at the first write, not now: a run that
        # stops before it (bad input, a model that fails to load) loses nothing
        self._fresh = overwrite
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not overwrite:
                self._drop_torn_tail()
        except OSError as exc:
            raise OutputError.of(self.partial, exc) from None
        if not overwrite:
            self._index()
        self._file: Any = None

    def _index(self) -> None:
        """Every reusable record of ``PATH`` and ``PATH.partial``, by key (the partial's win)."""
        import numpy

        keys, places = array("Q"), array("q")
        for source, file in ((self.FINAL, self.path), (self.PARTIAL, self.partial)):
            if not file.is_file():
                continue
            with open(file, "rb") as stream:
                offset = 0
                for raw in stream:  # streamed: a large log is never read whole
                    try:
                        record = loads(raw)
                    except ValueError:  # a torn line from a killed run, or a file not ours
                        record = None
                    if (isinstance(record, dict) and isinstance(record.get("key"), str)
                            and record.get("status") not in RETRY_ON_RESUME):
                        hashed = _key_hash(record["key"])
                        if hashed is not None and self._distrusted_line(raw, hashed, record):
                            hashed = None
                        if hashed is not None:
                            keys.append(hashed)
                            places.append(source << _OFFSET_BITS | offset)
                    offset += len(raw)
        if not keys:
            return
        key_array = numpy.frombuffer(keys, dtype=numpy.uint64)
        order = numpy.argsort(key_array, kind="stable")  # a later record of a key wins
        sorted_keys = key_array[order]
        last = numpy.ones(len(sorted_keys), dtype=bool)
        last[:-1] = sorted_keys[1:] != sorted_keys[:-1]
        self._keys = sorted_keys[last]
        self._places = numpy.frombuffer(places, dtype=numpy.int64)[order][last]

    def _distrusted_line(self, raw: bytes, hashed: int, record: JSONFields) -> bool:
        """Whether the record ``raw`` is not to be reused: it does not read as a record, or
        ``distrusts`` says it disagrees with its raw text."""
        if self._distrusts is None:
            return False
        try:
            distrusted = self._distrusts(_read_line(raw, (self.path, 0)))
        except ResultsError:
            distrusted = True
        if distrusted:
            self._distrusted[hashed] = str(record.get("id"))
        else:
            self._distrusted.pop(hashed, None)  # a later record of the key is to be trusted
        return distrusted

    def _drop_torn_tail(self) -> None:
        """Cut a torn last line (a SIGKILL mid-write), reading only the file's end."""
        if self.partial.is_file():
            with open(self.partial, "rb+") as stream:
                cut_to_last_line(stream)

    @property
    def resumable(self) -> int:
        """How many earlier records a rerun could reuse (0 on a fresh run), and records it
        distrusts (a lookup must see them to name them)."""
        return len(self._keys) + len(self._distrusted)

    def lookup(self, key: str) -> Location | None:
        """Where an earlier run left the record this key produces, if it is reusable."""
        keys = self._keys
        hashed = _key_hash(key)
        if hashed is None:
            return None
        # a numpy scalar, not a Python int: with an int numpy casts the whole array per call
        index = int(keys.searchsorted(self._uint64(hashed))) if len(keys) else 0
        if index == len(keys) or int(keys[index]) != hashed:
            if hashed in self._distrusted:  # graded again: named in the summary
                self.regraded[self._distrusted[hashed]] = None
            return None
        packed = int(self._places[index])
        return packed >> _OFFSET_BITS, packed & _OFFSET_MASK

    def owner(self) -> JSONFields | None:
        """The identity of the run whose ``.partial`` this is (:meth:`claim`), or None when
        there is no partial or it does not say (a partial from grader before 0.2)."""
        if not self.partial.is_file():
            return None
        try:
            owner = json.loads(self.owner_file.read_bytes())
        except (OSError, ValueError, RecursionError):
            return None
        return owner if isinstance(owner, dict) else None

    def claim(self, identity: dict[str, Any]) -> None:
        """The log belongs to the run ``identity`` names: written beside it before its first
        record (a partial an earlier run of the same identity left keeps its file)."""
        self._claim = identity

    def _write_owner(self) -> None:
        if self._claim is None:
            if self._fresh:
                self.owner_file.unlink(missing_ok=True)
            return
        if (not self._fresh and self.partial.is_file() and self.partial.stat().st_size
                and self.owner() == self._claim):
            return
        write_json(self.owner_file, self._claim)

    def write(self, records: Iterable[Record]) -> list[Location]:
        """Append records, flushed and fsynced; returns where each one went."""
        if self._file is None:
            try:
                self._write_owner()
                self._file = open(self.partial, "wb" if self._fresh else "ab", buffering=0)
                self._fresh = False
            except OSError as exc:
                raise OutputError.of(self.partial, exc) from None
        start = self._file.seek(0, os.SEEK_END)
        locations, encoded, offset = [], [], start
        for record in records:
            line = encode(record.to_json() + "\n")
            locations.append((self.PARTIAL, offset))
            encoded.append(line)
            offset += len(line)
        data = memoryview(b"".join(encoded))
        try:
            written = 0
            while written < len(data):
                written += self._file.write(data[written:])
            os.fsync(self._file.fileno())
        except OSError as exc:
            # cut back to the last whole record: a rerun resumes from there
            with contextlib.suppress(OSError):
                os.ftruncate(self._file.fileno(), start)
            raise OutputError.of(self.partial, exc) from None
        return locations

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def assemble(self, locations: Iterable[Location]) -> Iterator[Record]:
        """Write ``PATH.tmp``, one record per location in that order, and yield each;
        :meth:`commit` then puts it in place. A failed write leaves no ``.tmp`` behind."""
        self.close()
        readers = {source: open(file, "rb") for source, file in
                   ((self.PARTIAL, self.partial), (self.FINAL, self.path)) if file.is_file()}
        final = self._tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            with open(final, "wb") as stream:
                for number, (source, offset) in enumerate(locations, start=1):
                    reader = readers[source]
                    reader.seek(offset)
                    line = reader.readline()
                    stream.write(line)
                    # named by its line in the file being put in place
                    yield _read_line(line, (self.path, number))
                stream.flush()
                os.fsync(stream.fileno())
        except BaseException as exc:
            final.unlink(missing_ok=True)
            if isinstance(exc, OSError):
                raise OutputError.of(final, exc) from None
            raise
        finally:
            for reader in readers.values():
                reader.close()

    def commit(self) -> None:
        """Put the file :meth:`assemble` wrote in place and remove the log."""
        try:
            os.replace(self._tmp, self.path)
        except OSError as exc:
            self._tmp.unlink(missing_ok=True)
            raise OutputError.of(self.path, exc) from None
        self.partial.unlink(missing_ok=True)
        self.owner_file.unlink(missing_ok=True)

    def abandon(self) -> None:
        """Remove what :meth:`assemble` wrote; the log stays for a rerun."""
        self._tmp.unlink(missing_ok=True)


def read_records(path: str | Path, *, start: int = 0,
                 end: int | None = None) -> Iterator[tuple[int, Record]]:
    """``(line, record)`` for each record of a results JSONL file, each checked by
    :func:`grader.records.parse_record` (the one way records enter from files; msgspec
    decodes most lines straight into their class, :func:`grader.records.decode_record`).

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
            yield number, _read_line(raw, (path, number), bom=number == 1 and not start)


def _read_line(line: bytes, where: tuple[str | Path, int], *, bom: bool = False) -> Record:
    """The record of one results line: msgspec's (:func:`grader.records.decode_record`), else
    ``json``'s object through :func:`grader.records.parse_record` (or ``PATH:LINE: reason``)."""
    record = decode_record(line)
    if record is not None:
        return record
    try:
        obj = loads(line, bom=bom)
    except ValueError as exc:  # bad syntax or bytes, a 5000-digit number, deep nesting
        raise ResultsError.at(*where, str(exc)) from None
    return parse_record(obj, where)


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
    return list(itertools.pairwise(bounds))


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


def write_atomic(path: Path, data: bytes) -> None:
    """``data`` written to ``path`` whole or not at all: a full disk, a read-only directory or
    a parent that is a file raise :class:`OutputError` and leave the file as it was, with no
    ``.partial`` beside it."""
    staged = _staged(path, data)
    try:
        os.replace(staged, path)
    except OSError as exc:
        _discard(staged)
        raise OutputError.of(path, exc) from None


def _staged(path: Path, data: bytes) -> Path:
    """``data`` written and fsynced beside ``path`` (``PATH.partial``), not yet in place; an
    OSError leaves nothing behind and raises :class:`OutputError`."""
    partial = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(partial, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
    except OSError as exc:
        _discard(partial)
        raise OutputError.of(path, exc) from None
    return partial


def _discard(path: Path) -> None:
    """``path`` removed where it can be (on the way out of a failed write)."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def commit_with_summary(writer: ResultsWriter, summary_file: Path, summary: JSONObject) -> None:
    """Put ``writer``'s results and their summary in place together: both are written and
    fsynced first, then renamed (a rename needs no space), so a full disk changes neither."""
    staged = _staged(summary_file, _json_bytes(summary.to_dict()))
    try:
        writer.commit()
        os.replace(staged, summary_file)
    except OSError as exc:
        staged.unlink(missing_ok=True)
        raise OutputError.of(summary_file, exc) from None
    except BaseException:
        staged.unlink(missing_ok=True)
        raise


def _json_bytes(value: Any) -> bytes:
    """The bytes of a JSON file grader writes (a summary, an owner file, an audit): indented."""
    return encode(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def write_json(path: Path, value: Any) -> None:
    """``value`` as indented JSON, by :func:`write_atomic`."""
    write_atomic(path, _json_bytes(value))


def write_summary(path: Path, summary: JSONObject) -> None:
    """A summary (:class:`grader.analysis.summary.Summary`) written as its JSON object."""
    write_json(path, summary.to_dict())


class SummaryError(GraderError, ValueError):
    """A summary file that exists but cannot be read as one."""


def read_summary(results: str | Path) -> JSONFields | None:
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
    except RecursionError:
        raise SummaryError(f"{path}: nested too deeply to be a grader summary") from None
    if not isinstance(summary, dict) or not isinstance(summary.get("run", {}), dict):
        raise SummaryError(f"{path}: not a grader summary (a JSON object with a 'run' object)")
    return summary


def read_manifest(results: str | Path) -> RunManifest | None:
    """The run manifest of the summary beside a results file (its ``run``), typed; None where
    there is no summary or it holds no ``run`` (another tool's). A key the manifest does not
    declare (a later stage's entry) is kept among its ``entries``.

    Raises :class:`SummaryError` when the summary cannot be read, or its ``run`` holds a field
    of another type than the manifest's."""
    summary = read_summary(results)
    run = summary.get("run") if summary else None
    if not run:
        return None
    declared = RunManifest.__struct_fields__
    fields = {name: value for name, value in run.items() if name in declared and name != "entries"}
    entries = {name: value for name, value in run.items() if name not in fields}
    try:
        return msgspec.convert(fields | {"entries": entries}, RunManifest)
    except msgspec.ValidationError as exc:
        raise SummaryError(f"{summary_path(Path(results))}: run: {exc}") from None


def recorded_data(results: Path) -> str | None:
    """The dataset the run that wrote ``results`` graded (its summary's ``run.data``), where
    that file is still there (as written, else beside the results); None otherwise."""
    try:
        run = read_manifest(results)
    except SummaryError:
        return None
    data = run.data if run is not None else None
    if not isinstance(data, str) or data == "-":
        return None
    for candidate in (Path(data), results.parent / data):
        if candidate.is_file():
            return str(candidate)
    return None
