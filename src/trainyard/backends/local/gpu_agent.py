"""The local backend's node agent: a reading of every node's GPUs, per call (issue 39, per-GPU
telemetry; `LocalBackend.gpu_readings`, sampled by control/lifecycle/telemetry.py).

Two sources, chosen per node on every call:

    nvml      a node that is a slice of this machine's real GPUs, while NVML answers for them:
              each GPU's own utilization, memory in use, power and temperature
              (`local.gpu_use.read`), held or not
    emulated  every other node (emulated GPUs, or NVML silent): the GPUs some running rank holds,
              read from that rank's real activity, so that every path but the NVML read runs here

The emulation, per *holder* (a rank with a cgroup of its own; a batch attempt, whose script and
srun tasks share one cell, is one holder of all its allocation's GPUs):

    util      the holder's CPU rate (the difference of two CPU-time readings of its cgroup,
              `contain.usage.dir_seconds`, or of its processes in the subreaper mode) as a
              percent of one core, shared evenly by its GPUs, at most 100
    mem_mib   the resident memory of its processes (/proc/<pid>/statm), shared evenly by its
              GPUs, at most the GPU's configured memory
    power_w   IDLE_W + util/100 x (TDP_W - IDLE_W)
    temp_c    AMBIENT_C + C_PER_W x power_w

A holder seen for the first time has no rate yet and gives no reading until the next call. Two
attempts sharing a GPU (GPU-memory placements) add up on it (util capped at 100), as the one GPU
would read; which job holds a GPU is the plane's join (by placement), never this module's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard import jobfs
from trainyard.backends.base import GpuReading, NodeInfo
from trainyard.backends.contain import cgroupfs, subreaper
from trainyard.backends.contain import usage as contain_usage
from trainyard.backends.local import gpu_use
from trainyard.backends.rundir import procfs

EMULATED_MODEL = "emulated"  # as backends/local/backend.py names emulated GPUs
# An A100 SXM's board figures, rounded: ~60 W idle, 400 W at full load; 30 °C air at the inlet
# and ~0.1 °C per W above it put a busy GPU near 70 °C, as such boards run.
IDLE_W = 60.0
TDP_W = 400.0
AMBIENT_C = 30.0
C_PER_W = 0.1
PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


@dataclass(frozen=True)
class Holder:
    """What the emulation reads for some GPUs: `key` (job, attempt, rank; rank -1: the whole
    attempt), the (node, GPU index) it holds, its CPU seconds so far (None: cannot tell) and
    the resident memory of its processes."""

    key: tuple[int, int, int]
    gpus: tuple[tuple[str, int], ...]
    cpu_s: float | None
    rss_mib: float


class ProcTree:
    """Every live process's children, from one scan of /proc made on first use (the subreaper mode
    finds a rank's processes as its runner's descendants: one scan per reading, not one per rank)."""

    def __init__(self) -> None:
        self._kids: dict[int, list[int]] | None = None

    def descendants(self, roots: list[int]) -> set[int]:
        if self._kids is None:
            self._kids = subreaper.children()
        found: set[int] = set()
        todo = [k for r in roots for k in self._kids.get(r, ())]
        while todo:
            p = todo.pop()
            if p not in found:
                found.add(p)
                todo.extend(self._kids.get(p, ()))
        return found


def holders(job_id: int, attempt: int, run_dir: Path, cell: dict | None, tree: ProcTree | None = None) -> list[Holder]:
    """The holders of one attempt, from its attempt.json (read through no link) and its cell;
    `tree`: the reading's one scan of /proc, shared by the attempts (made here when None)."""
    tree = tree if tree is not None else ProcTree()
    meta = jobfs.read_record(run_dir / "attempt.json") or {}
    plans: Mapping[str, Any] = meta.get("contain") or {}
    if meta.get("batch") or cell is None:
        gpus = tuple((str(r["node"]), int(g)) for r in meta.get("allocation") or meta.get("ranks") or []
                     for g in r.get("gpus") or [])
        runners = _runners(run_dir, [int(r["rank"]) for r in meta.get("ranks") or []])
        pids = _cell_pids(cell, runners, tree)
        cpu = contain_usage.cpu_seconds(cell, runners) if cell is not None else None
        return [Holder((job_id, attempt, -1), gpus, cpu, _rss_mib(pids))] if gpus else []
    out = []
    for r in meta.get("ranks") or []:
        gpus = tuple((str(r["node"]), int(g)) for g in r.get("gpus") or [])
        if not gpus:
            continue
        rank = int(r["rank"])
        plan = plans.get(str(rank)) or {}
        if cell.get("mode") == "subreaper":
            runners = _runners(run_dir, [rank])
            pids = tree.descendants(runners) if runners else set()
            cpu = contain_usage.proc_seconds(pids, runners) if runners else None
        else:
            pids = cgroupfs.procs(plan["freezer"]) if plan.get("freezer") and os.path.isdir(plan["freezer"]) else set()
            cpu = next((s for d in plan.get("join") or [] if (s := contain_usage.dir_seconds(d)) is not None), None)
        out.append(Holder((job_id, attempt, rank), gpus, cpu, _rss_mib(pids)))
    return out


class NodeAgent:
    """Reads every node's GPUs (see the module docstring); keeps each holder's last CPU reading
    between calls. `nvml`: returns pynvml or None (tests pass a pynvml-shaped object)."""

    def __init__(self, nodes: list[NodeInfo], offsets: Mapping[str, int],
                 nvml: Callable[[], Any] = gpu_use.nvml, clock: Callable[[], float] = time.monotonic) -> None:
        self.nodes = list(nodes)
        self.offsets = dict(offsets)
        self.nvml, self.clock = nvml, clock
        self._last: dict[tuple[int, int, int], tuple[float, float]] = {}  # key -> (time, cpu seconds)

    def read(self, held: list[Holder]) -> list[GpuReading]:
        """One reading per GPU: NVML's for the nodes it answers for, the emulation's for the GPUs
        `held` holds on the others."""
        now = self.clock()
        nv = self.nvml() if any(n.gpu_model != EMULATED_MODEL for n in self.nodes) else None
        out: list[GpuReading] = []
        real: set[str] = set()
        for n in self.nodes:
            if nv is not None and n.gpu_model != EMULATED_MODEL:
                got = [(g, gpu_use.read(self.offsets.get(n.name, 0) + g, nv)) for g in range(n.gpus)]
                if any(r is not None for _, r in got):
                    real.add(n.name)
                    out += [GpuReading(n.name, g, r.util, r.mem_mib, r.power_w, r.temp_c, "nvml")
                            for g, r in got if r is not None]
        out += self._emulate([h for h in held if any(node not in real for node, _ in h.gpus)], now, real)
        return out

    def _emulate(self, held: list[Holder], now: float, real: set[str]) -> list[GpuReading]:
        mem_of = {n.name: float(n.gpu_mem_mib) for n in self.nodes}
        util: dict[tuple[str, int], float] = {}
        mem: dict[tuple[str, int], float] = {}
        seen = set()
        for h in held:
            seen.add(h.key)
            if h.cpu_s is None:
                continue
            last = self._last.get(h.key)
            self._last[h.key] = (now, h.cpu_s)
            if last is None or now <= last[0]:
                continue  # first sight: no rate yet
            rate = max(0.0, h.cpu_s - last[1]) / (now - last[0])  # cores; a lower reading: counted anew
            share = 100.0 * rate / len(h.gpus)
            for g in h.gpus:
                if g[0] in real:
                    continue
                util[g] = util.get(g, 0.0) + share
                mem[g] = mem.get(g, 0.0) + h.rss_mib / len(h.gpus)
        for key in [k for k in self._last if k not in seen]:
            del self._last[key]  # an attempt gone: forget it
        out = []
        for (node, gpu), u in sorted(util.items()):
            u = min(100.0, u)
            power = IDLE_W + u / 100.0 * (TDP_W - IDLE_W)
            out.append(GpuReading(node, gpu, round(u, 2), round(min(mem[(node, gpu)], mem_of.get(node, 0.0)), 1),
                                  round(power, 1), round(AMBIENT_C + C_PER_W * power, 1), "emulated"))
        return out


def _runners(run_dir: Path, ranks: list[int]) -> list[int]:
    """The live runners of these ranks (their records' pids, not recycled ones)."""
    out = []
    for r in ranks:
        rec = jobfs.read_record(run_dir / f"rank-{r}.json")
        if rec and procfs.is_alive(rec["pid"], rec["start_time"]):
            out.append(int(rec["pid"]))
    return out


def _cell_pids(cell: dict | None, runners: list[int], tree: ProcTree) -> set[int]:
    if cell is None:
        return set()
    if cell.get("mode") == "subreaper":
        return tree.descendants(runners) if runners else set()
    top = cell.get("freeze")
    return cgroupfs.procs(top) if top and os.path.isdir(top) else set()


def _rss_mib(pids: set[int]) -> float:
    """Resident memory of these processes (statm's second field, pages), MiB; gone ones count 0."""
    pages = 0
    for p in pids:
        try:
            pages += int(cgroupfs.read(f"/proc/{p}/statm").split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return pages * PAGE_MIB
