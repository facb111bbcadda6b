"""What the parts agree on about images: the registry access, a cached image, a pull's failure.

Standard library only: the backends and the loop read these without the pull machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Credentials:
    """A login for one registry (from the configuration's `images.registries[].username` and
    `password_file`: the secret is read by the plane, never stored in the job or shown)."""

    username: str
    password: str = field(repr=False)


@dataclass(frozen=True)
class RegistryAccess:
    """How the plane reaches registries: which are plain HTTP (`insecure`: a registry on loopback
    always is, as Docker treats localhost), and the credentials for each (`registry host[:port]` →
    `Credentials`)."""

    insecure: frozenset[str] = frozenset()
    credentials: dict[str, Credentials] = field(default_factory=dict)
    timeout_s: float = 600.0  # one skopeo call; a registry that hangs is "unreachable" after it
    # each node cache's size cap (the configuration's `images.cache_max_gib`), carried with the
    # access so that a change of configuration applies at the next pull; None: the backend's own
    cache_max_bytes: int | None = None

    def plain_http(self, registry: str) -> bool:
        host = registry.rsplit(":", 1)[0] if not registry.endswith("]") else registry
        return registry in self.insecure or host in ("localhost", "127.0.0.1", "[::1]") or host.startswith("127.")


# Kinds of pull failure. `registry_fault`: not the user's doing, so not counted against the
# job's retries (the registry down, the plane's credentials refused, the node's disk full).
NOT_FOUND = "not_found"  # no such repository, tag or digest (the user's)
UNAUTHORIZED = "unauthorized"  # the registry refused the plane's credentials (the configuration's)
UNREACHABLE = "unreachable"  # connection refused, DNS, TLS, timeout, 5xx
DISK_FULL = "disk_full"  # the node's cache has no room even after eviction
BAD_IMAGE = "bad_image"  # an image the cache refuses to unpack (a path escaping its layer, an unknown media type, …)
TOOL_MISSING = "tool_missing"  # skopeo (or another tool) is not installed on the node
UNSUPPORTED = "unsupported"  # the backend cannot run images here (Slurm without pyxis): the user's to choose
REGISTRY_FAULTS = frozenset({UNAUTHORIZED, UNREACHABLE, DISK_FULL, TOOL_MISSING})


class ImagePullError(Exception):
    """A pull (or digest resolution) that failed; `str()` is one line naming the image and why."""

    def __init__(self, kind: str, image: str, message: str) -> None:
        super().__init__(f"{image}: {message}")
        self.kind = kind
        self.image = image

    @property
    def registry_fault(self) -> bool:
        return self.kind in REGISTRY_FAULTS


@dataclass(frozen=True)
class ImageConfig:
    """What an image's OCI config says about running it (`config.Env`, `Entrypoint`, `Cmd`, `WorkingDir`, `User`)."""

    env: tuple[str, ...] = ()
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    workdir: str = ""
    user: str = ""


@dataclass(frozen=True)
class CachedImage:
    """An image unpacked in a node's cache, ready to run: `layers` are the unpacked layer
    directories, lowest first (an overlay's lowerdirs, reversed); a runner holds a shared flock on
    `lock_path` while a container of it runs, and eviction skips an entry it cannot lock."""

    digest: str  # the manifest's, sha256:…
    name: str  # registry/repository it was pulled as (for `yard image ls`)
    layers: tuple[str, ...]
    config: ImageConfig
    lock_path: str
    size_bytes: int


@dataclass(frozen=True)
class EntryInfo:
    """One line of `yard image ls`: an image in a node's cache."""

    node: str
    name: str
    digest: str
    size_bytes: int
    last_used: float  # epoch seconds
    in_use: bool
