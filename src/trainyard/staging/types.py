"""What the parts agree on about datasets: the object-store access, a pinned dataset, a staged
copy, a node cache's entry, a staging failure.

Standard library only: the backends and the loop read these without fsspec.

A dataset is `name:version`; its `checksum` is `sha256:<hex>`. For a single file it is the sha256
of its bytes; for a directory, the sha256 of one line `<relative path>\\0<size>\\0<sha256 hex>\\n`
per regular file, sorted by path (`staging/checksum.py`). A job finds each of its datasets on
every node at `$TRAINYARD_DATASET_<NAME>` (`dataset_var`): the staged copy of the source itself,
a file for a file, a directory for a directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainyard.contracts import JobVar

DATA_STAGING = "DataStaging"  # the reason a CONFIGURING job shows while its nodes stage data
STAGING_ERROR = "DataStagingError"  # the cause of an attempt whose staging failed
VAR_PREFIX = JobVar.DATASET_PREFIX
CHECKSUM_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def dataset_var(name: str) -> str:
    """The job's variable for dataset `name`: TRAINYARD_DATASET_ and the name upper-cased, `-` as `_`."""
    return VAR_PREFIX + re.sub(r"[^A-Z0-9]", "_", name.upper())


@dataclass(frozen=True)
class ObjectStore:
    """One object store the plane reads (the configuration's `storage.object_stores[]`): URLs under
    `url` (`s3://bucket[/prefix]`) are read with these settings; the secret is the plane's, never
    the job's, and never shown. `teams`: the teams whose datasets may name it (None: every team)."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None
    key: str | None = None
    secret: str | None = field(default=None, repr=False)
    teams: frozenset[str] | None = None

    def covers(self, url: str) -> bool:
        base = self.url.rstrip("/")
        return url == base or url.startswith(base + "/")

    def fsspec_options(self) -> dict[str, object]:
        """The keyword arguments of `fsspec.filesystem("s3", ...)` (s3fs) for this store."""
        opts: dict[str, object] = {}
        if self.key is not None:
            opts.update(key=self.key, secret=self.secret)
        else:
            opts["anon"] = True
        client: dict[str, object] = {}
        if self.endpoint_url:
            client["endpoint_url"] = self.endpoint_url
        if self.region:
            client["region_name"] = self.region
        if client:
            opts["client_kwargs"] = client
        return opts


@dataclass(frozen=True)
class SourceAccess:
    """How the plane reaches dataset sources and archives: the object stores (longest prefix
    first wins), a time limit for one read, and each node cache's cap (carried with the access so
    that a change of configuration applies at the next staging; None: the backend's own)."""

    stores: tuple[ObjectStore, ...] = ()
    timeout_s: float = 600.0
    cache_max_bytes: int | None = None

    def store_for(self, url: str) -> ObjectStore | None:
        found = [s for s in self.stores if s.covers(url)]
        return max(found, key=lambda s: len(s.url)) if found else None


@dataclass(frozen=True)
class Reader:
    """Who a path source is read as: the Unix account of the member who added the dataset, so that
    the plane (root) never copies what that member could not read itself."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class DatasetRef:
    """A dataset version as a job pins it at submit: what to copy and what it must hash to."""

    name: str
    version: str
    source: str  # an absolute path (a shared file system) or an object-store URL (s3://…)
    checksum: str  # sha256:<hex>
    bytes: int
    reader: Reader | None = None  # for a path source; None: read as the plane (an operator's dataset)

    @property
    def label(self) -> str:
        return f"{self.name}:{self.version}"


@dataclass(frozen=True)
class StagedDataset:
    """A dataset ready on a node: `path` is what `$TRAINYARD_DATASET_<NAME>` names there."""

    node: str
    checksum: str
    path: str
    bytes: int
    copied: bool  # False: the node had it already (nothing was copied)
    seconds: float


@dataclass(frozen=True)
class DatasetEntry:
    """One line of `yard dataset ls --node`: a dataset in a node's cache."""

    node: str
    name: str
    version: str
    checksum: str
    bytes: int
    last_used: float  # epoch seconds
    in_use: bool


# Kinds of staging failure. `source_fault`: not the user's doing, so the job goes back to the queue
# after a pause, not counted against its retries (the source unreachable, the node's disk full).
CHECKSUM_MISMATCH = "checksum_mismatch"  # the source no longer hashes to the pinned checksum (the user's)
NOT_FOUND = "not_found"  # the source is gone (the user's)
FORBIDDEN = "forbidden"  # the dataset's owner cannot read it, or it is not a regular file/directory (the user's)
UNREACHABLE = "unreachable"  # connection refused, timeout, 5xx
DISK_FULL = "disk_full"  # the node's cache has no room even after eviction
UNSUPPORTED = "unsupported"  # the backend cannot stage here
SOURCE_FAULTS = frozenset({UNREACHABLE, DISK_FULL})


class DataStagingError(Exception):
    """A staging (or a source probe) that failed; `str()` is one line naming the dataset and why."""

    def __init__(self, kind: str, dataset: str, message: str) -> None:
        super().__init__(f"{dataset}: {message}")
        self.kind = kind
        self.dataset = dataset

    @property
    def source_fault(self) -> bool:
        return self.kind in SOURCE_FAULTS
