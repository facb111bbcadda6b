"""Nodes that slowed down more than one job: suspect, a speed check, then drained or cleared.

A rank flagged as a straggler (`control/loop/stragglers.py`) says little about its node: the job
may have given that rank more data, or its code may be slow there. A node flagged in two
*unrelated* jobs within `stragglers.suspect_window` says more. Unrelated: different jobs that
are not tasks of one array (an array's tasks run one script, often with the same skewed shard);
two jobs of one user count, since a false suspicion costs only one speed check. The attempts of
one job (a requeue) are one job. Flags from before the node's suspicion last ended (cleared,
confirmed, or the node back `up`) do not count again.

Suspect (`nodes.suspect_since`, `nodes.suspect_reason`, event `node.suspect`): the schedule step
gives it no new work (`control/loop/snapshot.py`; its running jobs go on) and the health checker
runs a round of its checks at once, the `speed` check among them (control/health/speed.py; on the
local backend inside the node's CPU cgroup, so a slowed node measures slow). Then, on the first
`speed` result that started after the suspicion:

- CRITICAL (below the baseline): the node was slow. The node watch takes it down and remediates
  it as for any failing check (`node.down` with the check's figures); here the suspicion ends
  with `node.suspect_confirmed`.
- OK: the node is as fast as its baseline, so the jobs were the cause: `node.suspect_cleared`,
  and it takes work again.
- WARN (no baseline for its model, torch missing): nothing was measured, so nothing is cleared:
  it stays suspect (and the node watch makes it `suspect` as for any WARN) until a person
  resumes it (`yard resume NODE`, which ends the suspicion).

With no `speed` check configured there is nothing to measure with, and holding the node out
without a way back would be worse than the straggler: it is marked suspect (seen in `yard nodes`,
the event saying no check will run) but keeps taking work, and the mark lapses after
`suspect_window`.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainyard.control.health import CRITICAL, OK, CheckResult, HealthChecker
from trainyard.control.loop.context import LoopContext
from trainyard.services.config import ConfigVersion
from trainyard.services.events import record
from trainyard.spec.pilot import effective_for
from trainyard.store.models import EventRow, JobRow, NodeRow

ACTOR = "stragglers"
FLAG = "job.straggler"
CLEARED, CONFIRMED = "node.suspect_cleared", "node.suspect_confirmed"
ENDS = (CLEARED, CONFIRMED, "node.up")  # after these, earlier flags count no more


def speed_checks(cfg: ConfigVersion, node: str) -> set[str]:
    """The node's `speed` checks (its own settings: a pilot node's trial, spec/pilot.py)."""
    return {c.name for c in effective_for(cfg.spec, node).health.checks if c.kind == "speed"}


def speed_checked(cfg: ConfigVersion, node: str) -> bool:
    """A `speed` check is configured: a suspect node is held out of new work until it runs."""
    return bool(speed_checks(cfg, node))


def held(cfg: ConfigVersion, row: NodeRow | None) -> bool:
    """The node takes no new work because it is suspect (and a speed check will judge it)."""
    return row is not None and row.suspect_since is not None and speed_checked(cfg, row.name)


class Suspects:
    def __init__(self, ctx: LoopContext, health: HealthChecker) -> None:
        self.ctx, self.health = ctx, health

    def run(self, now: float, flags: list[tuple[str, int]]) -> None:
        """`flags`: (node, job) of the straggler flags recorded this pass."""
        ctx = self.ctx
        with ctx.store.session() as s:
            suspect = list(s.scalars(select(NodeRow.name).where(NodeRow.suspect_since.is_not(None))))
        if not flags and not suspect:
            return
        with ctx.lock, ctx.store.session.begin() as s:
            cfg = ctx.configs.current(s)
            window = cfg.spec.stragglers.suspect_window
            for node in sorted({n for n, _ in flags}):
                self._judge_flags(s, cfg, node, window, now)
            for row in s.scalars(select(NodeRow).where(NodeRow.suspect_since.is_not(None))):
                self._follow(s, cfg, row, window, now)

    def _judge_flags(self, s: Session, cfg: ConfigVersion, node: str, window: float, now: float) -> None:
        row = s.get(NodeRow, node)
        if row is not None and (row.suspect_since is not None or row.state not in ("up", "suspect")):
            return  # suspect already, or out of service (drained, down): its checks decide
        ended = s.scalar(select(func.max(EventRow.time)).where(EventRow.kind.in_(ENDS), EventRow.node == node))
        since = max(now - window, ended or 0.0)
        jobs = sorted({j for j in s.scalars(select(EventRow.job_id).where(
            EventRow.kind == FLAG, EventRow.node == node, EventRow.time >= since)) if j is not None})
        groups: dict[int, list[int]] = {}
        for jid, array in s.execute(select(JobRow.id, JobRow.array_job_id).where(JobRow.id.in_(jobs))):
            groups.setdefault(array if array is not None else jid, []).append(jid)
        if len(groups) < 2:
            return
        checked = speed_checked(cfg, node)
        row = row or NodeRow(name=node)
        s.add(row)
        names = ", ".join(str(j) for j in jobs)
        row.suspect_since = now
        row.suspect_reason = (f"straggler in jobs {names} within {window:g}s"
                              + ("" if checked else " (no speed check configured: still in service)"))[:200]
        record(s, ACTOR, "node.suspect",
               f"node {node} is suspect: it slowed unrelated jobs {names} within {window:g}s; "
               + ("no new work until its speed check passes (it runs now); its jobs run on" if checked else
                  "no speed check is configured (health.checks, kind speed), so it stays in service; configure one "
                  "to have suspect nodes measured"),
               node=node, at=now, data={"cause": "stragglers", "jobs": jobs, "checked": checked})
        if checked:
            self.health.request(node)

    def _follow(self, s: Session, cfg: ConfigVersion, row: NodeRow, window: float, now: float) -> None:
        """A suspect node: ask for its speed check until one started after the suspicion, then act on it."""
        since = row.suspect_since or 0.0
        if not speed_checked(cfg, row.name):
            if now - since >= window:
                self._end(s, row, CLEARED, f"node {row.name}: its straggler suspicion lapsed after {window:g}s "
                          "(never measured: no speed check is configured)", now)
            return
        names = speed_checks(cfg, row.name)
        mine = self.health.results(row.name, effective_for(cfg.spec, row.name).health)
        results = [r for r in mine if r.check in names and r.at >= since]
        if len(results) < len(names):
            self.health.request(row.name)  # none queued or running since: at once (a running one is that round)
            return
        bad = next((r for r in results if r.status == CRITICAL), None)
        if bad is not None and row.state in ("up", "suspect"):
            return  # the node watch takes it out of service first (next pass at the latest), then it ends here
        if bad is not None:
            self._end(s, row, CONFIRMED, f"node {row.name}: its speed check {bad.check} failed ({bad.message}): "
                      "the node was slow; it is taken out of service and remediated", now, bad)
        elif all(r.status == OK for r in results):
            r = results[0]
            self._end(s, row, CLEARED, f"node {row.name}: its speed check {r.check} passed ({r.message}): the "
                      "cause was the jobs, not the node; it takes work again", now, r)

    @staticmethod
    def _end(s: Session, row: NodeRow, kind: str, message: str, now: float, result: CheckResult | None = None) -> None:
        row.suspect_since, row.suspect_reason = None, ""
        record(s, ACTOR, kind, message, node=row.name, at=now,
               data={"check": result.check, "status": result.status, "message": result.message} if result else {})
