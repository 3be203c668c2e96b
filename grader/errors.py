"""The one base class of every error a command turns into one line and an exit code (each
error type says its own; docs/runs.md, "Exit codes"). It imports nothing of grader's.
"""

from __future__ import annotations

import errno

EXIT_FAIL_ON = 1  # --fail-on: a listed status, or the judge check's verdict listed
EXIT_BAD_INPUT = 2  # bad input, settings or options; results of another run
EXIT_ENGINE = 3  # the engine cannot run here: no device, an unsupported vLLM, a missing extra
EXIT_INTERNAL = 70  # a bug in grader (sysexits' EX_SOFTWARE); the traceback is saved
EXIT_OUTPUT = 73  # the output cannot be written (sysexits' EX_CANTCREAT)
EXIT_BUSY = 75  # another run writes the same output (sysexits' EX_TEMPFAIL: retry later)
EXIT_INTERRUPTED = 130  # Ctrl-C (the shell's 128 + SIGINT)
EXIT_TERMINATED = 143  # SIGTERM (128 + SIGTERM)


class GraderError(Exception):
    """An error a command reports as its message, one line, and exits with ``exit_code``."""

    exit_code = EXIT_BAD_INPUT


class Terminated(KeyboardInterrupt):
    """A SIGTERM that stops a run at once (before its grading starts, or a second one); the
    command exits 143, as a Ctrl-C's :class:`KeyboardInterrupt` exits 130."""


class OutputError(GraderError):
    """A file grader writes cannot be written: the message names it and the reason."""

    exit_code = EXIT_OUTPUT

    @classmethod
    def of(cls, path: object, exc: OSError) -> OutputError:
        reason = exc.strerror or str(exc)
        hint = _HINTS.get(exc.errno or 0, "")
        return cls(f"cannot write {path}: {reason}{hint}")


_HINTS = {
    errno.ENOSPC: " (the disk is full: free space, or write elsewhere with another -o)",
    errno.EDQUOT: " (over the disk quota: free space, or write elsewhere with another -o)",
    errno.EACCES: " (no permission: write elsewhere with another -o)",
    errno.EPERM: " (no permission: write elsewhere with another -o)",
    errno.EROFS: " (a read-only filesystem: write elsewhere with another -o)",
    errno.ENOTDIR: " (a part of the path is a file, not a directory)",
    errno.EEXIST: " (a part of the path is a file, not a directory)",
}


def one_line(value: object, *, named: bool = False, limit: int | None = None) -> str:
    """``value`` (an exception, or any text) as one line: its whitespace runs made one space;
    at most ``limit`` characters of it; an exception's type first where ``named``
    (``"OSError: ..."``), and its type's name where it has no message."""
    text = " ".join(str(value).split())[:limit]
    if not isinstance(value, BaseException):
        return text
    name = type(value).__name__
    if named:
        return f"{name}: {text}" if text else name
    return text or name
