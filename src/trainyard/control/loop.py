"""The control loop: one pass reads the backend's facts once, then runs the steps in order.

    facts = poll() + inventory()          what runs and which nodes are healthy, read once
    1.  reconcile     (control/reconcile.py)    store ↔ backend: orphans, lost launches, outcomes
    1b. node watch    (control/node_watch.py)   node health: down, suspect, remediate, return; hung jobs
    2.  stops         (control/stops.py)        time limits; notice → SIGTERM → SIGKILL
    3.  dependencies  (control/dependencies.py) `--dependency` met or never
    4.  schedule      (control/schedule.py)     snapshot → policy.cycle() → preempt, start, reasons

Each step is its own object with the state it keeps between passes, sharing one `LoopContext`;
the transitions they make (start, stop, end an attempt, requeue, finish) are the functions of
`services/transitions.py`. The loop can be killed at any instruction: every step commits its
decisions to the store before acting on the backend, and the next pass's reconcile makes the two
agree again (DESIGN rule 3).

It runs on its own thread: `wake()` (after any change through the API) or a short tick. Tests of
the loop's own logic call `step()` directly with a fake backend and a fake clock.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

from trainyard.backends.base import Backend
from trainyard.control.context import Facts, LoopContext, LoopParams, LoopStats
from trainyard.control.dependencies import Dependencies
from trainyard.control.frozen import FrozenRanks
from trainyard.control.health import HealthChecker
from trainyard.control.node_watch import NodeWatch
from trainyard.control.reconcile import Reconciler
from trainyard.control.schedule import Scheduler
from trainyard.control.stops import Stops
from trainyard.sched.policy import Policy
from trainyard.services.config import ConfigCache
from trainyard.spec import HealthSpec
from trainyard.store.db import Store

__all__ = ["ControlLoop", "LoopParams", "LoopStats"]

log = logging.getLogger("trainyard.loop")


class ControlLoop:
    def __init__(self, store: Store, backend: Backend, data_dir: Path, configs: ConfigCache,
                 write_lock: threading.RLock, *, policy: Policy | None = None, params: LoopParams | None = None,
                 api_url: str | None = None, clock: Callable[[], float] = time.time):
        """`policy`: a fixed policy; None (the plane's default) runs the one the configuration in
        force names. `clock`: the time every step judges by (a fake one in the loop's tests)."""
        self.ctx = ctx = LoopContext(store, backend, Path(data_dir), configs, write_lock, params or LoopParams(),
                                     clock, api_url)
        self.stats = LoopStats()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # a finished round wakes the loop: a node that just passed takes its work at once
        self.health = HealthChecker(ctx.data_dir, self._health_spec, self._node_names,
                                    on_round=lambda node, context: self.wake())
        frozen = FrozenRanks(ctx.params.hung_after_s)
        self.reconcile = Reconciler(ctx, frozen)
        self.node_watch = NodeWatch(ctx, self.health, frozen)
        self.stops = Stops(ctx)
        self.dependencies = Dependencies(ctx)
        self.scheduler = Scheduler(ctx, self.health, policy)

    @property
    def api_url(self) -> str | None:
        return self.ctx.api_url

    @api_url.setter
    def api_url(self, url: str | None) -> None:
        self.ctx.api_url = url

    def _health_spec(self) -> HealthSpec:
        with self.ctx.store.session() as s:
            return self.ctx.configs.current(s).spec.health

    def _node_names(self) -> list[str]:
        with self.ctx.store.session() as s:
            return [n.name for n in self.ctx.configs.current(s).nodes]

    # -- thread ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainyard-loop", daemon=True)
        self._thread.start()
        self.health.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.health.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                self.step()
            except Exception as e:  # the loop must outlive any one bad pass; the next one retries
                self.stats.errors += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"
                log.exception("control loop pass failed")
            took = time.perf_counter() - t0
            self.stats.last_step_ms = took * 1000
            self._wake.wait(self.ctx.params.tick_s)
            self._wake.clear()
            # Wakes closer together than this are merged into one pass. A pass that took long (many
            # pending jobs) is followed by a pause twice as long, so that under a burst of API calls
            # the loop takes at most a third of the interpreter and requests stay fast.
            self._stop.wait(max(self.ctx.params.min_interval_s, 2 * took))

    # -- one pass --------------------------------------------------------------------------------

    def step(self) -> None:
        ctx = self.ctx
        now = ctx.clock()
        facts = Facts(ctx.backend.poll(), ctx.backend.inventory())
        self.reconcile.run(facts, now)
        self.node_watch.run(facts, now)
        self.stops.run(now)
        self.dependencies.run(now)
        self.scheduler.run(facts, ctx.clock())
        self.stats.steps += 1
