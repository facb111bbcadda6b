"""The telemetry sampler: every node's GPUs, read beside the loop and kept per job (issue 39;
docs/control-plane.md, "GPU telemetry").

A supervised thread (like retention and the storage meter) that every `telemetry.interval`
(default 1 s):

  1. reads `Backend.gpu_readings()` (the node agents: NVML, or the local backend's emulation);
  2. joins each reading to the attempts holding that GPU *by placement*: the store's running
     attempts (`attempts.ended_at` unset) and their `placement` rows ({node, gpus}) are the
     truth of who holds what (a GPU shared by GPU-memory placements counts for each holder; a
     reading no running attempt holds is dropped);
  3. adds it to that (attempt, GPU)'s period (`services.telemetry.Period`);
  4. for each running attempt with no `first_output_at`, looks at its rank logs through jobfs
     (control/lifecycle/first_output.py) and sets it when one has output of the attempt.

When the reconcile step ends an attempt it first writes that attempt's readings not yet flushed
(`flush_attempt`, in the step's own transaction), so the attempt's ledger judges its last period
too: a bare job's idle tail, or the whole of an attempt shorter than a flush.

Every `telemetry.flush` (default 15 s) it writes the periods in one short transaction under the
plane's lock (`services.telemetry.flush`: one `gpu_samples` row per GPU, the attempts'
`gpu_summary`, each job's rows kept to `telemetry.max_rows_per_job`). Readings not yet flushed
are lost if the plane dies: at most one period of samples, never a summary half-written.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select

from trainyard.backends.base import Backend
from trainyard.contracts import JobDir
from trainyard.control.lifecycle import first_output
from trainyard.control.lifecycle.supervise import BackgroundWork
from trainyard.services import telemetry
from trainyard.services.config import ConfigCache
from trainyard.services.ranks import ranks_for
from trainyard.spec.telemetry import TelemetrySpec
from trainyard.store.db import Store
from trainyard.store.models import AttemptRow, JobRow

log = logging.getLogger("trainyard.telemetry")


@dataclass(frozen=True)
class Running:
    """A running attempt as the sampler needs it."""

    job_id: int
    attempt: int
    started_at: float
    placement: list[dict[str, Any]]
    job_dir: JobDir
    ranks: int  # rank logs to look at for its first output (a batch script: its one)
    has_output: bool


class Telemetry(BackgroundWork):
    thread_name = "trainyard-telemetry"

    def __init__(self, store: Store, configs: ConfigCache, lock: threading.RLock, backend: Backend,
                 data_dir: Path, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.store, self.configs, self.lock, self.backend = store, configs, lock, backend
        self.data_dir, self.clock = data_dir, clock
        self._periods: dict[tuple[int, int, str, int], telemetry.Period] = {}
        self._mu = threading.Lock()  # `_periods`: this thread adds, the loop's reconcile step takes an attempt's
        self._since: float | None = None  # the start of the period being gathered
        self._round: float | None = None  # the previous round's time: what a reading speaks for begins there
        self.samples = self.rows = 0  # readings joined to a job; rows written

    def spec(self) -> TelemetrySpec:
        with self.store.session() as s:
            return self.configs.current(s).spec.telemetry

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            spec = self.spec()
            if spec.enabled:
                now = self.clock()
                self.sample(now)
                if self._since is not None and now - self._since >= spec.flush:
                    self.flush(now, spec.max_rows_per_job)
            stop.wait(spec.interval)

    def sample(self, now: float) -> int:
        """One round (steps 1-4 of the module docstring); returns the readings joined to a job."""
        if self._since is None:
            self._since = now
        read = getattr(self.backend, "gpu_readings", None)  # optional: a backend of another package may lack it
        readings = read() if read is not None else []
        running = self.running()
        holders: dict[tuple[str, int], list[Running]] = {}
        for r in running:
            for part in r.placement:
                for g in part.get("gpus") or ():
                    holders.setdefault((str(part["node"]), int(g)), []).append(r)
        # A reading speaks for the time since the previous round (the emulation's rate is taken
        # between two rounds; NVML's rate is of its last second), never for the time before: an
        # attempt's first period begins there, not at its start, or its data staging and launch
        # would read as GPU activity in a bare job's ledger (its `startup` would be 0).
        since_round = max(self._since, self._round if self._round is not None else self._since)
        self._round = now
        joined = 0
        for rd in readings:
            for r in holders.get((rd.node, rd.gpu), ()):
                key = (r.job_id, r.attempt, rd.node, rd.gpu)
                begins = max(since_round, r.started_at)
                with self._mu:
                    p = self._periods.get(key)
                    if p is None:
                        p = self._periods[key] = telemetry.Period(r.job_id, r.attempt, rd.node, rd.gpu,
                                                                  begins, now, rd.source)
                    p.add(rd.util, rd.mem_mib, rd.power_w, rd.temp_c, now)
                joined += 1
        self.samples += joined
        self._first_outputs([r for r in running if not r.has_output], now)
        return joined

    def flush(self, now: float, max_rows: int) -> int:
        """Write the periods gathered so far; returns the rows written."""
        with self._mu:
            periods = [p for p in self._periods.values() if p.samples]
            self._periods, self._since = {}, now
        if not periods:
            return 0
        with self.lock, self.store.session.begin() as s:
            merged = telemetry.flush(s, periods, now, max_rows)
        self.rows += len(periods)
        if merged:
            log.debug("telemetry: %d rows merged to keep jobs within %d rows", merged, max_rows)
        return len(periods)

    def flush_attempt(self, s: Any, job_id: int, attempt: int, now: float) -> int:
        """Write the attempt's readings not yet flushed into `s` (the caller's transaction, which
        holds the plane's lock: the reconcile step ending it); returns the rows written."""
        with self._mu:
            keys = [k for k in self._periods if k[0] == job_id and k[1] == attempt]
            mine = [p for k in keys if (p := self._periods.pop(k)).samples]
        if not mine:
            return 0
        telemetry.flush(s, mine, now, self.configs.current(s).spec.telemetry.max_rows_per_job)
        self.rows += len(mine)
        return len(mine)

    def running(self) -> list[Running]:
        with self.store.session() as s:
            rows = s.execute(select(AttemptRow.job_id, AttemptRow.attempt, AttemptRow.started_at,
                                    AttemptRow.placement, AttemptRow.first_output_at, JobRow.dir_key,
                                    JobRow.tasks_per_node, JobRow.script.is_not(None).label("batch"))
                             .join(JobRow, JobRow.id == AttemptRow.job_id)
                             .where(AttemptRow.ended_at.is_(None))).all()
        return [Running(r.job_id, r.attempt, r.started_at, list(r.placement or []),
                        JobDir.of(self.data_dir, r.job_id, r.dir_key),
                        1 if r.batch else len(ranks_for(r.placement or [], r.tasks_per_node)),
                        r.first_output_at is not None) for r in rows]

    def _first_outputs(self, quiet: list[Running], now: float) -> None:
        found = [r for r in quiet if first_output.printed(r.job_dir, r.ranks, r.attempt, r.started_at)]
        if not found:
            return
        with self.lock, self.store.session.begin() as s:
            for r in found:
                row = s.execute(select(AttemptRow).where(AttemptRow.job_id == r.job_id,
                                                         AttemptRow.attempt == r.attempt)).scalar_one_or_none()
                if row is not None and row.first_output_at is None:
                    row.first_output_at = now
