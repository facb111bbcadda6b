"""A node's OCI image layout (`<cache>/oci`, what `skopeo copy` writes): its images by name, their
manifests and configs read back bounded, and the blobs no image names any more removed.

The layout is the plane's own (root's, under a 0700 directory) but its contents come from a
registry: every document is read with a size bound and checked for the fields the cache uses, and a
blob is opened only as a regular file named by a well-formed digest. Only the cache's writer (under
its lock) calls `forget` and `collect`.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from trainyard.images.types import BAD_IMAGE, ImageConfig, ImagePullError

REF_NAME = "org.opencontainers.image.ref.name"
DOC_MAX = 4 * 1024 * 1024
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
LAYER_TYPES = {
    "application/vnd.oci.image.layer.v1.tar": "tar",
    "application/vnd.oci.image.layer.v1.tar+gzip": "gzip",
    "application/vnd.docker.image.rootfs.diff.tar.gzip": "gzip",
    "application/vnd.oci.image.layer.v1.tar+zstd": "zstd",
}


def blob_path(layout: Path, digest: str) -> Path:
    if not _DIGEST.fullmatch(digest):
        raise ValueError(f"not a sha256 digest: {digest[:80]!r}")
    return layout / "blobs" / "sha256" / digest.split(":", 1)[1]


def open_blob(layout: Path, digest: str) -> int:
    """A descriptor of the blob `digest`, a regular file (never a link or a FIFO)."""
    fd = os.open(blob_path(layout, digest), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ImagePullError(BAD_IMAGE, digest, "a blob of the node's layout is not a regular file")
    return fd


def _read_json(path_fd: int, what: str, image: str) -> Any:
    with os.fdopen(path_fd, "rb") as f:
        data = f.read(DOC_MAX + 1)
    if len(data) > DOC_MAX:
        raise ImagePullError(BAD_IMAGE, image, f"{what} over {DOC_MAX} bytes")
    try:
        return json.loads(data)
    except ValueError:
        raise ImagePullError(BAD_IMAGE, image, f"{what} is not JSON") from None


def read_index(layout: Path) -> dict[str, Any]:
    """The layout's index.json (an empty one when there is none yet)."""
    try:
        fd = os.open(layout / "index.json", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return {"schemaVersion": 2, "manifests": []}
    doc = _read_json(fd, "the layout's index.json", str(layout))
    if not isinstance(doc, dict) or not isinstance(doc.get("manifests", []), list):
        raise ImagePullError(BAD_IMAGE, str(layout), "the layout's index.json is malformed")
    return doc


def manifest_of(layout: Path, name: str, image: str) -> dict[str, Any]:
    """The manifest the layout names `name`, checked to be an image's (config and layers)."""
    for desc in read_index(layout).get("manifests", []):
        if isinstance(desc, dict) and (desc.get("annotations") or {}).get(REF_NAME) == name:
            doc = _read_json(open_blob(layout, str(desc.get("digest", ""))), "the image's manifest", image)
            break
    else:
        raise ImagePullError(BAD_IMAGE, image, f"the pull left no image {name!r} in the node's layout")
    layers = doc.get("layers") if isinstance(doc, dict) else None
    config = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(layers, list) or not isinstance(config, dict) \
            or not all(isinstance(x, dict) and _DIGEST.fullmatch(str(x.get("digest", ""))) for x in [config, *layers]):
        raise ImagePullError(BAD_IMAGE, image, "the image's manifest lacks a config or layers")
    for layer in layers:
        kind = str(layer.get("mediaType", ""))
        if kind not in LAYER_TYPES:
            raise ImagePullError(BAD_IMAGE, image, f"unsupported layer type {kind[:100]!r}")
    return doc


def _strings(value: Any, field: str, image: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ImagePullError(BAD_IMAGE, image, f"the image config's {field} is not a list of strings")
    return tuple(value)


def config_of(layout: Path, manifest: dict[str, Any], image: str, arch: str) -> tuple[ImageConfig, list[str]]:
    """The image's run settings and its layers' diff_ids (uncompressed digests), from its config
    blob; an image for another architecture or OS is BAD_IMAGE."""
    doc = _read_json(open_blob(layout, manifest["config"]["digest"]), "the image's config", image)
    if not isinstance(doc, dict):
        raise ImagePullError(BAD_IMAGE, image, "the image's config is not a JSON object")
    if doc.get("os", "linux") != "linux" or doc.get("architecture", arch) != arch:
        raise ImagePullError(BAD_IMAGE, image, f"the image is for {doc.get('os')}/{doc.get('architecture')}, "
                                               f"this node is linux/{arch}")
    run = doc.get("config") or {}
    if not isinstance(run, dict):
        raise ImagePullError(BAD_IMAGE, image, "the image config's config is not an object")
    diff_ids = _strings((doc.get("rootfs") or {}).get("diff_ids"), "rootfs.diff_ids", image)
    if len(diff_ids) != len(manifest["layers"]):
        raise ImagePullError(BAD_IMAGE, image, f"the config lists {len(diff_ids)} diff_ids for "
                                               f"{len(manifest['layers'])} layers")
    user, workdir = run.get("User") or "", run.get("WorkingDir") or ""
    if not isinstance(user, str) or not isinstance(workdir, str):
        raise ImagePullError(BAD_IMAGE, image, "the image config's User or WorkingDir is not a string")
    return ImageConfig(env=_strings(run.get("Env"), "Env", image), entrypoint=_strings(run.get("Entrypoint"), "Entrypoint", image),
                       cmd=_strings(run.get("Cmd"), "Cmd", image), workdir=workdir, user=user), list(diff_ids)


def _write_index(layout: Path, doc: dict[str, Any]) -> None:
    tmp = layout / "index.json.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, layout / "index.json")


def forget(layout: Path, names: set[str]) -> None:
    """Drop `names` from the layout's index (their blobs go at the next `collect`)."""
    doc = read_index(layout)
    kept = [d for d in doc.get("manifests", []) if (d.get("annotations") or {}).get(REF_NAME) not in names]
    if len(kept) != len(doc.get("manifests", [])):
        doc["manifests"] = kept
        _write_index(layout, doc)


def collect(layout: Path) -> int:
    """Remove every blob no image of the index names, and the temporary files an interrupted copy
    left; returns the bytes freed."""
    if not (layout / "blobs" / "sha256").is_dir():
        return 0
    keep: set[str] = set()
    for desc in read_index(layout).get("manifests", []):
        digest = str(desc.get("digest", ""))
        keep.add(digest)
        try:
            doc = _read_json(open_blob(layout, digest), "a manifest", str(layout))
        except (OSError, ValueError, ImagePullError):
            continue
        for d in [doc.get("config") or {}, *(doc.get("layers") or [])]:
            if isinstance(d, dict):
                keep.add(str(d.get("digest", "")))
    freed = 0
    blobs = layout / "blobs" / "sha256"
    for entry in os.scandir(blobs):
        if f"sha256:{entry.name}" not in keep:
            freed += entry.stat(follow_symlinks=False).st_size
            os.unlink(entry.path)
    for entry in os.scandir(layout):  # an interrupted skopeo's temporary files
        if entry.is_file(follow_symlinks=False) and entry.name not in ("index.json", "oci-layout"):
            freed += entry.stat(follow_symlinks=False).st_size
            os.unlink(entry.path)
    return freed


def blobs_size(layout: Path) -> int:
    blobs = layout / "blobs" / "sha256"
    if not blobs.is_dir():
        return 0
    return sum(e.stat(follow_symlinks=False).st_size for e in os.scandir(blobs))
