"""Is the plane doing its job? The checks behind `/healthz` and `/readyz`.

`/healthz` used to answer ok whatever happened: with a corrupted store (no loop pass, every call
failing), a full disk or a dead health thread. Here each check says ok or why not:

    loop     the control loop's thread is alive and its newest pass ended less than
             `stale_after_s` ago (max(30 s, 10 ticks): a pass that hangs, or a loop that died)
    store    a transaction can write now (`Store.writable`: read-only file or file system,
             read-only standby, a write lock held too long)
    disk     the data dir's file system has at least `min_free_bytes` free (logs, checkpoints
             and the store live there; a full one loses exit records and submissions)
    threads  every supervised thread (loop, health checks) is alive; restarts are counted

`/healthz` is 200 only when all pass, else 503 with the same body, so a load balancer or a
systemd watchdog can act on it. `/readyz` says whether to send traffic here: the plane has
finished starting (one loop pass done), the store answers, and it is not shutting down (SIGTERM
turns readiness off first, so a load balancer drains it). The report is cached for
`CACHE_S`: a probe every second costs one write-lock round trip per second at most.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainyard.disk import free_bytes
from trainyard.store.db import Store

CACHE_S = 1.0
MIN_FREE_BYTES = 256 * 2**20  # the default floor of free space on the data dir's file system


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    checks: list[Check]
    loop: dict[str, Any] = field(default_factory=dict)  # what /healthz shows of the loop's passes

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in self.checks},
                "loop": self.loop}


def disk_check(path: Path, min_free: int) -> Check:
    try:
        free = free_bytes(path)
    except OSError as e:
        return Check("disk", False, f"cannot read free space of {path}: {e.strerror}")
    mib = free / 2**20
    if free < min_free:
        return Check("disk", False, f"{path} has {mib:.0f} MiB free, under the {min_free / 2**20:.0f} MiB floor")
    return Check("disk", True, f"{mib:.0f} MiB free on {path}")


class Liveness:
    """The plane's self-checks; `report()` is what /healthz answers (cached for CACHE_S)."""

    def __init__(self, store: Store, data_dir: Path, loop: Any, *, min_free_bytes: int = MIN_FREE_BYTES,
                 threads: Callable[[], list[Any]] | None = None):
        """`loop`: the ControlLoop (its stats, params and `running`); `threads`: every supervised
        thread of the plane (the loop's, the health checks', retention's), the loop's by default."""
        self.store, self.data_dir, self.loop = store, data_dir, loop
        self.threads = threads or (lambda: loop.threads)
        self.min_free_bytes = min_free_bytes
        self.shutting_down = False
        self._cached: tuple[float, Report] | None = None
        self._lock = threading.Lock()

    def stale_after_s(self) -> float:
        return max(30.0, 10 * self.loop.ctx.params.tick_s)

    def report(self) -> Report:
        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < CACHE_S:
                return self._cached[1]
            rep = Report([self._loop_check(now), Check("store", *self.store.writable()),
                          disk_check(self.data_dir, self.min_free_bytes), self._threads_check()],
                         loop=self._loop_view(now))
            self._cached = (now, rep)
            return rep

    def ready(self) -> Check:
        """Whether to send traffic here (/readyz): started, the store answers, not stopping."""
        if self.shutting_down:
            return Check("ready", False, "shutting down")
        if self.loop.stats.steps == 0:
            return Check("ready", False, "starting: no control loop pass yet")
        try:
            with self.store.engine.connect() as c:
                c.exec_driver_sql("SELECT 1")
        except Exception as e:  # noqa: BLE001 - any failure: not ready, say why
            return Check("ready", False, f"the store does not answer: {type(e).__name__}: {e}")
        return Check("ready", True, "ready")

    def _loop_check(self, now: float) -> Check:
        st = self.loop.stats
        if not self.loop.running:
            return Check("loop", False, "the control loop is not running")
        if st.last_pass_at is None:
            return Check("loop", True, "started; no pass ended yet")
        age = now - st.last_pass_at
        if age > self.stale_after_s():
            return Check("loop", False, f"no pass ended for {age:.0f} s (limit {self.stale_after_s():.0f} s)")
        return Check("loop", True, f"last pass ended {age:.1f} s ago")

    def _threads_check(self) -> Check:
        threads = self.threads()
        dead = [t.name for t in threads if not t.alive]
        restarts = {t.name: t.stats.restarts for t in threads if t.stats.restarts}
        said = f"; restarts {restarts}" if restarts else ""
        if dead and not self.shutting_down:
            return Check("threads", False, f"not running: {', '.join(dead)}{said}")
        return Check("threads", True, f"{len(threads)} running{said}")

    def _loop_view(self, now: float) -> dict[str, Any]:
        st = self.loop.stats
        return {"steps": st.steps, "last_step_ms": round(st.last_step_ms, 1), "errors": st.errors,
                "last_error": st.last_error, "slow_passes": st.slow_passes, "passes": st.pass_summary(),
                "last_pass_age_s": None if st.last_pass_at is None else round(now - st.last_pass_at, 2)}
