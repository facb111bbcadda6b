"""When to start periodic asynchronous checkpoints so an incident never costs more than
`checkpoint_every` steps.

An asynchronous save of step N is only a checkpoint once it commits, some steps later. Saving at
every multiple of N alone would let an incident during that commit lose the save in flight as
well as the steps since the one before: up to `every + lag` steps. Instead `every` is treated as
the bound on lost work (the recovery-point objective): the cadence learns how many steps a
commit takes and starts each save that much earlier, and `must_wait` tells the loop to wait for
a commit that runs later than that rather than let the newest committed checkpoint fall more
than `every` steps behind.

Pure bookkeeping, no I/O: `Run` feeds it step ends and commit durations; rank 0's `due` answers
reach every rank through the runtime's per-step agreement, so all ranks save the same step.
"""

from __future__ import annotations

import math


class CheckpointCadence:
    """Start-of-save decisions for one run.

    Args:
        every: the most steps an incident may cost (the newest committed checkpoint is never
            older than this, counted from the last completed step before the next one starts).
        start_step: the step the run resumed at (0 when fresh: a restart from scratch is
            itself a "checkpoint" of step 0).
        pipeline: steps between rank 0 answering `due` and every rank acting on it (1 when the
            answer travels through the runtime's pipelined agreement, 0 in a single process).
    """

    def __init__(self, every: int, start_step: int = 0, pipeline: int = 0) -> None:
        if every < 1:
            raise ValueError(f"checkpoint_every must be at least 1, not {every}")
        self.every = every
        self.pipeline = pipeline
        self.last_started = start_step
        self.lag_steps = 0  # how many steps the last commit took (0 until one is seen)
        self.step_s: float | None = None  # smoothed wall time of a step (rank 0)
        self._flagged = False
        self._last_end: float | None = None

    @property
    def gap(self) -> int:
        """Steps between the starts of two saves: `every` less the commit lag, at least 1."""
        return max(1, self.every - self.lag_steps)

    def step_ended(self, now: float) -> None:
        """Rank 0, at every step end: keeps the smoothed step time the lag is counted in."""
        if self._last_end is not None:
            dt = max(0.0, now - self._last_end)
            self.step_s = dt if self.step_s is None else 0.8 * self.step_s + 0.2 * dt
        self._last_end = now

    def committed(self, seconds: float) -> None:
        """Rank 0: a save committed `seconds` after it started."""
        if self.step_s:
            self.lag_steps = max(0, math.ceil(seconds / self.step_s))

    def due(self, step: int) -> bool:
        """Rank 0, at the end of `step`: should a save start `pipeline` steps from now?

        Answers True once per save (until `started` is called), so a pipelined answer does not
        start two saves in a row.
        """
        if self._flagged:
            return False
        if step + self.pipeline >= self.last_started + self.gap:
            self._flagged = True
            return True
        return False

    def should_save(self, step: int, agreed_due: bool) -> bool:
        """Every rank, at the end of `step`, with the agreed `due` answer: save now?

        A save is due when rank 0 asked for it (unless a save has started since it asked), and
        in any case once `every` steps have passed since the last one started; both rules give
        every rank the same answer, since all know the agreed flag and `last_started`.
        """
        if step >= self.last_started + self.every:
            return True
        return agreed_due and self.last_started < step - self.pipeline

    def started(self, step: int) -> None:
        """Every rank: a save of `step` started (periodic, time-based, preemption or final)."""
        self.last_started = step
        self._flagged = False

    def must_wait(self, step: int, committed_step: int) -> bool:
        """Before step `step + 1` starts: would the newest commit fall more than `every` behind?"""
        return step + 1 - committed_step > self.every
