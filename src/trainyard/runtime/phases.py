"""Where a rank's step time goes: data wait, checkpoint stall and collectives, per step (issue 39).

The control plane's goodput ledger and its straggler detector need, for every rank, how much of
its steps it spent waiting for data, waiting for a checkpoint and in collectives; `MetricsLogger`
already measures each step's wall time (from the previous step's end to this one's). A
`PhaseClock` keeps one cumulative counter per phase, fed while the loop runs:
- `data(iterable)` times each `next()` of the loader the training code iterates; `phase(name)` is
  the same for code that loads (or communicates, or saves) otherwise;
- `Run` times what the loop waits for of a checkpoint (`checkpoint_stall`) and its agreement;
- `comm_interval(t0, t1)` is fed from other threads (the DDP communication hook's completion
  callbacks, `comm_timing.py`): intervals, because a step's buckets overlap each other, and their
  union is the step's time in collectives; `comm_sources` give durations measured elsewhere (CUDA
  events).
At each step end (`step_ended`, right after `log_step`) the counters are read: what grew since the
previous step end is this step's share. Attribution is therefore by time, like the step time
itself: a save `step_done` starts after logging step N is waited for inside step N+1's time.
Phases never nest (an inner `phase()` inside an open one counts for the outer), and a step's
phases are clipped so that they never add up to more than its wall time.

The result is the per-rank phase file of `contracts.py` (the comment above `PHASES_DIR`), handed to
`PhaseFile` at most every `PHASES_EVERY_S` and at the end: a few floats per step and a deque append
keep the per-step cost in microseconds (`bench/phase_overhead.py`).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

from trainyard.contracts import PHASES_EVERY_S, PHASES_RECENT
from trainyard.runtime.phase_file import PhaseFile

PHASES = ("data_wait", "checkpoint_stall", "comm")
SWITCH = "TRAINYARD_PHASES"  # "0", "false", "off" or "no": no phase timing (Run's phase_timing=None)
FORMAT_VERSION = 1
MAX_PENDING = 4096  # collectives kept between two step ends, at most

T = TypeVar("T")
_clock = time.perf_counter


def enabled_by(environ: Mapping[str, str] | None = None) -> bool:
    """Phase timing is on unless `TRAINYARD_PHASES` says 0/false/off/no."""
    raw = (os.environ if environ is None else environ).get(SWITCH, "")
    return raw.strip().lower() not in ("0", "false", "off", "no")


def union_s(intervals: list[tuple[float, float]], lo: float, hi: float) -> float:
    """Seconds covered by `intervals` (start, end), clipped to [lo, hi]."""
    total, cur_s, cur_e = 0.0, 0.0, float("-inf")
    for s, e in sorted(intervals):
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if s > cur_e:
            total += max(0.0, cur_e - cur_s)
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + max(0.0, cur_e - cur_s)


class _Span:
    """`with clock.phase(name):` — a context manager without a generator's cost."""

    __slots__ = ("clock", "name", "outer", "t0")

    def __init__(self, clock: PhaseClock, name: str) -> None:
        self.clock, self.name, self.outer, self.t0 = clock, name, False, 0.0

    def __enter__(self) -> _Span:
        c = self.clock
        self.outer = c.open
        if not self.outer:
            c.open = True
            self.t0 = _clock()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        if not self.outer:
            c = self.clock
            c.open = False
            c.add(self.name, self.t0, _clock())


class TimedIter(Generic[T]):
    """An iterator whose every `next()` counts as data wait (unless a phase is already open)."""

    __slots__ = ("clock", "it", "source")

    def __init__(self, clock: PhaseClock, source: Iterable[T]) -> None:
        self.clock, self.source, self.it = clock, source, iter(source)

    def __iter__(self) -> TimedIter[T]:
        return self

    def __len__(self) -> int:
        return len(self.source)  # type: ignore[arg-type]  # a DataLoader's, when it has one

    def __next__(self) -> T:
        c = self.clock
        if c.open:
            return next(self.it)
        t0 = _clock()
        try:
            return next(self.it)
        finally:
            c.data_wait_s += _clock() - t0


class PhaseClock:
    """One rank's phase counters and its phase file. Called from the training thread, except
    `comm_interval` (any thread: a list append)."""

    def __init__(self, path: str | Path, *, attempt: int, rank: int, every_s: float = PHASES_EVERY_S,
                 recent: int = PHASES_RECENT) -> None:
        self.attempt, self.rank, self.every_s = attempt, rank, every_s
        self.file = PhaseFile(Path(path), rank=rank)
        self.open = False  # a phase() or a data next() is being timed (phases never nest)
        # raw cumulative seconds (all the attempt, before and after the steps too)
        self.data_wait_s = 0.0
        self.checkpoint_s = 0.0
        self.comm: list[tuple[float, float]] = []  # intervals (perf_counter) since the last step end
        self.comm_sources: list[Callable[[], float]] = []  # comm seconds measured elsewhere, since last asked
        # what the file says
        self.began: float | None = None
        self.last: float | None = None
        self.step: int | None = None
        self.steps = 0
        self.total_step = self.total_data = self.total_ckpt = self.total_comm = 0.0
        self.recent: deque[tuple[int, float, float]] = deque(maxlen=recent)
        self.ended: float | None = None
        # the raw counters and the clock at the previous step end (or the start)
        self._mark_data = self._mark_ckpt = 0.0
        self._mark_t = _clock()
        self._next_write = 0.0

    # -- measuring -----------------------------------------------------------------------------

    def phase(self, name: str) -> _Span:
        """`with clock.phase("data_wait" | "checkpoint_stall" | "comm"):` counts the block."""
        if name not in PHASES:
            raise ValueError(f"phase {name!r}: expected one of {', '.join(PHASES)}")
        return _Span(self, name)

    def data(self, iterable: Iterable[T]) -> TimedIter[T]:
        return TimedIter(self, iterable)

    def add(self, name: str, t0: float, t1: float) -> None:
        if name == "data_wait":
            self.data_wait_s += t1 - t0
        elif name == "checkpoint_stall":
            self.checkpoint_s += t1 - t0
        else:
            self.comm.append((t0, t1))

    def comm_interval(self, t0: float, t1: float) -> None:
        """A collective from `t0` to `t1` (perf_counter): from any thread. Bounded, for a loop that
        never ends a step through `step_ended`."""
        if len(self.comm) < MAX_PENDING:
            self.comm.append((t0, t1))

    # -- the steps -------------------------------------------------------------------------------

    def start(self) -> None:
        """The steps begin (after the resume): what came before is not a step's."""
        self.began = time.time()
        self._mark_data, self._mark_ckpt, self._mark_t = self.data_wait_s, self.checkpoint_s, _clock()
        self.comm = []
        for source in self.comm_sources:
            source()
        self.flush()

    def step_ended(self, step: int, step_s: float) -> None:
        """Step `step` ended now, `step_s` after the previous one (MetricsLogger's step time)."""
        now = _clock()
        data, ckpt = self.data_wait_s - self._mark_data, self.checkpoint_s - self._mark_ckpt
        self._mark_data, self._mark_ckpt = self.data_wait_s, self.checkpoint_s
        comm = 0.0
        if self.comm:
            intervals, self.comm = self.comm, []
            comm = union_s(intervals, self._mark_t, now)
        for source in self.comm_sources:
            comm += source()
        self._mark_t = now
        # never more than the step: phases do not overlap, and the clocks are read a little apart
        data = min(data, step_s)
        ckpt = min(ckpt, step_s - data)
        comm = min(comm, step_s - data - ckpt)
        self.total_step += step_s
        self.total_data += data
        self.total_ckpt += ckpt
        self.total_comm += comm
        self.recent.append((step, step_s, comm))
        self.step = step
        self.steps += 1
        self.last = time.time()
        if now >= self._next_write:
            self.flush(now)

    @property
    def after_last_s(self) -> float:
        """Checkpoint stall since the newest step ended (a final or a preemption save)."""
        return self.checkpoint_s - self._mark_ckpt

    def record(self) -> dict[str, Any]:
        """The phase file's content now (contracts.py, above `PHASES_DIR`)."""
        return {
            "v": FORMAT_VERSION, "attempt": self.attempt, "rank": self.rank,
            "began": self.began, "last": self.last, "step": self.step, "steps": self.steps,
            "phases": {"step": round(self.total_step, 6), "data_wait": round(self.total_data, 6),
                       "checkpoint_stall": round(self.total_ckpt, 6), "comm": round(self.total_comm, 6)},
            "after_last": {"checkpoint_stall": round(self.after_last_s, 6)},
            "ended": self.ended,
            "recent": [[s, round(t, 6), round(c, 6)] for s, t, c in self.recent],
        }

    def flush(self, now: float | None = None) -> None:
        """Hand the record to the writer thread (it writes the newest one; never waits)."""
        self._next_write = (now if now is not None else _clock()) + self.every_s
        self.file.submit(self.record())

    def finish(self) -> None:
        """The run ended: `ended` set, the file written before returning. Idempotent."""
        if self.ended is None:
            self.ended = time.time()
        self.file.close(self.record())
