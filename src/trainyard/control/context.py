"""What every step of the control loop shares: its parameters, its wiring and one pass's facts.

`LoopContext` is the wiring (store, write lock, configuration cache, backend, data dir, clock); a
step keeps it and whatever state of its own it needs between passes. `Facts` is what the backend
reported at the start of a pass, read once by the orchestrator (`control/loop.py`) so that every
step of the pass judges the same picture.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from trainyard.backends.base import AttemptState, Backend, NodeInfo
from trainyard.contracts import JobDir
from trainyard.services.config import ConfigCache
from trainyard.store.db import Store

HEALTH = "health"  # the actor of node-health events, and the mark of a node the loop took down itself
HEALTH_MARK = "(health)"  # ends the reason of a node the checks found failing


@dataclass
class LoopParams:
    tick_s: float = 1.0
    kill_wait_s: float = 10.0  # SIGTERM → SIGKILL (Slurm's KillWait)
    min_interval_s: float = 0.05  # wakes closer together than this are merged
    retry_backoff_s: float = 10.0  # first automatic retry waits this long, then twice as long each time
    hung_after_s: float = 30.0  # a rank stopped (frozen) this long makes its job hung


@dataclass
class LoopStats:
    steps: int = 0
    last_step_ms: float = 0.0
    errors: int = 0
    last_error: str = ""
    started: list[str] = field(default_factory=list)


@dataclass
class LoopContext:
    store: Store
    backend: Backend
    data_dir: Path
    configs: ConfigCache
    lock: threading.RLock  # the plane's write lock: one writer at a time (API and loop)
    params: LoopParams
    clock: Callable[[], float]
    api_url: str | None = None

    def job_dir(self, job_id: int) -> JobDir:
        return JobDir.of(self.data_dir, job_id)


@dataclass(frozen=True)
class Facts:
    """The backend's report at the start of one pass: every attempt it knows, and its nodes."""

    attempts: list[AttemptState]
    inventory: list[NodeInfo]

    @property
    def unhealthy(self) -> list[str]:
        return [n.name for n in self.inventory if not n.healthy]
