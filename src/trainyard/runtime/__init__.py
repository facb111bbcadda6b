"""trainyard.runtime: the in-job library (docs/design.md rule 4: it stands alone, works under plain torchrun).

    import trainyard.runtime as yr

    ctx = yr.init(seed=0, deterministic=True)                  # env, device, process group, seeds
    sampler = yr.ResumableSampler(len(ds), global_batch_size=64, seed=0,
                                  world_size=ctx.world_size, rank=ctx.rank)
    run = yr.Run(ctx, model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                 checkpoint_every=500, keep_last=3, keep_every=5000, watchdog_s=600)
    for step in run.steps(total_steps):                        # resumes from the newest checkpoint
        loss = train_step(sampler.indices())
        run.log(loss=loss)

Parts, one job each: `env` (the job environment), `startup` (process set-up: `init`; not a module
named `init`, which importing it would make `yr.init` instead of the function), `checkpoint`
(DCP checkpoints, atomic commit, retention, validation), `preemption` (notice → agreement),
`sampler` (data order independent of world size), `metrics` (metrics.jsonl, TensorBoard),
`progress` (reports to the control plane), `watchdog` (hang → exit 86), `rng` (generator
states), `phases` (where each step's time goes: data wait, checkpoint stall, collectives; the
per-rank phase file is `phase_file`, DDP's timed all-reduce `comm_timing`), `run` (all of them
wired to a loop: `for batch in run.data(loader)`, `with run.phase("comm")`). Exit codes:
`REQUEUE_EXIT` (75), `WATCHDOG_EXIT` (86).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainyard.contracts import REQUEUE_EXIT, WATCHDOG_EXIT

# Loaded on first use (PEP 562): a job that needs only the torch-free parts (`env`, `phases`,
# `progress`, `metrics`: the demo's stand-in job, the tools) does not pay for importing torch
# (seconds of CPU per rank) because it imported this package.
_WHERE = {
    "CheckpointError": "checkpoint", "CheckpointManager": "checkpoint", "CheckpointSaveError": "checkpoint",
    "NoValidCheckpointError": "checkpoint", "JobEnv": "env", "JobEnvError": "env", "Context": "startup",
    "init": "startup", "runtime_groups": "startup", "seed_everything": "startup", "set_deterministic": "startup",
    "MetricsLogger": "metrics", "read_metrics": "metrics", "PhaseClock": "phases",
    "PreemptionHandler": "preemption", "ProgressReporter": "progress", "Run": "run",
    "ResumableSampler": "sampler", "Watchdog": "watchdog",
}

if TYPE_CHECKING:
    from trainyard.runtime.checkpoint import (
        CheckpointError,
        CheckpointManager,
        CheckpointSaveError,
        NoValidCheckpointError,
    )
    from trainyard.runtime.env import JobEnv, JobEnvError
    from trainyard.runtime.startup import Context, init, runtime_groups, seed_everything, set_deterministic
    from trainyard.runtime.metrics import MetricsLogger, read_metrics
    from trainyard.runtime.phases import PhaseClock
    from trainyard.runtime.preemption import PreemptionHandler
    from trainyard.runtime.progress import ProgressReporter
    from trainyard.runtime.run import Run
    from trainyard.runtime.sampler import ResumableSampler
    from trainyard.runtime.watchdog import Watchdog


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'trainyard.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"trainyard.runtime.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "REQUEUE_EXIT",
    "WATCHDOG_EXIT",
    "CheckpointError",
    "CheckpointManager",
    "CheckpointSaveError",
    "Context",
    "JobEnv",
    "JobEnvError",
    "MetricsLogger",
    "NoValidCheckpointError",
    "PhaseClock",
    "PreemptionHandler",
    "ProgressReporter",
    "ResumableSampler",
    "Run",
    "Watchdog",
    "init",
    "read_metrics",
    "runtime_groups",
    "seed_everything",
    "set_deterministic",
]
