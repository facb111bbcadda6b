"""A node's cache of staged datasets: one entry per checksum, copied once, verified, made visible
by one rename, evicted least recently used over a size cap when no running attempt uses it.

    <root>/                  0711, the plane's: a job reaches an entry it was given, lists none
      key                    0600, the plane's: 32 random bytes that name the entries
      lock                   the writers' flock: the room a new entry needs is decided under it
      <hex>/                 an entry (0555): `data` (the dataset: a file 0444, or a tree of 0555
                             directories and 0444 files) and `meta.json` (name, version, checksum,
                             bytes, staged_at; its mtime is the entry's last use)
      .tmp.<hex>.<pid>.<bytes>/   an entry being copied (its size reserved against the cap)
      locks/<hex>.lock       one per entry: concurrent stagings of one dataset on a node copy once
      pins/<hex>/<job>.<attempt>   an attempt that uses the entry (`stage(..., job=)`), removed by
                             `unpin` (the backend's `release`): a pinned entry is never evicted

An entry's name `<hex>` is HMAC-SHA256(key, the checksum's hex), not the checksum: the root lists
nothing, and the name cannot be computed from the checksum, so a local account (another team's
job on the node) that knows or guesses a dataset's checksum still cannot reach its copy. Only the
attempts the plane gives the path (`$TRAINYARD_DATASET_<NAME>`) know it. The entry's checksum is in
its `meta.json`.

`stage` finds an entry without a lock (its directory exists: whole, since it appeared by rename);
else it takes the entry's lock, looks again (a second staging of the same dataset waits for the
first and finds its entry), makes room under the cache's lock (evicting unpinned entries, least
recently used first; DISK_FULL when even then it cannot fit), copies the source with
`staging.source.fetch` into `.tmp.<hex>…`, hashes the copy (`staging.checksum.of_local`) and
renames it into place only when it hashes to the pinned checksum (else CHECKSUM_MISMATCH, the copy
removed). A kill at any point leaves a `.tmp.` directory that the next staging of that entry, or
the next writer that can take its lock, removes. Entries are read-only to everyone, the plane
included, so that a job reads the shared copy but can never alter it (the container gets it bound
read-only too: `backends/contain/oci_spec.py`).

The cache is the truth about a node's data; the store's `node_datasets` rows are what the plane
last saw of it (`control/loop/data_staging.py`).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import hmac
import importlib
import json
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from trainyard.staging.types import (
    CHECKSUM_MISMATCH,
    DISK_FULL,
    FORBIDDEN,
    DatasetEntry,
    DatasetRef,
    DataStagingError,
    Reader,
    SourceAccess,
    StagedDataset,
)

Fetch = Callable[..., object]  # (source, access, reader, dest, *, label): staging.source.fetch
Digest = Callable[[str], str]  # a local path -> "sha256:<hex>"

_HEX = re.compile(r"[0-9a-f]{64}")
_TMP = re.compile(r"^\.tmp\.([0-9a-f]{64})\.(\d+)\.(\d+)$")
_GONE = re.compile(r"^\.gone\.")
_PIN = re.compile(r"^(\d+)\.(\d+)$")
META = "meta.json"
DATA = "data"
KEY = "key"
KEY_BYTES = 32


def hex_of(checksum: str) -> str:
    """The 64 hex digits of a `sha256:` checksum (an entry's name)."""
    algo, _, hexa = checksum.partition(":")
    if algo != "sha256" or not _HEX.fullmatch(hexa):
        raise ValueError(f"not a sha256 checksum: {checksum[:80]!r}")
    return hexa


def _default_fetch(source: str, access: SourceAccess, reader: Reader | None, dest: str, *, label: str) -> object:
    # staging/source.py: fsspec and the readers, loaded only where data is staged
    return importlib.import_module("trainyard.staging.source").fetch(source, access, reader, dest, label=label)


def _default_digest(path: str) -> str:
    return str(importlib.import_module("trainyard.staging.checksum").of_local(path))


@dataclass(frozen=True)
class _Meta:
    name: str
    version: str
    checksum: str
    bytes: int
    staged_at: float
    last_used: float


class NodeDatasetCache:
    """The dataset cache of node `node` under `root` (module docstring); `cap_bytes` None: no cap.
    `fetch` and `digest`: the copy and the hash (default `staging.source.fetch` and
    `staging.checksum.of_local`)."""

    def __init__(self, root: str | Path, cap_bytes: int | None = None, node: str = "", *,
                 fetch: Fetch | None = None, digest: Digest | None = None) -> None:
        self.root = Path(root)
        self.node = node
        self.cap_bytes = cap_bytes
        self._fetch = fetch or _default_fetch
        self._digest = digest or _default_digest
        self._prepare()

    # -- reading: no lock ------------------------------------------------------------------------

    def entry_of(self, checksum: str) -> str:
        """The name of the checksum's entry under the root (the module docstring: keyed, so that
        knowing a checksum is not knowing where its copy lies)."""
        return hmac.new(self._key, hex_of(checksum).encode(), hashlib.sha256).hexdigest()

    def path_of(self, checksum: str) -> Path:
        """Where the entry's dataset lies (what `$TRAINYARD_DATASET_<NAME>` names)."""
        return self.root / self.entry_of(checksum) / DATA

    def has(self, checksum: str) -> bool:
        return (self.root / self.entry_of(checksum) / META).is_file()

    def entries(self) -> list[DatasetEntry]:
        out = []
        for hexa, m in self._all():
            out.append(DatasetEntry(node=self.node, name=m.name, version=m.version, checksum=m.checksum,
                                    bytes=m.bytes, last_used=m.last_used, in_use=self._pinned(hexa)))
        return out

    def usage(self) -> int:
        """Bytes the entries hold plus what copies under way have reserved."""
        return sum(m.bytes for _, m in self._all()) + sum(int(x.group(3)) for x in self._tmps())

    # -- writing ---------------------------------------------------------------------------------

    def stage(self, ref: DatasetRef, access: SourceAccess, job: tuple[int, int] | None = None) -> StagedDataset:
        """`ref` in this cache: found (its last use now) or copied and verified; pinned for `job`.

        Raises:
            DataStagingError: the fetch's kinds; CHECKSUM_MISMATCH (the copy does not hash to
                `ref.checksum`: nothing kept); DISK_FULL (no room even after evicting what no
                running attempt uses).
        """
        began = time.monotonic()
        hexa = self.entry_of(ref.checksum)
        if job is not None:
            self._pin(hexa, job)
        try:
            if self._touch(hexa):
                return self._staged(ref, hexa, False, began)
            with self._entry_locked(hexa):
                if self._touch(hexa):
                    return self._staged(ref, hexa, False, began)
                self._sweep_tmp(hexa)
                self._copy(ref, access, hexa)
                self._trim(keep=hexa)
                return self._staged(ref, hexa, True, began)
        except BaseException:
            if job is not None:
                self.unpin(*job, only=hexa)
            raise

    def remove(self, checksum: str) -> bool:
        """Remove the entry; False when it is absent or pinned by a running attempt."""
        hexa = self.entry_of(checksum)
        with self._locked():
            return self._remove(hexa)

    def unpin(self, job_id: int, attempt: int, only: str | None = None) -> None:
        """The attempt uses none of this cache's entries any more (its release)."""
        pins = self.root / "pins"
        for hexa in ([only] if only else os.listdir(pins)):
            try:
                os.unlink(pins / hexa / f"{job_id}.{attempt}")
            except (FileNotFoundError, NotADirectoryError):
                pass

    # -- internals -------------------------------------------------------------------------------

    def _staged(self, ref: DatasetRef, hexa: str, copied: bool, began: float) -> StagedDataset:
        meta = self._meta(hexa)
        size = meta.bytes if meta is not None else ref.bytes
        return StagedDataset(node=self.node, checksum=ref.checksum, path=str(self.root / hexa / DATA),
                             bytes=size, copied=copied, seconds=time.monotonic() - began)

    def _copy(self, ref: DatasetRef, access: SourceAccess, hexa: str) -> None:
        with self._locked():
            self._sweep()
            self._make_room(ref, hexa)
            work = self.root / f".tmp.{hexa}.{os.getpid()}.{max(0, ref.bytes)}"
            work.mkdir(mode=0o700)
        try:
            dest = work / DATA
            self._fetch(ref.source, access, ref.reader, str(dest), label=ref.label)
            if not os.path.lexists(dest):
                raise DataStagingError(FORBIDDEN, ref.label, "the source gave nothing to copy")
            got = self._digest(str(dest))
            if got != ref.checksum:
                raise DataStagingError(CHECKSUM_MISMATCH, ref.label,
                                       f"the copy hashes to {got}, not the pinned {ref.checksum}: the source "
                                       "changed since the dataset was added (nothing was kept)")
            size = _read_only(dest)
            doc = {"name": ref.name, "version": ref.version, "checksum": ref.checksum, "bytes": size,
                   "staged_at": time.time()}
            fd = os.open(work / META, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(work, 0o555)
            os.rename(work, self.root / hexa)  # same parent: the entry appears whole, or not at all
        except OSError as e:
            _remove_tree(work)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DataStagingError(DISK_FULL, ref.label, f"no space left on node {self.node}'s dataset cache") \
                    from None
            raise DataStagingError(FORBIDDEN, ref.label, f"cannot copy: {e.strerror or e}") from None
        except BaseException:
            _remove_tree(work)
            raise

    def _make_room(self, ref: DatasetRef, hexa: str) -> None:
        """Evict unpinned entries, least recently used first, until `ref` fits under the cap (the
        cache's lock held)."""
        if self.cap_bytes is None:
            return
        if ref.bytes > self.cap_bytes:
            raise DataStagingError(DISK_FULL, ref.label, f"its {ref.bytes} bytes are more than node {self.node}'s "
                                                         f"dataset cache cap of {self.cap_bytes} bytes")
        for other, _ in sorted(self._all(), key=lambda e: e[1].last_used):
            if self.usage() + ref.bytes <= self.cap_bytes:
                return
            if other != hexa:
                self._remove(other)
        if self.usage() + ref.bytes > self.cap_bytes:
            raise DataStagingError(DISK_FULL, ref.label,
                                   f"node {self.node}'s dataset cache ({self.cap_bytes} bytes) is full of data "
                                   "running jobs use")

    def _trim(self, keep: str) -> None:
        """After a copy: unpinned entries evicted, least recently used first, while the cache is
        over its cap (a dataset whose size was not known before its copy, `ref.bytes` 0)."""
        if self.cap_bytes is None:
            return
        with self._locked():
            for other, _ in sorted(self._all(), key=lambda e: e[1].last_used):
                if self.usage() <= self.cap_bytes:
                    return
                if other != keep:
                    self._remove(other)

    def _remove(self, hexa: str) -> bool:
        if self._pinned(hexa) or not (self.root / hexa).is_dir():
            return False
        gone = self.root / f".gone.{hexa}.{os.getpid()}.{time.monotonic_ns()}"
        os.chmod(self.root / hexa, 0o700)  # a non-root plane may not move a read-only directory otherwise
        os.rename(self.root / hexa, gone)
        _remove_tree(gone)
        return True

    def _pinned(self, hexa: str) -> bool:
        try:
            return any(_PIN.match(n) for n in os.listdir(self.root / "pins" / hexa))
        except FileNotFoundError:
            return False

    def _pin(self, hexa: str, job: tuple[int, int]) -> None:
        d = self.root / "pins" / hexa
        d.mkdir(mode=0o700, exist_ok=True)
        os.close(os.open(d / f"{job[0]}.{job[1]}", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))

    def _touch(self, hexa: str) -> bool:
        try:
            os.utime(self.root / hexa / META, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def _meta(self, hexa: str) -> _Meta | None:
        try:
            fd = os.open(self.root / hexa / META, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        with os.fdopen(fd, "rb") as f:
            used = os.fstat(f.fileno()).st_mtime
            try:
                doc = json.loads(f.read(64 * 1024))
                return _Meta(str(doc["name"]), str(doc["version"]), str(doc["checksum"]), int(doc["bytes"]),
                             float(doc["staged_at"]), used)
            except (ValueError, KeyError, TypeError):
                return None

    def _all(self) -> list[tuple[str, _Meta]]:
        out = []
        for name in sorted(os.listdir(self.root)):
            if _HEX.fullmatch(name) and (m := self._meta(name)) is not None:
                out.append((name, m))
        return out

    def _tmps(self) -> Iterator[re.Match[str]]:
        for name in os.listdir(self.root):
            if (m := _TMP.match(name)) is not None:
                yield m

    def _sweep_tmp(self, hexa: str) -> None:
        """A crashed copy of `hexa` (its entry lock held: no one else copies it)."""
        for m in list(self._tmps()):
            if m.group(1) == hexa:
                _remove_tree(self.root / m.group(0))

    def _sweep(self) -> None:
        """What interrupted writers left: copies no one holds the lock of, removals half done."""
        for name in os.listdir(self.root):
            if _GONE.match(name):
                _remove_tree(self.root / name)
            elif (m := _TMP.match(name)) is not None:
                fd = self._lock_fd(m.group(1))
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # being copied right now
                finally:
                    os.close(fd)
                _remove_tree(self.root / name)

    def _lock_fd(self, hexa: str) -> int:
        return os.open(self.root / "locks" / f"{hexa}.lock",
                       os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    @contextmanager
    def _entry_locked(self, hexa: str) -> Iterator[None]:
        fd = self._lock_fd(hexa)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _prepare(self) -> None:
        """The cache's directories, the plane's own (a link or another owner's directory in their
        place is refused: they hold what every team staged)."""
        for d, mode in ((self.root, 0o711), (self.root / "locks", 0o700), (self.root / "pins", 0o700)):
            try:
                d.mkdir(mode=mode, parents=d == self.root)
            except FileExistsError:
                pass
            info = os.lstat(d)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                raise DataStagingError(FORBIDDEN, str(d), "the dataset cache's directory is a link or not the plane's own")
            if stat.S_IMODE(info.st_mode) != mode:
                os.chmod(d, mode)
        self._key = self._read_key()

    def _read_key(self) -> bytes:
        """The cache's naming key, made once: written whole aside, then linked into place (two
        processes making it at once agree on the one linked first)."""
        path = self.root / KEY
        if not os.path.lexists(path):
            tmp = self.root / f".key.{os.getpid()}.{threading.get_ident()}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(os.urandom(KEY_BYTES))
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    pass
            finally:
                os.unlink(tmp)
        bad = DataStagingError(FORBIDDEN, str(path), f"the dataset cache's key is not a 0600 file of the plane's of "
                               f"{KEY_BYTES} bytes")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError as e:  # a link in its place (ELOOP), or gone
            raise bad from e
        with os.fdopen(fd, "rb") as f:
            info = os.fstat(f.fileno())
            key = f.read(KEY_BYTES + 1) if stat.S_ISREG(info.st_mode) else b""
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077 \
                or len(key) != KEY_BYTES:
            raise bad
        return key


class NodeCaches:
    """Every node's cache under one directory, `<top>/<node>/` (`top` 0711: a job reaches the entry
    its variable names and lists nothing), as a backend holds them: made on first use, one per node,
    each staging with the cap its access carries. The local backend's emulated nodes and the Slurm
    backend's nodes on this machine share this class."""

    def __init__(self, top: str | Path) -> None:
        self.top = Path(top)
        self._caches: dict[str, NodeDatasetCache] = {}
        self._lock = threading.Lock()

    def of(self, node: str) -> NodeDatasetCache:
        """`node`'s cache. Raises ValueError for a name that is not one (a path, `.`, `..`)."""
        with self._lock:
            cache = self._caches.get(node)
            if cache is None:
                if not node or "/" in node or node in (".", ".."):
                    raise ValueError(f"not a node name: {node!r}")
                self.top.mkdir(mode=0o711, exist_ok=True)
                os.chmod(self.top, 0o711)  # made by an older plane with another mode
                cache = self._caches[node] = NodeDatasetCache(self.top / node, None, node)
            return cache

    def stage(self, node: str, ref: DatasetRef, access: SourceAccess,
              job: tuple[int, int] | None = None) -> StagedDataset:
        """`ref` in `node`'s cache (copied unless there: minutes maybe, no lock of the caller held),
        pinned for `job` until `unpin`. Raises `DataStagingError`."""
        cache = self.of(node)
        cache.cap_bytes = access.cache_max_bytes
        return cache.stage(ref, access, job)

    def entries(self, node: str) -> list[DatasetEntry]:
        return self.of(node).entries()

    def remove(self, node: str, checksum: str) -> bool:
        return self.of(node).remove(checksum)

    def unpin(self, job_id: int, attempt: int) -> None:
        """The attempt's pins gone from every node's cache (its release): evictable again."""
        if not self.top.is_dir():
            return
        for node in os.listdir(self.top):
            pins = self.top / node / "pins"
            if pins.is_dir() and not pins.is_symlink():
                for hexa in os.listdir(pins):
                    try:
                        os.unlink(pins / hexa / f"{job_id}.{attempt}")
                    except (FileNotFoundError, NotADirectoryError):
                        pass


def _read_only(path: Path) -> int:
    """Make the copy at `path` read-only to all (files 0444, directories 0555), following no link;
    its bytes (regular files' sizes). Anything but regular files and directories is refused."""
    info = os.lstat(path)
    if stat.S_ISREG(info.st_mode):
        os.chmod(path, 0o444)
        return info.st_size
    if not stat.S_ISDIR(info.st_mode):
        raise DataStagingError(FORBIDDEN, str(path.name), "the copy is neither a regular file nor a directory")
    total = 0
    for top, dirs, files in os.walk(path, topdown=False):
        for name in files:
            p = os.path.join(top, name)
            st = os.lstat(p)
            if not stat.S_ISREG(st.st_mode):
                raise DataStagingError(FORBIDDEN, name, "the copy holds something that is not a regular file")
            os.chmod(p, 0o444)
            total += st.st_size
        for name in dirs:
            p = os.path.join(top, name)
            if not stat.S_ISDIR(os.lstat(p).st_mode):
                raise DataStagingError(FORBIDDEN, name, "the copy holds a link")
            os.chmod(p, 0o555)
    os.chmod(path, 0o555)
    return total


def _remove_tree(path: Path) -> None:
    """Remove what lies at `path` (read-only directories made writable first), following no link."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink(missing_ok=True)
        return
    if not path.exists():
        return
    for top, dirs, _ in os.walk(path):
        os.chmod(top, 0o700)
        for name in dirs:
            p = os.path.join(top, name)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
    shutil.rmtree(path, ignore_errors=True)
