"""Baseline policies, the yardsticks trainyard's own policy is measured against (design rule 8).

Each module models one real scheduler faithfully but simply, and says in its docstring what it
leaves out: `fifo`, `partition` (static per-team partitions), `slurm` (multifactor priority,
EASY backfill, QOS preemption), `kueue` (cohort borrowing, BestEffortFIFO, reclaim and
within-queue preemption) `tiresias` (discretized 2D-LAS as Pollux evaluated it) and `tiresias-3200` (the
parameters it shipped with before). Importing this package registers
them with `trainyard.sched.policy.register`.
"""

from trainyard.sched.baselines.fifo import Fifo
from trainyard.sched.baselines.kueue import Kueue
from trainyard.sched.baselines.partition import Partition
from trainyard.sched.baselines.slurm import Slurm
from trainyard.sched.baselines.tiresias import Tiresias, TiresiasShortQueue

__all__ = ["Fifo", "Kueue", "Partition", "Slurm", "Tiresias", "TiresiasShortQueue"]
