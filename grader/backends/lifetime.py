"""Engine processes that die with grader.

vLLM runs its engine core in a child process, and the engine core its workers. A grader killed
with SIGKILL runs no cleanup, so the engine core kept running: vLLM 0.32.0's
``VLLM::EngineCore`` stayed alive holding ~950 MB here, and on a GPU it would hold the GPU's
memory (issue 29, item 14). Its workers already end with it (vLLM's death pipe).

vLLM starts the engine core with ``multiprocessing``'s spawn method on CPU (its CPU platform
sets VLLM_WORKER_MULTIPROC_METHOD=spawn) and usually on CUDA: a fresh interpreter that runs none
of grader's code before vLLM's, so no hook can arm Linux's parent-death signal in it. Instead a
small watchdog process waits on a pipe only grader holds; when grader is gone, however it died,
the pipe reads end of file and the watchdog kills the engine core processes it was given (each
checked by its start time, so a reused pid is never hit).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterable

log = logging.getLogger(__name__)

# Run as `python -c`: reads the pids and their start times, waits for EOF on stdin, kills.
_WATCHDOG = r"""
import os, signal, sys
pids = [(int(p), s) for p, s in (a.split(":", 1) for a in sys.argv[1:])]
try:
    while os.read(0, 4096):
        pass
except OSError:
    pass
for pid, started in pids:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        if stat[stat.rindex(")") + 2:].split()[19] == started:
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass
"""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22)."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            stat = stat_file.read()
        return stat[stat.rindex(")") + 2 :].split()[19]
    except (OSError, ValueError, IndexError):
        return None


class Watchdog:
    """Kills ``pids`` once this process is gone (Linux; elsewhere it does nothing)."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        targets = [f"{pid}:{started}" for pid in pids if (started := _start_time(pid))]
        if not targets or not sys.platform.startswith("linux"):
            return
        # stdin is the pipe: its write end stays in this process alone (close_fds, and the
        # engine's children are spawned, not forked); the watchdog ignores Ctrl-C and SIGTERM
        # meant for the terminal's process group by running in its own session.
        self.process = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, *targets], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
            start_new_session=True,
        )

    def close(self) -> None:
        """The engine was shut down: the watchdog ends (its targets are gone, or not ours)."""
        if self.process is None:
            return
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.process = None


def engine_core_pids(llm: object) -> list[int]:
    """The pids of ``vllm.LLM``'s engine core processes; [] where vLLM keeps them elsewhere.

    vLLM 0.32.0: ``LLM.llm_engine.engine_core`` (an MP client) holds
    ``resources.engine_manager.processes`` (CoreEngineProcManager, v1/engine/utils.py).
    """
    try:
        processes = llm.llm_engine.engine_core.resources.engine_manager.processes  # type: ignore[attr-defined]
        return [p.pid for p in processes if p.pid]
    except AttributeError:
        log.debug("vLLM's engine core processes not found: no watchdog")
        return []
