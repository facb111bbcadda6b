"""/api/v1/reservations: admin reservations (list for readers; create and delete for admins).
Each change is a new configuration version (`services/reservations.py`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Path
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, reader, session, storable_input
from trainyard.services import reservations, units
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1/reservations", tags=["reservations"], dependencies=[Depends(storable_input)])


@router.get("")
def list_reservations(by: Principal = Depends(reader), cp: Plane = Depends(plane),
                      s: Session = Depends(session)) -> dict[str, Any]:
    return {"reservations": reservations.list_reservations(cp.configs.current(s), cp.clock())}


@router.post("", status_code=201)
def create_reservation(body: reservations.ReservationCreate, by: Principal = Depends(principal),
                       cp: Plane = Depends(plane)) -> dict[str, Any]:
    return units.create_reservation(cp, body, by)


@router.delete("/{name}")
def delete_reservation(name: str = Path(..., max_length=100), by: Principal = Depends(principal),
                       cp: Plane = Depends(plane)) -> dict[str, Any]:
    return units.delete_reservation(cp, name, by)
