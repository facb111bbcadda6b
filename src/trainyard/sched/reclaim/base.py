"""The one interface of a reclaim strategy (step 5 and its letters): try to free GPUs for a job.

Why a Protocol of one method: the cycle (`sched/cycle/run.py`) tries the strategies in a fixed
order and stops at the first that finds victims, as Kueue's preemptor tries its policies in
turn; a strategy only needs the cycle's state (`CycleState`), the job and its priority, and says
whether it chose victims (sent through `CycleState.stop_for`, which claims their GPUs for it).
"""

from __future__ import annotations

from typing import Protocol

from trainyard.sched.cycle.state import CycleState
from trainyard.sched.types import PendingJob


class Strategy(Protocol):
    name: str

    def try_(self, st: CycleState, pj: PendingJob, prio: int) -> bool:
        """Whether victims were chosen for `pj` (of priority `prio`), their notices sent."""
        ...
