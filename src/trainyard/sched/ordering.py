"""In what order trainyard considers pending jobs.

The key, most significant first:
1. class priority (interactive before training before batch);
2. tier: a job that fits inside its team's unused nominal quota comes before a job that would
   borrow (nominal quota is a guarantee, borrowing is a favour). Aging never lifts a borrowing
   job above a job its team is owed: that would hand reclaimed GPUs straight back to borrowers
   and make reclaim preempt again (ping-pong);
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
from typing import Callable, Mapping, Sequence

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


def sort_key(pj: PendingJob, cls: JobClass, now: float, in_quota: bool, fs: float, p: OrderingParams) -> tuple:
    req = pj.req
    mw = cls.max_wait_s
    frac = (now - req.submit_time) / (mw if mw > 1.0 else 1.0)
    tier = 0 if in_quota else 1
    if frac >= p.reserve_at:
        return (-cls.priority, tier, 0, -frac, req.submit_time, req.id)
    est = req.est_runtime_s
    if est is None:
        est = cls.max_run_s or p.unknown_runtime_s
    remaining = est - pj.progress_s
    if remaining < 60.0:
        remaining = 60.0
    score = math.log(remaining * req.min_gpus * fs) - p.aging_weight * frac
    return (-cls.priority, tier, 1, score, req.submit_time, req.id)


def keyed_in_order(pending: Sequence[PendingJob], classes: Mapping[str, JobClass], now: float,
                   headroom: Callable[[str, str], int], fairshare: Mapping[str, Mapping[str, float]],
                   p: OrderingParams) -> list[tuple[tuple, PendingJob]]:
    """Every pending job with its `sort_key`, sorted: the order a cycle considers them in.

    `headroom(team, pool)` is the team's unused nominal quota (asked once per team and pool),
    `fairshare[pool][team]` its fair-share factor. The key is `sort_key`'s, computed inline with
    the per-class constants hoisted: this runs over every pending job (5,000 in the scheduling
    benchmark) on every cycle. `tests/sched/test_fast_paths.py` keeps the two in step.
    """
    per_class = {name: (-c.priority, c.max_wait_s if c.max_wait_s > 1.0 else 1.0, c.max_run_s or p.unknown_runtime_s)
                 for name, c in classes.items()}
    rooms: dict[tuple[str, str], int] = {}
    reserve_at, aging, log = p.reserve_at, p.aging_weight, math.log
    keyed = []
    append = keyed.append
    for pj in pending:
        req = pj.req
        neg_prio, mw, default_est = per_class[req.job_class]
        tp = (req.team, req.pool)
        room = rooms.get(tp)
        if room is None:
            room = rooms[tp] = headroom(req.team, req.pool)
        tier = 0 if req.min_gpus <= room else 1
        frac = (now - req.submit_time) / mw
        if frac >= reserve_at:
            append(((neg_prio, tier, 0, -frac, req.submit_time, req.id), pj))
            continue
        est = req.est_runtime_s
        if est is None:
            est = default_est
        remaining = est - pj.progress_s
        if remaining < 60.0:
            remaining = 60.0
        score = log(remaining * req.min_gpus * fairshare[req.pool].get(req.team, 1.0)) - aging * frac
        append(((neg_prio, tier, 1, score, req.submit_time, req.id), pj))
    keyed.sort(key=itemgetter(0))
    return keyed


def is_urgent(key: tuple) -> bool:
    return key[2] == 0
