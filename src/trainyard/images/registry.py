"""A registry, as the plane reaches it through `skopeo`: an image's digest resolved, an image pulled
by digest into a node's OCI layout, a failure classified into the kinds of `images/types.py`.

What is pinned: the digest of the manifest of the one image that runs. A tag that names a manifest
list (an OCI index) resolves to the entry for this machine's platform (linux and its architecture),
so the recorded digest is the one a later pull by digest fetches, byte for byte, on any node.

Credentials never reach a command line (where /proc shows them to every user): they go into an
authfile written 0600 in a private temporary directory, removed after the call; without
credentials a registry is asked anonymously (`--no-creds`), never with the plane's own login files
(the tool's HOME is private, tools.py). A registry that `RegistryAccess.plain_http` names is reached
over plain HTTP (`--tls-verify=false`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import platform
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainyard.images import tools
from trainyard.images.types import (
    BAD_IMAGE,
    DISK_FULL,
    NOT_FOUND,
    UNAUTHORIZED,
    UNREACHABLE,
    ImagePullError,
    RegistryAccess,
)
from trainyard.spec.image_ref import ImageRef

MANIFEST_MAX = 4 * 1024 * 1024  # distribution's own limit on a manifest
INDEX_TYPES = frozenset({"application/vnd.oci.image.index.v1+json",
                         "application/vnd.docker.distribution.manifest.list.v2+json"})
IMAGE_TYPES = frozenset({"application/vnd.oci.image.manifest.v1+json",
                         "application/vnd.docker.distribution.manifest.v2+json"})
_ARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64", "ppc64le": "ppc64le",
         "s390x": "s390x"}

# skopeo's (and the registry's) words, lower case; status codes as whole words (a digest's hex
# digits or a port are no status). An unknown repository behind a login answers 401 (the registry
# cannot tell whom not to tell): that is UNAUTHORIZED, as the registry said.
_UNAUTHORIZED = re.compile(r"unauthorized|authentication required|status:? ?40[13]\b|forbidden|denied|"
                           r"invalid username/password|incorrect username or password")
_NOT_FOUND = re.compile(r"manifest unknown|name unknown|blob unknown|not found|repository name not known|"
                        r"does not exist|status:? ?404\b")


def machine_platform() -> tuple[str, str]:
    """(os, architecture) as OCI names them, for this machine."""
    machine = platform.machine().lower()
    return "linux", _ARCH.get(machine, machine)


def classify(message: str) -> str:
    """The `ImagePullError` kind of a failed skopeo call, from what it printed: the node's disk is
    full (DISK_FULL), the registry refused the login (UNAUTHORIZED), it does not have the image
    (NOT_FOUND), or anything else kept it from answering (UNREACHABLE: connection refused, no such
    host, TLS, a timeout, a 5xx; its fault, not the user's)."""
    low = message.lower()
    if "no space left on device" in low or "disk quota exceeded" in low:
        return DISK_FULL
    if _UNAUTHORIZED.search(low):
        return UNAUTHORIZED
    if _NOT_FOUND.search(low):
        return NOT_FOUND
    return UNREACHABLE


def _fail(result: tools.ToolResult, image: str) -> ImagePullError:
    line = tools.last_line(result.stderr)
    return ImagePullError(classify(result.stderr), image, line)


@contextmanager
def _access_args(ref: ImageRef, access: RegistryAccess, prefix: str) -> Iterator[list[str]]:
    """skopeo's TLS and credential options for `ref`'s registry (`prefix`: "" for inspect, "src-" for copy)."""
    args = [f"--{prefix}tls-verify={'false' if access.plain_http(ref.registry) else 'true'}"]
    creds = access.credentials.get(ref.registry)
    if creds is None:
        yield args + [f"--{prefix}no-creds"]
        return
    with tempfile.TemporaryDirectory(prefix="trainyard-auth-") as private:
        os.chmod(private, 0o700)
        path = os.path.join(private, "auth.json")
        token = base64.b64encode(f"{creds.username}:{creds.password}".encode()).decode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"auths": {ref.registry: {"auth": token}}}, f)
        yield args + [f"--{prefix}authfile", path]


def _transport(ref: ImageRef, reference: str | None = None) -> str:
    reference = reference or ref.reference
    sep = "@" if reference.startswith("sha256:") else ":"
    return f"docker://{ref.name}{sep}{reference}"


def fetch_manifest(ref: ImageRef, access: RegistryAccess, reference: str | None = None) -> bytes:
    """The raw manifest (or index) `ref` (or `reference` in its repository) names, as the registry
    serves it.

    Raises:
        ImagePullError: what the registry answered, classified (module docstring).
    """
    with _access_args(ref, access, "") as args:
        result = tools.run(["skopeo", "inspect", "--raw", "--retry-times", "0", *args, _transport(ref, reference)],
                           timeout=access.timeout_s, image=ref.canonical(), stdout_max=MANIFEST_MAX)
    if result.returncode != 0:
        raise _fail(result, ref.canonical())
    if result.truncated:
        raise ImagePullError(BAD_IMAGE, ref.canonical(), f"manifest over {MANIFEST_MAX} bytes")
    return result.stdout


def _media_type(raw: bytes, image: str) -> tuple[str, dict]:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ImagePullError(BAD_IMAGE, image, "the registry's manifest is not JSON") from None
    if not isinstance(doc, dict):
        raise ImagePullError(BAD_IMAGE, image, "the registry's manifest is not a JSON object")
    kind = doc.get("mediaType") or ("application/vnd.oci.image.index.v1+json" if "manifests" in doc
                                    else "application/vnd.oci.image.manifest.v1+json" if "layers" in doc else "")
    return str(kind), doc


def _platform_entry(index: dict, image: str) -> str:
    want_os, want_arch = machine_platform()
    for entry in index.get("manifests") or []:
        plat = entry.get("platform") or {}
        if plat.get("os") == want_os and plat.get("architecture") == want_arch \
                and entry.get("mediaType", next(iter(IMAGE_TYPES))) in IMAGE_TYPES:
            digest = str(entry.get("digest", ""))
            if digest.startswith("sha256:") and len(digest) == 71:
                return digest
    raise ImagePullError(NOT_FOUND, image, f"the image has no {want_os}/{want_arch} variant")


def resolve_digest(ref: ImageRef, access: RegistryAccess) -> str:
    """The `sha256:…` digest of the image manifest `ref` names now: for a tag, what it points at
    (for a manifest list, this platform's entry); for a digest, that digest checked to exist (or
    this platform's entry of the list it names). Pull this digest, record it: it is what runs.

    Raises:
        ImagePullError: NOT_FOUND (no such repository, tag or digest, or no variant for this
            machine), UNAUTHORIZED, UNREACHABLE, BAD_IMAGE (a manifest the cache cannot run).
    """
    image = ref.canonical()
    raw = fetch_manifest(ref, access)
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    if ref.digest is not None and digest != ref.digest:
        raise ImagePullError(BAD_IMAGE, image, f"the registry served a manifest of digest {digest}")
    kind, doc = _media_type(raw, image)
    if kind in INDEX_TYPES:
        digest = _platform_entry(doc, image)
        kind, _ = _media_type(fetch_manifest(ref, access, digest), image)
    if kind not in IMAGE_TYPES:
        raise ImagePullError(BAD_IMAGE, image, f"unsupported manifest type {kind or 'unknown'!r} "
                                               "(OCI or Docker schema 2 images only)")
    return digest


def pull(ref: ImageRef, access: RegistryAccess, layout: Path, name: str) -> None:
    """Copy the image `ref.digest` names into the OCI layout `layout` as `name` (blobs the layout
    already holds are not fetched again). The caller holds the layout's lock.

    Raises:
        ImagePullError: as `resolve_digest`; DISK_FULL is the caller's to find (a write that failed).
    """
    if ref.digest is None:
        raise ValueError(f"{ref.canonical()}: pull an image pinned to a digest")
    with _access_args(ref, access, "src-") as args:
        result = tools.run(["skopeo", "copy", "--quiet", "--retry-times", "0", *args, _transport(ref, ref.digest),
                            f"oci:{layout}:{name}"], timeout=access.timeout_s, image=ref.canonical())
    if result.returncode != 0:
        raise _fail(result, ref.canonical())
