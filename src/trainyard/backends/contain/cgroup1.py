"""cgroup v1 driver: one directory per attempt in each of the freezer, pids, memory, devices and
cpu hierarchies (what Slurm's proctrack/cgroup and task/cgroup use on v1 machines).

    freezer  tracking and race-free signalling: freeze the attempt, signal each pid, thaw
    pids     pids.max on the node level: the job's pids limit, shared by its ranks there (a fork
             past it fails with EAGAIN, counted in the forking rank's pids.events)
    memory   memory.limit_in_bytes (and memsw, so swap is no way out) on the node level: the
             attempt's ranks on a node share the node's --mem; the kernel OOM-kills inside it and
             each rank's memory.oom_control counts its own kills (v1 counts at the victim's cgroup)
    devices  per rank, `c 195:<minor>` of every GPU the rank was not given is denied (Slurm's
             ConstrainDevices): opening another rank's GPU fails with EPERM
    cpu      per rank, CFS bandwidth cpu.cfs_quota_us = cpus x cpu.cfs_period_us
    cpuacct  accounting only: cpuacct.usage of the attempt's directory is the CPU time all its
             processes used (`contain.usage`: how busy an interactive allocation is); where cpu
             and cpuacct are mounted together (`cpu,cpuacct`) it is the cpu directory itself

Only the freezer is required (without it v1 cannot track an attempt); each other hierarchy is
used when it is mounted and writable, and `summary` says which. A job whose limits need one that
is missing is refused at launch with a `ContainmentError` naming the option, never run unlimited.
"""

from __future__ import annotations

import os
import signal as _signal
import time

from trainyard.backends.contain import cgroupfs
from trainyard.backends.contain.common import ContainmentError, Needs, attempt_key_names, base_name, pids_plan
from trainyard.backends.contain.mounts import Hierarchies

USED = ("freezer", "pids", "memory", "devices", "cpu", "cpuacct")
CFS_PERIOD_US = 100_000


class Cgroup1:
    mode = "cgroup1"

    def __init__(self, found: Hierarchies, data_dir: str) -> None:
        """Raises ContainmentError when the freezer hierarchy is not mounted or not writable."""
        self.base: dict[str, str] = {}
        problems = []
        for c in USED:
            own = found.v1.get(c)
            if own is None:
                problems.append(f"{c}: not mounted")
                continue
            d = os.path.join(own, "trainyard", base_name(data_dir))
            if d in self.base.values():
                continue  # co-mounted with one already used (cpu,cpuacct): one directory serves both
            try:
                cgroupfs.make(d)
            except OSError as e:
                problems.append(f"{c}: cannot create {d}: {e.strerror}")
                continue
            self.base[c] = d
        self.problems = problems
        if "freezer" not in self.base:
            self.close()
            raise ContainmentError("cgroup1 needs a writable freezer hierarchy: " + "; ".join(problems))
        self.close()  # made to prove we can; made again by the first attempt (no empty dirs left behind)

    def summary(self) -> str:
        used = ", ".join(self.base)
        pids = "pids.max per node" if "pids" in self.base else "pids not limited (no pids hierarchy)"
        line = f"cgroup1 ({used}) under {self.base['freezer']}; {pids}"
        return line + (f"; not used: {'; '.join(self.problems)}" if self.problems else "")

    def prepare(self, needs: Needs) -> dict:
        """Make the attempt's cgroups with their limits; the record goes into attempt.json.

        Raises:
            ContainmentError: a limit needs a hierarchy that is not there, or a write failed.
        """
        wants_mem = any(v is not None for v in needs.node_mem_mib.values())
        if wants_mem and "memory" not in self.base:
            raise ContainmentError("--mem/--mem-per-gpu need the memory cgroup, which is not usable here "
                                   f"({'; '.join(self.problems)})")
        if any(r.cpus for r in needs.ranks) and "cpu" not in self.base:
            raise ContainmentError("--cpus-per-task needs the cpu cgroup, which is not usable here "
                                   f"({'; '.join(self.problems)})")
        top = {c: os.path.join(b, needs.key) for c, b in self.base.items()}
        record: dict = {"mode": self.mode, "dirs": sorted(top.values()), "freeze": top["freezer"], "ranks": {}}
        try:
            for node in sorted({r.node for r in needs.ranks}):
                limit = needs.node_mem_mib.get(node)
                if "memory" in top:
                    d = os.path.join(top["memory"], node)
                    cgroupfs.make(d)
                    if limit is not None:
                        cgroupfs.write(os.path.join(d, "memory.limit_in_bytes"), str(limit * 2**20))
                        swap = os.path.join(d, "memory.memsw.limit_in_bytes")
                        if os.path.exists(swap):
                            cgroupfs.write(swap, str(limit * 2**20))
                if "pids" in top and needs.pids_max is not None:
                    d = os.path.join(top["pids"], node)
                    cgroupfs.make(d)
                    cgroupfs.write(os.path.join(d, "pids.max"), str(needs.pids_max))
            for r in needs.ranks:
                dirs = {c: os.path.join(t, r.node, f"r{r.rank}") for c, t in top.items()}
                for d in dirs.values():
                    cgroupfs.make(d)
                if "devices" in dirs:
                    for major, minor in needs.gpu_devices:
                        if (major, minor) not in r.devices:
                            cgroupfs.write(os.path.join(dirs["devices"], "devices.deny"), f"c {major}:{minor} rwm")
                if r.cpus and "cpu" in dirs:
                    cgroupfs.write(os.path.join(dirs["cpu"], "cpu.cfs_period_us"), str(CFS_PERIOD_US))
                    cgroupfs.write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), str(r.cpus * CFS_PERIOD_US))
                record["ranks"][str(r.rank)] = {
                    "mode": self.mode, "join": [dirs[c] for c in dirs], "freezer": dirs["freezer"], "cpus": r.cpus,
                    "memory": dirs.get("memory"),
                    **(pids_plan(dirs["pids"], os.path.dirname(dirs["pids"]), needs.pids_max)
                       if "pids" in dirs and needs.pids_max is not None else {}),
                }
        except OSError as e:
            for d in top.values():
                cgroupfs.remove(d)
            raise ContainmentError(f"cannot set up the attempt's cgroups: {e.filename}: {e.strerror}") from e
        acct = [t for c, t in top.items() if c in ("cpuacct", "cpu") and os.path.exists(os.path.join(t, "cpuacct.usage"))]
        if acct:
            record["cpuacct"] = acct[0]  # the attempt's CPU time, all its ranks (`contain.usage`)
        return record

    def close(self) -> None:
        """Remove our (empty) base directories; one still holding an attempt stays."""
        for d in self.base.values():
            try:
                os.rmdir(d)
            except OSError:
                pass

    def sweep(self, keep: set[str]) -> list[str]:
        """Kill and remove every attempt's cgroups under our base whose key is not in `keep`."""
        swept = []
        for key in attempt_key_names(self.base["freezer"]):
            if key not in keep:
                kill_all(os.path.join(self.base["freezer"], key), timeout_s=10)
                for b in self.base.values():
                    cgroupfs.remove(os.path.join(b, key))
                swept.append(key)
        return swept


def freeze(d: str, timeout_s: float = 2.0) -> None:
    """Freeze the attempt and wait (briefly) for FROZEN; a task in uninterruptible sleep can hold
    it in FREEZING, and then the signal is sent anyway (thaw follows)."""
    state = os.path.join(d, "freezer.state")
    cgroupfs.write(state, "FROZEN")
    deadline = time.monotonic() + timeout_s
    while cgroupfs.read(state).strip() != "FROZEN" and time.monotonic() < deadline:
        time.sleep(0.002)


def thaw(d: str) -> None:
    cgroupfs.write(os.path.join(d, "freezer.state"), "THAWED")


def signal_all(d: str, sig: int) -> None:
    """Freeze the freezer cgroup `d`, signal every member, thaw: nothing can fork between the
    listing and the signal, so no process of it misses the signal."""
    if not os.path.isdir(d):
        return
    try:
        freeze(d)
    except OSError:
        return  # removed meanwhile
    try:
        cgroupfs.kill_each(cgroupfs.procs(d), sig)
    finally:
        try:
            thaw(d)
        except OSError:
            pass


def kill_all(d: str, timeout_s: float) -> set[int]:
    """SIGKILL every member of freezer cgroup `d` until it is empty; returns what is left."""
    deadline = time.monotonic() + timeout_s
    while (left := cgroupfs.procs(d)) and time.monotonic() < deadline:
        signal_all(d, _signal.SIGKILL)
        time.sleep(0.005)
    return left
