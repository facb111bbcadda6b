"""`yard login` over HTTP: where the login socket is, one-time codes, and logging out.

    GET  /api/v1/login                 (no token) {socket: path or null, codes: true}
    POST /api/v1/login/codes           (no token) {user, team?} -> {code, poll, expires_in, ...}
    POST /api/v1/login/codes/poll      (no token) {poll} -> {state: pending} | {state: approved, token, ...} once
    POST /api/v1/login/codes/approve   {code, role?, team?}: the code's own user, or an admin (403 otherwise)
    POST /api/v1/logout                revoke the token this request carries

The codes and their rules: services/login_codes.py. On the plane's host the socket is the way
(control/lifecycle/login_socket.py): the kernel says who calls, no code needed.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Header, Request

from trainyard.api.deps import plane, principal, storable_input
from trainyard.services import units
from trainyard.services.auth import Principal
from trainyard.services.errors import Unauthorized
from trainyard.services.login_codes import LoginCodes
from trainyard.services.plane_facade import Plane

router = APIRouter(tags=["login"], dependencies=[Depends(storable_input)])


def _codes(request: Request) -> LoginCodes:
    return request.app.state.login_codes


@router.get("/api/v1/login")
def login_info(request: Request) -> dict[str, Any]:
    """How to log in here: the login socket's path on the plane's host (null: none), and codes."""
    return {"socket": getattr(request.app.state, "login_socket", None), "codes": True}


@router.post("/api/v1/login/codes", status_code=201)
def open_code(request: Request, user: str = Body(..., embed=True, min_length=1, max_length=100),
              team: str | None = Body(None, embed=True, min_length=1, max_length=100),
              cp: Plane = Depends(plane)) -> dict[str, Any]:
    """A one-time code for `user` to have approved; keep `poll` to collect the token. `user` may be
    the account name that the configuration's `users:` maps a token user to (`yard login --code`
    sends the local account's name): the code is then that token user's."""
    source = request.client.host if request.client else ""
    return _codes(request).new(units.code_user(cp, user), team, source=source)


@router.post("/api/v1/login/codes/poll")
def poll_code(request: Request, poll: str = Body(..., embed=True, min_length=1, max_length=200)) -> dict[str, Any]:
    """Pending, or the token (once) when approved; 404 when unknown, expired or collected."""
    return _codes(request).poll(poll)


@router.post("/api/v1/login/codes/approve")
def approve_code(request: Request, code: str = Body(..., embed=True, min_length=1, max_length=20),
                 role: str | None = Body(None, embed=True, max_length=20),
                 team: str | None = Body(None, embed=True, min_length=1, max_length=100),
                 by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Approve a code: by its own user (hands on their role and team) or an admin (403 for anyone else)."""
    return _codes(request).approve(code, by, units.token_issuer(cp), role=role, team=team)


@router.post("/api/v1/logout")
def logout(authorization: str | None = Header(None), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Revoke the token of this request (`yard logout`), effective at the next request."""
    scheme, _, value = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        raise Unauthorized("no token: send 'Authorization: Bearer <token>'")
    return units.log_out(cp, value.strip())
