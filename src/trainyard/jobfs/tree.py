"""`Tree`: a directory the plane owns, and every path below it, reached through no link; its reads
bounded, its writes atomic, its removals never following a link (see the package docstring)."""

from __future__ import annotations

import errno
import json
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

PAGE_MAX = 8 << 20  # the most bytes one read hands out (an API page of a log)
JSON_MAX = 1 << 20  # a run record, an owner file: far smaller; anything bigger is not one of ours
TAIL_DEFAULT = 256 << 10

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Refused(OSError):
    """The plane will not touch this path: a link, not a regular file (or directory), or outside
    its root. The message names the path and why."""

    def __init__(self, path: str | os.PathLike[str], why: str, code: int = errno.EPERM) -> None:
        super().__init__(code, why, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


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
        """(name, file type) of the entries of directory `path`, sorted by name; at most `limit` of
        them (a job may make millions); [] when it is missing or not reachable. The type is
        `st_mode`'s type bits (`stat.S_ISDIR` etc.; a link is a link), from the directory entry
        itself: no `stat` per entry for links, directories and regular files, so listing a
        directory a job filled costs the plane one `getdents` per few hundred names."""
        try:
            with self.dir_fd(path) as fd, os.scandir(fd) as it:
                out: list[tuple[str, int]] = []
                for e in it:
                    if len(out) >= limit:
                        break
                    try:
                        out.append((e.name, _entry_type(e)))
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
        `limit` or not JSON (records the plane writes atomically are whole). Arrays nested
        thousands deep fit in a small file and make the parser recurse past Python's limit: that
        is not JSON either (RecursionError)."""
        try:
            with self.open_read(path) as fh:
                if os.fstat(fh.fileno()).st_size > limit:
                    return None
                return json.loads(fh.read(limit))
        except (OSError, ValueError, RecursionError):
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
        from trainyard.jobfs.usage import UsageWalk  # it walks a Tree: imported when used

        walk = UsageWalk(self, path)
        done = walk.run(deadline, max_entries)
        return walk.total, done and walk.whole


def _entry_type(e: os.DirEntry[str]) -> int:
    """The file type bits of a directory entry, without following a link, from its d_type when the
    file system gives one (a stat otherwise, and for FIFOs, sockets and devices)."""
    if e.is_symlink():
        return stat.S_IFLNK
    if e.is_dir(follow_symlinks=False):
        return stat.S_IFDIR
    if e.is_file(follow_symlinks=False):
        return stat.S_IFREG
    return stat.S_IFMT(e.stat(follow_symlinks=False).st_mode)


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
