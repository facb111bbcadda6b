"""Datasets on the nodes (issue 41, Deliver 2): what the store knows of each node's cache, how the
plane reaches the sources, and who may pre-stage a dataset.

- `source_access`: the configuration's object stores (their credentials read now, as the image
  registries' are) and each node cache's cap, as `staging.types.SourceAccess`;
- `ref_of` / `record_of`: a job's pinned dataset (`jobs.datasets`) ⇄ `staging.types.DatasetRef`;
- `record_entries`: a node's `node_datasets` rows made to match its cache (`Backend.dataset_entries`,
  the truth), after each staging: an entry the node evicted loses its row;
- `held_bytes`: node → bytes of a job's datasets it holds (the schedule step's tie-break);
- `listing`: `GET /api/v1/datasets/cache` (`yard dataset ls --node`);
- `resolve` and `may_stage`: `yard dataset stage NAME[:VERSION]` — the configuration's catalogue
  and the `datasets` table, read directly until the catalogue's resolver (`services/datasets.py`)
  takes over.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from trainyard.contracts import expand_hostlist
from trainyard.services import events, image_admin
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, NotFound, ServiceError
from trainyard.services.plane_facade import Plane
from trainyard.spec.models import ConfigSpec
from trainyard.staging.types import NAME_RE, VERSION_RE, DatasetEntry, DatasetRef, ObjectStore, Reader, SourceAccess
from trainyard.states import PENDING_STATES, JobState
from trainyard.store.models import DatasetRow, JobRow, NodeDatasetRow

MAX_CREDENTIALS_BYTES = 64 << 10
IN_USE_STATES = (JobState.CONFIGURING, JobState.RUNNING, JobState.COMPLETING)


def read_credentials(path: str, where: str) -> tuple[str, str]:
    """An object store's `credentials_file`: two lines, the access key id and the secret; a
    regular file that only the plane's account reads, opened through no link.

    Raises:
        ServiceError: field `where`; the message says what is wrong with the file.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # plane's own: a secret
    except OSError as e:
        raise ServiceError(f"{where}: {path}: {(e.strerror or str(e)).lower()}", field=where) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or st.st_uid != os.geteuid():
            raise ServiceError(f"{where}: {path} must be a regular file only the control plane's account reads "
                               "(chown it to the plane and chmod 600)", field=where)
        data = os.read(fd, MAX_CREDENTIALS_BYTES + 1)
    finally:
        os.close(fd)
    lines = [x.strip() for x in data.decode(errors="replace").splitlines() if x.strip()]
    if len(data) > MAX_CREDENTIALS_BYTES or len(lines) < 2:
        raise ServiceError(f"{where}: {path} should hold two lines: the access key id, then the secret", field=where)
    return lines[0], lines[1]


def source_access(spec: ConfigSpec) -> SourceAccess:
    """How the plane reads dataset sources under `spec` (credentials read now)."""
    stores = []
    for i, o in enumerate(spec.storage.object_stores):
        key = secret = None
        if o.credentials_file:
            key, secret = read_credentials(o.credentials_file, f"storage.object_stores.{i}.credentials_file")
        stores.append(ObjectStore(url=o.url, endpoint_url=o.endpoint_url, region=o.region, key=key, secret=secret,
                                  teams=frozenset(o.teams) if o.teams is not None else None))
    return SourceAccess(stores=tuple(stores), cache_max_bytes=spec.storage.dataset_cache.max_bytes)


def ref_of(record: Mapping[str, Any]) -> DatasetRef:
    """A job's pinned dataset (one item of `jobs.datasets`) as the backends take it."""
    r = record.get("reader")
    reader = Reader(int(r["uid"]), int(r["gid"]), tuple(int(g) for g in r.get("groups") or ())) if r else None
    return DatasetRef(name=str(record["name"]), version=str(record["version"]), source=str(record["source"]),
                      checksum=str(record["checksum"]), bytes=int(record.get("bytes") or 0), reader=reader)


def record_of(ref: DatasetRef) -> dict[str, Any]:
    """`ref` as `jobs.datasets` stores it."""
    reader = None if ref.reader is None else \
        {"uid": ref.reader.uid, "gid": ref.reader.gid, "groups": list(ref.reader.groups)}
    return {"name": ref.name, "version": ref.version, "source": ref.source, "checksum": ref.checksum,
            "bytes": ref.bytes, "reader": reader}


def record_entries(s: Session, node: str, entries: Sequence[DatasetEntry], now: float) -> list[str]:
    """Make `node`'s rows what its cache holds (`entries`); the checksums whose rows went (evicted
    or removed on the node)."""
    rows = {r.checksum: r for r in s.scalars(select(NodeDatasetRow).where(NodeDatasetRow.node == node))}
    seen = {e.checksum for e in entries}
    gone = sorted(set(rows) - seen)
    if gone:
        s.execute(delete(NodeDatasetRow).where(NodeDatasetRow.node == node, NodeDatasetRow.checksum.in_(gone)))
    for e in entries:
        row = rows.get(e.checksum)
        if row is None:
            s.add(NodeDatasetRow(node=node, checksum=e.checksum, name=e.name, version=e.version, bytes=e.bytes,
                                 staged_at=now, last_used_at=e.last_used))
        else:
            row.bytes, row.last_used_at = e.bytes, e.last_used
    return gone


def held_bytes(s: Session, checksums: Iterable[str]) -> dict[str, dict[str, int]]:
    """checksum → node → bytes, for the nodes holding any of `checksums`."""
    wanted = sorted(set(checksums))
    out: dict[str, dict[str, int]] = {}
    if not wanted:
        return out
    for r in s.scalars(select(NodeDatasetRow).where(NodeDatasetRow.checksum.in_(wanted))):
        out.setdefault(r.checksum, {})[r.node] = int(r.bytes)
    return out


def data_on(s: Session) -> dict[int, tuple[tuple[str, int], ...]]:
    """Each waiting job with datasets: (node, bytes of its datasets the node holds), for the nodes
    holding any (the schedule step's tie-break, `JobRequest.data_on`)."""
    jobs = [(j_id, ds) for j_id, ds in s.execute(select(JobRow.id, JobRow.datasets).where(
        JobRow.state.in_(PENDING_STATES), JobRow.datasets.is_not(None))) if ds]
    if not jobs:
        return {}
    held = held_bytes(s, (str(d.get("checksum")) for _, ds in jobs for d in ds))
    out: dict[int, tuple[tuple[str, int], ...]] = {}
    for j_id, ds in jobs:
        per: dict[str, int] = {}
        for checksum in {str(d.get("checksum")) for d in ds}:
            for node, size in held.get(checksum, {}).items():
                per[node] = per.get(node, 0) + size
        if per:
            out[int(j_id)] = tuple(sorted(per.items()))
    return out


def listing(s: Session, nodes: list[str] | None) -> list[dict[str, Any]]:
    """The cache entries of `nodes` (None: every node), as the plane last saw them; `in_use`: a job
    placed on that node that pins the entry is under way."""
    q = select(NodeDatasetRow).order_by(NodeDatasetRow.node, NodeDatasetRow.name, NodeDatasetRow.version)
    if nodes is not None:
        q = q.where(NodeDatasetRow.node.in_(nodes))
    used: set[tuple[str, str]] = set()
    for j in s.scalars(select(JobRow).where(JobRow.state.in_(IN_USE_STATES), JobRow.datasets.is_not(None))):
        for p in j.placement or ():
            used.update((str(p.get("node")), str(d.get("checksum"))) for d in j.datasets or ())
    return [{"node": r.node, "name": r.name, "version": r.version, "checksum": r.checksum, "bytes": int(r.bytes),
             "last_used": r.last_used_at, "in_use": (r.node, r.checksum) in used}
            for r in s.scalars(q)]


def parse_label(text: str, where: str = "dataset") -> tuple[str, str | None]:
    """`NAME[:VERSION]`.

    Raises:
        ServiceError: field `where`, a malformed name or version.
    """
    name, sep, version = text.partition(":")
    if not NAME_RE.fullmatch(name):
        raise ServiceError(f"{where}: {name!r} is not a dataset name (lower-case letters, digits, - and _)",
                           field=where)
    if sep and not VERSION_RE.fullmatch(version):
        raise ServiceError(f"{where}: {version!r} is not a dataset version", field=where)
    return name, version if sep else None


def resolve(s: Session, spec: ConfigSpec, name: str, version: str | None) -> tuple[DatasetRef, str, list[str]]:
    """The dataset `name:version` (None: its newest) of the configuration's catalogue or the
    `datasets` table: (its ref, its team, the teams granted it).

    Raises:
        NotFound: no such dataset or version (field `dataset`).
    """
    found: list[tuple[float, DatasetRef, str, list[str]]] = []
    for i, d in enumerate(spec.datasets):
        if d.name == name and version in (None, d.version):
            found.append((float(i) - 1e12, DatasetRef(d.name, d.version, d.source, d.checksum, 0), d.team,
                          list(d.grants)))
    q = select(DatasetRow).where(DatasetRow.name == name)
    if version is not None:
        q = q.where(DatasetRow.version == version)
    for r in s.scalars(q):
        ref = ref_of({"name": r.name, "version": r.version, "source": r.source, "checksum": r.checksum,
                      "bytes": r.bytes, "reader": r.reader})
        found.append((r.added_at, ref, r.team, list(r.grants or ())))
    if not found:
        label = f"{name}:{version}" if version else name
        raise NotFound(f"dataset: no dataset {label!r} in the catalogue", field="dataset")
    _, ref, team, grants = max(found, key=lambda x: x[0])
    return ref, team, grants


def may_stage(role: str, teams: Iterable[str], team: str, grants: Iterable[str], label: str) -> None:
    """An admin, or a member of the dataset's team or of a team granted it, may pre-stage it.

    Raises:
        Forbidden: anyone else (field `dataset`).
    """
    if role == "admin":
        return
    allowed = {team, *grants}
    if not allowed & set(teams):
        raise Forbidden(f"dataset: {label} belongs to team {team!r} and is not granted to yours", field="dataset")


# -- the API's calls (`api/routers/dataset_nodes.py`): no lock held while the nodes copy ------------

def stage(plane: Plane, by: Principal, dataset: str, node_list: str | None) -> dict[str, Any]:
    """`POST /api/v1/datasets/stage`: `dataset` (NAME[:VERSION]) staged on the nodes (all, or the
    hostlist `node_list`) by an admin or a member of a team that may use it; one audit event."""
    if by.role not in ("admin", "member"):
        raise Forbidden(f"an admin or a member of a team that may use the dataset pre-stages it (a {by.role} token)")
    name, version = parse_label(dataset)
    with plane.store.session() as s:
        cfg = plane.configs.current(s)
        ref, team, grants = resolve(s, cfg.spec, name, version)
    may_stage(by.role, [by.team] if by.team else [], team, grants, ref.label)
    names = image_admin.node_names(cfg, node_list)
    out = plane.stage_dataset(ref, names)
    failed = [r["node"] for r in out["nodes"] if not r["ok"]]
    with plane.transaction() as s:
        events.record(s, by.user, "dataset.staged", f"{ref.label} staged on {len(names) - len(failed)} of "
                      f"{len(names)} nodes" + (f"; failed on {', '.join(failed)}" if failed else ""),
                      data={"dataset": ref.label, "checksum": ref.checksum, "nodes": out["nodes"]})
    return out


def cache_entries(plane: Plane, by: Principal, node: str | None) -> dict[str, Any]:
    """`GET /api/v1/datasets/cache?node=N|all`: what each node's cache holds, as the plane last saw
    it. Admins and operators see every entry; anyone else those of the datasets their team may use
    (an entry's checksum is where it lies on the node)."""
    if by.role == "job":
        raise Forbidden("a job's token does not list the nodes' dataset caches")
    with plane.store.session() as s:
        cfg = plane.configs.current(s)
        entries = listing(s, None if node in (None, "", "all") else _nodes(cfg.nodes, str(node)))
        if by.role not in ("admin", "operator"):
            mine = _usable(s, cfg.spec, by.team)
            entries = [e for e in entries if (e["name"], e["version"]) in mine]
        return {"entries": entries}


def _nodes(known: Iterable[Any], hostlist: str) -> list[str]:
    """The configured nodes the hostlist `hostlist` names (a node, or `node-[0-3]`).

    Raises:
        ServiceError: a malformed hostlist; NotFound: a node the configuration lacks (field `node`).
    """
    names = {n.name for n in known}
    try:
        asked = list(dict.fromkeys(expand_hostlist(hostlist.strip())))
    except ValueError as e:
        raise ServiceError(f"node: {e}", field="node") from None
    unknown = [n for n in asked if n not in names]
    if unknown or not asked:
        raise NotFound(f"node: no node {(unknown or [hostlist])[0]!r} in the configuration", field="node")
    return asked


def _usable(s: Session, spec: ConfigSpec, team: str | None) -> set[tuple[str, str]]:
    """(name, version) of the datasets `team` owns or was granted."""
    if team is None:
        return set()
    out = {(d.name, d.version) for d in spec.datasets if team == d.team or team in d.grants}
    for r in s.scalars(select(DatasetRow)):
        if team == r.team or team in (r.grants or ()):
            out.add((r.name, r.version))
    return out
