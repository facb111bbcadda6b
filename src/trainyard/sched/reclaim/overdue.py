"""Step 5d: an overdue job takes its place back from the jobs of its team that overtook it.

A job that has been pending `OverdueParams.at` of its class's max wait and is no larger than its
team's nominal quota may stop its own team's jobs of its priority that are smaller than it and
were submitted after it, and takes their place in the team's quota (never more than its own size:
`victims.find_victims`): without it, a team's stream of small jobs, in quota and so tried first,
takes every GPU its quota frees and a large job of the team waits until the stream ends (issue 20
part 5: Slurm's answer is a reservation for its top job). No other team's GPUs or quota are
touched. Victims of a class that checkpoints on the notice lose its save and restart; others must
have saved a checkpoint in this attempt and lose at most `ShareParams.max_lost_s` per GPU. While
it waits, those jobs do not start (`overdue_first`). No ping-pong: a victim was submitted after
its preemptor and is smaller, so it can never stop it back; like every victim it has run its
class's min run time. Its wait is then bounded by `at` of its max wait, plus what its team's older
jobs have left to run (or the younger ones' min run time), plus their grace.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

from trainyard.sched.cycle.state import CycleState
from trainyard.sched.reclaim.victims import in_own_team_place
from trainyard.sched.types import JobClass, JobId, JobRequest, PendingJob, PreemptionKind, RunningJob

# Per (team, pool): the overdue job's (priority, (submit time, id), GPUs).
OverdueJobs = dict[tuple[str, str], tuple[int, tuple[float, JobId], int]]


class Overdue:
    name = "overdue"

    def try_(self, st: CycleState, pj: PendingJob, prio: int) -> bool:
        p, req = st.p, pj.req
        if p.overdue.at is None:
            return False
        cls = st.snap.classes[req.job_class]
        if st.now - pj.queued_since < overdue_after(st, req, cls):
            return False  # (pending that long now: a victim requeued a moment ago is not overdue)
        if req.min_gpus > st.ledger.nominal(req.team, req.pool):
            return False  # it can only ever borrow: its own team's GPUs would not make it fit
        if not st.searches_left():
            return False
        memo = ("overdue", req.team, prio, req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib,
                req.where, req.submit_time, st.mask)
        if memo in st.no_share:
            return False
        classes, now, max_lost, min_attempt = st.snap.classes, st.now, p.share.max_lost_s, p.share.min_attempt_s
        stopping, pool, lost, on_notice, mine = st.stopping, req.pool, st.lost, st.on_notice, req.team
        after, size = (req.submit_time, req.id), req.min_gpus

        def ok(r: RunningJob) -> bool:
            rq = r.req
            if rq.team != mine or rq.id in stopping or rq.pool != pool or (rq.submit_time, rq.id) <= after:
                return False
            if classes[rq.job_class].priority != prio or r.gpus >= size:
                return False
            if not on_notice[rq.job_class]:
                ran = now - r.start_time
                if ran < min_attempt or ran < (rq.checkpoint_interval_s or 0.0) or lost(r) > max_lost * r.gpus:
                    return False
            return True

        return in_own_team_place(st, pj, prio, ok, memo, PreemptionKind.OVERDUE)


def overdue_first(st: CycleState, order: list[tuple[Any, PendingJob]], n_first: int) -> OverdueJobs:
    """Per (team, pool), the first-submitted overdue job that its team's quota has no room for
    although it is no larger than that quota: (its priority, (submit time, id), GPUs), when only
    its team's smaller jobs of its priority submitted after it stand in its way. While it waits,
    those do not start: without that, in a stream of short jobs some are always within their min
    run time, so it never finds enough victims at once."""
    if st.p.overdue.at is None:
        return {}
    now, classes, nominal, hold_grace = st.now, st.snap.classes, st.ledger.nominal, st.p.overdue.hold_grace
    first: OverdueJobs = {}
    by_team: dict[tuple[str, str], list[RunningJob]] | None = None
    for _, pj in islice(order, n_first, None):
        req = pj.req
        cls = classes[req.job_class]
        late = now - pj.queued_since - overdue_after(st, req, cls)
        # Held back for one min run time and part of a grace at most: long enough for the
        # running ones to become victims, never so long that the team's own quota idles (a
        # team whose jobs wait beside unused quota that others borrow is owed it).
        if pj.held or late < 0 or late > cls.min_run_s + hold_grace * cls.grace_s:
            continue
        tp, mine = (req.team, req.pool), (req.submit_time, req.id)
        if tp in first and first[tp][1] < mine:
            continue
        need = req.min_gpus
        if need > nominal(req.team, req.pool) or need <= st.headroom(req.team, req.pool, cls.priority):
            continue
        # Only while what stands in its way is its team's smaller, younger jobs: if older or
        # larger ones hold the quota it needs, holding the team back would only idle it.
        if by_team is None:
            by_team = {}
            for r in st.snap.running:
                by_team.setdefault((r.req.team, r.req.pool), []).append(r)
        prio = cls.priority
        other = sum(r.gpus for r in by_team.get(tp, ()) if classes[r.req.job_class].priority >= prio and not (
            classes[r.req.job_class].priority == prio and r.gpus < need and (r.req.submit_time, r.req.id) > mine))
        if nominal(req.team, req.pool) - other >= need:
            first[tp] = (prio, mine, need)
    return first


def held_back(overdue: OverdueJobs, prio_of: dict[str, int], req: JobRequest) -> bool:
    """Whether `req` would take the quota an older, larger overdue job of its team waits for."""
    o = overdue.get((req.team, req.pool))
    return o is not None and prio_of[req.job_class] == o[0] and req.min_gpus < o[2] and (req.submit_time, req.id) > o[1]


def overdue_after(st: CycleState, req: JobRequest, cls: JobClass) -> float:
    """How long a job pends before it is overdue: `OverdueParams.at` of its max wait, or, for a
    class its team runs least-attained-service for, at least `las_reserve_at` of it (as urgency:
    serving such a team's jobs oldest first would turn its queue back into FIFO, which is what it
    asked not to have)."""
    at = st.p.overdue.at or 0.0
    team = st.snap.teams.get(req.team)
    if team is not None and team.las and team.las_for(req.job_class):
        at = max(at, st.p.ordering.las_reserve_at)
    return at * cls.max_wait_s
