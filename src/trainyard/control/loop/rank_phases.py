"""Each rank's own work per step, from the runtime's phase files, and which ranks straggle.

Why own work and not step time: in synchronous data parallelism every rank's step takes as long
as the slowest rank's, since the fast ones wait for it in the all-reduce. What tells them apart
is that wait: a rank's own work in a step is its step time less its time in collectives
(`recent` = [[step, step_s, comm_s], …] in the phase file, contracts.py above `PHASES_DIR`; a
missing comm_s counts as 0, and then every rank looks alike and nothing is flagged).

The files are the job's: they are read as the ledger reads them (`services/goodput_facts.read_phase`:
through `jobfs`, no link followed, no FIFO waited on, at most `PHASES_MAX_BYTES`; every figure a
plain number or skipped: a string, NaN, 1e308, a negative time or a bool is never an error). A file
that is missing, refused, too big or not of this attempt and rank is "no report" for that rank.

`slow_ranks` is pure: over the newest `window` steps every rank reported, each rank's median own
work against the median of the *other* ranks' medians (with two ranks, counting a rank in the
gang it is judged against would halve what the factor can see: a rank 4 times slower than its one
peer is only 1.6 times the median of both).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from trainyard.contracts import JobDir
from trainyard.services import goodput_facts


@dataclass(frozen=True)
class Straggler:
    """A rank whose median own work per step exceeds `factor` times the rest of its gang's."""

    rank: int
    median_s: float  # its median own work per step over the window
    gang_s: float  # the median of the other ranks' medians
    steps: tuple[int, int]  # the first and last step of the window


def own_work(job_dir: JobDir, attempt: int, rank: int) -> dict[int, float]:
    """{step: step seconds less comm seconds} of the rank's newest steps; {} when it reported none."""
    phases = goodput_facts.read_phase(job_dir, attempt, rank)
    return {} if phases is None else {step: max(0.0, step_s - comm_s) for step, step_s, comm_s in phases.recent}


def gang_window(own: dict[int, dict[int, float]], window: int) -> list[int] | None:
    """The newest `window` steps every rank of `own` (rank → {step: seconds}) reported, oldest first;
    None with fewer than two ranks or fewer common steps."""
    if len(own) < 2:
        return None
    common = set.intersection(*(set(steps) for steps in own.values()))
    if len(common) < window:
        return None
    return sorted(common)[-window:]


def slow_ranks(own: dict[int, dict[int, float]], window: int, factor: float) -> tuple[list[Straggler], bool]:
    """The ranks that straggle over the newest common window, and whether there was a window to
    judge at all (False: too few ranks or steps reported yet; nobody is judged, flagged or cleared)."""
    steps = gang_window(own, window)
    if steps is None:
        return [], False
    medians = {r: median(own[r][s] for s in steps) for r in own}
    out = []
    for r, m in sorted(medians.items()):
        gang = median(v for q, v in medians.items() if q != r)
        if m > factor * gang and m > 0:
            out.append(Straggler(r, m, gang, (steps[0], steps[-1])))
    return out, True
