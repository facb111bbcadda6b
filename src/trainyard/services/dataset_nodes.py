"""Datasets on the nodes (issue 41, Deliver 2): what the store knows of each node's cache, how the
and who may pre-stage a dataset (the catalogue, the sources' access and a job's pins are
`services/datasets.py`'s).

- `record_entries`: a node's `node_datasets` rows made to match its cache (`Backend.dataset_entries`,
  the truth), after each staging: an entry the node evicted loses its row;
- `held_bytes`: node → bytes of a job's datasets it holds (the schedule step's tie-break);
- `listing`: `GET /api/v1/datasets/cache` (`yard dataset ls --node`);
- `stage`: `yard dataset stage NAME[:VERSION]` — an admin's any version, anyone else's as a job of
  their team would pin it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from trainyard.contracts import expand_hostlist
from trainyard.services import datasets, events, image_admin
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, NotFound, ServiceError
from trainyard.services.plane_facade import Plane
from trainyard.spec.models import ConfigSpec
from trainyard.staging.types import DatasetEntry, DatasetRef
from trainyard.states import PENDING_STATES, JobState
from trainyard.store.models import DatasetRow, JobRow, NodeDatasetRow

IN_USE_STATES = (JobState.CONFIGURING, JobState.RUNNING, JobState.COMPLETING)


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


# -- the API's calls (`api/routers/dataset_nodes.py`): no lock held while the nodes copy ------------

def stage(plane: Plane, by: Principal, dataset: str, node_list: str | None) -> dict[str, Any]:
    """`POST /api/v1/datasets/stage`: `dataset` (NAME[:VERSION]) staged on the nodes (all, or the
    hostlist `node_list`) by an admin or a member of a team that may use it; one audit event."""
    if by.role not in ("admin", "member"):
        raise Forbidden(f"an admin or a member of a team that may use the dataset pre-stages it (a {by.role} token)")
    with plane.store.session() as s:
        cfg = plane.configs.current(s)
        ref = _stageable(s, cfg.spec, by, dataset)
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


def _stageable(s: Session, spec: ConfigSpec, by: Principal, asked: str) -> DatasetRef:
    """The version `asked` (NAME[:VERSION]) names for `by`: an admin's any version of the catalogue
    (no version: the newest), anyone else's as a job of their team would pin it.

    Raises:
        Unprocessable: malformed or unknown (field `dataset`). Forbidden: not usable by `by`'s team.
    """
    if by.role != "admin":
        return datasets.resolve(s, spec, asked, by.team or "", "dataset").ref()
    name, version = datasets.parse_ask(asked, "dataset")
    found = [e for e in datasets.catalogue(s, spec, name) if version in (None, e.version)]
    if not found:
        raise NotFound(f"dataset: no dataset {asked!r} in the catalogue (yard dataset ls)", field="dataset")
    return found[0].ref()


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
