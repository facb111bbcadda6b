"""/api/v1/images: the nodes' image caches — pull (pre-stage), list, remove (`yard image`).
A pull may take minutes: it runs outside the plane's lock (services/units.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query

from trainyard.api.deps import plane, principal, storable_input
from trainyard.services import units
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/images", tags=["images"], dependencies=[Depends(storable_input)])


@router.post("/pull")
def pull(image: str = Body(..., embed=True, min_length=1, max_length=1000),
         nodes: str | None = Body(None, embed=True, max_length=10_000),
         by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Resolve the image's digest once and cache it on the nodes (all, or the hostlist `nodes`)."""
    return units.pull_image(cp, by, image, nodes)


@router.get("")
def list_images(node: str | None = Query(None, max_length=10_000), by: Principal = Depends(principal),
                cp: Plane = Depends(plane)) -> dict[str, Any]:
    return units.image_entries(cp, by, node)


@router.post("/remove")
def remove(image: str = Body(..., embed=True, min_length=1, max_length=1000),
           nodes: str | None = Body(None, embed=True, max_length=10_000),
           by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Remove an image (or a digest) from the caches where no running job uses it."""
    return units.remove_image(cp, by, image, nodes)
