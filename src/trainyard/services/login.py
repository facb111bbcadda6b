"""Who a Unix account is to trainyard: the answer `yard login` gets on the plane's host (issue 35).

On a login node the account a person is logged in as is who they are (Slurm trusts munge for
the same reason): the plane's login socket (`control/lifecycle/login_socket.py`) learns the caller's uid
from the kernel (`SO_PEERCRED`) and asks `login_identity` which trainyard user, team and role
that uid is. The answer is the inverse of the mapping jobs run by (`services/owners.py`), so a
token issued here runs its jobs as the very account that asked for it:

    uid → account (pwd)
    user  →  the token user U that `users:` maps to this account (`users: {alice: asmith}`)
          →  else the account's own name, unless `users:` maps that name to another account
          →  and `owners.account_of(user)` must give back this uid (root without
             allow_root_jobs, another account on a plane that is not root: refused)
    team  →  every team whose Unix group (its `group:`, else the group of its name) lists the
             account (`getgrouplist`, as the plane does at launch): one is the team; several need
             the caller's choice (`yard login --team`); none is refused, naming the groups
    role  →  member (admins, operators and viewers keep the tokens an admin makes)

Nothing in the request can name another account: the uid comes from the kernel, never from
the caller.
"""

from __future__ import annotations

import grp
import os
import pwd
from dataclasses import dataclass

from sqlalchemy.orm import Session

from trainyard.services import auth, owners
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, ServiceError
from trainyard.spec.models import ConfigSpec

LOGIN_ROLE = "member"


@dataclass(frozen=True)
class LoginIdentity:
    """What a login token says: the token user, its team and role, and the account it is."""

    user: str
    team: str
    role: str
    account: str

    def view(self) -> dict[str, str]:
        return {"user": self.user, "team": self.team, "role": self.role, "account": self.account}


def _group_gid(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def user_of_account(spec: ConfigSpec, account: str) -> str:
    """The token user whose jobs run as `account` (see the module docstring).

    Raises:
        Forbidden: several `users:` entries map to the account, or its own name is mapped away.
    """
    mapped = sorted(u for u, a in spec.users.items() if a == account)
    if len(mapped) > 1:
        raise Forbidden(f"account {account!r} is the account of several users in the configuration's users: "
                        f"({', '.join(mapped)}); ask an admin for a token", field="user")
    if mapped:
        return mapped[0]
    if account in spec.users:
        raise Forbidden(f"account {account!r}: the configuration's users: maps the name {account!r} to the account "
                        f"{spec.users[account]!r}, so this account is nobody's; ask an admin", field="user")
    return account


def teams_of_account(spec: ConfigSpec, pw: pwd.struct_passwd) -> list[str]:
    """The teams whose Unix group lists the account, in configuration order."""
    groups = set(os.getgrouplist(pw.pw_name, pw.pw_gid))
    out = []
    for t in spec.teams:
        gid = _group_gid(t.group or t.name)
        if gid is not None and gid in groups:
            out.append(t.name)
    return out


def login_identity(spec: ConfigSpec, uid: int, team: str | None = None) -> LoginIdentity:
    """Who the process of `uid` is (the module docstring's mapping); `team` chooses among several.

    Raises:
        Forbidden: the uid has no account, maps to no user, to no team, or is not a member of `team`.
        ServiceError: the account is in several teams and `team` is not given (field `team`).
    """
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        raise Forbidden(f"uid {uid} has no account name on the plane's host") from None
    account = pw.pw_name
    user = user_of_account(spec, account)
    if owners.account_of(spec, user).pw_uid != uid:  # raises for root, or another account of a plain plane
        raise Forbidden(f"account {account!r}: its jobs would run as another account; ask an admin", field="user")
    teams = teams_of_account(spec, pw)
    if not teams:
        groups = ", ".join(f"{t.name}: {t.group or t.name}" for t in spec.teams)
        raise Forbidden(f"account {account!r} maps to no team: it is a member of none of the teams' Unix groups "
                        f"({groups}); an admin adds it (usermod -aG GROUP {account}) or gives it a token",
                        field="team")
    if team is not None:
        if team not in teams:
            raise Forbidden(f"account {account!r} is not a member of team {team!r}'s Unix group; its teams: "
                            f"{', '.join(teams)}", field="team")
    elif len(teams) > 1:
        raise ServiceError(f"account {account!r} is in several teams ({', '.join(teams)}): choose one "
                           f"(yard login --team TEAM)", field="team")
    else:
        team = teams[0]
    return LoginIdentity(user, team, LOGIN_ROLE, account)


def issue(s: Session, user: str, role: str, team: str | None, how: str, known_teams: set[str] | None = None) -> str:
    """A new personal token for `user`, made by the login machinery and recorded as made by `how`
    ("login:socket", "login:code approved by bob") in the token list and the audit trail."""
    return auth.create_token(s, user=user, role=role, team=team, by=Principal(how[:100], "admin"),
                             known_teams=known_teams)
