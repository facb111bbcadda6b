"""The state of one cycle (step 1): quota ledgers, the victim pools and the memos every step shares.

Why one object: the steps of `sched/engine.py` and every reclaim strategy (`sched/reclaim/`) read
and write the same facts within a cycle: the GPUs each team holds per priority level now and once
the leaving jobs have left, the victims chosen so far, and memos of searches that failed (which a
choice of victims clears, since it frees room). Kept in one place, a strategy is a function of
this state and a job; the state is thrown away at the cycle's end, so nothing leaks between
cycles (the engine stays a pure function of the snapshot).
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Any, Callable

from trainyard.sched.cluster import Placement
from trainyard.sched.cycle.views import Views
from trainyard.sched.engine_params import EngineParams
from trainyard.sched.placement import place
from trainyard.sched.quota import QuotaLedger
from trainyard.sched.reservations import Holds
from trainyard.sched.types import (
    CycleResult, JobClass, JobId, PendingJob, Preempt, PreemptionKind, Reason, RunningJob, Snapshot,
)

Levels = dict[tuple[str, str], dict[int, int]]  # (team, pool) -> priority -> GPUs


class CycleState(Views):
    """Ledgers, victim pools and memos of one cycle, over its views (`Views`)."""

    def __init__(self, snap: Snapshot, params: EngineParams) -> None:
        super().__init__(snap)
        self.p, self.now = params, snap.now
        self.res = CycleResult()
        self.prio_of = prio = {name: c.priority for name, c in snap.classes.items()}
        self.on_notice = {name: c.checkpoint_on_notice for name, c in snap.classes.items()}
        by_class = snap.allocated_by_class
        if by_class is None:
            acc: dict[tuple[str, str, str], int] = {}
            get = acc.get
            for r in snap.running:
                q = r.req
                k = (q.team, q.pool, q.job_class)
                acc[k] = get(k, 0) + r.placement.gpus
            by_class = acc
        # GPUs held per (team, pool) and priority level: a team's quota is filled by its
        # highest-priority work first (ordering's tier, the victim budget).
        levels: Levels = {}
        for (t, pool, c), g in by_class.items():
            d = levels.get((t, pool))
            if d is None:
                d = levels[(t, pool)] = {}
            d[prio[c]] = d.get(prio[c], 0) + g
        self.levels_now = levels
        self.levels_fut: Levels | None = None
        self.held_now: Levels = {}  # this cycle's starts and claims
        if snap.allocated is not None:
            self.ledger = QuotaLedger(snap.teams, ((t, p, g) for (t, p), g in snap.allocated.items()))
        else:
            self.ledger = QuotaLedger(snap.teams, ((t, p, g) for (t, p, _), g in by_class.items()))
        self.fledger_memo: QuotaLedger | None = None
        self.shadow = math.inf  # earliest shadow time among reservations made
        self.reserved_gpus: set[tuple[int, int]] = set()  # (node, GPU) of every reservation made
        self.stopping: set[JobId] = set()  # victims chosen in this cycle
        self.searches = 0  # fruitless victim searches so far
        self.successes = 0
        self.share_searches = 0
        self.ends_memo: list[tuple[float, JobId, Placement]] | None = None
        self.eligible_memo: dict[str, list[tuple[int, RunningJob]]] | None = None
        self.min_prio = math.inf
        preemptible = [c for c in snap.classes.values() if c.preemptible]
        self.min_patience = min((self.patience(c) for c in preemptible), default=params.preemption.reclaim_after_s)
        # The distinct patience levels (sorted): how long an owed job waits before reclaiming.
        self.patience_levels = sorted({self.patience(c) for c in preemptible})
        self.lowest_preemptible = min((c.priority for c in preemptible), default=math.inf)
        self.no_victims: set[tuple[Any, ...]] = set()
        self.no_share: set[tuple[Any, ...]] = set()
        self.lost_memo: dict[JobId, float] = {}
        self.by_node: dict[int, list[RunningJob]] | None = None
        self.sorted_team: dict[str | None, list[RunningJob]] = {}
        self.failed: dict[tuple[Any, ...], Reason] = {}
        self.failed_by: dict[tuple[Any, ...], JobId] = {}  # the first job of each `failed` shape
        self.details: dict[JobId, str] = {}  # `PendingInfo.detail` (`sched/cycle/explain.py`)
        self.preemptible_memo: dict[str, Any] = {}  # `explain.preemptible_in` per pool
        self.quota_memo: dict[tuple[Any, ...], tuple[list[float], list[int], bool]] = {}  # `explain.takeable`
        self.reasons: dict[JobId, Reason] = {}
        self.started: list[tuple[PendingJob, int]] = []  # what res.starts holds, as the estimate needs it
        self.holds = Holds.of(snap.reservations, snap.cluster, snap.classes, snap.now, snap.pending)
        self.resv_est: dict[JobId, float | None] = {}  # estimates reservations decide
        self.behind_top: dict[JobId, JobId] = {}  # in-quota job -> its team's higher-priority borrower
        self.tier0: set[JobId] = set()  # the jobs `order.in_turn` tried as in quota
        # the order's sort key (`order.preemptors_first` refines it)
        self.merge_key: Callable[[tuple[Any, PendingJob]], Any] = itemgetter(0)

    # -- ledgers --------------------------------------------------------------------------------

    def hold_quota(self, team: str, pool: str, gpus: int, prio: int) -> None:
        """A start or a claim: count its GPUs now and, once built, in the future ledger too (a
        start that only `ledger` saw let a later claim on leaving GPUs exceed the team's quota)."""
        self.ledger.add(team, pool, gpus)
        h = self.held_now.setdefault((team, pool), {})
        h[prio] = h.get(prio, 0) + gpus
        if self.fledger_memo is not None:
            self.fledger_memo.add(team, pool, gpus)
        if self.levels_fut is not None:
            d = self.levels_fut.setdefault((team, pool), {})
            d[prio] = d.get(prio, 0) + gpus

    def flevels(self) -> Levels:
        """Per (team, pool) and priority level, the GPUs held once the leaving jobs (and the
        victims chosen in this cycle) have left, with this cycle's starts and claims: the
        victim budget's view, as `fledger` is the quota check's."""
        if self.levels_fut is None:
            fut = {k: dict(d) for k, d in self.levels_now.items()}
            for r in self.leaving:
                self.drop_level(fut, r)
            self.levels_fut = fut
        return self.levels_fut

    def drop_level(self, levels: Levels, r: RunningJob) -> None:
        d = levels.get((r.req.team, r.req.pool))
        if d is not None:
            p = self.prio_of[r.req.job_class]
            d[p] = d.get(p, 0) - r.gpus

    def fledger(self) -> QuotaLedger:
        """Quota as it will be once the leaving jobs (and victims chosen now) have left.

        `self.ledger` still counts them: their GPUs are busy until they go, so only jobs that
        claim those very GPUs (step 4, step 5) may count on their quota."""
        if self.fledger_memo is None:
            self.fledger_memo = self.ledger.copy()
            for r in self.leaving:
                self.fledger_memo.add(r.req.team, r.req.pool, -r.gpus)
        return self.fledger_memo

    def headroom(self, team: str, pool: str, prio: int) -> int:
        """The team's nominal quota less what its running jobs of priority `prio` or more hold
        (at the cycle's start)."""
        held = self.levels_now.get((team, pool))
        used = sum(g for p, g in held.items() if p >= prio) if held else 0
        return self.ledger.nominal(team, pool) - used

    # -- victims --------------------------------------------------------------------------------

    def lost(self, r: RunningJob) -> float:
        """GPU-seconds a preemption of `r` now would cost: for a class that checkpoints on the
        notice, its save and restart (`notice_lost_s` per GPU), plus a hundredth of the work
        since its last checkpoint (what the save protects, should it fail: among equals, stop
        the one that risks least); else the work since its last checkpoint."""
        v = self.lost_memo.get(r.req.id)
        if v is None:
            at_risk = r.lost_if_stopped(self.now)
            if self.on_notice[r.req.job_class]:
                at_risk = r.placement.gpus * self.p.preemption.notice_lost_s + 0.01 * at_risk
            v = self.lost_memo[r.req.id] = at_risk
        return v

    def eligible_by_team(self) -> dict[str, list[tuple[int, RunningJob]]]:
        """Running jobs that may be preempted at all this cycle, by team (built once)."""
        if self.eligible_memo is None:
            eligible: dict[str, list[tuple[int, RunningJob]]] = {}
            # Per class: the latest start that is past its min run time, or None (never a victim).
            cutoff = {name: (self.now - c.min_run_s, c.priority) if c.preemptible else None
                      for name, c in self.snap.classes.items()}
            for r in self.snap.running:
                req = r.req
                cut = cutoff[req.job_class]
                if cut is None or r.preempting or r.starting or r.start_time > cut[0]:
                    continue
                team_jobs = eligible.get(req.team)
                if team_jobs is None:
                    team_jobs = eligible[req.team] = []
                team_jobs.append((cut[1], r))
                if cut[1] < self.min_prio:
                    self.min_prio = cut[1]
            self.eligible_memo = eligible
        return self.eligible_memo

    def node_jobs(self) -> dict[int, list[RunningJob]]:
        """Preemptible running jobs by node they occupy (built once per cycle)."""
        if self.by_node is None:
            self.by_node = {}
            for jobs in self.eligible_by_team().values():
                for _, r in jobs:
                    for n in r.placement.node_indices:
                        self.by_node.setdefault(n, []).append(r)
        return self.by_node

    def cheapest_first(self, team: str | None) -> list[RunningJob]:
        """A team's preemptible jobs (None: every team's), least lost work per GPU first
        (sorted once per cycle)."""
        got = self.sorted_team.get(team)
        if got is None:
            lost = self.lost
            eligible = self.eligible_by_team()
            teams = eligible.values() if team is None else (eligible.get(team, []),)
            # (cost, id, job): ids are unique, so two jobs are never compared themselves.
            keyed = [(lost(r) / r.placement.gpus, r.req.id, r) for jobs in teams for _, r in jobs]
            keyed.sort()
            got = self.sorted_team[team] = [r for _, _, r in keyed]
        return got

    def patience(self, victim_class: JobClass) -> float:
        """How long a job owed quota waits for natural turnover before reclaiming from this class."""
        pp = self.p.preemption
        return min(pp.reclaim_after_s, pp.reclaim_share * (victim_class.grace_s + victim_class.min_run_s))

    def min_prio_now(self) -> float:
        self.eligible_by_team()
        return self.min_prio

    def searches_left(self) -> bool:
        """Whether the reclaim strategies after step 5 (5b-5e) may still search this cycle."""
        pp = self.p.preemption
        return self.share_searches < pp.max_searches and self.successes < pp.max_preemptors

    def stop_for(self, pj: PendingJob, prio: int, victims: list[RunningJob], pl: Placement | None,
                 shared: PreemptionKind | None = None, kind_of: PreemptionKind | None = None) -> None:
        """Send `victims` their notices and let `pj` claim the GPUs they free. `shared`: the kind
        of the victims of `pj`'s priority; `kind_of`: every victim's kind, whatever its priority."""
        req = pj.req
        self.successes += 1
        self.no_victims.clear()
        self.no_share.clear()
        self.failed.clear()
        self.forget_future_fits()
        flv = self.flevels()
        for v in victims:
            self.stopping.add(v.req.id)
            self.fut().release(v.placement)
            self.fledger().add(v.req.team, v.req.pool, -v.gpus)
            self.drop_level(flv, v)
            vprio = self.snap.classes[v.req.job_class].priority
            kind = kind_of or (PreemptionKind.PRIORITY if vprio < prio else shared or PreemptionKind.RECLAIM)
            self.res.preemptions.append(Preempt(v.req.id, kind, req.id))
        if pl is None:
            pl, _ = place(self.fut(), req, req.min_nodes)
        if pl is not None:
            self.claim(pl)
        # The preemptor's quota is held for it while its victims leave.
        self.hold_quota(req.team, req.pool, req.min_gpus, prio)
