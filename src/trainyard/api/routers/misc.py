"""Tokens, the caller's identity, the event log, the health check and the Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.orm import Session

from trainyard.api.deps import MAX_ID, plane, principal, reader, session, storable_input
from trainyard.control.plane import ControlPlane
from trainyard.services import auth, events
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, ServiceError

router = APIRouter(tags=["misc"], dependencies=[Depends(storable_input)])


@router.post("/api/v1/tokens", status_code=201)
def create_token(user: str = Body(..., embed=True, min_length=1, max_length=100),
                 role: str = Body(..., embed=True, max_length=20),
                 team: str | None = Body(None, embed=True, max_length=100),
                 by: Principal = Depends(principal), cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    """Create a token (admin only). It is shown once; only its hash is stored."""
    if role == "job" and by.is_admin:  # the loop makes one per started job; one made here is for no job and unaudited
        raise ServiceError("job tokens are made by the control plane for each running job; roles here are "
                           "admin, operator, member, viewer", field="role")
    with cp.lock, cp.store.session.begin() as s:
        known = {t.name for t in cp.configs.current(s).spec.teams}
        token = auth.create_token(s, user=user, role=role, team=team, by=by, known_teams=known)
    return {"token": token, "user": user, "role": role, "team": team}


@router.get("/api/v1/whoami")
def whoami(by: Principal = Depends(principal)) -> dict[str, Any]:
    return {"user": by.user, "role": by.role, "team": by.team, "job_id": by.job_id}


@router.get("/api/v1/events")
def list_events(job: int | None = Query(None, ge=0, le=MAX_ID), since: int = Query(0, ge=0, le=MAX_ID),
                limit: int = Query(1000, ge=1, le=10000), newest: bool = False,
                by: Principal = Depends(principal), s: Session = Depends(session)) -> dict[str, Any]:
    """The audit trail, oldest first; `since` (an event id) pages forward, `newest` gives the last `limit`."""
    if by.role == "job" and (job is None or job != by.job_id):
        raise Forbidden("a job token reads only its own job's events: give job=<its id>")
    return {"events": events.list_events(s, job_id=job, since_id=since, limit=limit, newest=newest)}


@router.get("/healthz")
def healthz(cp: ControlPlane = Depends(plane)) -> dict[str, Any]:
    st = cp.loop.stats
    return {"ok": True, "loop": {"steps": st.steps, "last_step_ms": round(st.last_step_ms, 1), "errors": st.errors,
                                 "last_error": st.last_error}}


@router.get("/metrics", response_class=Response)
def metrics(request: Request, _: Principal = Depends(reader)) -> Response:
    """Prometheus exposition (text format 0.0.4). Needs a token like every read here: give
    Prometheus a viewer token (`authorization: {credentials_file: ...}` in its scrape config)."""
    return Response(generate_latest(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)
