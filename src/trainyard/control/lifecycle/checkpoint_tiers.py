"""The checkpoint tiers thread (issue 41): beside the loop, it keeps each job's checkpoints where
the lifecycle rules say (spec/lifecycle.py; the plan is services/checkpoint_plan.py).

Every `storage.archive.interval` (default 60 s; without an archive every 60 s, to record the fast
tier for `yard checkpoints`; and at once when `wake()` is called), for each job that may have
checkpoints (active, waiting to resume, recently ended, or with copies on record):

1. it reads the committed steps of the job's `checkpoints/` and their manifests through `jobfs`
   (the job dir is its owner's: no link followed, no FIFO opened, every read bounded) and records
   them as fast copies (bytes, files, the manifest's `metrics`); a step gone from the disk is
   forgotten;
2. when the job is under the plane's rules (`services.checkpoint_copies.plane_rules`), it computes
   the plan and applies it: each step to archive is copied (the manifest's files only, each to
   exactly its manifest size, the marker last), verified (sha256 of what was read against the
   archive copy read back), recorded, and only then its fast copy removed (marker first); each
   step to delete is removed from every tier, an audit event per removal (`checkpoint.deleted`:
   job, step, tier, bytes, rule).

3. for each job whose records `retention.jobs` purged, it removes what the archive still holds of
   it and forgets its records (control/lifecycle/purged_copies.py).

What a running job needs is never touched: only committed steps older than the newest `keep_last`
move; the newest committed step is never removed while the job may run again; and while an
attempt may be resuming (it started and has not committed since) nothing of its fast tier is
removed. Copies run on this thread at the lowest CPU priority and at most
`storage.archive.bandwidth_mb_s`, so they never hold the loop or a job's saves; the store is
written in short transactions under the plane's lock, never across a copy.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.contracts import CHECKPOINT_MARKER, JobDir
from trainyard.control.lifecycle import purged_copies
from trainyard.control.lifecycle.supervise import BackgroundWork
from trainyard.jobfs.records import commit_time, committed_steps
from trainyard.services import checkpoint_copies as copies
from trainyard.services import checkpoint_plan as cplan
from trainyard.services.config import ConfigCache
from trainyard.services.events import record
from trainyard.spec.lifecycle import DEFAULT_KEEP_LAST, CheckpointRules
from trainyard.spec.models import ConfigSpec
from trainyard.staging.archive_io import Archive, ArchiveError, Throttle, read_manifest
from trainyard.states import ACTIVE_STATES, PENDING_STATES, TERMINAL_STATES
from trainyard.store.db import Store
from trainyard.store.models import AttemptRow, CheckpointCopyRow, JobRow

log = logging.getLogger("trainyard.checkpoint_tiers")

ACTOR = "lifecycle"
CKPT = "checkpoints"
FIRST_LOOK_BACK_S = 7 * 86400  # at start: jobs ended this recently are looked at once more
IDLE_INTERVAL_S = 60.0  # without an archive, how often the fast tiers are looked at


@dataclass(frozen=True)
class JobView:
    """What the thread needs of a job, read in one short transaction."""

    id: int
    dir_key: str | None
    team: str
    job_class: str
    active: bool  # it runs, or waits to run again (it may resume from its checkpoints)
    ended_at: float | None
    attempt_started: float | None


class CheckpointTiers(BackgroundWork):
    thread_name = "trainyard-checkpoint-tiers"

    def __init__(self, store: Store, configs: ConfigCache, lock: threading.RLock, data_dir: Path,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.store, self.configs, self.lock, self.data_dir, self.clock = store, configs, lock, data_dir, clock
        self._woken = threading.Event()
        self._since: float | None = None
        self._current_archive: Archive | None = None
        self.archived = self.deleted = 0
        self.archived_bytes = 0

    def wake(self) -> None:
        self._woken.set()

    def _run(self, stop: threading.Event) -> None:
        try:  # the copies yield the CPU to everything else (Linux: the thread's own nice value)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (OSError, AttributeError):
            pass
        while not stop.is_set():
            self._woken.clear()
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - one bad round is logged; the next one tries again
                log.exception("checkpoint tiers: a round failed")
            with self.store.session() as s:
                a = self.configs.current(s).spec.storage.archive
            interval = a.interval if a is not None else IDLE_INTERVAL_S
            deadline = time.monotonic() + interval
            while not stop.is_set() and not self._woken.is_set() and time.monotonic() < deadline:
                self._woken.wait(min(1.0, max(0.0, deadline - time.monotonic())))

    # -- one round -------------------------------------------------------------------------------

    def run_once(self) -> int:
        """Look at every candidate job once; returns how many were looked at."""
        now = self.clock()
        since = self._since if self._since is not None else now - FIRST_LOOK_BACK_S
        with self.store.session() as s:
            spec = self.configs.current(s).spec
            views = self._candidates(s, since)
        self._since = now - 5.0
        try:
            archive = self._same_archive(copies.archive_for(spec))
        except ArchiveError as e:  # the fast tiers are still recorded; nothing moves or goes
            log.warning("checkpoint tiers: %s", e)
            return len(views)
        for v in views:
            if self._stop.is_set():
                break
            try:
                self.tend(v, spec, archive)
            except (OSError, ArchiveError) as e:
                log.warning("checkpoint tiers: job %s: %s", v.id, e)
        _, steps = purged_copies.forget(self.store, self.lock, archive, self.clock, self._stop.is_set)
        self.deleted += steps
        return len(views)

    def _same_archive(self, archive: Archive | None) -> Archive | None:
        """The previous round's archive while the configuration names the same one (its client,
        connections and all, kept), else this one."""
        prev = self._current_archive
        if archive is not None and prev is not None and (prev.url, prev.store) == (archive.url, archive.store):
            return prev
        self._current_archive = archive
        return archive

    def _candidates(self, s: Session, since: float) -> list[JobView]:
        with_copies = select(CheckpointCopyRow.job_id).distinct()
        rows = s.scalars(select(JobRow).where(or_(
            JobRow.state.in_(ACTIVE_STATES), (JobRow.state.in_(PENDING_STATES)) & (JobRow.attempt > 0),
            JobRow.end_time >= since, JobRow.id.in_(with_copies))).order_by(JobRow.id)).all()
        out = []
        for j in rows:
            started = s.scalar(select(AttemptRow.started_at).where(AttemptRow.job_id == j.id,
                                                                   AttemptRow.attempt == j.attempt))
            out.append(JobView(j.id, j.dir_key, j.team, j.job_class, j.state not in TERMINAL_STATES,
                               j.end_time if j.state in TERMINAL_STATES else None,
                               started if j.state in ACTIVE_STATES else None))
        return out

    def tend(self, v: JobView, spec: ConfigSpec, archive: Archive | None) -> None:
        """One job: see its fast tier, then (under the plane's rules) apply the plan."""
        jd = JobDir.of(self.data_dir, v.id, v.dir_key)
        tree = jobfs.Tree(jd.root)
        on_disk = self._see_fast(v, tree) if jobfs.Tree(jd.root.parent).is_dir(jd.root.name) else {}
        if not copies.plane_rules(spec, v.team, v.job_class):
            return
        rules = spec.lifecycle_for(v.team, v.job_class).checkpoints
        now = self.clock()
        with self.store.session() as s:
            cps = copies.checkpoints_of(s, v.id)
        if not cps:
            return
        p = cplan.plan(cps, rules, archive_tier=archive is not None, ended_at=v.ended_at, now=now)
        newest = max(c.step for c in cps)
        # a job that may still run resumes from its newest step; one that may be resuming now
        # (started, not committed since) may fall back to any step of its fast tier
        resuming = v.attempt_started is not None and (
            not on_disk or (commit_time(tree, CKPT, max(on_disk)) or 0.0) < v.attempt_started)
        may_remove_fast = not resuming

        def protected(step: int) -> bool:
            return v.active and step == newest

        if archive is not None:
            mb_s = spec.storage.archive.bandwidth_mb_s if spec.storage.archive is not None else 0.0
            for step in p.moves(cps):
                if step in on_disk and not protected(step):
                    self._archive(v, tree, archive, step, mb_s)
            with self.store.session() as s:
                cps = copies.checkpoints_of(s, v.id)
            if may_remove_fast:
                for step in p.fast_removals(cps):
                    if not protected(step):
                        self._remove_fast(v, tree, step, archived=True, rule="")
        why = _rule_words(rules, v.ended_at, now)
        tiers = {c.step: c.tiers for c in cps}
        for step in sorted(p.delete):
            if protected(step):
                continue
            if cplan.FAST in tiers.get(step, frozenset()) and may_remove_fast:
                self._remove_fast(v, tree, step, archived=False, rule=why)
            if cplan.ARCHIVE in tiers.get(step, frozenset()) and archive is not None:
                self._remove_archive(v, archive, step, why)

    # -- the fast tier as it is --------------------------------------------------------------------

    def _see_fast(self, v: JobView, tree: jobfs.Tree) -> dict[int, Path]:
        """Record the fast tier's committed steps (new ones with their manifests); forget the gone."""
        on_disk = dict(committed_steps(tree, CKPT))
        with self.store.session() as s:
            known = {r.step for r in copies.copies(s, v.id) if r.tier == cplan.FAST}
        seen = []
        for step in sorted(set(on_disk) - known):
            try:
                m = read_manifest(tree, CKPT, step)
            except ArchiveError as e:
                log.warning("checkpoint tiers: job %s: %s", v.id, e)
                continue
            seen.append((step, m))
        gone = known - set(on_disk)
        if seen or gone:
            now = self.clock()
            with self.lock, self.store.session.begin() as s:
                for step, m in seen:
                    copies.put(s, v.id, step, cplan.FAST, nbytes=m.bytes, files=len(m.files),
                               at=commit_time(tree, CKPT, step) or now, metrics=m.metrics)
                for step in gone:
                    copies.drop(s, v.id, step, cplan.FAST)
        return on_disk

    # -- moves and removals ----------------------------------------------------------------------

    def _archive(self, v: JobView, tree: jobfs.Tree, archive: Archive, step: int, mb_s: float) -> None:
        """Copy, verify and record one step in the archive (its fast copy stays until recorded)."""
        m = read_manifest(tree, CKPT, step)
        where = archive.location(v.id, v.dir_key, step)
        began = time.monotonic()
        n = archive.put_step(tree, CKPT, m, where, Throttle(mb_s))
        took = time.monotonic() - began
        now = self.clock()
        with self.lock, self.store.session.begin() as s:
            copies.put(s, v.id, step, cplan.ARCHIVE, nbytes=n, files=len(m.files), at=now, location=where,
                       metrics=m.metrics)
            record(s, ACTOR, "checkpoint.archived",
                   f"step {step}: {n} bytes copied to the archive and verified in {took:.1f}s",
                   job_id=v.id, at=now, data={"step": step, "bytes": n, "seconds": round(took, 3),
                                              "location": where})
        self.archived += 1
        self.archived_bytes += n

    def _remove_fast(self, v: JobView, tree: jobfs.Tree, step: int, *, archived: bool, rule: str) -> None:
        """Remove a step from the job dir, marker first (never through a link); then its record."""
        rel = f"{CKPT}/step-{step}"
        tree.remove(f"{rel}/{CHECKPOINT_MARKER}")
        if not tree.remove_tree(rel):
            log.warning("checkpoint tiers: job %s: %s could not be removed entirely", v.id, rel)
        now = self.clock()
        with self.lock, self.store.session.begin() as s:
            row = copies.drop(s, v.id, step, cplan.FAST)
            nbytes = row.bytes if row is not None else 0
            if not archived:
                record(s, ACTOR, "checkpoint.deleted", f"step {step}: {nbytes} bytes deleted from the fast tier ({rule})",
                       job_id=v.id, at=now, data={"step": step, "tier": cplan.FAST, "bytes": nbytes, "rule": rule})
        if not archived:
            self.deleted += 1

    def _remove_archive(self, v: JobView, archive: Archive, step: int, rule: str) -> None:
        with self.store.session() as s:
            row = s.get(CheckpointCopyRow, (v.id, step, cplan.ARCHIVE))
            where = row.location if row is not None else ""
        if where:
            archive.remove(where)
        now = self.clock()
        with self.lock, self.store.session.begin() as s:
            row = copies.drop(s, v.id, step, cplan.ARCHIVE)
            nbytes = row.bytes if row is not None else 0
            record(s, ACTOR, "checkpoint.deleted", f"step {step}: {nbytes} bytes deleted from the archive ({rule})",
                   job_id=v.id, at=now, data={"step": step, "tier": cplan.ARCHIVE, "bytes": nbytes, "rule": rule,
                                              "location": where})
        self.deleted += 1


def _rule_words(rules: CheckpointRules, ended_at: float | None, now: float) -> str:
    """Which rule let a step go, in the audit event's words."""
    if rules.keep_for is not None and ended_at is not None and now >= ended_at + rules.keep_for:
        return f"keep_for: {rules.keep_for:.0f}s after the job ended, only steps marked keep remain"
    parts = [f"keep_last: {rules.keep_last or DEFAULT_KEEP_LAST}"]
    if rules.keep_every is not None:
        parts.append(f"keep_every: {rules.keep_every}")
    if rules.keep_best is not None:
        parts.append(f"keep_best: {rules.keep_best.count} by {rules.keep_best.mode} {rules.keep_best.metric}")
    return "not kept by " + ", ".join(parts)
