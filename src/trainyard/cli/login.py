"""`yard login`, `yard logout`, `yard whoami`: the Unix account you are logged in as is who you are.

    yard login                  # on the plane's host: a token for this account, over the login socket
    yard login --team nlp       # an account in several teams' groups chooses one
    yard login --code           # elsewhere: prints a one-time code and waits for its approval by
    yard login approve CODE     #   your own session (or an admin) on a host that has a token
    yard logout                 # revoke the token at the plane and forget it here
    yard whoami                 # who the plane takes you for: user, role, team

The token is kept in `cli/token_file.py`'s file (0600, one per plane URL) and used by every
command when `YARD_TOKEN` is not set. The plane's side: control/lifecycle/login_socket.py (the socket that
asks the kernel who calls), services/login.py (account → user, team, role),
services/login_codes.py (the codes).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any, Optional

import typer

from trainyard.cli import token_file
from trainyard.cli.client import EXIT_UNAVAILABLE, Client, error_message, server_url
from trainyard.cli.common import EXIT_BAD_INPUT, fail
from trainyard.cli.http import TransportError
from trainyard.cli.render import print_json
from trainyard.cli.safe_text import clean

JSON = typer.Option(False, "--json", help="print JSON")
POLL_S = 2.0
login_app = typer.Typer(help="Log in as the Unix account you are (on the plane's host) or with a one-time code.",
                        invoke_without_command=True)


def _is_socket(p: Path) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(p).st_mode)
    except OSError:
        return False


def _socket_path(c: Client, given: Optional[Path]) -> Path | None:
    """The login socket to use: --socket, $YARD_LOGIN_SOCKET, else the one the plane names, if here."""
    if given is not None:
        return given
    if os.environ.get("YARD_LOGIN_SOCKET"):
        return Path(os.environ["YARD_LOGIN_SOCKET"])
    named = c.get("/api/v1/login").get("socket")
    return Path(named) if named and _is_socket(Path(named)) else None


def _ask_socket(path: Path, request: dict[str, Any]) -> dict[str, Any]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(30)
    try:
        s.connect(str(path))
        s.sendall(json.dumps(request).encode() + b"\n")
        buf = b""
        while b"\n" not in buf and len(buf) < 65536:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    except OSError as e:
        typer.echo(f"error: cannot talk to the login socket {path}: {e.strerror or e}", err=True)
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    finally:
        s.close()
    try:
        out = json.loads(buf.split(b"\n", 1)[0])
        assert isinstance(out, dict)
        return out
    except (ValueError, AssertionError):
        typer.echo(f"error: {path} did not answer as a trainyard login socket", err=True)
        raise typer.Exit(EXIT_UNAVAILABLE) from None


def _keep(url: str, got: dict[str, Any]) -> None:
    """Check the new token at `url` (the plane that answered may be another one), then store it."""
    c = Client(url, got["token"])
    try:
        r = c.http.request("GET", "/api/v1/whoami")
    except TransportError:
        r = None
    if r is None or r.status_code != 200:
        fail(f"the token obtained is not accepted by the plane at {url}: the login socket belongs to another "
             "plane (give --socket, or YARD_URL)")
    where = token_file.save(url, got["token"])
    team = f", team {clean(got['team'])}" if got.get("team") else ""
    typer.echo(f"logged in to {url} as {clean(got['user'])} ({got['role']}{team}); token kept in {where}")


@login_app.callback()
def login(ctx: typer.Context,
          code: bool = typer.Option(False, "--code", help="log in with a one-time code that your own session or "
                                    "an admin approves (a plane on another host)"),
          team: Optional[str] = typer.Option(None, "--team", help="the team, when your account is in several"),
          user: Optional[str] = typer.Option(None, "--user", help="with --code: the user to log in as "
                                             "(default: your account's name)"),
          sock: Optional[Path] = typer.Option(None, "--socket", help="the plane's login socket (default: "
                                              "$YARD_LOGIN_SOCKET, else the one the plane names)"),
          wait: float = typer.Option(600, "--wait", min=1, help="with --code: seconds to wait for the approval")) -> None:
    """Get a token for who you are and keep it (0600) for the CLI's later commands."""
    if ctx.invoked_subcommand is not None:
        return
    url = server_url()
    c = Client(url)
    if not code:
        if user is not None:
            fail("--user goes with --code: over the socket you are the account you are logged in as")
        path = _socket_path(c, sock)
        if path is None:
            fail(f"the plane at {url} has no login socket on this host: log in with a one-time code "
                 "(yard login --code)")
        got = _ask_socket(path, {"op": "login", **({"team": team} if team else {})})
        if not got.get("ok"):
            typer.echo(f"error: {clean(str(got.get('error')))}", err=True)
            raise typer.Exit(EXIT_BAD_INPUT if got.get("status", 400) < 500 else EXIT_UNAVAILABLE)
        _keep(url, got)
        return
    who = user or getpass.getuser()
    opened = c.post("/api/v1/login/codes", json={"user": who, "team": team})
    who = opened["user"]  # the plane's name for it (users: may map the account's name)
    typer.echo(f"To log in to {url} as {clean(who)}, approve this code from a session that is {clean(who)}'s "
               f"(or an admin's):\n\n    yard login approve {opened['code']}\n\n"
               f"waiting for the approval (the code expires in {opened['expires_in'] // 60} minutes)…", err=True)
    deadline = time.monotonic() + min(wait, opened["expires_in"] + 5)
    while time.monotonic() < deadline:
        r = c.http.request("POST", "/api/v1/login/codes/poll", json={"poll": opened["poll"]})
        if r.status_code != 200:
            fail(f"the login code ended: {error_message(r)}")
        got = r.json()
        if got.get("state") == "approved":
            _keep(url, got)
            return
        time.sleep(POLL_S)
    fail("no approval came in time; run yard login --code again")


@login_app.command("approve")
def approve(code: str = typer.Argument(..., help="the code `yard login --code` shows"),
            role: Optional[str] = typer.Option(None, "--role", help="(admin) the role to give: member (default), "
                                               "viewer, operator, admin"),
            team: Optional[str] = typer.Option(None, "--team", help="(admin) the team to give"),
            as_json: bool = JSON) -> None:
    """Approve a login code: your own (from a session that has your token) or, as an admin, anyone's."""
    out = Client().post("/api/v1/login/codes/approve", json={"code": code, "role": role, "team": team})
    if as_json:
        print_json(out)
        return
    t = f", team {clean(out['team'])}" if out.get("team") else ""
    typer.echo(f"approved {out['code']}: {clean(out['user'])} gets a {out['role']} token{t}")


def logout() -> None:
    """Revoke the token `yard login` kept for this plane, at the plane, and forget it here."""
    url = server_url()
    tok = token_file.read(url)
    if tok is None:
        typer.echo(f"not logged in to {url} (no token for it in {token_file.path()})")
        return
    try:
        r = Client(url, tok).http.request("POST", "/api/v1/logout")
    except TransportError as e:
        typer.echo(f"error: cannot reach {url} ({type(e).__name__}); the token is kept, so that it can still be "
                   "revoked: run yard logout again", err=True)
        raise typer.Exit(EXIT_UNAVAILABLE) from None
    if r.status_code >= 500:
        typer.echo(f"error: the plane failed (HTTP {r.status_code}); the token is kept: run yard logout again",
                   err=True)
        raise typer.Exit(EXIT_UNAVAILABLE)
    token_file.remove(url)
    if r.status_code == 200:
        typer.echo(f"logged out of {url}: token {r.json()['revoked'][0]['id']} revoked and forgotten")
    else:  # 401/404: revoked already (an admin did), or unknown to this plane
        typer.echo(f"logged out of {url}: the plane no longer knew the token ({clean(error_message(r))}); forgotten")


def whoami(as_json: bool = JSON) -> None:
    """Who the plane takes you for: user, role, team (and the job, for a job's token)."""
    me = Client().get("/api/v1/whoami")
    if as_json:
        print_json(me)
        return
    team = f", team {clean(me['team'])}" if me.get("team") else ""
    job = f", job {me['job_id']}" if me.get("job_id") else ""
    typer.echo(f"{clean(me['user'])} ({me['role']}{team}{job}) at {server_url()}")
