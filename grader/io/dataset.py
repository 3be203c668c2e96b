"""Read JSONL / CSV / Parquet (and the files of grader.io.foreign), map columns, validate rows
-> items.

Every problem with the file is a :class:`DatasetError` whose text is ``PATH:LINE: reason``
(for Parquet, LINE is the 1-based row number), raised before any model work starts.
"""

from __future__ import annotations

import base64
import csv
import datetime
import decimal
import hashlib
import itertools
import json
import math
import re
import shutil
import sys
import tempfile
from array import array
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader.errors import GraderError
from grader.io import foreign
from grader.io.foreign import Row, Rows
from grader.io.jsonlines import JSONError, fast_loads, loads
from grader.io.manifest import sha256_json

# The seed's fields; the first is optional (rendered empty when absent), the others are the
# content the seed needs: a row without them is ``missing_context``.
SEED_FIELDS = ("input", "reference", "output_text")
REQUIRED_FIELDS = ("reference", "output_text")
FORMATS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".parquet": "parquet"}


class DatasetError(GraderError, foreign.ForeignFileError):
    """Bad input: the message is one line naming the file and line (``PATH:LINE: reason``)."""


@dataclass
class Item:
    """One dataset row, as the prompt template sees it (``fields``) plus where it came from."""

    id: Any
    index: int  # 0-based position in the file: results keep this order
    line: int  # the line (JSONL, CSV) or row number (Parquet) for messages
    fields: Row
    invalid: str | None = None  # why the row's text cannot be sent to a model, if it cannot


class MappingError(GraderError, ValueError):
    """A ``--map`` pair that is not ``FIELD=COLUMN``."""


def parse_mapping(pairs: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``["output_text=response"]`` -> ``{"output_text": "response"}`` (template field -> column)."""
    mapping: dict[str, str] = {}
    for pair in pairs:
        name, sep, column = pair.partition("=")
        if not sep or not name.strip() or not column.strip():
            raise MappingError(f"--map expects FIELD=COLUMN, got {pair!r}")
        mapping[name.strip()] = column.strip()
    return mapping


def detect_format(path: str, source: str | None = None) -> str:
    """The file's format: ``source`` (``--from``) when given, else the tool that wrote it
    (grader.io.foreign), else its extension (read by :class:`Dataset`: lm-eval's ``.jsonl``)."""
    if source is not None:
        if source not in foreign.SOURCES:
            known = ", ".join(foreign.SOURCES)
            raise DatasetError(path, None, f"unknown --from {source!r}: one of {known}")
        if path == "-" and source not in ("jsonl", "lm-eval"):
            raise DatasetError(path, None, f"--from {source} reads a file or folder, not stdin")
        return source
    found = foreign.detect(path)
    if found is not None:
        return found
    if path == "-":
        return "jsonl"
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise DatasetError(path, None, f"unknown format {suffix!r}: use .jsonl, .csv, .parquet, "
                                       "an inspect_ai log (.eval, .json), a save_to_disk folder, "
                                       "or --from")
    return FORMATS[suffix]


def _decode(path: str, line: int, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(path, line, f"not valid UTF-8 (byte {exc.start})") from None


def _unreadable(path: str, exc: OSError) -> DatasetError:
    return DatasetError(path, None, f"cannot read the file: {exc.strerror or exc}")


def _jsonl_rows(path: str) -> Rows:
    try:
        stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    except OSError as exc:
        raise _unreadable(path, exc) from None
    try:
        for number, raw in enumerate(stream, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a BOM from an editor on Windows
            row = fast_loads(raw)  # msgspec; where it declines, json below decides
            if type(row) is dict:
                yield number, row
                continue
            text = _decode(path, number, raw).strip()
            if not text:
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise DatasetError(path, number, f"invalid JSON: {exc.msg} (column {exc.colno})") from None
            except (ValueError, RecursionError):  # a 5000-digit number, "[[[[..."
                try:
                    loads(text)
                except JSONError as exc:  # the one decoder words it
                    raise DatasetError(path, number, str(exc)) from None
                raise
            if not isinstance(row, dict):
                raise DatasetError(path, number, f"expected a JSON object, got {type(row).__name__}")
            yield number, row
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


def _json_row(name: str, number: int, row: Any) -> Row:
    """A row given in memory as a JSONL file would hold it: its values as JSON reads them."""
    if not isinstance(row, dict):
        raise DatasetError(name, number, f"expected a dict, got {type(row).__name__}")
    try:
        decoded: Row = json.loads(json.dumps(row, ensure_ascii=False, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise DatasetError(name, number, f"not JSON: {exc}") from None
    return decoded


def _decoded_lines(path: str, stream: Any) -> Iterator[str]:
    """The file's lines as text, decoded one by one so a bad byte names its own line."""
    for number, raw in enumerate(stream, start=1):
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DatasetError(path, number, f"not valid UTF-8 (byte {exc.start} of the line)") from None


def _csv_rows(path: str) -> Rows:
    try:
        stream = open(path, "rb")
    except OSError as exc:
        raise _unreadable(path, exc) from None
    with stream:
        yield from _csv_records(path, _decoded_lines(path, stream))


def _csv_records(path: str, lines: Iterator[str]) -> Rows:
    first = next(lines, None)
    if first is None:
        raise DatasetError(path, 1, "empty CSV file: no header row")
    lines = itertools.chain([first.removeprefix("\ufeff")], lines)
    # A model's answer or a long document can pass csv's default 128 KiB field limit.
    csv.field_size_limit(max(csv.field_size_limit(), 2**31 - 1))
    # strict: an unclosed quote raises instead of swallowing the rest of the file as one field
    reader = csv.reader(lines, strict=True)
    try:
        header = next(reader)
    except StopIteration:
        raise DatasetError(path, 1, "empty CSV file: no header row") from None
    except csv.Error as exc:
        raise DatasetError(path, reader.line_num, f"invalid CSV: {exc}") from None
    if len(set(header)) != len(header):
        raise DatasetError(path, 1, "duplicate column names in the header")
    while True:
        start = reader.line_num + 1
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if "unexpected end of data" in str(exc):
                raise DatasetError(path, start, "invalid CSV: a quoted field in this row is "
                                                "never closed") from None
            raise DatasetError(path, reader.line_num, f"invalid CSV: {exc}") from None
        if not values:
            continue
        if len(values) != len(header):
            raise DatasetError(path, start,
                               f"row has {len(values)} fields, the header has {len(header)}")
        yield start, dict(zip(header, values, strict=True))


def _parquet_rows(path: str) -> Rows:
    import pyarrow.parquet as pq  # only for Parquet input

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...
        raise DatasetError(path, None, f"not a readable Parquet file: {exc}") from None
    number = 0
    batches = parquet.iter_batches(batch_size=4096)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as exc:  # a corrupt page shows only when it is read
            raise DatasetError(path, number + 1, f"cannot read Parquet data: {exc}") from None
        for row in batch.to_pylist():
            number += 1
            yield number, {name: _plain(value) for name, value in row.items()}


def _plain_rows(reader: Any) -> Any:
    """``reader`` with every row's values made JSON's kinds (:func:`_plain`)."""

    def rows(path: str) -> Rows:
        for number, row in reader(path):
            yield number, {name: _plain(value) for name, value in row.items()}

    return rows


def _plain(value: Any) -> Any:
    """A Parquet value as JSON's kinds of value, so it renders and hashes like a JSONL row's.

    Arrow hands back dates, times and timestamps (ISO 8601 strings), durations (their
    ``str``), decimals (their exact digits as a string), binary (its text when it is UTF-8,
    else ``base64:`` and its Base64), maps (lists of ``[key, value]``), at any depth in lists
    and structs. docs/formats.md, "Input".
    """
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(data).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    return str(value)  # a duration, or a type a later pyarrow adds


_UNSENDABLE = re.compile("[\x00\ud800-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _described(char: str) -> str:
    return "a NUL byte" if char == "\x00" else f"a lone surrogate (U+{ord(char):04X})"


def _has_surrogate(text: str) -> bool:
    # UTF-8 encodes every code point but a lone surrogate: a C loop, where a regular
    # expression costs about 10 µs over a row's 600 characters (the copy lasts a moment)
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def unsendable(text: str) -> str | None:
    """What in text to be sent (a rendered prompt, a chat template's output) no tokenizer or
    engine can take: "a NUL byte" or "a lone surrogate (U+XXXX)", in that order; or None. The
    judge's renderer and the backends' chat templates put it to their text in the same words."""
    if "\x00" in text:
        return _described("\x00")
    surrogate = _SURROGATE.search(text) if _has_surrogate(text) else None
    return _described(surrogate.group()) if surrogate else None


def reference_key(input_text: Any, reference: Any) -> str:
    """A hash of a row's (input, reference) pair: the key of what rows that share them share
    (a judge's prepared value, the controls' sample)."""
    return sha256_json(["" if input_text is None else str(input_text), str(reference)])[:16]


def unsendable_at(text: str) -> tuple[str, int] | None:
    """The first character of ``text`` no tokenizer can take, in :func:`unsendable`'s words,
    and its position; or None. A NUL byte is binary data, not an answer; a lone surrogate
    (JSON "\\ud800") is not Unicode text at all and makes tokenizers raise."""
    if "\x00" not in text and not _has_surrogate(text):
        return None
    match = _UNSENDABLE.search(text)
    return None if match is None else (_described(match.group()), match.start())


def _unsendable(name: str, text: str) -> str | None:
    """Why field ``name``'s ``text`` cannot go to a tokenizer (the row is ``invalid_input``),
    or None."""
    found = unsendable_at(text)
    return None if found is None else f"{name} contains {found[0]} at character {found[1]}"


def _searchable(value: Any) -> str:
    """A field's text, nested strings included, for :func:`_unsendable`."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (TypeError, ValueError):  # keys JSON cannot hold (a Parquet map's tuples)
            return ""
    return ""


def cell_text(value: Any) -> str | None:
    """A dataset value as prompt text; None when it is empty. Line ends become \\n."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        return value.replace("\r\n", "\n") if value and not value.isspace() else None
    if isinstance(value, bool):  # as the judge reads JSON, not Python's True
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


class Dataset:
    """A dataset file, read as a stream of validated :class:`Item` (never held whole).

    Opening it reads the first row (the format, the columns, the id column), and the first
    iteration goes on from that open file: two full reads open the file twice. Where a file's
    columns are the union over its rows (JSONL), a column the first row lacks is looked for as
    the rows go by. :meth:`check_unique_ids` after a full iteration finds duplicate ids with 8
    bytes a row. ``-`` (JSONL on stdin) is spooled to a temporary file, which :meth:`close`
    (or leaving a ``with`` block) removes.
    """

    def __init__(self, path: str, *, mapping: Mapping[str, str] | None = None,
                 id_column: str | None = None, limit: int | None = None, source: str | None = None):
        self.name = path
        self.mapping = dict(mapping or {})
        self._id_column = id_column
        self.limit = limit
        self.format = detect_format(path, source)  # source: --from, else detected
        self._spool = _spool_stdin() if path == "-" else None
        self.path = self._spool or path
        self._sniff = source is None and path != "-" and self.format == "jsonl"
        self._reader = self._reader_of(self.format)
        self._open()

    @staticmethod
    def _reader_of(source: str) -> Callable[[str], Rows]:
        readers = {"jsonl": _jsonl_rows, "csv": _csv_rows, "parquet": _parquet_rows}
        if source in readers:
            return readers[source]
        reader = foreign.reader(source, _jsonl_rows)  # a file another tool wrote
        if source == "hf-disk":  # Arrow values, as Parquet's: dates, bytes, decimals
            reader = _plain_rows(reader)
        return reader

    def _open(self) -> None:
        self._unread: tuple[tuple[int, Row], Generator[tuple[int, Row]]] | None = None
        self._id_hashes: array[int] = array("q")
        try:
            self._check_columns()
        except BaseException:
            self.close()
            raise

    @classmethod
    def of_rows(cls, rows: Iterable[Any], *, name: str = "rows",
                mapping: Mapping[str, str] | None = None, id_column: str | None = None) -> Dataset:
        """Rows held in memory (the Python API's), read as a JSONL file of them would be: each
        a dict of JSON values (else a :class:`DatasetError` naming ``name`` and the row's
        number); nothing is written."""
        checked = [(number, _json_row(name, number, row)) for number, row in enumerate(rows, start=1)]
        dataset = cls.__new__(cls)
        dataset.name = dataset.path = name
        dataset.mapping, dataset._id_column = dict(mapping or {}), id_column
        dataset.limit, dataset.format, dataset._spool, dataset._sniff = None, "jsonl", None, False
        dataset._reader = lambda _path: iter(checked)
        dataset._open()
        return dataset

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close an unread first read; remove the copy of stdin: a run leaves no input behind."""
        if self._unread is not None:
            self._unread[1].close()
            self._unread = None
        if self._spool is not None:
            Path(self._spool).unlink(missing_ok=True)
            self._spool = None

    def _first_read(self) -> Generator[tuple[int, Row]]:
        """A first read: a ``.jsonl`` file's first row says whether it holds lm-eval samples."""
        if not self._sniff:
            return self._read(self._reader(self.path))
        lines = _jsonl_rows(self.path)
        first = next(lines, None)
        if first is not None and foreign.is_lm_eval(first[1]):
            self.format, self._reader = "lm-eval", self._reader_of("lm-eval")
            return self._read(foreign.lm_eval_rows(self.path, itertools.chain([first], lines)))
        return self._read(itertools.chain([] if first is None else [first], lines))

    def _check_columns(self) -> None:
        rows = self._first_read()
        first = next(rows, None)
        if first is None:
            raise DatasetError(self.name, None, "no rows")
        self._unread = first, rows
        self._first_line, row = first
        self.columns = frozenset(row)
        # rows need not share keys where the first has no header or schema: a column is in the
        # file when any row has it, and a row without it is treated like an empty cell
        self._every_column = self.format in foreign.SCHEMA_SOURCES
        self._unseen: dict[str, DatasetError] = {}
        for name, column in self.mapping.items():
            self._require(column, DatasetError(self.name, self._first_line,
                                               f"--map {name}={column}: no column {column!r}"))
        self.id_key = self._id_column or ("id" if "id" in row else None)
        # an "id" a later row has makes it the id column, which the first row leaves empty
        self._id_later = self.id_key is None and not self._every_column

    def require_field(self, name: str, reason: str) -> None:
        """Refuse the file (a :class:`DatasetError` of ``reason``) if it has no column for the
        template field ``name`` (:meth:`_require`)."""
        self._require(self.mapping.get(name, name), DatasetError(self.name, None, reason))

    def _require(self, column: str, error: DatasetError) -> None:
        """Raise ``error`` if the file has no column ``column``: now, where the first row
        shows it; else at the end of the first full iteration that met no row with it."""
        if column in self.columns:
            return
        if self._every_column:
            raise error
        self._unseen.setdefault(column, error)

    def _read(self, rows: Rows) -> Generator[tuple[int, Row]]:
        if self.limit is not None:
            rows = itertools.islice(rows, self.limit)
        try:
            yield from rows
        except foreign.ForeignFileError as exc:  # or a DatasetError
            if exc.path == self.name and isinstance(exc, DatasetError):
                raise
            raise DatasetError(self.name, exc.line, exc.reason) from None  # "-", not the spool

    def _rows(self) -> Rows:
        """The rows: the first read's, once, then a new read each time."""
        unread, self._unread = self._unread, None
        if unread is None:
            return self._read(self._reader(self.path))
        first, rows = unread
        return itertools.chain([first], rows)

    def __iter__(self) -> Iterator[Item]:
        self._id_hashes = array("q")
        unseen, id_later = self._unseen, self._id_later
        for position, (line, row) in enumerate(self._rows()):
            if unseen:
                for column in [column for column in unseen if column in row]:
                    del unseen[column]
            if id_later and "id" in row:
                raise DatasetError(self.name, self._first_line, "no value in id column 'id'")
            item = self._item(position, line, row)
            self._id_hashes.append(_id_hash(item.id))
            yield item
        if unseen:
            raise next(iter(unseen.values()))

    def _item(self, position: int, line: int, row: Row) -> Item:
        mapping = self.mapping
        fields = dict(row)
        for name, column in mapping.items():
            if name not in SEED_FIELDS and column in row:
                fields[name] = row[column]  # a custom prompt's own fields
        for name in SEED_FIELDS:
            value = cell_text(row.get(mapping.get(name, name)))
            fields[name] = value if value is not None else ""
        # Every field, not only the seed's: a custom prompt may render any column, and one lone
        # surrogate anywhere in a prompt makes the tokenizer (and the resume key's hash) raise.
        names = [*SEED_FIELDS, *(name for name in fields if name not in SEED_FIELDS)]
        invalid = next(filter(None, (_unsendable(name, _searchable(fields[name]))
                                     for name in names)), None)
        item_id = position if self.id_key is None else self._item_id(line, row, self.id_key)
        return Item(id=item_id, index=position, line=line, fields=fields, invalid=invalid)

    def _item_id(self, line: int, row: Row, id_key: str) -> str | int:
        """The row's id from its id column, checked (the row number is the id without one)."""
        if id_key not in row or cell_text(row[id_key]) is None:
            raise DatasetError(self.name, line, f"no value in id column {id_key!r}")
        item_id = row[id_key]
        if isinstance(item_id, float) and item_id.is_integer():
            item_id = int(item_id)
        # bool is an int to Python: true would collide with the id 1
        if isinstance(item_id, bool) or not isinstance(item_id, (str, int)):
            raise DatasetError(self.name, line, f"id must be a string or an integer, got {item_id!r}")
        if isinstance(item_id, str) and _UNSENDABLE.search(item_id):
            raise DatasetError(self.name, line, f"id {item_id!r} holds a NUL byte or a lone surrogate")
        return item_id

    @property
    def id_hashes(self) -> array[int]:
        """The ids' 8-byte hashes, in row order, of the last full iteration."""
        return self._id_hashes

    def check_unique_ids(self) -> None:
        """After a full iteration: a :class:`DatasetError` naming the first duplicate id."""
        import numpy

        # sorted in place as 8-byte ints: a list of Python ints would be ~5x the array's size
        hashes = numpy.frombuffer(self._id_hashes, dtype=numpy.int64).copy()
        hashes.sort()
        clashing = set(hashes[1:][hashes[1:] == hashes[:-1]].tolist())
        if not clashing:
            return
        seen: dict[Any, int] = {}
        for item in self:  # a second look, only now, to name the lines
            if _id_hash(item.id) in clashing:
                if item.id in seen:
                    raise DatasetError(self.name, item.line, f"duplicate id {item.id!r} "
                                                             f"(first on line {seen[item.id]})")
                seen[item.id] = item.line


def _id_hash(item_id: Any) -> int:
    digest = hashlib.blake2b(repr(item_id).encode("utf-8", "surrogatepass"), digest_size=8)
    return int.from_bytes(digest.digest(), "little", signed=True)


def _spool_stdin() -> str:
    """A copy of stdin in a temporary file; the caller removes it (:meth:`Dataset.close`)."""
    stdin = getattr(sys.stdin, "buffer", None)  # sys.stdin is None when the shell closed it
    if stdin is None:
        raise DatasetError("-", None, "stdin is closed: pipe the data in (grader grade - < FILE) "
                                      "or pass the file's path")
    spool = tempfile.NamedTemporaryFile(prefix="grader-stdin-", suffix=".jsonl", delete=False)
    try:
        with spool:
            shutil.copyfileobj(stdin, spool)
    except BaseException as exc:  # a full disk, a Ctrl-C: no half copy left behind
        Path(spool.name).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise DatasetError("-", None, f"cannot copy stdin to {spool.name}: {exc.strerror or exc}") from None
        raise
    return spool.name


def read_items(path: str, *, mapping: Mapping[str, str] | None = None,
               id_column: str | None = None, source: str | None = None) -> list[Item]:
    """Read and validate a whole dataset into memory (for small files; grading streams).

    Args:
        path: a ``.jsonl``, ``.csv`` or ``.parquet`` file, ``-`` for JSONL on stdin, or a file
            another tool wrote (grader.io.foreign).
        mapping: template field -> column, e.g. ``{"output_text": "response"}``.
        id_column: the column holding row ids; default ``id`` when the file has it, else the
            0-based row number.
        source: ``--from``: the format, instead of detecting it.
    """
    with Dataset(path, mapping=mapping, id_column=id_column, source=source) as dataset:
        items = list(dataset)
        dataset.check_unique_ids()
    return items
