"""The plane's own files in its data dir, kept out of the jobs' reach (DESIGN rule 6).

    <data dir>/            plane 0711  jobs pass through to their job dir; nobody lists it
        jobs/              plane 0711  (`control/job_files.py`: each job dir is its owner's and team's)
        trainyard.db*      plane 0600  the store (SQLite gives its -wal and -shm files the same mode)
        admin.token        plane 0600
        server.json        plane 0600
        anything else      plane 0700 (directories, e.g. the emulated nodes' state) / 0600 (files)

`protect` sets those modes when the plane starts (a data dir made by an older version had its
store and logs at 0644). The jobs of a plane that runs as root run as other accounts and get no
way in; those of a plane run as a plain user run as that user and read everything here anyway,
which `yard up` says at start (`services.owners.notes`).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

PASS_THROUGH = 0o711
PUBLIC_ENTRIES = ("jobs",)


def protect(data_dir: Path) -> None:
    """Set the modes of the module docstring on `data_dir` and its entries (not inside `jobs/`)."""
    os.chmod(data_dir, PASS_THROUGH)
    for entry in os.scandir(data_dir):
        if entry.is_symlink():
            continue
        if entry.name in PUBLIC_ENTRIES:
            os.chmod(entry.path, PASS_THROUGH)
        elif entry.is_dir():
            _private_tree(Path(entry.path))
        else:
            os.chmod(entry.path, 0o600)


def _private_tree(d: Path) -> None:
    os.chmod(d, 0o700)
    for root, dirs, files in os.walk(d):  # os.walk does not descend into links
        for name in dirs + files:
            path = os.path.join(root, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISDIR(mode):
                os.chmod(path, 0o700)
            elif stat.S_ISREG(mode):
                os.chmod(path, 0o600)


def write_private(path: Path, text: str) -> None:
    """Write `path` atomically with mode 0600 (readers see the old file or the whole new one)."""
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
