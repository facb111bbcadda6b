"""Background threads that come back: a thread whose body raises is restarted, and its death is
counted, logged and reported, never silent.

The plane's work happens on threads of its own (the control loop, the periodic health checks). A
thread that dies of an unexpected error (a store that refused a read, a bug in one check) used to
stay dead: the loop or the health checks silently stopped while the API kept answering. Here a
`Supervised` thread runs its body again after a short pause that doubles on every death in a row
(capped), calls `on_death(name, error)` (the plane records an event), and keeps the counts that
`/healthz` and the metrics show.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("trainyard.supervise")

FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 30.0


@dataclass
class ThreadStats:
    """What a supervised thread has been through; read by /healthz and the metrics."""

    name: str
    restarts: int = 0
    last_error: str = ""
    last_death: float | None = None  # time.time() of the last death


class Supervised:
    """Runs `body(stop)` on a daemon thread until `stop` is set, restarting it when it raises.

    `body` is expected to loop until `stop.is_set()`; returning normally ends the thread (a clean
    exit), raising restarts it.
    """

    def __init__(self, name: str, body: Callable[[threading.Event], None], stop: threading.Event,
                 on_death: Callable[[str, BaseException], None] | None = None):
        self.name = name
        self.stats = ThreadStats(name)
        self._body = body
        self._stop = stop
        self._on_death = on_death
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Started and not ended (a thread pausing before its restart counts as alive)."""
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        pause = FIRST_PAUSE_S
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self._body(self._stop)
                return
            except Exception as e:  # noqa: BLE001 - any error: count it, report it, run again
                self.stats.restarts += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"
                self.stats.last_death = time.time()
                log.exception("thread %s died; restarting it in %.1fs", self.name, pause)
                if self._on_death is not None:
                    try:
                        self._on_death(self.name, e)
                    except Exception:  # noqa: BLE001 - reporting must not stop the restart
                        log.exception("reporting the death of thread %s failed", self.name)
            if time.monotonic() - started > MAX_PAUSE_S:
                pause = FIRST_PAUSE_S  # it ran a good while before dying: not a crash loop
            self._stop.wait(pause)
            pause = min(MAX_PAUSE_S, pause * 2)


class BackgroundWork:
    """A part of the plane that works on a supervised thread of its own beside the loop (retention,
    the storage meter): `start` and `stop` once, `_run(stop)` is the part's own body, which loops
    until `stop` is set."""

    thread_name = "trainyard-background"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.thread: Supervised | None = None

    def start(self, on_death: Callable[[str, BaseException], None] | None = None) -> None:
        self.thread = Supervised(self.thread_name, self._run, self._stop, on_death)
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout=30)

    def _run(self, stop: threading.Event) -> None:
        raise NotImplementedError

