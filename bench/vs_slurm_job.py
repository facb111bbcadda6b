"""The job of `bench/vs_slurm.py`: one-second steps, a checkpoint every few steps and on either
system's preemption notice, and resume from the newest one.

    python bench/vs_slurm_job.py --steps N --state FILE [--ckpt-every K] [--step-s S]

The same program runs under real Slurm and under trainyard, so both are measured by the same
clock and the same records: every attempt appends `start <unix time> <step>` to FILE.log when it
begins and `end <unix time> <step> <why> ran=<steps>` when it leaves, and the newest checkpoint
(a step count) is in FILE, written to a temporary file and renamed, so a kill never leaves half a
checkpoint. On trainyard's notice (SIGUSR1, docs/design.md) it saves and exits 75 ("checkpointed,
requeue me"); on SIGTERM (Slurm's preemption with `PreemptMode=REQUEUE`, after which Slurm
requeues the job itself; also a cancel) it saves and exits 0. Killed without a notice (SIGKILL
after the grace), it loses the steps since its last checkpoint: `lost steps` = steps run in all
attempts − steps needed, the work done twice. The step in progress at a notice is not counted.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path


def _read_step(state: Path) -> int:
    try:
        return int(state.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _save(state: Path, step: int) -> None:
    tmp = state.with_name(state.name + ".tmp")
    tmp.write_text(str(step))
    os.replace(tmp, state)


def _log(state: Path, line: str) -> None:
    with open(state.with_name(state.name + ".log"), "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--step-s", type=float, default=1.0)
    ap.add_argument("--ckpt-every", type=int, default=5)
    a = ap.parse_args(argv)
    stop: list[str] = []
    signal.signal(signal.SIGUSR1, lambda *_: stop.append("notice"))
    signal.signal(signal.SIGTERM, lambda *_: stop.append("term"))
    step = _read_step(a.state)
    _log(a.state, f"start {time.time():.3f} {step}")
    ran = 0
    while step < a.steps and not stop:
        t_end = time.monotonic() + a.step_s
        while time.monotonic() < t_end and not stop:
            time.sleep(min(0.05, max(0.0, t_end - time.monotonic())))
        if stop:
            break  # the step in progress is lost: done again by the next attempt
        step += 1
        ran += 1
        if step % a.ckpt_every == 0 or step >= a.steps:
            _save(a.state, step)
    why = "done" if step >= a.steps else stop[0]
    _save(a.state, step)  # on a notice: the checkpoint it asks for
    _log(a.state, f"end {time.time():.3f} {step} {why} ran={ran}")
    if why == "notice":
        return 75
    return 0


if __name__ == "__main__":
    sys.exit(main())
