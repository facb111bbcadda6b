"""Step 1e of a pass: slow ranks within running jobs, and the nodes they point at (issue 39).

Every running job's ranks report their newest steps in phase files (`control/loop/rank_phases.py`
reads them and says which rank straggles). A rank that does `stragglers.factor` times the work
of the rest of its gang per step, over the newest `stragglers.window` steps, gets one event
`job.straggler` naming the job, the rank, its node (from the plane's placement, never from what
the job wrote) and both medians; once per rank and attempt, or again after a
`job.straggler_recovered`. The node's part (two unrelated jobs → suspect → speed check) is
`control/loop/suspects.py`, told of each new flag.

The flags are events, so the store keeps them across a restart of the plane: a job first seen
by this process has its flagged ranks read back from its events, not flagged twice. The files
are read at most every half `contracts.PHASES_EVERY_S` (the period the runtime rewrites them at):
a rewritten file is seen at most half a period late, and at the default 1 s tick that is every
pass (the running jobs as plain rows of five columns); the suspects' follow-up runs every pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.contracts import PHASES_EVERY_S, JobDir
from trainyard.control.loop.context import LoopContext
from trainyard.control.loop.rank_phases import Straggler, own_work, slow_ranks
from trainyard.control.loop.suspects import Suspects
from trainyard.services.events import record
from trainyard.services.ranks import ranks_for
from trainyard.spec.stragglers import StragglersSpec
from trainyard.states import JobState
from trainyard.store.models import EventRow, JobRow

ACTOR = "stragglers"
FLAG, RECOVERED = "job.straggler", "job.straggler_recovered"
READ_EVERY_S = PHASES_EVERY_S / 2


@dataclass
class _Seen:
    flagged: set[int] = field(default_factory=set)  # ranks flagged and not recovered


class Stragglers:
    def __init__(self, ctx: LoopContext, suspects: Suspects) -> None:
        self.ctx, self.suspects = ctx, suspects
        self._jobs: dict[tuple[int, int], _Seen] = {}  # (job, attempt) of the running jobs
        self._read_at = float("-inf")  # the last pass that read the files

    def run(self, now: float) -> None:
        if now - self._read_at < READ_EVERY_S:  # nothing new in the files yet
            self.suspects.run(now, [])
            return
        self._read_at = now
        ctx = self.ctx
        with ctx.store.session() as s:
            spec = ctx.configs.current(s).spec.stragglers
            t = JobRow.__table__  # plain rows of the columns it needs, not ORM objects: one query a period
            running = [(r.id, r.attempt, r.placement or [], r.tasks_per_node, JobDir.of(ctx.data_dir, r.id, r.dir_key))
                       for r in s.execute(select(t.c.id, t.c.attempt, t.c.placement, t.c.tasks_per_node, t.c.dir_key)
                                          .where(t.c.state == JobState.RUNNING))]
        self._jobs = {k: v for k, v in self._jobs.items() if k[:2] in {(r[0], r[1]) for r in running}}
        if not spec.enabled:
            self.suspects.run(now, [])
            return
        news: list[tuple[int, int, Straggler | None, int, str]] = []  # job, attempt, flag or None, rank, node
        for job_id, attempt, placement, tasks_per_node, jd in running:
            nodes = {r.rank: r.node for r in ranks_for(placement, tasks_per_node)}
            if len(nodes) < 2:
                continue
            seen = self._jobs.get((job_id, attempt))
            if seen is None:
                seen = self._jobs[(job_id, attempt)] = _Seen(self._flagged_before(job_id, attempt))
            flags, judged = slow_ranks({r: own_work(jd, attempt, r) for r in nodes}, spec.window, spec.factor)
            if not judged:
                continue
            slow = {f.rank: f for f in flags}
            news += [(job_id, attempt, f, r, nodes[r]) for r, f in slow.items() if r not in seen.flagged]
            news += [(job_id, attempt, None, r, nodes[r]) for r in seen.flagged - set(slow)]
            seen.flagged = set(slow)
        if news:
            with ctx.lock, ctx.store.session.begin() as s:
                for job_id, attempt, flag, rank, node in news:
                    self._record(s, spec, job_id, attempt, flag, rank, node, now)
        self.suspects.run(now, [(n[4], n[0]) for n in news if n[2] is not None])

    def _flagged_before(self, job_id: int, attempt: int) -> set[int]:
        """The ranks of this attempt its events leave flagged (a restarted plane's memory)."""
        flagged: set[int] = set()
        with self.ctx.store.session() as s:
            for kind, data in s.execute(select(EventRow.kind, EventRow.data).where(
                    EventRow.job_id == job_id, EventRow.kind.in_((FLAG, RECOVERED))).order_by(EventRow.id)):
                if (data or {}).get("attempt") == attempt and isinstance((data or {}).get("rank"), int):
                    (flagged.add if kind == FLAG else flagged.discard)(data["rank"])
        return flagged

    @staticmethod
    def _record(s: Session, spec: StragglersSpec, job_id: int, attempt: int, flag: Straggler | None, rank: int,
                node: str, now: float) -> None:
        data = {"attempt": attempt, "rank": rank, "node": node}
        if flag is None:
            record(s, ACTOR, RECOVERED, f"job {job_id} rank {rank} on {node} no longer straggles", job_id=job_id,
                   node=node, at=now, data=data)
            return
        record(s, ACTOR, FLAG,
               f"job {job_id} rank {rank} on {node} straggles: median {flag.median_s:.3g}s of its own work per step "
               f"against the gang's {flag.gang_s:.3g}s (over steps {flag.steps[0]}-{flag.steps[1]}, factor "
               f"{spec.factor:g})", job_id=job_id, node=node, at=now,
               data={**data, "median_s": flag.median_s, "gang_s": flag.gang_s, "steps": list(flag.steps),
                     "factor": spec.factor})
