"""One writer per results file: an advisory lock beside it, held for the whole run.

Two runs writing the same results file corrupt each other (each resumes from, truncates and
removes the other's log). ``OutputLock`` takes an ``flock`` on ``PATH.lock`` before anything
is read or written; a second run finds it taken and stops with one line naming the first. The
kernel drops the lock when its process dies, however it dies, so a lock left by a killed run
never blocks the resume.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

from grader.errors import EXIT_BUSY, GraderError, OutputError
from grader.io.manifest import now

logger = logging.getLogger(__name__)


class OutputBusy(GraderError, RuntimeError):
    """Another grader process holds the results file; the message names it in one line."""

    exit_code = EXIT_BUSY


def lock_path(output: Path) -> Path:
    """``results.jsonl`` -> ``results.jsonl.lock`` beside it."""
    return output.with_name(output.name + ".lock")


class OutputLock:
    """``with OutputLock(path):`` holds the only right to write ``path`` (and its summary)."""

    def __init__(self, output: Path):
        self.output = Path(output)
        self.path = lock_path(self.output)
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise :class:`OutputBusy` at once: a second run never waits."""
        while True:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # O_CREAT without O_TRUNC: the holder's details must survive a contender's open
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:  # a read-only directory, a parent that is a file
                raise OutputError.of(self.output, exc) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise OutputBusy(f"{self.output} is being written by another grader run "
                                 f"({holder}); wait for it to finish, or write elsewhere with "
                                 "another -o") from None
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                # a filesystem without locks: say so rather than pretend to be protected
                logger.warning("warning: cannot lock %s (%s): make sure no other grader run writes "
                               "the same results", self.path, exc.strerror)
                return
            # The holder before us removes the file as it lets go: if it did so between our
            # open and our flock, we hold a lock on a file nobody else will open. Try again.
            try:
                current = os.stat(self.path)
            except FileNotFoundError:
                current = None
            held = os.fstat(fd)
            if current is not None and (current.st_ino, current.st_dev) == (held.st_ino, held.st_dev):
                break
            os.close(fd)
        self._fd = fd
        details = {"pid": os.getpid(), "host": socket.gethostname(), "started": now()}
        try:
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(details) + "\n").encode())
        except OSError as exc:  # a full disk: nothing could be written, so stop before starting
            self.release()
            raise OutputError.of(self.path, exc) from None

    def release(self) -> None:
        if self._fd is None:
            return
        # Removed while still held, so that no one can take a lock on a file about to vanish.
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def _read_holder(fd: int) -> str:
    """The holder's pid, host and start time, as the lock file says them."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0))
        return f"pid {holder['pid']} on {holder['host']}, started {holder['started']}"
    except (OSError, ValueError, TypeError, KeyError):
        # it took the lock a moment ago and has not written its details yet
        return "its details are not written yet"
