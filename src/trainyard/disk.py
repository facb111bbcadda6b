"""Free space on a file system: one definition for the health checks, the metrics and the storage
reserve (`control/lifecycle/storage.py`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer can still use on `path`'s file system (statvfs f_bavail)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@dataclass(frozen=True)
class Space:
    """A file system's size and what is left of it, for an unprivileged writer (a job)."""

    dev: int  # st_dev of the directory measured: two paths on one file system share it
    size: int
    free: int
    inodes: int  # 0 where the file system does not count them (btrfs)
    inodes_free: int


def space(directory: str | Path) -> Space:
    """The file system of `directory`, one of the plane's own (its data dir, its `jobs/`, which an
    admin may have made a link to or a mount point of another file system: followed)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        st, vfs = os.fstat(fd), os.fstatvfs(fd)
    finally:
        os.close(fd)
    return Space(st.st_dev, vfs.f_blocks * vfs.f_frsize, vfs.f_bavail * vfs.f_frsize, vfs.f_files, vfs.f_favail)
