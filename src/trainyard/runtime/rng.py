"""Every random-number generator a training step may draw from, captured and restored.

Exact resume needs the generators exactly where the interrupted run left them: dropout masks,
data augmentation and sampling all draw from them. This covers Python's `random`, NumPy's global
generator, torch's CPU generator and every CUDA device's generator. The states are per rank (each
rank draws its own dropout masks), so they go into each rank's own file of a checkpoint.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

import numpy as np
import torch


def capture() -> dict[str, Any]:
    """This process's generator states (plain Python objects and CPU tensors)."""
    np_state = np.random.get_state()
    assert isinstance(np_state, tuple)  # the legacy global generator's form: MT19937, keys, pos, gauss
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (np_state[0], np_state[1].copy(), *np_state[2:]),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore(state: dict[str, Any]) -> None:
    """Put the generators back where `capture()` found them."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            torch.cuda.set_rng_state(cuda[0])


def derived_seed(*parts: int | str) -> int:
    """A 63-bit seed from several parts (seed, rank, step): for generators that cannot be restored."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
