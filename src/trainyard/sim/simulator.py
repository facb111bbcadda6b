"""Discrete-event simulator: replays a workload through a policy, the very engine the cluster runs.

    simulate(workload, policy, params=SimParams(), progress=None) -> SimResult

The simulator owns time and the facts; the policy owns every decision. Events are job arrivals,
completions, the end of a preempted job's grace (it leaves and is requeued), node failures and
repairs. After the events of one instant are applied, the policy runs one cycle if anything changed
(and, while jobs wait, every `tick_s` so that time-driven rules such as aging, min run time and
reclaim deadlines act). Its decisions are applied as the control loop would: starts allocate the
placement, preemptions send a notice.

Work model (the same for every policy):
- A job's true run time is `duration_s` at its largest size; at g of its G GPUs it runs g/G as
  fast (elastic jobs). Work is counted in seconds-at-full-size.
- A restarted attempt first spends `restart_overhead_s` loading its checkpoint (no progress), or
  the workload's own figure where its trace world has one (`Workload.restart_overhead_s`).
- Each job checkpoints every `checkpoint_interval_s` of progress-making wall time. A node failure
  throws away the work since its last checkpoint; that, and every restart overhead, is counted as
  lost GPU time.
- A preempted job keeps its GPUs for min(class grace period, `stop_delay_s`) after the notice, then
  leaves and is requeued. Checkpoint on notice (issue 20 part 4), as trainyard's runtime does it:
  a job whose class honours the notice (`JobClass.checkpoint_on_notice`) and whose stop delay
  leaves time for the save (`notice_save_s`) saves its progress as of the notice; it loses only
  the save time and, when it restarts, the restart overhead. A job that ignores the notice (or
  cannot save in time) loses the work since its last periodic checkpoint, as on a failure. Every
  policy that preempts is charged by this same model. Each record also keeps what its
  preemptions would have cost had every notice been ignored (`lost_if_ignored_gpu_s`), so both
  prices are reported for the same decisions.
- Node failures (optional, exponential with mean `node_mtbf_s` per node) kill every job on the
  node at once; the node comes back after `node_repair_s`.
Max run time is not enforced in the simulator (traces record what did run). A job the policy
will never start (pending on an idle cluster with nothing more to come) is left unfinished and
counted as such (`completed` < `jobs` in the metrics).
"""

from __future__ import annotations

import heapq
import math
import random
import time as _time
from dataclasses import dataclass, replace
from typing import Callable

from trainyard.sched.cluster import ClusterState
from trainyard.sched.policy import Policy
from trainyard.sched.types import CycleResult, JobId, PendingJob, RunningJob, Snapshot
from trainyard.sim.estimates import START_ESTIMATORS, LearnedRuntimes
from trainyard.sim.result import JobRecord, SimResult
from trainyard.sim.workload import SimJob, Workload


@dataclass(frozen=True, slots=True)
class SimParams:
    restart_overhead_s: float = 60.0  # a restarted attempt spends this long loading before progress
    stop_delay_s: float = 30.0  # a preempted job holds its GPUs this long (capped by the class grace)
    notice_save_s: float = 30.0  # the save on a notice; honoured if it fits in the stop delay
    default_checkpoint_interval_s: float = 1800.0  # for jobs that do not say
    node_mtbf_s: float | None = None  # mean time between failures of one node; None: no failures
    node_repair_s: float = 3600.0
    usage_half_life_s: float = 7 * 86400.0  # fair-share decay (Slurm's PriorityDecayHalfLife)
    tick_s: float = 30.0  # cycle at least this often while jobs wait
    horizon_s: float = 400 * 86400.0  # give up this long after the last arrival (failed nodes)
    seed: int = 0
    # None: no start estimates (the engine's step 7 off, as before); "limit" or "learned": every
    # cycle explains, and each job's first estimated start is recorded (sim/estimates.py)
    start_estimator: str | None = None


# Event kinds, in the order they are applied within one instant: leaving before arriving, so the
# freed GPUs are visible to the cycle that follows.
_FINISH, _STOP, _FAIL, _REPAIR, _ARRIVE, _TICK = range(6)


# Told of every attempt as it ends: (job, start, end). For reports that need each run, not only
# the per-job totals of `JobRecord` (bench/vs_slurm_frontier.py counts quota gaps from them).
AttemptObserver = Callable[[JobId, float, float], None]


class _Sim:
    def __init__(self, wl: Workload, policy: Policy, params: SimParams, on_attempt: AttemptObserver | None = None):
        self.wl, self.policy, self.p = wl, policy, params
        self.on_attempt = on_attempt
        self.cluster = ClusterState(wl.nodes)
        self.jobs: dict[JobId, SimJob] = {}
        self.records: dict[JobId, JobRecord] = {}
        self.pending: dict[JobId, PendingJob] = {}
        self.stopped_for: dict[JobId, JobId] = {}  # victim -> its preemptor (Snapshot.stopped_for)
        self.running: dict[JobId, RunningJob] = {}
        self.end_token: dict[JobId, int] = {}  # job -> attempt whose completion event is live
        self.notice_at: dict[JobId, float] = {}  # job -> when its preemption notice went out
        self.restart_s = wl.restart_overhead_s if wl.restart_overhead_s is not None else params.restart_overhead_s
        # (time, kind, sequence, job id or node index, token); the sequence is unique, so the
        # tuples never compare beyond it.
        self.events: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.now = 0.0
        self.dirty = False
        self.tick_due: float | None = None
        # Accounting.
        self.allocated = 0
        self.total_gpus = wl.total_gpus
        self.m_from = wl.measure_from
        self.m_to = wl.measure_to if wl.measure_to is not None else math.inf
        self.busy_in_window = 0.0
        self.lost_in_window = 0.0
        self.last_t = 0.0
        self.util_series: list[tuple[float, int]] = [(0.0, 0)]
        self.team_alloc: dict[str, int] = {t: 0 for t in wl.teams}
        self.class_alloc: dict[tuple[str, str, str], int] = {}  # (team, pool, class) -> GPUs
        self.team_series: dict[str, list[tuple[float, int]]] = {t: [(0.0, 0)] for t in wl.teams}
        self.usage: dict[str, float] = {t: 0.0 for t in wl.teams}
        self.usage_t = 0.0
        # Quota-violation tracking: per team, pending sizes (size -> count) and episode start.
        self.pend_sizes: dict[str, dict[int, int]] = {t: {} for t in wl.teams}
        self.below_since: dict[str, float | None] = {t: None for t in wl.teams}
        self.violations = 0
        self.violation_s = 0.0
        # GPUs a team is owed now (0 outside an episode), since when, and GPU-s owed in its episode.
        self.owed_gpus: dict[str, int] = {t: 0 for t in wl.teams}
        self.owed_t: dict[str, float] = {t: 0.0 for t in wl.teams}
        self.owed_acc: dict[str, float] = {t: 0.0 for t in wl.teams}
        self.violation_gpu_s = 0.0
        pre = [c.grace_s + c.min_run_s for c in wl.classes.values() if c.preemptible]
        self.violation_limit = max(pre) if pre else 0.0
        self.cycles = 0
        self.done = 0
        self.arrivals_left = len(wl.jobs)
        self.rng = random.Random(params.seed)
        if params.start_estimator not in (None, *START_ESTIMATORS):
            raise ValueError(f"unknown start estimator {params.start_estimator!r}; choose one of "
                             f"{', '.join(START_ESTIMATORS)}")
        self.learned = LearnedRuntimes() if params.start_estimator == "learned" else None

    # -- events ---------------------------------------------------------------------------------

    def push(self, t: float, kind: int, job: int = 0, token: int = 0) -> None:
        """Schedule an event; `job` is the job's id, or the node's index for _FAIL and _REPAIR."""
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, job, token))

    def run(self, progress: Callable[[float], None] | None) -> SimResult:
        wall0 = _time.perf_counter()
        for sj in self.wl.jobs:
            self.jobs[sj.req.id] = sj
            self.push(sj.req.submit_time, _ARRIVE, sj.req.id)
        if self.p.node_mtbf_s:
            for i in range(len(self.wl.nodes)):
                self.push(self.rng.expovariate(1.0 / self.p.node_mtbf_s), _FAIL, i)
        total = len(self.wl.jobs)
        next_report = 0
        while self.events:
            t = self.events[0][0]
            self.advance(t)
            while self.events and self.events[0][0] == t:
                _, kind, _, job, token = heapq.heappop(self.events)
                self.apply(kind, job, token)
            if self.done == total and not self.pending:
                break
            if self.dirty or (self.tick_due is not None and t >= self.tick_due):
                self.cycle()
                if self.stuck():
                    break
            if self.pending and (self.tick_due is None or self.tick_due <= t):
                self.tick_due = t + self.p.tick_s
                self.push(self.tick_due, _TICK)
            if progress and self.done >= next_report:
                progress(self.done / max(1, total))
                next_report = self.done + max(1, total // 200)
        self.close_violations(self.now)
        if progress:
            progress(1.0)
        return SimResult(
            policy=self.policy.name, total_gpus=self.total_gpus, measure_from=self.m_from,
            measure_to=min(self.m_to, self.last_submit()), jobs=list(self.records.values()),
            util_series=self.util_series, team_series=self.team_series,
            nominal={t: team.quota("default").nominal for t, team in self.wl.teams.items()},
            busy_gpu_s_in_window=self.busy_in_window, lost_gpu_s_in_window=self.lost_in_window,
            quota_violations=self.violations, quota_violation_s=self.violation_s,
            quota_violation_gpu_s=self.violation_gpu_s, cycles=self.cycles,
            wall_s=_time.perf_counter() - wall0, end_time=self.now, start_estimator=self.p.start_estimator)

    def stuck(self) -> bool:
        """Jobs wait on an idle, healthy cluster with nothing more to come: the policy will never
        start them (say, a job larger than its team's partition). They stay unfinished."""
        if not self.pending or self.running or self.arrivals_left:
            return False
        return all(n.healthy for n in self.cluster.nodes) or self.now > self.last_submit() + self.p.horizon_s

    def last_submit(self) -> float:
        return self.wl.jobs[-1].req.submit_time if self.wl.jobs else 0.0

    def advance(self, t: float) -> None:
        """Move the clock: integrate allocated GPUs over the measurement window."""
        lo, hi = max(self.now, self.m_from), min(t, self.m_to)
        if hi > lo:
            self.busy_in_window += self.allocated * (hi - lo)
        self.now = t

    def apply(self, kind: int, job: int, token: int) -> None:
        if kind == _ARRIVE:
            self.arrivals_left -= 1
            sj = self.jobs[job]
            r = sj.req
            self.records[job] = JobRecord(job, r.team, r.job_class, r.max_gpus, r.submit_time, sj.duration_s,
                                          measured=self.wl.measured(r.submit_time))
            if self.learned is not None:
                r = replace(r, expected_runtime_s=self.learned.expected(r))
                self.jobs[job] = replace(sj, req=r)
            self.enqueue(PendingJob(r, 0, self.now))
        elif kind == _FINISH:
            if self.end_token.get(job) == token and job in self.running:
                self.finish(job)
        elif kind == _STOP:
            if job in self.running and self.running[job].attempt == token:
                self.interrupt(job, preempted=True)
        elif kind == _FAIL:
            self.node_fail(job)
        elif kind == _REPAIR:
            i = job
            self.cluster.set_health(i, True)
            self.dirty = True
            self.push(self.now + self.rng.expovariate(1.0 / self.p.node_mtbf_s), _FAIL, job)  # type: ignore[operator]
        # _TICK: nothing to apply; the loop runs a cycle when it is due.

    # -- queue and allocation bookkeeping -------------------------------------------------------

    def enqueue(self, pj: PendingJob) -> None:
        self.pending[pj.req.id] = pj
        sizes = self.pend_sizes.setdefault(pj.req.team, {})
        sizes[pj.req.min_gpus] = sizes.get(pj.req.min_gpus, 0) + 1
        self.dirty = True

    def dequeue(self, job: JobId) -> PendingJob:
        pj = self.pending.pop(job)
        sizes = self.pend_sizes[pj.req.team]
        n = sizes[pj.req.min_gpus] - 1
        if n:
            sizes[pj.req.min_gpus] = n
        else:
            del sizes[pj.req.min_gpus]
        return pj

    def change_alloc(self, team: str, job_class: str, delta: int) -> None:
        self.decay_usage()
        self.allocated += delta
        self.team_alloc[team] = self.team_alloc.get(team, 0) + delta
        k = (team, "default", job_class)
        self.class_alloc[k] = self.class_alloc.get(k, 0) + delta
        self.util_series.append((self.now, self.allocated))
        self.team_series.setdefault(team, [(0.0, 0)]).append((self.now, self.team_alloc[team]))
        self.dirty = True

    def decay_usage(self) -> None:
        """Advance every team's decayed usage to now (allocation is constant since usage_t)."""
        dt = self.now - self.usage_t
        if dt <= 0:
            return
        h = self.p.usage_half_life_s
        d = 0.5 ** (dt / h)
        gain = (1 - d) * h / math.log(2)
        for t in self.usage:
            self.usage[t] = self.usage[t] * d + self.team_alloc.get(t, 0) * gain
        self.usage_t = self.now

    def lose(self, rec: JobRecord, gpu_s: float) -> None:
        rec.lost_gpu_s += gpu_s
        if self.m_from <= self.now < self.m_to:
            self.lost_in_window += gpu_s

    # -- decisions ------------------------------------------------------------------------------

    def cycle(self) -> None:
        self.dirty = False
        self.check_violations()
        if not self.pending:
            return
        self.decay_usage()
        snap = Snapshot(now=self.now, cluster=self.cluster, teams=self.wl.teams, classes=self.wl.classes,
                        running=list(self.running.values()), pending=list(self.pending.values()),
                        usage=self.usage, explain=self.p.start_estimator is not None,
                        allocated={(t, "default"): g for t, g in self.team_alloc.items()},
                        allocated_by_class={k: g for k, g in self.class_alloc.items() if g},
                        stopped_for=self.victims_in_play())
        res: CycleResult = self.policy.cycle(snap)
        self.cycles += 1
        for jid, info in res.pending.items():  # empty unless a start estimator is on
            rec = self.records[jid]
            if rec.first_est is None and rec.first_start is None and info.est_start is not None:
                rec.first_est = info.est_start
        for pre in res.preemptions:
            self.preempt(pre.job_id)
            self.stopped_for[pre.job_id] = pre.for_job
        for st in res.starts:
            self.start(st.job_id, st.placement)
        if res.starts or res.preemptions:
            self.check_violations()

    def victims_in_play(self) -> dict[JobId, JobId]:
        """As the control plane's: victims (running or waiting) whose preemptor still waits."""
        if self.stopped_for:
            self.stopped_for = {v: b for v, b in self.stopped_for.items()
                                if b in self.pending and (v in self.pending or v in self.running)}
        return self.stopped_for

    def start(self, job: JobId, placement) -> None:
        if job not in self.pending:
            raise RuntimeError(f"policy {self.policy.name} started {job}, which is not pending")
        pj = self.dequeue(job)
        if pj.held:
            raise RuntimeError(f"policy {self.policy.name} started held job {job}")
        self.cluster.allocate(placement)  # raises on over-allocation
        r = pj.req
        rec = self.records[job]
        rec.wait_s += self.now - pj.queued_since
        if rec.first_start is None:
            rec.first_start = self.now
        interval = r.checkpoint_interval_s or self.p.default_checkpoint_interval_s
        if r.checkpoint_interval_s is None:
            r = replace(r, checkpoint_interval_s=interval)
        overhead = self.restart_s if pj.attempt > 0 else 0.0
        rate = placement.gpus / r.max_gpus
        sj = self.jobs[job]
        remaining = max(0.0, sj.duration_s - pj.progress_s)
        end = self.now + overhead + remaining / rate
        self.running[job] = RunningJob(r, placement, self.now, self.now + overhead, pj.attempt, pj.progress_s,
                                       pj.attained_gpu_s)
        self.end_token[job] = pj.attempt
        self.push(end, _FINISH, job, pj.attempt)
        self.change_alloc(r.team, r.job_class, placement.gpus)

    def preempt(self, job: JobId) -> None:
        rj = self.running.get(job)
        if rj is None or rj.preempting:
            raise RuntimeError(f"policy {self.policy.name} preempted {job}, which is not running")
        cls = self.wl.classes[rj.req.job_class]
        if not cls.preemptible:
            raise RuntimeError(f"policy {self.policy.name} preempted non-preemptible job {job}")
        self.running[job] = replace(rj, preempting=True)
        self.notice_at[job] = self.now
        self.records[job].preemptions += 1
        self.push(self.now + min(cls.grace_s, self.p.stop_delay_s), _STOP, job, rj.attempt)

    def finish(self, job: JobId) -> None:
        rj = self.running.pop(job)
        rec = self.records[job]
        overhead = rj.last_checkpoint - rj.start_time
        if overhead:
            self.lose(rec, overhead * rj.gpus)
            rec.lost_if_ignored_gpu_s += overhead * rj.gpus
        self.cluster.release(rj.placement)
        rec.end = self.now
        self.done += 1
        if self.learned is not None:
            self.learned.observe(rj.req, self.jobs[job].duration_s)
        if self.on_attempt is not None:
            self.on_attempt(job, rj.start_time, self.now)
        self.change_alloc(rj.req.team, rj.req.job_class, -rj.gpus)

    def interrupt(self, job: JobId, preempted: bool) -> None:
        """Stop a running attempt (preemption or node failure) and requeue it from its checkpoint."""
        rj = self.running.pop(job)
        rec = self.records[job]
        now = self.now
        rate = rj.gpus / rj.req.max_gpus
        lc, start, g = rj.last_checkpoint, rj.start_time, rj.gpus
        # Without a save on the notice: back to the newest periodic checkpoint; lost is the work
        # since then, plus the restart's loading time if it got no further.
        saved = rj.saved_at(now)
        ignored = rj.lost_if_stopped(now) + max(0.0, min(saved, lc) - start) * g
        notice = self.notice_at.pop(job, None)
        if preempted and notice is not None and self.honours_notice(rj):
            # Saved as of the notice: lost is the time since (the save) and the loading time.
            progress = rj.progress_s + max(0.0, notice - lc) * rate
            self.lose(rec, (now - notice) * g + max(0.0, min(notice, lc) - start) * g)
        else:
            progress = rj.progress_s + max(0.0, saved - lc) * rate
            self.lose(rec, ignored)
        rec.lost_if_ignored_gpu_s += ignored
        if not preempted:
            rec.failures += 1
        self.cluster.release(rj.placement)
        self.end_token.pop(job, None)
        if self.on_attempt is not None:
            self.on_attempt(job, rj.start_time, now)
        attained = rj.attained_gpu_s + (now - rj.start_time) * rj.gpus
        self.change_alloc(rj.req.team, rj.req.job_class, -rj.gpus)
        self.enqueue(PendingJob(rj.req, rj.attempt + 1, now, progress, attained))

    def honours_notice(self, rj: RunningJob) -> bool:
        """Whether a preempted job saves on its notice: its class says it does, and the time it
        keeps its GPUs after the notice covers the save."""
        cls = self.wl.classes[rj.req.job_class]
        return cls.checkpoint_on_notice and self.p.notice_save_s <= min(cls.grace_s, self.p.stop_delay_s)

    def node_fail(self, i: int) -> None:
        if not self.cluster.nodes[i].healthy:
            return
        victims = sorted(j for j, rj in self.running.items() if i in rj.placement.node_indices)
        for j in victims:
            self.interrupt(j, preempted=False)
        self.cluster.set_health(i, False)
        self.push(self.now + self.p.node_repair_s, _REPAIR, i)
        self.dirty = True

    # -- quota violations -----------------------------------------------------------------------

    def check_violations(self) -> None:
        """A team is 'owed' while it has a pending job that fits in its unused nominal quota and
        another team of its cohort holds more than its own nominal quota: GPUs it is owed are in
        a borrower's hands. Free GPUs a team cannot use (its job does not fit their shape) are no
        other team's doing, and a team that no one can borrow from is never owed."""
        teams = self.wl.teams
        lent: dict[str, int] = {}  # cohort -> GPUs its members hold beyond their nominal quotas
        for name, g in self.team_alloc.items():
            holder = teams.get(name)
            if holder is not None and holder.cohort and g > holder.quota("default").nominal:
                lent[holder.cohort] = lent.get(holder.cohort, 0) + g - holder.quota("default").nominal
        for team, sizes in self.pend_sizes.items():
            t = teams.get(team)
            headroom = (t.quota("default").nominal if t else 0) - self.team_alloc.get(team, 0)
            cohort = t.cohort if t is not None else None
            # (A team with headroom does not borrow itself: the borrower is another member.)
            owed = bool(sizes) and headroom > 0 and min(sizes) <= headroom and cohort in lent
            since = self.below_since.get(team)
            self._owe(team, min(headroom, lent[cohort]) if owed and cohort is not None else 0)
            if owed and since is None:
                self.below_since[team] = self.now
                self.owed_acc[team] = 0.0
            elif not owed and since is not None:
                self.end_episode(team, since, self.now)

    def _owe(self, team: str, gpus: int) -> None:
        """The GPUs `team` is owed from now on; what it was owed until now is added up (GPU-s)."""
        self.owed_acc[team] = self.owed_acc.get(team, 0.0) + self.owed_gpus.get(team, 0) * (self.now - self.owed_t.get(team, self.now))
        self.owed_gpus[team], self.owed_t[team] = gpus, self.now

    def end_episode(self, team: str, since: float, now: float) -> None:
        self.below_since[team] = None
        length = now - since
        if length > self.violation_limit and self.m_from <= since < self.m_to:
            self.violations += 1
            self.violation_s += length
            self.violation_gpu_s += self.owed_acc.get(team, 0.0)
        self.owed_acc[team] = 0.0

    def close_violations(self, now: float) -> None:
        for team, since in list(self.below_since.items()):
            if since is not None:
                self._owe(team, 0)  # (now is the simulation's end: self.now)
                self.end_episode(team, since, now)


def simulate(workload: Workload, policy: Policy, params: SimParams = SimParams(),
             progress: Callable[[float], None] | None = None, on_attempt: AttemptObserver | None = None) -> SimResult:
    """Replay `workload` through `policy` and return what happened (see `sim.result.metrics`);
    `on_attempt(job, start, end)` hears of every attempt as it ends (finished or stopped)."""
    return _Sim(workload, policy, params, on_attempt).run(progress)
