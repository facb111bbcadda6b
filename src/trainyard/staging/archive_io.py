"""The checkpoint archive tier's I/O (issue 41): a committed step copied from a job's fast tier to
the archive and back, through fsspec (a path, or an s3:// URL of a configured object store).

The fast tier is the job's directory: its owner controls it, so it is read only through
`jobfs.Tree` (no link followed, no FIFO or device opened, no file with two names), each file to
exactly the size its manifest says (a file that is not that size is refused: the step changed
under us, or the manifest lies). The archive is the plane's own place.

Layout of one archived step, `<archive url>/job-<id>[-<dir key>]/step-<N>/`:

    <the manifest's files>   byte for byte as read from the fast tier
    SHA256SUMS               {name: sha256 hex} of what was read (JSON), for the fetch's check
    COMMITTED                the fast tier's manifest, written last: a step counts only with it

A copy is verified before anything relies on it: every file is read back from the archive and its
sha256 compared with the hash of what was read from the fast tier. Removal goes marker first,
as the runtime does (a half-removed step never looks complete).

A fetch (`fetch_step`) writes into the job's `checkpoints/` through no-follow descriptors, each
file created new (O_EXCL) and given the owner's uid and gid, its sha256 checked against
SHA256SUMS while it is written, `COMMITTED` last: the runtime then finds an ordinary committed step.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, BinaryIO

from trainyard.contracts import CHECKPOINT_MARKER
from trainyard.jobfs import Tree
from trainyard.staging import objects
from trainyard.staging.types import ObjectStore

CHUNK = 4 << 20
SUMS = "SHA256SUMS"
MAX_FILES = 100_000  # files one step's manifest may list
MANIFEST_MAX = 4 << 20  # a manifest bigger than this is not one of the runtime's
ARCHIVE_TIMEOUT_S = 120.0  # an object store's connect and each read wait at most this (then s3fs retries, then it fails)


class ArchiveError(Exception):
    """A step could not be copied, verified or fetched; the message says which file and why."""


@dataclass(frozen=True)
class Manifest:
    """A committed step's manifest as the plane trusts it: plain file names and their sizes."""

    step: int
    files: dict[str, int]
    metrics: dict[str, float]
    raw: bytes

    @property
    def bytes(self) -> int:
        return sum(self.files.values())


def parse_manifest(step: int, raw: bytes) -> Manifest:
    """The manifest of `step` from the marker's bytes.

    Raises:
        ArchiveError: not JSON, not the runtime's shape, or a file name that is not a plain name.
    """
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise ArchiveError(f"step-{step}/{CHECKPOINT_MARKER}: not JSON ({e})") from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict) or len(files) > MAX_FILES:
        raise ArchiveError(f"step-{step}/{CHECKPOINT_MARKER}: no 'files' map (or more than {MAX_FILES})")
    out: dict[str, int] = {}
    for name, size in files.items():
        if (not isinstance(name, str) or not name or "/" in name or "\x00" in name or name in (".", "..")
                or name.startswith(CHECKPOINT_MARKER) or name == SUMS):
            raise ArchiveError(f"step-{step}/{CHECKPOINT_MARKER}: file name {name!r} is not a plain name")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ArchiveError(f"step-{step}/{CHECKPOINT_MARKER}: size of {name!r} is not a byte count")
        out[name] = size
    metrics: dict[str, float] = {}
    raw_metrics = doc.get("metrics")
    if isinstance(raw_metrics, dict):
        for k, v in list(raw_metrics.items())[:100]:
            if isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v == v \
                    and abs(v) != float("inf"):
                metrics[k[:100]] = float(v)
    return Manifest(step, out, metrics, raw)


def read_manifest(tree: Tree, checkpoints: str, step: int) -> Manifest:
    """The manifest of committed `checkpoints/step-N` in a job's tree (bounded, through no link).

    Raises:
        ArchiveError: missing, refused, too big or malformed.
    """
    path = f"{checkpoints}/step-{step}/{CHECKPOINT_MARKER}"
    try:
        with tree.open_read(path) as fh:
            if os.fstat(fh.fileno()).st_size > MANIFEST_MAX:
                raise ArchiveError(f"{path}: bigger than {MANIFEST_MAX} bytes")
            raw = fh.read(MANIFEST_MAX)
    except OSError as e:
        raise ArchiveError(f"{path}: {e}") from None
    return parse_manifest(step, raw)


class Throttle:
    """At most `mb_s` MB (2^20 bytes) a second over a copy (0: no limit), by sleeping between chunks."""

    def __init__(self, mb_s: float) -> None:
        self.rate = mb_s * 2**20
        self.began = time.monotonic()
        self.done = 0

    def account(self, n: int) -> None:
        self.done += n
        if self.rate > 0:
            ahead = self.done / self.rate - (time.monotonic() - self.began)
            if ahead > 0:
                time.sleep(ahead)


@dataclass
class Archive:
    """The archive tier at `url` (a path, or s3:// with `store`'s settings)."""

    url: str
    store: ObjectStore | None = None
    _fs: Any = field(default=None, repr=False)

    @property
    def fs(self) -> Any:
        if self._fs is None:
            import fsspec  # type: ignore[import-untyped]  # the archive's only user of fsspec: loaded when an archive is configured

            if self.url.startswith("s3://"):
                opts: dict[str, object] = self.store.fsspec_options() if self.store is not None else {"anon": True}
                self._fs = objects.filesystem(opts, ARCHIVE_TIMEOUT_S)
            else:
                self._fs = fsspec.filesystem("file")
        return self._fs

    def _root(self) -> str:
        return self.url[len("s3://"):].rstrip("/") if self.url.startswith("s3://") else self.url.rstrip("/")

    def location(self, job_id: int, dir_key: str | None, step: int) -> str:
        """Where step `step` of a job lies in the archive (the URL form recorded on its copy)."""
        job = f"job-{job_id}" + (f"-{dir_key}" if dir_key else "")
        return f"{self.url.rstrip('/')}/{job}/step-{step}"

    def holds(self, location: str) -> bool:
        """Whether `location` (a copy's recorded URL) lies in this archive."""
        return location.startswith(self.url.rstrip("/") + "/")

    def _path(self, location: str) -> str:
        return location[len("s3://"):] if location.startswith("s3://") else location

    # -- fast → archive ---------------------------------------------------------------------------

    def put_step(self, tree: Tree, checkpoints: str, m: Manifest, location: str, throttle: Throttle) -> int:
        """Copy the manifest's files of `checkpoints/step-N` to `location`, then SHA256SUMS, then the
        marker; read every file back and compare its hash. Returns the bytes the archive now holds
        for the step (the files, SHA256SUMS and the marker: what `yard storage` counts for the tier).

        Raises:
            ArchiveError: a file refused, not its manifest's size, or the copy read back differs.
        """
        base = self._path(location)
        self.remove(location)  # what an interrupted copy left
        if not self.url.startswith("s3://"):
            self.fs.makedirs(base, exist_ok=True)
        sums: dict[str, str] = {}
        for name, size in sorted(m.files.items()):
            src = f"{checkpoints}/step-{m.step}/{name}"
            try:
                with tree.open_read(src) as fh, self.fs.open(f"{base}/{name}", "wb") as out:
                    sums[name] = _copy_exact(fh, out, size, src, throttle)
            except OSError as e:
                raise ArchiveError(f"{src}: {e}") from None
        sums_blob = json.dumps(sums, sort_keys=True).encode()
        self._write(f"{base}/{SUMS}", sums_blob)
        for name, want in sums.items():
            got = self._hash_of(f"{base}/{name}", m.files[name])
            if got != want:
                raise ArchiveError(f"{location}/{name}: the archive copy reads back as sha256 {got[:16]}…, "
                                   f"the fast tier's was {want[:16]}…")
        self._write(f"{base}/{CHECKPOINT_MARKER}", m.raw)
        return m.bytes + len(sums_blob) + len(m.raw)

    def _write(self, path: str, data: bytes) -> None:
        with self.fs.open(path, "wb") as out:
            out.write(data)

    def _hash_of(self, path: str, size: int) -> str:
        h = hashlib.sha256()
        n = 0
        with self.fs.open(path, "rb") as fh:
            while n <= size:
                chunk = fh.read(min(CHUNK, size + 1 - n))
                if not chunk:
                    break
                h.update(chunk)
                n += len(chunk)
        if n != size:
            return f"<{n} bytes, not {size}>"
        return h.hexdigest()

    def committed(self, location: str) -> bool:
        try:
            return bool(self.fs.exists(f"{self._path(location)}/{CHECKPOINT_MARKER}"))
        except OSError:
            return False

    def remove(self, location: str) -> None:
        """Remove an archived step, marker first; nothing there is no error."""
        base = self._path(location)
        try:
            if self.fs.exists(f"{base}/{CHECKPOINT_MARKER}"):
                self.fs.rm(f"{base}/{CHECKPOINT_MARKER}")
            if self.fs.exists(base):
                self.fs.rm(base, recursive=True)
        except FileNotFoundError:
            pass

    # -- archive → fast ---------------------------------------------------------------------------

    def fetch_step(self, location: str, tree: Tree, checkpoints: str, step: int,
                   owner: tuple[int, int] | None) -> int:
        """Copy an archived step back into `checkpoints/step-N` of a job's tree, as `owner`'s files
        (uid, gid), every file's sha256 checked, the marker last. Returns the bytes fetched.

        Raises:
            ArchiveError: the archived step is incomplete or does not hash to its SHA256SUMS.
            OSError: the job's directory refused a step (a link, not a directory).
        """
        base = self._path(location)
        try:
            with self.fs.open(f"{base}/{CHECKPOINT_MARKER}", "rb") as fh:
                raw = fh.read(MANIFEST_MAX + 1)
            with self.fs.open(f"{base}/{SUMS}", "rb") as fh:
                sums = json.loads(fh.read(MANIFEST_MAX + 1))
        except (OSError, ValueError) as e:
            raise ArchiveError(f"{location}: not a complete archived step ({e})") from None
        m = parse_manifest(step, raw)
        rel = f"{checkpoints}/step-{step}"
        tree.remove_tree(rel)  # an interrupted fetch's leftovers (never through a link)
        tree.make_dir(rel, 0o750, owner=owner)
        done = 0
        for name, size in sorted(m.files.items()):
            with self.fs.open(f"{base}/{name}", "rb") as src, _create(tree, f"{rel}/{name}", owner) as out:
                got = _copy_exact(src, out, size, f"{location}/{name}", None)
                os.fsync(out.fileno())
            if not isinstance(sums, dict) or sums.get(name) != got:
                raise ArchiveError(f"{location}/{name}: sha256 {got[:16]}… is not the one recorded at archiving")
            done += size
        with _create(tree, f"{rel}/{CHECKPOINT_MARKER}", owner) as out:
            out.write(raw)
            out.flush()
            os.fsync(out.fileno())
        return done


def _copy_exact(src: BinaryIO, out: Any, size: int, what: str, throttle: Throttle | None) -> str:
    """Copy exactly `size` bytes from `src` to `out` (a longer or shorter file is refused); their sha256."""
    if hasattr(src, "fileno"):
        try:
            st = os.fstat(src.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size != size:
                raise ArchiveError(f"{what}: {st.st_size} bytes, the manifest says {size}")
        except (OSError, ValueError, AttributeError):
            pass
    h = hashlib.sha256()
    left = size
    while left > 0:
        chunk = src.read(min(CHUNK, left))
        if not chunk:
            raise ArchiveError(f"{what}: ends {left} bytes before its manifest size {size}")
        h.update(chunk)
        out.write(chunk)
        left -= len(chunk)
        if throttle is not None:
            throttle.account(len(chunk))
    if src.read(1):
        raise ArchiveError(f"{what}: longer than its manifest size {size}")
    return h.hexdigest()


class _create:
    """A new regular file in a tree (O_EXCL, no link followed), given `owner`; a binary writer."""

    def __init__(self, tree: Tree, path: str, owner: tuple[int, int] | None) -> None:
        self.tree, self.path, self.owner = tree, path, owner

    def __enter__(self) -> BinaryIO:
        p = PurePosixPath(self.path)
        with self.tree.dir_fd(str(p.parent)) as dfd:
            fd = os.open(p.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640, dir_fd=dfd)
        try:
            if self.owner is not None:
                os.fchown(fd, *self.owner)
        except BaseException:
            os.close(fd)
            raise
        self.fh = os.fdopen(fd, "wb")
        return self.fh

    def __exit__(self, *exc: object) -> None:
        self.fh.close()
