"""Progress reports from the in-job runtime (`trainyard.runtime.progress`): step, checkpoint, metrics.

Optional by design (design rule 4): the control plane also reads checkpoints and exit codes from
disk. A report refreshes the job's `progress` and, when it names a newer checkpoint of the
current attempt, the `last_checkpoint` the engine weighs when it chooses victims; peak memory
among its metrics (`max_rss_mib`, `peak_gpu_mem_mib`) raises the attempt's, for `yard acct`. Reports of an
older attempt are ignored (a late packet must not move a newer attempt backwards).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard import figures
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, NotFound
from trainyard.services.events import record
from trainyard.store.models import AttemptRow, JobRow


# Peak memory the runtime may report among its metrics (`runtime.metrics.peak_memory`), kept per attempt.
PEAKS = ("max_rss_mib", "peak_gpu_mem_mib")


class ProgressReport(BaseModel):
    model_config = ConfigDict(extra="ignore")

    attempt: int = Field(ge=1, le=2**31 - 1)
    step: int = Field(ge=0, le=2**62)
    time: float = Field(ge=0, le=1e11)
    event: Literal["start", "resume", "progress", "checkpoint", "preempted", "finished"] = "progress"
    last_checkpoint_step: int | None = Field(None, ge=0, le=2**62)
    last_checkpoint_time: float | None = Field(None, ge=0, le=1e11)
    metrics: dict[str, float | int | str | None] = Field(default_factory=dict, max_length=100)

    @field_validator("metrics")
    @classmethod
    def _finite(cls, v: dict[str, Any]) -> dict[str, Any]:
        for k, x in v.items():
            # JSON has no NaN (a diverged loss is reported as null), and an integer beyond 64 bits
            # breaks whoever reads it as a number (the dashboard's queue, a client): null too.
            v[k] = figures.json_number(x)
            if isinstance(x, str) and len(x) > 200:
                v[k] = x[:200]
        return v


def report(s: Session, job_id: int, rep: ProgressReport, by: Principal) -> dict[str, Any]:
    row = s.get(JobRow, job_id)
    if row is None:
        raise NotFound(f"no job {job_id}")
    if not (by.is_admin or (by.role == "job" and by.job_id == job_id)):
        raise Forbidden("only the job itself (its TRAINYARD_TOKEN) or an admin reports its progress")
    if rep.attempt != row.attempt or row.state not in ("RUNNING", "COMPLETING"):
        return {"accepted": False, "why": f"job {job_id} is {row.state}, attempt {row.attempt}"}
    row.progress = rep.model_dump()
    peaks = {k: float(v) for k in PEAKS if isinstance((v := rep.metrics.get(k)), (int, float))
             and not isinstance(v, bool) and 0 <= v < 1e12}
    att = None
    if rep.event not in ("start", "resume") or peaks:
        att = s.scalars(select(AttemptRow).where(AttemptRow.job_id == job_id, AttemptRow.attempt == rep.attempt)).first()
    if att is not None:
        if rep.event not in ("start", "resume") and att.first_step_at is None:
            att.first_step_at = rep.time  # a step finished in this attempt: recovery is over
        for k, v in peaks.items():  # the attempt keeps the highest value reported (`yard acct`)
            if getattr(att, k) is None or v > getattr(att, k):
                setattr(att, k, v)
    t = rep.last_checkpoint_time
    if t is not None and row.start_time is not None and t >= row.start_time and \
            (row.last_checkpoint is None or t > row.last_checkpoint):
        row.last_checkpoint = t
    if rep.event != "progress":
        record(s, by.user, f"job.runtime.{rep.event}",
               f"runtime: {rep.event} at step {rep.step}"
               + (f", last checkpoint step {rep.last_checkpoint_step}" if rep.last_checkpoint_step is not None else ""),
               job_id=job_id, data={"step": rep.step, "attempt": rep.attempt})
    return {"accepted": True}
