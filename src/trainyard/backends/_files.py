"""Run-state files both backends keep in a job's run dir (`attempt.json`, the runners' records):
written atomically, so a reader sees the old state or the whole new one, never half a file.

Some of these directories belong to the job's owner (a Slurm attempt's run dir, where its tasks
write their records as the owner; a job's `metrics/`), while the plane reading and writing them
runs as root. So nothing here follows a link or waits on a FIFO the owner left in their place:
`open_untrusted` opens only a regular file, without following a last-component link and without
blocking, and `write_json` creates its temporary file with O_EXCL|O_NOFOLLOW under a random name
(a link planted there makes the write fail, never write through it); `os.replace` replaces a
link at the final name, it does not follow it.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from pathlib import Path
from typing import BinaryIO


def open_untrusted(path: Path | str) -> BinaryIO:
    """`path` opened for reading, only if it is a regular file and not a link (binary mode).

    Raises:
        OSError: missing, a link (ELOOP), or not a regular file (EINVAL): a FIFO or a device.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_json(path: Path) -> dict | None:
    """The file's object, or None when it is missing or not one of ours (atomic writes are whole)."""
    try:
        with open_untrusted(path) as f:
            return json.load(f)
    except (ValueError, OSError):
        return None


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def touch(path: Path) -> None:
    """Create an empty marker file (or keep it), never through a link."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    except FileExistsError:
        pass
