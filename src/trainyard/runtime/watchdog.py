"""A step watchdog: no step done within the timeout → stacks to stderr, exit `WATCHDOG_EXIT` (86).

A hung rank (a deadlocked collective, a frozen GPU, a data loader waiting on a dead worker)
does not crash: the job sits idle holding its GPUs until its time limit, and the other ranks
wait in their next collective. A daemon thread here watches the time since the last
completed step; past the timeout it prints what it knows, dumps every thread's stack (so the
log shows *where* it hung) and ends the process with `os._exit(86)`. `os._exit`, because the
main thread is stuck by definition: no exception would ever be handled, no atexit hook would
finish. The distinct code lets the control plane record "hung", not "crashed".

Long phases that are not steps (the first step's compilation, a synchronous checkpoint, a
resume) get their own allowance through `allow(seconds, what)`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import threading
import time
from collections.abc import Iterator

from trainyard.contracts import WATCHDOG_EXIT


class Watchdog:
    """Exit the process when no `beat()` comes within `timeout_s`.

    Args:
        timeout_s: the longest time allowed between two completed steps.
        first_timeout_s: allowance before the first step (start-up, compilation, resume);
            default: max(timeout_s, 600).
        exit_code: the code to exit with (`contracts.WATCHDOG_EXIT`).
        rank: shown in the message.
    """

    def __init__(self, timeout_s: float, *, first_timeout_s: float | None = None,
                 exit_code: int = WATCHDOG_EXIT, rank: int = 0) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        self.timeout_s = float(timeout_s)
        self.first_timeout_s = float(first_timeout_s if first_timeout_s is not None else max(timeout_s, 600.0))
        self.exit_code = exit_code
        self.rank = rank
        self.last_step: int | None = None
        self._lock = threading.Lock()
        self._deadline = 0.0
        self._what = "the first step"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> Watchdog:
        with self._lock:
            self._deadline = time.monotonic() + self.first_timeout_s
        self._thread = threading.Thread(target=self._run, name="trainyard-watchdog", daemon=True)
        self._thread.start()
        return self

    def beat(self, step: int | None = None) -> None:
        """A step completed; the next must complete within `timeout_s`."""
        now = time.monotonic()
        with self._lock:
            self.last_step = step
            self._deadline = now + self.timeout_s
            self._what = "a training step"

    @contextlib.contextmanager
    def allow(self, seconds: float, what: str) -> Iterator[None]:
        """Give the enclosed phase `seconds` (on top of nothing: the clock restarts) to finish."""
        with self._lock:
            saved = (self._deadline, self._what)
            self._deadline = time.monotonic() + seconds
            self._what = what
        try:
            yield
        finally:
            with self._lock:
                # Back to the step clock, restarted: the phase's time is not the next step's.
                self._deadline = max(saved[0], time.monotonic() + self.timeout_s)
                self._what = saved[1]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

    def _run(self) -> None:
        period = min(max(self.timeout_s / 10, 0.05), 5.0)
        while not self._stop.wait(period):
            with self._lock:
                late = time.monotonic() - self._deadline
                what = self._what
            if late > 0:
                self._fire(what)

    def _fire(self, what: str) -> None:
        last = "none yet" if self.last_step is None else str(self.last_step)
        msg = (f"\ntrainyard watchdog (rank {self.rank}): {what} did not complete in time "
               f"(step timeout {self.timeout_s:g} s; last completed step: {last}). A rank is hung or "
               f"a GPU is frozen. Stacks of every thread follow; exiting with code {self.exit_code}.\n")
        try:
            os.write(2, msg.encode())
            faulthandler.dump_traceback(file=2, all_threads=True)
        except Exception:  # noqa: BLE001 - the exit below is what matters
            pass
        os._exit(self.exit_code)
