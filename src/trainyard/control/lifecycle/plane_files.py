"""The plane's own files in its data dir, kept out of the jobs' reach (design rule 6).

    <data dir>/            plane 0711  jobs pass through to their job dir; nobody lists it
        jobs/              plane 0711  (`control/jobfiles/ownership.py`: each job dir is its owner's and team's)
        trainyard.db*      plane 0600  the store (SQLite gives its -wal and -shm files the same mode)
        admin.token        plane 0600
        server.json        plane 0600
        tmp/               plane 0700  the jobs' private /tmp mounts (`backends/contain/private_tmp.py`):
                                       set itself, never walked (what is inside is the jobs')
        anything else      plane 0700 (directories, e.g. the emulated nodes' state) / 0600 (files)

`protect` sets those modes when the plane starts (a data dir made by an older version had its
store and logs at 0644). `jobs/` may be a link an admin made, or `yard up --jobs-dir` made
(`use_jobs_dir`), to a directory on another file system, or a mount point: job dirs then cannot
fill the store's disk. Every part of the plane reaches job dirs as `<data dir>/jobs/<name>`, and
`jobfs` opens `jobs/` itself as the root it walks from (following that one link, the admin's),
never a link below it. The jobs of a plane that runs as root run as other accounts and get no
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
JOBS_INSIDE = ("tmp",)  # the plane's directory, the jobs' files inside: its mode only, never a walk


def protect(data_dir: Path) -> None:
    """Set the modes of the module docstring on `data_dir` and its entries (not inside `jobs/`)."""
    os.chmod(data_dir, PASS_THROUGH)
    for entry in os.scandir(data_dir):
        if entry.is_symlink():
            continue
        if entry.name in PUBLIC_ENTRIES:
            os.chmod(entry.path, PASS_THROUGH)
        elif entry.name in JOBS_INSIDE and entry.is_dir():
            os.chmod(entry.path, 0o700)
        elif entry.is_dir():
            _private_tree(Path(entry.path))
        else:
            os.chmod(entry.path, 0o600)


def _private_tree(d: Path) -> None:
    os.chmod(d, 0o700)
    dev = os.lstat(d).st_dev
    for root, dirs, files in os.walk(d):  # os.walk does not descend into links
        dirs[:] = [x for x in dirs if os.lstat(os.path.join(root, x)).st_dev == dev]  # nor into a mount
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


class JobsDirError(ValueError):
    """`--jobs-dir` cannot be used as asked; the message says what is there and what to do."""


def use_jobs_dir(data_dir: Path, target: Path) -> None:
    """Keep job dirs in `target` (`yard up --jobs-dir`): `<data dir>/jobs` becomes a link to it
    (made with mode 0711 when missing). A link to the same place, or a mount of it there, is kept;
    an empty `jobs/` is replaced. Existing job dirs are never moved by the plane.

    Raises:
        JobsDirError: `target` is not absolute or not a directory, or `jobs/` is a link elsewhere,
            or a directory that holds job dirs (move them first: the message says how).
    """
    if not target.is_absolute():
        raise JobsDirError(f"expected an absolute path, got {str(target)!r}")
    try:
        target.mkdir(mode=PASS_THROUGH, parents=True, exist_ok=True)
    except OSError as e:
        raise JobsDirError(f"cannot make {target}: {e.strerror or e}") from None
    if not target.is_dir():
        raise JobsDirError(f"{target} is not a directory")
    link = data_dir / "jobs"
    try:
        st = os.lstat(link)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        if os.path.realpath(link) != os.path.realpath(target):
            raise JobsDirError(f"{link} already links to {os.readlink(link)}; to move the job dirs, stop the plane, "
                               f"move them, and replace the link (or give --jobs-dir {os.path.realpath(link)})")
    elif st is not None and stat.S_ISDIR(st.st_mode) and not os.path.samefile(link, target):
        if any(os.scandir(link)):
            raise JobsDirError(f"{link} holds job dirs; with the plane stopped, move them (mv {link}/* {target}/), "
                               f"remove it (rmdir {link}) and start again")
        try:
            os.rmdir(link)
        except OSError as e:
            raise JobsDirError(f"cannot replace {link}: {e.strerror or e}") from None
        st = None
    elif st is not None and not stat.S_ISDIR(st.st_mode):
        raise JobsDirError(f"{link} is there and is not a directory")
    if st is None:
        os.symlink(target, link)
    os.chmod(target, PASS_THROUGH)


def jobs_dir_note(data_dir: Path) -> str:
    """Where job dirs live, for `yard up`'s start-up lines."""
    link = data_dir / "jobs"
    try:
        where, other = os.path.realpath(link), os.stat(link).st_dev != os.stat(data_dir).st_dev
    except OSError:
        return f"job dirs in {link} (on the store's file system; yard up --jobs-dir puts them on another)"
    if other:
        return f"job dirs in {where}, on another file system than the store's"
    return f"job dirs in {where}, on the store's file system (yard up --jobs-dir puts them on another)"
