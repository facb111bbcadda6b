"""The lines a job's log ends with when the plane ended its attempt, in Slurm's words.

A job that does not use trainyard's runtime learns nothing from the plane but its log, and a log
that just stops says nothing: was the job preempted, over its time, out of memory, cancelled?
Slurm's slurmstepd writes one line into the job's output in each case
(`*** JOB 65 ON node1 CANCELLED AT 2026-12-06T05:00:00 DUE TO PREEMPTION ***`), and sites grep
for it. trainyard writes the same line (prefixed `trainyard: error:` rather than `slurmstepd:`)
to each rank's log — its stderr file when it has one (`-e/--error`) — followed by trainyard's own
reason, and, for a failed rank of a job that is not a batch script, srun's line
(`node-0: rank 1: Exited with exit code 3`). The lines are appended through `jobfs` (the logs
are the owner's files in the plane's directory: no link, no FIFO) by the reconcile step when it
records the attempt's end; the plane never waits on a log.
"""

from __future__ import annotations

import logging
import signal as _signal
import time
from collections.abc import Sequence

from trainyard import jobfs
from trainyard.backends.base import RankState
from trainyard.contracts import REQUEUE_EXIT, JobDir
from trainyard.control.rules.outcome import Outcome

log = logging.getLogger("trainyard.loop")

# the cause of an attempt's end → the tail of Slurm's "*** JOB … CANCELLED AT <time>" line
DUE_TO = {"cancelled": "", "timeout": " DUE TO TIME LIMIT", "preempted": " DUE TO PREEMPTION",
          "requeued": " DUE TO JOB REQUEUE", "node_lost": " DUE TO NODE FAILURE", "hung": " DUE TO NODE FAILURE"}


def _signame(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def lines(job_id: int, attempt: int, node: str, out: Outcome, rank: RankState | None, *, batch: bool,
          when: float) -> list[str]:
    """What rank `rank`'s log (on `node`) gets when the attempt ended with `out`: nothing for a
    job that completed; Slurm's line for a stop (not for a job that asked to be requeued itself,
    exit 75), srun's line for a failed rank of a job that is not a batch script, then the reason."""
    if out.cause == "completed":
        return []
    at = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when))
    text: list[str] = []
    asked = out.cause == "requeued" and out.exit_code == REQUEUE_EXIT and out.signal is None
    if out.cause in DUE_TO and not asked:
        text.append(f"trainyard: error: *** JOB {job_id} ON {node} CANCELLED AT {at}{DUE_TO[out.cause]} ***")
    elif out.cause == "oom":
        text.append(f"trainyard: error: Detected an oom_kill event in attempt {attempt} of job {job_id}. "
                    "Some of the job's processes have been OOM Killed.")
    if not batch and rank is not None and out.cause not in DUE_TO:
        if rank.exit_code not in (None, 0, REQUEUE_EXIT):
            text.append(f"trainyard: error: {node}: rank {rank.rank}: Exited with exit code {rank.exit_code}")
        elif rank.signal is not None:
            text.append(f"trainyard: error: {node}: rank {rank.rank}: {_signame(rank.signal)}")
    text.append(f"trainyard: attempt {attempt} of job {job_id} ended: {out.reason}")
    return text


def append(jd: JobDir, job_id: int, attempt: int, out: Outcome, ranks: Sequence[RankState],
           nodes: dict[int, str], *, batch: bool, stderr_apart: bool, when: float) -> None:
    """Append each rank's `lines` to its log (or its stderr file with -e/--error); a log that is
    not a regular file, or cannot be written, is skipped (said in the plane's log)."""
    tree = jobfs.Tree(jd.root)
    for r in ranks:
        text = lines(job_id, attempt, nodes.get(r.rank, "?"), out, r, batch=batch, when=when)
        if not text:
            continue
        path = jd.rank_err(r.rank) if stderr_apart else jd.rank_log(r.rank)
        try:
            with tree.open_append(path, create=False) as f:
                f.write(("\n".join(text) + "\n").encode())
        except OSError as e:
            log.warning("job %s: cannot end %s with the plane's note: %s", job_id, path.name, e)
