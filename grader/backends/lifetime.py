"""Engine processes, and their shared memory, that die with grader.

A grader killed with SIGKILL runs no cleanup, so vLLM's engine core, a child process, kept
running (vllm_compat, "sigkill"); its workers end with it. It is spawned, so no hook can arm
Linux's parent-death signal in it. Instead a small watchdog process waits on a pipe only grader
holds; when grader is gone, however it died, the pipe reads end of file and the watchdog kills
the engine's processes.

The engine's processes are only those vLLM started: the processes that appeared directly
below grader while the engine was being built (:meth:`Watchdog.started` ends that window), and
their descendants. Each is checked by its start time, so a reused pid is never hit.
multiprocessing's resource tracker, which the engine's start launches below grader too, is left
alone: it serves the user's own processes as well. Anything else below grader (the user's own
subprocesses, started before or after the engine, detached or not) is not the engine's and is
never killed.

The engine's shared memory (vllm_compat, "shared-memory"): the watchdog notes the
``multiprocessing.shared_memory`` segments the engine's processes map (/proc/PID/maps)
in a file of its own; grader unlinks them when it shuts the engine down
(:meth:`Watchdog.close`), the watchdog when it kills the engine, and the next watchdog those of an
earlier one that died before it could (its file is still there). A segment is unlinked only
once no live process maps it; the engine creates them readable by this user alone (mode 0600),
so no other user's process can map one unseen.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import weakref
from contextlib import suppress
from pathlib import Path

from grader.errors import GraderError

# Run as `python -c WATCHDOG PARENT STATE_DIR CHILDREN` (CHILDREN: PARENT's, none of them the
# engine's). While the engine is built, every half second it takes PARENT's new children for
# the engine's. Lines on stdin: "started CHILDREN" (the engine is built: its processes are
# those of these CHILDREN that are new, and theirs), "done" (grader shut the engine down: it
# prints the engine's segments no live process maps, for grader to unlink, and ends). End of
# file without "done" (PARENT died): it kills the engine's processes, unlinks their segments.
_WATCHDOG = r"""
# grader's engine watchdog
import json, os, select, signal, sys, time
from contextlib import suppress
parent, state_dir = int(sys.argv[1]), sys.argv[2]
# PARENT's children when it started this watchdog, "PID:START,...": none of them is the engine's
before = dict(p.split(":") for p in sys.argv[3].split(",") if p)
before = {int(p): s for p, s in before.items()}
me = os.getpid()
SHM = "/dev/shm/"
PREFIX = "psm_"  # multiprocessing.shared_memory's names: the segments vLLM creates

def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] == "Z":
            return None  # ended, not yet reaped: it maps nothing and cannot be killed
        return int(fields[1]), fields[19]  # ppid, start time
    except (OSError, ValueError, IndexError):
        return None

def table():
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (got := stat(int(entry))):
            found[int(entry)] = got
    return found

def alive(pid, started):
    got = stat(pid)
    return got is not None and got[1] == started

def is_tracker(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"multiprocessing.resource_tracker" in f.read()
    except OSError:
        return False

def segments_of(pid):
    names = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[5:]
                if path and path[0].startswith(SHM + PREFIX) and not path[0].endswith(" (deleted)"):
                    names.add(path[0][len(SHM):])
    except (OSError, IndexError):
        pass  # gone, or another user's (it cannot map this user's 0600 segments)
    return names

def unmapped(names):
    names = {n for n in names if os.path.exists(SHM + n)}
    for entry in os.listdir("/proc"):
        if names and entry.isdigit():
            names -= segments_of(int(entry))
    return names

def unlink(names):
    for name in unmapped(names):
        with suppress(OSError):
            os.unlink(SHM + name)

def sweep():
    # the files of earlier watchdogs that died (killed before they could clean up)
    for entry in os.listdir(state_dir):
        pid, _, started = entry.removesuffix(".json").partition("-")
        if not entry.endswith(".json") or not pid.isdigit() or alive(int(pid), started):
            continue
        path = os.path.join(state_dir, entry)
        try:
            with open(path) as f:
                names = set(json.load(f)["segments"])
        except (OSError, ValueError, KeyError, TypeError):
            names = set()
        unlink(n for n in names if isinstance(n, str) and n.startswith(PREFIX) and "/" not in n)
        with suppress(OSError):
            os.unlink(path)

os.makedirs(state_dir, mode=0o700, exist_ok=True)
state = os.path.join(state_dir, f"{me}-{stat(me)[1]}.json")
sweep()
roots, noted, segments = {}, {}, set()
building = True

def look():
    global noted
    processes = table()
    if building:
        for pid, (up, started) in processes.items():
            if (up == parent and pid != me and before.get(pid) != started and pid not in roots
                    and not is_tracker(pid)):
                roots[pid] = started
    found = {p: s for p, s in roots.items() if processes.get(p, (0, None))[1] == s}
    todo = list(found)
    while todo:
        pid = todo.pop()
        for child, (up, started) in processes.items():
            if up == pid and child not in found:
                found[child] = started
                todo.append(child)
    # the ones noted before stay while they live: a look that ran as PARENT died finds its
    # children moved under init, below no one, and would forget them (seen under load)
    noted = {p: s for p, s in noted.items() if alive(p, s)} | found
    new = set().union(*(segments_of(p) for p in noted)) - segments
    if new:
        segments.update(new)
        save()

def save():
    with open(state + ".tmp", "w") as f:
        json.dump({"segments": sorted(segments)}, f)
    os.replace(state + ".tmp", state)

def wait_gone(seconds):
    deadline = time.monotonic() + seconds
    while any(alive(p, s) for p, s in noted.items()) and time.monotonic() < deadline:
        time.sleep(0.05)

def forget():
    with suppress(OSError):
        os.unlink(state)

read = b""
while True:
    ready, _, _ = select.select([0], [], [], 0.5)
    if not ready:
        look()
        continue
    chunk = os.read(0, 64)
    if not chunk:
        break
    read += chunk
    while b"\n" in read:
        line, read = read.split(b"\n", 1)
        if line.startswith(b"started "):
            # PARENT's children as it sent this: the engine's are those that were not there
            # before (a look now could take a process PARENT started since for the engine's)
            building = False
            now = dict(p.split(":") for p in line[8:].decode().split(",") if p)
            roots = {int(p): s for p, s in now.items()
                     if before.get(int(p)) != s and int(p) != me and not is_tracker(int(p))}
            # what the looks while it was built took for the engine's is looked at again
            noted = {}
            segments.clear()
            look()
            save()
        elif line == b"done":
            look()
            wait_gone(5)
            sys.stdout.write(" ".join(sorted(unmapped(segments))) + "\n")
            sys.stdout.flush()
            forget()
            sys.exit(0)
look()
for pid, started in noted.items():
    if alive(pid, started):
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
wait_gone(10)
unlink(segments)
forget()
"""


def state_dir() -> Path:
    """Where watchdogs keep the names of their engine's segments while it runs: this user's."""
    return Path(tempfile.gettempdir()) / f"grader-engines-{os.getuid()}"


class Watchdog:
    """Kills the engine's processes (those started below this one until :meth:`started`, and
    theirs) once this process is gone without :meth:`close`, and unlinks their shared memory
    (Linux; elsewhere it does nothing).

    Args:
        state: the folder of the watchdogs' segment files [default: :func:`state_dir`].
    """

    def __init__(self, state: Path | None = None) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        if not sys.platform.startswith("linux"):
            return
        # stdin is the pipe: its write end stays in this process alone (close_fds, and the
        # engine's children are spawned, not forked); its own session keeps it out of the
        # terminal's Ctrl-C.
        # the children this process has now are not the engine's: listed here, not by the
        # watchdog once it runs, as the engine may start before it looks
        children = _listed(_children(os.getpid()))
        self.process = process = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(state or state_dir()),
             children],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            close_fds=True, start_new_session=True,
        )
        # Dropped without close(): the pipe is closed, so the watchdog ends, taking what is left
        # of the engine along; else Popen.__del__ keeps a running child's Popen, and the pipe,
        # in subprocess._active (CPython 3.8 to 3.13). Not at exit: the engine's shutdown first.
        assert process.stdin is not None
        weakref.finalize(self, process.stdin.close).atexit = False

    def started(self) -> None:
        """The engine is built: processes started below this one from now on are not its."""
        if self.process is None:
            return
        assert self.process.stdin is not None
        children = _listed(_children(os.getpid()))
        with suppress(OSError):  # the watchdog is gone: close() says nothing either
            self.process.stdin.write(f"started {children}\n".encode())
            self.process.stdin.flush()

    def close(self) -> None:
        """The engine was shut down: the watchdog ends and kills nothing; the engine's
        segments that no process maps any more are unlinked."""
        if self.process is None:
            return
        process, self.process = self.process, None
        try:
            named, _ = process.communicate(b"done\n", timeout=15)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
            return
        for name in named.decode("ascii", "replace").split():
            unlink_segment(name)


def unlink_segment(name: str) -> None:
    """Unlink the shared-memory segment ``name`` through ``multiprocessing.shared_memory``,
    which also takes it off the resource tracker's list: Python warns of no leak at exit."""
    from multiprocessing import shared_memory

    try:
        # Python 3.11's attach registers the name with the resource tracker too, and unlink()
        # unregisters it: the tracker forgets it whether or not the engine had registered it.
        segment = shared_memory.SharedMemory(name=name)
    except (OSError, ValueError):
        return  # gone already
    segment.close()
    with suppress(OSError):
        segment.unlink()


def _children(parent: int) -> list[tuple[int, str]]:
    """The processes whose parent is ``parent``, each with its start time (/proc: Linux)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
            fields = text[text.rindex(")") + 2:].split()
        except (OSError, ValueError):
            continue
        if len(fields) > 19 and fields[1] == str(parent):
            found.append((int(entry), fields[19]))
    return found


def _listed(processes: list[tuple[int, str]]) -> str:
    """Processes as the watchdog reads them: ``PID:START,...``."""
    return ",".join(f"{pid}:{started}" for pid, started in processes)


class UnguardedScriptError(GraderError):
    """A script that uses grader without an ``if __name__ == "__main__":`` guard started it
    again in a process spawned for the engine (bad usage: exit 2)."""


def refuse_reimport() -> None:
    """Stop where grader would start grading inside a process that ``multiprocessing``'s spawn
    method is still preparing: one that re-imports the parent's main script.

    A script that grades at its top level, without the ``__main__`` guard, grades again there
    (vllm_compat, "spawn-main"), and multiprocessing's error names no script while the parent
    saw only "Engine core initialization failed". The reason is printed here, this process
    exits 2, and the reason is left for the parent (:func:`reimported`) to raise instead.
    """
    import multiprocessing

    # CPython's spawn (multiprocessing/spawn.py _main, 3.8 to 3.13) sets _inheriting on the
    # current process while it re-imports the main module; its own check reads the same flag.
    if not getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    # the script runs as __mp_main__ (spawn.py _fixup_main_from_path: runpy.run_path)
    main = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
    script = getattr(main, "__file__", None) or "the main script"
    error = UnguardedScriptError(
        f"{script} starts grading again in a process spawned for the engine: the engine's new "
        "Python process imports the main script again, and code outside "
        "`if __name__ == \"__main__\":` runs there again; put the code that uses grader "
        "under that guard (docs/python.md)"
    )
    # unwritten, the parent says only what vLLM says: this process's line below is the reason
    with suppress(OSError):
        note = _note(os.getppid())
        note.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        note.write_text(str(error), encoding="utf-8")
    # one line on the terminal, as the command line's errors, not a traceback through runpy; and
    # an exit that the script's own `except GraderError` cannot turn into going on
    print(f"error: {error}", file=sys.stderr)
    raise SystemExit(error.exit_code)


def reimported() -> UnguardedScriptError | None:
    """The error :func:`refuse_reimport` left in a process this one spawned, taken (None
    where there is none): the reason the engine did not start."""
    path = _note(os.getpid())
    try:
        text = path.read_text(encoding="utf-8")
        path.unlink()
    except OSError:
        return None
    return UnguardedScriptError(text)


def _note(pid: int) -> Path:
    return state_dir() / f"reimported-{pid}"
