"""/api/v1/reservations: admin reservations (list for readers; create and delete for admins).
Each change is a new configuration version (`services/reservations.py`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, reader, session, storable_input
from trainyard.control.lifecycle.plane import ControlPlane
from trainyard.services import reservations
from trainyard.services.auth import Principal

router = APIRouter(prefix="/api/v1/reservations", tags=["reservations"], dependencies=[Depends(storable_input)])


@router.get("")
def list_reservations(by: Principal = Depends(reader), cp: ControlPlane = Depends(plane),
                      s: Session = Depends(session)) -> dict[str, Any]:
    return {"reservations": reservations.list_reservations(cp.configs.current(s), cp.clock())}


@router.post("", status_code=201)
def create_reservation(body: reservations.ReservationCreate, by: Principal = Depends(principal),
                       cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    with cp.lock, cp.store.session.begin() as s:
        version, name = reservations.create(s, cp.configs.current(s), body, by, cp.clock())
    cp.loop.wake()
    with cp.store.session() as s:
        got = next(r for r in reservations.list_reservations(cp.configs.current(s), cp.clock()) if r["name"] == name)
    return {**got, "config_version": version}


@router.delete("/{name}")
def delete_reservation(name: str = Path(..., max_length=100), by: Principal = Depends(principal),
                       cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    with cp.lock, cp.store.session.begin() as s:
        version = reservations.delete(s, cp.configs.current(s), name, by)
    cp.loop.wake()
    return {"name": name, "deleted": True, "config_version": version}
