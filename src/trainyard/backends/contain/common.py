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
    `gpu_devices`: every GPU device of the machine; a rank is denied those not in its own."""

    key: str
    ranks: tuple[RankNeeds, ...]
    node_mem_mib: Mapping[str, int | None] = field(default_factory=dict)
    gpu_devices: tuple[tuple[int, int], ...] = ()


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
