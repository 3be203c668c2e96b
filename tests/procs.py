"""Processes and shared-memory segments read from /proc (Linux): the engine tests' helpers,
imported by the programs they start too (tests/test_vllm_engine.py)."""

from __future__ import annotations

import os


def engine_below(parent: int, among: list[int] | None = None, named: str | None = "VLLM::"
                 ) -> list[int]:
    """vLLM's engine processes (named VLLM::...) below ``parent``; with ``among``, those of
    them still alive (``named`` None: any live process of ``among``)."""
    table = {}
    for entry in os.listdir("/proc"):
        try:
            stat = open(f"/proc/{entry}/stat").read() if entry.isdigit() else ""
        except OSError:
            continue
        if stat:
            name, fields = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                table[int(entry)] = (name, int(fields[1]))
    if among is not None:
        return [pid for pid in among if pid in table]
    found, todo = [], [parent]
    while todo:
        pid = todo.pop()
        for child, (name, up) in table.items():
            if up == pid:
                todo.append(child)
                if named is None or name.startswith(named):
                    found.append(child)
    return found


def segments(pids: list[int]) -> set[str]:
    """The shared-memory segments (/dev/shm/psm_*) ``pids`` map."""
    names = set()
    for pid in pids:
        try:
            lines = open(f"/proc/{pid}/maps").read().splitlines()
        except OSError:
            continue
        names |= {line.split()[-1][len("/dev/shm/"):] for line in lines
                  if "/dev/shm/psm_" in line and not line.endswith("(deleted)")}
    return names


def alive(pid: int) -> bool:
    return bool(engine_below(0, [pid], named=None))


def watchdogs_below(parent: int) -> list[int]:
    """The live engine watchdogs (grader.backends.lifetime) that ``parent`` started."""
    found = []
    for pid in engine_below(parent, named=None):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"# grader's engine watchdog" in f.read():
                    found.append(pid)
        except OSError:
            continue
    return found
