"""Run-time estimates handed to the policies, the same for every policy of a comparison.

Three modes (`yard sim --estimates MODE`):

- `none`: no estimate (`est_runtime_s = None`); backfill and start-time estimates must do without.
- `oracle`: the true run time (`SimJob.duration_s`), which no real cluster has.
- `user`: what users write as a wall-time limit: the true run time times a factor drawn
  log-uniformly from [1, 5] (users over-estimate, never under-estimate, or their job is killed),
  then rounded UP to the next common limit: 15m, 30m, 1h, 2h, 4h, 8h, 12h, 1d, 2d, 3d, 5d, 7d,
  14d, 30d, 60d. Beyond 60 days the factor is applied without rounding.

Every draw is made from `random.Random(f"{seed}:{job name}")` (`SimJob.name`: the loader's label,
`p00001`, or the id where there is none), so a job's estimate depends only on the seed and its
name: every policy, every run and every subset of the workload sees the same estimate for the same
job. The label, not the int id, because the estimates of every published figure were drawn from
those strings (when ids were strings), and an int seed would draw others.

Start-time estimates (`yard sim --start-estimator limit|learned`, `SimParams.start_estimator`):
what the engine tells a waiting job about when it will start, measured against when it did
(issue 40). `limit` assumes every job runs to its limit (`est_runtime_s`), as a cluster that has
learned nothing; `learned` gives each job, at its arrival, the run time learned from the jobs
completed before it (`LearnedRuntimes`), as the control plane's services/learned_runtimes.py does
from a user's past jobs of the same name. The Philly trace has neither users nor job names, so the
key is the nearest it has: the same virtual cluster (team), the same GPU count and the same limit.
`sim.result.estimate_errors` adds up the error of each job's first estimate.
"""

from __future__ import annotations

import bisect
import math
import random
import statistics
from collections import deque
from dataclasses import replace

from trainyard.sched.types import JobRequest
from trainyard.sim.workload import SimJob

MODES = ("none", "user", "oracle")

_M, _H, _D = 60.0, 3600.0, 86400.0
COMMON_LIMITS_S: tuple[float, ...] = (
    15 * _M, 30 * _M, 1 * _H, 2 * _H, 4 * _H, 8 * _H, 12 * _H,
    1 * _D, 2 * _D, 3 * _D, 5 * _D, 7 * _D, 14 * _D, 30 * _D, 60 * _D,
)
MAX_FACTOR = 5.0


def user_estimate(duration_s: float, rng: random.Random) -> float:
    """One user's wall-time limit for a job that truly runs `duration_s` seconds."""
    raw = duration_s * math.exp(rng.uniform(0.0, math.log(MAX_FACTOR)))
    i = bisect.bisect_left(COMMON_LIMITS_S, raw)
    return COMMON_LIMITS_S[i] if i < len(COMMON_LIMITS_S) else raw


def apply_estimates(jobs: list[SimJob], mode: str, seed: int) -> list[SimJob]:
    """A copy of `jobs` with `req.est_runtime_s` set according to `mode` (see the module notes).

    Raises:
        ValueError: `mode` is not one of `none`, `user`, `oracle`.
    """
    if mode not in MODES:
        raise ValueError(f"unknown estimates mode {mode!r}; choose one of {', '.join(MODES)}")
    out: list[SimJob] = []
    for job in jobs:
        if mode == "none":
            est = None
        elif mode == "oracle":
            est = float(job.duration_s)
        else:
            est = user_estimate(job.duration_s, random.Random(f"{seed}:{job.name}"))
        out.append(replace(job, req=replace(job.req, est_runtime_s=est)))
    return out


START_ESTIMATORS = ("limit", "learned")
LEARNED_LAST = 10  # the learned run time is the median of the last this many completed jobs of a key


class LearnedRuntimes:
    """Run times learned from completed jobs, keyed by (team, GPUs, limit): the median of the last
    `LEARNED_LAST` of the key, at most the job's limit; nothing where the key has none yet."""

    def __init__(self, last: int = LEARNED_LAST) -> None:
        self.last = last
        self.seen: dict[tuple[str, int, float | None], deque[float]] = {}

    @staticmethod
    def key(req: JobRequest) -> tuple[str, int, float | None]:
        return (req.team, req.max_gpus, req.est_runtime_s)

    def observe(self, req: JobRequest, run_s: float) -> None:
        got = self.seen.get(self.key(req))
        if got is None:
            got = self.seen[self.key(req)] = deque(maxlen=self.last)
        got.append(run_s)

    def expected(self, req: JobRequest) -> float | None:
        got = self.seen.get(self.key(req))
        if not got:
            return None
        m = statistics.median(got)
        return m if req.est_runtime_s is None else min(m, req.est_runtime_s)
