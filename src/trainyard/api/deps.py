"""What every route needs: the control plane, a session, the caller (from the bearer token)."""

from __future__ import annotations

from typing import Iterator

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from trainyard.control.plane import ControlPlane
from trainyard.services.auth import Principal, authenticate
from trainyard.services.errors import Forbidden


def plane(request: Request) -> ControlPlane:
    return request.app.state.plane


def session(cp: ControlPlane = Depends(plane)) -> Iterator[Session]:
    with cp.store.session() as s:
        yield s


def principal(authorization: str | None = Header(None, description="Bearer <token>"),
              s: Session = Depends(session)) -> Principal:
    token = None
    if authorization:
        scheme, _, value = authorization.partition(" ")
        token = value.strip() if scheme.lower() == "bearer" else None
    return authenticate(s, token)


def reader(by: Principal = Depends(principal)) -> Principal:
    """The caller of a cluster-wide read (queue-wide events, nodes, teams, configuration): anyone but
    a job token, which reads its own job only (see `services/auth.py`)."""
    if by.role == "job":
        raise Forbidden("a job token reads only its own job")
    return by
