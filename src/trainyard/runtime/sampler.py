"""A data order that survives restarts and changes of world size.

Why not `torch.utils.data.DistributedSampler`: its order depends on the world size (rank r
takes every W-th sample of the permutation) and its position is "the epoch", so a job requeued
mid-epoch repeats the epoch, and one resumed on fewer GPUs sees a different order.

Here the order is a function of (seed, epoch) only: one global permutation per epoch, cut into
global batches of `global_batch_size` samples; at every step rank r of W takes the r-th of W
equal contiguous slices of the next global batch. The position is the number of samples of the
current epoch already *trained on* — a global offset, the same on every rank — so a run resumed
on another world size continues with the next unseen global batch: no sample skipped or repeated.

The position advances only when a step is done (`advance()`, which `Run` calls for you), never
when a batch is handed out: a `DataLoader` that prefetches batches ahead of training would
otherwise checkpoint a position it has not trained on. Iterating the sampler (as a
`batch_sampler`) reads from the trained position to the end of the epoch without moving it.

Each epoch ends with the last full global batch; the `num_samples mod global_batch_size` samples
left over are not used that epoch (they take their turn in other epochs' permutations). With
`drop_last=False` the last, short batch is used, split as evenly as the ranks allow.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np


class ResumableSampler:
    """Global-batch sampler whose order depends only on seed and epoch.

    Args:
        num_samples: dataset length.
        global_batch_size: samples per optimizer step, all ranks together. Must be a multiple
            of world_size (equal work per rank; also for any world size you resume on).
        seed: the order's seed; keep it across restarts.
        world_size, rank: this process's place; default single process.
        shuffle: False keeps the dataset's order (epochs repeat it).
        drop_last: see the module docstring.

    Raises:
        ValueError: sizes that cannot work (empty dataset, batch larger than the dataset,
            batch not a multiple of the world size, rank outside the world).
    """

    def __init__(
        self,
        num_samples: int,
        global_batch_size: int,
        *,
        seed: int = 0,
        world_size: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples={num_samples} must be > 0")
        if not 0 < global_batch_size <= num_samples:
            raise ValueError(f"global_batch_size={global_batch_size} must be in 1..num_samples={num_samples}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in 0..world_size-1 (world_size={world_size})")
        if global_batch_size % world_size:
            raise ValueError(
                f"global_batch_size={global_batch_size} is not a multiple of world_size={world_size}; "
                "each rank must take the same number of samples")
        self.num_samples = num_samples
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.world_size = world_size
        self.rank = rank
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.epoch = 0
        self.offset = 0  # samples of `epoch` already trained on (global, identical on every rank)
        self._perm_epoch: int | None = None
        self._perm: np.ndarray | None = None

    # -- the order ------------------------------------------------------------------------------

    def permutation(self, epoch: int) -> np.ndarray:
        """The global order of `epoch` (cached for the current epoch)."""
        if self._perm_epoch != epoch:
            if self.shuffle:
                rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
                self._perm = rng.permutation(self.num_samples)
            else:
                self._perm = np.arange(self.num_samples)
            self._perm_epoch = epoch
        assert self._perm is not None
        return self._perm

    @property
    def batches_per_epoch(self) -> int:
        full, rest = divmod(self.num_samples, self.global_batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def _epoch_end(self) -> int:
        """Offset at which the epoch ends."""
        if self.drop_last:
            return self.num_samples - self.num_samples % self.global_batch_size
        return self.num_samples

    def global_batch(self, epoch: int | None = None, offset: int | None = None) -> list[int]:
        """All ranks' sample indices of the batch at (epoch, offset); default: the next one."""
        epoch = self.epoch if epoch is None else epoch
        offset = self.offset if offset is None else offset
        return self.permutation(epoch)[offset: offset + self.global_batch_size].tolist()

    def _slice(self, batch: list[int]) -> list[int]:
        parts = np.array_split(np.asarray(batch, dtype=np.int64), self.world_size)
        return parts[self.rank].tolist()

    def indices(self) -> list[int]:
        """This rank's sample indices for the next step (the same until `advance()`)."""
        return self._slice(self.global_batch())

    def advance(self, batches: int = 1) -> None:
        """Mark `batches` global batches as trained on; rolls over to the next epoch at its end."""
        for _ in range(batches):
            self.offset += len(self.global_batch())
            if self.offset >= self._epoch_end():
                self.epoch += 1
                self.offset = 0

    # -- as a batch_sampler ---------------------------------------------------------------------

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's batches from the trained position to the end of its epoch (no state change)."""
        epoch, offset, end = self.epoch, self.offset, self._epoch_end()
        while offset < end:
            batch = self.global_batch(epoch, offset)
            yield self._slice(batch)
            offset += len(batch)

    def __len__(self) -> int:
        remaining = max(0, self._epoch_end() - self.offset)
        return math.ceil(remaining / self.global_batch_size)

    # -- checkpointing --------------------------------------------------------------------------

    @property
    def samples_seen(self) -> int:
        """Global samples trained on since epoch 0 (for throughput and accounting)."""
        return self.epoch * self._epoch_end() + self.offset

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "offset": self.offset,
            "seed": self.seed,
            "num_samples": self.num_samples,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a saved position (any world size).

        Raises:
            ValueError: the saved order was made with another seed, dataset length, global batch
                size or shuffle/drop_last setting: resuming would skip or repeat samples.
        """
        for key in ("seed", "num_samples", "global_batch_size", "shuffle", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"checkpointed data order has {key}={state[key]!r}, this run {key}={getattr(self, key)!r}: "
                    "resuming would skip or repeat samples")
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
