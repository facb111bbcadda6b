"""The storage meter: each team's bytes in job dirs against its quota, and the reserve kept free for
the store and the plane (`storage:`, spec.StorageSpec), on a thread of its own beside the control
loop. The loop never waits on it: its schedule step reads one immutable `Holds`, swapped in whole.

Every `storage.interval` (and at start) a sweep lists `jobs/` and walks each job dir through
directory descriptors (`jobfs.UsageWalk`: no link followed, one file system, hard links once,
allocated blocks as `du -sx` counts them, descriptors and memory bounded whatever the tree's
shape). A walk is cut at `walk_budget_s` and goes on from there at the next sweep; meanwhile the
dir keeps the larger of what was counted and its last measure, marked as an estimate, so a job
that makes millions of files neither holds the thread nor hides its bytes behind them. A dir
is charged to the team of the job whose directory it is (the store's `jobs.team` and `dir_key`);
one that no job of the store owns is shown as unowned and charged to nobody.

Every CHECK_S, between walks too: the free space and inodes of the data dir's file system and of
`jobs/`'s (`disk.space`), and each team's bytes against its quota in the configuration in force,
so a quota or reserve changed by `yard cluster apply` holds within seconds. Each crossing is one
event (`services/storage.py`: the team, and each of its running jobs once; the reserve) and wakes
the loop. The figures live in memory and are measured again after a restart; the crossings are
read back from the events, so a restart neither warns twice nor forgets a team over its quota.
"""

from __future__ import annotations

import logging
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import select

from trainyard import jobfs
from trainyard.contracts import JobDir
from trainyard.control.lifecycle.storage_figures import DirUsage, FsUsage, fs_dict, kinds_of
from trainyard.control.lifecycle.supervise import BackgroundWork
from trainyard.disk import space
from trainyard.services import storage as events
from trainyard.services.config import ConfigCache
from trainyard.spec.models import ConfigSpec, StorageSpec
from trainyard.store.db import Store
from trainyard.store.models import JobRow

log = logging.getLogger("trainyard.storage")

WALK_BUDGET_S = 30.0  # one job dir's walk at most; then its figure is an estimate
CHECK_S = 5.0  # free space and quotas are looked at this often, walks or not
MAX_ENTRIES = 10_000_000  # entries one walk counts at most
MAX_DIRS = 10_000_000  # job dirs one sweep lists at most


@dataclass(frozen=True)
class Holds:
    """What keeps new attempts from starting: the teams over their quota, or the reserve crossed."""

    teams: frozenset[str] = frozenset()
    reserve: bool = False

    def reason(self, team: str) -> str | None:
        """The reason a waiting job of `team` shows, or None when nothing here holds it."""
        return events.DISK_RESERVE if self.reserve else events.STORAGE_QUOTA if team in self.teams else None


class StorageMeter(BackgroundWork):
    thread_name = "trainyard-storage"

    def __init__(self, store: Store, configs: ConfigCache, lock: threading.RLock, data_dir: Path, *,
                 clock: Callable[[], float] = time.time, wake: Callable[[], None] | None = None,
                 walk_budget_s: float = WALK_BUDGET_S) -> None:
        """`lock`: the plane's write lock (events are written under it); `wake`: the loop's, called
        when a team or the reserve crosses its line."""
        super().__init__()
        self.store, self.configs, self.lock, self.data_dir, self.clock = store, configs, lock, Path(data_dir), clock
        self.jobs_root = self.data_dir / "jobs"
        self.wake = wake or (lambda: None)
        self.walk_budget_s = walk_budget_s
        self._mu = threading.Lock()  # guards _dirs (the thread writes, the API reads)
        self._sweeping = threading.RLock()  # one sweep or check at a time: the thread's or a refresh
        self._dirs: dict[str, DirUsage] = {}
        self._walks: dict[str, jobfs.UsageWalk] = {}  # walks cut at their budget, resumed next sweep
        self._holds = Holds()
        self._fs: tuple[FsUsage, ...] = ()
        self._over: set[str] | None = None  # None: not read back from the events yet
        self._warned: dict[int, str] = {}
        self._low = False
        self._last_check = 0.0
        self.swept_at: float | None = None  # when the newest full sweep ended (clock)
        self.sweep_s = 0.0
        self.sweeps = 0

    def holds(self) -> Holds:
        """What the schedule step holds back now (never blocks)."""
        return self._holds

    # -- the thread -----------------------------------------------------------------------------

    def start(self, on_death: Callable[[str, BaseException], None] | None = None) -> None:
        """Read back what the events say is over (so the loop's first pass already holds it), then
        measure on a thread of its own."""
        self.restore()
        super().start(on_death)

    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.sweep()
            until = time.monotonic() + self._spec().storage.interval
            while not stop.is_set() and (left := until - time.monotonic()) > 0:
                stop.wait(min(CHECK_S, left))
                if not stop.is_set():
                    self.check()

    def restore(self) -> None:
        """Read back the crossings the events record (`services.storage.known_state`)."""
        with self.store.session() as s:
            self._over, self._warned, self._low = events.known_state(s)
        self._holds = Holds(frozenset(self._over), self._low)

    def _spec(self) -> ConfigSpec:
        with self.store.session() as s:
            return self.configs.current(s).spec

    # -- measuring ------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Measure every job dir now, whole (no walk budget), and check: an admin's `yard storage
        --refresh`, so what it shows is the disk as it is, to the byte."""
        with self._sweeping:
            self._walks.clear()
            budget, self.walk_budget_s = self.walk_budget_s, float("inf")
            try:
                self.sweep()
            finally:
                self.walk_budget_s = budget

    def sweep(self) -> None:
        """Measure every job dir once (checking free space and quotas every CHECK_S meanwhile)."""
        with self._sweeping:
            self._sweep()

    def _sweep(self) -> None:
        t0 = time.monotonic()
        self.check()
        tree = jobfs.Tree(self.jobs_root)
        names = [n for n, mode in tree.list_dir("", limit=MAX_DIRS) if stat.S_ISDIR(mode)]
        owners = self._owners(names)
        seen: set[str] = set()
        for name in names:
            if self._stop.is_set():
                return
            walk = self._walks.pop(name, None) or jobfs.UsageWalk(tree, name)
            done = walk.run(deadline=time.monotonic() + min(self.walk_budget_s, 1e9), max_entries=MAX_ENTRIES)
            if done and not walk.whole and not tree.is_dir(name):
                continue  # removed meanwhile (retention, an admin)
            if not done:
                self._walks[name] = walk  # the next sweep goes on from where this one stopped
            job_id, team, user = owners.get(name, (None, None, None))
            with self._mu:
                old = self._dirs.get(name)
                used, complete = walk.total, done and walk.whole
                if not complete and old is not None:
                    used = max(used, old.bytes)  # an estimate: never less than the last measure
                self._dirs[name] = DirUsage(name, job_id, team, user, used, complete, self.clock(),
                                            walk.apparent, kinds_of(walk.by_top))
            seen.add(name)
            if time.monotonic() - self._last_check >= CHECK_S:
                self.check()
        self._walks = {k: w for k, w in self._walks.items() if k in seen}
        with self._mu:
            self._dirs = {k: v for k, v in self._dirs.items() if k in seen}
        self.swept_at, self.sweep_s = self.clock(), time.monotonic() - t0
        self.sweeps += 1
        self.check()

    def _owners(self, names: list[str]) -> dict[str, tuple[int, str, str]]:
        """name -> (job id, team, user) of the dirs that are their job's (`JobDir.name_of`)."""
        ids = sorted({p[0] for p in map(JobDir.parse_name, names) if p is not None})
        out: dict[str, tuple[int, str, str]] = {}
        with self.store.session() as s:
            for i in range(0, len(ids), 500):  # bound the IN list
                q = select(JobRow.id, JobRow.dir_key, JobRow.team, JobRow.user).where(JobRow.id.in_(ids[i:i + 500]))
                for jid, key, team, user in s.execute(q):
                    out[JobDir.name_of(jid, key)] = (jid, team, user)
        return out

    def _file_systems(self, spec: StorageSpec) -> tuple[FsUsage, ...]:
        """The data dir's file system, and `jobs/`'s when it is another (a link or a mount)."""
        out, devs = [], set()
        for path in (self.data_dir, self.jobs_root):
            try:
                sp = space(path)
            except OSError:
                continue  # no `jobs/` yet
            if sp.dev in devs:
                continue
            devs.add(sp.dev)
            out.append(FsUsage(str(path), sp.size, sp.free, spec.reserve_bytes(sp.size), sp.inodes, sp.inodes_free,
                               int(sp.inodes * spec.reserve_percent / 100)))
        return tuple(out)

    # -- judging --------------------------------------------------------------------------------

    def team_bytes(self) -> dict[str, int]:
        with self._mu:
            dirs = list(self._dirs.values())
        out: dict[str, int] = {}
        for d in dirs:
            if d.team is not None:
                out[d.team] = out.get(d.team, 0) + d.bytes
        return out

    def check(self) -> None:
        """Free space and quotas against the configuration in force; events and a wake on a crossing."""
        with self._sweeping:
            self._check()

    def _check(self) -> None:
        self._last_check = time.monotonic()
        now = self.clock()
        if self._over is None:
            self.restore()
        assert self._over is not None
        spec = self._spec()
        fs = self._file_systems(spec.storage)
        low = [f for f in fs if f.low]
        used = self.team_bytes()
        quotas = {t.name: spec.storage.quota_bytes(t) for t in spec.teams}
        over = {t for t, q in quotas.items() if q is not None and used.get(t, 0) > q}
        if self.swept_at is None:  # before the first full sweep a team may go over, not back under
            over |= {t for t in self._over if quotas.get(t) is not None}
        crossed = over != self._over or bool(low) != self._low
        if over:
            with self.store.session() as s:
                warn = {t: ids for t in sorted(over) if (ids := events.unwarned(s, t, self._warned))}
        else:
            warn = {}
        if crossed or warn:
            with self.lock, self.store.session.begin() as s:
                for team in sorted(over - self._over):
                    events.team_over(s, team, used.get(team, 0), quotas[team] or 0, now)
                    log.warning("storage: team %s holds %d bytes, over its quota of %s", team, used.get(team, 0),
                                quotas[team])
                for team in sorted(self._over - over):
                    events.team_under(s, team, used.get(team, 0), quotas.get(team), now)
                    self._warned = {j: t for j, t in self._warned.items() if t != team}
                for team, ids in warn.items():
                    events.warn_jobs(s, team, ids, used.get(team, 0), quotas[team] or 0, now)
                    self._warned.update(dict.fromkeys(ids, team))
                if low and not self._low:
                    events.reserve_crossed(s, [fs_dict(f) for f in low], now)
                    log.warning("storage: under the disk reserve: %s", ", ".join(f.path for f in low))
                elif self._low and not low:
                    events.reserve_ok(s, now)
        self._over, self._low, self._fs = over, bool(low), fs
        self._holds = Holds(frozenset(over), bool(low))
        if crossed:
            self.wake()

    # -- what the API shows ---------------------------------------------------------------------

    def dirs(self) -> list[DirUsage]:
        """Every job dir as last measured."""
        with self._mu:
            return list(self._dirs.values())

    def job(self, name: str) -> dict[str, Any] | None:
        """Job dir `name` (under `jobs/`) as last measured, or None."""
        d = self._dirs.get(name)
        return None if d is None else {"bytes": d.bytes, "complete": d.complete, "measured_at": d.measured_at}

    def report(self, spec: ConfigSpec, jobs: int = 0) -> dict[str, Any]:
        """What `GET /api/v1/storage` answers (`services.storage.report`)."""
        with self._mu:
            dirs = list(self._dirs.values())
        return events.report(spec, dirs, [fs_dict(f) for f in self._fs], self._holds.teams, self._holds.reserve,
                             self.swept_at, self.sweep_s, jobs)
