"""Reading process facts from /proc (Linux), so a pid on disk is never trusted on its own.

A pid written down by an earlier control-plane process may since have been recycled for some
unrelated process. A process is identified by (pid, start time): field 22 of /proc/<pid>/stat,
in clock ticks since boot, which cannot repeat for the same pid before a reboot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str  # R, S, D, Z (zombie), X (dead), ...
    pgrp: int
    session: int
    start_time: int  # clock ticks since boot
    ppid: int = 0  # its parent's pid

    @property
    def exited(self) -> bool:
        """A zombie has finished; it only waits for its parent to reap it."""
        return self.state in ("Z", "X")


def read_stat(pid: int) -> ProcStat | None:
    """The stat line of `pid`, or None when no such process exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) is in parentheses and may itself contain ") "; split after
    # the last ')'. What follows starts at field 3.
    fields = raw[raw.rindex(")") + 2 :].split()
    return ProcStat(
        pid=pid, state=fields[0], pgrp=int(fields[2]), session=int(fields[3]), start_time=int(fields[19]),
        ppid=int(fields[1]),
    )


def is_alive(pid: int, start_time: int) -> bool:
    """True when `pid` is the very process that started at `start_time` and has not finished."""
    st = read_stat(pid)
    return st is not None and not st.exited and st.start_time == start_time


def group_members(pgid: int, not_before: int) -> list[int]:
    """Live processes of process group `pgid` in session `pgid` that started at or after `not_before`.

    Used when a group's leader is gone but its children may live on. Linux does not hand out a
    pid while it is still some group's id, so members found here belong to the original group;
    the session and start-time checks guard against the (unlikely) recycled-id group.
    """
    out: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = read_stat(int(name))
        if (
            st is not None
            and not st.exited
            and st.pgrp == pgid
            and st.session == pgid
            and st.start_time >= not_before
        ):
            out.append(st.pid)
    return out
