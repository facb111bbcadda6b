"""A stand-in training job for the demo: steps, periodic checkpoints, preemption by checkpoint.

It follows the contracts (`trainyard.contracts`) without any GPU: resumes from the newest
committed checkpoint, commits `step-<N>/` every `--ckpt-every` steps (rank 0 writes), and on
SIGUSR1 checkpoints at the next step boundary and exits 75 so that it is requeued, not lost.
Rank 0 reports its steps and checkpoints to the control plane as the runtime does, so `yard show`
has its progress and recovery times. Every rank writes the runtime's phase file too
(`trainyard.runtime.phases.PhaseClock`, docs/runtime.md "Phase timings"), so that the plane's
goodput ledger of a demo job is measured as a runtime job's is: the steps begin after the resume,
each step ends at its sleep's end, rank 0's checkpoint writes are its `checkpoint_stall` (a
preemption save the one after the newest step), the file is finished on the way out.
`TRAINYARD_PHASES=0` turns it off, as for the runtime.

    python -m trainyard.demo.work --steps 40 --step-time 0.5 --ckpt-every 5
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from trainyard.contracts import CHECKPOINT_MARKER, NOTICE_SIGNAL, REQUEUE_EXIT, JobVar, newest_checkpoint
from trainyard.runtime.env import JobEnv
from trainyard.runtime.metrics import peak_memory
from trainyard.runtime.phases import PhaseClock, enabled_by
from trainyard.runtime.progress import ProgressReporter


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--step-time", type=float, default=0.5)
    ap.add_argument("--ckpt-every", type=int, default=5)
    a = ap.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    ckdir = Path(os.environ.get(JobVar.CHECKPOINT_DIR, "checkpoints"))
    noticed = False

    def on_notice(*_: object) -> None:
        nonlocal noticed
        noticed = True

    signal.signal(NOTICE_SIGNAL, on_notice)
    found = newest_checkpoint(ckdir)
    step = found[0] if found else 0
    print(f"rank {rank}: attempt {os.environ.get('TRAINYARD_ATTEMPT', '?')} starts at step {step}", flush=True)

    env = JobEnv.from_environ()
    progress = ProgressReporter(env.api if rank == 0 else None, env.job_id, env.token, attempt=env.attempt,
                                interval_s=2.0)
    last_ckpt: tuple[int, float] | None = (found[0], found[2]) if found else None
    clock = PhaseClock(env.phases_file(rank), attempt=env.attempt, rank=rank) if enabled_by() else None

    def checkpoint(at: int) -> None:
        nonlocal last_ckpt
        if rank == 0:
            with clock.phase("checkpoint_stall") if clock is not None else contextlib.nullcontext():
                write_checkpoint(ckdir, at)
            last_ckpt = (at, time.time())
            progress.report(at, event="checkpoint", last_checkpoint_step=at, last_checkpoint_time=last_ckpt[1])

    if clock is not None:
        clock.start()
    ended = time.perf_counter()  # the previous step's end (the steps begin here)
    try:
        while step < a.steps:
            time.sleep(a.step_time)
            step += 1
            if clock is not None:
                now = time.perf_counter()
                clock.step_ended(step, now - ended)
                ended = now
            progress.report(step, last_checkpoint_step=last_ckpt and last_ckpt[0],
                            last_checkpoint_time=last_ckpt and last_ckpt[1], metrics=peak_memory())
            if noticed:
                checkpoint(step)
                print(f"rank {rank}: preemption notice: checkpointed step {step}, exiting {REQUEUE_EXIT}", flush=True)
                return REQUEUE_EXIT
            if step % a.ckpt_every == 0:
                checkpoint(step)
        print(f"rank {rank}: done after {step} steps", flush=True)
        return 0
    finally:
        if clock is not None:
            clock.finish()
        progress.close(timeout_s=1.0)


def write_checkpoint(ckdir: Path, at: int) -> None:
    """`step-<at>/` with its state, then its commit marker (the contract's layout)."""
    d = ckdir / f"step-{at}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "state.txt").write_text(str(at))
    (d / CHECKPOINT_MARKER).write_text("")


if __name__ == "__main__":
    sys.exit(main())
