"""Tokens: create one (shown once), list them (never the secret), revoke them. Admin only.

    POST   /api/v1/tokens            {user, role, team?}  -> the token, once
    GET    /api/v1/tokens            ?user=&revoked=false&jobs=false -> {tokens: [...]}
    DELETE /api/v1/tokens/{id}       revoke one token
    POST   /api/v1/tokens/revoke     {user}: revoke every personal token of a user

A revocation is effective at the next request, the token cache included (services/tokens.py).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Path, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import MAX_ID, plane, principal, session, storable_input
from trainyard.services import tokens, units
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(tags=["tokens"], dependencies=[Depends(storable_input)])


@router.post("/api/v1/tokens", status_code=201)
def create_token(user: str = Body(..., embed=True, min_length=1, max_length=100),
                 role: str = Body(..., embed=True, max_length=20),
                 team: str | None = Body(None, embed=True, max_length=100),
                 by: Principal = Depends(principal), cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Create a token (admin only). It is shown once; only its hash is stored."""
    return units.create_token(cp, by, user, role, team)


@router.get("/api/v1/tokens")
def list_tokens(user: str | None = Query(None, min_length=1, max_length=100),
                revoked: bool = Query(False, description="also list revoked tokens"),
                jobs: bool = Query(False, description="also list the job tokens of running attempts"),
                by: Principal = Depends(principal), s: Session = Depends(session)) -> dict[str, Any]:
    """Who holds a token: id, user, role, team, created (when, by whom), last used. Never the secret."""
    return {"tokens": tokens.list_tokens(s, by, user=user, include_revoked=revoked, include_jobs=jobs)}


@router.delete("/api/v1/tokens/{token_id}")
def revoke_token(token_id: int = Path(..., ge=1, le=MAX_ID), by: Principal = Depends(principal),
                 cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Revoke one token by its id (`yard token list` shows ids)."""
    return units.revoke_tokens(cp, by, token_id=token_id)


@router.post("/api/v1/tokens/revoke")
def revoke_user(user: str = Body(..., embed=True, min_length=1, max_length=100), by: Principal = Depends(principal),
                cp: Plane = Depends(plane)) -> dict[str, Any]:
    """Revoke every personal token of `user`; their running jobs keep their job tokens until they end."""
    return units.revoke_tokens(cp, by, user=user)

