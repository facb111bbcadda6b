"""The retention thread: purges what `retention:` no longer keeps and deletes what the lifecycle
rules say (services/retention.py), in bounded batches, beside the control loop rather than inside a pass.

Every `retention.interval` (and once at start) it purges batch after batch until nothing is due:
each batch's job dirs are measured first, without the lock, then the batch is one short
transaction under the write lock (`retention.batch` jobs; each dir moved aside and recorded as
one `retention.deleted` event), then the directories it moved aside are removed without the lock, then a short pause lets the loop and the API
take the lock between batches. So a purge of a year of jobs delays a loop pass by one batch at
most, never by the whole purge.

Logs and job dirs (the rules of `storage.lifecycle`, per team and class, with `retention.job_dirs`
as the fallback) are looked at by job id from a cursor: each deletion is measured, then recorded (one audit event)
and moved aside in one transaction under the lock, and removed after it, without the lock. At the end of a pass
the cursor stays below every job whose fate is not settled yet (running, or ended within the
longest rule: `services.retention.undecided_from`), so a job that ends late is never skipped;
a new configuration version starts it from the beginning again.
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
        self._cursor_version: int | None = None  # the configuration version the cursor was made under
        self.purged_jobs = self.removed_dirs = self.deleted = 0

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self.store.session() as s:
                spec = self.configs.current(s).spec
            if spec.retention.jobs is not None or retention.horizons(spec) is not None:
                self.run_once()
            stop.wait(spec.retention.interval)

    def run_once(self, max_batches: int | None = None) -> int:
        """Purge until nothing is due (or `max_batches`), then apply the rules to logs and job dirs;
        returns the jobs purged (the deletions are counted in `deleted`)."""
        done = batches = 0
        while not self._stop.is_set() and (max_batches is None or batches < max_batches):
            now = self.clock()
            with self.store.session() as s:
                spec = self.configs.current(s).spec.retention
                names = retention.purge_candidates(s, self.data_dir, spec, now)
            sizes = {jid: retention.apparent_bytes(self.data_dir, name) for jid, name in names.items()}
            with self.lock, self.store.session.begin() as s:
                spec = self.configs.current(s).spec.retention
                out = retention.purge_jobs(s, self.data_dir, spec, now, sizes)
            if not out.jobs:
                break
            done += out.jobs
            self.removed_dirs += retention.remove(out.dirs)
            batches += 1
            time.sleep(PAUSE_S)
        self.purged_jobs += done
        if done:
            log.info("retention: purged %d jobs", done)
        if max_batches is None or batches < max_batches:
            self._apply_rules()
        return done

    def _apply_rules(self) -> None:
        """One pass of the logs and job-dir rules from the cursor."""
        now = self.clock()
        with self.store.session() as s:
            cfg = self.configs.current(s)
            spec = cfg.spec
            if cfg.version != self._cursor_version:
                self._dirs_cursor, self._cursor_version = 0, cfg.version
            floor = retention.undecided_from(s, spec, now)
        cursor = self._dirs_cursor
        retention.empty_trash(self.data_dir)  # what a crash left moved aside
        while not self._stop.is_set():
            with self.store.session() as s:
                items, last = retention.due(s, self.data_dir, spec, now, cursor, spec.retention.batch)
            for d in items:
                nbytes, complete = retention.apparent_bytes(self.data_dir, d.path)
                with self.lock, self.store.session.begin() as s:
                    trash = retention.record_deletion(s, self.data_dir, d, nbytes, complete, self.clock())
                if trash is not None:
                    retention.empty_trash(self.data_dir, [trash])
                    self.deleted += 1
                    log.info("retention: deleted %s of job %d (%d bytes, %s)", d.rule.what, d.job_id, nbytes,
                             d.rule.source)
            if last == cursor:
                break
            cursor = last
            time.sleep(PAUSE_S)
        self._dirs_cursor = cursor if floor is None else min(cursor, floor - 1)
