"""`yard share` (sshare) and `yard prio` (sprio): fair share and the engine's order, as the schedule
step (`control/loop/schedule.py`) would see them now.

Both rebuild the step's inputs the way it does (the waiting rows it would hand the engine, the
running jobs, each team's decayed usage over the same horizon and half-life) and read the order
through the engine's own public functions (`sched.ordering.keyed_in_order`, `fairshare_factors`,
`sched.quota.QuotaLedger`): nothing here decides anything, so what `yard prio` shows is the
order the next cycle considers the jobs in. The engine's factors (most significant first):
tier (in quota: it fits beside what its team holds with work of its priority or more; else
borrowing), class priority, urgency (waited `reserve_at` of the class's max wait), then the
score — log of the estimated remaining GPU-seconds × the team's fair-share factor, less the
aging credit — then submit time and id. Within a cycle the engine may still move an in-quota
job behind the borrowing ones when in-quota jobs ahead of it take its team's quota first.

Fair share (sshare's columns): a team's normalized share is its nominal quota over all teams'
in the pool; its usage is its decayed GPU-seconds (each second weighted 2^(-age / 7 days), as
Slurm's PriorityDecayHalfLife), normalized over all teams; the engine's factor is
(usage share / quota share) ^ fairshare_weight, clamped to [1/8, 8]: 1 is on share, above 1 a
team that used more than its share waits a little longer. `level_fs` is Slurm's Level FS
(share / usage; above 1 under-served). The policy in force must be trainyard's for the order
to be its; another policy's name is reported and the trainyard order is not claimed.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from trainyard.control.loop.schedule import PENDING_COLUMNS, _array_throttle, _waiting_rows
from trainyard.control.loop.snapshot import USAGE_HALF_LIFE_S, NodeIndex, PendingCache, build_snapshot, decayed_usage
from trainyard.sched.ordering import OrderingParams, fairshare_factors, keyed_in_order
from trainyard.sched.quota import QuotaLedger
from trainyard.services.config import ConfigVersion
from trainyard.services.errors import Conflict, NotFound
from trainyard.services.nodes import node_states
from trainyard.services.priority_report import JobPriority, PriorityReport, ShareReport, TeamShare
from trainyard.states import ACTIVE_STATES, PENDING_STATES
from trainyard.store.models import AttemptRow, JobRow


def _ordering(cfg: ConfigVersion) -> OrderingParams:
    params = getattr(cfg.policy, "params", None)
    return getattr(params, "ordering", None) or OrderingParams()


def _usage(s: Session, now: float) -> dict[str, float]:
    """Each team's decayed GPU-seconds, from the attempts the schedule step reads (same horizon)."""
    horizon = now - 6 * USAGE_HALF_LIFE_S
    spans = s.execute(select(JobRow.team, AttemptRow.gpus, AttemptRow.started_at, AttemptRow.ended_at)
                      .join(JobRow, JobRow.id == AttemptRow.job_id)
                      .where(or_(AttemptRow.ended_at.is_(None), AttemptRow.ended_at > horizon))).all()
    return decayed_usage(((t, g, a, b) for t, g, a, b in spans), now)


def _held_now(s: Session) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    q = (select(JobRow.team, JobRow.pool, AttemptRow.gpus).join(JobRow, JobRow.id == AttemptRow.job_id)
         .where(AttemptRow.ended_at.is_(None), JobRow.state.in_(ACTIVE_STATES)))
    for t, p, g in s.execute(q):
        out[(t, p)] = out.get((t, p), 0) + g
    return out


def share(s: Session, cfg: ConfigVersion, now: float) -> ShareReport:
    teams, _ = cfg.sched
    op = _ordering(cfg)
    usage = _usage(s, now)
    held = _held_now(s)
    total_use = sum(usage.get(t, 0.0) for t in teams)
    pools = sorted({p for t in cfg.spec.teams for p in t.quotas} | {n.pool for n in cfg.nodes})
    out = []
    for pool in pools:
        fs = fairshare_factors(teams, usage, pool, op.fairshare_weight)
        total_nom = sum(t.quota(pool).nominal for t in teams.values())
        for name, t in sorted(teams.items()):
            q = t.quota(pool)
            spec = next(x for x in cfg.spec.teams if x.name == name)
            if pool not in spec.quotas and not held.get((name, pool)):
                continue
            norm_shares = q.nominal / total_nom if total_nom else 0.0
            norm_usage = usage.get(name, 0.0) / total_use if total_use > 0 else 0.0
            out.append(TeamShare(team=name, pool=pool, cohort=t.cohort, nominal_gpus=q.nominal,
                                 borrowing_limit=q.borrowing_limit, lending_limit=q.lending_limit,
                                 gpus_allocated=held.get((name, pool), 0), norm_shares=norm_shares,
                                 raw_usage_gpu_hours=usage.get(name, 0.0) / 3600.0, norm_usage=norm_usage,
                                 level_fs=norm_shares / norm_usage if norm_usage > 0 else None,
                                 fairshare_factor=fs[name], fairshare=sshare_fairshare(norm_usage, norm_shares)))
    return ShareReport(now=now, policy=cfg.spec.scheduler.policy, half_life_s=USAGE_HALF_LIFE_S,
                       fairshare_weight=op.fairshare_weight, teams=out)


def sshare_fairshare(norm_usage: float, norm_shares: float) -> float:
    """Slurm's classic fair-share factor, 2^(-U/S): 1 for a team that used nothing, 0.5 for one
    that used exactly its share, towards 0 beyond; 0 for a team with no share that used any."""
    if norm_shares <= 0:
        return 1.0 if norm_usage <= 0 else 0.0
    return 2.0 ** (-norm_usage / norm_shares)


def priority(s: Session, cfg: ConfigVersion, now: float, job_ids: tuple[int, ...] = ()) -> PriorityReport:
    """The waiting jobs in the order the next cycle considers them (only `job_ids`, when given).

    Raises:
        NotFound: a job asked for does not exist. Conflict: it is not waiting for the scheduler
            (running, ended, held, waiting on a dependency, a begin time or a retry's backoff).
    """
    teams, classes = cfg.sched
    op = _ordering(cfg)
    running = list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))))
    rows, _ = _array_throttle(_waiting_rows(s, now), running)
    for jid in job_ids:
        if not any(r.id == jid for r in rows):
            _why_not_considered(s, jid, now)
    idx = NodeIndex.build(cfg, node_states(s))
    snap = build_snapshot(cfg, idx, running, rows, _usage(s, now), now, PendingCache(PENDING_COLUMNS), explain=False)
    ledger = QuotaLedger(snap.teams, ((r.req.team, r.req.pool, r.gpus) for r in snap.running))
    # GPUs held per (team, pool) and class priority, as the engine's step 1 counts them: a job is in
    # quota when it fits beside what its team holds with work of its priority or more
    levels: dict[tuple[str, str], dict[int, int]] = {}
    for r in snap.running:
        d = levels.setdefault((r.req.team, r.req.pool), {})
        prio = classes[r.req.job_class].priority if r.req.job_class in classes else 0
        d[prio] = d.get(prio, 0) + r.gpus

    def headroom(team: str, pool: str, prio: int) -> int:
        held = levels.get((team, pool), {})
        return ledger.nominal(team, pool) - sum(g for p, g in held.items() if p >= prio)

    pools = {pj.req.pool for pj in snap.pending}
    fs = {pool: fairshare_factors(snap.teams, snap.usage, pool, op.fairshare_weight) for pool in pools}
    order, in_quota = keyed_in_order(snap.pending, classes, now, headroom, fs, op)
    by_id = {r.id: r for r in rows}
    extra = {r.id: r for r in s.execute(select(JobRow.id, JobRow.name, JobRow.user, JobRow.reason, JobRow.est_start)
                                        .where(JobRow.id.in_(list(by_id))))} if by_id else {}
    wanted = set(job_ids)
    out = []
    for rank, (key, pj) in enumerate(order, 1):
        req = pj.req
        if wanted and req.id not in wanted:
            continue
        cls = classes[req.job_class]
        est = req.est_runtime_s if req.est_runtime_s is not None else (cls.max_run_s or op.unknown_runtime_s)
        e: Any = extra[req.id]
        out.append(JobPriority(
            rank=rank, id=req.id, name=e.name, user=e.user, team=req.team, pool=req.pool, job_class=req.job_class,
            class_priority=cls.priority, tier="in-quota" if rank <= in_quota else "borrowing", urgent=key[1] == 0,
            waited_fraction=(now - req.submit_time) / (cls.max_wait_s if cls.max_wait_s > 1.0 else 1.0),
            remaining_gpu_s=max(60.0, est - pj.progress_s) * req.min_gpus,
            fairshare_factor=fs[req.pool].get(req.team, 1.0), score=key[2] if key[1] == 1 else None,
            gpus=req.min_gpus, reason=e.reason, est_start=e.est_start))
    return PriorityReport(now=now, policy=cfg.spec.scheduler.policy,
                          ordering={k: float(getattr(op, k)) for k in ("reserve_at", "aging_weight",
                                                                       "fairshare_weight", "unknown_runtime_s")},
                          jobs=out)


def _why_not_considered(s: Session, jid: int, now: float) -> None:
    j = s.get(JobRow, jid)
    if j is None:
        raise NotFound(f"no job {jid}")
    if j.state not in PENDING_STATES:
        why = f"it is {j.state}"
    elif j.held:
        why = f"it is held ({j.reason})"
    elif j.dependency_pending:
        why = f"it waits on its dependency {j.dependency}"
    elif j.begin_time is not None and j.begin_time > now:
        why = "its begin time has not come"
    elif j.retry_after is not None and j.retry_after > now:
        why = "it waits out a retry's backoff"
    else:
        why = f"its array's throttle holds it back ({j.reason})"
    raise Conflict(f"job {jid} is not in the scheduler's order: {why}", field="jobs")
