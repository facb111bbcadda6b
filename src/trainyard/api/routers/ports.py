"""/api/v1/jobs/{id}/port/{port}: `yard port-forward` (issue 38), a WebSocket carrying one TCP
connection to `port` on the loopback of a running job's rank.

The query is `rank` or `node` (neither: rank 0); the caller's token comes in the handshake's
Authorization header, as on every other route. Checked in `services/ports.py`, carried by
`api/port_pump.py`."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from trainyard.api import port_pump

router = APIRouter(tags=["jobs"])


@router.websocket("/api/v1/jobs/{job_id}/port/{port}")
async def job_port(ws: WebSocket, job_id: str, port: str) -> None:
    """A connection to a port in a running job's rank, for its owner and admins (403 before anything connects)."""
    await port_pump.serve(ws, job_id, port)
