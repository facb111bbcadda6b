"""/api/v1/jobs/{id}/terminal: `yard shell` (issue 38), a WebSocket carrying a pseudo-terminal.

The query is `rank` or `node`, `cmd` (repeated: the argv; none: the owner's shell), `rows`, `cols`; the
caller's token comes in the handshake's Authorization header, as on every other route. Checked in
`services/terminals.py`, carried by `api/terminal.py`."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from trainyard.api import terminal

router = APIRouter(tags=["jobs"])


@router.websocket("/api/v1/jobs/{job_id}/terminal")
async def job_terminal(ws: WebSocket, job_id: str) -> None:
    """A terminal in a running job's rank, for its owner and admins (403 before anything starts)."""
    await terminal.serve(ws, job_id)
