"""The one way the control plane touches files a job's owner can change (DESIGN rule 7).

Why: the plane often runs as root, and a job's owner controls much of what lies under the job's
directory (checkpoints/, metrics/, a Slurm attempt's run dir) and all of its working directory. A
hostile member can put a link, a FIFO, a device or a gigabyte where the plane reads or writes, and
swap a directory for a link between two steps of a launch. Every such read, write, listing, mkdir,
chown and link of the plane goes through this module, and `tests/test_architecture.py` fails when
`control/`, `services/`, `api/` or the plane's side of `backends/` does it another way.

Two ways in, after what the path is:

- **Under a root the plane owns** (`Tree`): its data dir, a job's directory (plane-owned, 0750,
  inside the plane's `jobs/`). The way from the root is walked one component at a time with
  `O_NOFOLLOW|O_DIRECTORY` descriptors, so no link anywhere below the root is followed, whatever
  is swapped between two calls (the `openat2(RESOLVE_NO_SYMLINKS|RESOLVE_BENEATH)` guarantee,
  built from calls every kernel has). A file is opened `O_NOFOLLOW|O_NONBLOCK` (a FIFO opens at once
  instead of waiting for a writer) and used only when `fstat` says it is a regular file; one read
  has a file with a second name refused too (a hard link may be anyone's file). Every read is
  bounded: a page (`read_range`), the end (`read_tail`), a small record (`read_json`), or windows
  spread over a big file (`sample_lines`): the plane's memory never grows with what a job writes.
- **Where the owner chooses** (`as_owner`: the working directory, `--output` paths): done in a
  short-lived child that has dropped to the owner's groups, gid and uid, so the kernel checks every
  step as it would for the owner, as Slurm's slurmstepd opens a job's output as the user. The child
  is killed after a timeout, so a hung file system or a FIFO never holds the plane.

Errors are `OSError`s: `Refused` (a link, not a regular file or directory, a path that leaves its
root) or what the kernel said. Standard library only: the backends use it too.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import select
import signal
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Protocol, TypeVar

T = TypeVar("T")

PAGE_MAX = 8 << 20  # the most bytes one read hands out (an API page of a log)
JSON_MAX = 1 << 20  # a run record, an owner file: far smaller; anything bigger is not one of ours
TAIL_DEFAULT = 256 << 10
OWNER_TIMEOUT_S = 10.0
USAGE_OPEN_DIRS = 32  # descriptors a `UsageWalk` run holds at most (and one for its top)
USAGE_PENDING = 1 << 16  # subdirectory names a walk keeps waiting (then it walks them and scans on)
USAGE_LINKS = 1 << 16  # files with several names a walk remembers (beyond: counted again, never less)

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(OSError):
    """The plane will not touch this path: a link, not a regular file (or directory), or outside
    its root. The message names the path and why."""

    def __init__(self, path: str | os.PathLike[str], why: str, code: int = errno.EPERM) -> None:
        super().__init__(code, why, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class Account(Protocol):
    """Who a job runs as (`backends.base.Owner` is one)."""

    uid: int
    gid: int
    groups: tuple[int, ...]


@dataclass(frozen=True)
class Chunk:
    """Bytes read from `offset` of a file of `size` bytes (at that moment)."""

    data: bytes
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + len(self.data)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "not a regular file"


class Tree:
    """A directory the plane made and owns, and every path below it, reached through no link.

    `root` itself is opened as given (it is the plane's: its data dir, or a job's directory in
    its `jobs/`); paths are absolute paths under it or relative ones, without `..`."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"Tree({str(self.root)!r})"

    # -- the way down ---------------------------------------------------------------------------

    def parts(self, path: str | os.PathLike[str] = "") -> tuple[str, ...]:
        """The components of `path` below the root.

        Raises:
            Refused: `path` is absolute and not under the root, or has `..`.
        """
        p = PurePosixPath(os.fspath(path))
        if p.is_absolute():
            root = PurePosixPath(os.path.normpath(self.root))
            norm = PurePosixPath(os.path.normpath(p))
            if norm != root and root not in norm.parents:
                raise Refused(path, f"not under {self.root}")
            p = norm.relative_to(root)
        out = tuple(x for x in p.parts if x not in ("", "."))
        if ".." in out:
            raise Refused(path, "a path with '..'")
        return out

    @contextmanager
    def dir_fd(self, path: str | os.PathLike[str] = "", *, create: int | None = None) -> Iterator[int]:
        """A descriptor of directory `path`, every step below the root opened without following a
        link; `create` (a mode): directories that are missing are made with it (umask applies).

        Raises:
            Refused: a step is a link or not a directory.
            FileNotFoundError: a step is missing (and `create` is None).
        """
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in self.parts(path):
                nxt = _step(fd, part, create, path)
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def _parent(self, path: str | os.PathLike[str], create: int | None = None) -> Iterator[tuple[int, str]]:
        parts = self.parts(path)
        if not parts:
            raise Refused(path, "names the root itself")
        with self.dir_fd(PurePosixPath(*parts[:-1]) if len(parts) > 1 else "", create=create) as fd:
            yield fd, parts[-1]

    # -- looking --------------------------------------------------------------------------------

    def lstat(self, path: str | os.PathLike[str]) -> os.stat_result | None:
        """The entry itself (a link is reported as one), or None when it or a step is missing,
        or a step is a link."""
        try:
            with self._parent(path) as (fd, name):
                return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return None

    def is_dir(self, path: str | os.PathLike[str]) -> bool:
        st = self.lstat(path)
        return st is not None and stat.S_ISDIR(st.st_mode)

    def is_file(self, path: str | os.PathLike[str]) -> bool:
        st = self.lstat(path)
        return st is not None and stat.S_ISREG(st.st_mode)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.lstat(path) is not None

    def list_dir(self, path: str | os.PathLike[str] = "", limit: int = 100_000) -> list[tuple[str, int]]:
        """(name, st_mode from lstat) of the entries of directory `path`, sorted by name; at most
        `limit` of them (a job may make millions); [] when it is missing or not reachable."""
        try:
            with self.dir_fd(path) as fd, os.scandir(fd) as it:
                out = []
                for e in it:
                    if len(out) >= limit:
                        break
                    try:
                        out.append((e.name, e.stat(follow_symlinks=False).st_mode))
                    except OSError:
                        continue  # gone meanwhile
        except OSError:
            return []
        return sorted(out)

    # -- reading, always bounded ----------------------------------------------------------------

    @contextmanager
    def open_read(self, path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
        """`path` opened for reading: a regular file with one name, reached through no link,
        never waiting on a FIFO or a device.

        Raises:
            Refused: a link on the way or at the end, a FIFO, socket, device or directory, or a
                file with more than one name (hard link).
            OSError: missing, no permission.
        """
        with self._parent(path) as (dfd, name):
            try:
                fd = os.open(name, _READ, dir_fd=dfd)
            except OSError as e:
                raise _refusal(dfd, name, path, e) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Refused(path, _kind(st.st_mode))
            if st.st_nlink > 1:
                raise Refused(path, f"a file with {st.st_nlink} names (a hard link may be anyone's file)")
            os.set_blocking(fd, True)
            fh = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with fh:
            yield fh

    def read_range(self, path: str | os.PathLike[str], offset: int, limit: int) -> Chunk:
        """Up to `limit` (at most PAGE_MAX) bytes from `offset`; a negative offset counts from the
        end (-N: the last N bytes). None past the end."""
        limit = max(0, min(limit, PAGE_MAX))
        with self.open_read(path) as fh:
            size = os.fstat(fh.fileno()).st_size
            start = max(0, size + offset) if offset < 0 else min(offset, size)
            fh.seek(start)
            return Chunk(fh.read(min(limit, size - start)), start, size)

    def read_tail(self, path: str | os.PathLike[str], limit: int = TAIL_DEFAULT) -> bytes:
        """The last `limit` bytes (at most PAGE_MAX)."""
        return self.read_range(path, -max(1, min(limit, PAGE_MAX)), limit).data

    def tail_lines(self, path: str | os.PathLike[str], limit: int = TAIL_DEFAULT) -> list[bytes]:
        """The whole lines within the last `limit` bytes (a line cut by the window is dropped);
        [] when the file is missing or refused."""
        try:
            c = self.read_range(path, -max(1, min(limit, PAGE_MAX)), limit)
        except OSError:
            return []
        lines = c.data.split(b"\n")
        if c.offset > 0:
            lines = lines[1:]
        return [x for x in lines if x]

    def sample_lines(self, path: str | os.PathLike[str], budget: int = PAGE_MAX, windows: int = 64) -> Iterator[bytes]:
        """Every line of a file of up to `budget` bytes; of a bigger one, the whole lines of
        `windows` windows spread evenly from its start to its end (the last one ending at the
        end), `budget` bytes in all: a curve over a whole long run, read in bounded time and
        memory. Nothing when the file is missing or refused."""
        try:
            with self.open_read(path) as fh:
                size = os.fstat(fh.fileno()).st_size
                if size <= budget:
                    yield from (x for x in fh.read(budget).split(b"\n") if x)
                    return
                width = max(1, budget // max(1, windows))
                stride = (size - width) / max(1, windows - 1)
                for i in range(windows):
                    start = int(i * stride)
                    fh.seek(start)
                    lines = fh.read(width).split(b"\n")
                    lines = lines[1:] if start > 0 else lines
                    yield from (x for x in lines[:-1] if x)  # the window's last line may be cut
                    if i == windows - 1 and lines and lines[-1] and start + width >= size:
                        yield lines[-1]
        except OSError:
            return

    def read_json(self, path: str | os.PathLike[str], limit: int = JSON_MAX) -> Any:
        """The JSON value of a small file, or None when it is missing, refused, bigger than
        `limit` or not JSON (records the plane writes atomically are whole)."""
        try:
            with self.open_read(path) as fh:
                if os.fstat(fh.fileno()).st_size > limit:
                    return None
                return json.loads(fh.read(limit))
        except (OSError, ValueError):
            return None

    def read_text(self, path: str | os.PathLike[str], limit: int = JSON_MAX) -> str | None:
        """A small text file (at most `limit` bytes, else None), or None when missing or refused."""
        try:
            with self.open_read(path) as fh:
                if os.fstat(fh.fileno()).st_size > limit:
                    return None
                return fh.read(limit).decode("utf-8", "replace")
        except OSError:
            return None

    # -- writing, in directories the plane owns -------------------------------------------------

    def write_json(self, path: str | os.PathLike[str], obj: Any, mode: int = 0o644, *, fsync: bool = True) -> None:
        """Replace `path` with `obj` atomically: a temporary file made with O_EXCL|O_NOFOLLOW under
        a random name (a link planted there makes the write fail, never write through it), then
        renamed over the name (a rename replaces a link, it does not follow it)."""
        self.write_bytes(path, json.dumps(obj).encode(), mode, fsync=fsync)

    def write_bytes(self, path: str | os.PathLike[str], data: bytes, mode: int = 0o644, *,
                    owner: tuple[int, int] | None = None, fsync: bool = True) -> None:
        """Replace `path` with `data` atomically (see `write_json`); `owner`: (uid, gid) to give it."""
        with self._parent(path) as (dfd, name):
            tmp = f".{name}.tmp.{os.getpid()}.{secrets.token_hex(4)}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dfd)
            try:
                try:
                    if owner is not None:
                        os.fchown(fd, *owner)
                    os.fchmod(fd, mode)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                    if fsync:
                        os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
                raise

    def create_file(self, path: str | os.PathLike[str], data: bytes = b"", mode: int = 0o644, *,
                    owner: tuple[int, int] | None = None, exist_ok: bool = True) -> bool:
        """Make `path` with `data` unless it exists (never through a link); True when made here.
        `owner`: (uid, gid) it is given, and with `exist_ok` an existing regular file is given it
        again (with `mode`), as an earlier attempt left it."""
        with self._parent(path) as (dfd, name):
            try:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dfd)
                made = True
            except FileExistsError:
                if not exist_ok:
                    raise
                if owner is None:
                    return False
                fd = self._open_regular(dfd, name, path, os.O_WRONLY)
                made = False
            try:
                if owner is not None:
                    os.fchown(fd, *owner)
                os.fchmod(fd, mode)
                if made and data:
                    os.write(fd, data)
            finally:
                os.close(fd)
            return made

    @staticmethod
    def _open_regular(dfd: int, name: str, path: str | os.PathLike[str], flags: int) -> int:
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
        except OSError as e:
            raise _refusal(dfd, name, path, e) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise Refused(path, _kind(st.st_mode))
        os.set_blocking(fd, True)
        return fd

    def open_append(self, path: str | os.PathLike[str], *, create: bool = True) -> BinaryIO:
        """`path` opened for appending (made 0644 when missing and `create`): a regular file
        reached through no link; never a FIFO or a device."""
        with self._parent(path) as (dfd, name):
            if create:
                try:
                    os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                     0o644, dir_fd=dfd))
                except FileExistsError:
                    pass
            fd = self._open_regular(dfd, name, path, os.O_WRONLY | os.O_APPEND)
        return os.fdopen(fd, "ab")

    def truncate(self, path: str | os.PathLike[str]) -> bool:
        """Empty a regular file (never through a link, never a FIFO); False when it is not one."""
        try:
            with self._parent(path) as (dfd, name):
                fd = self._open_regular(dfd, name, path, os.O_WRONLY)
        except OSError:
            return False
        try:
            os.ftruncate(fd, 0)
        finally:
            os.close(fd)
        return True

    def make_dir(self, path: str | os.PathLike[str], mode: int | None = 0o755, *,
                 owner: tuple[int, int] | None = None, parents: bool = False, exist_ok: bool = True) -> None:
        """Make directory `path` (or keep it, with `exist_ok`) and give it `owner` (uid, gid) and
        `mode` (None: as made, 0755 less the umask, or as found) through a descriptor opened
        without following a link: what an earlier attempt left is made right again. `parents`:
        missing directories on the way are made 0755 (the plane's).

        Raises:
            FileExistsError: it exists and not `exist_ok`.
            Refused: it, or a step on the way, is a link or not a directory.
        """
        with self._parent(path, create=0o755 if parents else None) as (dfd, name):
            try:
                os.mkdir(name, 0o755 if mode is None else 0o700, dir_fd=dfd)
            except FileExistsError:
                if not exist_ok:
                    raise
            fd = _step(dfd, name, None, path)
            try:
                if owner is not None:
                    os.fchown(fd, *owner)
                if mode is not None:
                    os.fchmod(fd, mode)
            finally:
                os.close(fd)

    def rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        """Rename `src` to `dst` (both under the root; neither's way follows a link)."""
        with self._parent(src) as (sfd, sname), self._parent(dst) as (dfd, dname):
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)

    def remove(self, path: str | os.PathLike[str]) -> bool:
        """Unlink a file or link (never what it points to); False when there was none."""
        try:
            with self._parent(path) as (dfd, name):
                os.unlink(name, dir_fd=dfd)
                return True
        except FileNotFoundError:
            return False

    def rmdir(self, path: str | os.PathLike[str]) -> bool:
        """Remove directory `path` if it is empty; False when it is not there, not empty or not one."""
        try:
            with self._parent(path) as (dfd, name):
                os.rmdir(name, dir_fd=dfd)
                return True
        except OSError:
            return False

    def remove_tree(self, path: str | os.PathLike[str]) -> bool:
        """Delete directory `path` and everything in it, descending through directory descriptors
        only (a link is unlinked, never followed); True when it is gone. Entries that cannot be
        removed are left (the caller sees False)."""
        try:
            with self._parent(path) as (dfd, name):
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    return True
                if not stat.S_ISDIR(st.st_mode):
                    os.unlink(name, dir_fd=dfd)
                    return True
                _empty(dfd, name)
                os.rmdir(name, dir_fd=dfd)
                return True
        except OSError:
            return False

    def disk_usage(self, path: str | os.PathLike[str] = "", *, deadline: float | None = None,
                   max_entries: int = 10_000_000) -> tuple[int, bool]:
        """(bytes allocated by everything under `path`, complete): counted from lstat's blocks,
        hard links once, never through a link, never into another file system. `complete` is False
        when `deadline` (time.monotonic()) or `max_entries` cut the walk short, so a job that makes
        millions of files cannot hold the caller, or when a part could not be walked (`UsageWalk`,
        which also goes on from where a cut walk stopped)."""
        walk = UsageWalk(self, path)
        done = walk.run(deadline, max_entries)
        return walk.total, done and walk.whole


def _refusal(dfd: int, name: str, path: str | os.PathLike[str], e: OSError) -> OSError:
    """What an O_NOFOLLOW|O_NONBLOCK open's error means: ELOOP is a link; ENXIO a socket, or a
    FIFO nobody reads when opened for writing; anything else is the kernel's own error."""
    if e.errno == errno.ELOOP:
        return Refused(path, "a symbolic link", errno.ELOOP)
    if e.errno == errno.ENXIO:
        try:
            return Refused(path, _kind(os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode), errno.ENXIO)
        except OSError:
            return Refused(path, "not a regular file", errno.ENXIO)
    return e


def _step(fd: int, part: str, create: int | None, path: str | os.PathLike[str]) -> int:
    """Open directory `part` under `fd` without following a link (making it with mode `create`
    when missing). `fd` stays open: the caller closes it."""
    if create is not None:
        try:
            os.mkdir(part, create, dir_fd=fd)
        except FileExistsError:
            pass
    try:
        return os.open(part, _DIR, dir_fd=fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            what = _kind(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            what = "not a directory"
        raise Refused(path, f"{part} is {what}", errno.ELOOP if what == "a symbolic link" else errno.ENOTDIR) from None


def _empty(parent: int, name: str) -> None:
    """Remove everything inside directory `name` of `parent`, through descriptors only."""
    fd = os.open(name, _DIR, dir_fd=parent)
    try:
        for entry in os.listdir(fd):
            try:
                st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    _empty(fd, entry)
                    os.rmdir(entry, dir_fd=fd)
                else:
                    os.unlink(entry, dir_fd=fd)
            except FileNotFoundError:
                continue
    finally:
        os.close(fd)


class UsageWalk:
    """`du -sx` of a directory below a `Tree`, in slices: each `run` counts on from where the last
    one stopped, until its deadline or the end, so a tree too big to walk in one go is still
    counted whole over several runs (the storage meter's sweeps) rather than cut at the same place
    every time, which let a job hide its bytes behind a million empty files.

    Counted: lstat's allocated blocks of every entry, a file with several names once, never through
    a link, never into another file system (as `du -sx`). Bounded whatever the tree's shape (as
    fts(3) is): a directory's subdirectories are walked after its scan, by name, so a directory of
    thousands of them holds one descriptor, not thousands (which ran out, and the rest went
    uncounted); a run holds at most USAGE_OPEN_DIRS descriptors, the deepest levels', and reopens a
    level above them through `..`, checked to be the same directory (else through no link from the
    top, checked at every step). Memory is bounded too: past USAGE_PENDING subdirectory names
    waiting, a scan stops, its subdirectories are walked, and it goes on after the entries it
    counted (a directory changed meanwhile is counted as it reads then); past USAGE_LINKS files
    with several names, a further one is counted again (too much, never too little).

    Between runs it keeps, per level of the way down, the directory's name, (st_dev, st_ino), how
    many entries of its scan were counted (a cut scan goes on after them) and its subdirectories
    still to walk; no descriptor. A level moved or swapped meanwhile is left out and `whole` says so.
    """

    def __init__(self, tree: Tree, path: str | os.PathLike[str] = "") -> None:
        self.tree, self.path = tree, path
        self._start()

    def _start(self) -> None:
        self.total = 0  # bytes counted so far
        self.entries = 0  # entries counted so far
        self.finished = False
        self.whole = True  # False: a part could not be walked (moved, swapped, not reachable)
        self._levels: list[list[Any]] | None = None  # [name, (dev, ino), entries scanned or -1, subdirs]
        self._dev = 0
        self._pending = 0
        self._seen: set[tuple[int, int]] = set()

    def run(self, deadline: float | None = None, max_entries: int | None = None) -> bool:
        """Count on until `deadline` (time.monotonic()) or `max_entries` more entries; True once
        the whole tree is counted (or found missing: `whole` False)."""
        if self.finished:
            return True
        budget = max_entries if max_entries is not None else -1
        try:
            with self.tree.dir_fd(self.path) as top:
                st = os.fstat(top)
                if self._levels is None or self._levels[0][1] != (st.st_dev, st.st_ino):
                    self._start()  # the first run, or the top was replaced: from the start
                    self._dev, self._levels = st.st_dev, [["", (st.st_dev, st.st_ino), 0, []]]
                fds: list[int | None] = [os.dup(top)] + [None] * (len(self._levels) - 1)
                try:
                    self._reopen(fds)
                    done = self._walk(fds, deadline, budget)
                finally:
                    for fd in fds:
                        if fd is not None:
                            os.close(fd)
        except OSError:
            self.whole, done = False, True  # the top is gone, or not a directory reached through no link
        self.finished = done
        return done

    def _walk(self, fds: list[int | None], deadline: float | None, budget: int) -> bool:
        levels = self._levels
        assert levels is not None
        n = 0  # entries counted in this run: it counts at least one before it looks at the clock
        while levels:
            level, fd = levels[-1], fds[-1]
            assert fd is not None
            if level[3]:  # down into its next subdirectory
                name = level[3].pop()
                self._pending -= 1
                try:
                    child = os.open(name, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    continue  # removed meanwhile
                except OSError:
                    self.whole = False  # swapped for a link, or not ours to open: left out, said so
                    continue
                st = os.fstat(child)
                levels.append([name, (st.st_dev, st.st_ino), 0, []])
                fds.append(child)
                if len(fds) - 1 - USAGE_OPEN_DIRS >= 1:  # hold the deepest levels' descriptors only
                    k = len(fds) - 1 - USAGE_OPEN_DIRS
                    if fds[k] is not None:
                        os.close(fds[k])  # type: ignore[arg-type]
                        fds[k] = None
            elif level[2] >= 0:  # scan it, on after the entries counted before
                with os.scandir(fd) as it:
                    for i, e in enumerate(it):
                        if i < level[2]:
                            continue
                        if budget == 0 or (deadline is not None and n % 256 == 1 and time.monotonic() > deadline):
                            level[2] = i
                            return False
                        if self._pending >= USAGE_PENDING and level[3]:
                            level[2] = i  # enough names waiting: walk them, then scan on from here
                            break
                        budget -= 1
                        n += 1
                        self.entries += 1
                        self._count(e, level)
                    else:
                        level[2] = -1
            else:  # done with it: back up
                levels.pop()
                fds.pop()
                try:
                    if fds and fds[-1] is None:
                        self._reopen(fds, via=fd)
                finally:
                    os.close(fd)
        return True

    def _count(self, e: os.DirEntry[str], level: list[Any]) -> None:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            return  # gone meanwhile
        if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key in self._seen:
                return
            if len(self._seen) < USAGE_LINKS:  # beyond: counted again (too much, never too little)
                self._seen.add(key)
        self.total += st.st_blocks * 512
        if stat.S_ISDIR(st.st_mode) and st.st_dev == self._dev:
            self._pending += 1
            level[3].append(e.name)

    def _reopen(self, fds: list[int | None], via: int | None = None) -> None:
        """Open the levels whose descriptors are closed, down to the last: through `..` of `via`
        (the level below, being left) when that is the same directory, else from the deepest open
        level through no link, each step checked to be the directory it was. A level that is not
        is dropped with those below it (`whole` False)."""
        levels = self._levels
        assert levels is not None
        if via is not None:
            try:
                up = os.open("..", _DIR, dir_fd=via)
            except OSError:
                up = None
            if up is not None:
                st = os.fstat(up)
                if (st.st_dev, st.st_ino) == levels[len(fds) - 1][1]:
                    fds[-1] = up
                    return
                os.close(up)
        j = max(i for i, fd in enumerate(fds) if fd is not None)
        for i in range(j + 1, len(fds)):
            try:
                fd: int | None = os.open(levels[i][0], _DIR, dir_fd=fds[i - 1])
            except OSError:
                fd = None
            if fd is not None:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != levels[i][1]:
                    os.close(fd)
                    fd = None
            if fd is None:
                self._pending -= sum(len(x[3]) for x in levels[i:])
                del levels[i:], fds[i:]
                self.whole = False
                return
            fds[i] = fd
            if i - 1 > j and i - 1 < len(fds) - USAGE_OPEN_DIRS:
                os.close(fds[i - 1])  # type: ignore[arg-type]
                fds[i - 1] = None


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


# -- the owner's side ------------------------------------------------------------------------------


def plane_acts_for(owner: Account | None) -> bool:
    """Whether work for `owner` must be done in a child that becomes it: the plane is root and the
    owner is another account (a plane that is not root runs every job as itself)."""
    return owner is not None and os.geteuid() == 0 and owner.uid != 0


def as_owner(owner: Account | None, fn: Callable[..., T], *args: Any, timeout_s: float = OWNER_TIMEOUT_S) -> T:
    """`fn(*args)` with the owner's identity: in a forked child that has set the owner's groups,
    gid and uid before calling it, so the kernel checks every path as it would for the owner. Its
    result (JSON-able) comes back through a pipe; an OSError it raised is raised here with its
    errno and message, anything else as `OSError(EIO)`. Called directly when the plane does not act
    for someone else (`plane_acts_for`).

    The child only makes system calls through `os` (no lock of another thread can hold it), and is
    killed after `timeout_s`: a hung mount or a FIFO in the owner's path never holds the plane.

    Raises:
        TimeoutError: the child did not finish in time.
        OSError: what `fn` raised.
    """
    if not plane_acts_for(owner):
        return fn(*args)
    assert owner is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the owner, do it, say how it went, exit without cleanup
        out: dict[str, Any]
        try:
            os.close(r)
            try:
                os.setgroups(list(owner.groups) or [owner.gid])
                os.setgid(owner.gid)
                os.setuid(owner.uid)
            except (OSError, ValueError, OverflowError) as e:  # no such ids, or the kernel refused them
                out = {"identity": getattr(e, "errno", None) or errno.EINVAL, "strerror": getattr(e, "strerror", None) or str(e)}
            else:
                out = {"ok": fn(*args)}
        except Refused as e:
            out = {"refused": [e.filename, e.strerror, e.errno]}
        except OSError as e:
            out = {"errno": e.errno, "strerror": e.strerror or str(e), "filename": e.filename}
        except BaseException as e:  # noqa: BLE001 - reported to the parent, never raised here
            out = {"error": f"{type(e).__name__}: {e}"}
        try:
            os.write(w, json.dumps(out).encode()[:1 << 16])
        finally:
            os._exit(0)
    os.close(w)
    try:
        body = _read_until(r, time.monotonic() + timeout_s)
    finally:
        os.close(r)
        if body is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.waitpid(pid, 0)
    if body is None:
        raise TimeoutError(errno.ETIMEDOUT, f"no answer in {timeout_s:g} s working as uid {owner.uid}")
    try:
        out = json.loads(body)
    except ValueError:
        raise OSError(errno.EIO, "the child working as the owner ended without an answer") from None
    if "ok" in out:
        return out["ok"]
    if "refused" in out:
        filename, why, code = out["refused"]
        raise Refused(filename, why, code)
    if "errno" in out:
        raise OSError(out["errno"], out["strerror"], out["filename"])
    if "identity" in out:
        who = getattr(owner, "user", None) or f"uid {owner.uid}"
        raise OSError(out["identity"], f"cannot run as {who} (uid {owner.uid}): {out['strerror']}")
    raise OSError(errno.EIO, out.get("error", "failed"))


def _read_until(fd: int, deadline: float) -> bytes | None:
    """Everything from `fd` until EOF, or None when `deadline` passes first."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def lstat_way(base: str | os.PathLike[str], rel: str | os.PathLike[str]) -> list[int | str | None]:
    """For each step of `base/rel` below `base`: its st_mode (lstat: a link is a link), the
    error's text, or None for the first missing one (the list ends there). Meant to run as the
    owner (`as_owner`), so it shows what the owner may see."""
    out: list[int | str | None] = []
    here = os.fspath(base)
    for part in PurePosixPath(os.fspath(rel)).parts:
        here = os.path.join(here, part)
        try:
            out.append(os.lstat(here).st_mode)
        except FileNotFoundError:
            out.append(None)
            break
        except OSError as e:
            out.append(e.strerror or str(e))
            break
    return out


def enter_problem(workdir: str | os.PathLike[str]) -> str | None:
    """Why the caller cannot work in directory `workdir` ("does not exist", "is not a directory",
    "Permission denied"), or None when it can enter it. Meant to run as the owner (`as_owner`):
    the kernel's own answer, whatever the modes and ACLs on the way."""
    try:
        st = os.stat(workdir)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not os.access(workdir, os.X_OK):
        return "Permission denied"
    return None


def link_inside(workdir: str | os.PathLike[str], rel: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Make `workdir/rel` a symbolic link to `target`, making the directories of `rel` as needed;
    an older link there is replaced, anything else is left alone. Meant to run as the owner
    (`as_owner`): then the kernel decides what may be made where; the way below the working
    directory is still walked through no link, so the link lands inside it.

    Raises:
        Refused: a part of the way is a link or not a directory, or the name is taken.
        OSError: the file system refused (no space, no permission, ...).
    """
    parts = PurePosixPath(os.fspath(rel)).parts
    if not parts or parts[0] == "/" or any(p in ("", ".", "..") for p in parts):
        raise Refused(rel, "not a path inside the working directory")
    fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = _step(fd, part, None, rel)
            os.close(fd)
            fd = nxt
        name = parts[-1]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISLNK(st.st_mode):
            raise Refused(rel, "exists and is not a link; not replaced")
        if st is not None:
            os.unlink(name, dir_fd=fd)
        os.symlink(os.fspath(target), name, dir_fd=fd)
    finally:
        os.close(fd)
