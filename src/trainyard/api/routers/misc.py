"""The caller's identity, the event log, the health and readiness checks and the Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.orm import Session

from trainyard.api.deps import MAX_ID, plane, principal, reader, session, storable_input
from trainyard.services import events
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden
from trainyard.services.plane_facade import Plane

router = APIRouter(tags=["misc"], dependencies=[Depends(storable_input)])


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


@router.get("/healthz", responses={503: {"description": "a check failed: the body says which"}})
def healthz(cp: Plane = Depends(plane)) -> JSONResponse:
    """Is the plane doing its job (control/lifecycle/liveness.py): the loop's last pass recent, the store
    writable, free disk above the floor, every background thread alive. 200 when all pass, else
    503 with the same body. Needs no token (load balancers and watchdogs call it)."""
    ok, body = cp.health()
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/readyz", responses={503: {"description": "not ready: starting, store unreachable or stopping"}})
def readyz(cp: Plane = Depends(plane)) -> JSONResponse:
    """Whether to send traffic here: started (one loop pass done), the store answers, not shutting
    down (SIGTERM turns this off first). Needs no token."""
    ok, detail = cp.ready()
    return JSONResponse({"ready": ok, "detail": detail}, status_code=200 if ok else 503)


@router.get("/metrics", response_class=Response)
def metrics(request: Request, _: Principal = Depends(reader)) -> Response:
    """Prometheus exposition (text format 0.0.4). Needs a token like every read here: give
    Prometheus a viewer token (`authorization: {credentials_file: ...}` in its scrape config)."""
    return Response(generate_latest(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)
