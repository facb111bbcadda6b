"""/api/v1/nodes: list, get, drain, resume."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, reader, session, storable_input
from trainyard.services import nodes, units
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/nodes", tags=["nodes"], dependencies=[Depends(storable_input)])


@router.get("")
def list_nodes(by: Principal = Depends(reader), cp: Plane = Depends(plane),
               s: Session = Depends(session)) -> dict[str, Any]:
    return {"nodes": nodes.list_nodes(s, cp.configs.current(s), containment=cp.containment)}


@router.get("/{name}")
def get_node(name: str, by: Principal = Depends(reader), cp: Plane = Depends(plane),
             s: Session = Depends(session)) -> dict[str, Any]:
    return nodes.get_node(s, cp.configs.current(s), name)


@router.post("/{name}/drain")
def drain(name: str, reason: str = Body("", embed=True, max_length=200), by: Principal = Depends(principal),
          cp: Plane = Depends(plane)) -> dict[str, Any]:
    """No new work lands on the node; what runs there runs on."""
    return units.set_node_state(cp, name, "drain", reason, by)


@router.post("/{name}/resume")
def resume(name: str, by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    return units.set_node_state(cp, name, "up", "", by)
