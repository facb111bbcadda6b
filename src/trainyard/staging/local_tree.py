"""A local file or directory walked without following a link: what a path source is made of.

Why: a path source is chosen by a member, and the plane (root) copies it. Every step below the
source's own path is opened with `O_NOFOLLOW` from its directory's descriptor, after an `lstat`
that says it is a regular file or a directory, and the opened descriptor is checked to be the
same inode: a link, a FIFO, a socket or a device anywhere in the source is refused (never opened:
a FIFO would hang the reader, a tape device rewind), and swapping a directory for a link between
two steps gets the swap refused, not followed. The directories above the source's path are the
member's way to it and are resolved as the member would resolve them (the reader runs as them:
`staging/as_reader.py`).

A directory is walked depth first in name order; a file is read in chunks of `CHUNK` bytes, so
memory never grows with a file's size. Only names and sizes are kept, and at most `MAX_FILES`
files and `MAX_DEPTH` levels are walked (more is refused: no source makes the plane hold an
unbounded list).

Standard library only, and only `os` calls on the way: it runs in a forked child of a threaded
plane (`staging/as_reader.py`).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

CHUNK = 1 << 20
MAX_FILES = 1_000_000
MAX_DEPTH = 128
_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class NotPlain(OSError):
    """A source holds what is not a regular file or a directory (a link, a FIFO, ...), or is too big
    a tree to walk; the message names the path."""


@dataclass
class Visitor:
    """What a walk does with what it meets. `rel` is the path below the source as bytes (`b""`
    for the source itself: a file source's file, or a directory source's directory, which comes
    first); `on_file` gets an open descriptor (read it, do not close it)."""

    on_dir: Callable[[bytes], None]
    on_file: Callable[[bytes, int, int], None]  # (rel, fd, size)


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file or a directory"


def _show(top: str, rel: bytes) -> str:
    return os.path.join(top, os.fsdecode(rel)) if rel else top


def _open_checked(name: str | bytes, dir_fd: int | None, shown: str) -> tuple[int, os.stat_result]:
    """Open `name` (under `dir_fd`) when it is a regular file or a directory, never following a link
    and never opening anything else; the descriptor and its stat."""
    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise NotPlain(errno.EPERM, f"{shown} is {_what(st.st_mode)}; a dataset holds only regular files and directories")
    try:
        fd = os.open(name, _OPEN, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotPlain(errno.ELOOP, f"{shown} is a symbolic link; a dataset holds no links") from None
        raise
    got = os.fstat(fd)
    if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino) or stat.S_IFMT(got.st_mode) != stat.S_IFMT(st.st_mode):
        os.close(fd)
        raise NotPlain(errno.EAGAIN, f"{shown} changed while it was opened")
    if stat.S_ISREG(got.st_mode):
        os.set_blocking(fd, True)
    return fd, got


def walk(top: str, visit: Visitor) -> str:
    """Walk source `top` (a file or a directory), calling `visit` for it, each directory below it and
    each regular file; its kind, "file" or "dir".

    Raises:
        NotPlain: a link, FIFO, socket or device in it, or more than MAX_FILES files or MAX_DEPTH levels.
        OSError: what the kernel said (missing, no permission, I/O error).
    """
    if top.endswith("/") and top != "/":
        top = top.rstrip("/")
    fd, st = _open_checked(top, None, top)
    if stat.S_ISREG(st.st_mode):
        try:
            visit.on_file(b"", fd, st.st_size)
        finally:
            os.close(fd)
        return "file"
    files = 0
    stack: list[tuple[int, bytes, list[str]]] = []
    try:
        visit.on_dir(b"")
        stack.append((fd, b"", sorted(os.listdir(fd), key=os.fsencode)[::-1]))
        while stack:
            dfd, rel, names = stack[-1]
            if not names:
                os.close(dfd)
                stack.pop()
                continue
            name = os.fsencode(names.pop())
            sub = rel + b"/" + name if rel else name
            shown = _show(top, sub)
            cfd, cst = _open_checked(name, dfd, shown)
            if stat.S_ISDIR(cst.st_mode):
                if len(stack) >= MAX_DEPTH:
                    os.close(cfd)
                    raise NotPlain(errno.E2BIG, f"{shown}: deeper than {MAX_DEPTH} levels")
                visit.on_dir(sub)
                try:
                    listing = sorted(os.listdir(cfd), key=os.fsencode)[::-1]
                except BaseException:
                    os.close(cfd)
                    raise
                stack.append((cfd, sub, listing))
                continue
            try:
                files += 1
                if files > MAX_FILES:
                    raise NotPlain(errno.E2BIG, f"{top}: more than {MAX_FILES:,} files")
                visit.on_file(sub, cfd, cst.st_size)
            finally:
                os.close(cfd)
    finally:
        for dfd, _, _ in stack:
            os.close(dfd)
    return "dir"


def read_chunks(fd: int, sink: Callable[[bytes], None]) -> int:
    """Read `fd` to its end in CHUNK-sized pieces into `sink`; the bytes read."""
    n = 0
    while True:
        data = os.read(fd, CHUNK)
        if not data:
            return n
        n += len(data)
        sink(data)
