"""`--output` checked at submission, before anything is stored or created.

Slurm's `--output` names where a job's log appears; trainyard keeps every log in the job's
directory and links the asked-for path to it (`control/loop/attempt_start.py`, `jobfs.link_inside`).
The control plane may run with more rights than the job's owner, so the link is made *as the
owner*: inside the job's working directory (as written: the check is lexical, nothing is resolved
as root) through no symbolic link below it, and anywhere else the owner may write (an absolute
path outside it: `/scratch/logs/%x-%j.out`, as Slurm writes a job's output wherever its user
may). What can be known at submission is refused then, with a 400 naming `output`, instead of
being skipped at launch with a line in the plane's log that the user never sees (the file system
is looked at *as the owner*, `jobfs.as_owner`, so a member learns nothing of paths only root may
see):

- a path outside the working directory where the owner may not write (`place_problem`, as the
  owner), or whose name is taken by what is not a link;
- a directory on the way that is a symbolic link, or not a directory;
- a final name that is a directory, or a file that is not a link (the plane replaces only links).

The pattern's `%j %t %x %A %a %u %N ...` (`spec/io_patterns.py`) are filled with sample values for
the check; the directories that depend on them are checked again, and created safely, at launch.
`-e/--error` (stderr apart, linked to the rank's `rank-<r>.err`) is checked the same way, as field
`error`.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trainyard import jobfs
from trainyard.spec import io_patterns
from trainyard.services.errors import ServiceError

CHECK_S = 2.0  # a way on a hung mount holds a submit this long at most (outside the plane's lock)
SAMPLE = {"A": "1", "a": "0", "b": "0", "j": "1", "J": "1.batch", "s": "batch", "N": "node", "n": "0", "t": "0",
          "u": "user", "x": "job"}


def relative_to_workdir(path: Path, workdir: str) -> Path | None:
    """`path` (absolute, or relative to the working directory) relative to `workdir`; None if it
    lies outside it. Lexical: `..` and `.` are folded, links are not resolved (the plane resolves
    nothing an owner can change; `link_inside` then refuses a link on the way)."""
    if not path.is_absolute():
        return path
    norm, base = Path(os.path.normpath(path)), Path(os.path.normpath(workdir))
    return norm.relative_to(base) if norm.is_relative_to(base) else None


def check(pattern: str, workdir: str, field: str = "output", owner: jobfs.Account | None = None) -> None:
    """Refuse an `--output` (or `--error`: `field`) the plane would not link (see the module
    docstring); the way is looked at as `owner` (the account the job runs as).

    Raises:
        ServiceError: field `field`, saying which part of the path is the problem.
    """
    try:
        sample = io_patterns.expand(io_patterns.check(pattern, f"--{field}"), SAMPLE)
    except ValueError as e:
        raise ServiceError(str(e), field=field) from None
    rel = relative_to_workdir(Path(sample), workdir)
    if rel is None:  # elsewhere: wherever the owner may write, looked at as the owner
        try:
            problem = jobfs.as_owner(owner, jobfs.place_problem, os.path.normpath(sample), timeout_s=CHECK_S)
        except OSError as e:
            problem = f"cannot look at it: {e.strerror or e}"
        if problem is not None:
            raise ServiceError(f"--{field} {pattern}: {problem} (the job's owner makes the link there)", field=field)
        return
    if not rel.parts or rel.name in ("", ".", ".."):
        raise ServiceError(f"--{field} {pattern} names no file in the working directory", field=field)
    try:
        way = jobfs.as_owner(owner, jobfs.lstat_way, workdir, str(rel), timeout_s=CHECK_S)
    except OSError as e:
        raise ServiceError(f"--{field} {pattern}: cannot look at {workdir}: {e.strerror or e}", field=field) from None
    here = Path(workdir)
    for i, (part, found) in enumerate(zip(rel.parts, way)):
        here = here / part
        if found is None:
            return  # made at launch, with the rest of the way
        if isinstance(found, str):
            raise ServiceError(f"--{field} {pattern}: cannot look at {here}: {found}", field=field)
        last = i == len(rel.parts) - 1
        if stat.S_ISLNK(found):
            if last:
                return  # an older link: replaced at launch
            raise ServiceError(f"--{field} {pattern}: {here} is a symbolic link; the log is linked through none",
                               field=field)
        if not last and not stat.S_ISDIR(found):
            raise ServiceError(f"--{field} {pattern}: {here} is not a directory", field=field)
        if last:
            raise ServiceError(f"--{field} {pattern}: {here} exists and is not a link; only a link is replaced",
                               field=field)
