"""Taking tokens back: listing who holds one, and revoking them (admin only; a person lists and
revokes their own: `yard token list`, `yard logout`).

A token is listed by its id, never by its secret (the store keeps only the hash). Revoking is
effective at the next request: the caller commits, then calls `auth.forget_cached_tokens`, so
the API's 30 s token cache cannot answer for a revoked token (see auth.py's cache comment).

What a revocation by user covers: that user's own tokens (admin, operator, member, viewer). The
job tokens of the user's running jobs are not theirs to lose: each belongs to one attempt and is
revoked when that attempt ends (`transitions.end_attempt`), so a running job can still report
progress and checkpoints until it ends, and nothing new can be started with a revoked token.

The last admin token that still works cannot be revoked (nobody could create another): create a
new admin token first.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainyard.services.auth import Principal, hash_token
from trainyard.services.errors import Conflict, Forbidden, NotFound, ServiceError
from trainyard.services.events import record
from trainyard.store.models import TokenRow


def _admin_only(by: Principal, what: str) -> None:
    if not by.is_admin:
        raise Forbidden(f"only an admin can {what} tokens")


def token_view(row: TokenRow) -> dict[str, Any]:
    """What a listing shows of a token: who, role, team, when made and last used; no secret."""
    return {"id": row.id, "user": row.user, "role": row.role, "team": row.team, "job_id": row.job_id,
            "created_at": row.created_at, "created_by": row.created_by, "last_used_at": row.last_used_at,
            "revoked": bool(row.revoked)}


def list_tokens(s: Session, by: Principal, *, user: str | None = None, include_revoked: bool = False,
                include_jobs: bool = False) -> list[dict[str, Any]]:
    """Tokens, oldest first. Job tokens (one per running attempt) and revoked ones only on request.
    A caller who is not an admin lists their own personal tokens only (`yard token list`)."""
    if by.role == "job":
        raise Forbidden("a job token lists no tokens")
    if not by.is_admin:
        if user is not None and user != by.user:
            raise Forbidden(f"only an admin lists other users' tokens; yours are {by.user!r}'s", field="user")
        user, include_jobs = by.user, False
    q = select(TokenRow).order_by(TokenRow.id)
    if user is not None:
        q = q.where(TokenRow.user == user)
    if not include_revoked:
        q = q.where(TokenRow.revoked.is_(False))
    if not include_jobs:
        q = q.where(TokenRow.role != "job")
    return [token_view(r) for r in s.scalars(q)]


def revoke(s: Session, by: Principal, *, token_id: int | None = None, user: str | None = None) -> list[dict[str, Any]]:
    """Revoke one token (`token_id`) or every personal token of `user`; returns what was revoked.

    Already revoked tokens are left as they are (revoking twice is not an error). Call
    `auth.forget_cached_tokens()` after the commit.

    Raises:
        Forbidden: not an admin.
        ServiceError: neither or both of token_id and user given; a job token named by id.
        NotFound: no token with that id, or the user holds no token.
        Conflict: it would revoke the last admin token that still works.
    """
    _admin_only(by, "revoke")
    if (token_id is None) == (user is None):
        raise ServiceError("give a token id or a user, not both", field="id" if token_id is None else "user")
    if token_id is not None:
        row = s.get(TokenRow, token_id)
        if row is None:
            raise NotFound(f"no token with id {token_id}")
        if row.role == "job":
            raise ServiceError(f"token {token_id} is job {row.job_id}'s: it is revoked when the job's attempt ends; "
                               "cancel the job instead", field="id")
        rows = [row]
    else:
        rows = list(s.scalars(select(TokenRow).where(TokenRow.user == user, TokenRow.role != "job")
                              .order_by(TokenRow.id)))
        if not rows:
            raise NotFound(f"user {user!r} holds no token", field="user")
    live = [r for r in rows if not r.revoked]
    admins_left = s.execute(select(func.count(TokenRow.id))
                            .where(TokenRow.role == "admin", TokenRow.revoked.is_(False))).scalar_one()
    if any(r.role == "admin" for r in live) and admins_left - sum(r.role == "admin" for r in live) < 1:
        raise Conflict("that would revoke the last admin token that still works; create another admin token first")
    for r in live:
        r.revoked = True
        record(s, by.user, "token.revoked", f"token {r.id} of {r.user} ({r.role}{', team ' + r.team if r.team else ''})",
               data={"id": r.id, "user": r.user, "role": r.role, "team": r.team, "before": {"revoked": False},
                     "after": {"revoked": True}})
    return [token_view(r) for r in live]


def revoke_own(s: Session, token: str) -> dict[str, Any]:
    """Revoke the token the caller authenticated with (`yard logout`); returns what was revoked.
    Call `auth.forget_cached_tokens()` after the commit.

    Raises:
        ServiceError: a job token (it ends with its attempt).
        Conflict: it is the last admin token that still works.
    """
    row = s.scalars(select(TokenRow).where(TokenRow.token_hash == hash_token(token))).first()
    if row is None or row.revoked:
        raise NotFound("unknown or revoked token")
    if row.role == "job":
        raise ServiceError("a job token is revoked when its attempt ends", field="token")
    if row.role == "admin":
        admins_left = s.execute(select(func.count(TokenRow.id)).where(TokenRow.role == "admin",
                                                                      TokenRow.revoked.is_(False))).scalar_one()
        if admins_left <= 1:
            raise Conflict("that would revoke the last admin token that still works; create another admin token first")
    row.revoked = True
    record(s, row.user, "token.revoked", f"token {row.id} of {row.user} ({row.role}"
           f"{', team ' + row.team if row.team else ''}), by its holder (logout)",
           data={"id": row.id, "user": row.user, "role": row.role, "team": row.team, "before": {"revoked": False},
                 "after": {"revoked": True}})
    return token_view(row)
