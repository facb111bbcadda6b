"""The two environments around a Slurm attempt: the plane's own commands', and the job's.

The plane's commands (`sbatch`, `squeue`, `scancel`, `scontrol`) run with `command_env`: a fixed
PATH, the C locale, SLURM_CONF from the plane's own environment (which cluster to talk to) and the
backend's configured extras, nothing else. No SBATCH_*/SLURM_* input variable, no PATH, no
LD_PRELOAD reaches them from anywhere else: were the job's environment the sbatch process's (as it
was), a job that set PATH would have the plane run its own `sbatch`, and SBATCH_ACCOUNT or
SBATCH_PARTITION would change what the plane asks Slurm for.

The job's environment (`job_env`: `LaunchSpec.env`, what the submitter exported, and
TRAINYARD_JOB_ID/ATTEMPT/CHECKPOINT_DIR; nothing of the plane's own environment, whose secrets, the
store's password among them, stay the plane's) reaches the job through a file instead
(`write_job_env`: `<attempt run dir>/job-env.json`, the owner's, 0600: it holds the job token),
which `slurm/task.py` lays over the task's environment on the node, under what Slurm and the batch
script set for the task (`TASK_OWN`: SLURM_*, the GPUs Slurm bound, MASTER_ADDR/PORT). The task's
own base is the clean environment sbatch ran with (`command_env`, exported by `--export=ALL`)
with the account's HOME/USER/LOGNAME/SHELL that `runuser` sets: the same allow-list as the local
backend's (`login_env`). The batch script and `srun` run with the clean environment, so a PATH of
the job's cannot change which `srun` starts the ranks either.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from trainyard import jobfs
from trainyard.backends.base import LaunchSpec

COMMAND_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
FROM_THE_PLANE = ("SLURM_CONF",)  # the only variable of the plane's own environment its commands get
JOB_DATASETS_FILE = "job-datasets.json"
JOB_ENV_FILE = "job-env.json"


def command_env(environ: Mapping[str, str], extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of every Slurm command the plane runs (see the module docstring)."""
    env = {"PATH": COMMAND_PATH, "LC_ALL": "C"}
    env.update({k: environ[k] for k in FROM_THE_PLANE if k in environ})
    env.update(extra or {})
    return env


def job_env(spec: LaunchSpec) -> dict[str, str]:
    """What the ranks of `spec` get on top of their task's environment: the job's own variables and
    trainyard's, nothing of the plane's (see the module docstring). `--export=NONE` or a list needs
    nothing more here: the job's env then holds only what was exported (and SLURM_EXPORT_ENV)."""
    env = dict(spec.env)
    env.update(TRAINYARD_JOB_ID=str(spec.job_id), TRAINYARD_ATTEMPT=str(spec.attempt),
               TRAINYARD_CHECKPOINT_DIR=spec.checkpoint_dir)
    return env


def write_job_env(run_dir: Path, spec: LaunchSpec) -> None:
    """Write `job-env.json` (`job_env`) in the new attempt dir: a new file, never through a link
    (`jobfs`), readable by the job's owner only (it holds the job token)."""
    who = (spec.owner.uid, spec.owner.gid) if spec.owner is not None else None
    jobfs.Tree(run_dir).create_file(JOB_ENV_FILE, json.dumps(job_env(spec)).encode(), 0o600, owner=who,
                                    exist_ok=False)
    if spec.dataset_paths:  # node -> {TRAINYARD_DATASET_<NAME>: its copy there}: each task takes its node's (task.py)
        jobfs.Tree(run_dir).create_file(JOB_DATASETS_FILE, json.dumps(spec.dataset_paths).encode(), 0o600,
                                        owner=who, exist_ok=False)
