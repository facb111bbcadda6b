"""/api/v1/cluster/config: get, apply (a new version), versions, diff, rollback."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import MAX_ID, plane, principal, reader, session, storable_input
from trainyard.control.lifecycle.plane import ControlPlane
from trainyard.services import config, teams
from trainyard.services.auth import Principal
from trainyard.services.errors import Conflict, Forbidden
from trainyard.services.nodes import gpus_in_use
from trainyard.spec.models import parse_config

router = APIRouter(prefix="/api/v1/cluster/config", tags=["cluster"], dependencies=[Depends(storable_input)])


def _row(r) -> dict[str, Any]:  # noqa: ANN001
    return {"version": r.version, "text": r.text, "author": r.author, "created_at": r.created_at, "message": r.message}


@router.get("")
def get_config(version: int | None = Query(None, ge=1, le=MAX_ID), by: Principal = Depends(reader),
               s: Session = Depends(session)) -> dict[str, Any]:
    return _row(config.get_version(s, version))


def _apply(cp: ControlPlane, by: Principal, fn) -> dict[str, Any]:  # noqa: ANN001
    if not by.is_admin:
        raise Forbidden("only an admin can change the cluster configuration")
    with cp.lock, cp.store.session.begin() as s:
        version = fn(s)
        spec = parse_config(config.get_version(s, version).text)
        new = {n.name for n in spec.cluster.expand()}
        busy = sorted(set(gpus_in_use(s)) - new)
        if busy:
            raise Conflict(f"nodes {busy} run jobs and cannot leave the configuration; drain them and wait")
    cp.loop.wake()
    with cp.store.session() as s:
        return {**_row(config.get_version(s, version)), "warnings": teams.overcommitted(spec)}


@router.post("")
def apply_config(text: str = Body(..., embed=True, max_length=1_000_000), message: str = Body("", embed=True, max_length=500),
                 by: Principal = Depends(principal), cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    """Validate a whole configuration (YAML) and make it the newest version."""
    return _apply(cp, by, lambda s: config.apply(s, text, by, message))


@router.get("/versions")
def versions(by: Principal = Depends(reader), s: Session = Depends(session)) -> dict[str, Any]:
    return {"versions": config.history(s)}


@router.get("/diff")
def diff(from_version: int = Query(..., alias="from", ge=1, le=MAX_ID),
         to_version: int = Query(..., alias="to", ge=1, le=MAX_ID),
         by: Principal = Depends(reader), s: Session = Depends(session)) -> dict[str, Any]:
    return {"from": from_version, "to": to_version, "diff": config.diff(s, from_version, to_version)}


@router.post("/rollback")
def rollback(version: int = Body(..., embed=True, ge=1, le=MAX_ID), by: Principal = Depends(principal),
             cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    """Apply an older version's text as the newest version (history is never rewritten)."""
    return _apply(cp, by, lambda s: config.rollback(s, version, by))
