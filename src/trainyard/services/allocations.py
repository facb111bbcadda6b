"""Interactive allocations (issue 38: `yard alloc`, `yard srun --pty`, `yard notebook`): what the
plane makes of one at submit, how its session's end ends it, and salloc's "relinquish".

At submit (`jobs.with_defaults` asks `defaults`): a job with `interactive: {"kind": ...}` and
neither a command nor a script runs the plane's *hold*, `HOLD_SCRIPT`: a batch script, so it runs
once, as rank 0 on the first node, with the whole allocation's environment (SLURM_JOB_ID,
SLURM_JOB_NODELIST, CUDA_VISIBLE_DEVICES, the in-job `srun`), and does nothing but wait with
`/bin/sh` and `sleep` (in any image) until the plane ends it. A session terminal
(`api/terminal.py`, `session=1`) opens in that rank, so a shell there has the environment a Slurm
allocation's interactive step has and its `srun` spreads tasks over the allocation. Without a
class, it gets the configuration's `interactive.class` when that names a configured class, else
the default class. No `slurm-%j.out` is written for it (salloc writes none): the hold's output
goes to the job's own log.

The end: when the session's process exits (`end_session`, from the pump), the exit code is stored
in `jobs.interactive["exit"]` and the job is stopped with `StopKind.SESSION` (straight to SIGTERM):
COMPLETED for 0, FAILED NonZeroExitCode otherwise (control/rules/outcome.py), and a
`job.session_end` event records it. A client that goes away ends nothing here: the loop's
connection grace does (control/loop/interactive.py). `release` is `POST /jobs/{id}/release` for an
allocation that is not held: ended as a session exiting 0 when it runs, cancelled when it waits
("released before it started"); a held job's release stays `jobs.release` (scontrol's).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy.orm import Session

from trainyard.services import events, transitions
from trainyard.services.auth import Principal
from trainyard.services.config import ConfigVersion
from trainyard.services.errors import Conflict
from trainyard.services.plane_facade import Plane
from trainyard.states import ACTIVE_STATES, PENDING_STATES, JobState, StopKind
from trainyard.store.models import JobRow

Kind = Literal["alloc", "srun", "notebook"]

# The hold: a batch script that waits until the plane ends the allocation. `exec` is not used so
# that the script's shell stays the rank's process (a terminal joins its environment); a SIGTERM
# ends the shell at once (no trap), and the stop signals every process of the rank anyway.
HOLD_SCRIPT = """#!/bin/sh
# trainyard: an interactive allocation (yard alloc). It holds its nodes until its session ends,
# it is released or cancelled, its connection grace passes or its time limit is reached.
while :; do sleep 3600; done
"""


class InteractiveAsk(BaseModel):
    """The submit's `interactive` field: which interactive command made the job and, for `yard
    notebook` (cli/notebook.py), where JupyterLab listens in the job (`port`), its token and the
    local URL its client serves it on (`url`, with the token: the dashboard's "Open notebook"
    link). The token and the URL are the owner's secret: `shown` keeps them from everyone else."""

    model_config = ConfigDict(extra="forbid")

    kind: Kind
    port: int | None = Field(None, ge=1, le=65535)
    token: str | None = Field(None, min_length=16, max_length=128, pattern=r"^[A-Za-z0-9_-]+$")
    url: str | None = Field(None, max_length=2000, pattern=r"^https?://[^\s]+$")

    @model_validator(mode="after")
    def _notebook_only(self) -> "InteractiveAsk":
        given = [k for k in ("port", "token", "url") if getattr(self, k) is not None]
        if given and self.kind != "notebook":
            raise ValueError(f"interactive.{given[0]}: only a notebook (kind notebook) has one")
        return self


def defaults(ask: InteractiveAsk, name: str, command: list[str], script: str | None, job_class: str | None,
             cfg: ConfigVersion) -> dict[str, Any]:
    """What an interactive submission gets that it did not give: the hold as its script (and the
    name salloc gives such a job, "interactive"), its class (see the module docstring). The fields
    to update, or none."""
    update: dict[str, Any] = {}
    if not command and script is None:
        update["script"] = HOLD_SCRIPT
        if not name:
            update["name"] = "interactive"
    if job_class is None:
        wanted = cfg.spec.interactive.class_name
        update["job_class"] = wanted if any(c.name == wanted for c in cfg.spec.classes) else cfg.spec.default_class
    return update


def record_of(ask: InteractiveAsk | None) -> dict[str, Any] | None:
    """The stored `jobs.interactive` of a submission."""
    return None if ask is None else ask.model_dump(exclude_none=True)


SECRET = ("token", "url")  # a notebook's: whoever has them uses the owner's JupyterLab


def public(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    """What anyone who sees the job sees of its interactive record: not a notebook's token or URL."""
    return None if rec is None else {k: v for k, v in rec.items() if k not in SECRET}


def shown(rec: dict[str, Any] | None, by: Principal | None, job: JobRow) -> dict[str, Any] | None:
    """The record as `by` may see it: whole for the job's owner (a member token of its team), admins
    and the job's own token (the notebook's script reads its token with it: cli/notebook.py);
    `public` for the rest. Others of the team read the job's env, command and logs, so the token is
    in none of them."""
    if rec is None or by is None or by.is_admin or by.job_id == job.id or \
            (by.role == "member" and by.team == job.team and by.user == job.user):
        return rec
    return public(rec)


def end_session(s: Session, job_id: int, code: int, now: float, *, actor: str) -> bool:
    """The session's process of running allocation `job_id` exited with `code`: stored, the event
    recorded and, unless the job is stopping already, the stop requested. True when it was (the
    caller wakes the loop)."""
    row = s.get(JobRow, job_id)
    if row is None or row.interactive is None:
        return False
    stopping = row.stop_kind is not None or row.state not in ACTIVE_STATES
    events.record(s, actor, "job.session_end", f"the session exited with code {code}"
                  + ("" if not stopping else " (the allocation was ending already)"),
                  job_id=job_id, at=now, data={"exit": code})
    if stopping:
        return False
    row.interactive = {**row.interactive, "exit": code}  # a new dict: the JSON column sees the change
    transitions.request_stop(s, row, StopKind.SESSION, now, actor=actor, event="job.stop_requested",
                             message=f"the session exited with code {code}; ending the allocation")
    return True


def relinquish(s: Session, plane: Plane, job_id: int, by: Principal, now: float) -> JobRow:
    """salloc's relinquish: a running allocation ends as its session exiting 0 would (COMPLETED), a
    waiting one is cancelled ("released before it started").

    Raises:
        NotFound, Forbidden: as `terminals.check_attach`. Conflict: not an interactive job, or one
            that has ended (or is ending).
    """
    from trainyard.services import terminals  # it imports jobs, which imports this module

    row = terminals.check_attach(s, plane, by, job_id, "release an allocation")
    if row.interactive is None:
        raise Conflict(f"job {job_id} is not an interactive allocation (release ends one; "
                       "a held job is released by `yard release`)")
    if row.state in PENDING_STATES:
        transitions.cancel_waiting(s, row, now, "released before it started", actor=by.user,
                                   message=f"released by {by.user} before it started")
        return row
    if row.state != JobState.RUNNING or row.stop_kind is not None:
        raise Conflict(f"job {job_id} is {row.state}{' and ending' if row.stop_kind else ''}: nothing to release")
    row.interactive = {**row.interactive, "exit": 0}
    transitions.request_stop(s, row, StopKind.SESSION, now, actor=by.user, event="job.released",
                             message=f"allocation released by {by.user}; ending it")
    return row


def release(plane: Plane, job_id: int, by: Principal) -> dict[str, Any]:
    """`POST /api/v1/jobs/{id}/release`: a held job's hold released (`jobs.release`, scontrol's),
    an interactive allocation that is not held relinquished (`relinquish`); the loop told."""
    from trainyard.services import jobs  # it imports this module

    with plane.transaction() as s:
        row = s.get(JobRow, job_id)
        if row is not None and row.interactive is not None and not row.held:
            row = relinquish(s, plane, job_id, by, plane.clock())
        else:
            row = jobs.release(s, job_id, by, now=plane.clock())
        out = jobs.job_dict(row, by)
    plane.wake()
    return out
