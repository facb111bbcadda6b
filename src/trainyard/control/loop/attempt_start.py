"""Starting an attempt: its row (committed first), the job directory, the launch, and a failed launch.

`start` runs inside the schedule step's transaction: it moves the job to RUNNING
(`transitions.start_attempt`), mints the attempt's job token and returns the `LaunchSpec` (with the
job's --mem / --mem-per-gpu / --cpus-per-task and the configuration's pids limit as its `limits`).
`launch` runs after the commit: it prepares the job directory (the batch script, Slurm's
`--output` links) and asks the backend to start every rank; a launch the backend refuses (no
such program, workdir gone, …) fails the job as the user's error.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.backends.base import BackendError, Constraints, ContainerLaunch, LaunchSpec, Limits
from trainyard.contracts import JobDir, JobInfo, JobVar
from trainyard.control.jobfiles import claim, ownership
from trainyard.control.loop import checkpoint_fetch, data_staging, fingerprints, image_pull
from trainyard.control.loop.context import LoopContext
from trainyard.services import auth, checkpoint_copies, owners, transitions
from trainyard.services.errors import Forbidden
from trainyard.services.jobs import LAUNCH_FAILED_HELD
from trainyard.services.output_paths import relative_to_workdir
from trainyard.services.events import record
from trainyard.spec import io_patterns
from trainyard.spec.container import ContainerOptions
from trainyard.states import AttemptOutcome, JobState
from trainyard.store import identity
from trainyard.store.models import JobRow

if TYPE_CHECKING:
    from trainyard.control.loop.snapshot import NodeIndex
    from trainyard.sched.cluster import Placement

log = logging.getLogger("trainyard.loop")
# SLURM_SUBMIT_HOST: jobs reach the plane over HTTP, so the host they were submitted to is the plane's.
SUBMIT_HOST = socket.gethostname()


def start(ctx: LoopContext, s: Session, j: JobRow, idx: NodeIndex, placement: Placement, cluster: str,
          now: float) -> LaunchSpec:
    """Commit-side half of a start: the job is RUNNING on the engine's `placement` (its rows
    stored, `idx.to_rows`); returns what to launch, its ranks from the same decision
    (`idx.ranks`). `cluster`: the configuration's cluster name (SLURM_CLUSTER_NAME)."""
    rows = idx.to_rows(placement)
    container = ContainerOptions.from_record(j.container) if j.container else None
    configuring = image_pull.IMAGE_PULL if container else data_staging.DATA_STAGING if j.datasets else None
    transitions.start_attempt(s, j, rows, now, configuring=configuring)
    jd = ctx.job_dir(j)
    env = dict(j.env)
    if ctx.api_url:
        env[JobVar.API] = ctx.api_url
    env[JobVar.TOKEN] = auth.create_token(s, user=f"job-{j.id}", role="job", team=j.team,
                                               by=auth.SYSTEM, job_id=j.id)
    command = list(j.command) if j.command else ["/bin/bash", str(jd.script)]
    j.pids_max = pids_limit(ctx, s, j)
    info = job_info(j, rows, cluster)
    return LaunchSpec(job_id=j.id, attempt=j.attempt, command=command, workdir=j.workdir, job_dir=str(jd.root),
                      ranks=idx.ranks(placement, j.tasks_per_node), env=env,
                      checkpoint_dir=str(jd.checkpoints), job=info,
                      limits=Limits(j.mem_mib, j.mem_per_gpu_mib, j.cpus_per_task, j.pids_max), batch=not j.command,
                      stderr_apart=stderr_apart(j.output, j.error),
                      constraints=Constraints(j.constraint, j.gpu_model, tuple(j.exclude_nodes or ()), bool(j.exclusive)),
                      container=ContainerLaunch(container, container.image, j.image_digest or "") if container else None,
                      datasets=data_staging.refs_of(j.datasets),
                      may_fetch=j.attempt > 1 and checkpoint_copies.newest_archived(s, j.id) is not None)


def job_info(j: JobRow, placement: list[dict[str, Any]], cluster: str) -> JobInfo:
    """The SLURM variables of the job's options (`contracts.JobInfo`): what sbatch would set for
    them. The GPUs are those the attempt holds (an --exclusive job's are its nodes' every GPU); a
    memory limit that --mem-per-cpu gave is SLURM_MEM_PER_CPU (in the job's env), not per node."""
    per_node = {len(p["gpus"]) for p in placement}
    held = sum(len(p["gpus"]) for p in placement)
    return JobInfo(name=j.name, team=j.team, pool=j.pool, job_class=j.job_class, cluster=cluster,
                   submit_dir=j.workdir, submit_host=SUBMIT_HOST, tasks_per_node=j.tasks_per_node,
                   cpus_per_task=j.cpus_per_task,
                   gpus_per_node=per_node.pop() if len(per_node) == 1 else None, gpus=held or None,
                   mem_per_node_mib=None if "SLURM_MEM_PER_CPU" in (j.env or {}) else j.mem_mib,
                   mem_per_gpu_mib=j.mem_per_gpu_mib)


def pids_limit(ctx: LoopContext, s: Session, j: JobRow) -> int:
    """The job's pids limit per node: the configuration's for its team, else its class, else the
    built-in default (`spec.models.ConfigSpec.pids_max_for`), as it is when this attempt starts."""
    return ctx.configs.current(s).spec.pids_max_for(j.team, j.job_class)


def stderr_apart(output: str | None, error: str | None) -> bool:
    """Whether the ranks' stderr goes to a file of its own: `-e/--error` given, and not the very
    pattern of `--output` (then both share the file, as in Slurm)."""
    return error is not None and error != output


def launch(ctx: LoopContext, spec: LaunchSpec, now: float) -> None:
    """Backend-side half of a start, after the commit: who the job runs as (`owners.resolve`,
    asked again: an account may have gone since the submit), its directory claimed
    (`claim.claim`) and made for that account (`ownership.prepare`), then the backend. A job with no one left to run as fails as a launch
    the backend refused does."""
    jd = JobDir(spec.job_dir)
    try:
        with ctx.store.session() as s:
            j = s.get(JobRow, spec.job_id)
            if j is None:
                return  # gone meanwhile (nothing deletes jobs today)
            script, output, error, name, user = j.script, j.output, j.error, j.name, j.user
            truncate = j.open_mode == "truncate"
            if script is None and not j.command and j.array_job_id not in (None, j.id):
                first = s.get(JobRow, j.array_job_id)  # an array's script is stored once, with its first task
                script = first.script if first is not None else None
            array = (j.array_job_id, j.array_task_id)
            owner = claim.owner_record(identity.instance_id(s), j.id, j.dir_key)
            adopt = j.dir_key is None and spec.attempt > 1  # a job from before keys, that ran before
            cfg = ctx.configs.current(s)
            cls = next((c for c in cfg.spec.classes if c.name == j.job_class), None)
            limits = [x for x in (j.time_limit_s, cls.max_run_time if cls else None) if x]
        who = owners.resolve(cfg.spec, user, spec.job.team)
        if (blocked := owners.blocked_at(jd.root.parent.parent, who.owner)) is not None:
            raise BackendError(f"{who.owner.user!r}, the account the job runs as, cannot reach its job dir: "
                               f"{blocked} does not let it in (put the data dir where every account may pass)")
        try:
            claim.claim(jd, owner, adopt_unmarked=adopt)
        except claim.ForeignJobDir as e:
            _hold_foreign(ctx, spec, str(e), now)
            return
        # The plane ends a job at its time limit (control/loop/stops.py: SIGTERM, the class's grace, SIGKILL
        # after kill_wait); a backend that can enforce a limit of its own (Slurm's --time) gets the
        # moment by which the plane has surely done so, as a backstop that never cuts a grace short.
        backstop = min(limits) + (cls.grace_period if cls else 60.0) + ctx.params.kill_wait_s if limits else None
        spec = replace(spec, owner=who.launch_owner, time_limit_s=backstop)
        ownership.prepare(jd, who, [r.rank for r in spec.ranks], script, errors=spec.stderr_apart,
                          truncate=truncate)
        if spec.container is not None:  # pinned and on every node first (CONFIGURING, ImagePull)
            pulled = image_pull.prepare(ctx, spec)
            if pulled is None:
                return
            spec = pulled
        elif not fingerprints.enforce(ctx, spec, cfg.spec.images.fingerprint):
            return
        if spec.datasets:  # staged on every node next (CONFIGURING, DataStaging): the job's startup
            staged = data_staging.prepare(ctx, spec)
            if staged is None:
                return
            spec = staged
        if (fetched := checkpoint_fetch.prepare(ctx, spec, who)) is None:  # resume across tiers (issue 41)
            return
        spec = fetched
        if output:
            link_outputs(output, spec, name, jd, array, user=user)
        if error and spec.stderr_apart:
            link_outputs(error, spec, name, jd, array, user=user, option="--error", target=jd.rank_err)
        ctx.backend.launch(spec)
    except (BackendError, OSError, Forbidden) as e:
        cause = e.message if isinstance(e, Forbidden) else e
        with ctx.lock, ctx.store.session.begin() as s:
            j = s.get(JobRow, spec.job_id)
            if j is not None and j.attempt == spec.attempt and j.state in (JobState.RUNNING, JobState.CONFIGURING):
                why = f"UserError: cannot launch: {cause}"  # no such program, workdir gone, …
                transitions.end_attempt(s, j, AttemptOutcome.FAILED, why, now, cause="user_error")
                transitions.finish(j, JobState.FAILED, why, now)
                record(s, "backend", "job.failed", f"launch failed: {cause}", job_id=j.id, at=now)


def _hold_foreign(ctx: LoopContext, spec: LaunchSpec, why: str, now: float) -> None:
    """The job's directory is not its own (`control/jobfiles/claim.py`): nothing was launched; the job
    goes back to the queue held, as Slurm's "launch failed requeued held", until an admin has
    looked at the directory, moved it aside and released the job."""
    log.warning("job %s: launch refused: %s", spec.job_id, why)
    with ctx.lock, ctx.store.session.begin() as s:
        j = s.get(JobRow, spec.job_id)
        if j is None or j.attempt != spec.attempt or j.state not in (JobState.RUNNING, JobState.CONFIGURING):
            return
        transitions.end_attempt(s, j, AttemptOutcome.REQUEUED, f"launch refused: {why}"[:200], now)
        transitions.back_to_queue(j, now, LAUNCH_FAILED_HELD)
        j.held, j.eligible_time = True, None
        record(s, "scheduler", "job.launch_refused",
               f"attempt {spec.attempt} not launched: {why}; held until an admin moves the directory aside and "
               "releases the job", job_id=j.id, at=now, data={"job_dir": spec.job_dir, "attempt": spec.attempt})


def link_outputs(pattern: str, spec: LaunchSpec, name: str, jd: JobDir,
                 array: tuple[int | None, int | None] = (None, None), *, user: str = "",
                 option: str = "--output", target: Callable[[int], Path] | None = None) -> None:
    """Slurm's `--output` (or `--error`: `option`, linked to `target`, the ranks' stderr files):
    make the asked-for path(s) point at the rank logs, with Slurm's filename patterns
    (`io_patterns`: %j id, %t rank, %x name, %u user, %N node, %A an array's id and %a the
    task's index; outside an array, the job's id and 0).

    The control plane may run with more rights than the job's owner, so the links are made *as
    the owner* (`jobfs.as_owner`: the kernel checks each step as for the owner, as slurmstepd opens
    a job's output as the user), inside the job's working directory through no symbolic link below
    it (`jobfs.link_inside`), anywhere else the owner may write (`jobfs.link_at`), replacing
    nothing but an older symlink; what cannot be made is skipped (the log stays in the job dir).
    Submission has refused what it could see (`services/output_paths.py`). The links and the
    directories made for them are the owner's.
    """
    target = target or jd.rank_log
    safe_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in name).lstrip(".") or "job"
    safe_user = "".join(c if c.isalnum() or c in "-_." else "_" for c in user).lstrip(".") or "user"
    aid, index = array
    nodes = list(dict.fromkeys(r.node for r in sorted(spec.ranks, key=lambda r: r.rank)))
    per_rank = io_patterns.uses(pattern, "tNn")
    per_task = io_patterns.uses(pattern, "t")
    linked: set[Path] = set()
    for r in sorted(spec.ranks, key=lambda r: r.rank):
        if r.rank > 0 and not per_rank:
            break
        if r.rank > 0 and spec.batch and not per_task:
            break  # a script's other tasks write to srun's output, the script's own
        step = "batch" if spec.batch else "0"
        values = {"A": str(spec.job_id if aid is None else aid), "a": str(index or 0), "b": str((index or 0) % 10),
                  "j": str(spec.job_id), "J": f"{spec.job_id}.{step}", "s": step, "N": r.node,
                  "n": str(nodes.index(r.node)), "t": str(r.rank), "u": safe_user, "x": safe_name}
        path = Path(io_patterns.expand(pattern, values))
        if path in linked:
            continue  # `%N` without `%t`: a node's first rank has its file (a link shows one log)
        linked.add(path)
        rel = relative_to_workdir(path, spec.workdir)
        try:
            if rel is None:  # elsewhere: wherever the owner may write (the owner's rights decide)
                jobfs.as_owner(spec.owner, jobfs.link_at, os.path.normpath(path), str(target(r.rank)))
            else:
                jobfs.as_owner(spec.owner, jobfs.link_inside, spec.workdir, str(rel), str(target(r.rank)))
        except jobfs.Refused as e:
            log.warning("job %s: %s %s not linked: %s", spec.job_id, option, path, e)
        except OSError as e:
            log.warning("job %s: cannot link %s %s: %s", spec.job_id, option, path, e)
