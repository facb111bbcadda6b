"""One-time login codes: `yard login --code` against a plane on another host (issue 35).

Away from the plane's host there is no kernel to vouch for the caller, so a person proves who they
are the way device logins do: `yard login --code --user U` asks for a code, shows it, and waits;
someone who already holds a token approves it — U's own session (a login node's `yard login`, or
a token the admin gave), which can only hand on what it is (the same user, role and team), or an
admin, who says the role and team. The waiting `yard login` then collects the token, once.

Two secrets, two jobs: the short `code` (8 letters, shown to people) is what an approver types,
and approving needs a token anyway; the long `poll` secret (32 random bytes) is what collects the
token, and only the `yard login` that asked for the code has it, so someone who reads the code over
a shoulder cannot take the token. Codes expire after TTL_S, are used once (the token is handed out
at the first poll after approval and forgotten), and live in the plane's memory only: a plane
restart forgets pending codes (ask again), and no token is ever stored in clear.

At most MAX_PENDING codes wait at once, and at most MAX_PER_SOURCE of them from one address (anyone
may ask for one, a job too: 429 beyond), so one client that asks in a loop cannot crowd everyone
else out of logging in for the codes' lifetime.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from trainyard.services.auth import ROLES, Principal
from trainyard.services.errors import Conflict, Forbidden, NotFound, ServiceError

TTL_S = 600.0
MAX_PENDING = 256
MAX_PER_SOURCE = 8
ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"  # no vowels (no words), no look-alikes (0/O, 1/I)
CODE_LEN = 8


class TooMany(ServiceError):
    status = 429


def normalize(code: str) -> str:
    """`abcd-efgh`, `ABCDEFGH`, `abcd efgh` → `ABCDEFGH`."""
    return "".join(ch for ch in code.upper() if ch.isalnum())


def shown(code: str) -> str:
    return f"{code[:4]}-{code[4:]}"


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass
class _Pending:
    user: str
    team: str | None
    poll_hash: str
    expires: float
    source: str = ""
    token: str | None = None
    granted: dict[str, Any] | None = None


Issue = Callable[[str, str, str | None, str], str]  # (user, role, team, how) -> a new token


class LoginCodes:
    """The codes waiting for approval, in memory, safe to use from several threads."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, ttl_s: float = TTL_S,
                 max_pending: int = MAX_PENDING, max_per_source: int = MAX_PER_SOURCE):
        self._clock, self._ttl, self._max, self._per_source = clock, ttl_s, max_pending, max_per_source
        self._lock = threading.Lock()
        self._codes: dict[str, _Pending] = {}

    def _purge(self) -> None:
        now = self._clock()
        for c in [c for c, p in self._codes.items() if p.expires <= now]:
            del self._codes[c]

    def new(self, user: str, team: str | None, source: str = "") -> dict[str, Any]:
        """A new code for `user` (and, if given, `team`): the code to show and the poll secret to keep.
        `source`: the asking client's address (at most `max_per_source` waiting codes each)."""
        if not user.strip():
            raise ServiceError("user must not be empty", field="user")
        poll = secrets.token_urlsafe(32)
        with self._lock:
            self._purge()
            if len(self._codes) >= self._max:
                raise TooMany(f"{self._max} login codes are waiting already; try again in a few minutes")
            if sum(1 for p in self._codes.values() if p.source == source) >= self._per_source:
                raise TooMany(f"{self._per_source} login codes asked from {source or 'this address'} are waiting "
                              "already; approve or let them expire first")
            code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
            while code in self._codes:
                code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
            self._codes[code] = _Pending(user, team, _hash(poll), self._clock() + self._ttl, source)
        return {"code": shown(code), "poll": poll, "user": user, "team": team, "expires_in": int(self._ttl)}

    def approve(self, code: str, by: Principal, issue: Issue, *, role: str | None = None,
                team: str | None = None) -> dict[str, Any]:
        """Approve `code` as `by`: the code's user themself (their token's role and team, nothing
        more) or an admin (`role`, default member, and `team`, default the one asked for).

        Raises:
            Forbidden: a job token; another user who is not an admin; a role or team the
                approver's own token does not have.
            NotFound: no such code, or it expired.  Conflict: approved already.
            ServiceError: a member token without a team, an unknown role.
        """
        if by.role == "job":
            raise Forbidden("a job token cannot approve a login")
        key = normalize(code)
        with self._lock:
            self._purge()
            p = self._codes.get(key)
            if p is None:
                raise NotFound("no such login code, or it expired", field="code")
            if p.token is not None:
                raise Conflict("this login code is approved already", field="code")
            if by.is_admin:
                role, team = role or "member", team or p.team
                if role not in ROLES or role == "job":
                    raise ServiceError(f"unknown role {role!r}; roles are admin, operator, member, viewer", field="role")
                if role == "member" and not team:
                    raise ServiceError(f"user {p.user!r} asked for no team: give one (--team) for a member token",
                                       field="team")
            elif by.user != p.user:
                raise Forbidden(f"this code is for user {p.user!r}, not you ({by.user!r}): only that user's own "
                                f"session or an admin may approve it")
            else:
                if (role is not None and role != by.role) or (team is not None and team != by.team):
                    raise Forbidden("your own session hands on only what it is: role "
                                    f"{by.role}{', team ' + by.team if by.team else ''}", field="role")
                if p.team is not None and p.team != by.team:
                    raise Forbidden(f"the code asks for team {p.team!r}; your session is "
                                    f"{'team ' + repr(by.team) if by.team else 'of no team'}", field="team")
                role, team = by.role, by.team
            # issue under the lock: two approvals of one code cannot both make a token
            p.token = issue(p.user, role, team, f"login:code approved by {by.user}")
            p.granted = {"user": p.user, "role": role, "team": team}
            return {"code": shown(key), **p.granted}

    def poll(self, poll: str) -> dict[str, Any]:
        """`{"state": "pending", "expires_in": s}` until approved; then once the token, and the code is gone.

        Raises:
            NotFound: no code has this poll secret (never was, expired, or collected).
        """
        h = _hash(poll)
        with self._lock:
            self._purge()
            key = next((c for c, p in self._codes.items() if secrets.compare_digest(p.poll_hash, h)), None)
            if key is None:
                raise NotFound("no such login code, or it expired: run yard login --code again", field="poll")
            p = self._codes[key]
            if p.token is None:
                return {"state": "pending", "expires_in": max(0, int(p.expires - self._clock()))}
            del self._codes[key]
            return {"state": "approved", "token": p.token, **(p.granted or {})}
