"""Starting an attempt: its row (committed first), the job directory, the launch, and a failed launch.

`start` runs inside the schedule step's transaction: it moves the job to RUNNING
(`transitions.start_attempt`), mints the attempt's job token and returns the `LaunchSpec`.
`launch` runs after the commit: it prepares the job directory (the batch script, Slurm's
`--output` links) and asks the backend to start every rank; a launch the backend refuses (no
such program, workdir gone, …) fails the job as the user's error.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from trainyard.backends.base import BackendError, LaunchSpec
from trainyard.contracts import JobDir, JobInfo
from trainyard.control.context import LoopContext
from trainyard.services import auth, transitions
from trainyard.services.events import record
from trainyard.services.ranks import ranks_for
from trainyard.states import AttemptOutcome, JobState
from trainyard.store.models import JobRow

log = logging.getLogger("trainyard.loop")
# SLURM_SUBMIT_HOST: jobs reach the plane over HTTP, so the host they were submitted to is the plane's.
SUBMIT_HOST = socket.gethostname()


def start(ctx: LoopContext, s: Session, j: JobRow, placement: list[dict[str, Any]], cluster: str,
          now: float) -> LaunchSpec:
    """Commit-side half of a start: the job is RUNNING on `placement`; returns what to launch.
    `cluster`: the configuration's cluster name (SLURM_CLUSTER_NAME)."""
    transitions.start_attempt(s, j, placement, now)
    jd = ctx.job_dir(j.id)
    env = dict(j.env)
    if ctx.api_url:
        env["TRAINYARD_API"] = ctx.api_url
    env["TRAINYARD_TOKEN"] = auth.create_token(s, user=f"job-{j.id}", role="job", team=j.team,
                                               by=auth.SYSTEM, job_id=j.id)
    command = list(j.command) if j.command else ["/bin/bash", str(jd.script)]
    info = JobInfo(name=j.name, team=j.team, pool=j.pool, job_class=j.job_class, cluster=cluster,
                   submit_dir=j.workdir, submit_host=SUBMIT_HOST, tasks_per_node=j.tasks_per_node)
    return LaunchSpec(job_id=j.id, attempt=j.attempt, command=command, workdir=j.workdir, job_dir=str(jd.root),
                      ranks=ranks_for(placement, j.tasks_per_node), env=env,
                      checkpoint_dir=str(jd.checkpoints), job=info)


def launch(ctx: LoopContext, spec: LaunchSpec, now: float) -> None:
    """Backend-side half of a start, after the commit."""
    jd = JobDir(spec.job_dir)
    try:
        jd.create()
        with ctx.store.session() as s:
            j = s.get(JobRow, spec.job_id)
            script = j.script if j is not None else None
            output = j.output if j is not None else None
            name = j.name if j is not None else ""
            array = (j.array_job_id, j.array_task_id) if j is not None else (None, None)
        if script is not None and not jd.script.exists():
            jd.script.write_text(script)
        if output:
            link_outputs(output, spec, name, jd, array)
        ctx.backend.launch(spec)
    except (BackendError, OSError) as e:
        with ctx.lock, ctx.store.session.begin() as s:
            j = s.get(JobRow, spec.job_id)
            if j is not None and j.attempt == spec.attempt and j.state == JobState.RUNNING:
                why = f"UserError: cannot launch: {e}"  # no such program, workdir gone, …
                transitions.end_attempt(s, j, AttemptOutcome.FAILED, why, now, cause="user_error")
                transitions.finish(j, JobState.FAILED, why, now)
                record(s, "backend", "job.failed", f"launch failed: {e}", job_id=j.id, at=now)


def link_outputs(pattern: str, spec: LaunchSpec, name: str, jd: JobDir,
                 array: tuple[int | None, int | None] = (None, None)) -> None:
    """Slurm's `--output`: make the asked-for path(s) point at the rank logs (%j id, %t rank, %x name,
    %A an array's id and %a the task's index; outside an array, the job's id and 0).

    The control plane may run with more rights than the job's owner, so it only ever creates a
    symlink inside the job's working directory, replaces nothing but an older symlink, and skips
    (the log stays in the job dir) whatever would land elsewhere.
    """
    workdir = Path(spec.workdir).resolve()
    safe_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".") or "job"
    for r in spec.ranks:
        if r.rank > 0 and "%t" not in pattern:
            break
        aid, index = array
        path = Path(pattern.replace("%j", str(spec.job_id)).replace("%t", str(r.rank)).replace("%x", safe_name)
                    .replace("%A", str(spec.job_id if aid is None else aid)).replace("%a", str(index or 0)))
        if not path.is_absolute():
            path = workdir / path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            where = path.parent.resolve() / path.name
            if not where.is_relative_to(workdir) or path.name in ("", ".", ".."):
                log.warning("job %s: --output %s is outside its working directory; not linked", spec.job_id, path)
                return
            if where.is_symlink():
                where.unlink()
            elif where.exists():
                log.warning("job %s: --output %s exists and is not a link; not replaced", spec.job_id, where)
                continue
            os.symlink(jd.rank_log(r.rank), where)
        except OSError as e:
            log.warning("job %s: cannot link --output %s: %s", spec.job_id, path, e)
