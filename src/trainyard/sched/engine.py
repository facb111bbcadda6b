"""The trainyard policy: one pure scheduling cycle, written as numbered steps (after Kueue's).

    TrainyardPolicy().cycle(snapshot) -> CycleResult

1. Ledger and views. Quota usage per team from the running jobs; a working copy of the free
   capacity (`now`), and a lazily built `future` view where jobs already leaving (preempting) have
   left, so their GPUs can be claimed by the job they were preempted for.
2. Order. Pending jobs sorted by `ordering.sort_key`: priority, urgency (aging toward max wait),
   in-quota before borrowing, then shortest estimated remaining GPU-time with fair share.
3. Admit. For each job in order: quota check (nominal + cohort borrowing, `QuotaLedger.fits`),
   then an all-or-nothing placement (`placement.place`), at the largest size an elastic job can
   take. A job that would run past a reservation's shadow time may only use GPUs the reservation
   does not need (EASY backfill: a backfilled job never delays a reservation).
4. Claim. A job that does not fit now but fits once the jobs already leaving have left claims
   those GPUs and waits (reason `preempting`); nothing new is preempted for it.
5. Preempt. Otherwise, a job within its team's nominal quota may reclaim GPUs from teams that
   borrow; a job may displace jobs of lower priority (of its own team, or of teams borrowing).
   Victims must be preemptible and past their min run time; among them, the set that loses the
   least work since its last checkpoint is chosen (`preemption.find_victims`). The job claims the
   freed GPUs and starts when the victims have left, in a later cycle.
   5b. Time-sharing (`share_below_gpu_s`; None turns it off): a job that has held few GPU-seconds
   may stop same-priority jobs that have held many, lose little since their last checkpoint and
   have much more work left, but only GPUs their teams borrow (`try_share`).
   5c. Least-attained-service within a team's own quota, for the teams that ask (`try_las`).
   5d. Overdue: a job pending `overdue_at` of its class's max wait may stop its own team's
   smaller jobs of its priority submitted after it, so that a team's stream of small jobs cannot
   starve its large one (`try_overdue`).
   5e. Moves: a gang that the pool's free GPUs could hold but no node's (fragmentation) stops
   smaller jobs that checkpoint on the notice and fit elsewhere at once (`try_move`).
   5f. Borrowing within the cohort (`borrow_within_cohort`; Kueue's `borrowWithinCohort`): a job
   blocked by quota whose GPUs beyond its team's nominal are within the team's borrowing limit
   may stop lower-priority jobs of other teams of its cohort, only what those teams borrow
   (never below their nominal quota), so that the cohort can lend it what it needs
   (`try_borrow`; tried right after its own team's lower-priority jobs, before 5b-5d).
6. Reserve. An urgent job (waited `reserve_at` of its max wait) that still does not fit gets a
   reservation: the earliest time, by the running jobs' estimated ends, when its placement frees
   up; those GPUs are kept from jobs that would still run then, and from later reservations.
7. Explain. With `snapshot.explain`, every job left pending gets a reason and an estimated start.
   A job blocked by quota that no step can help says which limit holds it (`_quota_reason`):
   its team's borrowing limit, or a cohort whose lendable GPUs are held by work it may not stop;
   a job that will borrow once its victims are past their min run time gets that time as its
   estimate. Jobs already leaving count as gone at their grace's end, not at their time limit.

Admin reservations (`reservations.py`) take the nodes a job may not use out of every view before
the job is tried (its mask), and keep a job whose reservation is not active out of the steps.

No ping-pong: a victim must have run its class's min run time in its current attempt, victims are
only ever of lower priority or borrowing beyond quota (so the preemptor can never qualify as a
victim of its victim), a job waiting on leaving victims never triggers more preemption, and a
victim is tried only after the job it was stopped for while that job waits (`Snapshot.stopped_for`).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from operator import itemgetter
from itertools import chain, islice
from dataclasses import dataclass, field
from typing import Iterable

from trainyard.sched.budget import Tally, VictimBudget, borrowed_levels
from trainyard.sched.cluster import ClusterState, Placement
from trainyard.sched.estimate import estimate_starts, expected_end
from trainyard.sched.ordering import OrderingParams, fairshare_factors, is_urgent, keyed_in_order
from trainyard.sched.placement import memory_ever_fits, place
from trainyard.sched.policy import gc_paused, register
from trainyard.sched.preemption import find_victims
from trainyard.sched.quota import QuotaLedger
from trainyard.sched.reservations import NO_MASK, Holds
from trainyard.sched.types import (
    BORROWING_LIMIT, COHORT_IN_USE, CycleResult, JobId, PendingInfo, PendingJob, Preempt, Reason, Reservation,
    RunningJob, Snapshot, Start,
)


@dataclass(frozen=True, slots=True)
class EngineParams:
    ordering: OrderingParams = field(default_factory=OrderingParams)
    max_reservations: int = 4  # urgent jobs that may hold a reservation at once (per cycle)
    max_estimates: int = 1000  # pending jobs, in order, that get an estimated start
    # Victim searches per cycle (each scans candidate nodes): failed ones and successful ones are
    # capped apart, so a cycle with many owed jobs is not starved by fruitless searches. More
    # preemptors wait for the next cycle.
    max_preemption_searches: int = 4
    max_preemptions_for: int = 16
    # A job inside its team's nominal quota first waits this long for GPUs to free up by
    # themselves before it reclaims them by preemption: on a busy cluster jobs end every few
    # seconds, and each avoided preemption saves the victim's work since its last checkpoint.
    # The wait is capped per victim at `reclaim_share` of the victim class's grace period plus
    # min run time, so that the owed team still gets its GPUs within that sum. 60 s since the
    # fix of the failed-search memo (it ignored patience, which stalled reclaim): 300 s then
    # failed the p99-wait line on the validation week, 60 s passes it and three other weeks.
    reclaim_after_s: float = 60.0
    reclaim_share: float = 0.4
    # Time-sharing of borrowed GPUs by attained service (after Tiresias; step 5b), among jobs of
    # equal priority: a job that has held less than `share_below_gpu_s` GPU-seconds may stop one
    # that has held at least `share_above_gpu_s`, loses at most `share_max_lost_s` seconds of work
    # per GPU since its last checkpoint and has `share_ratio` times its remaining GPU-time left,
    # as long as the victim's team keeps its nominal quota. None: off. On since stop 30: once a
    # team's own higher-priority job went before its in-quota work and a borrowing preemptor got
    # its victims' GPUs (the ordering fixes), 3200 GPU-s with a ratio of 8 keeps every hard limit
    # on the ten Philly windows at 80 x 8 and 56 x 8 and meets the waiting targets on 8 of 10 at
    # each (ratio 4: 10-17 at 56 x 8 lost 0.54% of its capacity; bench/README.md).
    share_below_gpu_s: float | None = 3200.0
    share_above_gpu_s: float = 4 * 3600.0
    share_max_lost_s: float = 300.0
    share_ratio: float = 8.0
    share_min_attempt_s: float = 1800.0  # for victims that declare no checkpoint interval
    # Least-attained-service within a team's own quota (step 5c), for the teams and classes that
    # ask for it (`Team.las`): a job of the team that has held less than `las_below_gpu_s`
    # GPU-seconds may stop the team's jobs of its priority that have held at least
    # `las_above_gpu_s` and have, by estimate, `las_ratio` times its remaining GPU-time left.
    # Tiresias' two queues split at 16 GPU-hours (as Pollux evaluated it), with the estimates
    # trainyard has: a job close to its end is not stopped for a longer one.
    las_below_gpu_s: float = 16 * 3600.0
    las_above_gpu_s: float = 16 * 3600.0
    las_ratio: float = 1.0
    # What stopping a job whose class checkpoints on the notice costs, per GPU: the save on the
    # notice and the restart's load (the simulator's 30 s and 60 s). Victims are chosen by cost.
    notice_lost_s: float = 90.0
    # An overdue job (step 5d: pending this share of its class's max wait, 6 h of training's day)
    # may stop its own team's smaller jobs of its priority that were submitted after it. None: off.
    # 0.25: on the validation week the figures are within 1% of those without it; at 56 x 8 the
    # p99 wait moved -6% (window from 10-02) and +1% (10-20), no quota broken (bench/README.md).
    overdue_at: float | None = 0.25
    # The team's younger, smaller jobs are held back for the overdue job's class's min run time
    # (so that the running ones all become victims) plus this share of its grace at most (step
    # 5d). A team held back beside its unused quota while others borrow is owed that quota, and an
    # episode longer than min run time plus grace is a quota violation: the whole grace broke a
    # quota on 10-20 at 80 x 8 once moves were on, half of it on 10-20 at 56 x 8; none broke with 0.
    overdue_hold_grace: float = 0.0
    # Moves (step 5e): a gang the pool's free GPUs could hold, but no node's (fragmentation), may
    # stop smaller single-node jobs of classes that checkpoint on the notice, once it has waited
    # `move_after_s`, when every one of them fits on the pool's other free GPUs at once: each loses
    # its save and restart, and the gang does not wait for whole nodes to drain by chance. On the
    # ten Philly windows it keeps every hard limit at both loads (at 56 x 8, goodput +0.02-0.05 and
    # the quota violation of 10-13 gone: bench/README.md). False: off.
    move_for_gangs: bool = True
    move_after_s: float = 60.0
    # Borrowing within the cohort (step 5f, Kueue's `borrowWithinCohort` with its LowerPriority
    # policy): a job blocked by quota, whose GPUs beyond its team's nominal are within the team's
    # borrowing limit, may stop other teams' lower-priority jobs that borrow (only what they
    # borrow at the victim's level: never below their nominal quota). Without it a team's job
    # beyond its nominal waited for another team's lower-priority borrowers to end by themselves,
    # past its class's max wait (issue 35 point 1). False: off.
    borrow_within_cohort: bool = True


class TrainyardPolicy:
    name = "trainyard"

    def __init__(self, params: EngineParams | None = None):
        self.params = params or EngineParams()

    @gc_paused
    def cycle(self, snap: Snapshot) -> CycleResult:
        return _Cycle(snap, self.params).run()


register("trainyard")(TrainyardPolicy)


class _Cycle:
    """The state of one cycle; thrown away at its end."""

    def __init__(self, snap: Snapshot, params: EngineParams):
        self.snap, self.p, self.now = snap, params, snap.now
        self.res = CycleResult()
        # Step 1: ledger and views.
        self._prio = prio = {name: c.priority for name, c in snap.classes.items()}
        self._on_notice = {name: c.checkpoint_on_notice for name, c in snap.classes.items()}
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
        levels: dict[tuple[str, str], dict[int, int]] = {}
        for (t, pool, c), g in by_class.items():
            d = levels.get((t, pool))
            if d is None:
                d = levels[(t, pool)] = {}
            d[prio[c]] = d.get(prio[c], 0) + g
        self._levels_now = levels
        self._levels_fut: dict[tuple[str, str], dict[int, int]] | None = None
        self._held_now: dict[tuple[str, str], dict[int, int]] = {}  # this cycle's starts and claims
        if snap.allocated is not None:
            self.ledger = QuotaLedger(snap.teams, ((t, p, g) for (t, p), g in snap.allocated.items()))
        else:
            self.ledger = QuotaLedger(snap.teams, ((t, p, g) for (t, p, _), g in by_class.items()))
        self.state: ClusterState | None = None  # copy-on-write of snap.cluster
        self.future: ClusterState | None = None  # state, with leaving jobs gone
        self.long_state: ClusterState | None = None  # state, with reserved GPUs taken away
        self.shadow = math.inf  # earliest shadow time among reservations made
        self._reserved_gpus: set[tuple[int, int]] = set()  # (node, GPU) of every reservation made
        self.leaving = [r for r in snap.running if r.preempting]
        self.stopping: set[JobId] = set()  # victims chosen in this cycle
        self.searches = 0  # fruitless victim searches so far
        self.successes = 0
        self._ends: list[tuple[float, JobId, Placement]] | None = None
        self._eligible: dict[str, list[tuple[int, RunningJob]]] | None = None
        self._min_prio = math.inf
        self._min_patience = min((self._patience(c) for c in snap.classes.values() if c.preemptible),
                                 default=params.reclaim_after_s)
        # The distinct patience levels (sorted): how long an owed job waits before reclaiming.
        self._levels = sorted({self._patience(c) for c in snap.classes.values() if c.preemptible})
        self._lowest_preemptible = min((c.priority for c in snap.classes.values() if c.preemptible), default=math.inf)
        # Within a cycle, free capacity in a view only shrinks (starts and claims), except in
        # `future` when victims are chosen; so a shape that did not fit stays unfit until then.
        self._nofit: dict[tuple, Reason] = {}
        self._no_victims: set[tuple] = set()
        self._lost: dict[JobId, float] = {}
        self._by_node: dict[int, list[RunningJob]] | None = None
        self._sorted_team: dict[str | None, list[RunningJob]] = {}
        self._failed: dict[tuple, Reason] = {}
        self._failed_by: dict[tuple, JobId] = {}  # the first job of each `_failed` shape
        self._details: dict[JobId, str] = {}  # `PendingInfo.detail` (`_quota_reason`)
        self._preemptible: dict[str, tuple[dict[str, dict[int, tuple[list, list]]], dict[str, int]]] = {}
        self._quota_memo: dict[tuple, tuple[list[float], list[int], bool]] = {}  # `_takeable` per team, pool, priority
        self.share_searches = 0
        self._no_share: set[tuple] = set()
        self._fledger: QuotaLedger | None = None
        self._reasons: dict[JobId, Reason] = {}
        self._started: list[tuple[PendingJob, int]] = []  # what res.starts holds, as the estimate needs it
        # Admin reservations: the nodes the job being tried may not use (`reservations.py`).
        self.holds = Holds.of(snap.reservations, snap.cluster, snap.classes, snap.now, snap.pending)
        self._mask = NO_MASK
        self._resv_est: dict[JobId, float | None] = {}  # estimates reservations decide
        self._behind_top: dict[JobId, JobId] = {}  # in-quota job -> its team's higher-priority borrower
        self._tier0: set[JobId] = set()  # the jobs `in_turn` tried as in quota
        self._merge_key = itemgetter(0)  # the order's sort key (`_preemptors_first` refines it)

    # -- views ----------------------------------------------------------------------------------

    def cur(self) -> ClusterState:
        if self.state is None:
            self.state = self.snap.cluster.copy()
        return self.state

    def fut(self) -> ClusterState:
        if self.future is None:
            self.future = self.cur().copy()
            for r in self.leaving:
                self.future.release(r.placement)
        return self.future

    def hold_quota(self, team: str, pool: str, gpus: int, prio: int) -> None:
        """A start or a claim: count its GPUs now and, once built, in the future ledger too (a
        start that only `ledger` saw let a later claim on leaving GPUs exceed the team's quota)."""
        self.ledger.add(team, pool, gpus)
        h = self._held_now.setdefault((team, pool), {})
        h[prio] = h.get(prio, 0) + gpus
        if self._fledger is not None:
            self._fledger.add(team, pool, gpus)
        if self._levels_fut is not None:
            d = self._levels_fut.setdefault((team, pool), {})
            d[prio] = d.get(prio, 0) + gpus

    def flevels(self) -> dict[tuple[str, str], dict[int, int]]:
        """Per (team, pool) and priority level, the GPUs held once the leaving jobs (and the
        victims chosen in this cycle) have left, with this cycle's starts and claims: the
        victim budget's view, as `fledger` is the quota check's."""
        if self._levels_fut is None:
            fut = {k: dict(d) for k, d in self._levels_now.items()}
            for r in self.leaving:
                self._drop_level(fut, r)
            self._levels_fut = fut
        return self._levels_fut

    def _drop_level(self, levels: dict[tuple[str, str], dict[int, int]], r: RunningJob) -> None:
        d = levels.get((r.req.team, r.req.pool))
        if d is not None:
            p = self._prio[r.req.job_class]
            d[p] = d.get(p, 0) - r.gpus

    def fledger(self) -> QuotaLedger:
        """Quota as it will be once the leaving jobs (and victims chosen now) have left.

        `self.ledger` still counts them: their GPUs are busy until they go, so only jobs that
        claim those very GPUs (step 4, step 5) may count on their quota."""
        if self._fledger is None:
            self._fledger = self.ledger.copy()
            for r in self.leaving:
                self._fledger.add(r.req.team, r.req.pool, -r.gpus)
        return self._fledger

    def place_in(self, view: ClusterState, req, n: int | None) -> tuple[Placement | None, Reason | None]:
        key = (id(view), req.pool, req.gpus, req.gpus_per_node, n, req.gpu_mem_mib, req.where, self._mask)
        why = self._nofit.get(key)
        if why is not None:
            return None, why
        pl, why = place(view, req, n)
        if pl is None:
            self._nofit[key] = why or Reason.CAPACITY
        return pl, why

    def lost(self, r: RunningJob) -> float:
        """GPU-seconds a preemption of `r` now would cost: for a class that checkpoints on the
        notice, its save and restart (`notice_lost_s` per GPU), plus a hundredth of the work
        since its last checkpoint (what the save protects, should it fail: among equals, stop
        the one that risks least); else the work since its last checkpoint."""
        v = self._lost.get(r.req.id)
        if v is None:
            at_risk = r.lost_if_stopped(self.now)
            if self._on_notice[r.req.job_class]:
                at_risk = r.placement.gpus * self.p.notice_lost_s + 0.01 * at_risk
            v = self._lost[r.req.id] = at_risk
        return v

    def commit(self, placement: Placement) -> None:
        """A start: allocate in every view that exists."""
        self.cur().allocate(placement)
        for view in (self.future, self.long_state):
            if view is not None:
                _take_where_free(view, placement)

    def claim(self, placement: Placement) -> None:
        """A future start (waiting for leaving victims): keep its GPUs from everyone else."""
        self.fut().allocate(placement)
        for view in (self.state, self.long_state):
            if view is not None:
                _take_where_free(view, placement, whole=True)

    # -- the cycle ------------------------------------------------------------------------------

    def in_turn(self, order: list[tuple[tuple, PendingJob]], n_first: int) -> Iterable[tuple[tuple, PendingJob]]:
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
        nominal, levels, held, prio = self.ledger.nominal, self._levels_now, self._held_now, self._prio
        tops: dict[tuple[str, str], tuple[int, JobId]] = {}  # each team's first borrowing job
        for key, pj in islice(order, n_first, None):
            tk = (pj.req.team, pj.req.pool)
            if tk not in tops:
                tops[tk] = (key[0], pj.req.id)
        behind = self._behind_top
        tier0 = self._tier0 if self.snap.stopped_for else None  # only `stopped_for` asks
        for kp in islice(order, n_first):
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
        rest = islice(order, n_first, None)
        yield from (heapq.merge(demoted, rest, key=self._merge_key) if demoted else rest)

    def after_their_bosses(self, jobs: Iterable[tuple[tuple, PendingJob]]) -> Iterable[tuple[tuple, PendingJob]]:
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
        stopped_for, behind_top = self.snap.stopped_for, self._behind_top
        team_of = {pj.req.id: pj.req.team for pj in self.snap.pending} if stopped_for else {}
        untried = set(team_of)
        tier0 = self._tier0
        behind: dict[JobId, list[tuple[tuple, PendingJob]]] = {}
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

    def run(self) -> CycleResult:
        snap = self.snap
        order, n_first = self.order()
        levels = self._levels
        share_below = self.p.share_below_gpu_s if self.p.share_below_gpu_s is not None else -1.0
        las_below = self.p.las_below_gpu_s
        classes, now, failed = snap.classes, self.now, self._failed
        reasons = self._reasons if snap.explain else None
        overdue = self.overdue_first(order, n_first)
        for key, pj in self.after_their_bosses(self.in_turn(order, n_first)):
            r = pj.req
            if pj.held:
                self.pend(pj, Reason.HELD)
                continue
            if overdue:
                o = overdue.get((r.team, r.pool))
                if o is not None and self._prio[r.job_class] == o[0] and r.min_gpus < o[2] and (r.submit_time, r.id) > o[1]:
                    self.pend(pj, Reason.RESERVATION)  # it would take the quota an older, larger job waits for
                    continue
            if self.holds is not None:
                mask, why = self.holds.mask(r)
                if why is not None:
                    self._resv_est[r.id] = self.holds.start_of(r)
                    self.pend(pj, why)
                    continue
                self.holds.apply(mask, (self.cur(), self.future, self.long_state))
                self._mask = mask
            # Jobs alike in every way the steps below look at fail alike: capacity and quota only
            # shrink within a cycle until victims are chosen (which clears this memo), and
            # reservations make estimates matter (no memo then).
            alike = (r.team, r.pool, r.job_class, r.gpus, r.gpus_per_node, r.min_nodes, r.max_nodes, r.gpu_mem_mib,
                     r.where, key[1], bisect_right(levels, now - pj.queued_since), pj.attained_gpu_s < share_below,
                     pj.attained_gpu_s < las_below, self._mask)
            if failed:
                known = failed.get(alike)
                if known is not None and self.shadow == math.inf:
                    if reasons is not None:
                        reasons[r.id] = known
                        first = self._failed_by.get(alike)
                        if first is not None:
                            if first in self._resv_est:
                                self._resv_est[r.id] = self._resv_est[first]
                            if first in self._details:
                                self._details[r.id] = self._details[first]
                    continue
            cls = classes[r.job_class]
            reason = self.admit(pj, key)
            if reason is None:
                continue
            # Step 4: room that leaving jobs will free.
            if self.leaving or self.stopping:
                if self.fledger().fits(r.team, r.pool, r.min_gpus):
                    pl, _ = self.place_in(self.fut(), r, r.min_nodes)
                    if pl is not None and (pl.gpus <= r.min_gpus or self.fledger().fits(r.team, r.pool, pl.gpus)):
                        self.claim(pl)
                        self.hold_quota(r.team, r.pool, max(r.min_gpus, pl.gpus), cls.priority)
                        self.pend(pj, Reason.PREEMPTING)
                        continue
            if reason == Reason.QUOTA:
                # Only the team's own lower-priority jobs can give quota back to it.
                if (self.try_preempt(pj, cls.priority, own_team_only=True) or self.try_borrow(pj, cls.priority)
                        or self.try_share(pj, cls.priority) or self.try_las(pj, cls.priority)
                        or self.try_overdue(pj, cls.priority)):
                    self.pend(pj, Reason.PREEMPTING)
                else:
                    if reasons is not None:
                        self._quota_reason(pj, cls.priority)
                    self.fail(pj, alike, reason)
                continue
            # Step 5: preemption.
            if (self.try_preempt(pj, cls.priority) or self.try_share(pj, cls.priority) or self.try_las(pj, cls.priority)
                    or self.try_overdue(pj, cls.priority)):
                self.pend(pj, Reason.PREEMPTING)
                continue
            if reason == Reason.TOPOLOGY and self.try_move(pj, cls.priority):
                self.pend(pj, Reason.PREEMPTING)
                continue
            # Step 6: reservation for urgent jobs.
            if is_urgent(key) and len(self.res.reservations) < self.p.max_reservations:
                if self.reserve(pj):
                    self.pend(pj, Reason.RESERVATION)
                    continue
            self.fail(pj, alike, reason)
        if snap.explain and self._reasons:
            reasons = self._reasons
            # Like Slurm's bf_max_job_test: only the first jobs in order get an estimate; the
            # ones behind them are too far back for a guess to mean much (None).
            ahead = list(islice((pj for _, pj in order if pj.req.id in reasons), self.p.max_estimates))
            leaving = {r.req.id: self.now + classes[r.req.job_class].grace_s for r in snap.running
                       if r.preempting or r.req.id in self.stopping}
            est = estimate_starts(snap, ahead, self._started, self.res.reservations, leaving)
            est.update(self._resv_est)
            pending = self.res.pending = {j: PendingInfo(why, est.get(j)) for j, why in reasons.items()}
            for j, detail in self._details.items():
                info = pending.get(j)
                if info is not None and info.reason == Reason.QUOTA:
                    info.detail = detail
        return self.res

    def fail(self, pj: PendingJob, alike: tuple, reason: Reason) -> None:
        """Nothing worked for this job; jobs alike will fare the same until victims are chosen."""
        if self.holds is not None and reason in (Reason.CAPACITY, Reason.TOPOLOGY, Reason.MEMORY) \
                and self.holds.blocked(pj.req, self.cur()):
            reason = Reason.RESERVED
            self._resv_est[pj.req.id] = None  # free GPUs it may not use: no estimate from them
        if self.shadow == math.inf:
            self._failed[alike] = reason
            self._failed_by[alike] = pj.req.id  # jobs alike get its estimate and detail too
        self.pend(pj, reason)

    def pend(self, pj: PendingJob, reason: Reason) -> None:
        if self.snap.explain:
            self._reasons[pj.req.id] = reason

    # Step 2.
    def order(self) -> tuple[list[tuple[tuple, PendingJob]], int]:
        snap, op = self.snap, self.p.ordering
        pools = {pj.req.pool for pj in snap.pending}
        fs = {pool: fairshare_factors(snap.teams, snap.usage, pool, op.fairshare_weight) for pool in pools}
        order, n_first = keyed_in_order(snap.pending, snap.classes, self.now, self.headroom, fs, op, snap.teams)
        bosses = set(snap.stopped_for.values()) if snap.stopped_for else None
        if bosses:
            order = self._preemptors_first(order, n_first, bosses)
        return order, n_first

    def _preemptors_first(self, order: list[tuple[tuple, PendingJob]], n_first: int,
                          bosses: set[JobId]) -> list[tuple[tuple, PendingJob]]:
        """Among the borrowing jobs (tier 1), one whose victims are leaving or have left
        (`Snapshot.stopped_for`) goes first among the jobs of its priority, as Slurm's preemptor
        is the job it starts next.

        Its victims gave up their GPUs for it. Tried after a borrowing job of its priority that
        merely scored better, it saw that job take them (in the run against real Slurm a
        borrowing 4-GPU job took the node another team's 4-GPU job had just stopped a job for,
        and was reclaimed a second later). Not among the in-quota jobs: lifted there as well,
        the ten Philly windows broke a quota on three of twenty runs (none without). `_merge_key`
        keeps the order `in_turn` merges its demoted jobs by."""
        def key(kp: tuple[tuple, PendingJob]) -> tuple:
            return (kp[0][0], kp[1].req.id not in bosses, kp[0])

        self._merge_key = key
        rest = order[n_first:]
        up = [kp for kp in rest if kp[1].req.id in bosses]
        if not up:
            return order
        return order[:n_first] + list(heapq.merge(up, (kp for kp in rest if kp[1].req.id not in bosses), key=key))

    def headroom(self, team: str, pool: str, prio: int) -> int:
        """The team's nominal quota less what its running jobs of priority `prio` or more hold
        (at the cycle's start)."""
        held = self._levels_now.get((team, pool))
        used = sum(g for p, g in held.items() if p >= prio) if held else 0
        return self.ledger.nominal(team, pool) - used

    # Step 3.
    def admit(self, pj: PendingJob, key: tuple) -> Reason | None:
        req = pj.req
        if not self.ledger.fits(req.team, req.pool, req.min_gpus):
            return Reason.QUOTA
        state = self.cur()
        if state.free_gpus(req.pool) < req.min_gpus and req.gpu_mem_mib is None:
            return Reason.CAPACITY
        sizes: Iterable[int | None]
        if req.gpus_per_node is None:
            sizes = (None,)
        else:
            sizes = range(req.max_nodes, req.min_nodes - 1, -1)
        reason = Reason.CAPACITY
        for n in sizes:
            gpus = req.gpus if n is None else req.gpus_per_node * n  # type: ignore[operator]
            if not self.ledger.fits(req.team, req.pool, gpus):
                reason = Reason.QUOTA
                continue
            view = state
            if self.long_state is not None and not self.ends_before_shadow(pj, gpus):
                view = self.long_state
            pl, why = self.place_in(view, req, n)
            if pl is None:
                if view is not state and self.place_in(state, req, n)[0] is not None:
                    why = Reason.RESERVATION
                reason = why or reason
                continue
            if pl.gpus > gpus and not self.ledger.fits(req.team, req.pool, pl.gpus):
                reason = Reason.QUOTA  # an exclusive job holds its nodes' every GPU, and is charged for them
                continue
            self.commit(pl)
            self.hold_quota(req.team, req.pool, pl.gpus, self._prio[req.job_class])
            self.res.starts.append(Start(req.id, pl))
            self._started.append((pj, pl.gpus))
            return None
        return reason

    def ends_before_shadow(self, pj: PendingJob, gpus: int) -> bool:
        est = pj.req.est_runtime_s
        if est is None:
            return False
        rate = gpus / pj.req.max_gpus
        return self.now + max(0.0, est - pj.progress_s) / rate <= self.shadow

    # Step 5.
    def _eligible_by_team(self) -> dict[str, list[tuple[int, RunningJob]]]:
        """Running jobs that may be preempted at all this cycle, by team (built once)."""
        if self._eligible is None:
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
                if cut[1] < self._min_prio:
                    self._min_prio = cut[1]
            self._eligible = eligible
        return self._eligible

    def _node_jobs(self) -> dict[int, list[RunningJob]]:
        """Preemptible running jobs by node they occupy (built once per cycle)."""
        if self._by_node is None:
            self._by_node = {}
            for jobs in self._eligible_by_team().values():
                for _, r in jobs:
                    for n in r.placement.node_indices:
                        self._by_node.setdefault(n, []).append(r)
        return self._by_node

    def _victim_rules(self, pj: PendingJob, prio: int, own_team_only: bool, whole: bool = False):
        """Who may be stopped for `pj` (a predicate) and how many GPUs each team may lose.

        Of its own team: lower priority. Of another team: only what that team borrows at the
        victim's priority level (`budget.py`: its quota is filled by its highest-priority work
        first), and then if `pj` fits in its own team's nominal quota (reclaim) or is of higher
        priority. Never so many that a team falls below its nominal quota, unless `whole` (a
        reclaim whose only victims are jobs larger than what their team borrows: such a job is
        stopped whole, issue 20 part 9).
        """
        req = pj.req
        fl = self.fledger()
        in_quota = fl.used(req.team, req.pool) + req.min_gpus <= fl.nominal(req.team, req.pool)
        waited = self.now - pj.queued_since
        in_quota = in_quota and waited >= self._min_patience
        levels: dict[str, list[tuple[int, float]]] = {}
        if not own_team_only:
            flv = self.flevels()
            for team in self._eligible_by_team():
                if team != req.team and fl.borrowed(team, req.pool) > 0:
                    levels[team] = borrowed_levels(flv.get((team, req.pool), {}), fl.nominal(team, req.pool))
        budget = VictimBudget(levels, self._prio, overshoot=whole, unlimited=(req.team,))
        candidate = budget.candidate
        classes, stopping, pool = self.snap.classes, self.stopping, req.pool

        def ok(r: RunningJob) -> bool:
            t = r.req.team
            if r.req.id in stopping or r.req.pool != pool:
                return False
            vcls = classes[r.req.job_class]
            lower = vcls.priority < prio
            if t == req.team:
                return lower
            if t not in levels or not candidate(r):
                return False
            return lower or (in_quota and waited >= self._patience(vcls))

        return ok, budget

    def try_preempt(self, pj: PendingJob, prio: int, own_team_only: bool = False) -> bool:
        if self.searches >= self.p.max_preemption_searches or self.successes >= self.p.max_preemptions_for:
            return False
        req = pj.req
        fl = self.fledger()
        in_quota = fl.used(req.team, req.pool) + req.min_gpus <= fl.nominal(req.team, req.pool)
        in_quota = in_quota and self.now - pj.queued_since >= self._min_patience
        if not in_quota and (prio <= self._lowest_preemptible or prio <= self._min_prio_now()):
            return False  # nothing of lower priority runs, and it may not reclaim
        # Which victim classes the job has waited out the patience of is part of the shape: a job
        # that may not reclaim from a class yet must not make a patient one skip its search.
        patient = bisect_right(self._levels, self.now - pj.queued_since)
        memo = (req.team, prio, in_quota, patient, own_team_only, req.pool, req.gpus, req.gpus_per_node, req.min_nodes,
                req.gpu_mem_mib, req.where, self._mask)
        if memo in self._no_victims:
            return False
        self.searches += 1  # given back below if it finds victims
        ok, budget = self._victim_rules(pj, prio, own_team_only)
        # Quota first: the team's own lower-priority jobs give quota back to it.
        found = self._find_victims(req, ok, budget, req.team)
        if found is None and in_quota and not own_team_only:
            # A team owed its quota gets it back even when the only victims are jobs larger than
            # what their teams borrow: stop such a job whole, the least-lost-work set of them.
            ok, budget = self._victim_rules(pj, prio, own_team_only, whole=True)
            found = self._find_victims(req, ok, budget, req.team)
        if found is None:
            self._no_victims.add(memo)
            return False
        victims, pl = found
        self.searches -= 1
        self._stop_for(pj, prio, victims, pl)
        return True

    def _cohort_borrowers(self, req, prio: int, teams: set[str] | None = None) -> dict[str, list[tuple[int, float]]]:
        """Per other team of `req`'s cohort that borrows in its pool and runs preemptible work of
        priority below `prio` (past its min run time; `teams`: those that run such work at all):
        what it borrows at each level (`budget.borrowed_levels`)."""
        team = self.snap.teams.get(req.team)
        if team is None or not team.cohort:
            return {}
        fl, flv, all_teams = self.fledger(), self.flevels(), self.snap.teams
        lower = teams if teams is not None else {
            t for t, jobs in self._eligible_by_team().items() if any(p < prio for p, _ in jobs)}
        out: dict[str, list[tuple[int, float]]] = {}
        for t in sorted(lower):
            other = all_teams.get(t)
            if t == req.team or other is None or other.cohort != team.cohort or fl.borrowed(t, req.pool) <= 0:
                continue
            out[t] = borrowed_levels(flv.get((t, req.pool), {}), fl.nominal(t, req.pool))
        return out

    def _may_borrow(self, req) -> bool:
        """Whether `req` needs to borrow, and the GPUs it needs beyond its team's nominal quota are
        within the team's borrowing limit (step 5f's condition)."""
        team = self.snap.teams.get(req.team)
        if team is None or not team.cohort:
            return False
        fl = self.fledger()
        over = fl.used(req.team, req.pool) + req.min_gpus - fl.nominal(req.team, req.pool)
        limit = team.quota(req.pool).borrowing_limit
        return over > 0 and (limit is None or over <= limit)

    def try_borrow(self, pj: PendingJob, prio: int) -> bool:
        """Step 5f: borrowing within the cohort by preempting lower-priority borrowers.

        A job blocked by quota, whose GPUs beyond its team's nominal quota are within the team's
        borrowing limit, may stop jobs of other teams of its cohort that are of lower priority
        and borrow (whole jobs; only what their team borrows at the victim's level, so no team
        ends below its nominal quota: the strict `VictimBudget`), and its own team's
        lower-priority jobs, least lost work first, until the cohort can lend it what it needs
        and it fits. Kueue's `borrowWithinCohort` (policy LowerPriority); Slurm's QOS preemption
        stops lower-priority jobs whatever the quotas. Before it, a team's interactive job one
        GPU beyond its nominal waited for another team's batch jobs to end by themselves, past
        its class's max wait, while the same job within nominal reclaimed in seconds (issue 35).
        Victims are past their min run time and get their grace, as every victim. No ping-pong:
        a victim is of lower priority and, its team left at or above nominal, needs to borrow to
        restart, so it can never stop its preemptor back.
        """
        p, req = self.p, pj.req
        if not p.borrow_within_cohort:
            return False
        if self.searches >= p.max_preemption_searches or self.successes >= p.max_preemptions_for:
            return False
        if prio <= self._lowest_preemptible or prio <= self._min_prio_now():
            return False  # nothing of lower priority runs
        if not self._may_borrow(req):
            return False
        memo = ("borrow", req.team, prio, req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib,
                req.where, self._mask)
        if memo in self._no_victims:
            return False
        levels = self._cohort_borrowers(req, prio)
        if not levels:
            self._no_victims.add(memo)
            return False
        self.searches += 1  # given back below if it finds victims
        budget = VictimBudget(levels, self._prio, unlimited=(req.team,))
        candidate, classes, stopping, pool, mine = budget.candidate, self.snap.classes, self.stopping, req.pool, req.team

        def ok(r: RunningJob) -> bool:
            rq = r.req
            if rq.id in stopping or rq.pool != pool or classes[rq.job_class].priority >= prio:
                return False
            return rq.team == mine or (rq.team in levels and candidate(r))

        # Quota first (least lost work anywhere, then what more must go for it to fit), else
        # place first: the victims that make room on the nodes it would take, if their leaving
        # also gives the cohort room (the quota-first set can be spread so thin over the nodes
        # that the budget has nothing left for the node it needs).
        found = self._find_victims(req, ok, budget, None) or self._room_first(req, ok, budget)
        if found is None:
            self._no_victims.add(memo)
            return False
        self.searches -= 1
        victims, pl = found
        self._stop_for(pj, prio, victims, pl, kind_of="borrow")
        return True

    def _room_first(self, req, ok, budget: VictimBudget) -> tuple[list[RunningJob], None] | None:
        """Victims chosen for room on the nodes `req` would take (`preemption.find_victims`),
        when their leaving also lets it fit its quota; else None."""
        victims = self._more_victims(self.fut(), req, ok, budget.tally(), [])
        if victims is None:
            return None
        ledger = self.fledger().copy()
        for v in victims:
            ledger.add(v.req.team, v.req.pool, -v.gpus)
        return (victims, None) if ledger.fits(req.team, req.pool, req.min_gpus) else None

    def _quota_reason(self, pj: PendingJob, prio: int) -> None:
        """Step 7 for a job blocked by quota that no step could help: which limit holds it
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
        team = self.snap.teams.get(req.team)
        fl = self.fledger()
        over = fl.used(req.team, req.pool) + req.min_gpus - fl.nominal(req.team, req.pool)
        if over <= 0 or team is None:
            return
        if not self._may_borrow(req):
            self._details[req.id] = BORROWING_LIMIT
            return
        if not self.p.borrow_within_cohort:
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
        known = self._quota_memo.get(key)
        if known is None or (known[2] and need > (known[1][-1] if known[1] else 0)):  # none yet, or cut short
            known = self._quota_memo[key] = self._takeable(req, prio, need)
        times, total, cut = known
        if not total or need > total[-1]:
            self._details[req.id] = COHORT_IN_USE
            return
        self._resv_est[req.id] = times[bisect_left(total, need)]

    def _takeable(self, req, prio: int, need: int) -> tuple[list[float], list[int], bool]:
        """For `_quota_reason`: the times (each a victim's end of min run time, plus its grace,
        ascending) at which step 5f could have the GPUs it may take for `req`, the running total
        of those GPUs, and whether the search stopped early: once each team gave what any job of
        `req`'s team and pool could need (`need`, or more for its team's larger jobs)."""
        by_team, largest = self._preemptible_in(req.pool)
        cap = need + largest.get(req.team, req.min_gpus) - req.min_gpus
        lower = {t for t, levels in by_team.items() if min(levels) < prio}
        borrowing = self._cohort_borrowers(req, prio, teams=lower)
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
            for g, at in _joined([by_size for by_size, _ in below]):
                if got >= cap:
                    cut = True
                    break
                if g > left:
                    break
                when.append((at, g))
                left -= g
                got += g
        when.sort()
        times, total, got = [], [], 0
        for at, g in when:
            got += g
            times.append(at)
            total.append(got)
        return times, total, cut

    def _preemptible_in(self, pool: str) -> tuple[dict[str, dict[int, tuple[list, list]]], dict[str, int]]:
        """Per team and priority, the running jobs of `pool` that are or will be possible victims
        (preemptible, not leaving): (GPUs, when) smallest first and (when, GPUs) earliest first,
        `when` being the end of its min run time plus its grace; and per team the most GPUs a job
        of it waits for in the pool. Built once per pool a cycle."""
        got = self._preemptible.get(pool)
        if got is None:
            now = self.now
            # per class: (priority, min run time, grace), for preemptible classes only
            rule = {n: (c.priority, c.min_run_s, c.grace_s) for n, c in self.snap.classes.items() if c.preemptible}
            lists: dict[tuple[str, int], list[tuple[int, float]]] = {}
            for r in self.snap.running:
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
            by_team: dict[str, dict[int, tuple[list, list]]] = {}
            for (t, q), js in sorted(lists.items()):
                by_team.setdefault(t, {})[q] = (js, [])  # sorted on first use (`_sorted_pair`)
            largest: dict[str, int] = {}
            for pj in self.snap.pending:
                rq = pj.req
                if rq.pool == pool and rq.min_gpus > largest.get(rq.team, 0):
                    largest[rq.team] = rq.min_gpus
            got = self._preemptible[pool] = (by_team, largest)
        return got

    def _stop_for(self, pj: PendingJob, prio: int, victims: list[RunningJob], pl: Placement | None,
                  shared: str | None = None, kind_of: str | None = None) -> None:
        """Send `victims` their notices and let `pj` claim the GPUs they free. `shared`: the kind
        of the victims of `pj`'s priority; `kind_of`: every victim's kind, whatever its priority."""
        req = pj.req
        self.successes += 1
        self._no_victims.clear()
        self._no_share.clear()
        self._failed.clear()
        fut_id = id(self.fut())
        self._nofit = {k: v for k, v in self._nofit.items() if k[0] != fut_id}
        flv = self.flevels()
        for v in victims:
            self.stopping.add(v.req.id)
            self.fut().release(v.placement)
            self.fledger().add(v.req.team, v.req.pool, -v.gpus)
            self._drop_level(flv, v)
            vprio = self.snap.classes[v.req.job_class].priority
            kind = kind_of or ("priority" if vprio < prio else shared or "reclaim")
            self.res.preemptions.append(Preempt(v.req.id, kind, req.id))
        if pl is None:
            pl, _ = place(self.fut(), req, req.min_nodes)
        if pl is not None:
            self.claim(pl)
        # The preemptor's quota is held for it while its victims leave.
        self.hold_quota(req.team, req.pool, req.min_gpus, prio)

    def try_share(self, pj: PendingJob, prio: int) -> bool:
        """Step 5b: time-sharing by attained service among jobs of the same priority.

        A job that has held few GPU-seconds so far (`share_below_gpu_s`) may stop jobs of its own
        priority that have held many (`share_above_gpu_s`): of its own team, or of teams that
        borrow (never below their nominal quota). Least lost work first, as for any victim.
        Short jobs then do not queue behind week-long ones; the long ones lose at most the work
        since their last checkpoint and come back when the short ones are done.
        """
        p = self.p
        if p.share_below_gpu_s is None or pj.attained_gpu_s >= p.share_below_gpu_s:
            return False
        if self.share_searches >= p.max_preemption_searches or self.successes >= p.max_preemptions_for:
            return False
        req = pj.req
        # The victim must have, by estimate, `share_ratio` times the preemptor's remaining work.
        mine = _remaining_s(pj.req, pj.progress_s, self.snap.classes[req.job_class], self.p) * req.min_gpus
        least = p.share_ratio * mine
        memo = (req.team, prio, req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib, req.where, least, self._mask)
        if memo in self._no_share:
            return False
        fl = self.fledger()
        # Only borrowed GPUs are shared: every victim's team stays at or above its nominal quota
        # (the preemptor's own team counting the preemptor), so no victim is ever owed quota.
        amounts: dict[str, float] = {}
        for team in self._eligible_by_team():
            b = fl.used(team, req.pool) + (req.min_gpus if team == req.team else 0) - fl.nominal(team, req.pool)
            if b > 0:
                amounts[team] = b
        if not amounts:
            return False
        budget = VictimBudget.flat(amounts, self._prio)
        now, above, max_lost, min_attempt = self.now, p.share_above_gpu_s, p.share_max_lost_s, p.share_min_attempt_s
        classes, stopping, pool, lost = self.snap.classes, self.stopping, req.pool, self.lost

        def ok(r: RunningJob) -> bool:
            rq = r.req
            if rq.team not in amounts or rq.id in stopping or rq.pool != pool:
                return False
            if classes[rq.job_class].priority != prio:
                return False
            g = r.placement.gpus
            ran = now - r.start_time
            # An attempt that has not saved anything yet is never shared: restarted long jobs
            # would otherwise be stopped again and again before they make any progress.
            if ran < min_attempt or ran < (rq.checkpoint_interval_s or 0.0):
                return False
            if r.attained_gpu_s + g * ran < above or lost(r) > max_lost * g:
                return False
            return _remaining_s(rq, r.progress_s + ran, classes[rq.job_class], p) * g >= least

        self.share_searches += 1
        # Quota first: any borrowing team's shareable jobs give cohort slack back.
        found = self._find_victims(req, ok, budget, None)
        if found is None:
            self._no_share.add(memo)
            return False
        self.share_searches -= 1
        victims, pl = found
        self._stop_for(pj, prio, victims, pl, shared="share")
        return True

    def try_las(self, pj: PendingJob, prio: int) -> bool:
        """Step 5c: least-attained-service within a team's own quota (`Team.las`).

        A job that has held few GPU-seconds (`las_below_gpu_s`) may stop jobs of its own team and
        priority, of classes the team asked this for, that have held many (`las_above_gpu_s`) and
        have, by estimate, `las_ratio` times its remaining GPU-time left; it takes their place
        in the team's quota (never more than its own size: `_find_victims`), so no other team's
        GPUs or quota are touched. Victims of a class that checkpoints on the notice lose its
        save and restart; others must have saved a checkpoint in this attempt and lose at most
        `share_max_lost_s` per GPU. No ping-pong: a victim has held at least `las_above_gpu_s`
        (>= `las_below_gpu_s`) and attained service only grows, so it can never stop its
        preemptor back; like every victim it has run its class's min run time.
        """
        p, req = self.p, pj.req
        team = self.snap.teams.get(req.team)
        if team is None or not team.las_for(req.job_class) or pj.attained_gpu_s >= p.las_below_gpu_s:
            return False
        if self.share_searches >= p.max_preemption_searches or self.successes >= p.max_preemptions_for:
            return False
        classes = self.snap.classes
        least = p.las_ratio * _remaining_s(req, pj.progress_s, classes[req.job_class], p) * req.min_gpus
        memo = ("las", req.team, prio, req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib, req.where,
                least, self._mask)
        if memo in self._no_share:
            return False
        now, above, max_lost, min_attempt = self.now, p.las_above_gpu_s, p.share_max_lost_s, p.share_min_attempt_s
        stopping, pool, lost, on_notice, mine = self.stopping, req.pool, self.lost, self._on_notice, req.team

        def ok(r: RunningJob) -> bool:
            rq = r.req
            if rq.team != mine or rq.id in stopping or rq.pool != pool or not team.las_for(rq.job_class):
                return False
            cls = classes[rq.job_class]
            if cls.priority != prio:
                return False
            g = r.placement.gpus
            ran = now - r.start_time
            if r.attained_gpu_s + g * ran < above:
                return False
            if not on_notice[rq.job_class]:
                # It loses its work since its last checkpoint: only once it has saved one in
                # this attempt, and little since.
                if ran < min_attempt or ran < (rq.checkpoint_interval_s or 0.0) or lost(r) > max_lost * g:
                    return False
            return _remaining_s(rq, r.progress_s + ran, cls, p) * g >= least

        return self._in_own_team_place(pj, prio, ok, memo, "las")

    def overdue_first(self, order: list[tuple[tuple, PendingJob]], n_first: int) -> dict[tuple[str, str], tuple]:
        """Per (team, pool), the first-submitted overdue job (step 5d) that its team's quota has
        no room for although it is no larger than that quota: (its priority, (submit time, id),
        GPUs), when only its team's smaller jobs of its priority submitted after it stand in its
        way. While it waits, those do not start: without that, in a stream of short jobs some are
        always within their min run time, so it never finds enough victims at once."""
        at = self.p.overdue_at
        if at is None:
            return {}
        now, classes, nominal = self.now, self.snap.classes, self.ledger.nominal
        first: dict[tuple[str, str], tuple] = {}
        by_team: dict[tuple[str, str], list[RunningJob]] | None = None
        for _, pj in islice(order, n_first, None):
            req = pj.req
            cls = classes[req.job_class]
            late = now - pj.queued_since - self._overdue_after(req, cls)
            # Held back for one min run time and part of a grace at most: long enough for the
            # running ones to become victims, never so long that the team's own quota idles (a
            # team whose jobs wait beside unused quota that others borrow is owed it).
            if pj.held or late < 0 or late > cls.min_run_s + self.p.overdue_hold_grace * cls.grace_s:
                continue
            tp, mine = (req.team, req.pool), (req.submit_time, req.id)
            if tp in first and first[tp][1] < mine:
                continue
            need = req.min_gpus
            if need > nominal(req.team, req.pool) or need <= self.headroom(req.team, req.pool, cls.priority):
                continue
            # Only while what stands in its way is its team's smaller, younger jobs: if older or
            # larger ones hold the quota it needs, holding the team back would only idle it.
            if by_team is None:
                by_team = {}
                for r in self.snap.running:
                    by_team.setdefault((r.req.team, r.req.pool), []).append(r)
            prio = cls.priority
            other = sum(r.gpus for r in by_team.get(tp, ()) if classes[r.req.job_class].priority >= prio and not (
                classes[r.req.job_class].priority == prio and r.gpus < need and (r.req.submit_time, r.req.id) > mine))
            if nominal(req.team, req.pool) - other >= need:
                first[tp] = (prio, mine, need)
        return first

    def _overdue_after(self, req, cls) -> float:
        """How long a job pends before it is overdue (step 5d): `overdue_at` of its max wait, or,
        for a class its team runs least-attained-service for, at least `las_reserve_at` of it
        (as urgency: serving such a team's jobs oldest first would turn its queue back into
        FIFO, which is what it asked not to have)."""
        at = self.p.overdue_at or 0.0
        team = self.snap.teams.get(req.team)
        if team is not None and team.las and team.las_for(req.job_class):
            at = max(at, self.p.ordering.las_reserve_at)
        return at * cls.max_wait_s

    def try_overdue(self, pj: PendingJob, prio: int) -> bool:
        """Step 5d: an overdue job takes its place back from the jobs of its team that overtook it.

        A job that has been pending `overdue_at` of its class's max wait and is no larger than its
        team's nominal quota may stop its own team's jobs of its priority that are smaller than
        it and were submitted after it, and takes their place in the team's quota (never more than its own size:
        `_find_victims`): without it, a team's stream of small jobs, in quota and so tried first,
        takes every GPU its quota frees and a large job of the team waits until the stream ends
        (issue 20 part 5: Slurm's answer is a reservation for its top job). No other team's GPUs
        or quota are touched. Victims of a class that checkpoints on the notice lose its save and
        restart; others must have saved a checkpoint in this attempt and lose at most
        `share_max_lost_s` per GPU. While it waits, those jobs do not start (`overdue_first`).
        No ping-pong: a victim was submitted after its preemptor and is smaller, so it can never
        stop it back; like every victim it has run its class's min run time. Its wait is then
        bounded by `overdue_at` of its max wait, plus what its team's older jobs have left to run
        (or the younger ones' min run time), plus their grace.
        """
        p, req = self.p, pj.req
        if p.overdue_at is None:
            return False
        cls = self.snap.classes[req.job_class]
        if self.now - pj.queued_since < self._overdue_after(req, cls):
            return False  # (pending that long now: a victim requeued a moment ago is not overdue)
        if req.min_gpus > self.ledger.nominal(req.team, req.pool):
            return False  # it can only ever borrow: its own team's GPUs would not make it fit
        if self.share_searches >= p.max_preemption_searches or self.successes >= p.max_preemptions_for:
            return False
        memo = ("overdue", req.team, prio, req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib,
                req.where, req.submit_time, self._mask)
        if memo in self._no_share:
            return False
        classes, now, max_lost, min_attempt = self.snap.classes, self.now, p.share_max_lost_s, p.share_min_attempt_s
        stopping, pool, lost, on_notice, mine = self.stopping, req.pool, self.lost, self._on_notice, req.team
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

        return self._in_own_team_place(pj, prio, ok, memo, "overdue")

    def try_move(self, pj: PendingJob, prio: int) -> bool:
        """Step 5e: move smaller jobs aside for a gang the pool's free GPUs could hold but no node does.

        Best fit keeps large holes while it can, but in a pool busy with single-GPU jobs every node
        keeps a few of them, and a gang waits until some node drains by chance (a day and more on
        the Philly windows, with tens of GPUs free). Here the gang, once it has passed its quota
        and waited `move_after_s`, stops the smaller single-node jobs on the nodes it would take
        (the least-lost-work set, `_find_victims`), of any team, when (1) their classes checkpoint
        on the notice, so each loses only its save and restart, (2) they are past their min run
        time (eligible victims), and (3) all of them fit at once on the pool's free GPUs left
        once the gang has its place (`_movers_fit`), so no team loses GPUs for longer than a
        restart and no quota changes hands. No ping-pong: a mover is smaller than the gang and
        single-node, so it never needs a move itself (it fits where it is sent) and can never
        move the gang back.
        """
        p, req = self.p, pj.req
        if not p.move_for_gangs or req.min_gpus < 2:
            return False
        if self.now - pj.queued_since < p.move_after_s:
            return False
        if self.share_searches >= p.max_preemption_searches or self.successes >= p.max_preemptions_for:
            return False
        state = self.fut()
        if state.free_gpus(req.pool) < req.min_gpus:
            return False  # not fragmentation: the pool has too few free GPUs
        memo = ("move", req.pool, req.gpus, req.gpus_per_node, req.min_nodes, req.gpu_mem_mib, req.where, self._mask)
        if memo in self._no_share:
            return False
        stopping, pool, on_notice, size = self.stopping, req.pool, self._on_notice, req.min_gpus

        def ok(r: RunningJob) -> bool:
            rq = r.req
            return (rq.id not in stopping and rq.pool == pool and r.gpus < size and len(r.placement.nodes) == 1
                    and on_notice[rq.job_class])

        self.share_searches += 1
        teams = {t: math.inf for t in self._eligible_by_team()}
        found = self._find_victims(req, ok, VictimBudget.flat(teams, self._prio), None)
        if found is None or not self._movers_fit(req, *found):
            self._no_share.add(memo)
            return False
        self.share_searches -= 1
        victims, pl = found
        self._stop_for(pj, prio, victims, pl, shared="move")
        return True

    def _movers_fit(self, req, victims: list[RunningJob], pl: Placement | None) -> bool:
        """Whether every victim of a move fits on the pool's other free GPUs once `req` has its place."""
        view = self.fut().copy()
        for v in victims:
            view.release(v.placement)
        if pl is None:
            pl, _ = place(view, req, req.min_nodes)
            if pl is None:
                return False
        view.allocate(pl)
        for v in sorted(victims, key=lambda v: -v.gpus):
            got, _ = place(view, v.req, 1)
            if got is None:
                return False
            view.allocate(got)
        return True

    def _in_own_team_place(self, pj: PendingJob, prio: int, ok, memo: tuple, kind: str) -> bool:
        """Steps 5c and 5d: stop the jobs of `pj`'s own team that `ok` allows, taking their place
        in the team's quota; a fruitless search is remembered (`memo`) for the rest of the cycle."""
        mine = pj.req.team
        self.share_searches += 1
        found = self._find_victims(pj.req, ok, VictimBudget({}, self._prio, unlimited=(mine,)), mine)
        if found is None:
            self._no_share.add(memo)
            return False
        self.share_searches -= 1
        victims, pl = found
        self._stop_for(pj, prio, victims, pl, shared=kind)
        return True

    def _find_victims(self, req, ok, budget: VictimBudget,
                      quota_from: str | None) -> tuple[list[RunningJob], Placement | None] | None:
        """Victims for `req`, or None: first, if it does not fit its quota, jobs of `quota_from`
        (a team; None: every team) least lost work first until it does; then whatever more
        must go for it to fit (`_place_victims`). No team loses more than its `budget` allows."""
        chosen: list[RunningJob] = []
        tally = budget.tally()
        ledger = self.fledger().copy()
        if not ledger.fits(req.team, req.pool, req.min_gpus):
            # The job takes its victims' place in the quota: never more than its own size
            # (plus the last victim's overshoot). A team further beyond what its cohort can lend
            # now (lenders took their quota back) gives that back to the lenders' reclaims, not
            # to one of its own jobs (a 1-GPU job stopped 220 of its team's jobs otherwise); a
            # job that replaces its own team's jobs GPU for GPU leaves every quota as it was.
            freed = 0
            for r in self._cheapest_first(quota_from):
                if not ok(r) or not tally.take(r):
                    continue
                chosen.append(r)
                freed += r.gpus
                ledger.add(r.req.team, r.req.pool, -r.gpus)
                if ledger.fits(req.team, req.pool, req.min_gpus):
                    break
                if freed >= req.min_gpus:
                    if quota_from == req.team:
                        break  # in its own team's place
                    return None
            else:
                return None
        return self._place_victims(req, ok, tally, chosen)

    def _cheapest_first(self, team: str | None) -> list[RunningJob]:
        """A team's preemptible jobs (None: every team's), least lost work per GPU first
        (sorted once per cycle)."""
        got = self._sorted_team.get(team)
        if got is None:
            lost = self.lost
            eligible = self._eligible_by_team()
            teams = eligible.values() if team is None else (eligible.get(team, ()),)
            # (cost, id, job): ids are unique, so two jobs are never compared themselves.
            keyed = [(lost(r) / r.placement.gpus, r.req.id, r) for jobs in teams for _, r in jobs]
            keyed.sort()
            got = self._sorted_team[team] = [r for _, _, r in keyed]
        return got

    def _patience(self, victim_class) -> float:
        """How long a job owed quota waits for natural turnover before reclaiming from this class."""
        return min(self.p.reclaim_after_s, self.p.reclaim_share * (victim_class.grace_s + victim_class.min_run_s))

    def _min_prio_now(self) -> float:
        self._eligible_by_team()
        return self._min_prio

    def _place_victims(self, req, ok, tally: Tally,
                       chosen: list[RunningJob]) -> tuple[list[RunningJob], Placement | None] | None:
        """`chosen` plus whatever more must go for `req` to fit, or None if it cannot.

        With the placement `req` gets once they have left, when it was found on the way (None:
        the caller places it). The victims already chosen are released in the `future` view for
        the search and allocated back after it (exact, in integer MiB): a copy of the whole
        cluster per search cost more than the search itself.
        """
        state = self.fut()
        for v in chosen:
            state.release(v.placement)
        try:
            if chosen:
                pl, _ = place(state, req, req.min_nodes)
                if pl is not None:
                    return chosen, pl
            more = self._more_victims(state, req, ok, tally, chosen)
            return None if more is None else (chosen + more, None)
        finally:
            for v in chosen:
                state.allocate(v.placement)

    def _more_victims(self, state: ClusterState, req, ok, tally: Tally,
                      chosen: list[RunningJob]) -> list[RunningJob] | None:
        taken = {v.req.id for v in chosen}
        max_node = state.max_gpus.get(req.pool, 0)
        if req.gpus_per_node is not None:
            n, per = req.min_nodes, req.gpus_per_node
        elif req.gpus <= max_node:
            n, per = 1, req.gpus
        else:
            n, per = -(-req.gpus // max_node), max_node
        more = find_victims(state, req, n, per, self._node_jobs(), lambda r: r.req.id not in taken and ok(r),
                            self.lost, tally)
        return more or None

    # Step 6.
    def ends(self) -> list[tuple[float, str, Placement]]:
        if self._ends is None:
            ends = []
            for r in self.snap.running:
                cls = self.snap.classes[r.req.job_class]
                e = self.now + cls.grace_s if (r.preempting or r.req.id in self.stopping) else expected_end(r, cls, self.now)
                if e != math.inf:
                    ends.append((e, r.req.id, r.placement))
            ends.sort(key=lambda x: (x[0], x[1]))
            self._ends = ends
        return self._ends

    def reserve(self, pj: PendingJob) -> bool:
        req = pj.req
        if not memory_ever_fits(self.snap.cluster, req):  # capacities, not what is free
            return False  # no GPU of its pool is big enough: no end of any job helps
        view = (self.long_state or self.cur()).copy()
        need = req.min_gpus
        step = max(1, need // 4)
        since_try = need
        held = self._reserved_gpus
        for end, _, pl in self.ends():
            view.release(pl)
            if held:  # an earlier reservation's GPUs stay out of this one's view when they free up
                for i, gis in pl.nodes:
                    for g in gis:
                        if (i, g) in held:
                            view.take_gpu(i, g)
            since_try += pl.gpus
            if view.free_gpus(req.pool) < need or since_try < step:
                continue
            since_try = 0
            got, _ = place(view, req, req.min_nodes)
            if got is not None:
                self.res.reservations.append(Reservation(req.id, max(end, self.now), got.node_indices))
                if self.long_state is None:
                    self.long_state = self.cur().copy()
                for (i, gis), _m in zip(got.nodes, got.mem_mib):
                    for g in gis:
                        self.long_state.take_gpu(i, g)
                        held.add((i, g))
                self.shadow = min(self.shadow, max(end, self.now))
                return True
        return False


def _sorted_pair(pair: tuple[list, list]) -> tuple[list, list]:
    """`_preemptible_in`'s (GPUs, when) list sorted, and its (when, GPUs) twin, made once."""
    by_size, by_at = pair
    if not by_at and by_size:
        by_size.sort()
        by_at.extend(sorted([(at, g) for g, at in by_size]))
    return pair


def _joined(lists: list[list[tuple]]) -> list[tuple]:
    """Sorted lists as one sorted list (the one itself when there is one)."""
    return lists[0] if len(lists) == 1 else sorted(chain.from_iterable(lists))


def _remaining_s(req, progress_s: float, cls, p: EngineParams) -> float:
    """A job's estimated remaining run time (at least a minute): its estimate, else its class's
    max run time, else the ordering's default for unknown run times."""
    est = req.est_runtime_s
    if est is None:
        est = cls.max_run_s or p.ordering.unknown_runtime_s
    return max(60.0, est - progress_s)


def _take_where_free(view: ClusterState, placement: Placement, whole: bool = False) -> None:
    """Mark a placement's GPUs used in another view, where they are still free there."""
    for (i, gis), mem in zip(placement.nodes, placement.mem_mib):
        free = view.free_mib[i]
        for g in gis:
            if whole or free[g] < mem:
                if free[g] > 0:
                    view.take_gpu(i, g)
            else:
                view.allocate(Placement(((i, (g,)),), (mem,)))
