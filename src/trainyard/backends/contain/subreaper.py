"""Subreaper fallback, where no cgroup is writable (a plane run as a plain user, a locked-down
container): each rank runner is a child subreaper (PR_SET_CHILD_SUBREAPER, see rank_runner.py),
so a process that daemonizes or calls setsid is re-parented to the runner, not to init, and stays
findable as a descendant of the runner in /proc.

Signals go to every descendant of the rank's runner (the runner itself only waits); SIGKILL is
repeated until no descendant is left, because the children of a killed process become the
runner's and show up on the next walk. Weaker than a cgroup: a process that forks between the
walk and the signal is caught by the next walk only, and if the runner itself dies its orphans
go to init and out of reach. No limit (memory, CPU, devices) can be enforced in this mode; an
attempt that asks for one is refused with a `ContainmentError`. The pids limit, which every job
has from the configuration, is not enforced either (RLIMIT_NPROC would count every process of the
owner's account, its other jobs and logins included, not the job's): the attempt runs without
one, and `summary` (yard up's containment line) says so.
"""

from __future__ import annotations

import os
import signal as _signal
import time
from collections.abc import Iterable

from trainyard.backends.contain import cgroupfs
from trainyard.backends.contain.common import ContainmentError, Needs


class Subreaper:
    mode = "subreaper"

    def __init__(self, why: str = "") -> None:
        self.why = why

    def summary(self) -> str:
        line = "subreaper (no cgroup: descendants of each rank runner; no memory, CPU or device limits; pids not limited)"
        return line + (f": {self.why}" if self.why else "")

    def prepare(self, needs: Needs) -> dict:
        """Raises ContainmentError for an attempt with limits: nothing here could enforce them."""
        if any(v is not None for v in needs.node_mem_mib.values()):
            raise ContainmentError("--mem/--mem-per-gpu cannot be enforced: containment is subreaper "
                                   "(no writable cgroup; run the plane as root or in a delegated cgroup)")
        if any(r.cpus for r in needs.ranks):
            raise ContainmentError("--cpus-per-task cannot be enforced: containment is subreaper "
                                   "(no writable cgroup; run the plane as root or in a delegated cgroup)")
        return {"mode": self.mode, "dirs": [], "ranks": {str(r.rank): {"mode": self.mode} for r in needs.ranks}}

    def close(self) -> None:
        return None

    def sweep(self, keep: set[str]) -> list[str]:
        return []  # nothing on disk outlives its runner's record


def children() -> dict[int, list[int]]:
    """Each live process's children (pid -> child pids), from one scan of /proc's parent links."""
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = cgroupfs.read(f"/proc/{name}/stat")
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if fields[0] not in ("Z", "X"):
            kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


def descendants(roots: Iterable[int]) -> set[int]:
    """Every live descendant of the processes `roots` (not the roots), from /proc parent links."""
    kids = children()
    found: set[int] = set()
    todo = [k for r in roots for k in kids.get(r, ())]
    while todo:
        p = todo.pop()
        if p not in found:
            found.add(p)
            todo.extend(kids.get(p, ()))
    return found


def signal_all(runners: Iterable[int], sig: int) -> None:
    runners = list(runners)
    if runners:
        cgroupfs.kill_each(descendants(runners), sig)


def kill_all(runners: Iterable[int], timeout_s: float) -> set[int]:
    runners = list(runners)
    deadline = time.monotonic() + timeout_s
    while (left := descendants(runners)) and time.monotonic() < deadline:
        cgroupfs.kill_each(left, _signal.SIGKILL)
        time.sleep(0.005)
    return left


__all__ = ["ContainmentError", "Subreaper", "descendants", "kill_all", "signal_all"]
