"""`init()`: one call that turns the job environment into a ready process.

What it does, in order, and why:
1. reads the job environment (`JobEnv`), so nothing else has to parse variables;
2. picks the device: `cuda:<LOCAL_RANK mod visible GPUs>` when CUDA is usable (a backend that
   gives each rank its own `CUDA_VISIBLE_DEVICES` leaves one visible GPU: cuda:0), else CPU;
3. joins the process group (NCCL on GPUs, gloo on CPU) only when the job is distributed
   (WORLD_SIZE > 1 or MASTER_ADDR set), so `python train.py` needs no rendezvous;
4. creates two extra gloo groups, once, on every rank in the same order (group creation is a
   collective): `control` for the runtime's small CPU collectives (preemption agreement,
   barriers), `checkpoint` for checkpoint saves. Saves run in a background thread; giving them a
   group of their own keeps their collectives from interleaving with the training loop's, which
   would deadlock or corrupt both;
5. seeds Python, NumPy and torch with the same seed on every rank (identical initial weights
   everywhere, which FSDP and tensor parallelism rely on; DDP broadcasts rank 0's anyway);
6. on request, makes kernels deterministic (`torch.use_deterministic_algorithms`, cuDNN
   deterministic, the cuBLAS workspace setting).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from trainyard.runtime.env import JobEnv


@dataclass
class Context:
    """What a training script needs to know about its process; returned by `init()`."""

    env: JobEnv
    device: torch.device
    backend: str | None  # "nccl" | "gloo" | None when not distributed
    seed: int | None
    deterministic: bool
    control_group: Any = None  # gloo group for the runtime's own collectives (None: single process)
    checkpoint_group: Any = None  # gloo group for checkpoint saves (None: single process)
    owns_process_group: bool = False  # init() created the default group, so close() destroys it
    _closed: bool = field(default=False, repr=False)

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def distributed(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    def close(self) -> None:
        """Destroy the process group if `init()` created it (idempotent). Collective.

        A barrier first: a rank that tears its groups down while a peer still completes its last
        collective can make that peer's gloo threads abort ("terminate called without an active
        exception") instead of exiting cleanly.
        """
        if self._closed:
            return
        self._closed = True
        if self.owns_process_group and dist.is_available() and dist.is_initialized():
            try:
                dist.barrier(group=self.control_group)
            finally:
                dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    """Seed Python's `random`, NumPy's global generator and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def set_deterministic(enabled: bool = True) -> None:
    """Deterministic kernels (an error on ops that have none), no cuDNN autotuning."""
    if enabled:
        # cuBLAS reads this when its handle is created; setting it before the first matmul suffices.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(enabled)
    torch.backends.cudnn.deterministic = enabled
    torch.backends.cudnn.benchmark = not enabled


def runtime_groups() -> tuple[Any, Any]:
    """(control, checkpoint) gloo groups for a job whose script called `init_process_group` itself.

    Collective: every rank must call it at the same point. `init()` does it for you.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None, None
    return dist.new_group(backend="gloo"), dist.new_group(backend="gloo")


def init(
    seed: int | None = 0,
    *,
    deterministic: bool = False,
    backend: str | None = None,
    timeout_s: float = 1800.0,
    env: JobEnv | None = None,
) -> Context:
    """Prepare this process for training; see the module docstring for the steps.

    Args:
        seed: seeds Python, NumPy and torch on every rank; None leaves the generators alone.
        deterministic: deterministic kernels (`set_deterministic`).
        backend: override the process-group backend ("nccl", "gloo", "cpu:gloo,cuda:nccl").
        timeout_s: collective timeout of the process group.
        env: the job environment; read from `os.environ` when None.

    Raises:
        JobEnvError: a malformed job-environment variable.
        RuntimeError / DistStoreError: the rendezvous failed (from `init_process_group`).
    """
    env = env or JobEnv.from_environ()
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    if deterministic:
        set_deterministic(True)
    if seed is not None:
        seed_everything(seed)

    owns = False
    chosen: str | None = None
    if dist.is_available() and dist.is_initialized():
        chosen = dist.get_backend()
    elif env.distributed:
        chosen = backend or ("nccl" if device.type == "cuda" else "gloo")
        kwargs: dict[str, Any] = {}
        if device.type == "cuda":
            kwargs["device_id"] = device  # binds NCCL to this rank's GPU at once (no guessing later)
        dist.init_process_group(
            backend=chosen,
            init_method="env://",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
            **kwargs,
        )
        owns = True
    control, checkpoint = runtime_groups()
    return Context(
        env=env,
        device=device,
        backend=chosen,
        seed=seed,
        deterministic=deterministic,
        control_group=control,
        checkpoint_group=checkpoint,
        owns_process_group=owns,
    )
