"""Step 4 of a pass: a `Snapshot` from the store, one `policy.cycle()`, its decisions applied.

The waiting jobs are read as plain rows of the columns the engine needs (`PENDING_COLUMNS`);
held jobs, jobs still waiting on a dependency, before their begin time or in a retry's backoff are
not the engine's business, an array's `%N` throttle keeps its later tasks back, and the storage
meter (`control/lifecycle/storage.py`) holds the jobs of a team over its disk quota (`StorageQuota`), or all
of them while the disk reserve is crossed (`DiskReserve`), as Slurm keeps a job over its
association's limits out of the schedule. The decisions
are applied under the write lock, each re-checked against the store (a job cancelled meanwhile is
not started). A start is committed before the backend launches it (`control/loop/attempt_start.py`). Every
job left waiting gets the engine's reason and estimated start (`squeue`'s REASON and START_TIME);
an estimate that moved is recorded, and a start settles its wait's promise (services/estimates.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.orm import Session

from trainyard.backends.base import LaunchSpec
from trainyard.control.loop import attempt_start, before_work
from trainyard.control.loop.context import Facts, LoopContext
from trainyard.control.health import HealthChecker
from trainyard.control.loop.launch_threads import for_backend
from trainyard.control.loop.snapshot import NodeIndex, PendingCache, build_snapshot
from trainyard.control.loop.usage_cache import DecayedUsage
from trainyard.sched.policy import Policy
from trainyard.sched.types import BORROWING_LIMIT, COHORT_IN_USE, PendingInfo, Reason
from trainyard.services import arrays, dataset_nodes, estimates, transitions
from trainyard.services.nodes import node_states
from trainyard.states import ACTIVE_STATES, PENDING_STATES, JobState, StopKind
from trainyard.store.models import ENGINE_COLUMNS, JobRow

# squeue's names for the engine's reasons.
REASONS = {
    Reason.QUOTA: "Quota", Reason.CAPACITY: "Resources", Reason.TOPOLOGY: "Topology", Reason.MEMORY: "GpuMemory",
    Reason.RESERVATION: "Reservation", Reason.PRIORITY: "Priority", Reason.HELD: "JobHeldUser",
    Reason.PREEMPTING: "Preempting",
    # admin reservations (sched/reservations.py), in Slurm's words: held nodes (now, or before the
    # job's time limit would end), a reservation not started yet, one that ended or was deleted
    Reason.RESERVED: "ReqNodeNotAvail, Reserved for maintenance", Reason.RESV_WAIT: "Reservation",
    Reason.RESV_GONE: "ReservationDeleted",
}
# A job blocked by quota that no rule can help says which limit holds it (`PendingInfo.detail`).
DETAILS = {BORROWING_LIMIT: "QuotaBorrowingLimit", COHORT_IN_USE: "QuotaCohortInUse"}


def reason_text(info: PendingInfo) -> str:
    """squeue's REASON for a waiting job."""
    if info.detail is not None:
        return DETAILS.get(info.detail, info.detail)
    return REASONS.get(info.reason, str(info.reason.value))


# What `snapshot.pending_of` (every column marked `engine()` in store.models) and the reason and
# array bookkeeping read of a waiting job.
PENDING_COLUMNS = ENGINE_COLUMNS + ("reason", "est_start", "array_job_id", "array_task_id", "array_throttle")


class Scheduler:
    def __init__(self, ctx: LoopContext, health: HealthChecker, policy: Policy | None = None) -> None:
        """`policy`: a fixed policy (tests, benchmarks); None runs the one the configuration in
        force names (`scheduler:` in the cluster config), so a `yard cluster apply` changes it."""
        self.ctx, self.health, self.policy = ctx, health, policy
        self._pending_cache = PendingCache(PENDING_COLUMNS)  # waiting jobs unchanged since the last pass are not rebuilt
        # victim -> the job it was preempted for, while both are in play (`Snapshot.stopped_for`).
        # Kept in memory: after a restart of the plane, at most one more preemption sets it again.
        self._stopped_for: dict[int, int] = {}
        self._usage = DecayedUsage()  # fair share's usage, kept up to date (not six weeks reread a pass)
        self.launches = for_backend(ctx)  # inline, or off the loop's thread (Slurm)
        self._estimates = estimates.Recorder()  # the estimates recorded as they change (services/estimates.py)

    def run(self, facts: Facts, now: float) -> int:
        """One scheduling cycle; returns how many running jobs it asked to stop (preemptions),
        whose notices the orchestrator then sends in the same pass."""
        ctx = self.ctx
        with ctx.store.session() as s:
            cfg = ctx.configs.current(s)
            states = node_states(s)
            running = list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))))
            pending = _waiting_rows(s, now)
            pending, limited = _array_throttle(pending, running)
            if limited:
                self._note([(r, "JobArrayTaskLimit") for r in limited])
            pending = self._disk_holds(pending)
            if not pending:
                return 0
            unhealthy = facts.unhealthy
            unchecked, checking = before_work.gate(self.health, cfg, states, unhealthy, running, pending, now)
            idx = NodeIndex.build(cfg, states, unhealthy + sorted(unchecked))
            usage = self._usage(s, now)
            data_on = dataset_nodes.data_on(s)  # the tie-break: nodes that hold a job's datasets
        snap = build_snapshot(cfg, idx, running, pending, usage, now, self._pending_cache,
                              stopped_for=self._victims_in_play(running, pending),
                              launching=facts.launching | self.launches.in_flight(), data_on=data_on)
        result = (self.policy or cfg.policy).cycle(snap)
        by_id = {j.id: j for j in pending}
        launches: list[LaunchSpec] = []
        stopping = 0
        with ctx.lock, ctx.store.session.begin() as s:
            for pre in result.preemptions:
                if checking:
                    break  # a node being checked may be free for it in a moment: no preemption meanwhile
                v = s.get(JobRow, pre.job_id)
                if v is None or v.state != JobState.RUNNING or v.stop_kind is not None:
                    continue
                self._stopped_for[pre.job_id] = pre.for_job
                transitions.request_stop(
                    s, v, StopKind.PREEMPT, now, actor="scheduler", event="job.preempting", reason="Preempting",
                    message=f"preempted ({pre.reason}) to make room for job {pre.for_job}; checkpoint notice follows",
                    data={"reason": pre.reason, "for_job": pre.for_job})
                stopping += 1
            for st in result.starts:
                j = s.get(JobRow, st.job_id)
                seen = by_id.get(st.job_id)
                if j is None or j.state not in PENDING_STATES or j.held or seen is None or j.attempt != seen.attempt:
                    continue
                estimates.settle(s, j, now)  # the promise its wait was given, kept or not
                launches.append(attempt_start.start(ctx, s, j, idx, st.placement, cfg.spec.cluster.name, now))
            texts = {k: reason_text(v) for k, v in result.pending.items() if k in by_id}
            updates = [{"jid": k, "r": texts[k], "e": v.est_start}
                       for k, v in result.pending.items()
                       if k in by_id and (by_id[k].reason != texts[k] or by_id[k].est_start != v.est_start)]
            if updates:
                write_reasons(s, updates)
            self._estimates.note(s, now, {k: v.est_start for k, v in result.pending.items()},
                                 {r.id: (r.attempt + 1, r.est_start) for r in pending})
        for spec in launches:
            self.launches.start(spec, now)
        return stopping

    def _victims_in_play(self, running: Sequence[JobRow], pending: Sequence[Any]) -> dict[int, int]:
        """The victims still running or waiting whose preemptor still waits; the rest forgotten."""
        if not self._stopped_for:
            return {}
        waiting = {j.id for j in pending}
        present = waiting | {j.id for j in running}
        self._stopped_for = {v: b for v, b in self._stopped_for.items() if v in present and b in waiting}
        return dict(self._stopped_for)

    def _disk_holds(self, pending: list[Any]) -> list[Any]:
        """The waiting rows the storage meter does not hold back; those it holds get its reason."""
        holds = self.ctx.holds() if self.ctx.holds is not None else None
        if holds is None or not (holds.reserve or holds.teams):
            return pending
        kept, held = [], []
        for r in pending:
            why = holds.reason(r.team)
            if why is None:
                kept.append(r)
            else:
                held.append((r, why))
        self._note(held)
        return kept

    def _note(self, held: list[tuple[Any, str]]) -> None:
        """Waiting rows kept back from the engine this pass, each with its reason (an array's `%N`
        throttle: JobArrayTaskLimit; the storage meter's) and no estimate; written where it changed."""
        updates = [{"jid": r.id, "r": why, "e": None} for r, why in held if r.reason != why or r.est_start is not None]
        if updates:
            with self.ctx.lock, self.ctx.store.session.begin() as s:
                write_reasons(s, updates)


def _waiting_rows(s: Session, now: float) -> list[Any]:
    """Plain rows of the columns the engine reads, not ORM objects: with thousands waiting, loading
    them was most of a pass. Held jobs are not the engine's business."""
    t = JobRow.__table__
    return list(s.execute(select(*(t.c[c] for c in PENDING_COLUMNS))
                          .where(t.c.state.in_(PENDING_STATES), t.c.held.is_(False),
                                 t.c.dependency_pending.is_(False),
                                 or_(t.c.begin_time.is_(None), t.c.begin_time <= now),
                                 or_(t.c.retry_after.is_(None), t.c.retry_after <= now))
                          .order_by(t.c.id)).all())


def write_reasons(s: Session, updates: list[dict[str, Any]]) -> None:
    """Bulk-set waiting jobs' reason and estimated start ({"jid", "r", "e"} each); a job that has
    started, ended or been held since it was read is left as it is."""
    t = JobRow.__table__
    still_waiting = or_(*(t.c.state == st for st in PENDING_STATES))  # no IN: executemany can't expand it
    s.execute(update(t).where(and_(t.c.id == bindparam("jid"), still_waiting, t.c.held.is_(False)))
              .values(reason=bindparam("r"), est_start=bindparam("e")), updates)


def _array_throttle(pending: list[Any], running: Sequence[JobRow]) -> tuple[list[Any], list[Any]]:
    """Split the waiting rows into those the scheduler sees and those an array's `%N` throttle keeps
    back this pass (`services.arrays.throttled`)."""
    capped = [(r.id, r.array_job_id, r.array_task_id, r.array_throttle) for r in pending if r.array_throttle]
    if not capped:
        return pending, []
    active: dict[int, int] = {}
    for j in running:
        if j.array_job_id is not None:
            active[j.array_job_id] = active.get(j.array_job_id, 0) + 1
    out = arrays.throttled(capped, active)
    return [r for r in pending if r.id not in out], [r for r in pending if r.id in out]
