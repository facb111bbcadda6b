"""Time in DDP's gradient all-reduces, measured by a communication hook that does DDP's own work.

DDP all-reduces gradients in buckets, launched during backward and waited for at its end, so the
time a rank spends in collectives is the union, over a step's buckets, of "launched → done". In
synchronous data parallelism that includes waiting for the slowest rank: across ranks,
`comm - min(comm)` is the wait and `step - comm` each rank's own work (the plane compares them).
The hook (`timed_allreduce`) is DDP's default one — divide by the world size, all-reduce (sum) on
the model's process group, called on the group itself as DDP's built-in hook does (the Python
wrapper `dist.all_reduce` would add ~0.1 ms of checks per bucket) — plus two clock reads: at the launch, and in the completion callback
it chains to the all-reduce's future (DDP waits for the chained future, so the callback has run
before backward returns). No extra collective, no synchronisation.

On CPU tensors (gloo) the callback runs when the all-reduce is done. An NCCL future completes as
soon as the work is queued on the GPU, so there the hook records CUDA events instead (one on the
current stream at the launch, one in the callback, which CUDA orders after the all-reduce) and
reads their elapsed time at a later step end, once they have completed (`event.query()`: no wait).
A failure of that bookkeeping turns the timing off with one warning; the all-reduce is unchanged.

DDP also communicates before each forward: it broadcasts the module's buffers from rank 0 (any
buffer: BatchNorm's statistics, a rotary embedding's `inv_freq`), and after its first step the
rebuilt bucket order. A rank ahead of the others waits there — measured, a 2-rank Llama with one
rank's CPU capped 16-fold had its fast rank's wait split between that broadcast and the gradient
all-reduce, so its own work looked 2-4 times larger than it was. `time_pre_forward` times that
span too: a forward pre-hook on the DDP module notes the clock, one on the wrapped module (which
DDP calls after its pre-forward work) records the interval; on CUDA as a pair of events.

Only DDP is hooked, and only when it has no hook yet (one's own hook, a compression hook, DDP's
mixed precision: those are kept, and their collectives are measured only where marked with
`run.phase("comm")`). FSDP's and other collectives likewise: mark them.
"""

# No `from __future__ import annotations`: DDP checks a hook's annotations (`bucket`, the return)
# against the real types, so they must be evaluated.
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trainyard.runtime.phases import MAX_PENDING, union_s

_clock = time.perf_counter


@dataclass
class HookState:
    record: Callable[[float, float], None]  # (launched, done) in perf_counter seconds
    group: Any  # the model's process group
    world: int
    rank: int = 0
    cuda_pending: list[tuple[Any, Any]] = field(default_factory=list)  # (start, end) CUDA events
    broken: bool = False

    def cuda_seconds(self) -> float:
        """Seconds covered by the recorded CUDA event pairs that have completed (union); the others
        wait for a later call. Never blocks."""
        pending = self.cuda_pending
        if not pending:
            return 0.0
        done = 0
        try:
            while done < len(pending) and pending[done][1].query():
                done += 1
            if not done:
                return 0.0
            ref = pending[0][0]
            spans = list((ref.elapsed_time(s) / 1000.0, ref.elapsed_time(e) / 1000.0) for s, e in pending[:done])
        except RuntimeError as e:
            self.fail(e)
            return 0.0
        del pending[:done]
        return union_s(spans, float("-inf"), float("inf"))

    def cuda_start(self) -> Any:
        """A CUDA event recorded on the current stream now: the start of a timed span (None once
        the timing broke)."""
        if self.broken:
            return None
        try:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            return start
        except RuntimeError as e:
            self.fail(e)
            return None

    def cuda_end(self, start: Any) -> None:
        """The span from `start` (a `cuda_start`) to now, kept for a later step end's `cuda_seconds`."""
        if start is None or self.broken or len(self.cuda_pending) >= MAX_PENDING:
            return
        try:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.cuda_pending.append((start, end))
        except RuntimeError as e:
            self.fail(e)

    def fail(self, e: BaseException) -> None:
        if not self.broken:
            self.broken = True
            self.cuda_pending.clear()
            print(f"trainyard.runtime: rank {self.rank}: timing DDP's all-reduces failed ({e!r}); "
                  f"comm is no longer measured (training goes on)", file=sys.stderr, flush=True)


def timed_allreduce(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP's default gradient all-reduce (the mean over the ranks), timed."""
    buf = bucket.buffer()
    buf.div_(state.world)
    if state.broken:
        return state.group.allreduce([buf]).get_future().then(_first)
    if buf.is_cuda:
        return _timed_cuda(state, buf)
    t0 = _clock()
    fut = state.group.allreduce([buf]).get_future()

    def done(f: torch.futures.Future[Any]) -> torch.Tensor:
        state.record(t0, _clock())
        return f.value()[0]

    return fut.then(done)


def _first(f: torch.futures.Future[Any]) -> torch.Tensor:
    return f.value()[0]


def _timed_cuda(state: HookState, buf: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    start = state.cuda_start()
    fut = state.group.allreduce([buf]).get_future()

    def done(f: torch.futures.Future[Any]) -> torch.Tensor:
        value = f.value()[0]
        state.cuda_end(start)
        return value

    return fut.then(done)


def has_comm_hook(model: Any) -> bool:
    """Whether a DDP model already has a communication hook (Python or built-in)."""
    if getattr(model, "_comm_hooks", None):
        return True
    try:
        return bool(model._get_ddp_logging_data().get("comm_hook"))
    except (AttributeError, RuntimeError, AssertionError):
        return True  # cannot tell: leave it alone


def hook_ddp(model: Any, record: Callable[[float, float], None], *, rank: int = 0) -> HookState | None:
    """Register the timed all-reduce on `model` if it is a DDP model without a hook; its state, or None."""
    from torch.nn.parallel import DistributedDataParallel

    if not isinstance(model, DistributedDataParallel) or has_comm_hook(model):
        return None
    group = model.process_group
    state = HookState(record=record, group=group, world=group.size(), rank=rank)
    try:
        model.register_comm_hook(state, timed_allreduce)
    except (RuntimeError, ValueError) as e:  # registered too late (after the first backward), …
        print(f"trainyard.runtime: rank {rank}: cannot time DDP's all-reduces ({e}); comm is measured "
              f"only where marked with run.phase('comm')", file=sys.stderr, flush=True)
        return None
    time_pre_forward(model, state)
    return state


def time_pre_forward(model: Any, state: HookState) -> None:
    """Time DDP's work before each forward (its buffer broadcast) as comm: from the DDP module's
    forward pre-hook to the wrapped module's. The wrapped module called on its own (no DDP call
    open) records nothing."""
    opened: list[Any] = []  # the DDP call's start: a clock reading or a CUDA event

    def ddp_called(_module: Any, _args: Any) -> None:
        opened.clear()
        if state.broken:
            return
        opened.append(state.cuda_start() if model.device_ids else _clock())  # CPU (gloo): the broadcast blocks

    def module_called(_module: Any, _args: Any) -> None:
        if not opened:
            return
        start = opened.pop()
        if isinstance(start, float):
            state.record(start, _clock())
        else:
            state.cuda_end(start)

    model.register_forward_pre_hook(ddp_called)
    model.module.register_forward_pre_hook(module_called)
