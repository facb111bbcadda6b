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


def committed_steps(tree: Tree, checkpoints: str | os.PathLike[str], marker: str = "COMMITTED") -> list[tuple[int, Path]]:
    """(step, directory) of every committed `step-N/` (a real directory with a regular `marker`
    file in it; links are not followed), oldest first: the plane's side of the checkpoint contract
    (`contracts.committed_steps` is the job's)."""
    out = []
    for name, mode in tree.list_dir(checkpoints):
        if name.startswith("step-") and name[5:].isascii() and name[5:].isdigit() and stat.S_ISDIR(mode):
            st = tree.lstat(PurePosixPath(*tree.parts(checkpoints), name, marker))
            if st is not None and stat.S_ISREG(st.st_mode):
                out.append((int(name[5:]), tree.root.joinpath(*tree.parts(checkpoints), name)))
    return sorted(out)


def newest_checkpoint(tree: Tree, checkpoints: str | os.PathLike[str],
                      marker: str = "COMMITTED") -> tuple[int, Path, float] | None:
    """(step, directory, the marker's mtime) of the newest committed checkpoint, or None."""
    steps = committed_steps(tree, checkpoints, marker)
    if not steps:
        return None
    step, where = steps[-1]
    st = tree.lstat(where / marker)
    return (step, where, st.st_mtime) if st is not None else None
