"""The job dir's side of an attempt's start, as both real backends make it.

The job dir is the plane's (control/jobfiles/ownership.py gives it its modes), but the owner can
write below it: everything under it is reached through `jobfs.Tree`, which follows no link. What
a backend then does with an earlier run dir of the same attempt is its own (the local backend
ends what a dead owner may have started; Slurm's starts afresh).
"""

from __future__ import annotations

from pathlib import Path

from trainyard import jobfs
from trainyard.contracts import JobDir


def open_attempt(job_dir: str | Path, attempt: int) -> tuple[jobfs.Tree, Path]:
    """(the job dir's tree, the attempt's run dir) with the logs dir and the run dir's parent made.

    Raises:
        OSError: a directory could not be made (a link or a file where one should be, no space).
    """
    jd = JobDir(job_dir)
    jobfs.plane_dir(jd.root)
    tree = jobfs.Tree(jd.root)
    run_dir = jd.attempt_run(attempt)
    tree.make_dir(jd.logs, None)
    tree.make_dir(run_dir.parent, None)
    return tree, run_dir
