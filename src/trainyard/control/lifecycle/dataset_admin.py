"""What `yard dataset stage NAME --nodes …` asks of the nodes' dataset caches (issue 41,
docs/control-plane.md, "Storage"): the backend's `stage_dataset` on every node at once, each on a
thread of its own (a cold copy takes minutes; a node's failure is that node's line in the answer),
then each node's `node_datasets` rows made to match its cache (`services/dataset_nodes.py`). None of
it holds the plane's lock while the nodes copy; the rows are written in one transaction after.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from trainyard.backends.base import Backend, BackendError
from trainyard.staging.types import DatasetEntry, DatasetRef, DataStagingError, SourceAccess

MAX_THREADS = 32


class DatasetAdmin:
    """Pre-staging on one backend; `access()` is the configuration's source access in force (its
    credentials read at each call); `record(node -> entries)` writes what the caches now hold."""

    def __init__(self, backend: Backend, access: Callable[[], SourceAccess],
                 record: Callable[[dict[str, list[DatasetEntry]]], None]) -> None:
        self.backend, self.access, self.record = backend, access, record

    def stage(self, ref: DatasetRef, nodes: list[str]) -> dict[str, Any]:
        """`ref` in each of `nodes`' caches: `{dataset, checksum, nodes: [{node, ok, copied, seconds,
        bytes, error, kind}]}`; pinned by no attempt (evictable as soon as it is staged)."""
        access = self.access()

        def one(node: str) -> dict[str, Any]:
            try:
                got = self.backend.stage_dataset(node, ref, access)
            except DataStagingError as e:
                return {"node": node, "ok": False, "copied": False, "seconds": None, "bytes": None, "error": str(e),
                        "kind": e.kind}
            except BackendError as e:
                return {"node": node, "ok": False, "copied": False, "seconds": None, "bytes": None, "error": str(e),
                        "kind": "backend"}
            return {"node": node, "ok": True, "copied": got.copied, "seconds": round(got.seconds, 3),
                    "bytes": got.bytes, "error": None, "kind": None}

        with ThreadPoolExecutor(max_workers=max(1, min(len(nodes), MAX_THREADS)),
                                thread_name_prefix="dataset-stage") as pool:
            results = list(pool.map(one, nodes))
        found: dict[str, list[DatasetEntry]] = {}
        for node in nodes:
            try:
                found[node] = self.backend.dataset_entries(node)
            except (BackendError, OSError):
                continue
        self.record(found)
        return {"dataset": ref.label, "checksum": ref.checksum, "nodes": results}
