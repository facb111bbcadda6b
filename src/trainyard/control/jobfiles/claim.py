"""Claiming a job's directory at launch, and refusing one the job did not make.

A job's directory (`contracts.JobDir`, `jobs/<id>-<key>`) is made by the control plane at the
job's first launch, with an owner file (`.trainyard-job`: the store's instance id, the job id and
its key) written into it before it appears under its name: the directory is built as
`jobs/.new-<name>-<pid>` and renamed into place, so a crash never leaves one without its owner
file. A later attempt finds the same owner and carries on in it (logs are appended, the newest
checkpoint is resumed from).

A directory that is already there with another owner, or with none, is *not* the job's: it was
left by another store (the data dir was given a new database), by a job of a store restored from
an older backup, or planted by someone. Running in it would hand the new job the old one's script,
logs and checkpoints, so `claim` refuses (`ForeignJobDir`, saying what it found) and the launch
step holds the job (`control/loop/attempt_start.py`), as Slurm does with a launch that fails on the node
("launch failed requeued held"): an admin looks, moves the directory aside and releases the job.

One exception keeps old data dirs working: a job stored before directory keys existed
(`dir_key` NULL, directory `jobs/<id>`) that has run before may adopt its directory without an
owner file (`adopt_unmarked`); its first attempt may not.
"""

from __future__ import annotations

import os
import stat
import threading
from typing import Any

from trainyard import jobfs
from trainyard.contracts import OWNER_FILE, JobDir


class ForeignJobDir(Exception):
    """The job's directory exists and was not made by this job; the message says what is there."""


def owner_record(store_id: str, job_id: int, key: str | None) -> dict[str, Any]:
    """What the owner file of job `job_id` (directory key `key`) of store `store_id` holds."""
    return {"store": store_id, "job_id": job_id, "key": key}


def _jobs(jd: JobDir) -> jobfs.Tree:
    """The plane's `jobs/` directory, which holds the job dir: the root every step is taken from."""
    return jobfs.Tree(jd.root.parent)


def read_owner(jd: JobDir) -> dict[str, Any] | None:
    """The owner file's record, or None when there is none (or it cannot be read as one)."""
    rec = _jobs(jd).read_json(f"{jd.root.name}/{OWNER_FILE}")
    return rec if isinstance(rec, dict) else None


def claim(jd: JobDir, owner: dict[str, Any], *, adopt_unmarked: bool = False) -> None:
    """Make `jd` this job's (creating it with its owner file) or find it already the job's, then
    make the directories its ranks write to.

    Raises:
        ForeignJobDir: the directory is there and belongs to another job or store, has no owner
            file (unless `adopt_unmarked`), or is not a plain directory (a symbolic link, a file).
        OSError: it cannot be created.
    """
    jobfs.plane_dir(jd.root.parent)
    jobs = _jobs(jd)
    if jobs.lstat(jd.root.name) is None:
        _create(jd, owner)
    st = jobs.lstat(jd.root.name)
    if st is None or not stat.S_ISDIR(st.st_mode):
        what = "symbolic link" if st is not None and stat.S_ISLNK(st.st_mode) else "file"
        raise ForeignJobDir(f"{jd.root} is there but is not a directory the control plane made (a {what})")
    found = read_owner(jd)
    if found is None and adopt_unmarked:
        _write_owner(jd, owner)
    elif found != owner:
        raise ForeignJobDir(_foreign(jd, owner, found))
    for name in ("logs", "checkpoints", "metrics"):  # their owners and modes: ownership.prepare
        jobs.make_dir(f"{jd.root.name}/{name}", 0o750)


def _foreign(jd: JobDir, owner: dict[str, Any], found: dict[str, Any] | None) -> str:
    if found is None:
        return f"{jd.root} exists but was not made by job {owner['job_id']} (it has no {jd.owner_file.name})"
    whose = "this store" if found.get("store") == owner["store"] else f"another store ({found.get('store')})"
    return (f"{jd.root} exists and belongs to job {found.get('job_id')} (key {found.get('key')}) of {whose}, "
            f"not to job {owner['job_id']} (key {owner['key']})")


def _create(jd: JobDir, owner: dict[str, Any]) -> None:
    """The directory with its owner file, appearing under its name only when complete."""
    jobs = _jobs(jd)
    tmp = f".new-{jd.root.name}-{os.getpid()}-{threading.get_ident()}"
    jobs.remove_tree(tmp)  # a leftover of a crash at this very point
    jobs.make_dir(tmp, 0o700)
    try:
        jobs.write_json(f"{tmp}/{OWNER_FILE}", owner)
        jobs.rename(tmp, jd.root.name)  # fails if something non-empty took the name meanwhile
    except OSError:
        jobs.remove_tree(tmp)
        if jobs.lstat(jd.root.name) is None:
            raise  # a real failure to create it; a name taken meanwhile is judged by the caller


def _write_owner(jd: JobDir, owner: dict[str, Any]) -> None:
    _jobs(jd).write_json(f"{jd.root.name}/{OWNER_FILE}", owner)
