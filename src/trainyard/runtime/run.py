"""`Run`: the runtime's parts wired to one training loop, so a script needs a few lines.

    ctx = runtime.init(seed=0)
    ...build model, optimizer, scheduler, sampler...
    run = runtime.Run(ctx, model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                      checkpoint_every=500)
    for step in run.steps(10_000):          # resumes first; yields the steps still to do
        loss = train_step(sampler.indices())
        run.log(loss=loss)

At the end of every step (`step_done`, which `steps()` calls for you) it, in this order:
1. advances the sampler by one global batch and notes the step's metrics (`metrics.jsonl`);
2. tells the watchdog a step completed;
3. agrees with the other ranks — an all-reduce of three small integers on the runtime's gloo
   group, started at this step and read at the next, so nobody waits for it — on: did any rank
   get a preemption notice, did any rank's async checkpoint fail, has rank 0's clock reached a
   time-based checkpoint. Every rank gets the same answers at the same step, so they all save
   the same step or all stop (a notice takes effect one step after the one it arrived in);
4. on a notice: waits for any save in flight, saves this step synchronously, exits 75;
5. on a failed save: raises `CheckpointSaveError` on every rank (the job fails, clearly);
6. starts the periodic checkpoint (asynchronous by default) when one is due, and waits for
   the one in flight if it would otherwise leave more than `checkpoint_every` steps uncommitted;
7. queues a progress report for the control plane (rank 0; rate-limited; never blocks).

Every rank also splits its step time into phases (`phases.py`): the data wait of
`for batch in run.data(loader)`, the checkpoint stall (what the loop waits for of a save), the time
in DDP's gradient all-reduces (`comm_timing.py`) and whatever `with run.phase(name):` marks; it
writes them to its phase file (contracts.py, above `PHASES_DIR`) for the control plane's ledger.

Everything here is also usable piece by piece (`CheckpointManager`, `PreemptionHandler`,
`ResumableSampler`, `MetricsLogger`, `ProgressReporter`, `Watchdog`).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, ContextManager, TypeVar

import torch
import torch.distributed as dist

from trainyard.contracts import PHASES_EVERY_S, REQUEUE_EXIT
from trainyard.runtime import comm_timing, phases
from trainyard.runtime.cadence import CheckpointCadence
from trainyard.runtime.checkpoint import CheckpointManager, CheckpointSaveError
from trainyard.runtime.startup import Context, init
from trainyard.runtime.metrics import MetricsLogger, peak_memory
from trainyard.runtime.preemption import PreemptionHandler
from trainyard.runtime.progress import ProgressReporter
from trainyard.runtime.watchdog import Watchdog

T = TypeVar("T")


class Run:
    """One training run's runtime services. Collective: build it on every rank, in the same order.

    Args:
        ctx: from `init()`; None calls `init(seed=None)` (reads the environment, joins or reuses
            the process group, seeds nothing).
        model, optimizer, scheduler, sampler: what a checkpoint saves and restores.
        extra: more named objects with state_dict()/load_state_dict() to checkpoint.
        checkpoint_dir: default `TRAINYARD_CHECKPOINT_DIR` (or ./checkpoints).
        checkpoint_every: the most steps an incident may cost; None: save only on preemption and
            at the end. Blocking saves happen at its multiples. Asynchronous saves start early
            enough that the newest *committed* checkpoint is never more than N steps behind:
            `CheckpointCadence` learns how many steps a commit takes and starts that much
            sooner, and the loop waits for a commit that runs later than that.
        checkpoint_every_s: also save when this much time has passed since the last save.
        keep_last, keep_every: retention (see `CheckpointManager`).
        async_checkpoint: periodic saves overlap training (preemption saves are always blocking).
        final_checkpoint: `steps()` saves the last step when the loop completes.
        metrics_dir: default `TRAINYARD_METRICS_DIR`, else `<checkpoint dir>/../metrics` under the
            control plane, else ./metrics.
        log_every: write a metrics line every N steps (throughput is averaged over them).
        tensorboard: True/False/None (= when installed).
        watchdog_s: step timeout; default `TRAINYARD_WATCHDOG_S`; None: no watchdog.
        first_step_timeout_s: allowance for start-up and the first step (default max(watchdog_s, 600)).
        checkpoint_timeout_s: watchdog allowance for a blocking save or the resume.
        progress_every_s: least time between two step reports to the control plane.
        exit_on_preempt: exit 75 after the preemption checkpoint (else `step_done` returns True).
        phase_timing: split each step's time into data wait, checkpoint stall and collectives and
            write the phase file (docs/runtime.md, "Phase timings"); None: on unless the
            environment says `TRAINYARD_PHASES=0`.
        phases_every_s: least time between two writes of the phase file (`PHASES_EVERY_S`).
    """

    def __init__(
        self,
        ctx: Context | None = None,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        sampler: Any = None,
        extra: dict[str, Any] | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_every: int | None = None,
        checkpoint_every_s: float | None = None,
        keep_last: int = 3,
        keep_every: int | None = None,
        async_checkpoint: bool = True,
        final_checkpoint: bool = True,
        metrics_dir: str | None = None,
        log_every: int = 1,
        tensorboard: bool | None = None,
        watchdog_s: float | None = None,
        first_step_timeout_s: float | None = None,
        checkpoint_timeout_s: float = 1800.0,
        progress_every_s: float = 30.0,
        exit_on_preempt: bool = True,
        phase_timing: bool | None = None,
        phases_every_s: float = PHASES_EVERY_S,
    ) -> None:
        self.ctx = ctx if ctx is not None else init(seed=None)
        env = self.ctx.env
        self.rank = dist.get_rank() if self.ctx.distributed else 0
        self.optimizer = optimizer
        self.sampler = sampler
        self.checkpoint_every = checkpoint_every
        self.checkpoint_every_s = checkpoint_every_s
        self.final_checkpoint = final_checkpoint
        self.log_every = max(1, int(log_every))
        self.checkpoint_timeout_s = checkpoint_timeout_s
        self.exit_on_preempt = exit_on_preempt
        self.step = 0
        self.stop_requested = False
        self._done_step = -1
        self._step_metrics: dict[str, Any] = {}
        self._resumed = False
        self._finished = False
        self._last_save_t = time.monotonic()
        self._flag_bufs = (torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32))
        self._flag_turn = 0
        self._agreement: tuple[Any, torch.Tensor] | None = None  # (work, buffer) in flight
        self._save_error: CheckpointSaveError | None = None

        self.metrics = MetricsLogger(metrics_dir or env.metrics_dir, rank=self.rank, attempt=env.attempt,
                                     tensorboard=tensorboard)
        on = phase_timing if phase_timing is not None else phases.enabled_by()
        self.phases = (phases.PhaseClock(env.phases_file(self.rank, metrics_dir), attempt=env.attempt,
                                         rank=self.rank, every_s=phases_every_s) if on else None)
        self.comm_hook: comm_timing.HookState | None = None
        if self.phases is not None and model is not None:
            self.comm_hook = comm_timing.hook_ddp(model, self.phases.comm_interval, rank=self.rank)
            if self.comm_hook is not None:
                self.phases.comm_sources.append(self.comm_hook.cuda_seconds)
        states = dict(extra or {})
        states.setdefault("metrics", self.metrics)
        self.checkpoints = CheckpointManager(
            checkpoint_dir or env.checkpoint_dir, model=model, optimizer=optimizer, scheduler=scheduler,
            sampler=sampler, extra=states, keep_last=keep_last, keep_every=keep_every,
            async_save=async_checkpoint, group=self.ctx.checkpoint_group, control_group=self.ctx.control_group,
            seed=self.ctx.seed or 0)
        self.preemption = PreemptionHandler(self.ctx.control_group).install()
        self.progress = ProgressReporter(env.api if self.rank == 0 else None, env.job_id, env.token,
                                         attempt=env.attempt, interval_s=progress_every_s)
        self.checkpoints.on_commit.append(self._on_commit)
        self.cadence = (CheckpointCadence(checkpoint_every, pipeline=1 if self.ctx.distributed else 0)
                        if checkpoint_every and self.checkpoints.async_save else None)
        timeout = watchdog_s if watchdog_s is not None else env.watchdog_s
        self.watchdog = (Watchdog(timeout, first_timeout_s=first_step_timeout_s, rank=self.rank).start()
                         if timeout else None)

    # -- the loop ----------------------------------------------------------------------------------

    def resume(self) -> int:
        """Restore the newest complete checkpoint (if any); return the step it ends at (0: fresh)."""
        if self._resumed:
            return self.step
        self._resumed = True
        if self.watchdog is not None:
            with self.watchdog.allow(self.checkpoint_timeout_s, "loading the checkpoint"):
                step = self.checkpoints.load_latest()
        else:
            step = self.checkpoints.load_latest()
        self.step = step or 0
        self._done_step = self.step
        if step:
            self.metrics.resumed(step)
            print(f"trainyard.runtime: rank {self.rank} resumed from step {step}", file=sys.stderr, flush=True)
        self._report(event="resume" if step else "start")
        self.metrics.start_clock()
        if self.phases is not None:
            self.phases.start()
        self._last_save_t = time.monotonic()
        if self.cadence is not None:
            self.cadence.started(self.step)
        return self.step

    def steps(self, total: int, *, finish: bool = True) -> Iterator[int]:
        """Resume, then yield steps `resumed+1 … total`; each step's end runs `step_done`.

        After the last step: a final checkpoint (if `final_checkpoint`) and, if `finish`,
        `finish()` (which also destroys the process group; pass False to evaluate afterwards
        and call `run.finish()` yourself).
        """
        start = self.resume()
        for step in range(start + 1, total + 1):
            self.step = step
            yield step
            if self._done_step < step:
                if self.step_done(step):
                    return  # preempted, exit_on_preempt=False: the checkpoint is saved
        if self.final_checkpoint and total > start:
            self.checkpoint(blocking=True)
        if finish:
            self.finish()

    def log(self, **metrics: Any) -> None:
        """Metrics of the current step (loss=…, tokens=…, samples=…); written at its end."""
        self._step_metrics.update(metrics)

    def step_done(self, step: int | None = None, **metrics: Any) -> bool:
        """End of a step: the steps listed in the module docstring. Collective.

        Returns True when a preemption checkpoint was saved and `exit_on_preempt` is False;
        otherwise a notice ends the process with exit code 75 (SystemExit).

        Raises:
            CheckpointSaveError: an asynchronous checkpoint failed (on every rank).
        """
        step = self.step + 1 if step is None else step
        self.step = self._done_step = step
        values = {**self._step_metrics, **metrics}
        self._step_metrics = {}
        if self.sampler is not None and hasattr(self.sampler, "advance"):
            self.sampler.advance()
        samples = values.pop("samples", None)
        if samples is None and self.sampler is not None:
            samples = getattr(self.sampler, "global_batch_size", None)
        tokens = values.pop("tokens", None)
        write = step % self.log_every == 0
        if write and self.optimizer is not None and "lr" not in values:
            lr = self.optimizer.param_groups[0].get("lr")
            values["lr"] = float(lr) if lr is not None else None
        rec = self.metrics.log_step(step, samples=samples, tokens=tokens, write=write, **values)
        if rec is not None:  # the latest values logged (tensors read once, by the logger): the next manifest's
            self.checkpoints.metrics.update(manifest_metrics({k: rec[k] for k in values if k in rec}))
        if self.phases is not None:
            self.phases.step_ended(step, self.metrics.last_step_s)
        if self.watchdog is not None:
            self.watchdog.beat(step)

        if self._save_error is None:
            try:
                self.checkpoints.poll()
            except CheckpointSaveError as e:
                self._save_error = e  # raised once every rank knows (below), so all fail together
        time_due = False
        if self.rank == 0:
            now = time.monotonic()
            time_due = self.checkpoint_every_s is not None and now - self._last_save_t >= self.checkpoint_every_s
            if self.cadence is not None:
                self.cadence.step_ended(now)
                time_due = self.cadence.due(step) or time_due
        stop, failed, due = self._agree(self.preemption.local, self._save_error is not None, time_due)
        if failed:
            if self._save_error is None:
                try:
                    with self._timed("checkpoint_stall"):
                        self.checkpoints.wait()
                except CheckpointSaveError as e:
                    self._save_error = e
            raise self._save_error or self.checkpoints.failed_elsewhere()
        if stop:
            return self._preempt(step)
        if self.cadence is not None:
            save_now = self.cadence.should_save(step, due)
        else:
            save_now = due or bool(self.checkpoint_every and step % self.checkpoint_every == 0)
        if save_now:
            self.checkpoint()
        self._hold_lost_work_bound(step)
        if write:
            self._report()
        return False

    def _agree(self, stop: bool, failed: bool, due: bool) -> tuple[bool, bool, bool]:
        """The ranks' agreement on (stop, failed, due): MAX over ranks, pipelined by one step.

        A blocking all-reduce here would make every rank wait, at every step, for the slowest one
        plus a gloo round trip. Instead each step starts the all-reduce of its flags
        (`async_op=True`) and uses the result of the one started at the previous step, long
        finished by now. Every rank still acts on the same values at the same step; a notice is
        acted on one step later than it could be.
        """
        if not self.ctx.distributed:
            return stop, failed, due
        agreed = (False, False, False)
        if self._agreement is not None:
            work, buf = self._agreement
            with self._timed("comm"):  # a rank ahead waits here for the others (one step late)
                work.wait()
            a, b, c = buf.tolist()
            agreed = (bool(a), bool(b), bool(c))
        buf = self._flag_bufs[self._flag_turn]
        self._flag_turn ^= 1
        buf[0], buf[1], buf[2] = int(stop), int(failed), int(due)
        self._agreement = (dist.all_reduce(buf, op=dist.ReduceOp.MAX, group=self.ctx.control_group,
                                           async_op=True), buf)
        return agreed

    def _settle_agreement(self) -> None:
        """Wait for the agreement in flight (every rank has exactly one): before the group goes."""
        if self._agreement is not None:
            work, _ = self._agreement
            self._agreement = None
            work.wait()

    def checkpoint(self, blocking: bool | None = None) -> None:
        """Save the state after the current step now (collective). Blocking saves get the
        watchdog's checkpoint allowance."""
        self._last_save_t = time.monotonic()
        if self.cadence is not None:
            self.cadence.started(self.step)
        sync = blocking if blocking is not None else not self.checkpoints.async_save
        # the stall: a blocking save whole; an asynchronous one while it stages (and waits for the one before)
        with self._timed("checkpoint_stall"):
            if self.watchdog is not None and sync:
                with self.watchdog.allow(self.checkpoint_timeout_s, f"checkpoint of step {self.step}"):
                    self.checkpoints.save(self.step, blocking=True)
            else:
                self.checkpoints.save(self.step, blocking=sync)

    def _hold_lost_work_bound(self, step: int) -> None:
        """Wait for the save in flight if, without its commit, the next step would leave more
        than `checkpoint_every` steps uncommitted. A failure found here is raised on every rank
        at the next agreement, like one `poll()` finds."""
        if self.cadence is None or not self.checkpoints.in_flight:
            return
        if not self.cadence.must_wait(step, self.checkpoints.last_committed_step or 0):
            return
        try:
            if self.watchdog is not None:
                # A commit that takes far longer than the last one is a hung peer, not slow storage:
                # leave the watchdog its step timeout on top of three times the last commit.
                last = self.checkpoints.last_commit_s
                allowance = (self.checkpoint_timeout_s if last is None
                             else min(self.checkpoint_timeout_s, self.watchdog.timeout_s + 3 * last))
                with (self.watchdog.allow(allowance, "the commit of the checkpoint in flight"),
                      self._timed("checkpoint_stall")):
                    self.checkpoints.wait()
            else:
                with self._timed("checkpoint_stall"):
                    self.checkpoints.wait()
        except CheckpointSaveError as e:
            self._save_error = self._save_error or e

    def _preempt(self, step: int) -> bool:
        sig = self.preemption.received.name if self.preemption.received is not None else "another rank's notice"
        self.checkpoint(blocking=True)
        self.stop_requested = True
        self.metrics.event("preempted", step, signal=sig, checkpoint_step=step)
        print(f"trainyard.runtime: rank {self.rank}: preemption ({sig}): checkpointed step {step}; "
              f"exiting {REQUEUE_EXIT} (requeue)", file=sys.stderr, flush=True)
        self._report(event="preempted")
        if self.phases is not None:
            self.phases.flush()
        if not self.exit_on_preempt:
            return True
        self.finish(close_process_group=True, _event=False)
        raise SystemExit(REQUEUE_EXIT)

    def finish(self, close_process_group: bool = True, _event: bool = True) -> None:
        """Wait for the save in flight, stop the watchdog and the reporter, close the metrics file,
        and (by default) destroy the process group `init()` created. Idempotent."""
        if self._finished:
            return
        self._finished = True
        try:
            self._settle_agreement()
            # the save in flight: after the newest step (the phase file's `after_last`)
            with self._timed("checkpoint_stall"):
                self.checkpoints.close()
        finally:
            if self.phases is not None:
                self.phases.finish()
            if self.watchdog is not None:
                self.watchdog.stop()
            self.preemption.uninstall()
            if _event:
                # the process's peaks (max RSS, CUDA's max_memory_allocated): what a memory plan is checked against
                self.metrics.event("finished", self.step, **peak_memory())
                self._report(event="finished")
            self.progress.close()
            self.metrics.close()
            if close_process_group:
                self.ctx.close()

    # -- phase timings ---------------------------------------------------------------------------

    def data(self, iterable: Iterable[T]) -> Iterable[T]:
        """`for batch in run.data(loader):` — the time each batch takes to arrive is the step's
        data wait. The iterable itself when phase timing is off."""
        return self.phases.data(iterable) if self.phases is not None else iterable

    def phase(self, name: str) -> ContextManager[Any]:
        """`with run.phase("data_wait" | "checkpoint_stall" | "comm"):` counts the block in that
        phase of the current step (loading done otherwise, a save of one's own, a hand-written
        collective). Phases do not nest: inside one, another counts for the outer."""
        if name not in phases.PHASES:
            raise ValueError(f"phase {name!r}: expected one of {', '.join(phases.PHASES)}")
        return self._timed(name)

    def _timed(self, name: str) -> ContextManager[Any]:
        return self.phases.phase(name) if self.phases is not None else contextlib.nullcontext()

    # -- control plane -----------------------------------------------------------------------------

    def _on_commit(self, step: int, path: Any, seconds: float) -> None:
        if self.cadence is not None:
            self.cadence.committed(seconds)
        self.metrics.event("checkpoint", step, seconds=round(seconds, 3), path=str(path))
        self._report(event="checkpoint", step=step)

    def _report(self, event: str = "progress", step: int | None = None) -> None:
        if not self.progress.enabled:
            return
        last = self.metrics.last
        keep = ("loss", "lr", "step_time_s", "samples_per_s", "tokens_per_s", "mfu", "samples", "tokens")
        self.progress.report(
            self.step if step is None else step, event=event,
            last_checkpoint_step=self.checkpoints.last_committed_step,
            last_checkpoint_time=self.checkpoints.last_committed_time,
            metrics={**{k: last[k] for k in keep if k in last}, **peak_memory()})


def manifest_metrics(values: dict[str, Any]) -> dict[str, float]:
    """The finite numbers among a step's metrics (a loss, a learning rate): what a checkpoint's
    manifest carries for the plane's `keep_best` (issue 41)."""
    out: dict[str, float] = {}
    for k, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if v == v and v not in (float("inf"), float("-inf")):
            out[str(k)[:100]] = float(v)
    return out
