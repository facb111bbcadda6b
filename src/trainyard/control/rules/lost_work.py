"""How much work an ended attempt threw away: the training time since its last checkpoint.

Wall time since the checkpoint overstates it whenever the job was not training at the end: ranks
frozen for half a minute before the plane called them hung, or a control plane that was down
while the ranks checkpointed and exited. The runtime's `metrics.jsonl` (rank 0) says when each
step finished, so the work lost is the time from the end of the step the checkpoint holds (an
asynchronous one commits later) to the last step finished after it, plus the step that was in
progress when the attempt died (at most one step time). A job
that writes no step records (not using the runtime) falls back to wall time.

The records are the job's own: a step or time that is no plain number (`"x"`, `true`, NaN, 1e308)
is skipped (`_record`), as a string there made every pass of the loop fail; and the result is never
more than the wall time since the checkpoint, whatever times the job wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainyard import figures, jobfs
from trainyard.contracts import JobDir

TAIL_BYTES = 256 * 1024  # the end of metrics.jsonl holds the attempt's last steps
MAX_TIME = 1e11  # seconds since the epoch (year 5138), as ProgressReport's `time`


def last_steps(metrics_file: Path, attempt: int, limit: int = 64) -> list[dict]:
    """The last step records of `attempt` (oldest first), read from the end of the file: at most
    TAIL_BYTES, never through a link or from a FIFO (the job writes it; `jobfs`). `metrics_file`
    is a job dir's `metrics/metrics.jsonl`; the job dir is the root the way is walked from."""
    metrics_file = Path(metrics_file)
    tail = jobfs.Tree(metrics_file.parents[1]).tail_lines(metrics_file, TAIL_BYTES)
    out = []
    for line in tail:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict) and "event" not in r and type(r.get("attempt")) is int and r["attempt"] == attempt and \
                (rec := _record(r)) is not None:
            out.append(rec)
    return out[-limit:]


def _record(r: dict) -> dict | None:
    """A step record with a step (0..2**62), a time (0..1e11 s, as progress reports have it) and
    maybe a positive `step_time_s`, all plain numbers; None when its step or time is not one."""
    step, at = figures.step(r.get("step")), figures.finite(r.get("time"), limit=MAX_TIME)
    if step is None or at is None or at < 0:
        return None
    rec = {"step": step, "time": at}
    if (step_s := figures.finite(r.get("step_time_s"), limit=MAX_TIME)) is not None and step_s > 0:
        rec["step_time_s"] = step_s
    return rec


def lost_work_s(job_dir: JobDir | Path, attempt: int, *, start_time: float, checkpoint: tuple[int, float] | None,
                now: float) -> float:
    """Seconds of training the attempt did after its newest checkpoint, which the next attempt redoes.

    Args:
        checkpoint: (step, commit time) of the newest committed checkpoint, or None.
    """
    ck_step, ck_time = checkpoint if checkpoint is not None else (0, start_time)
    saved = max(start_time, ck_time)
    jd = job_dir if isinstance(job_dir, JobDir) else JobDir(job_dir)
    steps = last_steps(jd.metrics_file, attempt)
    if not steps:
        return max(0.0, now - saved)
    last = steps[-1]
    if last["step"] <= ck_step:
        return 0.0  # it checkpointed its last step (a preemption) and stopped
    # An asynchronous checkpoint commits some steps after the step it holds: the work kept ends
    # when that step finished, not at the commit.
    at_ck = next((r["time"] for r in reversed(steps) if r["step"] == ck_step), None)
    if at_ck is not None:
        saved = max(start_time, min(saved, at_ck))
    step_s = last.get("step_time_s")
    if step_s is None:
        times = [r["time"] for r in steps]
        step_s = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    in_progress = min(max(0.0, now - last["time"]), step_s)
    # never more than the wall time since the checkpoint, whatever times the job wrote
    return min(max(0.0, last["time"] + in_progress - saved), max(0.0, now - saved))
