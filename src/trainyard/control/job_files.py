"""A job's directory, made for the account it runs as: who owns what, with which mode, and why.

    jobs/                    plane        0711  anyone may pass through to a job dir it knows, none list
    jobs/<id>/               plane:G      0750  the owner and its team (G) enter; nobody else does
        logs/                plane:G      0750
            rank-<r>.log     owner:G      0640  the job writes its log, its team reads it
            rank-<r>.err     owner:G      0640  its stderr, with -e/--error
        run/                 plane:G      0750  a backend's run state (the Slurm backend hands each
                                                attempt's dir to the owner, whose tasks write there)
        script.sh            plane:G      0640  a batch script the ranks read, not change
        checkpoints/         owner:G      2750  what the job writes: files it makes get group G
        metrics/             owner:G      2750

G is the team's Unix group when the account is one of its members, else the account's own
primary group (`services.owners.resolve`). The modes are those of issue 15's "0750, group = team"
with one deliberate difference: the job dir itself and the directories the plane writes in
(`logs/`, `run/`) belong to the plane, not to the job's owner. The plane runs as root and writes
there (rank logs opened by path, run records, the batch script); were those directories the
owner's, a job could swap one for a link between two attempts and have root write, chown or
append wherever the link points. The owner gets write access where the job writes, and nowhere
the plane does.

Everything is done through directory file descriptors opened with O_NOFOLLOW, so no step follows
a link, whatever an earlier attempt left behind; an existing directory gets its owner and mode
set again on every launch.
"""

from __future__ import annotations

import os
import stat

from trainyard.contracts import JobDir
from trainyard.services.owners import Identity

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _subdir(parent_fd: int, name: str, uid: int, gid: int, mode: int) -> int:
    """Open (creating it) directory `name` under `parent_fd`, owned uid:gid with `mode`; its fd."""
    try:
        os.mkdir(name, 0o700, dir_fd=parent_fd)
    except FileExistsError:
        pass
    fd = os.open(name, _DIR, dir_fd=parent_fd)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _file(dir_fd: int, name: str, uid: int, gid: int, mode: int, text: str | None = None) -> None:
    """Create `name` (or keep it, when it exists and `text` is None) owned uid:gid with `mode`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_EXCL if text is not None else os.O_APPEND)
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        return  # the batch script of an earlier attempt: the same text
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
        if text is not None:
            os.write(fd, text.encode())
    finally:
        os.close(fd)


def prepare(jd: JobDir, who: Identity, ranks: list[int], script: str | None = None, *, errors: bool = False,
            truncate: bool = False) -> None:
    """Make `jd` (see the module docstring) for a job running as `who`, with an empty log per rank
    (and a stderr file per rank: `errors`, sbatch's -e/--error) and, for a batch job, its script.
    `truncate` (--open-mode=truncate): every log and stderr file of the job dir is emptied first,
    the earlier attempts' output with it, as Slurm truncates a job's output files at each start.

    Raises:
        OSError: a directory cannot be created, or one is a link (ELOOP).
    """
    plane = os.geteuid()
    owner, g = who.owner.uid, who.group
    jobs = jd.root.parent
    jobs.mkdir(parents=True, exist_ok=True)
    top = os.open(jobs, _DIR)
    try:
        os.fchmod(top, 0o711)
        root = _subdir(top, jd.root.name, plane, g, 0o750)
    finally:
        os.close(top)
    try:
        for name, uid, mode in (("checkpoints", owner, 0o2750), ("metrics", owner, 0o2750), ("run", plane, 0o750)):
            os.close(_subdir(root, name, uid, g, mode))
        logs = _subdir(root, "logs", plane, g, 0o750)
        try:
            if truncate:
                _truncate_all(logs)
            for r in ranks:
                _file(logs, jd.rank_log(r).name, owner, g, 0o640)
                if errors:
                    _file(logs, jd.rank_err(r).name, owner, g, 0o640)
        finally:
            os.close(logs)
        if script is not None:
            _file(root, jd.script.name, plane, g, 0o640, script)
    finally:
        os.close(root)


def _truncate_all(logs_fd: int) -> None:
    """Empty every `rank-*.log` / `rank-*.err` regular file in the logs dir (never through a link,
    never blocking on a FIFO: the job's owner owns the files, though not the directory)."""
    for name in os.listdir(logs_fd):
        if not (name.startswith("rank-") and name.endswith((".log", ".err"))):
            continue
        try:
            fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=logs_fd)
        except OSError:
            continue  # a link or something else that is no log: left alone
        try:
            if stat.S_ISREG(os.fstat(fd).st_mode):
                os.ftruncate(fd, 0)
        finally:
            os.close(fd)
