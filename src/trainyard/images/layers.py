"""One image layer (an untrusted tar stream) unpacked into a directory of its own, in overlayfs's form.

The layer is the image author's input, extracted by root, so nothing here trusts a name or a link:
- every member's path is taken apart and refused (BAD_IMAGE) if absolute or holding `..`; its
  parent is reached from the layer's root one component at a time through `O_NOFOLLOW|O_DIRECTORY`
  descriptors, so a link the layer made (`etc -> /etc`) is never followed: a member written
  through one is refused, never written to the host;
- files are created with `O_CREAT|O_EXCL|O_NOFOLLOW` in their parent's descriptor, owners and modes
  kept as numbers (root's files stay root's; no name is looked up in the host's passwd), set on the
  descriptor; symbolic links are made, never followed (their targets mean something only inside
  the container's root);
- a hard link may name only an earlier file or link of the same layer;
- OCI whiteouts become overlayfs's: `.wh.NAME` a 0/0 character device NAME, `.wh..wh..opq` the
  xattr `trusted.overlay.opaque=y` on its directory; other device nodes are skipped; no xattr of
  the image is set (a `trusted.overlay.*` one would steer the overlay);
- bytes are counted against a budget (a layer that inflates past it is DISK_FULL) and the
  uncompressed stream is hashed against the config's diff_id.
gzip and uncompressed layers; zstd is refused with its own message. The caller unpacks into a
temporary directory and renames it into place (cache.py): a half layer is never taken as whole.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import stat
import tarfile
import zlib
from dataclasses import dataclass, field
from typing import IO

from trainyard.images.types import BAD_IMAGE, DISK_FULL, ImagePullError

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
CHUNK = 1024 * 1024
ENTRY_COST = 4096  # what a directory entry, a link or an empty file costs on disk, roughly
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class OverCap(ImagePullError):
    """DISK_FULL because the image alone is larger than the cache's cap (evicting others is no help)."""

    def __init__(self, image: str, message: str) -> None:
        super().__init__(DISK_FULL, image, message)


class _Hashing:
    """A read-only stream that hashes what passes through it (the layer's diff_id)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        return data


@dataclass
class _State:
    root: int  # the layer dir's descriptor
    image: str
    budget: int
    used: int = 0
    linkable: set[tuple[str, ...]] = field(default_factory=set)
    dir_times: list[tuple[tuple[str, ...], float]] = field(default_factory=list)
    # the last member's parent, kept open (members come directory by directory): a walk from the
    # root per member costs a dozen opens in a deep tree. Dropped whenever a directory is removed.
    parent: tuple[tuple[str, ...], int] | None = None

    def drop_parent(self) -> None:
        if self.parent is not None:
            os.close(self.parent[1])
            self.parent = None

    def parent_of(self, parts: tuple[str, ...]) -> int:
        """A descriptor of directory `parts` (owned by the state: not to be closed by the caller)."""
        if self.parent is None or self.parent[0] != parts:
            fd = _open_dir(self, parts)
            self.drop_parent()
            self.parent = (parts, fd)
        return self.parent[1]

    def charge(self, n: int) -> None:
        self.used += n
        if self.used > self.budget:
            raise OverCap(self.image, f"the image unpacks to more than the room its cache's cap leaves "
                                      f"({self.budget} bytes)")

    def bad(self, why: str) -> ImagePullError:
        return ImagePullError(BAD_IMAGE, self.image, why)


def split(name: str, st: _State) -> tuple[str, ...]:
    """A member's path as its components; refuses absolute paths and `..`."""
    if name.startswith("/"):
        raise st.bad(f"layer member {name[:200]!r} is an absolute path")
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise st.bad(f"layer member {name[:200]!r} climbs out of the image with '..'")
    return parts


def _open_dir(st: _State, parts: tuple[str, ...], create: bool = True) -> int:
    """A descriptor of the directory `parts` under the layer's root, made (0755, root's) where
    missing; never through a link."""
    fd = os.dup(st.root)
    try:
        for i, part in enumerate(parts):
            try:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(part, 0o755, dir_fd=fd)
                st.charge(ENTRY_COST)
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise st.bad(f"layer member under {'/'.join(parts[:i + 1])[:200]!r} goes through a link or "
                                 "a file, not a directory") from None
                raise
            os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        os.close(fd)
        raise


def _remove_at(dirfd: int, name: str, st: _State | None = None) -> None:
    """Remove `name` in `dirfd` whatever it is (a directory: its tree), following no link."""
    try:
        info = os.lstat(name, dir_fd=dirfd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=dirfd)
        return
    if st is not None:
        st.drop_parent()  # it may lie in the tree going away
    sub = os.open(name, _DIR_FLAGS, dir_fd=dirfd)
    try:
        for entry in os.listdir(sub):
            _remove_at(sub, entry)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=dirfd)


def _make_room(st: _State, dirfd: int, name: str, keep_dir: bool) -> bool:
    """Clear `name` for a new member (an earlier member of the same path is replaced, as tar does);
    True when a directory is there and kept."""
    try:
        info = os.lstat(name, dir_fd=dirfd)
    except FileNotFoundError:
        return False
    if keep_dir and stat.S_ISDIR(info.st_mode):
        return True
    _remove_at(dirfd, name, st)
    return False


def _write_file(st: _State, pfd: int, name: str, member: tarfile.TarInfo, data: IO[bytes] | None) -> None:
    st.charge(ENTRY_COST + member.size)
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=pfd)
    try:
        left = member.size
        while data is not None and left > 0:
            chunk = data.read(min(CHUNK, left))
            if not chunk:
                raise st.bad(f"layer member {member.name[:200]!r} ends early")
            _write_all(fd, chunk)
            left -= len(chunk)
        os.fchown(fd, member.uid, member.gid)
        os.fchmod(fd, stat.S_IMODE(member.mode))  # after the chown, which clears set-id bits
        os.utime(fd, (member.mtime, member.mtime))
    finally:
        os.close(fd)


def _write_all(fd: int, chunk: bytes) -> None:
    view = memoryview(chunk)
    while view:
        view = view[os.write(fd, view):]


def _member(st: _State, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
    parts = split(member.name, st)
    if not parts:  # the layer's root itself: its attributes are the image root's
        if member.isdir():
            os.chown(st.root, member.uid, member.gid)
            os.chmod(st.root, stat.S_IMODE(member.mode))
        return
    base = parts[-1]
    if base.startswith(WHITEOUT) and not (member.isfile() or member.isdir() or member.islnk() or member.issym()):
        raise st.bad(f"whiteout {member.name[:200]!r} is not a plain entry")
    pfd = os.dup(st.parent_of(parts[:-1]))  # a dup: a removal below may drop the state's own
    try:
        if base == OPAQUE:
            os.setxattr(pfd, "trusted.overlay.opaque", b"y")
        elif base.startswith(WHITEOUT):
            hidden = base[len(WHITEOUT):]
            if hidden in ("", ".", "..") or hidden.startswith(WHITEOUT):
                raise st.bad(f"bad whiteout {member.name[:200]!r}")
            _make_room(st, pfd, hidden, keep_dir=False)
            os.mknod(hidden, stat.S_IFCHR | 0o000, os.makedev(0, 0), dir_fd=pfd)
            st.charge(ENTRY_COST)
        elif member.isdir():
            if not _make_room(st, pfd, base, keep_dir=True):
                os.mkdir(base, 0o700, dir_fd=pfd)
                st.charge(ENTRY_COST)
            fd = os.open(base, _DIR_FLAGS, dir_fd=pfd)
            try:
                os.fchown(fd, member.uid, member.gid)
                os.fchmod(fd, stat.S_IMODE(member.mode))
            finally:
                os.close(fd)
            st.dir_times.append((parts, member.mtime))
        elif member.isfile():
            _make_room(st, pfd, base, keep_dir=False)
            _write_file(st, pfd, base, member, tar.extractfile(member))
            st.linkable.add(parts)
        elif member.issym():
            _make_room(st, pfd, base, keep_dir=False)
            os.symlink(member.linkname, base, dir_fd=pfd)
            os.chown(base, member.uid, member.gid, dir_fd=pfd, follow_symlinks=False)
            st.charge(ENTRY_COST)
            st.linkable.add(parts)
        elif member.islnk():
            target = split(member.linkname, st)
            if target not in st.linkable:
                raise st.bad(f"hard link {member.name[:200]!r} names {member.linkname[:200]!r}, not an earlier "
                             "file of the same layer")
            tfd = _open_dir(st, target[:-1], create=False)
            try:
                _make_room(st, pfd, base, keep_dir=False)
                os.link(target[-1], base, src_dir_fd=tfd, dst_dir_fd=pfd, follow_symlinks=False)
            finally:
                os.close(tfd)
            st.charge(ENTRY_COST)
            st.linkable.add(parts)
        elif member.isfifo():
            _make_room(st, pfd, base, keep_dir=False)
            os.mkfifo(base, stat.S_IMODE(member.mode), dir_fd=pfd)
            os.chown(base, member.uid, member.gid, dir_fd=pfd, follow_symlinks=False)
        # device nodes and anything else: skipped (a container gets its devices from the runtime)
    finally:
        os.close(pfd)


def _set_dir_times(st: _State) -> None:
    for parts, mtime in reversed(st.dir_times):
        try:
            fd = _open_dir(st, parts, create=False)
        except (OSError, ImagePullError):
            continue  # replaced by a later member
        try:
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)


def unpack(blob: IO[bytes], dest: str, *, image: str, media_type: str, diff_id: str | None,
           budget: int) -> int:
    """Unpack the layer `blob` (its stream, compressed as `media_type` or its magic says) into the
    existing empty directory `dest`; returns the bytes it takes (about).

    Raises:
        ImagePullError: BAD_IMAGE (a hostile or broken member, zstd, a diff_id mismatch), DISK_FULL
            (past `budget`, or the disk is full).
    """
    head = blob.read(4)
    blob.seek(0)
    if head.startswith(ZSTD_MAGIC) or "zstd" in media_type:
        raise ImagePullError(BAD_IMAGE, image, "zstd layers not supported (push the image with gzip layers)")
    raw: IO[bytes] = gzip.GzipFile(fileobj=blob, mode="rb") if head.startswith(GZIP_MAGIC) else blob  # type: ignore[assignment]
    stream = _Hashing(raw)
    root = os.open(dest, _DIR_FLAGS)
    st = _State(root=root, image=image, budget=budget)
    try:
        with tarfile.open(fileobj=stream, mode="r|", errorlevel=2) as tar:  # type: ignore[call-overload]
            for member in tar:
                _member(st, tar, member)
        while stream.read(CHUNK):
            pass
        _set_dir_times(st)
    except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ImagePullError(BAD_IMAGE, image, f"layer is not a valid tar stream: {e}") from None
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise ImagePullError(DISK_FULL, image, "no space left on the node's image cache") from None
        raise ImagePullError(BAD_IMAGE, image, f"cannot unpack a layer member: {e.strerror}") from None
    finally:
        st.drop_parent()
        os.close(root)
    got = "sha256:" + stream.sha.hexdigest()
    if diff_id is not None and got != diff_id:
        raise ImagePullError(BAD_IMAGE, image, f"a layer's content is {got}, not the config's diff_id {diff_id}")
    return st.used
