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
        exports/             owner:G      2750  a recipe's relative `export:` (recipes/export.py)

G is the team's Unix group when the account is one of its members, else the account's own
primary group (`services.owners.resolve`). The modes are those of issue 15's "0750, group = team"
with one deliberate difference: the job dir itself and the directories the plane writes in
(`logs/`, `run/`) belong to the plane, not to the job's owner. The plane runs as root and writes
there (rank logs opened by path, run records, the batch script); were those directories the
owner's, a job could swap one for a link between two attempts and have root write, chown or
append wherever the link points. The owner gets write access where the job writes, and nowhere
the plane does.

Everything is done through `jobfs.Tree` (directory descriptors opened with O_NOFOLLOW), so no
step follows a link, whatever an earlier attempt left behind; an existing directory gets its owner
and mode set again on every launch.
"""

from __future__ import annotations

import stat

from trainyard import jobfs
from trainyard.contracts import JobDir
from trainyard.services.owners import Identity


def prepare(jd: JobDir, who: Identity, ranks: list[int], script: str | None = None, *, errors: bool = False,
            truncate: bool = False) -> None:
    """Make `jd` (see the module docstring) for a job running as `who`, with an empty log per rank
    (and a stderr file per rank: `errors`, sbatch's -e/--error) and, for a batch job, its script.
    `truncate` (--open-mode=truncate): every log and stderr file of the job dir is emptied first,
    the earlier attempts' output with it, as Slurm truncates a job's output files at each start.

    Raises:
        OSError: a directory cannot be created, or one is a link (`jobfs.Refused`).
    """
    plane = jobfs.plane_uid()
    owner, g = who.owner.uid, who.group
    jobfs.plane_dir(jd.root.parent, 0o711)
    jobs = jobfs.Tree(jd.root.parent)
    top = jd.root.name
    jobs.make_dir(top, 0o750, owner=(plane, g))
    for name, uid, mode in (("checkpoints", owner, 0o2750), ("metrics", owner, 0o2750), ("exports", owner, 0o2750),
                            ("run", plane, 0o750), ("logs", plane, 0o750)):
        jobs.make_dir(f"{top}/{name}", mode, owner=(uid, g))
    if truncate:
        _truncate_all(jobs, f"{top}/logs")
    for r in ranks:
        jobs.create_file(f"{top}/logs/{jd.rank_log(r).name}", mode=0o640, owner=(owner, g))
        if errors:
            jobs.create_file(f"{top}/logs/{jd.rank_err(r).name}", mode=0o640, owner=(owner, g))
    if script is not None and jobs.lstat(f"{top}/{jd.script.name}") is None:
        jobs.create_file(f"{top}/{jd.script.name}", script.encode(), 0o640, owner=(plane, g))  # an earlier
        # attempt's script is the same text: kept


def _truncate_all(jobs: jobfs.Tree, logs: str) -> None:
    """Empty every `rank-*.log` / `rank-*.err` regular file in the logs dir (never through a link,
    never blocking on a FIFO: the job's owner owns the files, though not the directory)."""
    for name, mode in jobs.list_dir(logs):
        if name.startswith("rank-") and name.endswith((".log", ".err")) and stat.S_ISREG(mode):
            jobs.truncate(f"{logs}/{name}")
