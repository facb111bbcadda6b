"""The control loop: one pass reads the backend's facts once, then runs the steps in order.

    facts = poll() + inventory()          what runs and which nodes are healthy, read once
    1.  reconcile     (control/loop/reconcile.py)    store ↔ backend: orphans, lost launches, outcomes
    1b. node watch    (control/loop/node_watch.py)   node health: down, suspect, remediate, return; hung jobs
    1c. interactive   (control/loop/interactive.py)  allocations with no one attached past their grace
    1d. idle          (control/loop/idle.py)         idle jobs (the class's `idle:`): warning, then notify,
                                                    requeue or cancel; idle allocations: IdleTimeout
    1e. stragglers    (control/loop/stragglers.py)   slow ranks flagged; a node slow in two jobs suspect,
                                                     speed-checked (control/loop/suspects.py)
    2.  stops         (control/loop/stops.py)        time limits; notice → SIGTERM → SIGKILL
    3.  dependencies  (control/loop/dependencies.py) `--dependency` met or never
    4.  schedule      (control/loop/schedule.py)     snapshot → policy.cycle() → preempt, start, reasons

Each step is its own object with the state it keeps between passes, sharing one `LoopContext`;
the transitions they make (start, stop, end an attempt, requeue, finish) are the functions of
`services/transitions.py`. The loop can be killed at any instruction: every step commits its
decisions to the store before acting on the backend, and the next pass's reconcile makes the two
agree again (design rule 3).

It runs on its own supervised thread (control/lifecycle/supervise.py): `wake()` (after any change through
the API) or a short tick. Each pass is timed (`LoopStats`: the recent passes' durations for
/healthz and the metrics, each step's share of the last one); a pass over `pass_budget_s` is
logged with that breakdown. Tests of the loop's own logic call `step()` directly with a fake
backend and a fake clock.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

from trainyard.backends.base import Backend
from trainyard.control.loop.context import Facts, LoopContext, LoopParams, LoopStats
from trainyard.control.loop.dependencies import Dependencies
from trainyard.control.loop.fingerprints import Fingerprints
from trainyard.control.loop.frozen import FrozenRanks
from trainyard.control.loop.interactive import Interactive
from trainyard.control.loop.idle import IdleJobs
from trainyard.control.health import HealthChecker
from trainyard.control.loop.node_watch import NodeWatch
from trainyard.control.loop.reconcile import Reconciler
from trainyard.control.loop.schedule import Scheduler
from trainyard.control.loop.stops import Stops
from trainyard.control.loop.stragglers import Stragglers
from trainyard.control.loop.suspects import Suspects
from trainyard.control.lifecycle.supervise import Supervised
from trainyard.control.lifecycle.store_audit import SeenRecord
from trainyard.sched.policy import Policy
from trainyard.services.config import ConfigCache
from trainyard.services.sessions import Sessions
from trainyard.spec.models import HealthSpec
from trainyard.spec.pilot import effective_for
from trainyard.store.db import Store

__all__ = ["ControlLoop", "LoopParams", "LoopStats"]

log = logging.getLogger("trainyard.loop")


def rest_after(took: float, waited: float, params: LoopParams) -> float:
    """How much longer to wait before the next pass, after a pass that took `took` seconds and
    a wait of `waited` since it ended (a tick, or less when woken).

    Wakes closer together than `min_interval_s` are merged into one pass. A pass that took long
    (many pending jobs) is followed by a pause twice as long, so that under a burst of API calls the
    loop takes at most a third of the interpreter and requests stay fast; the pause is capped, so a
    slow pass never delays the next start by more than `max_pause_s`. The wait counts towards the
    pause: unwoken, the next pass starts a tick after this one ended (it used to be a tick plus
    twice the pass: passes 1.9 s apart when each took 0.3 s, as on Slurm, where a job's end and a
    preemption's notice wait for the next pass)."""
    pause = min(params.max_pause_s, max(params.min_interval_s, 2 * took))
    return max(0.0, pause - waited)


class ControlLoop:
    def __init__(self, store: Store, backend: Backend, data_dir: Path, configs: ConfigCache,
                 write_lock: threading.RLock, *, policy: Policy | None = None, params: LoopParams | None = None,
                 api_url: str | None = None, clock: Callable[[], float] = time.time,
                 holds: Callable[[], Any] | None = None, sessions: Sessions | None = None):
        """`policy`: a fixed policy; None (the plane's default) runs the one the configuration in
        force names. `clock`: the time every step judges by (a fake one in the loop's tests).
        `holds`: the storage meter's (control/lifecycle/storage.py), read by the schedule step.
        `sessions`: the plane's registry of attached terminals and ports (services/sessions.py)."""
        self.ctx = ctx = LoopContext(store, backend, Path(data_dir), configs, write_lock, params or LoopParams(),
                                     clock, api_url, holds, Fingerprints(backend), sessions)
        self.stats = LoopStats()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: Supervised | None = None
        # a finished round wakes the loop: a node that just passed takes its work at once
        self.health = HealthChecker(ctx.data_dir, self._health_spec, self._node_names,
                                    on_round=lambda node, context: self.wake(), model_of=self._node_model,
                                    cell_of=getattr(ctx.backend, "check_cell", None),  # local: the node's cgroup
                                    node_spec_of=self._node_health)
        frozen = FrozenRanks(ctx.params.hung_after_s)
        self.reconcile = Reconciler(ctx, frozen)
        self.node_watch = NodeWatch(ctx, self.health, frozen)
        self.interactive = Interactive(ctx)
        self.idle = IdleJobs(ctx)
        self.stragglers = Stragglers(ctx, Suspects(ctx, self.health))
        self.stops = Stops(ctx)
        self.dependencies = Dependencies(ctx)
        self.scheduler = Scheduler(ctx, self.health, policy)
        self.seen = SeenRecord(store, ctx.data_dir)

    @property
    def api_url(self) -> str | None:
        return self.ctx.api_url

    @api_url.setter
    def api_url(self, url: str | None) -> None:
        self.ctx.api_url = url

    def _health_spec(self) -> HealthSpec:
        with self.ctx.store.session() as s:
            return self.ctx.configs.current(s).spec.health

    def _node_health(self, node: str) -> HealthSpec:
        """The node's health settings: the pilot's trial on a pilot node (spec/pilot.py)."""
        with self.ctx.store.session() as s:
            return effective_for(self.ctx.configs.current(s).spec, node).health

    def _node_names(self) -> list[str]:
        with self.ctx.store.session() as s:
            return [n.name for n in self.ctx.configs.current(s).nodes]

    def _node_model(self, name: str) -> str | None:
        with self.ctx.store.session() as s:
            return next((n.gpu_model for n in self.ctx.configs.current(s).nodes if n.name == name), None)

    # -- thread ----------------------------------------------------------------------------------

    def start(self, on_thread_death: Callable[[str, BaseException], None] | None = None) -> None:
        """Start the loop and the health checks, each on a supervised thread (control/lifecycle/supervise.py):
        one that dies is restarted and `on_thread_death(name, error)` is told."""
        self._thread = Supervised("trainyard-loop", self._run, self._stop, on_thread_death)
        self._thread.start()
        self.ctx.backend.watch(self.wake)  # a rank's end wakes the loop (backends/rundir/exit_watch.py)
        self.health.start(on_thread_death)
        self.ctx.fingerprints.prime(self._node_names())  # in the background: a bare gang's first start need not wait

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.health.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.scheduler.launches.close()

    @property
    def running(self) -> bool:
        """The loop's thread is started and alive (it may be pausing before a restart)."""
        return self._thread is not None and self._thread.alive and not self._stop.is_set()

    @property
    def threads(self) -> list[Supervised]:
        return [t for t in (self._thread, self.health.thread) if t is not None]

    def wake(self) -> None:
        self._wake.set()

    def _run(self, stop: threading.Event) -> None:
        params = self.ctx.params
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                self.step()
            except Exception as e:  # the loop must outlive any one bad pass; the next one retries
                self.stats.errors += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"
                log.exception("control loop pass failed")
            took = time.perf_counter() - t0
            self.stats.pass_done(took, params.pass_budget_s)
            if took > params.pass_budget_s:
                log.warning("control loop pass took %.2fs (budget %.2fs): %s", took, params.pass_budget_s,
                            ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in self.stats.last_phases.items()))
            ended = time.perf_counter()
            self._wake.wait(params.tick_s)
            self._wake.clear()
            stop.wait(rest_after(took, time.perf_counter() - ended, params))

    # -- one pass --------------------------------------------------------------------------------

    def step(self) -> None:
        ctx = self.ctx
        now = ctx.clock()
        phases: dict[str, float] = {}
        t = time.perf_counter()

        def done(name: str) -> None:
            nonlocal t
            t1 = time.perf_counter()
            phases[name] = t1 - t
            t = t1
        launching = self.scheduler.launches.in_flight()  # read before the poll: see control/loop/launch_threads.py
        facts = Facts(ctx.backend.poll(), ctx.backend.inventory(), launching)
        done("poll")
        self.reconcile.run(facts, now)
        done("reconcile")
        self.node_watch.run(facts, now)
        done("node_watch")
        self.interactive.run(facts, now)
        done("interactive")
        self.idle.run(now)  # before the stops: a job it stops is signalled this pass
        done("idle")
        self.stragglers.run(now)  # before the schedule step: a node made suspect gets no work this pass
        done("stragglers")
        self.stops.run(now, launching)
        done("stops")
        self.dependencies.run(now)
        done("dependencies")
        if self.scheduler.run(facts, ctx.clock()):  # victims chosen: their notices go out now, not a pass later
            self.stops.run(ctx.clock(), self.scheduler.launches.in_flight())
        done("schedule")
        self.seen.run()  # the data dir's record of the newest job id (control/lifecycle/store_audit.py)
        done("seen")
        self.stats.steps += 1
        self.stats.last_phases = phases
