"""/api/v1/datasets: the dataset catalogue (`services/datasets.py`) — list, show, add, grant and
revoke (`yard dataset ...`). Adding probes and hashes the source, which may take minutes: outside
the plane's lock. A node's cache (`/api/v1/datasets/cache`, `/stage`) is another router's."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Path, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, reader, session, storable_input
from trainyard.services import datasets
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/datasets", tags=["datasets"], dependencies=[Depends(storable_input)])
NAME = Path(..., min_length=1, max_length=63)


@router.get("")
def list_datasets(name: str | None = Query(None, max_length=63), by: Principal = Depends(reader),
                  cp: Plane = Depends(plane), s: Session = Depends(session)) -> dict[str, Any]:
    """The versions the caller may see (its team's and those granted to it; admins and operators all)."""
    return datasets.listing(s, cp.configs.current(s).spec, by, name)


@router.post("", status_code=201)
def add_dataset(body: datasets.DatasetAdd, by: Principal = Depends(principal),
                cp: Plane = Depends(plane)) -> dict[str, Any]:
    """A new version: the source probed and hashed (a path as the adding member), then recorded."""
    return datasets.add(cp, by, body)


@router.get("/{name}/versions")
def show_dataset(name: str = NAME, version: str | None = Query(None, max_length=64), by: Principal = Depends(reader),
                 cp: Plane = Depends(plane), s: Session = Depends(session)) -> dict[str, Any]:
    """A dataset's versions (or one), if the caller may see it."""
    return datasets.show(s, cp.configs.current(s).spec, by, name if version is None else f"{name}:{version}")


@router.post("/{name}/grants")
def grant(name: str = NAME, team: str = Body(..., embed=True, min_length=1, max_length=100),
          by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Let `team`'s jobs use every added version of the dataset (its team's members or an admin)."""
    return datasets.grant(cp, by, name, team)


@router.delete("/{name}/grants/{team}")
def revoke(name: str = NAME, team: str = Path(..., min_length=1, max_length=100),
           by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    return datasets.grant(cp, by, name, team, revoke=True)
