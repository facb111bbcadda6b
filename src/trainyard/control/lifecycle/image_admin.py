"""What `yard image pull|ls|rm` asks of the nodes' image caches (docs/control-plane.md, "Environment
images"), through the backend's `prepare_image`, `image_entries` and `remove_image` (backends/base.py).

A pull resolves the image's digest once (`resolve_digest` of the images part's registry module), so that every node
caches the very same image, then pulls on every node at once, each on a thread of its own: a
cold pull of a large image takes minutes, and a node's failure is that node's line in the answer,
not the others'. None of it holds the plane's lock (the caller's `services/units.py` takes none).
"""

from __future__ import annotations

import importlib
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from trainyard.backends.base import Backend, BackendError
from trainyard.images.types import EntryInfo, ImagePullError, RegistryAccess
from trainyard.spec.image_ref import parse_image

MAX_THREADS = 32


def _resolve(ref: Any, access: RegistryAccess) -> str:
    # the pull machinery (images/registry.py), loaded when an admin first pulls
    registry = importlib.import_module("trainyard.images.registry")
    digest: str = registry.resolve_digest(ref, access)
    return digest


class ImageAdmin:
    """The admin's image commands on one backend; `access()` is the configuration's registry
    access in force (its password files read at each call)."""

    def __init__(self, backend: Backend, access: Callable[[], RegistryAccess],
                 resolve: Callable[[Any, RegistryAccess], str] = _resolve):
        self.backend, self.access, self.digest_of = backend, access, resolve

    def pull(self, image: str, nodes: list[str]) -> dict[str, Any]:
        """`image` pinned and cached on each of `nodes`: `{image, digest, nodes: [{node, ok, error,
        kind, size_bytes}]}`. Raises `ImagePullError` when the digest cannot be resolved (then no
        node was asked)."""
        ref = parse_image(image, "image")
        access = self.access()
        digest = ref.digest or self.digest_of(ref, access)
        pinned = ref.pinned(digest).canonical()

        def one(node: str) -> dict[str, Any]:
            try:
                cached = self.backend.prepare_image(node, pinned, access)
            except ImagePullError as e:
                return {"node": node, "ok": False, "error": str(e), "kind": e.kind, "size_bytes": None}
            except BackendError as e:
                return {"node": node, "ok": False, "error": str(e), "kind": "backend", "size_bytes": None}
            return {"node": node, "ok": True, "error": None, "kind": None, "size_bytes": cached.size_bytes}

        with ThreadPoolExecutor(max_workers=max(1, min(len(nodes), MAX_THREADS)),
                                thread_name_prefix="image-pull") as pool:
            results = list(pool.map(one, nodes))
        return {"image": ref.canonical(), "digest": digest, "nodes": results}

    def entries(self, nodes: list[str]) -> list[EntryInfo]:
        """Every cached image of `nodes`, node by node."""
        return [e for node in nodes for e in self.backend.image_entries(node)]

    def remove(self, target: str, nodes: list[str]) -> list[dict[str, Any]]:
        """Each entry of `target` (a digest `sha256:…`; an image pinned by digest: that digest; an
        image by tag: every cached digest of its repository) removed from `nodes`: `[{node, name,
        digest, removed, why}]`; an entry a running container holds is kept (`why`: in use)."""
        out: list[dict[str, Any]] = []
        for entry in self.entries(nodes):
            if not _matches(target, entry):
                continue
            removed = not entry.in_use and self.backend.remove_image(entry.node, entry.digest)
            out.append({"node": entry.node, "name": entry.name, "digest": entry.digest, "removed": removed,
                        "why": None if removed else "in use by a running job" if entry.in_use else "in use or gone"})
        return out


def _matches(target: str, entry: EntryInfo) -> bool:
    if target.startswith("sha256:"):
        return entry.digest == target
    ref = parse_image(target, "image")
    if ref.digest:
        return entry.digest == ref.digest
    try:  # an entry's name is `registry/repository`, perhaps with the tag it was pulled by
        return parse_image(entry.name, "name").name == ref.name
    except ValueError:
        return False
