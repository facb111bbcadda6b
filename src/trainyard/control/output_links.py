"""Making a `--output` link inside a working directory, through no symbolic link.

The control plane may have more rights than the job's owner, and the owner controls the working
directory: a directory on the way could be replaced by a link to `/etc` between submission (where
`services/output_paths.py` checked it) and launch. So the way is walked with directory file
descriptors: each directory is created (if missing) inside the one before and then opened with
`O_NOFOLLOW`, which refuses a link; the link itself is made relative to the last one. Nothing is
ever created outside the working directory, even while someone swaps links under it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trainyard.backends.base import Owner


class Refused(Exception):
    """The link was not made; the message says why."""


def link_inside(workdir: Path, rel: Path, target: Path, owner: Owner | None = None) -> None:
    """Make `workdir/rel` a symbolic link to `target`, creating the directories of `rel` as needed;
    an older link there is replaced, anything else is left alone. With an `owner` (the job's
    account, LaunchSpec.owner) what is created belongs to it, as if the job had made it.

    Raises:
        Refused: a part of the way is a link or not a directory, or the name is taken.
        OSError: the file system refused (no space, no permission, ...).
    """
    parts = rel.parts
    if not parts or rel.is_absolute() or any(p in ("", ".", "..") for p in parts):
        raise Refused(f"{rel} is not a path inside the working directory")
    fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            made = True
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                made = False
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as e:  # ELOOP: a link; ENOTDIR: a file
                raise Refused(f"{part} in {rel} is a symbolic link or not a directory ({e.strerror})") from None
            if made and owner is not None:
                os.fchown(nxt, owner.uid, owner.gid)
            os.close(fd)
            fd = nxt
        name = parts[-1]
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISLNK(st.st_mode):
            raise Refused(f"{rel} exists and is not a link; not replaced")
        if st is not None:
            os.unlink(name, dir_fd=fd)
        os.symlink(target, name, dir_fd=fd)
        if owner is not None:
            os.chown(name, owner.uid, owner.gid, dir_fd=fd, follow_symlinks=False)
    finally:
        os.close(fd)
