"""The job environment (docs/design.md, "Contracts"), read once into a plain dataclass.

Every backend sets the same variables for every rank; `torchrun` sets the first six; a plain
`python train.py` sets none of them. `JobEnv.from_environ()` accepts all three: whatever is
missing takes the value of a single-process run (rank 0 of 1, checkpoints under
`./checkpoints`), so a script behaves the same on a laptop, under torchrun and under trainyard.

Values are validated here, with errors that name the variable, because a wrong RANK or
WORLD_SIZE otherwise surfaces minutes later as a rendezvous hang.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from trainyard.contracts import JobDir, JobVar


class JobEnvError(ValueError):
    """A job-environment variable is malformed (the message names it)."""


def _int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise JobEnvError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise JobEnvError(f"{name}={value} must be >= {minimum}")
    return value


def _str(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name)
    return raw if raw else None


@dataclass(frozen=True)
class JobEnv:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    job_id: str | None = None  # TRAINYARD_JOB_ID: None outside the control plane
    attempt: int = 0  # TRAINYARD_ATTEMPT: 0 outside the control plane
    checkpoint_dir: Path = Path("checkpoints")
    metrics_dir: Path = Path("metrics")
    api: str | None = None  # TRAINYARD_API: the control plane's base URL, when one runs
    token: str | None = None  # TRAINYARD_TOKEN: the job-scoped bearer token
    node: str | None = None  # TRAINYARD_NODE
    watchdog_s: float | None = None  # TRAINYARD_WATCHDOG_S: default step timeout, None = off
    # The job directory the control plane gave the job (TRAINYARD_JOB_ID and TRAINYARD_CHECKPOINT_DIR
    # set: the checkpoint directory's parent, as for the metrics); None outside a control plane.
    job_dir: Path | None = None

    @property
    def distributed(self) -> bool:
        """True when a process group is wanted: several ranks, or a launcher that set MASTER_ADDR."""
        return self.world_size > 1 or self.master_addr is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def phases_file(self, rank: int, metrics_dir: str | Path | None = None) -> Path:
        """Where rank `rank` writes its phase timings of this attempt (issue 39): the job directory's
        `metrics/phases/` under a control plane, where the plane reads it; else `<metrics dir>/phases/`
        (`metrics_dir`, default this environment's)."""
        if self.job_dir is not None:
            return JobDir(self.job_dir).phases_file(self.attempt, rank)
        name = JobDir(".").phases_file(self.attempt, rank)  # the contract's names, below a metrics dir
        return Path(metrics_dir if metrics_dir is not None else self.metrics_dir) / name.parent.name / name.name

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> JobEnv:
        """Read the job environment; missing variables take single-process defaults.

        Raises:
            JobEnvError: a variable is not an integer where one is expected, RANK >= WORLD_SIZE,
                LOCAL_RANK >= LOCAL_WORLD_SIZE, or TRAINYARD_WATCHDOG_S is not a positive number.
        """
        env = os.environ if environ is None else environ
        world = _int(env, "WORLD_SIZE", 1, minimum=1)
        rank = _int(env, "RANK", 0)
        if rank >= world:
            raise JobEnvError(f"RANK={rank} must be < WORLD_SIZE={world}")
        # Without LOCAL_* (a hand-made launch that set RANK and WORLD_SIZE only): one node.
        local_world = _int(env, "LOCAL_WORLD_SIZE", world, minimum=1)
        local_rank = _int(env, "LOCAL_RANK", rank % local_world)
        if local_rank >= local_world:
            raise JobEnvError(f"LOCAL_RANK={local_rank} must be < LOCAL_WORLD_SIZE={local_world}")
        port = _str(env, "MASTER_PORT")
        master_port = _int(env, "MASTER_PORT", 0, minimum=1) if port is not None else None

        ckpt = Path(env.get(JobVar.CHECKPOINT_DIR) or "checkpoints")
        # The control plane gives each job <job dir>/{checkpoints,metrics,logs}; a run outside it
        # keeps its metrics next to its checkpoints' directory, or in ./metrics.
        metrics = env.get(JobVar.METRICS_DIR)
        if not metrics:
            metrics = str(ckpt.parent / "metrics") if env.get(JobVar.CHECKPOINT_DIR) else "metrics"
        wd_raw = env.get(JobVar.WATCHDOG_S)
        watchdog_s = None
        if wd_raw:
            try:
                watchdog_s = float(wd_raw)
            except ValueError:
                raise JobEnvError(f"TRAINYARD_WATCHDOG_S={wd_raw!r} is not a number") from None
            if not watchdog_s > 0:
                raise JobEnvError(f"TRAINYARD_WATCHDOG_S={wd_raw!r} must be > 0")
        return cls(
            rank=rank,
            local_rank=local_rank,
            world_size=world,
            local_world_size=local_world,
            master_addr=_str(env, "MASTER_ADDR"),
            master_port=master_port,
            job_id=_str(env, JobVar.JOB_ID),
            attempt=_int(env, JobVar.ATTEMPT, 0),
            checkpoint_dir=ckpt,
            metrics_dir=Path(metrics),
            api=(_str(env, JobVar.API) or "").rstrip("/") or None,
            token=_str(env, JobVar.TOKEN),
            node=_str(env, JobVar.NODE),
            watchdog_s=watchdog_s,
            job_dir=ckpt.parent if env.get(JobVar.JOB_ID) and env.get(JobVar.CHECKPOINT_DIR) else None,
        )
