"""What every step of the control loop shares: its parameters, its wiring and one pass's facts.

`LoopContext` is the wiring (store, write lock, configuration cache, backend, data dir, clock); a
step keeps it and whatever state of its own it needs between passes. `Facts` is what the backend
reported at the start of a pass, read once by the orchestrator (`control/loop/orchestrator.py`) so that every
step of the pass judges the same picture.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainyard.backends.base import AttemptState, Backend, NodeInfo
from trainyard.contracts import JobDir
from trainyard.services.config import ConfigCache
from trainyard.services.sessions import Sessions
from trainyard.store.db import Store
from trainyard.store.models import JobRow

RECENT_PASSES = 2000  # how many pass times LoopStats keeps
HEALTH = "health"  # the actor of node-health events, and the mark of a node the loop took down itself
HEALTH_MARK = "(health)"  # ends the reason of a node the checks found failing


@dataclass
class LoopParams:
    tick_s: float = 1.0
    kill_wait_s: float = 10.0  # SIGTERM → SIGKILL (Slurm's KillWait)
    min_interval_s: float = 0.05  # wakes closer together than this are merged
    retry_backoff_s: float = 10.0  # first automatic retry waits this long, then twice as long each time
    hung_after_s: float = 30.0  # a rank stopped (frozen) this long makes its job hung
    pass_budget_s: float = 1.0  # a pass longer than this is logged, with each step's share
    max_pause_s: float = 2.0  # the longest pause after a slow pass (see ControlLoop._run)


@dataclass
class LoopStats:
    """What the loop's passes did: counts for /healthz and the metrics, the recent passes' times."""

    steps: int = 0
    last_step_ms: float = 0.0
    errors: int = 0
    last_error: str = ""
    started: list[str] = field(default_factory=list)
    last_pass_at: float | None = None  # time.monotonic() at the end of the newest pass
    recent_pass_s: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_PASSES))
    slow_passes: int = 0  # passes over the budget
    passes: int = 0  # passes timed, and their seconds in all (the metrics' summary count and sum)
    total_pass_s: float = 0.0
    last_phases: dict[str, float] = field(default_factory=dict)  # each step's seconds in the newest pass

    def pass_done(self, took_s: float, budget_s: float = 1.0) -> None:
        self.last_step_ms = took_s * 1000
        self.last_pass_at = time.monotonic()
        self.recent_pass_s.append(took_s)
        self.passes += 1
        self.total_pass_s += took_s
        if took_s > budget_s:
            self.slow_passes += 1

    def pass_summary(self) -> dict[str, float | int]:
        """p50, p99 and max of the recent passes, in ms (what /healthz shows)."""
        xs = sorted(self.recent_pass_s)
        if not xs:
            return {"count": 0}
        pick = lambda q: round(xs[min(len(xs) - 1, int(q * len(xs)))] * 1000, 1)  # noqa: E731
        return {"count": len(xs), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": round(xs[-1] * 1000, 1)}


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
    # what keeps new attempts from starting on disk grounds (`control/lifecycle/storage.py`'s `Holds`): a
    # team over its storage quota, the reserve crossed; None: nothing measured (tests of the loop)
    holds: Callable[[], Any] | None = None
    fingerprints: Any = None  # control.loop.fingerprints.Fingerprints: the nodes' environments, for bare gangs
    # who is attached to each job (the plane's `sessions`, services/sessions.py); None: nothing
    # attaches (tests of the loop without an API), and interactive allocations are not watched
    sessions: Sessions | None = None
    # the telemetry sampler's readings of an attempt not yet written, written into the given session
    # (job id, attempt, now): the reconcile step calls it before it splits an ended attempt's ledger,
    # so its last period counts (control/lifecycle/telemetry.py `flush_attempt`); None: no sampler
    flush_telemetry: Callable[[Any, int, int, float], object] | None = None

    def job_dir(self, j: JobRow) -> JobDir:
        """The job's directory (`contracts.JobDir`, keyed by the row's `dir_key`)."""
        return JobDir.of(self.data_dir, j.id, j.dir_key)


@dataclass(frozen=True)
class Facts:
    """The backend's report at the start of one pass: every attempt it knows, and its nodes."""

    attempts: list[AttemptState]
    inventory: list[NodeInfo]
    # attempts being launched when the poll began (`control/loop/launch_threads.py`): one the poll did not
    # report may be still starting, not never launched
    launching: frozenset[tuple[int, int]] = frozenset()

    @property
    def unhealthy(self) -> list[str]:
        return [n.name for n in self.inventory if not n.healthy]
