"""The retention thread: purges what `retention:` no longer keeps (services/retention.py), in bounded
batches, beside the control loop rather than inside a pass.

Every `retention.interval` (and once at start) it purges batch after batch until nothing is due:
each batch is one short transaction under the write lock (`retention.batch` jobs), then the
directories it named are removed without the lock, then a short pause lets the loop and the API
take the lock between batches. So a purge of a year of jobs delays a loop pass by one batch at
most, never by the whole purge. Directories alone (`job_dirs`) are walked by job id with a
cursor kept for the thread's life (a restart walks once more from the start, cheaply).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Callable

from trainyard.control.lifecycle.supervise import BackgroundWork
from trainyard.services import retention
from trainyard.services.config import ConfigCache
from trainyard.store.db import Store

log = logging.getLogger("trainyard.retention")

PAUSE_S = 0.05  # between batches: the loop and the API get the write lock


class Retention(BackgroundWork):
    thread_name = "trainyard-retention"

    def __init__(self, store: Store, configs: ConfigCache, lock: threading.RLock, data_dir: Path,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.store, self.configs, self.lock, self.data_dir, self.clock = store, configs, lock, data_dir, clock
        self._dirs_cursor = 0
        self.purged_jobs = self.removed_dirs = 0

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self.store.session() as s:
                spec = self.configs.current(s).spec.retention
            if spec.jobs is not None or spec.job_dirs is not None:
                self.run_once()
            stop.wait(spec.interval)

    def run_once(self, max_batches: int | None = None) -> int:
        """Purge until nothing is due (or `max_batches`); returns the jobs purged."""
        done = batches = 0
        while not self._stop.is_set() and (max_batches is None or batches < max_batches):
            now = self.clock()
            with self.lock, self.store.session.begin() as s:
                spec = self.configs.current(s).spec.retention
                out = retention.purge_jobs(s, self.data_dir, spec, now)
            if not out.jobs:
                with self.store.session() as s:
                    out = retention.dirs_to_purge(s, self.data_dir, spec, now, self._dirs_cursor)
                self._dirs_cursor = out.last_id
                if not out.jobs:
                    break
            else:
                done += out.jobs
            self.removed_dirs += retention.remove(out.dirs)
            batches += 1
            time.sleep(PAUSE_S)
        self.purged_jobs += done
        if done:
            log.info("retention: purged %d jobs", done)
        return done
