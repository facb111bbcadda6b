"""A batch script on the local backend, run as Slurm runs one (`LaunchSpec.batch`).

Slurm runs a batch script once, on the first node of the allocation, with the allocation's
environment, and the script's `srun` starts the tasks. The local backend does the same: the
attempt has one rank to run and report, 0, the script (`bash script.sh`, its exit the job's), and
this module prepares what it needs:

    <run-dir>/batch.json     the allocation, for our `srun`: every task slot (node, GPUs), the
                             job's GPUs and GPU device files per node, the job's id, attempt,
                             checkpoint dir, MASTER_ADDR/PORT and JobInfo (the plane's, 0644: no
                             secret in it; the job token stays in the environment)
    <run-dir>/bin/, tools/   srun, scontrol, squeue, sinfo: the attempt's own copy of the tools,
                             run by `job_python` as the owner (`job_tools.py`); batch.json also
                             holds the owner, time limit, start and the cluster's nodes for them
    <run-dir>/steps/         the owner's: one entry per step id taken

`bin/` goes first on the script's PATH, so `srun`/`scontrol`/`squeue`/`sinfo` are ours whatever the job's PATH holds.

The script's environment (`batch_env`) is the allocation's Slurm part as the batch step has it
(SLURM_JOB_NODELIST, SLURM_NNODES, SLURM_NTASKS, SLURM_TASKS_PER_NODE of the whole allocation;
SLURM_PROCID/LOCALID/NODEID 0; SLURM_GPUS_ON_NODE, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES the
job's GPUs on the first node), TRAINYARD_*, MASTER_ADDR/MASTER_PORT (free for the first step), and
none of the per-task variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
ROLE_*, TORCHELASTIC_*): Slurm's batch step has none of them, and with a WORLD_SIZE of the whole
allocation a `python train.py` run in the script itself would wait for ranks that never come.

The cell (`batch_needs`) has one rank: the script's, on the first node, allowed every GPU device
of the job (its tasks, srun's children, live in it), with the memory of every node's limit
together, and the CPUs of every task together (--cpus-per-task x tasks): the tasks share the cell, so
a limit per task is not applied in this form.
"""

from __future__ import annotations

import grp
import os
import time
from dataclasses import asdict
from pathlib import Path

from trainyard import jobfs
from trainyard.backends.rundir import job_tools
from trainyard.backends.base import LaunchSpec, NodeInfo
from trainyard.backends.contain import Needs, RankNeeds, attempt_key
from trainyard.backends.local.srun import BATCH_FILE, STEPS_DIR
from trainyard.contracts import EnvPart, Gang, JobDir, compress_hostlist, rank_env

PER_TASK = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


def bin_dir(run_dir: Path) -> Path:
    return run_dir / "bin"


def _who(spec: LaunchSpec) -> dict:
    """The job's user and group as `scontrol show job` names them (UserId=name(uid))."""
    uid, gid, user = (spec.owner.uid, spec.owner.gid, spec.owner.user) if spec.owner is not None else \
        (os.geteuid(), os.getegid(), "")
    if not user:
        import pwd

        try:
            user = pwd.getpwuid(uid).pw_name
        except KeyError:
            user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return {"user": user, "uid": uid, "group": group, "gid": gid}


def prepare(run_dir: Path, spec: LaunchSpec, gang: Gang, master_addr: str, master_port: int,
            devices: dict[str, list[str]], info_host: str, python: str,
            cluster_nodes: list[NodeInfo] | None = None) -> None:
    """Write batch.json, the tools (`job_tools.install`, run by `python`) and the steps dir (see
    the module docstring). `cluster_nodes`: every node of the backend, for the in-job `sinfo`.

    Raises:
        OSError: one cannot be written.
    """
    info = {**asdict(spec.job), "submit_host": spec.job.submit_host or info_host}
    jd = JobDir(Path(spec.job_dir))  # names only: nothing is opened here
    jobfs.write_record(run_dir / BATCH_FILE, {
        "job_id": spec.job_id, "attempt": spec.attempt, "checkpoint_dir": spec.checkpoint_dir,
        "workdir": spec.workdir, "job_dir": spec.job_dir, "master_addr": master_addr, "master_port": master_port,
        "info": info, "slots": [{"node": s.node, "gpus": [str(g) for g in s.gpus]} for s in gang.slots],
        "node_gpus": {n: gang.node_gpus(n) for n in gang.nodes}, "devices": devices,
        "stderr_apart": spec.stderr_apart, **_who(spec), "nodelist": compress_hostlist(gang.nodes),
        "time_limit_s": spec.time_limit_s, "start_epoch": time.time(), "mem_mib": spec.limits.mem_mib,
        "command": " ".join(spec.command), "stdout": str(jd.rank_log(0)),
        "stderr": str(jd.rank_err(0) if spec.stderr_apart else jd.rank_log(0)),
        "cluster_nodes": [{"name": n.name, "gpus": n.gpus} for n in cluster_nodes or []],
        "datasets": spec.dataset_paths,  # node -> {TRAINYARD_DATASET_<NAME>: its copy there}: srun's tasks get their node's
        # the job's image, which its steps run in (srun's --container-* are checked against it: step_container.py)
        "container": None if spec.container is None else
        {**spec.container.options.to_record(), "ref": spec.container.ref, "digest": spec.container.digest}})
    job_tools.install(run_dir, python, in_container=spec.container is not None)
    run = jobfs.Tree(run_dir)  # the plane's run dir: made through no link
    owner = (spec.owner.uid, spec.owner.gid) if spec.owner is not None else None
    run.make_dir(STEPS_DIR, 0o700, owner=owner, exist_ok=False)

def batch_env(gang: Gang, spec: LaunchSpec, run_dir: Path, master_addr: str, master_port: int,
              inherited_path: str) -> dict[str, str]:
    """The batch script's variables on top of the job's (see the module docstring); PATH is the
    job's (`inherited_path`: the spec's, else the plane's) behind our tools."""
    env = rank_env(gang, 0, job_id=spec.job_id, attempt=spec.attempt, checkpoint_dir=spec.checkpoint_dir,
                   master_addr=master_addr, master_port=master_port, workdir=spec.workdir, info=spec.job,
                   parts=EnvPart.ALL)
    for k in PER_TASK:
        env.pop(k, None)
    first = gang.nodes[0]
    env["CUDA_VISIBLE_DEVICES"] = ",".join(gang.node_gpus(first))
    env["PATH"] = f"{bin_dir(run_dir)}:{inherited_path}" if inherited_path else str(bin_dir(run_dir))
    return env


def batch_needs(spec: LaunchSpec, devices_of: dict[int, list[tuple[int, int]]],
                node_mem: dict[str, int | None], every: tuple[tuple[int, int], ...]) -> Needs:
    """The cell of a batch attempt: one rank (the script's) with every device of the job, and the
    whole allocation's memory and pids limit (every node's), since all its tasks run in it."""
    first = min(spec.ranks, key=lambda r: r.rank).node
    devices = tuple(sorted({d for r in spec.ranks for d in devices_of.get(r.rank, [])}))
    mems = list(node_mem.values())
    mem = None if not mems or any(m is None for m in mems) else sum(m for m in mems if m is not None)
    cpus = spec.limits.cpus_per_task * len(spec.ranks) if spec.limits.cpus_per_task else None
    pids = spec.limits.pids_max * len({r.node for r in spec.ranks}) if spec.limits.pids_max else None
    return Needs(attempt_key(spec.job_id, spec.attempt), (RankNeeds(0, first, devices, cpus),), {first: mem}, every,
                 pids)
