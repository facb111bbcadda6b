"""Containment: every process of an attempt in one place the plane can signal, count and kill.

Why: a rank's command may start its own sessions (torchrun's workers, `setsid`, `nohup … &`, a
daemonized data server). Killing process groups misses those, and a preempted attempt's workers
would train on beside the next attempt in the same checkpoint directory (design rule 3). So each
attempt gets one *cell*, like a Slurm step under proctrack/cgroup:

    cgroup2    the unified hierarchy (`cgroup2.py`): tracking by cgroup.procs, signals by
               cgroup.freeze + signal + thaw, kills by cgroup.kill; memory and cpu limits where
               those controllers are delegated to the plane's cgroup
    cgroup1    the v1 hierarchies freezer, pids, memory, devices, cpu (`cgroup1.py`): tracking
               and signals through the freezer; memory, device and CPU limits
    subreaper  neither writable (`subreaper.py`): each rank runner is a child subreaper and the
               cell is the runner's descendants; no limits

Choosing: `choose(mode, data_dir)` with mode `auto` (default), `cgroup2`, `cgroup1` or
`subreaper`, from the local backend's `containment` argument or the `TRAINYARD_CONTAINMENT`
environment variable of `yard up` (what Slurm's cgroup.conf `CgroupPlugin=autodetect|cgroup/v1|
cgroup/v2` and `ProctrackType=proctrack/linuxproc` say). `auto` takes cgroup2 when the unified
hierarchy is writable and has the memory, cpu and pids controllers; else cgroup1 when the v1
freezer is writable; else cgroup2 for tracking alone when the unified hierarchy is writable; else
subreaper, and `Choice.fallback` says why each better one was not taken. A mode asked for by
name that cannot work here is a `ContainmentError` (never a silent downgrade).

Layout (per hierarchy; absolute paths are recorded in the attempt's attempt.json, so a restarted
plane finds them whatever it would choose itself):

    <plane's own cgroup>/trainyard/d<hash of the data dir>/j<job>.a<attempt>/<node>/r<rank>

memory and pids per node level (the attempt's ranks on one node share its --mem and the job's
pids limit), devices and CPU per rank. `private_tmp.py` gives each attempt and node its own /tmp
and /dev/shm (a tmpfs the ranks bind in mount namespaces of their own). The rank runner writes the command's pid into the rank's cgroups between fork and exec, so
every descendant is inside before any code of the job runs; the runner itself stays outside.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from trainyard.backends.contain import mounts
from trainyard.backends.contain.cgroup1 import Cgroup1
from trainyard.backends.contain.cgroup2 import Cgroup2
from trainyard.backends.contain.common import MODES, ContainmentError, Needs, RankNeeds, attempt_key
from trainyard.backends.contain.subreaper import Subreaper

ENV = "TRAINYARD_CONTAINMENT"


class Driver(Protocol):
    mode: str

    def summary(self) -> str: ...

    def prepare(self, needs: Needs) -> dict: ...

    def sweep(self, keep: set[str]) -> list[str]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Choice:
    driver: Driver
    asked: str  # auto, or the mode asked for by name
    fallback: str = ""  # why `auto` did not take a better mode ("" when it took the best)

    @property
    def mode(self) -> str:
        return self.driver.mode

    def line(self) -> str:
        """The plane's start-up line: the mode, where, what it constrains, and why not better."""
        out = f"containment: {self.driver.summary()}"
        return out + (f" [fallback: {self.fallback}]" if self.fallback else "")


def choose(mode: str | None, data_dir: str, found: mounts.Hierarchies | None = None) -> Choice:
    """The driver for `mode` (None: $TRAINYARD_CONTAINMENT, else auto).

    Raises:
        ContainmentError: an unknown mode, or a named mode that cannot work here (says why).
    """
    asked = (mode or os.environ.get(ENV) or "auto").strip().lower()
    if asked not in ("auto", *MODES):
        raise ContainmentError(f"containment: unknown mode {asked!r} (one of auto, {', '.join(MODES)})")
    found = found if found is not None else mounts.find()
    data_dir = str(data_dir)
    if asked == "cgroup2":
        return Choice(Cgroup2(found.v2, data_dir), asked)
    if asked == "cgroup1":
        return Choice(Cgroup1(found, data_dir), asked)
    if asked == "subreaper":
        return Choice(Subreaper(), asked)
    why: list[str] = []
    v2: Cgroup2 | None = None
    try:
        v2 = Cgroup2(found.v2, data_dir)
        missing = sorted({"memory", "cpu", "pids"} - v2.controllers)
        if not missing:
            return Choice(v2, asked)
        why.append(f"cgroup2 lacks the {', '.join(missing)} controller(s)")
    except ContainmentError as e:
        why.append(str(e))
    try:
        v1 = Cgroup1(found, data_dir)
    except ContainmentError as e:
        why.append(str(e))
    else:
        if v2 is not None:
            v2.close()
        return Choice(v1, asked, "; ".join(why))
    if v2 is not None:
        return Choice(v2, asked, "; ".join(why) + "; cgroup2 used for tracking only")
    return Choice(Subreaper(), asked, "; ".join(why))


__all__ = ["ENV", "Choice", "ContainmentError", "Driver", "Needs", "RankNeeds", "attempt_key", "choose"]
