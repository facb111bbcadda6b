"""A clock that moves only when told, for tests of what happens *over time*.

`FakeClock()` is called like `time.time` (seconds since the epoch, a float), so it goes wherever
a clock is a parameter: `ControlLoop(clock=...)`, `FakeBackend(clock=...)`. A test advances it
(`advance(30)`: half a minute passes at once) instead of sleeping, so a grace period, a retry
backoff or a hung-rank timeout costs no wall time and the same test always sees the same times.

Whoever computes state from time can `subscribe` to hear of every move (the fake backend does:
its ranks' steps, checkpoints and exits happen as the clock passes their time, not when asked).

Thread-safe: the control loop reads it from its thread while the test advances it; subscribers
are called after the move, outside the clock's lock, in the thread that moved it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class FakeClock:
    """Settable, advanceable time with `time.time`'s shape; starts at `start` (default: a fixed
    date, 2023-11-14T22:13:20Z, so times in logs and files look like real ones)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()
        self._subscribers: list[Callable[[float], None]] = []

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        return self()

    def advance(self, seconds: float) -> float:
        """Let `seconds` pass (>= 0); returns the new time.

        Raises:
            ValueError: `seconds` is negative (time does not go back; use `set` to jump).
        """
        if seconds < 0:
            raise ValueError(f"a clock advances by >= 0 seconds, not {seconds}")
        with self._lock:
            self._now += seconds
            now = self._now
        self._moved(now)
        return now

    def set(self, now: float) -> None:
        """Jump to `now` (either way): for a test of a clock that went back."""
        with self._lock:
            self._now = float(now)
        self._moved(float(now))

    def sleep(self, seconds: float) -> None:
        """What `time.sleep` is for code under test that takes a sleep function: time passes, at once."""
        self.advance(max(0.0, seconds))

    def subscribe(self, callback: Callable[[float], None]) -> None:
        """Call `callback(now)` after every `advance`, `set` and `sleep`."""
        with self._lock:
            self._subscribers.append(callback)

    def unsubscribe(self, callback: Callable[[float], None]) -> None:
        """Stop calling `callback` (no error if it was not subscribed)."""
        with self._lock:
            self._subscribers = [cb for cb in self._subscribers if cb != callback]

    def _moved(self, now: float) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for cb in subscribers:
            cb(now)

    def __repr__(self) -> str:
        return f"FakeClock({self():.3f})"
