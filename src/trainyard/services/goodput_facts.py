"""An attempt's facts for the goodput split (services/goodput.py), gathered from the store and the job dir.

Both the loop (an ended attempt's ledger, `control/rules/ledger.py`) and the reports (a running
attempt, split live when read) gather them here, alike:
- the runtime's per-rank phase files (`JobDir.phases_file`), the job's own: read through `jobfs`
  (no link followed, no FIFO or device opened, at most `contracts.PHASES_MAX_BYTES` of each); a
  file refused, too big or not JSON (nested too deep to decode among them) is absent, as is one of
  another attempt or rank;
- the attempt's telemetry (`gpu_samples`, at most MAX_SAMPLES rows) and first output;
- when its class's idle policy found it idle (the `job.idle` event of a requeue or cancel);
- the idle threshold: the class's idle policy's `below` (percent) where the configuration has one,
  else `goodput.DEFAULT_IDLE_BELOW`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.contracts import PHASES_MAX_BYTES, JobDir
from trainyard.services.goodput import DEFAULT_IDLE_BELOW, AttemptFacts, RankPhases, Sample, parse_phases
from trainyard.services.ranks import ranks_for
from trainyard.spec import idle
from trainyard.spec.models import ConfigSpec
from trainyard.store.models import EventRow, GpuSampleRow

MAX_RANKS = 4096  # phase files read per attempt at most
MAX_SAMPLES = 200_000  # telemetry rows read per attempt at most


def idle_below(spec: ConfigSpec | None, job_class: str) -> float:
    """The class's idle threshold in percent: its idle policy's `below` (`spec/idle.py`, either
    form), else (no such policy, no configuration) `goodput.DEFAULT_IDLE_BELOW`."""
    policy = idle.policies(spec).get(job_class) if spec is not None else None
    return policy.below if policy is not None else DEFAULT_IDLE_BELOW


def read_phase(jd: JobDir, attempt: int, rank: int) -> RankPhases | None:
    """One rank's phase file of the attempt, when it is there and whole (see the module docstring):
    the one way the plane reads it (the ledger here, the straggler step in control/loop/rank_phases.py)."""
    return parse_phases(jobfs.Tree(jd.root).read_json(jd.phases_file(attempt, rank), limit=PHASES_MAX_BYTES),
                        attempt, rank)


def read_phases(jd: JobDir, attempt: int, nranks: int) -> tuple[RankPhases, ...]:
    """Each rank's phase file of the attempt that is there and whole."""
    return tuple(r for rank in range(min(nranks, MAX_RANKS)) if (r := read_phase(jd, attempt, rank)) is not None)


def samples(s: Session, job_id: int, attempt: int) -> tuple[Sample, ...]:
    q = (select(GpuSampleRow.time, GpuSampleRow.period_s, GpuSampleRow.util)
         .where(GpuSampleRow.job_id == job_id, GpuSampleRow.attempt == attempt)
         .order_by(GpuSampleRow.time).limit(MAX_SAMPLES))
    return tuple(Sample(t, p, u) for t, p, u in s.execute(q))


def idle_since(s: Session, job_id: int, attempt: int) -> float | None:
    """When the attempt went idle, if its class's idle policy requeued or cancelled it for that (the
    `job.idle` event: control/loop/idle_actions.py); None otherwise."""
    q = (select(EventRow.data).where(EventRow.job_id == job_id, EventRow.kind == "job.idle")
         .order_by(EventRow.id.desc()).limit(5))
    for data in s.scalars(q):
        if isinstance(data, dict) and data.get("attempt") == attempt and data.get("done") in ("requeue", "cancel") \
                and isinstance(since := data.get("idle_since"), (int, float)) and not isinstance(since, bool):
            return float(since)
    return None


def attempt_facts(s: Session, a: Any, now: float, *, jd: JobDir | None, tasks_per_node: int | None,
                  stop_at: float | None, below: float, telemetry: bool = True) -> AttemptFacts:
    """The facts of attempt `a` (an `AttemptRow`, or a row of its columns; running: up to `now`);
    `jd` None reads no phase file, `telemetry` False no sample."""
    running = a.ended_at is None
    nranks = len(ranks_for(a.placement or [], tasks_per_node)) if jd is not None else 0
    return AttemptFacts(start=a.started_at, end=now if running else float(a.ended_at or now), gpus=a.gpus or 0,
                        lost_gpu_s=a.lost_gpu_s or 0.0, stop_at=stop_at, running=running,
                        ranks=read_phases(jd, a.attempt, nranks) if jd is not None else (),
                        first_output_at=a.first_output_at, samples=samples(s, a.job_id, a.attempt) if telemetry else (),
                        idle_below=below, idle_from=idle_since(s, a.job_id, a.attempt))
