"""What a simulation replays: a cluster, its teams and classes, and jobs with their true run times.

Loaders (`trainyard.sim.philly`, `trainyard.sim.synthetic`) produce a `Workload`; the simulator
never looks at where it came from. Times are seconds from the workload's `origin` (a wall-clock
datetime kept only for display and for `--from/--to`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from trainyard.sched.cluster import Node
from trainyard.sched.types import JobClass, JobRequest, Team


@dataclass(frozen=True, slots=True)
class SimJob:
    """A job to replay. `duration_s` is its true run time at its largest size (`req.max_gpus`);
    an elastic job run at a smaller size takes proportionally longer (linear scaling).
    `req.est_runtime_s` is what the policies are told (see `trainyard.sim.estimates`).

    `req.id` is an int, as in the store; `label` is the loader's own name for the job (`p00001`
    for Philly's first row). The run-time estimates are seeded from the name, not the id: they were
    drawn from the labels when ids were those strings, and must not move with the id's type."""

    req: JobRequest
    duration_s: float
    label: str = ""  # "": the job is named by its id

    @property
    def name(self) -> str:
        return self.label or str(self.req.id)


@dataclass(slots=True)
class Workload:
    nodes: list[Node]
    teams: dict[str, Team]
    classes: dict[str, JobClass]
    jobs: list[SimJob]  # sorted by submit time, then id
    measure_from: float = 0.0  # only jobs submitted at or after this count (end of warm-up)
    measure_to: float | None = None  # ... and before this; None: all
    origin: datetime | None = None
    name: str = "workload"
    notes: list[str] = field(default_factory=list)  # how quotas etc. were derived, for the report
    # What a restart costs in this trace's world, if it says (Pollux: 30 s per allocation); None:
    # the simulator's `SimParams.restart_overhead_s`.
    restart_overhead_s: float | None = None

    def measured(self, submit_time: float) -> bool:
        return submit_time >= self.measure_from and (self.measure_to is None or submit_time < self.measure_to)

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)
