"""Estimated start times for pending jobs, and expected ends of running ones.

The estimate walks the pending jobs in the policy's order against a profile of aggregate free
GPUs per pool: GPUs free now, plus GPUs returned as running jobs reach their expected ends (from
run-time estimates, or the class's max run time). Each job takes its GPUs at the earliest moment
enough are free and gives them back after its own estimate. It ignores topology and memory (a
job may in truth need a particular node to free up), so it is a lower bound in spirit, shown as
Slurm shows START_TIME: a best guess that moves as the queue moves.

The run time it assumes is `JobRequest.expected_runtime_s` where the cluster has learned one (the
median of the user's past runs of the same job, at most the limit: services/learned_runtimes.py),
else the limit (`est_runtime_s`). A running job past its learned run time is assumed to run to its
limit. Only these estimates read the learned figure: `expected_end`, which reservations (step 6)
and so the decisions use, keeps the limit, as Slurm's backfill trusts limits, because the plane
stops nothing at the learned time and a reservation planned on it would be broken.
"""

from __future__ import annotations

import heapq
import math
from typing import Mapping, Sequence

from trainyard.sched.types import JobClass, JobId, JobRequest, PendingJob, Reservation, RunningJob, Snapshot


def run_time(req: JobRequest) -> float | None:
    """The run time the start estimates assume for `req`: learned where known, else its limit."""
    return req.expected_runtime_s if req.expected_runtime_s is not None else req.est_runtime_s


def expected_end(r: RunningJob, cls: JobClass, now: float) -> float:
    est = r.req.est_runtime_s
    if est is not None:
        rate = r.gpus / r.req.max_gpus
        end = r.start_time + max(0.0, est - r.progress_s) / rate
    elif cls.max_run_s:
        end = r.start_time + cls.max_run_s
    else:
        return math.inf
    return max(end, now + 60.0)  # overran its estimate: assume it ends soon


def running_ends(running: Sequence[RunningJob], classes: Mapping[str, JobClass],
                 now: float, leaving: Mapping[JobId, float] | None = None) -> dict[str, list[tuple[float, int]]]:
    """Per pool, (expected end, GPUs) of every running job whose end can be estimated; a job in
    `leaving` (preempted: its notice sent, or chosen as a victim in this cycle) ends then.

    The same formula as `expected_end` for a job without a learned run time (one with one ends
    at it until it is past it: the module notes), inlined: this pass runs over every running job (8,000
    in the scheduling benchmark) on every cycle, and the per-job function calls were most of its
    time. `tests/sched/test_fast_paths.py` keeps the two in step.
    """
    by_pool: dict[str, list[tuple[float, int]]] = {}
    # A learned run time, where a job has one, replaces the limit (module notes); the loop below
    # is the limit's formula, unchanged, for every job without one.
    max_run = {name: c.max_run_s for name, c in classes.items()}
    soon = now + 60.0
    for r in running:
        req = r.req
        g = r.placement.gpus
        est = req.est_runtime_s
        exp = req.expected_runtime_s
        if exp is not None and r.start_time + (exp - r.progress_s) * req.max_gpus / g > now:
            est = exp  # not yet past what it was expected to run
        if leaving and req.id in leaving:
            end = leaving[req.id]  # not moved to `soon`: it leaves at its grace's end
            ends = by_pool.get(req.pool)
            if ends is None:
                ends = by_pool[req.pool] = []
            ends.append((max(end, now), g))
            continue
        if est is not None:
            left = est - r.progress_s
            end = r.start_time + (left if left > 0.0 else 0.0) / (g / req.max_gpus)
        else:
            m = max_run[req.job_class]
            if not m:
                continue
            end = r.start_time + m
        ends = by_pool.get(req.pool)
        if ends is None:
            ends = by_pool[req.pool] = []
        ends.append((end if end > soon else soon, g))
    return by_pool


def estimate_starts(snap: Snapshot, pending_in_order: Sequence[PendingJob], started: Sequence[tuple[PendingJob, int]],
                    reservations: Sequence[Reservation],
                    leaving: Mapping[JobId, float] | None = None) -> dict[JobId, float | None]:
    """Estimated start of each job in `pending_in_order` (None: held, or beyond every known end).

    `started` are the jobs this cycle starts, with their GPUs: they hold those GPUs from now
    until their own estimated end. `leaving`: running jobs that end at a known time (preempted,
    at their grace's end), not at their estimate or time limit: a job waiting for its victims
    was once told the victims' time limit as its start.
    """
    now = snap.now
    reserved = {r.job_id: r.start_at for r in reservations}
    out: dict[JobId, float | None] = {}
    pools = sorted({pj.req.pool for pj in pending_in_order})
    all_ends = running_ends(snap.running, snap.classes, now, leaving) if pools else {}
    for pool in pools:
        # Returns come from two sources merged in time order: running jobs (sorted once) and the
        # jobs this walk places (a small heap).
        ends = all_ends.get(pool, [])
        avail = snap.cluster.free_gpus(pool)
        for pj, g in started:
            if pj.req.pool == pool:
                avail -= g
                run_s = run_time(pj.req)
                if run_s is not None:
                    ends.append((now + run_s, g))
        ends.sort()
        k, n_ends = 0, len(ends)
        heap: list[tuple[float, int]] = []
        t = now
        for pj in pending_in_order:
            if pj.req.pool != pool or pj.held:
                if pj.held:
                    out[pj.req.id] = None
                continue
            g = pj.req.min_gpus
            while avail < g and (k < n_ends or heap):
                if heap and (k >= n_ends or heap[0][0] < ends[k][0]):
                    t, back = heapq.heappop(heap)
                else:
                    t, back = ends[k]
                    k += 1
                avail += back
            if avail < g:
                out[pj.req.id] = None
                continue
            start = max(t, reserved.get(pj.req.id, t))
            out[pj.req.id] = start
            avail -= g
            run_s = run_time(pj.req)
            if run_s is not None:
                heapq.heappush(heap, (start + max(60.0, run_s - pj.progress_s), g))
    return out
