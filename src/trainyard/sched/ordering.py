"""In what order trainyard considers pending jobs.

The key, most significant first:
1. tier: a job that fits inside its team's nominal quota comes before a job that would borrow
   (nominal quota is a guarantee, borrowing is a favour), whatever their classes, as Kueue orders
   its heads (entryOrdering: borrowing last, then priority). A team's quota is filled by its
   highest-priority work first: a job of priority p is in quota when it fits beside the GPUs its
   team holds with jobs of priority p or more (`headroom(team, pool, p)`), since it may take the
   rest from its own team's lower-priority jobs. The engine also counts what the team's in-quota
   jobs started ahead of it in the same cycle take: one that no longer fits goes with the
   borrowing jobs (`sched/cycle/order.py`, `in_turn`). Neither priority nor aging lifts a borrowing job
   above a job another team is owed: a reclaimed job that came back first would take the GPUs it
   left straight back and make reclaim preempt again (ping-pong; issue 20 part 8). The victim
   budget (`budget.py`) makes sure every reclaimed job needs to borrow to restart;
2. class priority (interactive before training before batch);
3. urgency: a job that has waited `reserve_at` (5%) of its class's max wait is urgent; urgent jobs
   come first within their tier, most-waited first, and get a reservation when they do not fit;
4. score: the estimated remaining GPU-time of the job (shortest first, the order that minimises
   mean completion time), scaled by the team's fair-share factor (decayed usage relative to its
   quota share: a team that used more than its share waits a little longer) and discounted by
   how long the job has waited relative to its max wait (aging);
5. submit time, then id (determinism).

Jobs without an estimate are scored by their class's max run time or, lacking that,
`unknown_runtime_s`: they neither jump the queue nor starve behind it.
"""

from __future__ import annotations

import math
from operator import itemgetter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from trainyard.sched.types import JobClass, PendingJob, Team


@dataclass(frozen=True, slots=True)
class OrderingParams:
    # Fraction of its class's max wait after which a job is urgent: served oldest first within
    # its tier and given a reservation when it does not fit. Early (5%: 72 minutes of a 24-hour
    # max wait), so that reservations are made long before any job nears its max wait; tuned on
    # the Philly weeks of 2017-10-06..10-21 (see bench/README.md).
    reserve_at: float = 0.05
    aging_weight: float = 4.0  # e-folds of score removed per max-wait waited
    fairshare_weight: float = 0.5  # exponent on (usage share / quota share)
    unknown_runtime_s: float = 4 * 3600.0
    # The same for the classes a team runs least-attained-service for (`Team.las`): later, since
    # serving its waiting jobs oldest first would turn the team's own queue back into FIFO, which
    # is what it asked not to have; the max wait stays bounded by a reservation from then on.
    las_reserve_at: float = 0.5


def fairshare_factors(teams: Mapping[str, Team], usage: Mapping[str, float], pool: str, weight: float) -> dict[str, float]:
    """Per team: (usage share / quota share) ** weight, clamped to [1/8, 8]. 1.0 is 'on share'."""
    nominal = {t: team.quota(pool).nominal for t, team in teams.items()}
    total_nom = sum(nominal.values())
    total_use = sum(usage.get(t, 0.0) for t in teams)
    out = {}
    for t in teams:
        if total_use <= 0 or total_nom <= 0 or weight == 0:
            out[t] = 1.0
            continue
        q = max(nominal[t], 1) / total_nom
        u = usage.get(t, 0.0) / total_use
        out[t] = min(8.0, max(0.125, (max(u, 1e-6) / q) ** weight))
    return out


def sort_key(pj: PendingJob, cls: JobClass, now: float, fs: float, p: OrderingParams, las: bool = False) -> tuple[Any, ...]:
    """One job's key for keys 2-5 (priority, urgency, score or wait, submit time, id). The tier
    (key 1) is not part of it: it depends on the jobs of the job's team ahead of it, so
    `keyed_in_order` assigns it walking the jobs in this key's order, and returns the jobs of
    tier 0 and then those of tier 1, each in this key's order. `las`: the job's team runs
    least-attained-service for its class (urgent from `las_reserve_at`)."""
    req = pj.req
    mw = cls.max_wait_s
    frac = (now - req.submit_time) / (mw if mw > 1.0 else 1.0)
    if frac >= (p.las_reserve_at if las else p.reserve_at):
        return (-cls.priority, 0, -frac, req.submit_time, req.id)
    est = req.est_runtime_s
    if est is None:
        est = cls.max_run_s or p.unknown_runtime_s
    remaining = est - pj.progress_s
    if remaining < 60.0:
        remaining = 60.0
    score = math.log(remaining * req.min_gpus * fs) - p.aging_weight * frac
    return (-cls.priority, 1, score, req.submit_time, req.id)


def keyed_in_order(pending: Sequence[PendingJob], classes: Mapping[str, JobClass], now: float,
                   headroom: Callable[[str, str, int], int], fairshare: Mapping[str, Mapping[str, float]],
                   p: OrderingParams, teams: Mapping[str, Team] | None = None) -> tuple[list[tuple[tuple[Any, ...], PendingJob]], int]:
    """Every pending job with its `sort_key`, sorted: the order a cycle considers them in, and
    how many of them, the first ones, are in quota (tier 0).

    `headroom(team, pool, priority)` is the team's nominal quota less what its jobs of that
    priority or more hold (asked once per team, pool and priority),
    `fairshare[pool][team]` its fair-share factor. The key is `sort_key`'s, computed inline with
    the per-class constants hoisted: this runs over every pending job (5,000 in the scheduling
    benchmark) on every cycle. `tests/sched/test_fast_paths.py` keeps the two in step. `teams`
    say which teams run least-attained-service for which classes (`Team.las`).
    """
    per_class = {name: (-c.priority, c.max_wait_s if c.max_wait_s > 1.0 else 1.0, c.max_run_s or p.unknown_runtime_s)
                 for name, c in classes.items()}
    reserve_at, aging, log = p.reserve_at, p.aging_weight, math.log
    las_teams = {name: t for name, t in teams.items() if t.las} if teams else {}
    keyed: list[tuple[tuple[Any, ...], PendingJob]] = []
    append = keyed.append
    for pj in pending:
        req = pj.req
        neg_prio, mw, default_est = per_class[req.job_class]
        frac = (now - req.submit_time) / mw
        thr = reserve_at
        if las_teams:
            t = las_teams.get(req.team)
            if t is not None and t.las_for(req.job_class):
                thr = p.las_reserve_at
        if frac >= thr:
            append(((neg_prio, 0, -frac, req.submit_time, req.id), pj))
            continue
        est = req.est_runtime_s
        if est is None:
            est = default_est
        remaining = est - pj.progress_s
        if remaining < 60.0:
            remaining = 60.0
        score = log(remaining * req.min_gpus * fairshare[req.pool].get(req.team, 1.0)) - aging * frac
        append(((neg_prio, 1, score, req.submit_time, req.id), pj))
    keyed.sort(key=itemgetter(0))
    # The tier: in quota if it fits in what its team's quota leaves beside its jobs of its
    # priority or more. Stable: within a tier, the order above. What the team's in-quota jobs
    # ahead of it take in this cycle is the engine's to count (`sched/cycle/order.py`, `in_turn`): those
    # that cannot start take nothing.
    rooms: dict[tuple[str, str, int], int] = {}
    first: list[tuple[tuple[Any, ...], PendingJob]] = []
    second: list[tuple[tuple[Any, ...], PendingJob]] = []
    into_first, into_second = first.append, second.append
    for kp in keyed:
        req = kp[1].req
        rk = (req.team, req.pool, kp[0][0])
        room = rooms.get(rk)
        if room is None:
            room = rooms[rk] = headroom(req.team, req.pool, -kp[0][0])
        if req.min_gpus <= room:
            into_first(kp)
        else:
            into_second(kp)
    n_first = len(first)
    first.extend(second)
    return first, n_first


def is_urgent(key: tuple[Any, ...]) -> bool:
    return bool(key[1] == 0)
