"""Engine processes that die with grader.

vLLM runs its engine core in a child process, and the engine core its workers. A grader killed
with SIGKILL runs no cleanup, so the engine core kept running: vLLM's
``VLLM::EngineCore`` stayed alive holding ~950 MB here, and on a GPU it would hold the GPU's
memory (issue 29, item 14). Its workers already end with it (vLLM's death pipe).

vLLM starts the engine core with ``multiprocessing``'s spawn method on CPU (its CPU platform
sets VLLM_WORKER_MULTIPROC_METHOD=spawn) and usually on CUDA: a fresh interpreter that runs none
of grader's code before vLLM's, so no hook can arm Linux's parent-death signal in it. Instead a
small watchdog process waits on a pipe only grader holds; when grader is gone, however it died,
the pipe reads end of file and the watchdog kills the processes that appeared below grader
since it started (noted every half second, each checked by its start time, so a reused pid is
never hit). It starts before the engine, so a grader killed while the engine loads is covered.
"""

from __future__ import annotations

import os
import subprocess
import sys

# Run as `python -c PARENT`: every half second it notes the processes below PARENT that were
# not there when it started (with their start times); a "done" line on stdin ends it quietly,
# end of file without one (PARENT died) kills the ones it noted last.
_WATCHDOG = r"""
import os, select, signal, sys
parent = int(sys.argv[1])

def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
        fields = text[text.rindex(")") + 2:].split()
        return int(fields[1]), fields[19]
    except (OSError, ValueError, IndexError):
        return None

def below():
    ppid = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (got := stat(int(entry))):
            ppid[int(entry)] = got
    found, todo = {}, [parent]
    while todo:
        pid = todo.pop()
        for child, (up, started) in ppid.items():
            if up == pid and child not in found and child != os.getpid():
                found[child] = started
                todo.append(child)
    return found

before = below()
noted = {}
read = b""
while True:
    ready, _, _ = select.select([0], [], [], 0.5)
    if ready:
        chunk = os.read(0, 64)
        if not chunk:
            break
        read += chunk
        if b"done" in read:
            sys.exit(0)
    else:
        # the ones noted before stay while they live: a look that ran as PARENT died finds its
        # children moved under init, below no one, and would forget them (seen under load)
        kept = {p: s for p, s in noted.items() if (got := stat(p)) and got[1] == s}
        noted = kept | {p: s for p, s in below().items() if before.get(p) != s}
for pid, started in noted.items():
    got = stat(pid)
    if got and got[1] == started:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


class Watchdog:
    """Kills the processes started below this one from now on, once this process is gone
    without :meth:`close` (Linux; elsewhere it does nothing)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        if not sys.platform.startswith("linux"):
            return
        # stdin is the pipe: its write end stays in this process alone (close_fds, and the
        # engine's children are spawned, not forked); its own session keeps it out of the
        # terminal's Ctrl-C.
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid())], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
            start_new_session=True,
        )

    def close(self) -> None:
        """The engine was shut down: the watchdog ends and kills nothing."""
        if self.process is None:
            return
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(b"done\n")
            self.process.stdin.close()
            self.process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
        self.process = None
