"""/api/v1/datasets/cache and /api/v1/datasets/stage: the nodes' dataset caches — what each holds
(`yard dataset ls --node`) and a pre-staging without a job (`yard dataset stage`). A staging may
take minutes: it runs outside the plane's lock (services/dataset_nodes.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query

from trainyard.api.deps import plane, principal, storable_input
from trainyard.services import dataset_nodes
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/datasets", tags=["datasets"], dependencies=[Depends(storable_input)])


@router.get("/cache")
def cache(node: str | None = Query(None, max_length=10_000), by: Principal = Depends(principal),
          cp: Plane = Depends(plane)) -> dict[str, Any]:
    """The entries of the caches of `node` (a node or a hostlist; `all` or none: every node)."""
    return dataset_nodes.cache_entries(cp, by, node)


@router.post("/stage")
def stage(dataset: str = Body(..., embed=True, min_length=1, max_length=200),
          nodes: str | None = Body(None, embed=True, max_length=10_000),
          by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Stage NAME[:VERSION] on the nodes (all, or the hostlist `nodes`), as a job's start would."""
    return dataset_nodes.stage(cp, by, dataset, nodes)
