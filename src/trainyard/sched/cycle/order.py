"""Step 2: the order in which a cycle tries the pending jobs.

`order` sorts them (`ordering.keyed_in_order`: priority, urgency, in-quota before borrowing,
shortest estimated remaining GPU-time with fair share); `in_turn` and `after_their_bosses` then
adjust that order as the cycle goes, since whether a job is still in quota depends on what
started ahead of it. Each rule below keeps the story of the run that asked for it.
"""

from __future__ import annotations

import heapq
from itertools import islice
from typing import Any, Iterable

from trainyard.sched.cycle.state import CycleState
from trainyard.sched.ordering import fairshare_factors, keyed_in_order
from trainyard.sched.types import JobId, PendingJob

Keyed = tuple[Any, PendingJob]  # (the order's sort key, the job)


def order(st: CycleState) -> tuple[list[Keyed], int]:
    """The pending jobs in order, and how many of them (first) are in quota (tier 0)."""
    snap, op = st.snap, st.p.ordering
    pools = {pj.req.pool for pj in snap.pending}
    fs = {pool: fairshare_factors(snap.teams, snap.usage, pool, op.fairshare_weight) for pool in pools}
    keyed, n_first = keyed_in_order(snap.pending, snap.classes, st.now, st.headroom, fs, op, snap.teams)
    bosses = set(snap.stopped_for.values()) if snap.stopped_for else None
    if bosses:
        keyed = preemptors_first(st, keyed, n_first, bosses)
    return keyed, n_first


def preemptors_first(st: CycleState, keyed: list[Keyed], n_first: int, bosses: set[JobId]) -> list[Keyed]:
    """Among the borrowing jobs (tier 1), one whose victims are leaving or have left
    (`Snapshot.stopped_for`) goes first among the jobs of its priority, as Slurm's preemptor
    is the job it starts next.

    Its victims gave up their GPUs for it. Tried after a borrowing job of its priority that
    merely scored better, it saw that job take them (in the run against real Slurm a
    borrowing 4-GPU job took the node another team's 4-GPU job had just stopped a job for,
    and was reclaimed a second later). Not among the in-quota jobs: lifted there as well,
    the ten Philly windows broke a quota on three of twenty runs (none without).
    `CycleState.merge_key` keeps the order `in_turn` merges its demoted jobs by."""
    def key(kp: Keyed) -> tuple[Any, ...]:
        return (kp[0][0], kp[1].req.id not in bosses, kp[0])

    st.merge_key = key
    rest = keyed[n_first:]
    up = [kp for kp in rest if kp[1].req.id in bosses]
    if not up:
        return keyed
    return keyed[:n_first] + list(heapq.merge(up, (kp for kp in rest if kp[1].req.id not in bosses), key=key))


def in_turn(st: CycleState, keyed: list[Keyed], n_first: int) -> Iterable[Keyed]:
    """The jobs in the order they are tried: in-quota ones first, each only while it is still
    in quota once the jobs started or claiming GPUs ahead of it in this cycle are counted
    (it fits beside its team's jobs of its priority or more); one that no longer is goes
    with the borrowing jobs, in key order. A reclaimed job whose team's higher-priority job
    takes the quota first thus never comes back ahead of the job it was stopped for.

    An in-quota job whose own team has a higher-priority job that borrows is tried right
    after that job (`after_their_bosses`), not before it: within a team priority comes
    first, as in one Kueue ClusterQueue. Tried first, the lower-priority job took the quota
    the other needed, which then stopped it (own team, lower priority), and the next of the
    team's in-quota jobs took the GPUs it left: in the run against real Slurm a 4-GPU
    training job stopped six batch jobs of its team one after the other, a second apart."""
    demoted = []
    nominal, levels, held, prio = st.ledger.nominal, st.levels_now, st.held_now, st.prio_of
    tops: dict[tuple[str, str], tuple[int, JobId]] = {}  # each team's first borrowing job
    for key, pj in islice(keyed, n_first, None):
        tk = (pj.req.team, pj.req.pool)
        if tk not in tops:
            tops[tk] = (key[0], pj.req.id)
    behind = st.behind_top
    tier0 = st.tier0 if st.snap.stopped_for else None  # only `stopped_for` asks
    for kp in islice(keyed, n_first):
        req = kp[1].req
        hk = (req.team, req.pool)
        h = held.get(hk)
        if h and not kp[1].held:
            p = prio[req.job_class]
            lv = levels.get(hk, {})
            used = sum(g for q, g in lv.items() if q >= p) + sum(g for q, g in h.items() if q >= p)
            if used + req.min_gpus > nominal(req.team, req.pool):
                demoted.append(kp)
                continue
        if tops:
            top = tops.get(hk)
            if top is not None and top[0] < kp[0][0]:  # key[0] is -priority
                behind[req.id] = top[1]
        if tier0 is not None:
            tier0.add(req.id)
        yield kp
    rest = islice(keyed, n_first, None)
    yield from (heapq.merge(demoted, rest, key=st.merge_key) if demoted else rest)


def after_their_bosses(st: CycleState, jobs: Iterable[Keyed]) -> Iterable[Keyed]:
    """`jobs` in their order, except that a job is tried right after its "boss", not before:

    - a job stopped for a job that still waits (`Snapshot.stopped_for`): otherwise it could
      restart on the GPUs it just left and be preempted again, for ever. Not once it is inside
      its team's quota and was stopped for another team's job: its team is then owed those
      GPUs (its own work ended meanwhile; a reclaimed job always needs to borrow to restart),
      and holding it behind a borrowing job let that job's teammates take its place, each
      reclaimed a second later (the run against real Slurm);
    - an in-quota job whose team's first borrowing job has a higher priority (`in_turn`).
    """
    # `behind_top` fills while `in_turn` yields its in-quota jobs, which all come before any
    # borrowing job (so a boss from it is always still untried when its follower comes).
    stopped_for, behind_top = st.snap.stopped_for, st.behind_top
    team_of = {pj.req.id: pj.req.team for pj in st.snap.pending} if stopped_for else {}
    untried = set(team_of)
    tier0 = st.tier0
    behind: dict[JobId, list[Keyed]] = {}
    for kp in jobs:
        req = kp[1].req
        jid = req.id
        boss = stopped_for.get(jid) if stopped_for else None
        if boss is not None:
            if (jid in tier0 and team_of.get(boss) != req.team) or boss not in untried or boss == jid:
                boss = None
        if boss is None and behind_top:
            boss = behind_top.get(jid)
        if boss is not None:
            behind.setdefault(boss, []).append(kp)
            continue
        if not behind:
            untried.discard(jid)
            yield kp
            continue
        ready = [kp]
        while ready:
            nxt = ready.pop(0)
            untried.discard(nxt[1].req.id)
            yield nxt
            ready[:0] = behind.pop(nxt[1].req.id, ())
    for kps in behind.values():  # a cycle of victims and preemptors: in order
        yield from kps
