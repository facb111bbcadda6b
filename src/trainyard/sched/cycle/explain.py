"""Step 7: why every job left pending waits, and when it may start.

With `snapshot.explain`, each such job gets a reason and an estimated start (`estimate_starts`,
for the first `BackfillParams.max_estimates` jobs in order, as Slurm's bf_max_job_test). A job
blocked by quota that no step can help says which limit holds it (`quota_reason`): its team's
borrowing limit, or a cohort whose lendable GPUs are held by work it may not stop; a job that
will borrow once its victims are past their min run time gets that time as its estimate. Jobs
already leaving count as gone at their grace's end, not at their time limit.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import chain, islice
from typing import Any

from trainyard.sched.cycle.state import CycleState
from trainyard.sched.estimate import estimate_starts
from trainyard.sched.reclaim.borrow import cohort_borrowers, may_borrow
from trainyard.sched.types import BORROWING_LIMIT, COHORT_IN_USE, JobRequest, PendingInfo, PendingJob, Reason

ByTeam = dict[str, dict[int, tuple[list[tuple[int, float]], list[tuple[float, int]]]]]


def explain(st: CycleState, order: list[tuple[Any, PendingJob]]) -> None:
    """Fill `res.pending` for every job given a reason this cycle."""
    reasons, classes, snap = st.reasons, st.snap.classes, st.snap
    # Like Slurm's bf_max_job_test: only the first jobs in order get an estimate; the
    # ones behind them are too far back for a guess to mean much (None).
    ahead = list(islice((pj for _, pj in order if pj.req.id in reasons), st.p.backfill.max_estimates))
    leaving = {r.req.id: st.now + classes[r.req.job_class].grace_s for r in snap.running
               if r.preempting or r.req.id in st.stopping}
    est = estimate_starts(snap, ahead, st.started, st.res.reservations, leaving)
    est.update(st.resv_est)
    pending = st.res.pending = {j: PendingInfo(why, est.get(j)) for j, why in reasons.items()}
    for j, detail in st.details.items():
        info = pending.get(j)
        if info is not None and info.reason == Reason.QUOTA:
            info.detail = detail


def quota_reason(st: CycleState, pj: PendingJob, prio: int) -> None:
    """For a job blocked by quota that no step could help: which limit holds it
    (`PendingInfo.detail`) and, where its quota decides it, its estimated start.

    - `BORROWING_LIMIT`: the GPUs it needs beyond its team's nominal quota (its team's running
      jobs counted) exceed the team's borrowing limit, or the team has no cohort: only its
      own team's jobs ending make room. The estimate is the free GPUs' (when running jobs end).
    - `COHORT_IN_USE`: within that limit, but what the cohort could lend is held by work step
      5f may not stop (of its priority or higher, not preemptible, inside its team's nominal
      quota, or larger than what its team borrows): the free GPUs' estimate, when those end.
    - no detail: step 5f will act once the victims it needs are past their min run time (or
      this cycle's searches ran out): estimated start when they are, plus their grace.
    Before, such a job showed `Quota` with the free GPUs' estimate, e.g. the time limit of the
    very jobs it should have stopped (issue 35).
    """
    req = pj.req
    team = st.snap.teams.get(req.team)
    fl = st.fledger()
    over = fl.used(req.team, req.pool) + req.min_gpus - fl.nominal(req.team, req.pool)
    if over <= 0 or team is None:
        return
    if not may_borrow(st, req):
        st.details[req.id] = BORROWING_LIMIT
        return
    if not st.p.preemption.borrow_within_cohort:
        return
    # GPUs other teams must give back, and what step 5f could ever take (at any time): its own
    # team's lower-priority jobs, and of each borrowing team whole jobs below `prio`, smallest
    # first, as long as they add up to no more than what the team borrows; in the order they
    # may become victims. Once per team, pool and priority a cycle: a scan of the running
    # jobs per waiting job made the cycle of `yard bench sched` (5,000 pending, 8,000 running)
    # ten times slower.
    need = over - fl.cohort_slack(team.cohort or "", req.pool, exclude=req.team)
    if need <= 0:  # the cohort's idle GPUs cover it: no one need give anything back
        return
    key = (req.team, req.pool, prio)
    known = st.quota_memo.get(key)
    if known is None or (known[2] and need > (known[1][-1] if known[1] else 0)):  # none yet, or cut short
        known = st.quota_memo[key] = takeable(st, req, prio, need)
    times, total, cut = known
    if not total or need > total[-1]:
        st.details[req.id] = COHORT_IN_USE
        return
    st.resv_est[req.id] = times[bisect_left(total, need)]


def takeable(st: CycleState, req: JobRequest, prio: int, need: int) -> tuple[list[float], list[int], bool]:
    """For `quota_reason`: the times (each a victim's end of min run time, plus its grace,
    ascending) at which step 5f could have the GPUs it may take for `req`, the running total
    of those GPUs, and whether the search stopped early: once each team gave what any job of
    `req`'s team and pool could need (`need`, or more for its team's larger jobs)."""
    by_team, largest = preemptible_in(st, req.pool)
    cap = need + largest.get(req.team, req.min_gpus) - req.min_gpus
    lower = {t for t, levels in by_team.items() if min(levels) < prio}
    borrowing = cohort_borrowers(st, req, prio, teams=lower)
    when: list[tuple[float, int]] = []
    cut = False
    for t, levels in by_team.items():
        below = [_sorted_pair(lists) for q, lists in levels.items() if q < prio]
        if not below:
            continue
        got = 0
        if t == req.team:  # all of them may go: the earliest first
            for at, g in _joined([by_at for _, by_at in below]):
                if got >= cap:
                    cut = True
                    break
                when.append((at, g))
                got += g
            continue
        lv = borrowing.get(t)
        if lv is None:
            continue
        left = max((b for q, b in lv if q < prio), default=0.0)
        # smallest first, within what it borrows
        for g2, at2 in _joined([by_size for by_size, _ in below]):
            if got >= cap:
                cut = True
                break
            if g2 > left:
                break
            when.append((at2, g2))
            left -= g2
            got += g2
    when.sort()
    times, total, got = [], [], 0
    for at, g in when:
        got += g
        times.append(at)
        total.append(got)
    return times, total, cut


def preemptible_in(st: CycleState, pool: str) -> tuple[ByTeam, dict[str, int]]:
    """Per team and priority, the running jobs of `pool` that are or will be possible victims
    (preemptible, not leaving): (GPUs, when) smallest first and (when, GPUs) earliest first,
    `when` being the end of its min run time plus its grace; and per team the most GPUs a job
    of it waits for in the pool. Built once per pool a cycle."""
    got: tuple[ByTeam, dict[str, int]] | None = st.preemptible_memo.get(pool)
    if got is None:
        now = st.now
        # per class: (priority, min run time, grace), for preemptible classes only
        rule = {n: (c.priority, c.min_run_s, c.grace_s) for n, c in st.snap.classes.items() if c.preemptible}
        lists: dict[tuple[str, int], list[tuple[int, float]]] = {}
        for r in st.snap.running:
            rq = r.req
            k = rule.get(rq.job_class)
            if k is None or rq.pool != pool or r.preempting:
                continue
            at = r.start_time + k[1]
            key = (rq.team, k[0])
            js = lists.get(key)
            if js is None:
                js = lists[key] = []
            js.append((r.placement.gpus, (at if at > now else now) + k[2]))
        by_team: ByTeam = {}
        for (t, q), js in sorted(lists.items()):
            by_team.setdefault(t, {})[q] = (js, [])  # sorted on first use (`_sorted_pair`)
        largest: dict[str, int] = {}
        for pj in st.snap.pending:
            rq = pj.req
            if rq.pool == pool and rq.min_gpus > largest.get(rq.team, 0):
                largest[rq.team] = rq.min_gpus
        got = st.preemptible_memo[pool] = (by_team, largest)
    return got


def _sorted_pair(pair: tuple[list[tuple[int, float]], list[tuple[float, int]]]
                 ) -> tuple[list[tuple[int, float]], list[tuple[float, int]]]:
    """`preemptible_in`'s (GPUs, when) list sorted, and its (when, GPUs) twin, made once."""
    by_size, by_at = pair
    if not by_at and by_size:
        by_size.sort()
        by_at.extend(sorted([(at, g) for g, at in by_size]))
    return pair


def _joined(lists: list[list[Any]]) -> list[Any]:
    """Sorted lists as one sorted list (the one itself when there is one)."""
    return lists[0] if len(lists) == 1 else sorted(chain.from_iterable(lists))
