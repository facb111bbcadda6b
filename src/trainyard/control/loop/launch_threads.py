"""Launches the loop does not wait for, on a backend whose `launch` waits on another system.

Slurm's `launch` submits a batch job and waits until slurmctld has scheduled it and every rank has
started (seconds; more under load). Done on the loop's thread, that wait held up every other job
of the pass: a preemption's notice, a finished job's end record, the GPUs it frees (issue 20: the
notice took 1.7 s on average on Slurm, 5 s at worst). A backend that says so (`launch_waits`) has
its launches run here instead, several at once, each on a thread of the pool; the others
(local, fake) launch inline, as before, which keeps a pass of the loop's own tests deterministic.

An attempt is *in flight* from the moment its start is committed until its launch has returned
(the backend knows it) or failed (`attempt_start.launch` has recorded the failure in the store). The
orchestrator reads the in-flight set before it polls the backend (`Facts.launching`), so an
attempt the poll did not see is either still being launched or was seen: the reconcile step does
not take it for one that never launched, and the stop step holds its signals until the backend
knows where to send them.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from trainyard.backends.base import LaunchSpec
from trainyard.control.loop import attempt_start
from trainyard.control.loop.context import LoopContext

log = logging.getLogger("trainyard.loop")

LAUNCH_THREADS = 4  # launches at once: a burst of starts after a big job ends does not queue behind one


class Launches:
    """Runs `launch(spec, now)` inline, or on a pool of threads when `background`."""

    def __init__(self, launch: Callable[[LaunchSpec, float], None], background: bool,
                 threads: int = LAUNCH_THREADS) -> None:
        self._launch = launch
        self._lock = threading.Lock()
        self._in_flight: set[tuple[int, int]] = set()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="trainyard-launch") if background else None
        self._threads = threads
        self._background = background

    @property
    def background(self) -> bool:
        """Whether every launch goes to the pool (those with an image or datasets always do)."""
        return self._background

    def start(self, spec: LaunchSpec, now: float) -> None:
        """Launch `spec`'s attempt: now (inline), or on the pool (returns at once). An attempt with
        an image or datasets always goes to the pool: its nodes pull (`image_pull.py`) or stage
        (`data_staging.py`) first, for minutes maybe; so does one that may copy a checkpoint back
        from the archive (`checkpoint_fetch.py`)."""
        if self._pool is None and spec.container is None and not spec.datasets and not spec.may_fetch:
            self._launch(spec, now)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="trainyard-launch")
        key = (spec.job_id, spec.attempt)
        with self._lock:
            self._in_flight.add(key)
        try:
            future = self._pool.submit(self._run, spec, now, key)
        except RuntimeError:  # the pool is shut down: the plane is stopping; the next one requeues it
            self._forget(key)
            return
        future.add_done_callback(lambda f: self._forget(key) if f.cancelled() else None)  # dropped by close()

    def _run(self, spec: LaunchSpec, now: float, key: tuple[int, int]) -> None:
        try:
            self._launch(spec, now)
        except Exception:  # attempt_start.launch records what it can; anything else must not kill the thread
            log.exception("job %s attempt %s: launch failed", *key)
        finally:
            self._forget(key)

    def _forget(self, key: tuple[int, int]) -> None:
        with self._lock:
            self._in_flight.discard(key)

    def in_flight(self) -> frozenset[tuple[int, int]]:
        """The (job, attempt) pairs being launched right now."""
        with self._lock:
            return frozenset(self._in_flight)

    def close(self, wait: bool = False) -> None:
        """No new launches; those not begun are dropped (their attempts never launched: the next
        pass of a plane, this one or the next, puts them back in the queue). `wait`: until those
        under way have returned."""
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)


def for_backend(ctx: LoopContext) -> Launches:
    """`attempt_start.launch` inline, or on threads where `ctx.backend.launch_waits`; a launch off the
    loop's thread that fails is recorded at the time it failed, not at the pass that started it."""
    if not ctx.backend.launch_waits:
        return Launches(lambda spec, now: attempt_start.launch(ctx, spec, now), background=False)
    return Launches(lambda spec, now: attempt_start.launch(ctx, spec, ctx.clock()), background=True)
