"""/api/v1/cluster/config/what-if and /api/v1/cluster/trace: a proposed configuration replayed on
the cluster's own history, and that history as a trace (`services/whatif.py`; admin only).

Times (`since`, `until`) are UNIX seconds or text the server reads in its own time zone
(`spec.parsing.parse_time`: now-14days, 2026-11-01T08:00, today…); the CLI sends seconds.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query
from pydantic import Field

from trainyard.api.deps import plane, principal, storable_input
from trainyard.api.queries import TIME
from trainyard.services import whatif
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

SINCE = f"from ({TIME}); default now-14days"
UNTIL = f"to ({TIME}); default now"
router = APIRouter(prefix="/api/v1/cluster", tags=["cluster"], dependencies=[Depends(storable_input)])


@router.post("/config/what-if")
def what_if(text: str = Body(..., embed=True, max_length=1_000_000),
            since: float | Annotated[str, Field(max_length=100)] | None = Body(None, embed=True, description=SINCE),
            until: float | Annotated[str, Field(max_length=100)] | None = Body(None, embed=True, description=UNTIL),
            by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Replay the jobs submitted in the window through the configuration in force and through
    `text`, validated as an apply would validate it; nothing is stored."""
    return whatif.what_if(cp, by, text, since, until)


@router.get("/trace")
def trace(since: str | None = Query(None, max_length=100, description=SINCE),
          until: str | None = Query(None, max_length=100, description=UNTIL),
          by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """The jobs submitted in the window as the simulator's trainyard trace (`yard trace export`)."""
    return whatif.export(cp, by, since, until)
