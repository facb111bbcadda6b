"""Acting on a recorded cell, whatever driver made it: the record in attempt.json says the mode
and the paths, so a restarted plane (even one started with another mode) can still signal, count,
kill and remove what an earlier one started.

A *cell* is either an attempt's record (`freeze` is its top directory) or one rank's plan
(`freezer` is the rank's directory). `runners` are the live, verified pids of the cell's rank
runners; only the subreaper mode needs them.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainyard.backends.contain import cgroup1, cgroup2, cgroupfs, subreaper


def _dir(cell: dict) -> str | None:
    return cell.get("freeze") or cell.get("freezer")


def members(cell: dict, runners: Sequence[int] = ()) -> set[int]:
    """The live processes of the cell (the rank runners are not members)."""
    if cell.get("mode") == "subreaper":
        return subreaper.descendants(runners)
    d = _dir(cell)
    return cgroupfs.procs(d) if d else set()


def signal(cell: dict, runners: Sequence[int], sig: int) -> None:
    """Deliver `sig` to every process of the cell; a cell that is gone is fine."""
    mode, d = cell.get("mode"), _dir(cell)
    if mode == "subreaper":
        subreaper.signal_all(runners, sig)
    elif mode == "cgroup1" and d:
        cgroup1.signal_all(d, sig)
    elif mode == "cgroup2" and d:
        cgroup2.signal_all(d, sig)


def catches(pid: int, sig: int) -> bool:
    """Has process `pid` a handler for `sig` (SigCgt of /proc/<pid>/status)?"""
    try:
        for line in cgroupfs.read(f"/proc/{pid}/status").splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        pass
    return False


def notice(cell: dict, ranks: Sequence[tuple[dict, int | None, int | None]], sig: int) -> None:
    """The preemption notice: per rank, to every process of it that *listens* for `sig` (has a
    handler); a rank with no listener gets it at its command, as a plain program always has.

    Why not every process: a launcher such as torchrun or accelerate does not handle SIGUSR1, so
    the notice would kill it at once, and with it (the rank being over) the workers that were
    checkpointing. `ranks`: (the rank's plan, its verified runner pid, its command's pid). The
    attempt is frozen while the listeners are read and signalled, so none is missed by a fork."""
    mode, d = cell.get("mode"), _dir(cell)
    driver = cgroup1 if mode == "cgroup1" else cgroup2 if mode == "cgroup2" else None
    if driver is not None and d:
        try:
            driver.freeze(d)
        except OSError:
            return  # the attempt's cell is gone
    try:
        for plan, runner, main in ranks:
            pids = members(plan, [runner] if runner else [])
            targets = {p for p in pids if catches(p, sig)} or ({main} & pids if main else set())
            cgroupfs.kill_each(targets, sig)
    finally:
        if driver is not None and d:
            try:
                driver.thaw(d)
            except OSError:
                pass


def kill(cell: dict, runners: Sequence[int] = (), timeout_s: float = 10.0) -> set[int]:
    """SIGKILL every process of the cell until it is empty; returns the pids still there after
    `timeout_s` (a process stuck in uninterruptible sleep), empty when it is empty."""
    mode, d = cell.get("mode"), _dir(cell)
    if mode == "subreaper":
        return subreaper.kill_all(runners, timeout_s)
    if mode == "cgroup1" and d:
        return cgroup1.kill_all(d, timeout_s)
    if mode == "cgroup2" and d:
        return cgroup2.kill_all(d, timeout_s)
    return set()


def remove(record: dict, retry_s: float = 1.0) -> list[str]:
    """rmdir the attempt's cgroups; returns those that could not be removed (still populated).
    A cgroup with a process in it cannot be removed, so this never ends anything that runs."""
    left: list[str] = []
    for d in record.get("dirs") or []:
        left += cgroupfs.remove(d, retry_s)
    return left


