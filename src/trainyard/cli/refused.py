"""sbatch options `yard submit` refuses, each with the reason, on the command line and in `#SBATCH`.

A refused option is an error (exit 2, nothing stored), never a warning: each of these changes when
or whether a job runs, and a job that asked for it must not run quietly without it. The reason says
what trainyard does instead, so the user can choose. (`--reservation` was refused here until admin
reservations existed: `yard reservation create`, cli/reservations.py; it is honoured now.)
"""

from __future__ import annotations

REFUSED: dict[str, str] = {
    "--nice": ("not supported: trainyard orders pending jobs by quota, class priority, urgency and fair share, "
               "and a per-job niceness has no place in that order yet; submit to a lower class instead (-q batch)"),
    "--time-min": ("not supported: trainyard does not start a job with a time limit shorter than --time to "
                   "backfill it (Slurm's --time-min); give --time alone, which the backfill uses"),
    "--no-requeue": ("not supported: trainyard preempts by checkpoint and requeue, and requeues a job whose node "
                     "was lost, so every job may be requeued (--requeue, the default)"),
}
# (--container-image was refused here until jobs had images: it is pyxis's option now,
# cli/container_opts.py; -w/--nodelist, -x/--exclude, -C/--constraint, --exclusive and GPU models
# are honoured: services/placement_ask.py; so is --gpus-per-task: services/jobs.py.)


def refusal(name: str) -> str | None:
    """`NAME: reason` when `name` (an option, without its value) is refused, else None."""
    reason = REFUSED.get(name)
    return f"{name}: {reason}" if reason else None
