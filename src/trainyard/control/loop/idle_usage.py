"""How busy a running job is, as the idle step (control/loop/idle.py) judges it: its CPU rate and its GPUs.

The CPU rate is the difference of two `Backend.cpu_seconds` readings (all the attempt's processes,
on all its nodes, exited ones too) over the time between them, as a percent of one CPU; the GPU's
is `Backend.gpu_percent` (the busiest of the attempt's GPUs, where the backend reads one). A
reading at or above the class's `below` marks the job busy at that moment (`Track.busy_at`). The
readings are taken at most every `SAMPLE_S` per job (sooner for a short `after`, so that a stretch
is judged from several of them) and kept here, in memory: a restarted plane starts afresh.

A backend that cannot tell (None for both, as Slurm's) leaves `Track.measured` false: such a job
is judged by its terminal and port input alone if it is an allocation, and not at all otherwise
(no reading is no evidence that it is idle).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from trainyard.backends.base import Backend

log = logging.getLogger("trainyard.loop")
SAMPLE_S = 5.0  # the longest between two CPU readings of one job
MIN_SAMPLE_S = 0.5  # the shortest (an `after` of seconds, in tests)


@dataclass
class Track:
    """What the idle step remembers of one running job (its current attempt)."""

    attempt: int
    seen: float  # when this loop first saw the attempt running
    cpu: float | None = None  # the last CPU reading, and when
    cpu_at: float = 0.0
    busy_at: float | None = None  # the last sample its CPU or GPU was at or above the threshold
    measured: bool = False  # a CPU rate or a GPU reading was had: the backend can tell
    warned: float | None = None  # the `idle since` of the stretch already warned about
    warned_at: float = 0.0  # when that warning went out
    acted: float | None = None  # the `idle since` of the stretch already acted on (notify)


def sample_every(after: float) -> float:
    """How often one job's CPU is read: every few seconds, and at least eight times per `after`."""
    return min(SAMPLE_S, max(MIN_SAMPLE_S, after / 8))


def due(tr: Track, now: float, after: float) -> bool:
    return tr.cpu is None or now - tr.cpu_at >= sample_every(after)


def sample(backend: Backend, job_id: int, tr: Track, now: float, below: float) -> None:
    """Read the attempt's CPU (and GPU) now; a rate at or above `below` percent marks it busy."""
    try:
        cpu = backend.cpu_seconds(job_id, tr.attempt)
        gpu = backend.gpu_percent(job_id, tr.attempt)
    except Exception:  # noqa: BLE001 - a reading that fails is no reason to end anything
        log.exception("job %s: cannot read how busy it is", job_id)
        return
    if cpu is not None and tr.cpu is not None and cpu >= tr.cpu and now > tr.cpu_at:
        tr.measured = True
        if (cpu - tr.cpu) / (now - tr.cpu_at) * 100 >= below:
            tr.busy_at = now
    if gpu is not None:
        tr.measured = True
        if gpu >= below:
            tr.busy_at = now
    tr.cpu, tr.cpu_at = cpu, now
