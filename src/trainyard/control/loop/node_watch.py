"""Step 1b of a pass: node health, from the backend's inventory and the health checks' results.

- A node the backend reports unhealthy, or whose checks are CRITICAL, goes down (nothing new lands
  there) and the jobs on it are stopped to be retried elsewhere; an operator's drain outlives a
  failure (the node stays `drain`, its jobs still move).
- A WARN makes an up node `suspect` (no new work, its jobs run on); clean checks make it up again.
- A node the loop took down comes back once a round of its checks newer than its going down has
  passed and the backend's `check_node` agrees; with remediation actions configured it goes
  through `remediating` first, and after the last attempt a person is alerted.
- Ranks stopped (frozen) for `hung_after_s` make their job hung.
The checks themselves run in the background (`control/health`); this step never waits for them.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.backends.base import NodeInfo
from trainyard.control.loop.context import HEALTH, HEALTH_MARK, Facts, LoopContext
from trainyard.control.loop.frozen import FrozenRanks
from trainyard.control.health import BEFORE_WORK, CRITICAL, OK, WARN, CheckResult, HealthChecker, Remediator, worst
from trainyard.services import transitions
from trainyard.services.events import record
from trainyard.services.nodes import node_states
from trainyard.spec.models import HealthSpec
from trainyard.spec.pilot import effective_for
from trainyard.states import ACTIVE_STATES, JobState, StopKind
from trainyard.store.models import JobRow, NodeRow


class NodeWatch:
    def __init__(self, ctx: LoopContext, health: HealthChecker, frozen: FrozenRanks) -> None:
        self.ctx, self.health, self.frozen = ctx, health, frozen
        self.remediator = Remediator(ctx.data_dir)
        self._seen: dict[tuple[str, str], str] = {}  # (node, check) → last status recorded

    def run(self, facts: Facts, now: float) -> None:
        ctx = self.ctx
        hung = self.frozen.observe(facts.attempts, now)
        with ctx.lock, ctx.store.session.begin() as s:
            rows = node_states(s)
            active = list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES))))
            spec = ctx.configs.current(s).spec
            for info in facts.inventory:  # each node under its own settings: a pilot node's trial (spec/pilot.py)
                self._watch(s, info, rows.get(info.name), effective_for(spec, info.name).health, active, facts, now)
            for j in active:
                if j.stop_kind is None and (j.id, j.attempt) in hung:
                    after = ctx.params.hung_after_s
                    transitions.request_stop(s, j, StopKind.HUNG, now, actor=HEALTH, event="job.hung",
                                             message=f"ranks made no progress (stopped) for {after:.0f}s; "
                                                     "killing it to resume from its checkpoint",
                                             reason=f"ranks stopped for {after:.0f}s")

    def _watch(self, s: Session, info: NodeInfo, row: NodeRow | None, hspec: HealthSpec, active: list[JobRow],
               facts: Facts, now: float) -> None:
        name = info.name
        checks = self.health.results(name, hspec)
        if row is not None and row.state == "up" and row.updated_by != HEALTH:
            # resumed by a person: what the checks found before is forgotten, and only rounds run
            # since count (the before-work gate holds its work until one passes)
            self.health.forget_before(name, row.updated_at)
            checks = [c for c in checks if c.at >= row.updated_at]
        self._record_check_changes(s, name, checks, now)
        if info.healthy and row is not None and row.state == "down" and row.updated_by == HEALTH:
            self.checked_since(name, hspec, row.updated_at)  # a round at once, not at the next interval
        finding = worst(checks)
        failing = finding if finding is not None and finding.status == CRITICAL else None
        warning = finding if finding is not None and finding.status == WARN else None
        if row is not None and row.updated_by == HEALTH and row.state in ("down", "remediating") and \
                hspec.remediation.actions:
            self._remediate(s, row, info.healthy and not failing, hspec, active, now)
            if row.state == "remediating":
                return
        if info.healthy and not failing and (row is None or row.state in ("up", "suspect")):
            row = self._suspect(s, name, row, warning, now)
        state = info.state if not info.healthy else f"{failing.check}: {failing.message}" if failing else "up"
        check = failing.check if failing else None
        # An operator's drain outlives a failure (as Slurm's DRAIN does): the node stays `drain`,
        # its jobs still move, and it comes back only when a person resumes it.
        drained = row is not None and row.state == "drain" and row.updated_by != HEALTH
        if (not info.healthy or failing) and drained and row is not None and HEALTH_MARK not in (row.reason or ""):
            row.reason = f"{row.reason or 'drained'}; {state} {HEALTH_MARK}"[:200]
            record(s, HEALTH, "node.down", f"node {name} is {state}; it stays drained and its jobs move elsewhere",
                   node=name, at=now, data={"state": info.state, "drained": True, "check": check})
            self._stop_jobs_on(s, active, name, state, now)
        elif (not info.healthy or failing) and not drained and (row is None or row.state != "down"):
            row = row or NodeRow(name=name)
            row.state, row.reason, row.updated_at, row.updated_by = "down", f"{state} {HEALTH_MARK}"[:200], now, HEALTH
            s.add(row)
            record(s, HEALTH, "node.down", f"node {name} is {state}: down, its jobs move elsewhere",
                   node=name, at=now, data={"state": info.state, "check": check})
            self._stop_jobs_on(s, active, name, state, now)
        elif info.healthy and not failing and row is not None and row.state == "down" \
                and row.updated_by == HEALTH and self.checked_since(name, hspec, row.updated_at):
            # back only after a round of its checks newer than its going down has passed
            ok, _why = self.ctx.backend.check_node(name)
            if ok:
                row.state, row.reason, row.updated_at = "up", "", now
                self.remediator.reset(name)
                record(s, HEALTH, "node.up", f"node {name} passed its checks: back in service", node=name, at=now)
                self._grow_elastic(s, active, facts, now)

    @staticmethod
    def _stop_jobs_on(s: Session, active: list[JobRow], name: str, state: str, now: float) -> None:
        """Stop every job with a rank on a failed node, to resume it elsewhere."""
        for j in active:
            if j.stop_kind is None and any(p["node"] == name for p in j.placement or []):
                transitions.request_stop(s, j, StopKind.NODE, now, actor=HEALTH, event="job.node_failed",
                                         message=f"node {name} is {state}; stopping the job to resume it elsewhere",
                                         reason=f"node {name} {state}", node=name)

    @staticmethod
    def _suspect(s: Session, name: str, row: NodeRow | None, warning: CheckResult | None,
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

    def _remediate(self, s: Session, row: NodeRow, passing: bool, hspec: HealthSpec, active: list[JobRow],
                   now: float) -> None:
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
        if row.state != "down" or passing or not self.checked_since(name, hspec, row.updated_at):
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

    def _record_check_changes(self, s: Session, node: str, checks: list[CheckResult], now: float) -> None:
        """An event each time a check's status on a node changes (WARN and CRITICAL are findings)."""
        for c in checks:
            key = (node, c.check)
            if c.status != self._seen.get(key, OK):
                self._seen[key] = c.status
                where = " (before work)" if c.context == BEFORE_WORK else ""
                record(s, HEALTH, f"node.check_{c.status}", f"node {node}: check {c.check} {c.status.upper()}{where}: "
                       f"{c.message}", node=node, at=now,
                       data={"check": c.check, "status": c.status, "context": c.context})

    def checked_since(self, name: str, hspec: HealthSpec, at: float) -> bool:
        """Every configured check has run on the node since `at` (its going down, its remediation);
        if not, a round is asked for in the background rather than waiting for the periodic one,
        which may be an hour away."""
        if self.health.fresh(name, hspec, at):
            return True
        self.health.request(name)
        return False

    def _grow_elastic(self, s: Session, active: list[JobRow], facts: Facts, now: float) -> None:
        """A node came back: elastic jobs running below their size restart (by checkpoint) to grow,
        as many as the whole nodes free now can take."""
        busy = {p["node"] for j in active for p in j.placement or []}
        free_nodes = len({n.name for n in facts.inventory if n.healthy} - busy)
        for j in active:
            have = len(j.placement or [])
            if j.stop_kind is None and j.state == JobState.RUNNING and j.gpus_per_node and have < j.nodes_max \
                    and free_nodes >= 1:
                free_nodes -= min(free_nodes, j.nodes_max - have)
                transitions.request_stop(s, j, StopKind.REQUEUE, now, actor=HEALTH, event="job.grow",
                                         message=f"a node is back: restarting from a checkpoint to grow from {have} "
                                                 f"to up to {j.nodes_max} nodes", reason="Growing")
