"""The control loop: reconcile the backend's facts with the store, stop what must stop, schedule.

One pass (`step`) does, in order:
1. **reconcile**: every attempt the backend reports is matched with the store. Attempts the store
   does not consider running are orphans: killed and released (never an orphan process). Active
   jobs whose attempt the backend does not know never launched (the plane died between the
   commit and the launch) and go back to the queue. Finished attempts get their outcome
   (`outcome.classify`), a new attempt row state, an event, and `release`.
2. **stops**: preemption and requeue send SIGUSR1 (the checkpoint notice), then SIGTERM after the
   class's grace period, then SIGKILL after `kill_wait_s`; cancel, time limit and a failed rank
   go straight to SIGTERM then SIGKILL (Slurm's KillWait). The stage reached is stored, so a
   restarted loop carries on where the last one stopped.
3. **dependencies**: jobs waiting on a `--dependency` that now holds join the queue; those whose
   dependency never can are cancelled (`services.dependencies`).
4. **schedule**: a `Snapshot` from the store, `policy.cycle()`, then its decisions applied under
   the write lock, each re-checked against the store (a job cancelled meanwhile is not started).
   A start is committed *before* the backend launches it, so a crash can leave a committed start
   without processes (requeued at step 1) but never processes without a row. Held jobs and jobs
   still waiting on a dependency are not in the snapshot.

It runs on its own thread: `wake()` (after any change through the API) or a short tick.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sqlalchemy import and_, bindparam, or_, select, update

from trainyard.backends.base import AttemptState, Backend, BackendError, LaunchSpec, RankLaunch
from trainyard.contracts import newest_checkpoint
from trainyard.control.health import BEFORE_WORK, CRITICAL, OK, WARN, CheckResult, HealthChecker, Remediator, worst
from trainyard.control.lost_work import lost_work_s
from trainyard.control.outcome import classify, first_failure
from trainyard.control.retry import backoff_s, should_retry
from trainyard.control.snapshot import NodeIndex, PendingCache, build_snapshot, decayed_usage, USAGE_HALF_LIFE_S
from trainyard.spec import HealthSpec
from trainyard.sched.policy import Policy
from trainyard.sched.types import Reason
from trainyard.services import arrays, auth
from trainyard.services.config import ConfigCache, ConfigVersion
from trainyard.services.events import record
from trainyard.services.jobs import ACTIVE_STATES, PENDING_STATES, job_dir, settle_dependencies
from trainyard.services.nodes import node_states
from trainyard.store.db import Store
from trainyard.store.models import AttemptRow, JobRow, NodeRow, TokenRow

log = logging.getLogger("trainyard.loop")

REASONS = {
    Reason.QUOTA: "Quota", Reason.CAPACITY: "Resources", Reason.TOPOLOGY: "Topology", Reason.MEMORY: "GpuMemory",
    Reason.RESERVATION: "Reservation", Reason.PRIORITY: "Priority", Reason.HELD: "JobHeldUser",
    Reason.PREEMPTING: "Preempting",
}
NOTICE, TERM, KILL = 1, 2, 3
HEALTH = "health"  # the actor of node-health events, and the mark of a node the loop took down itself
HEALTH_MARK = "(health)"  # ends the reason of a node the checks found failing
# What `snapshot.pending_of` and the reason bookkeeping read of a waiting job.
PENDING_COLUMNS = ("id", "team", "job_class", "pool", "submit_time", "gpus", "gpus_per_node", "nodes_min", "nodes_max",
                   "gpu_mem_mib", "time_limit_s", "checkpoint_interval_s", "attempt", "queued_since", "progress_s",
                   "attained_gpu_s", "held", "reason", "est_start", "avoid_nodes", "eligible_time", "array_job_id",
                   "array_task_id", "array_throttle")


@dataclass
class LoopParams:
    tick_s: float = 1.0
    kill_wait_s: float = 10.0  # SIGTERM → SIGKILL (Slurm's KillWait)
    min_interval_s: float = 0.05  # wakes closer together than this are merged
    retry_backoff_s: float = 10.0  # first automatic retry waits this long, then twice as long each time
    hung_after_s: float = 30.0  # a rank stopped (frozen) this long makes its job hung


@dataclass
class LoopStats:
    steps: int = 0
    last_step_ms: float = 0.0
    errors: int = 0
    last_error: str = ""
    started: list[str] = field(default_factory=list)


MAX_AVOIDED = 4  # suspect nodes remembered per job (the most recent)


def ranks_for(placement: list[dict], tasks_per_node: int | None) -> list[RankLaunch]:
    """One rank per GPU (or `tasks_per_node` ranks sharing a node's GPUs evenly), in node order."""
    out: list[RankLaunch] = []
    for part in placement:
        gpus = list(part["gpus"])
        k = tasks_per_node or len(gpus)
        per = max(1, len(gpus) // k)
        for t in range(k):
            out.append(RankLaunch(len(out), part["node"], tuple(gpus[t * per:(t + 1) * per])))
    return out


class ControlLoop:
    def __init__(self, store: Store, backend: Backend, data_dir: Path, configs: ConfigCache,
                 write_lock: threading.RLock, *, policy: Policy | None = None, params: LoopParams | None = None,
                 api_url: str | None = None, clock: Callable[[], float] = time.time):
        self.store, self.backend, self.data_dir, self.configs = store, backend, Path(data_dir), configs
        self.lock, self.policy, self.p = write_lock, policy, params or LoopParams()  # None: the configuration's
        self.api_url, self.clock = api_url, clock
        self.stats = LoopStats()
        self._pending_cache = PendingCache(PENDING_COLUMNS)  # waiting jobs unchanged since the last pass are not rebuilt
        self._last_facts: list[AttemptState] = []
        self._stopped_since: dict[tuple[int, int], float] = {}
        self._stopped_seen: dict[tuple[int, int], set[int]] = {}  # ranks seen frozen, per attempt
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # a finished round wakes the loop: a node that just passed takes its work at once
        self.health = HealthChecker(self.data_dir, self._health_spec, self._node_names,
                                    on_round=lambda node, context: self.wake())
        self.remediator = Remediator(self.data_dir)
        self._health_seen: dict[tuple[str, str], str] = {}  # (node, check) → last status recorded

    def _health_spec(self) -> HealthSpec:
        with self.store.session() as s:
            return self.configs.current(s).spec.health

    def _node_names(self) -> list[str]:
        with self.store.session() as s:
            return [n.name for n in self.configs.current(s).nodes]

    # -- thread ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="trainyard-loop", daemon=True)
        self._thread.start()
        self.health.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self.health.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                self.step()
            except Exception as e:  # the loop must outlive any one bad pass; the next one retries
                self.stats.errors += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"
                log.exception("control loop pass failed")
            took = time.perf_counter() - t0
            self.stats.last_step_ms = took * 1000
            self._wake.wait(self.p.tick_s)
            self._wake.clear()
            # Wakes closer together than this are merged into one pass. A pass that took long (many
            # pending jobs) is followed by a pause twice as long, so that under a burst of API calls
            # the loop takes at most a third of the interpreter and requests stay fast.
            self._stop.wait(max(self.p.min_interval_s, 2 * took))

    # -- one pass --------------------------------------------------------------------------------

    def step(self) -> None:
        now = self.clock()
        self.reconcile(now)
        self.watch_nodes(now)
        self.drive_stops(now)
        self.settle_dependencies(now)
        self.schedule(self.clock())
        self.stats.steps += 1

    # 1. reconcile ----------------------------------------------------------------------------

    def reconcile(self, now: float) -> None:
        self._last_facts = self.backend.poll()
        facts = {(a.job_id, a.attempt): a for a in self._last_facts}
        with self.lock, self.store.session.begin() as s:
            active = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES)))}
            cfg = self.configs.current(s)
            to_release: list[tuple[int, int]] = []
            for (jid, att), st in facts.items():
                j = active.get(jid)
                if j is None or j.attempt != att:
                    self._kill_orphan(s, jid, att, st, now)
                    to_release.append((jid, att))
            for j in active.values():
                st = facts.get((j.id, j.attempt))
                if st is None:
                    self._never_launched(s, j, now)
                elif len(st.ranks) < len(ranks_for(j.placement or [], j.tasks_per_node)):
                    self._partial_launch(s, j, st, now)
                    to_release.append((j.id, j.attempt))
                elif st.done:
                    self._finish(s, j, st, now, cfg)
                    to_release.append((j.id, j.attempt))
                else:
                    self._note_checkpoint(j)
                    bad = first_failure([r for r in st.ranks if not r.running])
                    if bad is not None and j.stop_kind is None:  # one rank failed: stop the others
                        j.stop_kind, j.stop_since, j.stop_stage, j.state = "failed", now, 0, "COMPLETING"
                        j.reason = f"rank {bad.rank} failed; stopping the others"
                        record(s, "backend", "job.rank_failed", j.reason, job_id=j.id, at=now)
        if to_release:
            auth.forget_cached_tokens()  # the ended attempts' job tokens were revoked above
        for jid, att in to_release:
            self.backend.release(jid, att)

    def _kill_orphan(self, s, jid: int, att: int, st: AttemptState, now: float) -> None:  # noqa: ANN001
        if not st.done:
            self.backend.signal(jid, att, signal.SIGKILL)
            record(s, "scheduler", "job.orphan_killed",
                   f"attempt {att} had processes the store does not run; killed", job_id=jid, at=now)

    def _never_launched(self, s, j: JobRow, now: float) -> None:  # noqa: ANN001
        self._end_attempt(s, j, "REQUEUED", "never launched (control plane restarted before the launch)", None, None,
                          now)
        self._to_queue(j, now, "LaunchInterrupted")
        record(s, "scheduler", "job.requeued", f"attempt {j.attempt} never launched; back in the queue",
               job_id=j.id, at=now)

    def _partial_launch(self, s, j: JobRow, st: AttemptState, now: float) -> None:  # noqa: ANN001
        self.backend.signal(j.id, j.attempt, signal.SIGKILL)
        self._end_attempt(s, j, "REQUEUED", "launch interrupted with some ranks started; killed them", None, None,
                          now)
        self._to_queue(j, now, "LaunchInterrupted")
        record(s, "scheduler", "job.requeued", f"attempt {j.attempt} only partly launched; killed and requeued",
               job_id=j.id, at=now)

    def _finish(self, s, j: JobRow, st: AttemptState, now: float, cfg: ConfigVersion) -> None:  # noqa: ANN001
        checkpoint = self._note_checkpoint(j)
        attempt = self._attempt_row(s, j)
        made_progress = (attempt is not None and attempt.first_step_at is not None) or \
            (j.last_checkpoint is not None and j.start_time is not None and j.last_checkpoint >= j.start_time)
        out = classify(st, j.stop_kind, job_dir(self.data_dir, j.id), made_progress)
        gpus = sum(len(p["gpus"]) for p in j.placement or [])
        lost = 0.0
        if j.start_time is not None:
            j.attained_gpu_s += gpus * max(0.0, now - j.start_time)
            if out.cause not in ("completed", "cancelled", "timeout", "user_error"):
                # work since the last checkpoint, thrown away (training time, not wall time)
                lost = gpus * lost_work_s(job_dir(self.data_dir, j.id), j.attempt, start_time=j.start_time,
                                          checkpoint=checkpoint, now=now)
                j.lost_gpu_s += lost
        self._end_attempt(s, j, out.attempt_state, out.reason, out.exit_code, out.signal, now, out.cause, lost)
        self._note_suspects(s, j, st, out.cause, now)
        max_retries = next((c.max_retries for c in cfg.spec.classes if c.name == j.job_class), 0)
        retry = out.job_state not in ("REQUEUED", "COMPLETED") and should_retry(out, j.retries, max_retries)
        if out.job_state == "REQUEUED" or retry:
            if j.last_checkpoint is not None and j.start_time is not None:
                j.progress_s += max(0.0, j.last_checkpoint - j.start_time)  # work the next attempt resumes from
            reason = out.reason
            if retry:
                j.retries += 1
                wait = backoff_s(j.retries, self.p.retry_backoff_s, out.cause)
                j.retry_after = now + wait
                reason = (f"Retry {j.retries}/{max_retries} " + (f"in {wait:.0f}s " if wait else "")
                          + f"after {out.attempt_state}: {out.reason}")
            self._to_queue(j, now, reason)
        else:
            j.state, j.reason, j.end_time = out.job_state, out.reason, now
            j.exit_code, j.signal = out.exit_code, out.signal
            j.stop_kind, j.stop_since, j.stop_stage = None, None, 0
        record(s, "backend", f"job.{out.attempt_state.lower()}",
               f"attempt {j.attempt} ended {out.attempt_state} ({out.cause})"
               + (f": {out.reason}" if out.reason not in ("", "None") else "")
               + (f"; lost {lost:.0f} GPU-s since its last checkpoint" if lost else ""), job_id=j.id, at=now,
               data={"exit_code": out.exit_code, "signal": out.signal, "attempt": j.attempt, "cause": out.cause,
                     "lost_gpu_s": lost})
        if retry:
            record(s, "scheduler", "job.retry", reason, job_id=j.id, at=now,
                   data={"retry": j.retries, "max_retries": max_retries, "backoff_s": j.retry_after - now})

    def _note_suspects(self, s, j: JobRow, st: AttemptState, cause: str, now: float) -> None:  # noqa: ANN001
        """Remember the nodes this attempt's failure points at, so the next attempt goes elsewhere
        when it can: the node of a rank seen frozen (a hang), else of the rank that failed first
        (a crash, out of memory). A lost node needs none: it is drained until it passes its checks.
        A symmetric hang (every rank's watchdog fired, none seen frozen) names no node."""
        frozen = self._stopped_seen.pop((j.id, j.attempt), set())
        if cause not in ("hung", "crash", "oom"):
            return
        blamed = sorted(frozen)
        if not blamed and cause != "hung":
            bad = first_failure(st.ranks)
            blamed = [bad.rank] if bad is not None else []
        where = {r.rank: r.node for r in ranks_for(j.placement or [], j.tasks_per_node)}
        suspects = sorted({where[r] for r in blamed if r in where})
        if not suspects:
            return
        keep = [n for n in (j.avoid_nodes or []) if n not in suspects]
        j.avoid_nodes = (keep + suspects)[-MAX_AVOIDED:]
        record(s, "scheduler", "job.avoid_node",
               f"attempt {j.attempt} {cause} with rank {', '.join(map(str, blamed))} on {', '.join(suspects)}; "
               f"the next attempts go elsewhere when they can", job_id=j.id, at=now,
               data={"nodes": suspects, "ranks": blamed, "cause": cause})

    def _attempt_row(self, s, j: JobRow) -> AttemptRow | None:  # noqa: ANN001
        return s.scalars(select(AttemptRow).where(AttemptRow.job_id == j.id, AttemptRow.attempt == j.attempt)).first()

    def _note_checkpoint(self, j: JobRow) -> tuple[int, float] | None:
        """The newest committed checkpoint of this attempt, as the engine's `last_checkpoint`;
        returns its (step, commit time), or None if this attempt made none."""
        found = newest_checkpoint(job_dir(self.data_dir, j.id) / "checkpoints")
        if found is None or j.start_time is None or found[2] < j.start_time:
            return None
        if j.last_checkpoint is None or found[2] > j.last_checkpoint:
            j.last_checkpoint = found[2]
        return found[0], found[2]

    def _end_attempt(self, s, j: JobRow, state: str, reason: str, code, sig, now: float,  # noqa: ANN001
                     cause: str = "", lost: float = 0.0) -> None:
        a = self._attempt_row(s, j)
        if a is not None:
            a.state, a.reason, a.exit_code, a.signal, a.ended_at = state, reason, code, sig, now
            a.cause, a.lost_gpu_s = cause, lost
        # The attempt's job token dies with it (a token leaked through a log must not outlive the run).
        s.execute(update(TokenRow).where(TokenRow.job_id == j.id, TokenRow.role == "job").values(revoked=True))

    @staticmethod
    def _to_queue(j: JobRow, now: float, reason: str) -> None:
        j.state, j.reason, j.queued_since = "REQUEUED", reason, now
        j.placement, j.start_time, j.est_start = None, None, None
        j.stop_kind, j.stop_since, j.stop_stage = None, None, 0

    # 1b. node health ---------------------------------------------------------------------------

    def watch_nodes(self, now: float) -> None:
        """Nodes the backend reports unhealthy go down (nothing new lands there) and the jobs on
        them are stopped to be retried elsewhere; a node the loop took down comes back once the
        backend's check passes. Ranks stopped (SIGSTOP, a frozen node) for `hung_after_s` make
        their job a hung one."""
        inventory = {n.name: n for n in self.backend.inventory()}
        stopped = self._stopped_ranks(now)
        with self.lock, self.store.session.begin() as s:
            rows = node_states(s)
            active = list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))))
            hspec = self.configs.current(s).spec.health
            remedy = hspec.remediation
            for name, info in inventory.items():
                row = rows.get(name)
                checks = self.health.results(name)
                if row is not None and row.state == "up" and row.updated_by != HEALTH:
                    # resumed by a person: what the checks found before is forgotten, and only
                    # rounds run since count (the before-work gate holds its work until one passes)
                    self.health.forget_before(name, row.updated_at)
                    checks = [c for c in checks if c.at >= row.updated_at]
                self._record_check_changes(s, name, checks, now)
                if info.healthy and row is not None and row.state == "down" and row.updated_by == HEALTH:
                    self._checked_since(name, hspec, row.updated_at)  # a round at once, not at the next interval
                finding = worst(checks)
                failing = finding if finding is not None and finding.status == CRITICAL else None
                warning = finding if finding is not None and finding.status == WARN else None
                if row is not None and row.updated_by == HEALTH and row.state in ("down", "remediating") and \
                        remedy.actions:
                    self._remediate(s, row, info.healthy and not failing, hspec, active, now)
                    if row.state == "remediating":
                        continue
                if info.healthy and not failing and (row is None or row.state in ("up", "suspect")):
                    row = self._suspect(s, name, row, warning, now)
                state = info.state if not info.healthy else f"{failing.check}: {failing.message}" if failing else "up"
                # An operator's drain outlives a failure (as Slurm's DRAIN does): the node stays
                # `drain`, its jobs still move, and it comes back only when a person resumes it.
                drained = row is not None and row.state == "drain" and row.updated_by != HEALTH
                if (not info.healthy or failing) and drained and HEALTH_MARK not in (row.reason or ""):
                    row.reason = f"{row.reason or 'drained'}; {state} {HEALTH_MARK}"[:200]
                    record(s, HEALTH, "node.down", f"node {name} is {state}; it stays drained and its jobs move "
                           "elsewhere", node=name, at=now, data={"state": info.state, "drained": True,
                                                               "check": failing.check if failing else None})
                    self._stop_jobs_on(s, active, name, state, now)
                elif (not info.healthy or failing) and not drained and (row is None or row.state != "down"):
                    row = row or NodeRow(name=name)
                    row.state, row.reason, row.updated_at, row.updated_by = "down", f"{state} {HEALTH_MARK}"[:200], now, \
                        HEALTH
                    s.add(row)
                    record(s, HEALTH, "node.down", f"node {name} is {state}: down, its jobs move elsewhere",
                           node=name, at=now, data={"state": info.state, "check": failing.check if failing else None})
                    self._stop_jobs_on(s, active, name, state, now)
                elif info.healthy and not failing and row is not None and row.state == "down" \
                        and row.updated_by == HEALTH and self._checked_since(name, hspec, row.updated_at):
                    # back only after a round of its checks newer than its going down has passed
                    ok, why = self.backend.check_node(name)
                    if ok:
                        row.state, row.reason, row.updated_at = "up", "", now
                        self.remediator.reset(name)
                        record(s, HEALTH, "node.up", f"node {name} passed its checks: back in service",
                               node=name, at=now)
                        self._grow_elastic(s, active, now)
            for j in active:
                if j.stop_kind is None and (j.id, j.attempt) in stopped:
                    j.stop_kind, j.stop_since, j.stop_stage = "hung", now, 0
                    j.reason = f"ranks stopped for {self.p.hung_after_s:.0f}s"
                    record(s, HEALTH, "job.hung", f"ranks made no progress (stopped) for {self.p.hung_after_s:.0f}s; "
                           "killing it to resume from its checkpoint", job_id=j.id, at=now)

    @staticmethod
    def _stop_jobs_on(s, active: list[JobRow], name: str, state: str, now: float) -> None:  # noqa: ANN001
        """Stop every job with a rank on a failed node, to resume it elsewhere."""
        for j in active:
            if j.stop_kind is None and any(p["node"] == name for p in j.placement or []):
                j.stop_kind, j.stop_since, j.stop_stage = "node", now, 0
                j.reason = f"node {name} {state}"[:200]
                record(s, HEALTH, "job.node_failed", f"node {name} is {state}; stopping the job "
                       "to resume it elsewhere", job_id=j.id, node=name, at=now)

    def _suspect(self, s, name: str, row: NodeRow | None, warning: CheckResult | None,  # noqa: ANN001
                 now: float) -> NodeRow | None:
        """A WARN makes an up node `suspect` (no new work, its jobs run on); its end, `up` again.
        Returns the node's row (made here for a node that had none)."""
        if warning is not None and (row is None or row.state == "up"):
            row = row or NodeRow(name=name)
            row.state, row.reason, row.updated_at, row.updated_by = \
                "suspect", f"{warning.check}: {warning.message} (health)"[:200], now, HEALTH
            s.add(row)
            record(s, HEALTH, "node.suspect", f"node {name} is suspect ({warning.check}: {warning.message}): no new "
                   "work until its checks are clean; its jobs run on", node=name, at=now)
        elif warning is None and row is not None and row.state == "suspect" and row.updated_by == HEALTH:
            row.state, row.reason, row.updated_at = "up", "", now
            record(s, HEALTH, "node.up", f"node {name}: its checks are clean again: back in service", node=name, at=now)
        return row

    def _remediate(self, s, row: NodeRow, passing: bool, hspec: HealthSpec,  # noqa: ANN001
                   active: list[JobRow], now: float) -> None:
        """A node its checks took down: run the remediation actions once its jobs are gone,
        check again, repeat after the cooldown, and after the last attempt alert a person."""
        name, remedy = row.name, hspec.remediation
        done = self.remediator.take_finished(name)
        if done is not None:
            ok = all(a_ok for _, a_ok, _ in done)
            steps = "; ".join(f"{a}: {'ok' if a_ok else 'failed'} ({m})" for a, a_ok, m in done)
            row.state, row.updated_at = "down", now  # back only after a round of checks newer than this
            if ok:
                self.health.forget_before(name, now)  # the GPUs were reset: XIDs seen before are history
            row.reason = (f"remediated ({steps}); checking again (health)" if ok
                          else f"remediation failed ({steps}) (health)")[:200]
            record(s, HEALTH, "node.remediated" if ok else "node.remediation_failed",
                   f"node {name}: {steps}", node=name, at=now, data={"actions": done})
            return
        if row.state != "down" or passing or not self._checked_since(name, hspec, row.updated_at):
            return
        if any(p["node"] == name for j in active for p in j.placement or []):
            return  # its jobs are still checkpointing and stopping
        if self.remediator.may_start(name, remedy, now):
            n = self.remediator.start(name, remedy)
            row.state, row.updated_at = "remediating", now
            row.reason = f"remediation {n}/{remedy.max_attempts}: {', '.join(a.name for a in remedy.actions)}"
            record(s, HEALTH, "node.remediating", f"node {name}: {row.reason}", node=name, at=now,
                   data={"attempt": n, "actions": [a.name for a in remedy.actions]})
        elif self.remediator.exhausted(name, remedy) and not self.remediator.state(name).alerted:
            self.remediator.state(name).alerted = True
            row.reason = f"needs a person: still failing after {remedy.max_attempts} remediation rounds (health)"
            record(s, HEALTH, "node.alert", f"node {name} still fails its checks after {remedy.max_attempts} "
                   "remediation rounds: it stays down until a person looks at it", node=name, at=now)

    def _record_check_changes(self, s, node: str, checks: list[CheckResult], now: float) -> None:  # noqa: ANN001
        """An event each time a check's status on a node changes (WARN and CRITICAL are findings)."""
        for c in checks:
            key = (node, c.check)
            before = self._health_seen.get(key, OK)
            if c.status != before:
                self._health_seen[key] = c.status
                where = " (before work)" if c.context == BEFORE_WORK else ""
                record(s, HEALTH, f"node.check_{c.status}", f"node {node}: check {c.check} {c.status.upper()}{where}: "
                       f"{c.message}", node=node, at=now,
                       data={"check": c.check, "status": c.status, "context": c.context})

    def _checked_since(self, name: str, hspec: HealthSpec, at: float) -> bool:
        """Every configured check has run on the node since `at` (its going down, its remediation);
        if not, a round is asked for in the background rather than waiting for the periodic one,
        which may be an hour away."""
        if self.health.fresh(name, hspec, at):
            return True
        self.health.request(name)
        return False

    def _grow_elastic(self, s, active: list[JobRow], now: float) -> None:  # noqa: ANN001
        """A node came back: elastic jobs running below their size restart (by checkpoint) to grow,
        as many as the whole nodes free now can take."""
        busy = {p["node"] for j in active for p in j.placement or []}
        free_nodes = len({n.name for n in self.backend.inventory() if n.healthy} - busy)
        for j in active:
            have = len(j.placement or [])
            if j.stop_kind is None and j.state == "RUNNING" and j.gpus_per_node and have < j.nodes_max \
                    and free_nodes >= 1:
                free_nodes -= min(free_nodes, j.nodes_max - have)
                j.stop_kind, j.stop_since, j.stop_stage = "requeue", now, 0
                j.reason = "Growing"
                record(s, HEALTH, "job.grow", f"a node is back: restarting from a checkpoint to grow from {have} "
                       f"to up to {j.nodes_max} nodes", job_id=j.id, at=now)

    def _stopped_ranks(self, now: float) -> set[tuple[int, int]]:
        """Attempts with a rank stopped for at least `hung_after_s` (remembered across passes)."""
        seen: dict[tuple[int, int], float] = {}
        for a in self._last_facts:
            frozen = {r.rank for r in a.ranks if r.running and r.stopped}
            if frozen:
                key = (a.job_id, a.attempt)
                seen[key] = self._stopped_since.get(key, now)
                self._stopped_seen.setdefault(key, set()).update(frozen)
        self._stopped_since = seen
        return {k for k, t in seen.items() if now - t >= self.p.hung_after_s}

    # 2. stops ----------------------------------------------------------------------------------

    def drive_stops(self, now: float) -> None:
        sends: list[tuple[int, int, int]] = []
        with self.lock, self.store.session.begin() as s:
            cfg = self.configs.current(s)
            grace = {c.name: c.grace_period for c in cfg.spec.classes}
            max_run = {c.name: c.max_run_time for c in cfg.spec.classes}
            for j in s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))):
                if j.stop_kind is None:
                    limits = [x for x in (j.time_limit_s, max_run.get(j.job_class)) if x]
                    if limits and j.start_time is not None and now - j.start_time >= min(limits):
                        j.stop_kind, j.stop_since, j.stop_stage = "timeout", now, 0
                        record(s, "scheduler", "job.timeout", f"time limit {min(limits):.0f}s reached; stopping",
                               job_id=j.id, at=now)
                    else:
                        continue
                stage = self._next_stage(j, now, grace.get(j.job_class, 60.0))
                if stage > j.stop_stage:
                    sig = {NOTICE: signal.SIGUSR1, TERM: signal.SIGTERM, KILL: signal.SIGKILL}[stage]
                    sends.append((j.id, j.attempt, sig))
                    j.stop_stage = stage
                    if stage >= TERM:
                        j.state = "COMPLETING"
                    j.reason = {"preempt": "Preempting", "requeue": "Requeueing"}.get(j.stop_kind, j.reason)
                    if stage > NOTICE or j.stop_kind in ("preempt", "requeue"):
                        record(s, "scheduler", "job.signal", f"sent {signal.Signals(sig).name} ({j.stop_kind})",
                               job_id=j.id, at=now, data={"signal": int(sig), "stage": stage})
        for jid, att, sig in sends:
            self.backend.signal(jid, att, sig)

    def _next_stage(self, j: JobRow, now: float, grace_s: float) -> int:
        since = j.stop_since or now
        if j.stop_kind == "hung":
            return KILL  # a stopped process cannot act on SIGTERM
        if j.stop_kind in ("preempt", "requeue"):
            if j.stop_stage < NOTICE:
                return NOTICE
            if now - since < grace_s:
                return j.stop_stage
            if j.stop_stage < TERM:
                return TERM
            return KILL if now - since >= grace_s + self.p.kill_wait_s else j.stop_stage
        if j.stop_stage < TERM:
            return TERM
        return KILL if now - since >= self.p.kill_wait_s else j.stop_stage

    # 3. dependencies --------------------------------------------------------------------------

    def settle_dependencies(self, now: float) -> None:
        """Jobs whose `--dependency` now holds join the queue in this same pass; jobs whose
        dependency never can are cancelled (`services.jobs.settle_dependencies`)."""
        with self.lock, self.store.session.begin() as s:
            settle_dependencies(s, now)

    # 4. schedule -------------------------------------------------------------------------------

    def schedule(self, now: float) -> None:
        unhealthy = [n.name for n in self.backend.inventory() if not n.healthy]
        with self.store.session() as s:
            cfg = self.configs.current(s)
            states = node_states(s)
            running = list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))))
            t = JobRow.__table__
            # Plain rows of the columns the engine reads, not ORM objects: with thousands waiting,
            # loading them was most of a pass. Held jobs are not the engine's business.
            pending = s.execute(select(*(t.c[c] for c in PENDING_COLUMNS))
                                .where(t.c.state.in_(PENDING_STATES), t.c.held.is_(False),
                                       t.c.dependency_pending.is_(False),
                                       or_(t.c.begin_time.is_(None), t.c.begin_time <= now),
                                       or_(t.c.retry_after.is_(None), t.c.retry_after <= now))
                                .order_by(t.c.id)).all()
            horizon = now - 6 * USAGE_HALF_LIFE_S
            spans = s.execute(select(JobRow.team, AttemptRow.placement, AttemptRow.started_at, AttemptRow.ended_at)
                              .join(JobRow, JobRow.id == AttemptRow.job_id)
                              .where(or_(AttemptRow.ended_at.is_(None), AttemptRow.ended_at > horizon))).all()
            pending, limited = _array_throttle(pending, running)
            if limited:
                self._note_limited(limited)
            if not pending:
                return
            unchecked, checking = self._before_work(cfg, states, unhealthy, running, pending, now)
            idx = NodeIndex.build(cfg, states, unhealthy + sorted(unchecked))
        usage = decayed_usage(((t, sum(len(p["gpus"]) for p in pl), a, b) for t, pl, a, b in spans), now)
        snap = build_snapshot(cfg, idx, running, pending, usage, now, self._pending_cache)
        result = (self.policy or cfg.policy).cycle(snap)
        by_id = {j.id: j for j in pending}
        launches: list[LaunchSpec] = []
        with self.lock, self.store.session.begin() as s:
            for pre in result.preemptions:
                if checking:
                    break  # a node being checked may be free for it in a moment: no preemption meanwhile
                v = s.get(JobRow, pre.job_id)
                if v is None or v.state != "RUNNING" or v.stop_kind is not None:
                    continue
                v.stop_kind, v.stop_since, v.stop_stage, v.reason = "preempt", now, 0, "Preempting"
                record(s, "scheduler", "job.preempting",
                       f"preempted ({pre.reason}) to make room for job {pre.for_job}; checkpoint notice follows",
                       job_id=v.id, at=now, data={"reason": pre.reason, "for_job": pre.for_job})
            for st in result.starts:
                j = s.get(JobRow, st.job_id)
                seen = by_id.get(st.job_id)
                if j is None or j.state not in PENDING_STATES or j.held or seen is None or j.attempt != seen.attempt:
                    continue
                launches.append(self._start(s, j, idx.to_rows(st.placement), now))
            updates = [{"jid": k, "r": REASONS.get(v.reason, str(v.reason.value)), "e": v.est_start}
                       for k, v in result.pending.items()
                       if k in by_id and (by_id[k].reason != REASONS.get(v.reason)
                                          or by_id[k].est_start != v.est_start)]
            if updates:
                _write_reasons(s, updates)
        for spec in launches:
            self._launch(spec, now)

    def _note_limited(self, limited: list) -> None:
        """Tasks an array's `%N` throttle keeps back this pass: reason JobArrayTaskLimit, no estimate."""
        updates = [{"jid": r.id, "r": "JobArrayTaskLimit", "e": None} for r in limited
                   if r.reason != "JobArrayTaskLimit" or r.est_start is not None]
        if updates:
            with self.lock, self.store.session.begin() as s:
                _write_reasons(s, updates)

    def _before_work(self, cfg: ConfigVersion, states: dict[str, NodeRow], unhealthy: list[str],
                     running: list[JobRow], pending: list, now: float) -> tuple[set[str], bool]:
        """The before-work gate (Slurm's HealthCheckProgram at registration, NHC in a prolog):
        a node takes new work only on a round of its checks that passed, started within
        `health.before_work_max_age` and, when a person resumed the node, after that. Returns the
        nodes that may not take work now and whether a round is under way for one of them.

        A node that could take some of the waiting work (free GPUs, a pool a waiting job asks
        for) gets a before-work round in the background; the loop never waits for it, and the
        round's end wakes the loop. A round that finds a problem acts like a periodic one
        (`watch_nodes`: WARN → suspect, CRITICAL → down)."""
        hspec = cfg.spec.health
        if not hspec.checks:
            return set(), False
        used: dict[str, int] = {}
        for j in running:
            for part in j.placement or []:
                used[part["node"]] = used.get(part["node"], 0) + len(part["gpus"])
        pools = {p.pool for p in pending}
        horizon = now - hspec.before_work_max_age
        unchecked, checking = set(), False
        for n in cfg.nodes:
            row = states.get(n.name)
            wanted = n.pool in pools
            if n.name in unhealthy:
                continue
            if row is not None and row.state != "up":
                # no work for it anyway; but one its checks took down is checked again as often
                # while work waits for its pool, so that it returns as soon as it passes
                if row.state == "down" and row.updated_by == HEALTH and wanted \
                        and not self.health.fresh(n.name, hspec, max(horizon, row.updated_at)):
                    self.health.request(n.name)
                    checking = True
                continue
            since = horizon if row is None or row.updated_by == HEALTH else max(horizon, row.updated_at)
            if self.health.fresh(n.name, hspec, since) and worst(self.health.results(n.name)) is None:
                continue
            unchecked.add(n.name)
            if wanted and used.get(n.name, 0) < n.gpus:
                self.health.request(n.name)
                checking = True
        return unchecked, checking

    def _start(self, s, j: JobRow, placement: list[dict], now: float) -> LaunchSpec:  # noqa: ANN001
        j.attempt += 1
        j.state, j.reason, j.start_time, j.end_time, j.est_start = "RUNNING", "None", now, None, None
        j.retry_after = None
        j.placement, j.exit_code, j.signal = placement, None, None
        j.last_checkpoint = None
        j.stop_kind, j.stop_since, j.stop_stage = None, None, 0
        s.add(AttemptRow(job_id=j.id, attempt=j.attempt, placement=placement, started_at=now, state="RUNNING"))
        where = ", ".join(f"{p['node']}:{','.join(map(str, p['gpus']))}" for p in placement)
        record(s, "scheduler", "job.started", f"attempt {j.attempt} started on {where}", job_id=j.id, at=now,
               data={"attempt": j.attempt, "placement": placement})
        jd = job_dir(self.data_dir, j.id)
        env = dict(j.env)
        if self.api_url:
            env["TRAINYARD_API"] = self.api_url
        env["TRAINYARD_TOKEN"] = auth.create_token(s, user=f"job-{j.id}", role="job", team=j.team,
                                                   by=auth.SYSTEM, job_id=j.id)
        command = list(j.command) if j.command else ["/bin/bash", str(jd / "script.sh")]
        return LaunchSpec(job_id=j.id, attempt=j.attempt, command=command, workdir=j.workdir, job_dir=str(jd),
                          ranks=ranks_for(placement, j.tasks_per_node), env=env,
                          checkpoint_dir=str(jd / "checkpoints"))

    def _launch(self, spec: LaunchSpec, now: float) -> None:
        jd = Path(spec.job_dir)
        try:
            for sub in ("logs", "checkpoints", "metrics"):
                (jd / sub).mkdir(parents=True, exist_ok=True)
            with self.store.session() as s:
                j = s.get(JobRow, spec.job_id)
                script = j.script if j is not None else None
                output = j.output if j is not None else None
                name = j.name if j is not None else ""
                array = (j.array_job_id, j.array_task_id) if j is not None else (None, None)
            if script is not None and not (jd / "script.sh").exists():
                (jd / "script.sh").write_text(script)
            if output:
                _link_outputs(output, spec, name, jd, array)
            self.backend.launch(spec)
        except (BackendError, OSError) as e:
            with self.lock, self.store.session.begin() as s:
                j = s.get(JobRow, spec.job_id)
                if j is not None and j.attempt == spec.attempt and j.state == "RUNNING":
                    why = f"UserError: cannot launch: {e}"  # no such program, workdir gone, …
                    self._end_attempt(s, j, "FAILED", why, None, None, now, "user_error")
                    j.state, j.reason, j.end_time = "FAILED", why, now
                    record(s, "backend", "job.failed", f"launch failed: {e}", job_id=j.id, at=now)


def _write_reasons(s, updates: list[dict]) -> None:  # noqa: ANN001
    """Bulk-set waiting jobs' reason and estimated start ({"jid", "r", "e"} each); a job that has
    started, ended or been held since it was read is left as it is."""
    t = JobRow.__table__
    still_waiting = or_(*(t.c.state == st for st in PENDING_STATES))  # no IN: executemany can't expand it
    s.execute(update(t).where(and_(t.c.id == bindparam("jid"), still_waiting, t.c.held.is_(False)))
              .values(reason=bindparam("r"), est_start=bindparam("e")), updates)


def _array_throttle(pending: list, running: list[JobRow]) -> tuple[list, list]:
    """Split the waiting rows into those the scheduler sees and those an array's `%N` throttle keeps
    back this pass (`services.arrays.throttled`)."""
    capped = [(r.id, r.array_job_id, r.array_task_id, r.array_throttle) for r in pending if r.array_throttle]
    if not capped:
        return pending, []
    active: dict[int, int] = {}
    for j in running:
        if j.array_job_id is not None:
            active[j.array_job_id] = active.get(j.array_job_id, 0) + 1
    out = arrays.throttled(capped, active)
    return [r for r in pending if r.id not in out], [r for r in pending if r.id in out]


def _link_outputs(pattern: str, spec: LaunchSpec, name: str, jd: Path,
                  array: tuple[int | None, int | None] = (None, None)) -> None:
    """Slurm's `--output`: make the asked-for path(s) point at the rank logs (%j id, %t rank, %x name,
    %A an array's id and %a the task's index; outside an array, the job's id and 0).

    The control plane may run with more rights than the job's owner, so it only ever creates a
    symlink inside the job's working directory, replaces nothing but an older symlink, and skips
    (the log stays in the job dir) whatever would land elsewhere.
    """
    workdir = Path(spec.workdir).resolve()
    safe_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".") or "job"
    for r in spec.ranks:
        if r.rank > 0 and "%t" not in pattern:
            break
        aid, index = array
        path = Path(pattern.replace("%j", str(spec.job_id)).replace("%t", str(r.rank)).replace("%x", safe_name)
                    .replace("%A", str(spec.job_id if aid is None else aid)).replace("%a", str(index or 0)))
        if not path.is_absolute():
            path = workdir / path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            where = path.parent.resolve() / path.name
            if not where.is_relative_to(workdir) or path.name in ("", ".", ".."):
                log.warning("job %s: --output %s is outside its working directory; not linked", spec.job_id, path)
                return
            if where.is_symlink():
                where.unlink()
            elif where.exists():
                log.warning("job %s: --output %s exists and is not a link; not replaced", spec.job_id, where)
                continue
            os.symlink(jd / "logs" / f"rank-{r.rank}.log", where)
        except OSError as e:
            log.warning("job %s: cannot link --output %s: %s", spec.job_id, path, e)
