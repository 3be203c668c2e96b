"""One policy for every file grader writes, whichever command writes it.

Before any model work a command lists the files it will write (:class:`Planned`: a path,
its kind and the option that names it) and the files it reads, and calls
:func:`check_outputs` once:

- a file it reads in that command (DATA, ``--pair`` files, RESULTS, a ``--rubric`` file,
  labels, a settings file) is never written, with or without ``--overwrite``: the refusal
  names the option and the file, and does not offer ``--overwrite``, which cannot help;
- a directory is never written over: the refusal says to name a file;
- an existing file that is not grader's own of that kind (a summary that is not a summary, a
  copy of the data at ``NAME.controls.jsonl``, a page grader did not write at ``report -o``)
  stops the command unless ``--overwrite``; an empty file holds nothing to lose.

"Grader's own of that kind" is read from the file's first line or object only (:data:`KINDS`),
so the check costs a few kilobytes a file: a file of the right shape whose later lines are
broken is the reader's to refuse, with its line number. Writers keep their own guards on
what they write *into* a file of theirs (a results file of another run's settings,
:mod:`grader.run.owner`); this module decides only whether a file may be written at all.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grader.errors import GraderError

# What is read of a file to tell whose it is: its first line (a record, a rubric line, a
# labels header), its head (an HTML page's title), or the whole of a JSON file (a summary, an
# audit), each up to _WHOLE bytes (a summary is a few KB; beyond that a file is not grader's).
_WHOLE = 1 << 26


class Kind(enum.Enum):
    """The kinds of file grader writes, each with what it is called in a message."""

    RESULTS = "a grader results file"
    SUMMARY = "a grader summary"
    LOG = "a grader run's log"  # NAME.jsonl.partial, NAME.controls.jsonl.partial
    LOG_OWNER = "a grader run's log owner"  # NAME.jsonl.partial.json
    CONTROLS = "a grader controls file"
    RUBRIC = "a grader rubric file"
    AUDIT = "a grader audit summary"
    AUDIT_ROWS = "a grader audit rows file"
    PAIRS = "a grader pairs file"
    REPORT = "a grader report page"
    RANK_PAGE = "a grader rank page"
    LABELS = "a grader labels file"
    SCORED_LOG = "an inspect_ai log grader scored"
    BATCH_REQUESTS = "a grader batch requests file"
    BATCH_MANIFEST = "a grader batch manifest"
    STAGE = "a grader stage file"  # a preparation stage's that declares no kind of its own


@dataclass(frozen=True)
class Planned:
    """A file a command will write: where, of which kind, and how the user named it (the
    option, or the option it is written beside: ``"beside -o"``)."""

    path: Path
    kind: Kind
    option: str = "-o"


class OutputRefused(GraderError):
    """A file the command would write is not grader's own of its kind, or is one the command
    reads, or is a directory: one line naming it; exit 2, before any model work."""


def check_outputs(writes: Iterable[Planned], reads: Iterable[str | Path | None] = (), *,
                  overwrite: bool = False) -> None:
    """Raise :class:`OutputRefused` for the first planned file that may not be written.

    Args:
        writes: every file the command will write.
        reads: every file the command reads (None and ``-``, stdin, are skipped).
        overwrite: the command's ``--overwrite``: a file not grader's own may be replaced;
            a file the command reads, or a directory, never.
    """
    # a file that is not there is not read (a prompt given by name, say)
    read = [Path(p) for p in reads if p is not None and str(p) != "-" and os.path.exists(p)]
    for planned in writes:
        path = planned.path
        named = path if planned.option.startswith("beside") else f"{planned.option} {path}"
        source = next((r for r in read if _same(r, path)), None)
        if source is not None:
            raise OutputRefused(
                f"{named} is {source}, which this command reads: grader never writes a file it "
                f"reads; choose another {_option(planned)}")
        if path.is_dir():
            raise OutputRefused(f"{named} is a directory: name a file ({_option(planned)})")
        if overwrite or not path.exists():
            continue
        if not is_own(path, planned.kind):
            beside = f" ({planned.option})" if planned.option.startswith("beside") else ""
            raise OutputRefused(
                f"{path} exists and is not {planned.kind.value}{beside}: grader would replace "
                f"it; use --overwrite to replace it, or another {_option(planned)}")


def _option(planned: Planned) -> str:
    """The option that moves a file elsewhere: its own, or the one it is written beside."""
    return planned.option.removeprefix("beside ")


def _same(a: Path, b: Path) -> bool:
    """Whether two paths name one file (a hard link, a symlink or another spelling too)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): its absolute spelling decides
        return os.path.abspath(a) == os.path.abspath(b)


def is_own(path: Path, kind: Kind) -> bool:
    """Whether ``path`` holds a file grader wrote of ``kind`` (or nothing: an empty file).
    An unreadable file counts as grader's: the write that follows says why it fails."""
    test, read = KINDS[kind]
    try:
        with open(path, "rb") as stream:
            head = _READS[read](stream)
    except OSError:
        return True
    if not head.strip():
        return True
    if kind is Kind.RESULTS and not test(head):  # a results file whose summary says so
        from grader.io.results import summary_path

        return is_own(summary_path(path), Kind.SUMMARY) and summary_path(path).is_file()
    return test(head)


def _first_whole_line(stream: Any) -> bytes:
    """The first non-blank line (a record may run to megabytes), up to :data:`_WHOLE`."""
    for line in iter(lambda: stream.readline(_WHOLE), b""):
        if line.strip():
            return bytes(line)
    return b""


_READS: dict[str, Callable[[Any], bytes]] = {
    "line": _first_whole_line,
    "whole": lambda stream: bytes(stream.read(_WHOLE)),
    "head": lambda stream: bytes(stream.read(4096)),
}


def _whole(head: bytes) -> Any:
    """``head`` as JSON (None: not JSON, or cut off at its end)."""
    try:
        return json.loads(head.removeprefix(b"\xef\xbb\xbf"))
    except (ValueError, RecursionError):
        return None


def _first_line(head: bytes) -> Any:
    """The first non-blank line of ``head`` as JSON (None: not JSON, or cut off)."""
    return _whole(next((line for line in head.splitlines() if line.strip()), b""))


def _record(head: bytes) -> bool:
    first = _first_line(head)
    return isinstance(first, dict) and "id" in first and "status" in first


def _log(head: bytes) -> bool:
    # a run killed in its first write leaves one torn line, without its newline
    return _record(head) or not head.endswith(b"\n")


def _object_with(*keys: str, whole: bool = True) -> Callable[[bytes], bool]:
    def test(head: bytes) -> bool:
        value = _whole(head) if whole else _first_line(head)
        return isinstance(value, dict) and all(key in value for key in keys)

    return test


def _summary(head: bytes) -> bool:
    value = _whole(head)
    return isinstance(value, dict) and ("statuses" in value or isinstance(value.get("run"), dict))


def _audit_rows(head: bytes) -> bool:
    first = _first_line(head)
    return isinstance(first, dict) and "#audit:" in str(first.get("id"))


def _page(title: bytes) -> Callable[[bytes], bool]:
    return lambda head: b"<title>" + title in head


# Each kind: how its file is told from another's, and whether the test reads it whole.
KINDS: dict[Kind, tuple[Callable[[bytes], bool], str]] = {
    Kind.RESULTS: (_record, "line"),
    Kind.SUMMARY: (_summary, "whole"),
    Kind.LOG: (_log, "line"),
    Kind.LOG_OWNER: (lambda head: isinstance(_whole(head), dict), "whole"),
    Kind.CONTROLS: (_record, "line"),
    Kind.RUBRIC: (_object_with("key", "reference", whole=False), "line"),
    Kind.AUDIT: (_object_with("kinds", "original"), "whole"),
    Kind.AUDIT_ROWS: (_audit_rows, "line"),
    Kind.PAIRS: (_object_with("id", "output_a", "output_b", whole=False), "line"),
    Kind.REPORT: (_page(b"grader report: "), "head"),
    Kind.RANK_PAGE: (_page(b"grader rank</title>"), "head"),
    Kind.LABELS: (_object_with("grader_labels", whole=False), "line"),
    # an inspect_ai log (a zip, or JSON) is not told apart from another tool's by its first
    # bytes: any file already there is replaced only with --overwrite
    Kind.SCORED_LOG: (lambda head: False, "head"),
    Kind.BATCH_REQUESTS: (lambda head: str((_first_line(head) or {}).get("custom_id", "")
                                           ).startswith("grader-"), "line"),
    Kind.BATCH_MANIFEST: (_object_with("grader_batch"), "whole"),
    Kind.STAGE: (lambda head: isinstance(_first_line(head), dict), "line"),
}


def results_files(output: Path, option: str = "-o") -> list[Planned]:
    """A results file and what always goes beside it: its summary, its log and the log's
    owner (:mod:`grader.io.results`)."""
    from grader.io.results import owner_path, summary_path

    beside = f"beside {option}"
    return [Planned(output, Kind.RESULTS, option),
            Planned(summary_path(output), Kind.SUMMARY, beside),
            Planned(output.with_name(output.name + ".partial"), Kind.LOG, beside),
            Planned(owner_path(output), Kind.LOG_OWNER, beside)]


def label_files(labels: Path, reads: Iterable[str | Path | None], *,
                overwrite: bool = False) -> None:
    """``grader label -o LABELS``: the policy for a labels file (it reads RESULTS and DATA)."""
    check_outputs([Planned(Path(labels), Kind.LABELS)], reads, overwrite=overwrite)
