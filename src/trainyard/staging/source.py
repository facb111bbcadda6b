"""Reading a dataset's source: an absolute path (a shared file system) or an object-store URL
(`s3://bucket/key`, through fsspec/s3fs with the `ObjectStore` that covers it).

    probe(source, access, reader)        -> SourceInfo(kind "file"|"dir", bytes, files)
    fetch(source, access, reader, dest)  -> None: the source copied to `dest` (a new path)

Who reads: a path source with a `Reader` is read as that Unix account (the member who added the
dataset), in a forked child that takes its groups, gid and uid before opening anything
(`staging/as_reader.py`): the plane (root) never copies a file the member could not read. Without
a reader (an operator's dataset of the configuration) the child reads as the plane. An s3:// source
is read with the plane's credentials of the store covering its URL; no store covers it: refused.

What is read: regular files and directories only, never through a link (`staging/local_tree.py`;
for an object store, clean keys only: `staging/objects.py`). A link, a FIFO, a device in a path
source is refused.

Time: no read waits longer than `access.timeout_s` (a child that sends nothing for that long is
killed; an object store's connect and each read are bounded the same way), so a hung file system or
server fails the read instead of holding the plane.

Errors are `DataStagingError`s whose kind says whose fault it is (`staging/types.py`): NOT_FOUND
(the source is gone), FORBIDDEN (its reader may not read it, no store covers the URL, the store
refused the credentials, or it holds a link or a FIFO), UNREACHABLE (connection refused, a
timeout, a 5xx, an I/O error: the source's fault, not the user's). `dest`'s own file system
filling up is DISK_FULL. A failed fetch leaves nothing at `dest`.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from dataclasses import dataclass
from typing import Any

from trainyard.staging import objects
from trainyard.staging.as_reader import ChildFailed, Frames, Send, Stalled, errno_of, reading_as
from trainyard.staging.local_tree import Visitor, read_chunks, walk
from trainyard.staging.types import (DISK_FULL, FORBIDDEN, NOT_FOUND, UNREACHABLE, DataStagingError, ObjectStore, Reader,
                                     SourceAccess)

_DIR_MODE = 0o755
_FILE_MODE = 0o644
_NOT_FOUND = {errno.ENOENT, errno.ENOTDIR}
_FORBIDDEN = {errno.EACCES, errno.EPERM, errno.ELOOP}
_FULL = {errno.ENOSPC, errno.EDQUOT}


@dataclass(frozen=True)
class SourceInfo:
    """What a source is: a single file or a directory, its bytes (regular files only) and files."""

    kind: str  # "file" | "dir"
    bytes: int
    files: int


def is_path(source: str) -> bool:
    return source.startswith("/")


def store_of(source: str, access: SourceAccess, label: str) -> ObjectStore:
    """The object store whose settings read `source`.

    Raises:
        DataStagingError: FORBIDDEN, when no configured store covers the URL.
    """
    store = access.store_for(source)
    if store is None:
        raise DataStagingError(FORBIDDEN, label, f"{source} is under no configured object store "
                               "(storage.object_stores); the plane reads no other URL")
    return store


PSEUDO = ("/proc", "/sys", "/dev", "/run")  # the kernel's and the system's, not data: a read there may block


def check_source(source: str, label: str) -> None:
    """A source is an absolute path (not `/` itself nor under the pseudo file systems) or an s3:// URL.

    Raises:
        DataStagingError: FORBIDDEN.
    """
    if not (is_path(source) or objects.is_url(source)):
        raise DataStagingError(FORBIDDEN, label, f"{source!r} is neither an absolute path nor an s3:// URL")
    if is_path(source):
        norm = os.path.normpath(source)
        if norm in ("/", "//") or any(norm == p or norm.startswith(p + "/") for p in PSEUDO):
            raise DataStagingError(FORBIDDEN, label, f"{source}: not a place for data (the root, {', '.join(PSEUDO)})")


# -- errors -----------------------------------------------------------------------------------------


def from_child(e: ChildFailed | Stalled, source: str, label: str, timeout_s: float) -> DataStagingError:
    """A path source's failure, as a DataStagingError of the right kind."""
    if isinstance(e, Stalled):
        return DataStagingError(UNREACHABLE, label, f"{source}: no data for {timeout_s:g} s (a hung file system?)")
    if e.code in ("not_plain", "identity"):
        return DataStagingError(FORBIDDEN, label, str(e))
    code = errno_of(e)
    if code in _NOT_FOUND:
        return DataStagingError(NOT_FOUND, label, f"{source} does not exist ({e})")
    if code in _FORBIDDEN:
        return DataStagingError(FORBIDDEN, label, f"{source}: its reader may not read it ({e})")
    return DataStagingError(UNREACHABLE, label, f"{source}: {e}")


def from_store(e: BaseException, source: str, label: str) -> DataStagingError:
    """An object store's failure, as a DataStagingError of the right kind: missing is NOT_FOUND, a
    4xx refusal FORBIDDEN, and everything on the way (connection, timeout, 5xx) UNREACHABLE."""
    if isinstance(e, DataStagingError):
        return e
    if isinstance(e, objects.BadKey):
        return DataStagingError(FORBIDDEN, label, str(e))
    if isinstance(e, FileNotFoundError):
        return DataStagingError(NOT_FOUND, label, f"{source} does not exist")
    if isinstance(e, PermissionError):
        return DataStagingError(FORBIDDEN, label, f"{source}: the object store refused the plane's credentials ({e})")
    status = _http_status(e)
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return DataStagingError(FORBIDDEN, label, f"{source}: the object store answered {status} ({e})")
    why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return DataStagingError(UNREACHABLE, label, f"{source}: the object store is unreachable ({why})")


def _http_status(e: BaseException) -> int | None:
    seen: BaseException | None = e
    for _ in range(5):
        if seen is None:
            return None
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if isinstance(code, int):
                return code
        seen = seen.__cause__ or seen.__context__
    return None


def local_error(e: OSError, dest: str, label: str) -> Exception:
    """A failure writing the copy at `dest`: a full disk is DISK_FULL; anything else stays an OSError."""
    if e.errno in _FULL:
        return DataStagingError(DISK_FULL, label, f"no room for the copy at {dest}: {e.strerror or e}")
    return e


# -- probe ------------------------------------------------------------------------------------------


def _probe_work(path: str) -> Any:
    def work(send: Send) -> dict[str, Any]:
        sizes = [0, 0]

        def on_file(rel: bytes, fd: int, size: int) -> None:
            sizes[0] += size
            sizes[1] += 1
            send(b"P", b"")

        kind = walk(path, Visitor(on_dir=lambda rel: None, on_file=on_file))
        return {"kind": kind, "bytes": sizes[0], "files": sizes[1]}
    return work


def probe(source: str, access: SourceAccess, reader: Reader | None, *, label: str | None = None) -> SourceInfo:
    """What `source` is (a file or a directory), its size and number of files, read as `reader`
    for a path (see the module docstring).

    Raises:
        DataStagingError: NOT_FOUND, FORBIDDEN or UNREACHABLE.
    """
    label = label or source
    check_source(source, label)
    if is_path(source):
        try:
            with reading_as(reader, _probe_work(source), access.timeout_s) as frames:
                for _ in frames:
                    pass
                out = frames.answer
        except (ChildFailed, Stalled) as e:
            raise from_child(e, source, label, access.timeout_s) from None
        return SourceInfo(out["kind"], int(out["bytes"]), int(out["files"]))
    store = store_of(source, access, label)
    try:
        fs = objects.filesystem(store.fsspec_options(), access.timeout_s)
        kind, found = objects.listing(fs, source)
    except Exception as e:  # noqa: BLE001 - sorted into the kinds
        raise from_store(e, source, label) from None
    return SourceInfo(kind, sum(size for _, _, size in found), len(found))


# -- fetch ------------------------------------------------------------------------------------------


def _fetch_work(path: str) -> Any:
    def work(send: Send) -> dict[str, Any]:
        def on_file(rel: bytes, fd: int, size: int) -> None:
            send(b"F", rel)
            read_chunks(fd, lambda data: send(b"C", data))
            send(b"E", b"")

        return {"kind": walk(path, Visitor(on_dir=lambda rel: send(b"D", rel), on_file=on_file))}
    return work


def _target(dest: str, rel: bytes) -> bytes:
    """`dest/rel` (`dest` itself for b""), for a `rel` that is a clean relative path."""
    if rel == b"":
        return os.fsencode(dest)
    parts = rel.split(b"/")
    if any(p in (b"", b".", b"..") for p in parts):
        raise OSError(errno.EINVAL, f"not a clean relative path: {rel!r}")
    return os.path.join(os.fsencode(dest), rel)


def _new_file(path: bytes | str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _FILE_MODE)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _copy_frames(frames: Frames, dest: str) -> None:
    """Write what the reading child sends at `dest`: the file itself, or the tree below it."""
    out: int | None = None
    try:
        for kind, payload in frames:
            if kind == b"D":
                os.mkdir(_target(dest, payload), _DIR_MODE)
            elif kind == b"F":
                out = _new_file(_target(dest, payload))
            elif kind == b"C" and out is not None:
                _write_all(out, payload)
            elif kind == b"E" and out is not None:
                os.close(out)
                out = None
    finally:
        if out is not None:
            os.close(out)


def _fetch_object(source: str, store: ObjectStore, access: SourceAccess, dest: str, label: str) -> None:
    try:
        fs = objects.filesystem(store.fsspec_options(), access.timeout_s)
        kind, found = objects.listing(fs, source)
    except Exception as e:  # noqa: BLE001 - sorted into the kinds
        raise from_store(e, source, label) from None

    def one(item: tuple[str, str, int]) -> None:
        rel, path, _size = item
        fd = _new_file(dest if kind == "file" else os.path.join(dest, rel))
        try:
            objects.read_object(fs, path, lambda data: _write_all(fd, data))
        except OSError as e:
            if e.errno in _FULL:
                raise
            raise from_store(e, f"s3://{path}", label) from None
        except Exception as e:  # noqa: BLE001 - sorted into the kinds
            raise from_store(e, f"s3://{path}", label) from None
        finally:
            os.close(fd)

    if kind == "dir":
        os.mkdir(dest, _DIR_MODE)
        for parent in sorted({os.path.dirname(rel) for rel, _, _ in found} - {""}):
            os.makedirs(os.path.join(dest, parent), _DIR_MODE, exist_ok=True)
    objects.each(found, one)


def fetch(source: str, access: SourceAccess, reader: Reader | None, dest: str, *, label: str | None = None) -> None:
    """Copy `source` to `dest`, which must not exist: a file becomes the file `dest`, a directory the
    tree `dest` (directories 0755, files 0644, less the umask). Read as `reader` for a path. On any
    failure nothing is left at `dest`.

    Raises:
        FileExistsError: `dest` exists.
        DataStagingError: NOT_FOUND, FORBIDDEN, UNREACHABLE, or DISK_FULL for `dest`'s file system.
        OSError: another failure writing `dest`.
    """
    label = label or source
    check_source(source, label)
    if os.path.lexists(dest):
        raise FileExistsError(errno.EEXIST, "the copy's place is taken", dest)
    try:
        if is_path(source):
            try:
                with reading_as(reader, _fetch_work(source), access.timeout_s) as frames:
                    _copy_frames(frames, dest)
            except (ChildFailed, Stalled) as e:
                raise from_child(e, source, label, access.timeout_s) from None
        else:
            _fetch_object(source, store_of(source, access, label), access, dest, label)
    except OSError as e:
        _remove(dest)
        raise local_error(e, dest, label) from None
    except BaseException:
        _remove(dest)
        raise


def _remove(dest: str) -> None:
    """Remove what a failed fetch left at `dest` (the plane's own new path), never following a link."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(dest, ignore_errors=True)
    else:
        os.unlink(dest)
