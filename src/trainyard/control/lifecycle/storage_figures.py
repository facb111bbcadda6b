"""What the storage meter (control/lifecycle/storage.py) knows of one job dir and one file system,
and the kinds a job dir's bytes are sorted into for `yard storage` (contracts.JobDir's layout:
`checkpoints/`, `logs/`, `metrics/`, and the rest: the script, exports, run state, the owner file)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainyard.services.storage import KINDS


@dataclass(frozen=True)
class DirUsage:
    """One job dir as last measured; `team` None: no job of the store owns it."""

    name: str
    job_id: int | None
    team: str | None
    user: str | None
    bytes: int
    complete: bool  # False: the walk was cut, `bytes` is an estimate (at least what it counted)
    measured_at: float
    apparent: int = 0  # apparent bytes (`du -sbx`), as counted (all of them once `complete`)
    kinds: tuple[tuple[str, int], ...] = ()  # apparent bytes per kind (`kind_of`), adding up to `apparent`


@dataclass(frozen=True)
class FsUsage:
    path: str
    size: int
    free: int
    reserve: int
    inodes: int
    inodes_free: int
    inodes_reserve: int

    @property
    def low(self) -> bool:
        return self.free < self.reserve or (self.inodes > 0 and self.inodes_free < self.inodes_reserve)



def kind_of(top: str) -> str:
    """The kind of what a job dir's top-level entry `top` holds (contracts.JobDir's layout)."""
    return top if top in KINDS[:3] else "other"


def kinds_of(by_top: dict[str, int]) -> tuple[tuple[str, int], ...]:
    out = dict.fromkeys(KINDS, 0)
    for top, n in by_top.items():
        out[kind_of(top)] += n
    return tuple(out.items())



def fs_dict(f: FsUsage) -> dict[str, Any]:
    return {"path": f.path, "size": f.size, "free": f.free, "reserve": f.reserve, "inodes": f.inodes,
            "inodes_free": f.inodes_free, "inodes_reserve": f.inodes_reserve, "low": f.low}
