"""Tokens and roles: who may do what.

Roles (fixed, as on-call practice needs them):
- `admin`: everything, including tokens and the cluster configuration;
- `operator` (on-call): read everything, read all logs, drain and resume nodes, cancel, hold,
  release and requeue any job; does not submit (jobs belong to teams) nor change configuration;
- `member` of a team: submit jobs for that team, manage that team's jobs and read their logs;
  sees the whole queue (as `squeue` does) but cannot touch or read the logs of other teams' jobs;
- `viewer`: read-only (queue, nodes, teams, configuration, events), no logs;
- `job`: the token a running job gets (`TRAINYARD_TOKEN`): reads its own job only.

A token is 32 random bytes, shown once; the store keeps its SHA-256 only, so a stolen database
does not give access.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from trainyard.services.errors import Forbidden, ServiceError, Unauthorized
from trainyard.services.events import record
from trainyard.store.models import TokenRow

ROLES = ("admin", "operator", "member", "viewer", "job")


@dataclass(frozen=True)
class Principal:
    user: str
    role: str
    team: str | None = None
    job_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"

    def can_read_all_logs(self) -> bool:
        return self.role in ("admin", "operator")

    def can_manage_team(self, team: str) -> bool:
        """Cancel, hold, release, requeue and read logs of a job of `team`."""
        return self.role in ("admin", "operator") or (self.role == "member" and self.team == team)

    def can_submit_for(self, team: str) -> bool:
        return self.role == "admin" or (self.role == "member" and self.team == team)


SYSTEM = Principal("scheduler", "admin")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(s: Session, *, user: str, role: str, team: str | None, by: Principal,
                 known_teams: set[str] | None = None, job_id: int | None = None) -> str:
    if not by.is_admin:
        raise Forbidden("only an admin can create tokens")
    if role not in ROLES:
        raise ServiceError(f"unknown role {role!r}; roles are {list(ROLES)}", field="role")
    if not user or not user.strip():
        raise ServiceError("user must not be empty", field="user")
    if role == "member" and not team:
        raise ServiceError("a member token needs a team", field="team")
    if team is not None and known_teams is not None and team not in known_teams:
        raise ServiceError(f"unknown team {team!r}; teams are {sorted(known_teams)}", field="team")
    token = "ty_" + secrets.token_urlsafe(32)
    s.add(TokenRow(token_hash=hash_token(token), user=user, role=role, team=team, job_id=job_id,
                   created_at=time.time(), created_by=by.user))
    if role != "job":
        record(s, by.user, "token.created", f"token for {user} ({role}{', team ' + team if team else ''})",
               data={"user": user, "role": role, "team": team, "before": None,
                     "after": {"user": user, "role": role, "team": team, "revoked": False}})
    return token


# Valid tokens already looked up, by hash: every API request authenticates, and tokens change
# only through this process (created or revoked through the API, revoked by the control loop when
# a job's attempt ends), which calls `forget_cached_tokens` after its commit. A generation number
# closes the race of a lookup that read the row before the revocation committed and would cache
# it after the cache was cleared: it is cached only if no forget happened in between. Entries also
# expire, so a token revoked behind this process's back (by hand in the database) stops working
# within CACHE_TTL_S.
CACHE_TTL_S = 30.0
_cache: dict[str, tuple[Principal, float]] = {}
_cache_lock = threading.Lock()
_generation = 0


def forget_cached_tokens() -> None:
    """Call after committing a revocation: the next request of every token goes to the store."""
    global _generation
    with _cache_lock:
        _generation += 1
        _cache.clear()


def cached_principal(token: str | None) -> Principal | None:
    """The caller of a token this process checked within CACHE_TTL_S, without touching the store
    (the API answers most requests of a known token without a trip through the thread pool)."""
    if not token:
        return None
    hit = _cache.get(hash_token(token))
    return hit[0] if hit is not None and hit[1] > time.monotonic() else None


def authenticate(s: Session, token: str | None) -> Principal:
    """The caller of `token`; a lookup in the store also stamps the token's `last_used_at`, so
    `yard token list` shows the last use to within CACHE_TTL_S."""
    if not token:
        raise Unauthorized("no token: send 'Authorization: Bearer <token>' (the CLI reads YARD_TOKEN)")
    who = cached_principal(token)
    if who is not None:
        return who
    generation = _generation
    h = hash_token(token)
    row = s.scalars(select(TokenRow).where(TokenRow.token_hash == h)).first()
    if row is None or row.revoked:
        raise Unauthorized("unknown or revoked token")
    who = Principal(row.user, row.role, row.team, row.job_id)
    _stamp_last_use(s, row.id)
    with _cache_lock:
        if generation == _generation:
            if len(_cache) > 10_000:
                _cache.clear()
            _cache[h] = (who, time.monotonic() + CACHE_TTL_S)
    return who


def _stamp_last_use(s: Session, token_id: int) -> None:
    """Best effort: a busy store (SQLite's one writer) must not fail the request being served."""
    try:
        with s.get_bind().engine.connect() as c:  # an Engine's .engine is itself
            c.execute(update(TokenRow).where(TokenRow.id == token_id).values(last_used_at=time.time()))
            c.commit()
    except OperationalError:
        pass


def ensure_admin_token(s: Session, path: Path) -> str | None:
    """On first start: create the admin token, write it to `path` (mode 0600). Returns it if new."""
    if s.scalars(select(TokenRow).where(TokenRow.role == "admin")).first() is not None and path.exists():  # plane's own
        return None
    token = create_token(s, user="admin", role="admin", team=None, by=Principal("bootstrap", "admin"))
    path.parent.mkdir(parents=True, exist_ok=True)  # plane's own: its data dir
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", opener=lambda p, f: __import__("os").open(p, f, 0o600)) as fh:  # plane's own: admin.token
        fh.write(token + "\n")
    tmp.replace(path)
    return token
