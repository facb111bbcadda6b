"""Slurm: multifactor priority, EASY backfill and QOS preemption with requeue.

What it models (knob names from slurm.conf):
- `PriorityType=priority/multifactor` with three factors, each in [0, 1]:
  age = min(1, time in queue / `PriorityMaxAge` (7 days)), where the time in queue restarts at a
  requeue (`queued_since`), as Slurm resets a requeued job's eligible time;
  fair share = 2^(-U/S) (the classic formula, `PriorityFlags` without FAIR_TREE), U = the team's
  share of all decayed usage (`snap.usage`, decayed by the caller as `PriorityDecayHalfLife`
  would), S = the team's share of all nominal quota (its "shares"; a team with no quota gets 0);
  QOS = the job class's priority scaled to [0, 1] over the classes defined.
  Weights `PriorityWeightAge=1000`, `PriorityWeightFairshare=10000`, `PriorityWeightQOS=10000`.
  Ties: submit time, then id.
- `SchedulerType=sched/backfill`, reduced to EASY backfill: per pool, the highest-priority job
  that cannot start gets a reservation at its shadow time, computed from running jobs' expected
  ends (start + estimate - checkpointed progress; no estimate: the class `max_run_s` as a time
  limit; neither: never ends). A lower-priority job may start only if it fits now and either ends
  (now + its estimate) before the shadow time, or only uses GPUs the reservation does not need at
  the shadow time (checked per GPU on the reserved nodes). A `Reservation` decision is emitted
  when the shadow time is finite.
- `PreemptType=preempt/qos`, `PreemptMode=REQUEUE`: a blocked job whose class has a higher
  priority than some running job's class preempts preemptible jobs of strictly lower class
  priority (past their `min_run_s`): candidates are swept youngest (most recently started)
  first, counting the GPUs each would free on its nodes, until as many nodes as the job needs
  have room; only the victims on those nodes are preempted. The preemptor starts in a later
  cycle, once the victims have left; while they leave it waits for their GPUs (its claim is
  held back from backfill) instead of preempting more.

What it leaves out: Slurm's backfill plans reservations for many jobs (`bf_max_job_test`,
`bf_window`, `bf_resolution`); here only one per pool (EASY). No association limits (`GrpTRES`,
`MaxTRESPerUser`): quota enters only through fair share. No Fair Tree, no `PriorityWeightJobSize`
or partition factors, no `PreemptExemptTime` beyond the class min run time, no `GraceTime`
(the simulator's stop delay plays that role). Estimates are trusted but not enforced as time
limits, so a job that overruns its estimate can delay a reservation. A reservation for a shared
(`gpu_mem_mib`) request holds memory, not whole GPUs. One preemption search per (pool, class priority,
shape) per cycle: after one fails, equal jobs are not searched again in that cycle (a speed
shortcut in the spirit of Slurm's `sched_max_job_start`/`bf_max_job_test` limits).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from trainyard.sched.baselines._common import (
    INF,
    STOP_DELAY_S,
    Classes,
    Fitter,
    Outlook,
    fit_min,
    remaining_s,
    shape_gpus,
    shapes,
)
from trainyard.sched.cluster import ClusterState, Placement
from trainyard.sched.policy import gc_paused, register
from trainyard.sched.types import (
    CycleResult,
    JobId,
    JobRequest,
    PendingInfo,
    PendingJob,
    Preempt,
    PreemptionKind,
    Reason,
    Reservation,
    RunningJob,
    Snapshot,
    Start,
)

MAX_AGE_S = 7 * 24 * 3600.0
_TIME_ID = itemgetter(0, 1)


@dataclass(slots=True)
class _Held:
    """One pool's backfill reservation."""

    job_id: JobId
    shadow: float
    nodes: tuple[int, ...]
    masked: Fitter  # the live state minus what the reservation needs at the shadow time


@register("slurm")
class Slurm:
    name = "slurm"

    def __init__(
        self,
        w_age: float = 1000.0,
        w_fairshare: float = 10000.0,
        w_qos: float = 10000.0,
        max_age_s: float = MAX_AGE_S,
    ):
        self.w_age = w_age
        self.w_fairshare = w_fairshare
        self.w_qos = w_qos
        self.max_age_s = max_age_s

    # -- step 1: priorities ----------------------------------------------------------------------

    def fairshare(self, snap: Snapshot) -> dict[str, float]:
        shares = {name: sum(q.nominal for q in t.quotas.values()) for name, t in snap.teams.items()}
        total_shares = sum(shares.values())
        total_usage = sum(max(0.0, u) for u in snap.usage.values())
        out: dict[str, float] = {}
        for name in sorted(shares):
            s = shares[name] / total_shares if total_shares > 0 else 1.0 / len(shares)
            u = max(0.0, snap.usage.get(name, 0.0)) / total_usage if total_usage > 0 else 0.0
            out[name] = 2.0 ** (-u / s) if s > 0 else 0.0
        return out

    def priorities(self, snap: Snapshot, classes: Classes | None = None) -> dict[JobId, float]:
        fs = self.fairshare(snap)
        cls_prio = [c.priority for c in snap.classes.values()]
        lo, hi = (min(cls_prio), max(cls_prio)) if cls_prio else (0, 0)
        prio = (classes if classes is not None else Classes(snap)).prio
        qos_of: dict[str, float] = {}  # per class: w_qos * qos
        fs_of: dict[str, float] = {}  # per team: w_fairshare * fair share
        now, w_age, max_age = snap.now, self.w_age, self.max_age_s
        out = {}
        for job in snap.pending:
            req = job.req
            age = min(1.0, max(0.0, now - job.queued_since) / max_age)
            q = qos_of.get(req.job_class)
            if q is None:
                p = prio[req.job_class]
                q = qos_of[req.job_class] = self.w_qos * ((p - lo) / (hi - lo) if hi > lo else 0.0)
            f = fs_of.get(req.team)
            if f is None:
                f = fs_of[req.team] = self.w_fairshare * fs.get(req.team, 0.0)
            out[req.id] = w_age * age + f + q
        return out

    # -- the cycle -------------------------------------------------------------------------------

    @gc_paused
    def cycle(self, snap: Snapshot) -> CycleResult:
        res = CycleResult()
        now, explain = snap.now, snap.explain
        classes = Classes(snap)
        prio = self.priorities(snap, classes)
        order = sorted(snap.pending, key=lambda j: (-prio[j.req.id], j.req.submit_time, j.req.id))

        state = snap.cluster.copy()
        fitter = Fitter(state)
        outlook = Outlook(snap, with_quota=False)
        # Step 2: who could be preempted, youngest first, per pool.
        victims: dict[str, list[RunningJob]] = defaultdict(list)
        lowest_victim: dict[str, int] = {}
        for r in sorted(filter(classes.may_preempt, snap.running), key=lambda r: (-r.start_time, r.req.id)):
            pool = r.req.pool
            victims[pool].append(r)
            cp = classes[r.req.job_class].priority
            if cp < lowest_victim.get(pool, cp + 1):
                lowest_victim[pool] = cp
        ends: dict[str, list[tuple[float, JobId, Placement]]] = defaultdict(list)  # starts and claims
        held: dict[str, _Held] = {}
        no_preempt: set[tuple[Any, ...]] = set()
        cand_lists: dict[tuple[str, int], list[RunningJob]] = {}

        def start(job: PendingJob, p: Placement, dur: float) -> None:
            fitter.take(p)
            rsv = held.get(job.req.pool)
            if rsv is not None:
                rsv.masked.clip_to(state, p)
            outlook.note_start(job.req, p)
            ends[job.req.pool].append((now + dur, job.req.id, p))
            res.starts.append(Start(job.req.id, p))

        # Step 3: priority order, EASY backfill behind the first blocked job of each pool.
        for job in order:
            req = job.req
            if job.held:
                if explain:
                    res.pending[req.id] = PendingInfo(Reason.HELD, None)
                continue
            cls = classes[req.job_class]
            dur = remaining_s(req, job.progress_s, cls)
            rsv = held.get(req.pool)
            if req.gpu_mem_mib is None and state.free_gpus(req.pool) < shape_gpus(req, shapes(req)[-1]):
                p, why = None, Reason.CAPACITY
            elif rsv is None or now + dur <= rsv.shadow:
                p, why = fitter.fit(req)
            else:
                p, why = rsv.masked.fit(req)
                if p is None and fitter.fit(req)[0] is not None:
                    # It fits now but would delay the reservation: wait, and preempt nobody.
                    if explain:
                        res.pending[req.id] = PendingInfo(Reason.RESERVATION, None)
                    continue
            if p is not None:
                start(job, p, dur)
                continue

            # Step 4: QOS preemption for a blocked job of a class above some running job's.
            if cls.priority > lowest_victim.get(req.pool, cls.priority):
                key = (req.pool, cls.priority, req.gpus_per_node, shapes(req)[-1], req.gpus, req.gpu_mem_mib,
                       req.where)
                got = None
                if key not in no_preempt:
                    ck = (req.pool, cls.priority)
                    if ck not in cand_lists:
                        cand_lists[ck] = [
                            r for r in victims[req.pool] if classes[r.req.job_class].priority < cls.priority
                        ]
                    got = outlook.claim_on_nodes(req, cand_lists[ck])
                    if got is None:
                        no_preempt.add(key)
                if got is not None:
                    chosen, p = got
                    outlook.commit(req, chosen, p, state)
                    if rsv is not None:
                        rsv.masked.clip_to(state, p)
                    ends[req.pool].append((now + STOP_DELAY_S + dur, req.id, p))
                    for v in chosen:
                        res.preemptions.append(Preempt(v.req.id, PreemptionKind.PRIORITY, req.id))
                    if explain:
                        res.pending[req.id] = PendingInfo(Reason.PREEMPTING, now + STOP_DELAY_S)
                    continue

            # Step 5: the first blocked job of a pool gets the reservation.
            est = None
            if rsv is None:
                # A job that cannot fit even on an idle pool gets none; the next blocked job does.
                rsv = self._reserve(snap, req, state, outlook, ends[req.pool], classes)
                if rsv is not None:
                    held[req.pool] = rsv
                    if rsv.shadow < INF:
                        est = rsv.shadow
                        res.reservations.append(Reservation(req.id, rsv.shadow, rsv.nodes))
            if explain:
                res.pending[req.id] = PendingInfo(why, est)
        return res

    def _reserve(
        self,
        snap: Snapshot,
        req: JobRequest,
        state: ClusterState,
        outlook: Outlook,
        started: list[tuple[float, JobId, Placement]],
        classes: Classes | None = None,
    ) -> _Held | None:
        """The shadow time and reserved GPUs of `req`; None if it cannot fit even on an idle pool."""
        now = snap.now
        fut = outlook.state.copy()  # jobs under notice already gone; claims and starts in
        classes = classes if classes is not None else Classes(snap)
        pool, gone = req.pool, outlook.victims
        events = []
        for r in snap.running:
            rq = r.req
            if rq.pool == pool and not r.preempting and rq.id not in gone:
                # expected_end(snap, r), with the class looked up in the cycle's cache
                end = r.start_time + remaining_s(rq, r.progress_s, classes[rq.job_class])
                events.append((end if end > now else now, rq.id, r.placement))
        events.extend(started)
        events.sort(key=_TIME_ID)
        shadow = now + STOP_DELAY_S
        p = fit_min(fut, req)
        k = 0
        while p is None and k < len(events):
            shadow = events[k][0]
            while k < len(events) and events[k][0] == shadow:
                fut.release(events[k][2])
                k += 1
            p = fit_min(fut, req)
        if p is None:
            return None
        # Mask, GPU by GPU, what a job running past the shadow time must leave free now.
        masked = state.copy()
        nodes, mems = [], []
        for (i, gis), mem in zip(p.nodes, p.mem_mib):
            for g in gis:
                amt = masked.free_mib[i][g] - max(0, fut.free_mib[i][g] - mem)
                if amt > 0:
                    nodes.append((i, (g,)))
                    mems.append(amt)
        if nodes:
            masked.allocate(Placement(nodes=tuple(nodes), mem_mib=tuple(mems)))
        return _Held(req.id, shadow, p.node_indices, Fitter(masked))
