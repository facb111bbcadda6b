"""How many GPUs a preemption may take from each team: the victim budget.

A team's nominal quota is filled by its highest-priority work first. So, for a team T and a
priority level q, `used(T, >=q)` counts the GPUs T's jobs of priority q or more hold, and T
*borrows at level q* by `borrowed(T, q) = used(T, >=q) - nominal(T)` when that is positive. A job
of T at level q is a candidate to give GPUs back (reclaim, or a higher-priority job of another
team) only where T borrows at its level; T's work of priority above what it borrows is inside its
quota and is never touched for another team.

Two budgets, checked per level so that a reclaim never pushes a team's higher-priority work below
its nominal quota while lower-priority work of the same team keeps running:

- **strict**: the victims a set takes from T at levels >= q total at most `borrowed(T, q)`, for
  every level q; the team ends at or above its nominal quota at every level. What every search
  tries first.
- **whole jobs** (`overshoot=True`, for a team owed its quota, issue 20 part 9): a job is stopped
  whole, so a gang larger than what its team borrows could never be a victim under the strict
  rule, and the owed team would wait for it forever. Here a set is allowed as long as each victim
  is needed: for each victim R at level v, the victims taken from T at levels >= v total less
  than `borrowed(T, v) + R.min_gpus` (Kueue's rule, "a candidate only while its ClusterQueue is
  still borrowing", without depending on the order the victims are added in). The team may end
  below nominal by less than one victim.

Both keep the no-ping-pong invariant the ordering relies on (`ordering.py`, tier): after the
victims have left, each of them needs to borrow again to restart (`used(T, >=v) + R.min_gpus >
nominal(T)`), so it is ordered after the in-quota job it was stopped for. That holds per search:
when a cycle takes strict victims from T for one job and then a whole job from T for another, an
earlier victim may find T below nominal (by less than the whole job) and restart inside its quota.

A team absent from the budget may not lose anything; a team given `math.inf` (the preemptor's
own team, whose lower-priority jobs it may always displace) is not counted.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping

from trainyard.sched.types import JobId, RunningJob


class VictimBudget:
    """Per team, per priority level, how much a victim set may take (see the module docstring).

    `levels[team]` lists `(priority, borrowed at that level)` for the levels of the team's
    running jobs, highest priority first; a level whose team does not borrow has borrowed <= 0.
    `prio[class name]` gives a victim's level.
    """

    __slots__ = ("levels", "prio", "overshoot", "unlimited")

    def __init__(self, levels: Mapping[str, list[tuple[int, float]]], prio: Mapping[str, int],
                 overshoot: bool = False, unlimited: Iterable[str] = ()):
        self.levels = levels
        self.prio = prio
        self.overshoot = overshoot
        self.unlimited = frozenset(unlimited)

    @classmethod
    def flat(cls, amounts: Mapping[str, float], prio: Mapping[str, int]) -> "VictimBudget":
        """One level per team: at most `amounts[team]` GPUs whatever their priority (inf: any)."""
        unlimited = [t for t, a in amounts.items() if a == math.inf]
        return cls({t: [(-(1 << 62), a)] for t, a in amounts.items() if a != math.inf}, prio,
                   unlimited=unlimited)

    def allows_team(self, team: str) -> bool:
        return team in self.unlimited or team in self.levels

    def candidate(self, r: RunningJob) -> bool:
        """Whether `r` could be a victim at all: its team borrows at its level (or is unlimited)."""
        t = r.req.team
        if t in self.unlimited:
            return True
        lv = self.levels.get(t)
        if lv is None:
            return False
        p = self.prio[r.req.job_class]
        for q, b in lv:
            if q <= p:
                return b > (r.gpus - r.req.min_gpus if self.overshoot else r.gpus - 1)
        return False  # a level the team does not hold

    def tally(self) -> "Tally":
        return Tally(self)


class Tally:
    """The victims taken so far from each team under one budget; `take` adds one if allowed."""

    __slots__ = ("budget", "taken")

    def __init__(self, budget: VictimBudget):
        self.budget = budget
        # team -> list of (index of the victim's level in the team's levels, GPUs, min GPUs)
        self.taken: dict[str, list[tuple[int, int, int]]] = {}

    def copy(self) -> "Tally":
        new = Tally(self.budget)
        new.taken = {t: list(v) for t, v in self.taken.items()}
        return new

    def take(self, r: RunningJob) -> bool:
        """Count `r` as a victim if the set stays within the budget; False (and nothing counted)
        otherwise."""
        b = self.budget
        t = r.req.team
        if t in b.unlimited:
            return True
        lv = b.levels.get(t)
        if lv is None:
            return False
        p = b.prio[r.req.job_class]
        k = 0
        while k < len(lv) and lv[k][0] > p:
            k += 1
        if k == len(lv):
            return False  # a level the team does not hold (cannot happen for its running jobs)
        trial = self.taken.get(t, []) + [(k, r.gpus, r.req.min_gpus)]
        if not _within(lv, trial, b.overshoot):
            return False
        self.taken[t] = trial
        return True


def _within(levels: list[tuple[int, float]], taken: list[tuple[int, int, int]], overshoot: bool) -> bool:
    """Whether the victims `taken` from one team respect its per-level budget `levels`.

    Only levels that have a victim of their own are checked: below such a level the team
    borrows at least as much (borrowed grows as the level falls) and loses no more there."""
    for i, (_, borrowed) in enumerate(levels):
        spent = 0
        smallest = 0
        for k, g, m in taken:
            if k <= i:  # at this level or above it
                spent += g
                if k == i and (not smallest or m < smallest):
                    smallest = m
        if not smallest:
            continue  # no victim at this level
        if overshoot:
            # Each victim here must still be needed: less than what the team borrows at this
            # level plus the smallest victim of the level.
            if spent >= borrowed + smallest:
                return False
        elif spent > borrowed:
            return False
    return True


def level_usage(running: Iterable[RunningJob], prio: Mapping[str, int],
                skip: set[JobId] | frozenset[JobId] = frozenset()) -> dict[tuple[str, str], dict[int, int]]:
    """GPUs held per (team, pool) and priority level, by the running jobs not in `skip` (ids)."""
    out: dict[tuple[str, str], dict[int, int]] = {}
    for r in running:
        rq = r.req
        if rq.id in skip:
            continue
        k = (rq.team, rq.pool)
        d = out.get(k)
        if d is None:
            d = out[k] = {}
        p = prio[rq.job_class]
        d[p] = d.get(p, 0) + r.placement.gpus
    return out


def borrowed_levels(by_level: Mapping[int, int], nominal: int) -> list[tuple[int, float]]:
    """`(level, used(>= level) - nominal)` for each level held, highest priority first."""
    out = []
    acc = 0
    for p in sorted(by_level, reverse=True):
        acc += by_level[p]
        out.append((p, float(acc - nominal)))
    return out
