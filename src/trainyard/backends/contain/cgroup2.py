"""cgroup v2 driver: one subtree per attempt on the unified hierarchy.

    <base>/j<job>.a<attempt>            cgroup.freeze / cgroup.kill for the whole attempt
    <base>/j<job>.a<attempt>/<node>     memory.max: the node's --mem for the attempt's ranks there;
                                        pids.max: the job's pids limit there (all its ranks)
    <base>/.../<node>/r<rank>           the rank's processes; cpu.max for --cpus-per-task;
                                        memory.events counts the kernel's OOM kills of the rank

The pids limit is the configuration's, on every job: where the `pids` controller is not delegated
the attempt runs without it (`summary` says so) rather than every job being refused.
Tracking needs no controller at all (cgroup.procs, cgroup.freeze and cgroup.kill exist in every
v2 cgroup; cgroup.kill since Linux 5.14), so this driver also serves a unified hierarchy with no
controllers delegated (as on a hybrid machine). Limits need the `memory` and `cpu` controllers in
the plane's own cgroup; they are enabled level by level (cgroup.subtree_control) only when an
attempt asks for them, and a missing or un-enableable one is a `ContainmentError` naming the
option, never an attempt run without its limit. Devices: v2 controls them with an eBPF program
only, which trainyard does not load; `summary` says devices are not constrained (use cgroup1, or
Slurm's ConstrainDevices).
"""

from __future__ import annotations

import os
import signal as _signal
import time

from trainyard.backends.contain import cgroupfs
from trainyard.backends.contain.common import ContainmentError, Needs, attempt_key_names, base_name, pids_plan


class Cgroup2:
    mode = "cgroup2"

    def __init__(self, own: str | None, data_dir: str) -> None:
        """Raises ContainmentError when no cgroup2 is mounted, it is not writable, or the kernel
        lacks cgroup.kill / cgroup.freeze."""
        if own is None:
            raise ContainmentError("cgroup2: no unified hierarchy is mounted")
        self.own = own
        self.base = os.path.join(own, "trainyard", base_name(data_dir))
        try:
            cgroupfs.make(self.base)
        except OSError as e:
            raise ContainmentError(f"cgroup2: cannot create {self.base}: {e.strerror}") from e
        for name in ("cgroup.kill", "cgroup.freeze"):
            if not os.path.exists(os.path.join(self.base, name)):
                raise ContainmentError(f"cgroup2: {self.base} has no {name} (Linux >= 5.14 needed)")
        try:
            self.controllers = set(cgroupfs.read(os.path.join(own, "cgroup.controllers")).split())
        except OSError:
            self.controllers = set()
        self.close()  # made to prove we can; made again by the first attempt (no empty dirs left behind)

    def summary(self) -> str:
        have = sorted(self.controllers & {"memory", "cpu", "pids"})
        limits = ", ".join(have) if have else "none (tracking and kill only)"
        pids = "pids.max per node" if "pids" in self.controllers else "pids not limited (no pids controller)"
        return f"cgroup2 under {self.base}; controllers: {limits}; {pids}; devices not constrained (v2 needs eBPF)"

    def _enable(self, controller: str, down_to: str, option: str) -> None:
        """Enable `controller` in cgroup.subtree_control of every level from the plane's own
        cgroup down to `down_to`, so `down_to`'s children have it."""
        if controller not in self.controllers:
            raise ContainmentError(
                f"{option} needs cgroup2's {controller} controller, which {self.own} does not have "
                f"(it has: {', '.join(sorted(self.controllers)) or 'none'}); delegate it to the plane's cgroup "
                "or use TRAINYARD_CONTAINMENT=cgroup1")
        rel = os.path.relpath(down_to, self.own)
        levels = [self.own] + [os.path.join(self.own, *rel.split(os.sep)[: i + 1]) for i in range(len(rel.split(os.sep)))]
        for d in levels:
            ctl = os.path.join(d, "cgroup.subtree_control")
            if controller in cgroupfs.read(ctl).split():
                continue
            try:
                cgroupfs.write(ctl, f"+{controller}")
            except OSError as e:
                raise ContainmentError(
                    f"{option}: cannot enable the {controller} controller in {d}: {e.strerror}"
                    + (" (a cgroup with processes cannot hand controllers down: run the plane in a leaf of a "
                       "delegated cgroup)" if e.errno == 16 else "")) from e

    def prepare(self, needs: Needs) -> dict:
        """Make the attempt's subtree with its limits; the record goes into attempt.json.

        Raises:
            ContainmentError: a limit needs a controller this cgroup lacks, or a write failed.
        """
        top = os.path.join(self.base, needs.key)
        record: dict = {"mode": self.mode, "dirs": [top], "freeze": top, "ranks": {}}
        wants_mem = any(v is not None for v in needs.node_mem_mib.values())
        wants_cpu = any(r.cpus for r in needs.ranks)
        pids = needs.pids_max if "pids" in self.controllers else None
        try:
            cgroupfs.make(top)
            for node in sorted({r.node for r in needs.ranks}):
                nd = os.path.join(top, node)
                cgroupfs.make(nd)
                if wants_mem:
                    self._enable("memory", nd, "--mem/--mem-per-gpu")
                    if (limit := needs.node_mem_mib.get(node)) is not None:
                        cgroupfs.write(os.path.join(nd, "memory.max"), str(limit * 2**20))
                        if os.path.exists(swap := os.path.join(nd, "memory.swap.max")):
                            cgroupfs.write(swap, "0")
                if wants_cpu:
                    self._enable("cpu", nd, "--cpus-per-task")
                if pids is not None:
                    self._enable("pids", nd, "pids_max")
                    cgroupfs.write(os.path.join(nd, "pids.max"), str(pids))
            for r in needs.ranks:
                d = os.path.join(top, r.node, f"r{r.rank}")
                cgroupfs.make(d)
                if r.cpus:
                    cgroupfs.write(os.path.join(d, "cpu.max"), f"{r.cpus * 100_000} 100000")
                record["ranks"][str(r.rank)] = {
                    "mode": self.mode, "join": [d], "freezer": d, "kill": d, "cpus": r.cpus,
                    "memory": d if os.path.exists(os.path.join(d, "memory.events")) else None,
                    **(pids_plan(d, os.path.dirname(d), pids) if pids is not None else {}),
                }
        except ContainmentError:
            cgroupfs.remove(top)
            raise
        except OSError as e:
            cgroupfs.remove(top)
            raise ContainmentError(f"cannot set up the attempt's cgroups: {e.filename}: {e.strerror}") from e
        return record

    def close(self) -> None:
        """Remove our (empty) base directory; one still holding an attempt stays."""
        try:
            os.rmdir(self.base)
        except OSError:
            pass

    def sweep(self, keep: set[str]) -> list[str]:
        """Kill and remove every attempt's subtree under our base whose key is not in `keep`."""
        swept = []
        for key in attempt_key_names(self.base):
            if key not in keep:
                kill_all(os.path.join(self.base, key), timeout_s=10)
                cgroupfs.remove(os.path.join(self.base, key))
                swept.append(key)
        return swept


def _frozen(d: str) -> bool:
    for line in cgroupfs.read(os.path.join(d, "cgroup.events")).splitlines():
        if line.startswith("frozen "):
            return line.split()[1] == "1"
    return False


def freeze(d: str, timeout_s: float = 2.0) -> None:
    cgroupfs.write(os.path.join(d, "cgroup.freeze"), "1")
    deadline = time.monotonic() + timeout_s
    while not _frozen(d) and time.monotonic() < deadline:
        time.sleep(0.002)


def thaw(d: str) -> None:
    cgroupfs.write(os.path.join(d, "cgroup.freeze"), "0")


def signal_all(d: str, sig: int) -> None:
    """SIGKILL: cgroup.kill (the kernel kills every member, forks included). Any other signal:
    freeze, signal every member, thaw."""
    if not os.path.isdir(d):
        return
    try:
        if sig == _signal.SIGKILL:
            cgroupfs.write(os.path.join(d, "cgroup.kill"), "1")
            return
        cgroupfs.write(os.path.join(d, "cgroup.freeze"), "1")
    except OSError:
        return  # removed meanwhile
    try:
        deadline = time.monotonic() + 2.0
        while not _frozen(d) and time.monotonic() < deadline:
            time.sleep(0.002)
        cgroupfs.kill_each(cgroupfs.procs(d), sig)
    finally:
        try:
            cgroupfs.write(os.path.join(d, "cgroup.freeze"), "0")
        except OSError:
            pass


def kill_all(d: str, timeout_s: float) -> set[int]:
    """Kill every member of cgroup `d` and wait until it is empty; returns what is left."""
    deadline = time.monotonic() + timeout_s
    while (left := cgroupfs.procs(d)) and time.monotonic() < deadline:
        signal_all(d, _signal.SIGKILL)
        time.sleep(0.005)
    return left
