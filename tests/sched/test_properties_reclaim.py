"""Properties of reclaim on random snapshots (hypothesis), issue 20 parts 8 and 9.

- No ping-pong: a job stopped by a reclaim does not restart on any GPU it left before the job it
  was stopped for has started, over the cycles that follow its leaving.
- Every job stopped for another team needs to borrow to restart: once the victims have left and
  the jobs they were stopped for have started, `used(team, >= its priority) + its GPUs >
  nominal(team)` — unless the team lost a whole job larger than what it borrows (the third
  rule), where it loses less than what it borrows plus that job. So it is ordered after the in-quota
  job it was stopped for (the tier), which is what makes the first property hold.
- A team loses, to another team, only what it borrows at the victim's level, or (a whole job for
  a team owed its quota) less than that plus one victim.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard.sched.cluster import ClusterState, Node
from trainyard.sched.engine import TrainyardPolicy
from trainyard.sched.placement import place
from trainyard.sched.quota import QuotaLedger
from trainyard.sched.types import JobRequest, PendingJob, Quota, RunningJob, Snapshot, Team

from tests.sched.builders import CLASSES
from tests.sched.test_properties import SETTINGS
from tests.sched.test_reclaim import after

ENGINE = TrainyardPolicy()


@st.composite
def contended(draw) -> Snapshot:
    """A full cluster shared by 2-3 teams of one cohort whose nominal quotas add up to it, some
    of them borrowing, with pending jobs that have waited up to an hour (past the reclaim
    patience). The general `snapshots()` strategy almost never makes a reclaim."""
    n_nodes = draw(st.integers(1, 4))
    gpus = draw(st.sampled_from([4, 8]))
    ns = [Node(f"n{i}", gpus, 80 * 1024, block="b0", rack=f"r{i // 2}") for i in range(n_nodes)]
    total = n_nodes * gpus
    names = ["a", "b", "c"][: draw(st.integers(2, 3))]
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=len(names) - 1, max_size=len(names) - 1)))
    shares = [hi - lo for lo, hi in zip([0, *cuts], [*cuts, total])]
    tm = {t: Team(t, "lab", {"default": Quota(q)}) for t, q in zip(names, shares)}
    now = 100_000.0
    state = ClusterState(ns)
    ledger = QuotaLedger(tm)
    run: list[RunningJob] = []
    for k in range(draw(st.integers(4, 20))):
        r = _job(draw, k, names, gpus, now)
        if not ledger.fits(r.team, r.pool, r.min_gpus):
            continue
        pl, _ = place(state, r, r.min_nodes)
        if pl is None:
            continue
        state.allocate(pl)
        ledger.add(r.team, r.pool, pl.gpus)
        start = now - draw(st.floats(0, 5000))
        run.append(RunningJob(r, pl, start, start + draw(st.floats(0, 1000))))
    pend = [PendingJob(_job(draw, 100 + k, names, gpus, now), queued_since=now - draw(st.floats(0, 3600)))
            for k in range(draw(st.integers(1, 6)))]
    return Snapshot(now, state, tm, CLASSES, run, pend, explain=draw(st.booleans()))


def _job(draw, jid, names, gpus, now) -> JobRequest:
    team = draw(st.sampled_from(names))
    cls = draw(st.sampled_from(list(CLASSES)))
    submit = now - draw(st.floats(3600, 86400))
    est = draw(st.one_of(st.none(), st.floats(600, 86400)))
    if draw(st.booleans()):
        return JobRequest(jid, team, cls, submit, gpus=draw(st.integers(1, gpus)), est_runtime_s=est)
    n = draw(st.integers(1, 2))
    return JobRequest(jid, team, cls, submit, gpus=gpus * n, gpus_per_node=gpus, min_nodes=n, max_nodes=n,
                      est_runtime_s=est)


def _held(snap: Snapshot, team: str, pool: str, prio: int, gone: set) -> int:
    return sum(r.gpus for r in snap.running if r.req.id not in gone and (r.req.team, r.req.pool) == (team, pool)
               and snap.classes[r.req.job_class].priority >= prio)


@SETTINGS
@given(contended())
def test_every_job_stopped_for_another_team_must_borrow_to_restart(snap: Snapshot):
    res = ENGINE.cycle(snap)
    running = {r.req.id: r for r in snap.running}
    pending = {pj.req.id: pj for pj in snap.pending}
    gone = {p.job_id for p in res.preemptions} | {r.req.id for r in snap.running if r.preempting}
    # "Once the victims have left" the jobs they were stopped for start, the victim's own team's
    # among them: a team that stops its batch job for another team's and its training job for its
    # own interactive one holds that interactive job when the batch job asks to restart.
    coming = {pending[p.for_job].req for p in res.preemptions}
    lent = [running[p.job_id] for p in res.preemptions if running[p.job_id].req.team != pending[p.for_job].req.team]
    for v in lent:
        team, pool = v.req.team, v.req.pool
        prio = snap.classes[v.req.job_class].priority
        nominal = snap.teams[team].quota(pool).nominal
        at_level = [r for r in lent if r.req.team == team and snap.classes[r.req.job_class].priority >= prio]
        lost = sum(r.gpus for r in at_level)
        borrowed = _held(snap, team, pool, prio, set()) - nominal
        if lost > borrowed:
            # A whole job for a team owed its quota (budget.py): the team may end below nominal by
            # less than one victim, and a victim stopped earlier in the cycle may then restart
            # inside its quota. It may not lose more than that.
            assert lost < borrowed + max(r.req.min_gpus for r in at_level), (v.req.id, lost, borrowed)
            continue
        own = sum(r.min_gpus for r in coming if (r.team, r.pool) == (team, pool)
                  and snap.classes[r.job_class].priority >= prio)
        assert _held(snap, team, pool, prio, gone) + own + v.req.min_gpus > nominal


@SETTINGS
@given(contended())
def test_no_ping_pong(snap: Snapshot):
    res = ENGINE.cycle(snap)
    stopped = {p.job_id: p.for_job for p in res.preemptions if p.reason == "reclaim"}
    if not stopped:
        return
    left = {r.req.id: {(i, g) for i, gs in r.placement.nodes for g in gs} for r in snap.running if r.req.id in stopped}
    grace = max(snap.classes[r.req.job_class].grace_s for r in snap.running if r.req.id in stopped)
    started: set = set()
    cur, now = snap, snap.now
    for k in range(3):  # the victims leave, then three cycles a minute apart
        now = now + (grace + 1 if k == 0 else 60.0)
        cur = after(cur, res, now)
        res = ENGINE.cycle(cur)
        started |= {s.job_id for s in res.starts}
        for s in res.starts:
            if s.job_id in stopped and stopped[s.job_id] not in started:
                gpus = {(i, g) for i, gs in s.placement.nodes for g in gs}
                assert not gpus & left[s.job_id], (s, stopped[s.job_id])


@pytest.mark.parametrize("whole", [False, True])
def test_budget_rules_on_a_hand_made_team(whole):
    # One team, nominal 6, holding training 4 + 4 and batch 4: it borrows 2 at the training
    # level and 6 at the batch level.
    from trainyard.sched.budget import VictimBudget, borrowed_levels
    from tests.sched.builders import CLASSES, req
    from trainyard.sched.cluster import Placement
    from trainyard.sched.types import RunningJob

    prio = {n: c.priority for n, c in CLASSES.items()}
    levels = {"y": borrowed_levels({200: 8, 100: 4}, 6)}
    assert levels["y"] == [(200, 2.0), (100, 6.0)]
    b = VictimBudget(levels, prio, overshoot=whole)

    def job(jid, cls, g):
        return RunningJob(req(jid, "y", cls, gpus=g), Placement(((0, tuple(range(g))),), (1,)), 0.0, 0.0)

    t1, t2, bt = job(1, "training", 4), job(2, "training", 4), job(3, "batch", 4)
    assert b.candidate(bt)
    assert b.candidate(t1) is whole  # 4 > 2 borrowed at its level: only whole
    tally = b.tally()
    assert tally.take(bt)
    # Strict: training may not lose anything (2 < 4). Whole: one training job may go (4 < 2 + 4;
    # the batch level then loses 8 < 6 + 4); a second would make training lose 8 >= 2 + 4.
    assert tally.take(t1) is whole
    if whole:
        assert not tally.take(t2)
