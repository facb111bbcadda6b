"""Small builders for hand-made snapshots in the scheduler tests.

Job ids are ints, as in the engine (`JobId`); tests number a team's jobs by hundreds (team a's
jobs 100.., team b's 200..) where that helps to read them. GPU memory is MiB: `GB` MiB each."""

from __future__ import annotations

from trainyard.sched.cluster import ClusterState, Node, Placement
from trainyard.sched.placement import place
from trainyard.sched.types import JobClass, JobId, JobRequest, PendingJob, Quota, RunningJob, Snapshot, Team

GB = 1024  # MiB

CLASSES = {
    "interactive": JobClass("interactive", 300, preemptible=False, max_wait_s=900, grace_s=0),
    "training": JobClass("training", 200, preemptible=True, max_wait_s=86400, min_run_s=600, grace_s=120),
    "batch": JobClass("batch", 100, preemptible=True, max_wait_s=3 * 86400, min_run_s=0, grace_s=60),
}


def nodes(n: int, gpus: int = 8, mem_mib: int = 80 * GB, per_rack: int = 2, per_block: int = 2) -> list[Node]:
    return [Node(f"n{i}", gpus, mem_mib, block=f"b{i // (per_rack * per_block)}", rack=f"r{i // per_rack}") for i in range(n)]


def teams(**nominal: int | tuple[int, int | None, int | None]) -> dict[str, Team]:
    out = {}
    for name, q in nominal.items():
        if isinstance(q, tuple):
            out[name] = Team(name, "lab", {"default": Quota(*q)})
        else:
            out[name] = Team(name, "lab", {"default": Quota(q)})
    return out


def req(id: JobId, team: str = "a", cls: str = "training", gpus: int = 1, submit: float = 0.0, **kw) -> JobRequest:
    return JobRequest(id, team, cls, submit, gpus=gpus, **kw)


def pending(r: JobRequest, **kw) -> PendingJob:
    return PendingJob(r, queued_since=kw.pop("queued_since", r.submit_time), **kw)


def running(state: ClusterState, r: JobRequest, start: float = 0.0, ckpt: float | None = None,
            at: tuple[tuple[int, tuple[int, ...]], ...] | None = None, **kw) -> RunningJob:
    """Place `r` (or put it exactly `at` the given GPUs) and allocate it in `state`."""
    if at is not None:
        cap = [state.cap_mib[i] for i, _ in at]
        pl = Placement(at, tuple(cap))
    else:
        pl, why = place(state, r)
        assert pl is not None, why
    state.allocate(pl)
    return RunningJob(r, pl, start, start if ckpt is None else ckpt, **kw)


def snapshot(ns, tm, run, pend, now=0.0, usage=None, explain=True) -> Snapshot:
    state = ClusterState.build(ns, [r.placement for r in run])
    return Snapshot(now=now, cluster=state, teams=tm, classes=CLASSES, running=run, pending=pend,
                    usage=usage or {}, explain=explain)
