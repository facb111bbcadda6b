"""How much CPU an attempt's processes have used: what tells a busy interactive allocation from an
idle one (issue 38; the loop's idle step, control/loop/idle.py, turns two readings into a rate).

One number per attempt, the CPU time (user + system, seconds) of every process of its cell since
it started, exited ones included, read from files the kernel keeps and the job cannot write:

    cgroup2    cpu.stat `usage_usec` of the attempt's directory (present in every v2 cgroup, with or
               without the cpu controller; hierarchical: every node and rank below it)
    cgroup1    cpuacct.usage (ns) of the attempt's cpuacct directory (`cgroup1.py` makes one where
               the cpuacct hierarchy is mounted); without one, /proc as below over the members
               of the attempt's freezer cgroup
    subreaper  /proc: utime + stime + cutime + cstime of every descendant of the rank runners, and
               the runners' own cutime + cstime (what their reaped children used)

A terminal opened in a rank (backends/rundir/attach.py) joins the rank's cgroups, so what it runs
counts in the two cgroup modes; in the subreaper mode it is not a descendant of the runner and does
not (its input counts instead). The /proc sums lose a process's time when it is reaped by a parent
outside the set (a reading may then go down): the caller treats a reading lower than the last as
a new start, never as a negative rate.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from trainyard.backends.contain import cgroupfs, subreaper

TICK = os.sysconf("SC_CLK_TCK")


def _stat_ticks(pid: int, with_children: bool = True) -> int:
    """utime + stime (+ cutime + cstime) of `pid` in clock ticks; 0 when it is gone."""
    try:
        raw = cgroupfs.read(f"/proc/{pid}/stat")
    except OSError:
        return 0
    f = raw[raw.rindex(")") + 2 :].split()  # fields from 3 on: utime is field 14, so f[11]
    try:
        own = int(f[11]) + int(f[12])
        kids = int(f[13]) + int(f[14])
    except (IndexError, ValueError):
        return 0
    return own + kids if with_children else kids


def proc_seconds(pids: Iterable[int], reapers: Iterable[int] = ()) -> float:
    """CPU seconds of `pids` with their reaped children, plus the reaped children of `reapers`."""
    ticks = sum(_stat_ticks(p) for p in pids) + sum(_stat_ticks(p, with_children=False) for p in reapers)
    return ticks / TICK


def _cgroup2_seconds(d: str) -> float | None:
    try:
        for line in cgroupfs.read(os.path.join(d, "cpu.stat")).splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        pass
    return None


def _cgroup1_seconds(d: str) -> float | None:
    try:
        return int(cgroupfs.read(os.path.join(d, "cpuacct.usage")).strip()) / 1e9
    except (OSError, ValueError):
        return None


def dir_seconds(d: str) -> float | None:
    """The CPU seconds of one cgroup directory and those below it: v2's cpu.stat, else v1's
    cpuacct.usage (a rank's own directory, for the node agent's per-rank rates:
    backends/local/gpu_agent.py); None when it has neither."""
    got = _cgroup2_seconds(d)
    return got if got is not None else _cgroup1_seconds(d)


def cpu_seconds(cell: dict, runners: Sequence[int] = ()) -> float | None:
    """The CPU seconds used so far by the attempt whose containment record is `cell`
    (attempt.json's "cell"); `runners`: its live, verified rank runners (the subreaper mode's
    roots). None when the record names no way to tell (a cell gone, an unknown mode)."""
    mode, top = cell.get("mode"), cell.get("freeze")
    if mode == "cgroup2" and top:
        return _cgroup2_seconds(top) if os.path.isdir(top) else None
    if mode == "cgroup1":
        if cell.get("cpuacct"):
            return _cgroup1_seconds(cell["cpuacct"])
        if top and os.path.isdir(top):
            return proc_seconds(cgroupfs.procs(top))
        return None
    if mode == "subreaper":
        return proc_seconds(subreaper.descendants(runners), runners) if runners else None
    return None


__all__ = ["cpu_seconds", "dir_seconds", "proc_seconds"]
