"""A step of each pass: idle interactive allocations give their GPUs back (issue 38, Deliver 5).

An allocation (`jobs.interactive` set: `yard alloc`, `yard srun --pty`, `yard notebook`) of a
class with `idle_timeout` is idle while nobody uses it: no terminal or forwarded-port input, its
processes below `interactive.idle_cpu_percent` of one CPU, and its GPUs (where NVML reads them)
below the same share. Per running allocation:

    idle since = the latest of: its start (or when this loop first saw it: a restarted plane
                 gives every allocation its whole timeout again), its last input
                 (`Sessions.last_input`), the last sample its CPU or GPU was busy
    at idle_timeout - idle_warning    once per idle stretch: a line to every attached terminal
                                      (`Sessions.warn`), the owner's webhook (an IDLE_WARNING
                                      note, whatever the job's mail types), event `job.idle_warning`
    at idle_timeout                   stop (`StopKind.IDLE`: SIGTERM, then SIGKILL; the job ends
                                      TIMEOUT, reason IdleTimeout), event `job.idle_timeout`

Input or use after the warning starts a new stretch, with a warning of its own when that one runs
out too. The CPU rate is the difference of two `Backend.cpu_seconds` readings over the time between
them, read at most every `SAMPLE_S` per job (sooner for a short timeout, so a stretch is judged
from several samples); the readings are kept here, in memory. A backend that cannot tell (None,
as Slurm's) leaves input alone to judge. The step runs before the stops, so an allocation that
runs out is signalled in the same pass.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy import select

from trainyard.control.loop.context import LoopContext
from trainyard.services import notices, transitions
from trainyard.services.events import record
from trainyard.services.sessions import Sessions
from trainyard.states import JobState, StopKind
from trainyard.store.models import JobRow

log = logging.getLogger("trainyard.loop")
SAMPLE_S = 5.0  # the longest between two CPU readings of one job
MIN_SAMPLE_S = 0.5  # the shortest (a timeout of seconds, in tests)
ACTOR = "scheduler"


@dataclass
class _Track:
    """What this step remembers of one running allocation (its current attempt)."""

    attempt: int
    seen: float  # when this loop first saw the attempt running
    cpu: float | None = None  # the last CPU reading, and when
    cpu_at: float = 0.0
    busy_at: float | None = None  # the last sample its CPU or GPU was at or above the threshold
    warned: float | None = None  # the `idle since` of the stretch already warned about


def sample_every(idle_timeout: float) -> float:
    """How often one job's CPU is read: every few seconds, and at least eight times a timeout."""
    return min(SAMPLE_S, max(MIN_SAMPLE_S, idle_timeout / 8))


def when(t: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(t))


class IdleAllocations:
    """The step (module docstring); the plane's terminals and ports are `ctx.sessions`."""

    def __init__(self, ctx: LoopContext) -> None:
        self.ctx = ctx
        self._tracks: dict[int, _Track] = {}

    def run(self, now: float) -> None:
        ctx, sessions = self.ctx, self.ctx.sessions
        if sessions is None:  # no API attaches here (a loop tested alone): nothing is watched
            return
        with ctx.store.session() as s:
            spec = ctx.configs.current(s).spec
            timeouts = {c.name: c.idle_timeout for c in spec.classes if c.idle_timeout}
            # `interactive` is judged here, not in SQL: a JSON column's None may be stored as 'null'
            rows = [(j.id, j.attempt, j.job_class, j.start_time) for j in s.scalars(
                select(JobRow).where(JobRow.state == JobState.RUNNING, JobRow.job_class.in_(timeouts),
                                     JobRow.stop_kind.is_(None))) if j.interactive] if timeouts else []
        threshold, warning = spec.interactive.idle_cpu_percent, spec.interactive.idle_warning
        live = set()
        for job_id, attempt, job_class, started in rows:
            timeout = timeouts.get(job_class)
            if timeout is None:
                continue
            live.add(job_id)
            tr = self._tracks.get(job_id)
            if tr is None or tr.attempt != attempt:
                tr = self._tracks[job_id] = _Track(attempt, now)
            if now - tr.cpu_at >= sample_every(timeout) or tr.cpu is None:
                self._sample(job_id, tr, now, threshold)
            since = max(started or 0.0, tr.seen, sessions.last_input(job_id) or 0.0, tr.busy_at or 0.0)
            if now - since >= timeout:
                self._stop(job_id, attempt, now, since, timeout)
            elif now - since >= timeout - warning and tr.warned != since:
                tr.warned = since
                self._warn(sessions, job_id, attempt, now, since, since + timeout)
        for job_id in set(self._tracks) - live:
            del self._tracks[job_id]

    def _sample(self, job_id: int, tr: _Track, now: float, threshold: float) -> None:
        """Read the attempt's CPU (and GPU) now; a rate at or above `threshold` marks it busy."""
        backend = self.ctx.backend
        try:
            cpu = backend.cpu_seconds(job_id, tr.attempt)
            gpu = backend.gpu_percent(job_id, tr.attempt)
        except Exception:  # noqa: BLE001 - a reading that fails is no reason to end anything
            log.exception("job %s: cannot read how busy it is", job_id)
            return
        if cpu is not None and tr.cpu is not None and cpu >= tr.cpu and now > tr.cpu_at:
            if (cpu - tr.cpu) / (now - tr.cpu_at) * 100 >= threshold:
                tr.busy_at = now
        if gpu is not None and gpu >= threshold:
            tr.busy_at = now
        tr.cpu, tr.cpu_at = cpu, now

    def _warn(self, sessions: Sessions, job_id: int, attempt: int, now: float, since: float, ends: float) -> None:
        text = (f"job {job_id} has been idle for {now - since:.0f} s (no input, no CPU or GPU use); "
                f"it ends at {when(ends)} (in {max(0.0, ends - now):.0f} s) with reason IdleTimeout unless "
                "there is input: press any key to keep it")
        told = sessions.warn(job_id, text)
        with self.ctx.lock, self.ctx.store.session.begin() as s:
            j = s.get(JobRow, job_id)
            if j is None or j.state != JobState.RUNNING or j.attempt != attempt or j.stop_kind is not None:
                return
            record(s, ACTOR, "job.idle_warning", f"idle since {when(since)}: ends at {when(ends)} unless used",
                   job_id=job_id, at=now, data={"idle_since": since, "ends_at": ends, "terminals": told})
            notices.note(j, "idle_warning", now, s, always=True, extra={"idle_since": since, "idle_ends_at": ends})

    def _stop(self, job_id: int, attempt: int, now: float, since: float, timeout: float) -> None:
        with self.ctx.lock, self.ctx.store.session.begin() as s:
            j = s.get(JobRow, job_id)
            if j is None or j.state != JobState.RUNNING or j.attempt != attempt or j.stop_kind is not None:
                return
            transitions.request_stop(
                s, j, StopKind.IDLE, now, actor=ACTOR, event="job.idle_timeout", reason="IdleTimeout",
                message=f"idle since {when(since)} (idle_timeout {timeout:g} s: no input, no CPU or GPU use)",
                data={"idle_since": since, "idle_timeout": timeout})
        self._tracks.pop(job_id, None)
