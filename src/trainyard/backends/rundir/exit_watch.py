"""News of a rank's end, for a control loop that would otherwise learn of it at its next tick.

The local and Slurm backends learn that a rank has ended from the exit record its runner writes
(`rank-<r>.exit` in the attempt's run dir, contracts.JobDir). The loop polls once a tick (1 s), so
a finished job was recorded, and its GPUs given to the next one, up to a tick late: on Slurm the
record took 1.6 s on average (issue 20). `ExitWatch` looks for new exit records ten times a second
(a few `stat` calls per running rank) and calls `wake()` when one appears; the loop then runs a
pass at once. It is news, not a fact: `poll` stays the only source of what happened, and a rank
that ends without a record (killed with its runner) is found by the next tick's poll as before.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, Protocol

from trainyard import jobfs

log = logging.getLogger("trainyard.backends")

INTERVAL_S = 0.1


class ExitWatch:
    """A daemon thread: `wake()` whenever a rank of `attempts()` has a new exit record.

    `attempts()` returns (run dir, world size) for every attempt the backend knows (it takes the
    backend's lock for a moment; it must not wait on anything slow)."""

    def __init__(self, attempts: Callable[[], list[tuple[Path, int]]], wake: Callable[[], None],
                 interval_s: float = INTERVAL_S) -> None:
        self._attempts = attempts
        self._wake = wake
        self._interval_s = interval_s
        self._seen: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainyard-exit-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                if self.look():
                    self._wake()
            except Exception:  # news only: a bad look must not end the watch
                log.exception("exit watch: look failed")

    def look(self) -> bool:
        """Whether an exit record appeared since the last look (the first look counts those there)."""
        current: set[Path] = set()
        for run_dir, world_size in self._attempts():
            for r in range(world_size):
                path = run_dir / f"rank-{r}.exit"
                if path in self._seen or jobfs.record_exists(path):  # a link counts; none is followed
                    current.add(path)
        new = bool(current - self._seen)
        self._seen = current  # attempts released are forgotten
        return new

    def stop(self) -> None:
        self._stop.set()


class _Run(Protocol):
    """What the watch reads of a backend's attempt."""

    run_dir: Path
    world_size: int


class WatchesExits:
    """`Backend.watch` for a backend whose ranks write exit records in their run dirs (local and
    Slurm alike): one `ExitWatch` over every attempt the backend holds. The backend keeps
    `_lock`, `_attempts` and `_exit_watch` (None until watched; stopped and cleared by its `close`)."""

    _lock: Any  # the backend's RLock
    _attempts: Mapping[Any, _Run]
    _exit_watch: ExitWatch | None

    def watch(self, wake: Callable[[], None]) -> None:
        """`wake()` when a rank writes its exit record: a job's end is recorded without waiting for
        the loop's next poll."""
        with self._lock:
            if self._exit_watch is None:
                self._exit_watch = ExitWatch(self._watched_runs, wake)

    def _watched_runs(self) -> list[tuple[Path, int]]:
        """(run dir, world size) of every attempt this backend holds: what the exit watch looks at."""
        with self._lock:
            return [(a.run_dir, a.world_size) for a in self._attempts.values()]
