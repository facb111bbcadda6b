"""/api/v1/nodes: list, get, drain, resume."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, reader, session, storable_input
from trainyard.control.lifecycle.plane import ControlPlane
from trainyard.services import nodes
from trainyard.services.auth import Principal

router = APIRouter(prefix="/api/v1/nodes", tags=["nodes"], dependencies=[Depends(storable_input)])


@router.get("")
def list_nodes(by: Principal = Depends(reader), cp: ControlPlane = Depends(plane),
               s: Session = Depends(session)) -> dict[str, Any]:
    return {"nodes": nodes.list_nodes(s, cp.configs.current(s), containment=getattr(cp.backend, "containment", cp.backend.name))}


@router.get("/{name}")
def get_node(name: str, by: Principal = Depends(reader), cp: ControlPlane = Depends(plane),
             s: Session = Depends(session)) -> dict[str, Any]:
    return nodes.get_node(s, cp.configs.current(s), name)


def _set(cp: ControlPlane, name: str, state: str, reason: str, by: Principal) -> dict[str, Any]:
    with cp.lock, cp.store.session.begin() as s:
        out = nodes.set_state(s, cp.configs.current(s), name, state, reason, by)
    cp.loop.wake()
    return out


@router.post("/{name}/drain")
def drain(name: str, reason: str = Body("", embed=True, max_length=200), by: Principal = Depends(principal),
          cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    """No new work lands on the node; what runs there runs on."""
    return _set(cp, name, "drain", reason, by)


@router.post("/{name}/resume")
def resume(name: str, by: Principal = Depends(principal), cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    return _set(cp, name, "up", "", by)
