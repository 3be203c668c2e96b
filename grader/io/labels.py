"""The labels file: human scores of graded rows, one event a line, safe to the last label given.

Written by ``grader label`` and read by every command that takes human labels (``agree``,
``compare``, ``rank``, ``report``) through :func:`read_labels`, the one reader. JSONL; line 1 is
the header, then one line per label event, appended, flushed and fsynced as it is given (a
later line for the same id replaces an earlier one)::

    {"grader_labels": 1, "results": "run.jsonl", "results_key": "<sha256>", "seed": 0,
     "sample": 100, "order": ["q03", "q01", ...]}
    {"id": "q03", "digest": "<sha256>", "human": 4, "skipped": false, "note": null,
     "position": 0, "at": "2026-11-28T02:00:00Z"}

``results_key`` (:func:`results_key`) identifies the rows of the run labeled (their ids, in no
order), so a labels file is never read against another run's rows; ``digest``
(:func:`answer_digest`) names the answer a label judges, so a label is never applied to an
answer that changed since (it is *stale*: counted and named, not used). ``order`` is the seeded
random order the rows were offered in: labels given along it are a random sample of the rows
wherever the person stopped (docs/formats.md, "Labels").
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, TypeVar

import msgspec

from grader.errors import GraderError, OutputError

if TYPE_CHECKING:
    from grader.records import Record

FORMAT_VERSION = 1
HEADER_KEY = "grader_labels"
LOWEST, HIGHEST = 0, 5  # a human score is an int in this range, as the judge's


class LabelFileError(GraderError, ValueError):
    """A labels file that cannot be read as one, or that belongs to other rows: one line,
    ``FILE:LINE: reason`` where a line is at fault (bad input, exit 2)."""


def label_id(value: object) -> str:
    """A row's id as a labels file writes it: a string (a results file's ids are strings or
    integers; an integer 7 is labeled as "7")."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def answer_digest(input: str, reference: str, answer: str) -> str:
    """The sha256 hex digest naming one answer to one question: input, NUL, reference, NUL,
    answer (UTF-8; NUL never occurs in text a person reads, so no two triples share bytes)."""
    joined = "\0".join((input, reference, answer))
    return hashlib.sha256(joined.encode("utf-8", "surrogatepass")).hexdigest()


def results_key(ids: Iterable[str]) -> str:
    """The digest identifying a run's rows: the sha256 of their ids, sorted, as one JSON list.

    Only the ids: an answer regraded since keeps its row's key, and its old label turns stale
    (named by its digest) rather than making the whole file another run's.
    """
    listed = json.dumps(sorted(ids), ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(listed.encode("utf-8", "surrogatepass")).hexdigest()


class Header(msgspec.Struct, frozen=True, kw_only=True):
    """Line 1 of a labels file."""

    results: str
    results_key: str
    seed: int
    sample: Annotated[int, msgspec.Meta(gt=0)] | None = None
    order: tuple[str, ...]

    def to_json(self) -> str:
        return json.dumps({HEADER_KEY: FORMAT_VERSION, **msgspec.structs.asdict(self)},
                          ensure_ascii=False)


class LabelEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One label line: a score 0-5, or a skip (``human`` None, ``skipped`` true), of the answer
    named by ``digest``, given at ``position`` of the header's order."""

    id: str
    digest: str
    human: int | None = None
    skipped: bool
    note: str | None = None
    position: int
    at: str

    def to_json(self) -> str:
        return json.dumps(msgspec.structs.asdict(self), ensure_ascii=False)


@dataclass(frozen=True)
class Labels:
    """What a labels file says about the rows of one run (:func:`read_labels`).

    Attributes:
        path: the file read.
        results: the results file it was made for, as given to ``grader label``.
        results_key: the digest of that run's row ids (:func:`results_key`).
        seed: the seed of the random order the rows were offered in.
        sample: ``--sample N``, or None: every row was in the order.
        order: the ids in the order offered.
        scores: id -> the human score, for the latest event of each id where it is a score and
            its digest matches the row's answer today.
        stale: ids whose latest label judged another answer than the row holds now: not used.
        unknown: ids labeled that are not among the rows given: not used.
        skipped: ids whose latest event is a skip.
        notes: id -> the latest event's note, where it has one.
        random: True where the rows labeled (scored, skipped or stale) are the first ones of
            the recorded seeded order and every score is of a row in it: the scores are a
            random sample of the rows (of the scored rows, if skips were not at random).
    """

    path: Path
    results: str
    results_key: str
    seed: int
    sample: int | None
    order: tuple[str, ...]
    scores: dict[str, int]
    stale: tuple[str, ...]
    unknown: tuple[str, ...]
    skipped: tuple[str, ...]
    notes: dict[str, str]
    random: bool


def is_label_file(path: str | Path) -> bool:
    """Whether ``path`` is a file whose first line is a labels header (any version)."""
    try:
        with open(path, "rb") as stream:
            first = stream.readline(1 << 26)
    except OSError:
        return False
    try:
        header = json.loads(first)
    except ValueError:
        return False
    return isinstance(header, dict) and HEADER_KEY in header


def read_events(path: str | Path) -> tuple[Header, list[LabelEvent]]:
    """The header and every event of a labels file, in file order. A last line without its
    newline that does not parse is a label being written when the writer died: left out."""
    with _open(path) as stream:
        header = _header(path, stream.readline())
        events = []
        for number, raw in enumerate(stream, start=2):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                if not raw.endswith(b"\n"):
                    break  # a torn last line: the label being typed when the writer died
                raise LabelFileError(f"{path}:{number}: not JSON ({exc})") from None
            events.append(_event(obj, f"{path}:{number}", len(header.order)))
    return header, events


def read_labels(path: str | Path, texts: Mapping[str, tuple[str, str, str]], *,
                results_key: str | None = None) -> Labels:
    """The labels of ``path`` against the graded rows ``texts`` (id -> (input, reference,
    answer); ids as strings), the latest event of each id winning.

    Args:
        results_key: where given, the file must have been made for rows with this key
            (:func:`results_key` of the results' ids), else :class:`LabelFileError`.

    Raises :class:`LabelFileError` (``FILE:LINE: reason``) for a line that is not a label.
    """
    header, events = read_events(path)
    if results_key is not None and header.results_key != results_key:
        raise LabelFileError(
            f"{path}: labels for other rows (made for {header.results}, whose rows differ from "
            "these): label these results into another file")
    latest = {event.id: event for event in events}
    scores: dict[str, int] = {}
    stale, unknown, skipped = [], [], []
    for name, event in latest.items():
        if name not in texts:
            unknown.append(name)
        elif event.digest != answer_digest(*texts[name]):
            stale.append(name)
        elif event.skipped:
            skipped.append(name)
        elif event.human is not None:
            scores[name] = event.human
    done = set(scores) | set(stale) | set(skipped)
    random = set(header.order[:len(done)]) == done
    notes = {name: event.note for name, event in latest.items() if event.note}
    return Labels(path=Path(path), results=header.results, results_key=header.results_key,
                  seed=header.seed, sample=header.sample, order=header.order, scores=scores,
                  stale=tuple(stale), unknown=tuple(unknown), skipped=tuple(skipped),
                  notes=notes, random=random)


class TextsNotFound(GraderError, ValueError):
    """The question, reference or answer of a graded row is nowhere to be read (bad input)."""


def graded_texts(results: str | Path, records: Mapping[str, Record] | None = None, *,
                 data: str | None = None, mapping: Mapping[str, str] | None = None,
                 id_column: str | None = None) -> dict[str, tuple[str, str, str]]:
    """Each graded row's ``(input, reference, answer)`` by id (:func:`label_id`): the texts a
    label's digest is made of, as :func:`read_labels` wants them.

    From ``data`` (read with ``mapping`` and ``id_column``, as grade read it), else the
    dataset the run recorded in its summary where it is still there, else the records' own
    ``input``, ``reference`` and ``output_text``. A missing text is ``""`` (a row not sent).

    Args:
        records: the records of ``results`` by id, where the caller has read them already.

    Raises :class:`TextsNotFound` naming the first row whose texts are found nowhere, and
    :class:`grader.io.dataset.DatasetError` for a ``data`` file that does not read.
    """
    from grader.io.results import read_records, recorded_data

    if records is None:
        records = {label_id(record.id): record for _, record in read_records(results)}
    path = data if data is not None else recorded_data(Path(results))
    found = _dataset_texts(path, data is not None, mapping, id_column) if path is not None else {}
    texts = {}
    for name, record in records.items():
        row = found.get(name)
        if row is None and all(record.has(f) for f in _TEXT_FIELDS):
            row = tuple(record.field(f) for f in _TEXT_FIELDS)
        if row is None:
            where = (f"--data {data}" if data is not None else
                     f"the dataset its run recorded ({path})" if path is not None else
                     "its records (and no dataset is recorded in its summary)")
            raise TextsNotFound(f"{results}: row {name!r} has no question, reference and "
                                f"answer in {where}: give the graded data with --data (and "
                                "--map, --id-column as for grade)")
        first, second, third = ("" if value is None else str(value) for value in row)
        texts[name] = (first, second, third)
    return texts


_TEXT_FIELDS = ("input", "reference", "output_text")


def _dataset_texts(path: str, given: bool, mapping: Mapping[str, str] | None,
                   id_column: str | None) -> dict[str, tuple[Any, ...]]:
    """The texts of the dataset at ``path`` by id; a recorded one (not ``given``) that no
    longer reads gives none: the records may hold the texts."""
    from grader.io.dataset import DatasetError, read_items

    try:
        items = read_items(path, mapping=mapping, id_column=id_column)
    except DatasetError:
        if given:
            raise
        return {}
    return {label_id(item.id): tuple(item.fields.get(f) for f in _TEXT_FIELDS) for item in items}


def labels_of_run(path: str | Path, results: str | Path, *, data: str | None = None,
                  mapping: Mapping[str, str] | None = None,
                  id_column: str | None = None) -> Labels:
    """The labels of ``path`` for the run that wrote ``results``: :func:`graded_texts` then
    :func:`read_labels` with the run's :func:`results_key` (labels of other rows refused)."""
    texts = graded_texts(results, data=data, mapping=mapping, id_column=id_column)
    return read_labels(path, texts, results_key=results_key(texts))


class LabelLog:
    """The writer of a labels file: every event appended, flushed and fsynced before
    :meth:`append` returns, so a kill -9 loses at most the label not yet given. Opened on an
    existing file it cuts a torn last line (the writer died mid-line) and appends after it.

    The caller holds the file's lock (:class:`grader.io.lock.OutputLock`): one writer a file.
    """

    def __init__(self, path: Path, header: Header, *, fresh: bool):
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if fresh:
                _write_new(path, header.to_json() + "\n")
            else:
                _cut_torn_tail(path)
            self._stream: IO[bytes] = open(path, "ab")
        except OSError as exc:
            raise OutputError.of(path, exc) from None

    def append(self, event: LabelEvent) -> None:
        line = (event.to_json() + "\n").encode("utf-8", "surrogatepass")
        try:
            self._stream.write(line)
            self._stream.flush()
            os.fsync(self._stream.fileno())
        except OSError as exc:
            raise OutputError.of(self.path, exc) from None

    def close(self) -> None:
        self._stream.close()


def _open(path: str | Path) -> IO[bytes]:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise LabelFileError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def _header(path: str | Path, first: bytes) -> Header:
    try:
        obj = json.loads(first)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or HEADER_KEY not in obj:
        raise LabelFileError(f"{path}:1: not a grader labels file (its first line is not a "
                             f'{{"{HEADER_KEY}": {FORMAT_VERSION}, ...}} header)')
    if obj[HEADER_KEY] != FORMAT_VERSION:
        raise LabelFileError(f"{path}:1: labels file version {obj[HEADER_KEY]!r}; this grader "
                             f"reads version {FORMAT_VERSION}")
    header = _typed(Header, obj, f"{path}:1: the header's")
    if len(set(header.order)) != len(header.order):
        raise LabelFileError(f"{path}:1: the header's order is missing or of the wrong type")
    return header


def _event(obj: Any, where: str, positions: int) -> LabelEvent:
    if not isinstance(obj, dict):
        raise LabelFileError(f"{where}: not a label (a JSON object)")
    human = obj.get("human")
    if human is not None and not (type(human) is int and LOWEST <= human <= HIGHEST):
        raise LabelFileError(f"{where}: human {human!r} is not a score {LOWEST}-{HIGHEST} or null")
    event = _typed(LabelEvent, obj, f"{where}:")
    if not 0 <= event.position < max(positions, 1):
        raise LabelFileError(f"{where}: position is missing or of the wrong type")
    if event.skipped == (human is not None):
        raise LabelFileError(f"{where}: a label has a human score, or is skipped, not both or "
                             "neither")
    return event


_T = TypeVar("_T", Header, LabelEvent)
# the field msgspec names: "... - at `$.seed`", "Object missing required field `seed`"
_FIELD = re.compile(r"`\$\.(\w+)|field `(\w+)`")


def _typed(cls: type[_T], obj: object, where: str) -> _T:
    """``obj`` as a ``cls``, its types checked by msgspec; a refusal names the field."""
    try:
        return msgspec.convert(obj, cls)
    except msgspec.ValidationError as exc:
        found = _FIELD.search(str(exc))
        name = (found[1] or found[2]) if found else str(exc)
        raise LabelFileError(f"{where} {name} is missing or of the wrong type") from None


def _write_new(path: Path, text: str) -> None:
    """A new labels file holding ``text``, in place whole or not at all (a crash leaves the old
    file, or none, never a header cut in half)."""
    staged = path.with_name(path.name + ".tmp")
    with open(staged, "wb") as stream:
        stream.write(text.encode("utf-8", "surrogatepass"))
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(staged, path)


def _cut_torn_tail(path: Path) -> None:
    """Cut the file back to its last newline: a kill -9 mid-append leaves part of a line. A
    last line that is whole JSON but lacks its newline (written by hand) gets one instead."""
    from grader.io.results import cut_to_last_line

    with open(path, "r+b") as stream:
        size = stream.seek(0, os.SEEK_END)
        stream.seek(max(0, size - (1 << 16)))
        tail = stream.read().rpartition(b"\n")[2]
        if not tail:
            return
        try:
            json.loads(tail)
        except ValueError:
            cut_to_last_line(stream)
        else:
            stream.write(b"\n")
        stream.flush()
        os.fsync(stream.fileno())
