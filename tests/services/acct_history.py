"""A written history for the accounting tests: jobs and attempts put straight into the store of a
plane whose loop does not run, so that every figure is known in advance.

Times are offsets from `T0` (an hour-aligned past time), GPUs and durations are round, so a
test states its expectation as arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.plane import Plane
from trainyard.services.transitions import placement_gpus
from trainyard.store.models import AttemptRow, JobRow

T0 = 1_760_000_400.0  # 2025-10-09T09:00:00Z: in the past, whole hours
H = 3600.0
NOW = T0 + 4 * H  # the API's clock in these tests


@dataclass
class Try:
    start: float  # offset from T0, seconds
    end: float | None  # None: still running
    gpus: int = 2
    node: str = "node-0"
    cause: str = "completed"
    state: str = "COMPLETED"
    lost_gpu_s: float = 0.0
    max_rss_mib: float | None = None


def add_job(p: Plane, *, team: str = "vision", user: str = "alice", job_class: str = "training",
            state: str = "COMPLETED", submit: float = 0.0, eligible: float | None = None,
            tries: tuple[Try, ...] = (), end: float | None = None, name: str = "job", **extra: Any) -> int:
    """One job and its attempts; `end` defaults to its last attempt's end for a finished job."""
    last = tries[-1] if tries else None
    if end is None and state not in ("PENDING", "REQUEUED", "RUNNING", "COMPLETING") and last is not None:
        end = last.end
    with p.cp.store.session.begin() as s:
        j = JobRow(name=name, user=user, team=team, job_class=job_class, pool="default", state=state, reason="None",
                   command=["true"], workdir="/tmp", env={}, gpus=last.gpus if last else 1,
                   submit_time=T0 + submit, queued_since=T0 + submit,
                   eligible_time=None if eligible is None else T0 + eligible,
                   end_time=None if end is None else T0 + end, attempt=len(tries),
                   start_time=None if last is None else T0 + last.start, **extra)
        s.add(j)
        s.flush()
        for i, t in enumerate(tries, 1):
            placement = [{"node": t.node, "gpus": list(range(t.gpus)), "mem_mib": 0}]
            s.add(AttemptRow(job_id=j.id, attempt=i, placement=placement, started_at=T0 + t.start,
                             ended_at=None if t.end is None else T0 + t.end, state=t.state if t.end else "RUNNING",
                             cause=t.cause if t.end is not None else "", lost_gpu_s=t.lost_gpu_s,
                             gpus=placement_gpus(placement), max_rss_mib=t.max_rss_mib))
        return j.id


class History:
    """Four hours from T0 (window 1h..3h is the middle two), teams vision and nlp."""

    def __init__(self, p: Plane):
        self.p = p
        # ran 0h..0.9h, before the middle window
        self.early = add_job(p, name="early", tries=(Try(0, 0.9 * H, gpus=4),))
        # 0.5h..2.5h, preempted at 1.5h (lost 0.1h of 2 GPUs), requeued, ran 2h..2.5h
        self.preempted = add_job(p, name="preempted", submit=0, eligible=0.25 * H,
                                 tries=(Try(0.5 * H, 1.5 * H, cause="preempted", state="PREEMPTED",
                                            lost_gpu_s=0.1 * H * 2),
                                        Try(2 * H, 2.5 * H, max_rss_mib=512.0)))
        # nlp, OOM at start 2h, ended 2.25h on node-1
        self.oom = add_job(p, name="oom", team="nlp", user="bob", state="OUT_OF_MEMORY", submit=1.9 * H,
                           tries=(Try(2 * H, 2.25 * H, gpus=1, node="node-1", cause="oom", state="OUT_OF_MEMORY",
                                      lost_gpu_s=0.2 * H),))
        # nlp, running since 2.5h on 3 GPUs
        self.running = add_job(p, name="running", team="nlp", user="bob", state="RUNNING", submit=2.4 * H,
                               tries=(Try(2.5 * H, None, gpus=3, node="node-1"),))
        # vision, pending since 1h (eligible at 1h)
        self.pending = add_job(p, name="waiting", state="PENDING", submit=H, eligible=H, job_class="batch")
        # submitted after the middle window
        self.late = add_job(p, name="late", submit=3.5 * H, tries=(Try(3.6 * H, 3.7 * H),))
