"""Discrete-event simulator (work in progress: the API below is fixed, the body is being written).

    simulate(workload, policy, params=SimParams(), progress=None) -> SimResult

`progress(fraction)` is called now and then with a number in [0, 1] for a progress bar.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trainyard.sched.policy import Policy
from trainyard.sim.result import SimResult
from trainyard.sim.workload import Workload


@dataclass(frozen=True, slots=True)
class SimParams:
    restart_overhead_s: float = 60.0  # a restarted attempt spends this long loading before progress
    stop_delay_s: float = 30.0  # a preempted job holds its GPUs this long (capped by the class grace)
    default_checkpoint_interval_s: float = 1800.0  # for jobs that do not say
    node_mtbf_s: float | None = None  # mean time between failures of one node; None: no failures
    node_repair_s: float = 3600.0
    usage_half_life_s: float = 7 * 86400.0  # fair-share decay (Slurm's PriorityDecayHalfLife)
    seed: int = 0


def simulate(workload: Workload, policy: Policy, params: SimParams = SimParams(),
             progress: Callable[[float], None] | None = None) -> SimResult:
    raise NotImplementedError
