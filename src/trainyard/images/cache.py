"""A node's image cache: images pinned by digest, pulled once, unpacked once per layer, evicted
least recently used over a size cap.

    <root>/            0700, root's: a job's owner reads no team's image from the host
      lock             the writers' flock: a pull, an eviction, a removal (one at a time per node)
      oci/             one OCI layout (skopeo's destination): blobs shared between images
      layers/<hex>/    each layer unpacked once (layers.py), shared between images
      images/<hex>.json, <hex>.lock   an image's entry and its in-use lock (entries.py)
      tmp/             where layers are unpacked before their rename into layers/

`ensure` finds an image without the lock (its entry exists: done); else it takes the lock, looks
again (a second pull of the same image on the node waits for the first and finds its entry), and
pulls. Every write lands by rename, the entry last, so a kill or a full disk at any point leaves
either the whole image or nothing a later `ensure` takes as done; what an interrupted writer left
(a temporary tree, a blob no image names, a layer no entry names) is swept by the next writer
before it starts. A full disk evicts what is not in use and tries once more, then is DISK_FULL.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainyard.images import layers as layer_unpack
from trainyard.images import layout, registry
from trainyard.images.entries import Entry, EntryStore, hex_of
from trainyard.images.types import (
    BAD_IMAGE,
    DISK_FULL,
    CachedImage,
    EntryInfo,
    ImagePullError,
    RegistryAccess,
)
from trainyard.spec.image_ref import ImageRef

UNLIMITED = 1 << 62


def _no_space(e: OSError) -> bool:
    return e.errno in (errno.ENOSPC, errno.EDQUOT)


def tree_size(path: Path) -> int:
    """Bytes a directory tree takes (its files' sizes plus a block per entry), following no link."""
    total = 0
    for top, dirs, files in os.walk(path):
        for name in dirs + files:
            total += os.lstat(os.path.join(top, name)).st_size + layer_unpack.ENTRY_COST
    return total


class NodeCache:
    """The image cache of node `node` under `root` (module docstring); `cap_bytes` None: no cap."""

    def __init__(self, root: Path, node: str, cap_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.node = node
        self.cap_bytes = cap_bytes
        self.oci = self.root / "oci"
        self.layers = self.root / "layers"
        self.tmp = self.root / "tmp"
        self.store = EntryStore(self.root / "images", self.layers)
        self._arch = registry.machine_platform()[1]
        self._prepare()

    # -- reading: no lock ------------------------------------------------------------------------

    def get(self, digest: str) -> CachedImage | None:
        entry = self.store.read(digest)
        return entry.image if entry else None

    def entries(self) -> list[EntryInfo]:
        return [EntryInfo(node=self.node, name=e.image.name, digest=e.image.digest, size_bytes=e.image.size_bytes,
                          last_used=e.last_used, in_use=self.store.in_use(e.image.digest)) for e in self.store.all()]

    def usage(self) -> int:
        """Bytes the cache holds: each layer once, and the layout's blobs."""
        sizes: dict[str, int] = {}
        for e in self.store.all():
            sizes.update(zip(e.layer_digests, e.layer_sizes))
        return sum(sizes.values()) + layout.blobs_size(self.oci)

    # -- writing: under the lock -----------------------------------------------------------------

    def ensure(self, ref: ImageRef, access: RegistryAccess) -> CachedImage:
        """The image `ref` (pinned: `ref.digest` set) in this cache: found (its last use now), or
        pulled and unpacked; then the cache is brought under its cap.

        Raises:
            ImagePullError: the pull failed (registry.py's kinds), BAD_IMAGE (the cache refuses to
                unpack it), DISK_FULL (no room even after evicting what is not in use).
            ValueError: `ref` is not pinned.
        """
        if ref.digest is None:
            raise ValueError(f"{ref.canonical()}: the cache holds images pinned to a digest")
        digest = ref.digest
        if self.store.touch(digest) and (hit := self.get(digest)) is not None:
            return hit
        with self._locked():
            if self.store.touch(digest) and (hit := self.get(digest)) is not None:
                return hit
            self._sweep()
            try:
                image = self._fetch_once(ref, access)
            except ImagePullError as e:
                if e.kind != DISK_FULL or isinstance(e, layer_unpack.OverCap):
                    raise
                self._evict(keep=digest, target=0)  # the disk is full: make all the room there is, once
                image = self._fetch_once(ref, access)
            self._evict(keep=digest, target=self.cap_bytes)
            return image

    def remove(self, digest: str) -> bool:
        """Remove the image `digest` (and what only it used); False when it is absent or in use."""
        with self._locked():
            done = self.store.remove(digest)
            if done:
                self._sweep()
            return done

    def _fetch_once(self, ref: ImageRef, access: RegistryAccess) -> CachedImage:
        try:
            return self._fetch(ref, access)
        except OSError as e:
            self._sweep()
            if _no_space(e):
                raise ImagePullError(DISK_FULL, ref.canonical(), "no space left on the node's image cache") from None
            raise ImagePullError(BAD_IMAGE, ref.canonical(), f"cannot unpack: {e.strerror or e}") from None
        except BaseException:
            self._sweep()
            raise

    def _fetch(self, ref: ImageRef, access: RegistryAccess) -> CachedImage:
        assert ref.digest is not None
        image, name = ref.canonical(), hex_of(ref.digest)
        registry.pull(ref, access, self.oci, name)
        manifest = layout.manifest_of(self.oci, name, image)
        config, diff_ids = layout.config_of(self.oci, manifest, image, self._arch)
        blobs = sum(int(d.get("size", 0)) for d in [manifest["config"], *manifest["layers"]])
        budget = UNLIMITED if self.cap_bytes is None else self.cap_bytes - blobs
        if budget < 0:
            raise layer_unpack.OverCap(image, f"the image's {blobs} compressed bytes alone are more than "
                                              f"the cache's cap of {self.cap_bytes} bytes")
        unpacked: list[tuple[str, int]] = []
        for desc, diff_id in zip(manifest["layers"], diff_ids):
            size = self._layer(desc, diff_id, image, budget)
            budget -= size
            unpacked.append((str(desc["digest"]), size))
        return self.store.write(ref.digest, ref.name, unpacked, config, blobs + sum(s for _, s in unpacked))

    def _layer(self, desc: dict, diff_id: str, image: str, budget: int) -> int:
        """Unpack one layer unless it is there; its size."""
        digest = str(desc["digest"])
        final = self.layers / hex_of(digest)
        if final.is_dir():
            for e in self.store.all():
                if digest in e.layer_digests:
                    return e.layer_sizes[e.layer_digests.index(digest)]
            return tree_size(final)
        work = self.tmp / f"{hex_of(digest)}.{os.getpid()}"
        work.mkdir(mode=0o755)
        fd = layout.open_blob(self.oci, digest)
        with os.fdopen(fd, "rb") as blob:
            size = layer_unpack.unpack(blob, str(work), image=image, media_type=str(desc.get("mediaType", "")),
                                       diff_id=diff_id, budget=budget)
        os.rename(work, final)
        return size

    def _evict(self, keep: str, target: int | None) -> None:
        """Remove least recently used images not in use (never `keep`) until the cache holds at
        most `target` bytes."""
        if target is None:
            return
        for entry in sorted(self.store.all(), key=lambda e: e.last_used):
            if self.usage() <= target:
                break
            if entry.image.digest != keep and self.store.remove(entry.image.digest):
                self._sweep()

    def _sweep(self) -> None:
        """Remove what no entry names: temporary trees, layers, the layout's names and blobs."""
        live: list[Entry] = self.store.all()
        for child in os.listdir(self.tmp):
            _remove_tree(self.tmp / child)
        wanted_layers = {hex_of(d) for e in live for d in e.layer_digests}
        for child in os.listdir(self.layers):
            if child not in wanted_layers:
                _remove_tree(self.layers / child)
        try:
            names = {str((d.get("annotations") or {}).get(layout.REF_NAME, ""))
                     for d in layout.read_index(self.oci).get("manifests", [])}
            layout.forget(self.oci, names - {hex_of(e.image.digest) for e in live})
            layout.collect(self.oci)
        except (ImagePullError, ValueError, OSError):  # a layout an interrupted copy broke: start it anew
            _remove_tree(self.oci)
            self.oci.mkdir(mode=0o700)
        for child in os.listdir(self.store.dir):
            if child.endswith(".lock") and not (self.store.dir / (child[:-5] + ".json")).exists() \
                    or child.startswith("."):
                os.unlink(self.store.dir / child)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _prepare(self) -> None:
        """The cache's directories, root's and 0700 (a link or another owner's directory in their
        place is refused: they hold what every team pulled)."""
        for d in (self.root, self.oci, self.layers, self.store.dir, self.tmp):
            try:
                d.mkdir(mode=0o700, parents=d == self.root)
            except FileExistsError:
                pass
            info = os.lstat(d)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                raise ImagePullError(BAD_IMAGE, str(d), "the image cache's directory is a link or not the plane's own")
            if stat.S_IMODE(info.st_mode) != 0o700:
                os.chmod(d, 0o700)


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    shutil.rmtree(path)
