"""Kueue: ClusterQueues with cohort borrowing, BestEffortFIFO, and two preemption rules.

What it models (field names from Kueue's ClusterQueue API):
- One ClusterQueue per team, its `nominalQuota`, `borrowingLimit` and `lendingLimit` per pool as
  `Quota`; teams with the same `cohort` lend each other unused nominal quota (`QuotaLedger`).
- `queueingStrategy: BestEffortFIFO`: workloads are tried in one global order, as Kueue's
  scheduler orders a cycle's entries: those that fit under their team's nominal quota before
  those that must borrow, then class priority (the WorkloadPriorityClass) descending, then
  submit time (creation timestamp, which a preempted workload keeps), then id; a
  workload that does not fit (quota, or no placement on the nodes) is skipped and does not
  block the ones behind it.
- `preemption.withinClusterQueue: LowerPriority`: a team's blocked workload may preempt its own
  team's running workloads of strictly lower priority.
- `preemption.reclaimWithinCohort: Any`: a team whose usage plus the workload stays within its
  nominal quota may take back lent quota by preempting workloads of any priority from teams of
  its cohort that are borrowing; a team is a candidate only while it is still borrowing, so it
  is left at or just under (by part of one workload) its nominal quota, as in Kueue.
  Candidates are ordered as Kueue's `candidatesOrdering` does: other teams' workloads first, then
  lowest priority, then most recently started; they are taken until the workload fits (quota and
  placement), then every victim not needed is given back (Kueue's fill-back). The preemptor
  starts in a later cycle, when its victims have left; meanwhile it waits for them and preempts
  no more. Victims must be preemptible and past their class `min_run_s` (our addition).

What it leaves out: Kueue admits one head workload per ClusterQueue per scheduling cycle; here
every workload that fits is admitted in one cycle (the same outcome as many fast cycles), and at
most one preemption search per team and pool per cycle (as only a queue's head can preempt).
Real Kueue checks quota only and lets kube-scheduler place pods (pods may then sit Pending);
here admission also needs a gang placement now (as with Topology Aware Scheduling). No
`borrowWithinCohort`, no fair sharing (`fairSharing` weights), no `waitForPodsReady`, no
resource flavors or flavor fungibility, no hierarchical cohorts. It uses no run-time
estimates and never considers checkpoints when choosing victims (the simulator charges their
preemption as it charges every policy's). `est_start` is always None (Kueue does not estimate).
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Iterable, Mapping

from trainyard.sched.baselines._common import (
    INF,
    STOP_DELAY_S,
    Classes,
    Fitter,
    Outlook,
    may_fit,
    shape_gpus,
    shapes,
)
from trainyard.sched.cluster import ClusterState, Placement
from trainyard.sched.placement import place
from trainyard.sched.policy import gc_paused, register
from trainyard.sched.quota import QuotaLedger
from trainyard.sched.types import (
    CycleResult, JobId, JobRequest, PendingInfo, PendingJob, Preempt, PreemptionKind, Reason, RunningJob, Snapshot,
    Start,
)

_RANK = itemgetter(0, 1, 2)


@register("kueue")
class Kueue:
    name = "kueue"

    @gc_paused
    def cycle(self, snap: Snapshot) -> CycleResult:
        res = CycleResult()
        now, explain = snap.now, snap.explain
        classes = Classes(snap)
        prio = classes.prio

        state = snap.cluster.copy()
        fitter = Fitter(state)
        # One pass over the running jobs: quota usage (all, and without those leaving) and the
        # preemptible ones per pool, with their candidate sort key (less its first field).
        use_all: dict[tuple[str, str], int] = {}
        use_live: dict[tuple[str, str], int] = {}
        preemptible: dict[str, list[tuple[int, float, JobId, str, RunningJob]]] = {}
        for r in snap.running:
            rq = r.req
            k = (rq.team, rq.pool)
            g = r.placement.gpus
            use_all[k] = use_all.get(k, 0) + g
            if r.preempting:
                continue
            use_live[k] = use_live.get(k, 0) + g
            cls = classes[rq.job_class]
            if cls.preemptible and now - r.start_time >= cls.min_run_s:  # may_preempt
                preemptible.setdefault(rq.pool, []).append((cls.priority, -r.start_time, rq.id, rq.team, r))
        ledger = QuotaLedger(snap.teams, [(t, p, g) for (t, p), g in use_all.items()])

        # Kueue's scheduler orders a cycle's entries (scheduler.go, entryOrdering): workloads that
        # fit under their ClusterQueue's nominal quota before those that must borrow, then
        # priority, then the queue timestamp (creation; preempted workloads keep theirs).
        def borrows(j: PendingJob) -> bool:
            rq = j.req
            return ledger.used(rq.team, rq.pool) + rq.min_gpus > ledger.nominal(rq.team, rq.pool)

        order = sorted(snap.pending, key=lambda j: (borrows(j), -prio[j.req.job_class], j.req.submit_time, j.req.id))
        outlook = Outlook(snap, with_quota=True, usage=[(t, p, g) for (t, p), g in use_live.items()])
        cohort_of = {name: t.cohort for name, t in snap.teams.items()}
        searched: set[tuple[str, str]] = set()
        sorted_pools: dict[str, bool] = {}  # preemptible[pool] sorted (on first use)

        # Within a cycle `ledger` only gains usage, so a quota check that failed for g GPUs keeps
        # failing for g or more: remember the smallest failure per (team, pool). A success for g
        # holds for g or less until the ledger next changes: remember the largest (`qok`, cleared
        # at every `ledger.add`).
        qfail: dict[tuple[str, str], int] = {}
        qok: dict[tuple[str, str], int] = {}

        def fits(team: str, pool: str, g: int) -> bool:
            key = (team, pool)
            if g >= qfail.get(key, INF):
                return False
            if g <= qok.get(key, -1):
                return True
            if ledger.fits(team, pool, g):
                qok[key] = g
                return True
            qfail[key] = g
            return False

        for job in order:
            req = job.req
            team, pool = req.team, req.pool
            if job.held:
                if explain:
                    res.pending[req.id] = PendingInfo(Reason.HELD, None)
                continue
            need = shape_gpus(req, shapes(req)[-1])
            if not explain and req.gpu_mem_mib is None and state.free_gpus(pool) < need:
                p, why = None, Reason.CAPACITY  # (the quota check would only change the reason)
            elif not fits(team, pool, need):
                p, why = None, Reason.QUOTA
            elif req.gpu_mem_mib is None and state.free_gpus(pool) < need:
                p, why = None, Reason.CAPACITY
            else:
                p, why = fitter.fit(req, allow=lambda g: fits(team, pool, g))
            if p is not None:
                fitter.take(p)
                ledger.add(team, pool, p.gpus)
                qok.clear()
                outlook.note_start(req, p)
                res.starts.append(Start(req.id, p))
                continue

            if (team, pool) not in searched:
                searched.add((team, pool))
                cands = preemptible.get(pool)
                if cands is not None and not sorted_pools.get(pool):
                    cands.sort(key=_RANK)
                    sorted_pools[pool] = True
                got = self._preempt_for(snap, req, outlook, cands or (), prio, cohort_of)
                if got is not None:
                    chosen, p = got
                    outlook.commit(req, chosen, p, state)
                    ledger.add(team, pool, p.gpus)  # hold its quota too (conservative for one cycle)
                    qok.clear()
                    for v in chosen:
                        why_p = PreemptionKind.PRIORITY if v.req.team == team else PreemptionKind.RECLAIM
                        res.preemptions.append(Preempt(v.req.id, why_p, req.id))
                    if explain:
                        res.pending[req.id] = PendingInfo(Reason.PREEMPTING, now + STOP_DELAY_S)
                    continue
            if explain:
                res.pending[req.id] = PendingInfo(why, None)
        return res

    @staticmethod
    def _preempt_for(snap: Snapshot, req: JobRequest, outlook: Outlook,
                     preemptible: Iterable[tuple[int, float, JobId, str, RunningJob]], prio: Mapping[str, int],
                     cohort_of: Mapping[str, str | None]) -> tuple[list[RunningJob], Placement] | None:
        team, pool = req.team, req.pool
        n = shapes(req)[-1]
        need = shape_gpus(req, n)
        my_prio = prio[req.job_class]
        t = snap.teams.get(team)
        if t is None:
            return None
        ol: QuotaLedger = outlook.ledger  # type: ignore[assignment]
        reclaim = ol.used(team, pool) + need <= ol.nominal(team, pool)
        cohort = t.cohort if reclaim else None
        # Kueue's candidatesOrdering, (other team first, priority, newest start, id): `preemptible`
        # is sorted by the last three, so filtering it keeps each group in order.
        own = []
        others = []
        for pr, _, _, rteam, r in preemptible:
            if rteam == team:
                if pr < my_prio:
                    own.append(r)
            elif cohort and cohort_of.get(rteam) == cohort:
                others.append(r)

        def check(state: ClusterState, ledger: Any) -> Placement | None:
            if not ledger.fits(team, pool, need):
                return None
            if req.gpu_mem_mib is None and state.free_gpus(pool) < need:
                return None
            if not may_fit(state, req, n):
                return None  # exactly when `place` would fail (whole GPUs), found cheaply
            return place(state, req, n)[0]

        def accept(r: RunningJob, ledger: Any) -> bool:
            return r.req.team == team or bool(ledger.borrowed(r.req.team, pool) > 0)

        return outlook.claim(req, others + own, check, accept)
