"""What every containment driver shares: the request, the error, and the names on disk."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MODES = ("cgroup2", "cgroup1", "subreaper")
KEY_RE = re.compile(r"^j\d+\.a\d+$")


class ContainmentError(Exception):
    """Containment cannot be set up as asked; the message says what is missing and where."""


@dataclass(frozen=True)
class RankNeeds:
    """One rank's cell: where it runs, the device numbers it may open, its CPUs."""

    rank: int
    node: str
    devices: tuple[tuple[int, int], ...] = ()  # (major, minor) of the rank's own GPUs
    cpus: int | None = None  # --cpus-per-task


@dataclass(frozen=True)
class Needs:
    """One attempt's cells. `node_mem_mib`: node -> memory limit of all its ranks there (None: none).
    `gpu_devices`: every GPU device of the machine; a rank is denied those not in its own.
    `pids_max`: processes and threads of all its ranks on a node (None: none); a driver without a
    pids controller runs the attempt without one and says so in its summary (the limit is the
    configuration's default for every job, not an option a job asked for)."""

    key: str
    ranks: tuple[RankNeeds, ...]
    node_mem_mib: Mapping[str, int | None] = field(default_factory=dict)
    gpu_devices: tuple[tuple[int, int], ...] = ()
    pids_max: int | None = None


def pids_plan(rank_dir: str, node_dir: str, limit: int) -> dict:
    """What a rank's runner reads to see a fork of its rank refused at the node's pids limit:
    pids.events "max" of the rank's cgroup (where v1, and v2 before Linux 6.13, count a refused
    fork: at the forking task's cgroup) and of the node's (where v2 since 6.13 counts it: at the
    cgroup whose limit was hit), and the node's pids.peak for the record."""
    return {"pids_max": limit, "pids_events": [os.path.join(rank_dir, "pids.events"),
                                               os.path.join(node_dir, "pids.events")],
            "pids_node": node_dir}


def attempt_key(job_id: int, attempt: int) -> str:
    return f"j{job_id}.a{attempt}"


def base_name(data_dir: str) -> str:
    """One directory per data dir under `<own cgroup>/trainyard/`, so two planes on one machine
    (tests, a staging plane) never sweep each other's attempts."""
    return "d" + hashlib.sha1(os.path.realpath(data_dir).encode()).hexdigest()[:12]


def attempt_key_names(base: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(base) if KEY_RE.match(n) and os.path.isdir(os.path.join(base, n)))
    except OSError:
        return []
