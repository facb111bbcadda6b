"""The plane's own directories, run records (small files in a directory whose own name only the
plane can change) and checkpoint markers, as the plane reads them."""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from trainyard.jobfs.tree import JSON_MAX, Tree


# -- the plane's own directories -------------------------------------------------------------------


def plane_uid() -> int:
    """The account the plane runs as (what owns its data dir, `jobs/`, each job dir, run dirs)."""
    return os.geteuid()


def plane_dir(path: str | os.PathLike[str], mode: int | None = None) -> None:
    """Make a directory of the plane's own with its parents (its data dir, `jobs/`): a path that
    no job can change, so plain `makedirs`; `mode` is set when given."""
    os.makedirs(path, exist_ok=True)
    if mode is not None:
        os.chmod(path, mode)


# -- run records: small files in a directory whose own name only the plane can change --------------
# A backend's run dir (`<job dir>/run/attempt-<a>/`) sits in the plane's `run/`; on Slurm it is the
# owner's inside (its tasks write their records there), so its entries are read as a job's are.


def read_record(path: str | os.PathLike[str], limit: int = JSON_MAX) -> Any:
    """The JSON of `path` (its directory is the root): None when missing, not ours or too big."""
    p = Path(path)
    return Tree(p.parent).read_json(p.name, limit)


def write_record(path: str | os.PathLike[str], obj: Any, mode: int = 0o644) -> None:
    """Replace `path` with `obj` atomically (`Tree.write_json`), fsynced."""
    p = Path(path)
    Tree(p.parent).write_json(p.name, obj, mode)


def touch_record(path: str | os.PathLike[str]) -> None:
    """Make an empty marker file `path` (or keep it), never through a link."""
    p = Path(path)
    Tree(p.parent).create_file(p.name)


def record_exists(path: str | os.PathLike[str]) -> bool:
    """Is there an entry `path` (a link counts, and is never followed)?"""
    p = Path(path)
    return Tree(p.parent).lstat(p.name) is not None


# -- checkpoints, as the plane reads them ----------------------------------------------------------


NEWEST_TRIES = 64  # step dirs looked into, newest first, for the newest committed one


def step_dirs(tree: Tree, checkpoints: str | os.PathLike[str]) -> list[int]:
    """The steps N of the real directories `step-N/` in `checkpoints` (links are no steps), in
    order; the listing costs no stat per entry (`Tree.list_dir`)."""
    return sorted(int(name[5:]) for name, mode in tree.list_dir(checkpoints)
                  if name.startswith("step-") and name[5:].isascii() and name[5:].isdigit() and stat.S_ISDIR(mode))


def commit_time(tree: Tree, checkpoints: str | os.PathLike[str], step: int, marker: str = "COMMITTED") -> float | None:
    """The mtime of `step-N/<marker>` when it is a regular file in a real directory (no link
    followed on the way or at the end); None when the step is not committed."""
    try:
        with tree.dir_fd(PurePosixPath(*tree.parts(checkpoints), f"step-{step}")) as fd:
            st = os.stat(marker, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    return st.st_mtime if stat.S_ISREG(st.st_mode) else None


def committed_steps(tree: Tree, checkpoints: str | os.PathLike[str], marker: str = "COMMITTED") -> list[tuple[int, Path]]:
    """(step, directory) of every committed `step-N/` (a real directory with a regular `marker`
    file in it; links are not followed), oldest first: the plane's side of the checkpoint contract
    (`contracts.committed_steps` is the job's)."""
    where = tree.root.joinpath(*tree.parts(checkpoints))
    return [(n, where / f"step-{n}") for n in step_dirs(tree, checkpoints)
            if commit_time(tree, checkpoints, n, marker) is not None]


def newest_checkpoint(tree: Tree, checkpoints: str | os.PathLike[str],
                      marker: str = "COMMITTED") -> tuple[int, Path, float] | None:
    """(step, directory, the marker's mtime) of the newest committed checkpoint, or None. The
    loop asks every pass for every running job, so at most NEWEST_TRIES step dirs are looked
    into, newest first: a job that makes thousands of uncommitted ones costs the plane a listing."""
    where = tree.root.joinpath(*tree.parts(checkpoints))
    for n in reversed(step_dirs(tree, checkpoints)[-NEWEST_TRIES:]):
        if (at := commit_time(tree, checkpoints, n, marker)) is not None:
            return n, where / f"step-{n}", at
    return None
