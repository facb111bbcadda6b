"""A node cache's record of its images: one JSON file per image (`images/<digest hex>.json`), its
last use the file's mtime, and beside it the lock file a running container holds shared.

An entry is written last, by rename, after every layer it names is in place: an entry that exists
names a whole image. Readers (`get`, `entries`) need no lock: a file is either there, whole, or
not. Removing an entry takes its lock file exclusively without waiting: held shared by a runner,
the image is in use and stays. A runner takes the lock shared, then checks the entry is still
there (`CachedImage.lock_path`): an image removed in between is gone for it too.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainyard.images.types import CachedImage, ImageConfig

_HEX = re.compile(r"[0-9a-f]{64}")


def hex_of(digest: str) -> str:
    """The 64 hex digits of a `sha256:` digest (the name of its files in the cache)."""
    algo, _, hexa = digest.partition(":")
    if algo != "sha256" or not _HEX.fullmatch(hexa):
        raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
    return hexa


@dataclass(frozen=True)
class Entry:
    """What an entry file says, and when it was last used."""

    image: CachedImage
    layer_digests: tuple[str, ...]
    layer_sizes: tuple[int, ...]
    last_used: float


class EntryStore:
    """The `images/` directory of a node cache; `layers` is where the layer directories are."""

    def __init__(self, directory: Path, layers: Path) -> None:
        self.dir = directory
        self.layers = layers

    def json_path(self, digest: str) -> Path:
        return self.dir / f"{hex_of(digest)}.json"

    def lock_path(self, digest: str) -> Path:
        return self.dir / f"{hex_of(digest)}.lock"

    def write(self, digest: str, name: str, layers: list[tuple[str, int]], config: ImageConfig,
              size: int) -> CachedImage:
        """Record an image whose layers (digest, size) are all in place; the lock file first."""
        lock = self.lock_path(digest)
        os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        doc = {"digest": digest, "name": name, "size": size,
               "layers": [{"digest": d, "size": s} for d, s in layers],
               "config": {"env": config.env, "entrypoint": config.entrypoint, "cmd": config.cmd,
                          "workdir": config.workdir, "user": config.user}}
        tmp = self.dir / f".{hex_of(digest)}.json.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.json_path(digest))
        found = self.read(digest)
        assert found is not None
        return found.image

    def read(self, digest: str) -> Entry | None:
        """The entry of `digest`, or None when there is none (or it went while being read)."""
        try:
            fd = os.open(self.json_path(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except (FileNotFoundError, ValueError):
            return None
        with os.fdopen(fd, "rb") as f:
            last_used = os.fstat(f.fileno()).st_mtime
            try:
                doc: dict[str, Any] = json.loads(f.read(16 * 1024 * 1024))
            except ValueError:
                return None
        c = doc["config"]
        layers = [(str(x["digest"]), int(x["size"])) for x in doc["layers"]]
        image = CachedImage(digest=doc["digest"], name=doc["name"],
                            layers=tuple(str(self.layers / hex_of(d)) for d, _ in layers),
                            config=ImageConfig(env=tuple(c["env"]), entrypoint=tuple(c["entrypoint"]),
                                               cmd=tuple(c["cmd"]), workdir=c["workdir"], user=c["user"]),
                            lock_path=str(self.lock_path(digest)), size_bytes=int(doc["size"]))
        return Entry(image, tuple(d for d, _ in layers), tuple(s for _, s in layers), last_used)

    def touch(self, digest: str) -> bool:
        """Mark `digest` used now; False when it has no entry."""
        try:
            os.utime(self.json_path(digest), follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True

    def all(self) -> list[Entry]:
        found = []
        for name in sorted(os.listdir(self.dir)):
            if name.endswith(".json") and _HEX.fullmatch(name[:-5]):
                entry = self.read(f"sha256:{name[:-5]}")
                if entry is not None:
                    found.append(entry)
        return found

    def in_use(self, digest: str) -> bool:
        """Whether a runner holds the image's lock (a shared flock)."""
        try:
            fd = os.open(self.lock_path(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def remove(self, digest: str) -> bool:
        """Remove the entry unless a runner holds it; True when it was removed."""
        try:
            fd = os.open(self.lock_path(digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = -1
        try:
            if fd >= 0:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    return False
            try:
                os.unlink(self.json_path(digest))
            except FileNotFoundError:
                return False
            finally:
                if fd >= 0:
                    os.unlink(self.lock_path(digest))
            return True
        finally:
            if fd >= 0:
                os.close(fd)
