"""Token commands: create (printed once), list (never the secret), revoke. Admin only.

    yard token create --user alice --role member --team vision
    yard token list [--user alice] [--revoked] [--jobs] [--json]
    yard token revoke 12            # one token, by the id `list` shows
    yard token revoke --user alice  # every personal token of alice (her running jobs run on)
"""

from __future__ import annotations

import time
from typing import Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.cli.render import print_json, table
from trainyard.cli.safe_text import clean

JSON = typer.Option(False, "--json", help="print JSON instead of a table")
token_app = typer.Typer(help="API tokens: create, list, revoke.", no_args_is_help=True)


def _when(t: float | None) -> str:
    return "" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


@token_app.command("create")
def token_create(user: str = typer.Option(..., "--user"), role: str = typer.Option(..., "--role",
                 help="admin, operator, member or viewer"), team: Optional[str] = typer.Option(None, "--team"),
                 as_json: bool = JSON) -> None:
    """Create a token (admin only); it is printed once."""
    t = Client().post("/api/v1/tokens", json={"user": user, "role": role, "team": team})
    print_json(t) if as_json else typer.echo(t["token"])


@token_app.command("list")
def token_list(user: Optional[str] = typer.Option(None, "--user", help="only this user's tokens"),
               revoked: bool = typer.Option(False, "--revoked", help="also revoked tokens"),
               jobs: bool = typer.Option(False, "--jobs", help="also the job tokens of running attempts"),
               as_json: bool = JSON) -> None:
    """Who holds a token: id, user, role, team, created, last used (to within 30 s). Never the secret."""
    params: dict[str, str] = {"revoked": str(revoked).lower(), "jobs": str(jobs).lower()}
    if user is not None:
        params["user"] = user
    ts = Client().get("/api/v1/tokens", params=params)["tokens"]
    if as_json:
        print_json(ts)
        return
    table(["ID", "USER", "ROLE", "TEAM", "JOB", "CREATED", "BY", "LAST_USED", "STATE"],
          [[t["id"], t["user"], t["role"], t["team"] or "", t["job_id"] or "", _when(t["created_at"]), t["created_by"],
            _when(t["last_used_at"]) or "never", "revoked" if t["revoked"] else "active"] for t in ts])


@token_app.command("revoke")
def token_revoke(token_id: Optional[int] = typer.Argument(None, metavar="[ID]", help="the id `yard token list` shows"),
                 user: Optional[str] = typer.Option(None, "--user", help="revoke every personal token of this user"),
                 as_json: bool = JSON) -> None:
    """Revoke a token (or all of a user's), effective at the next request."""
    if (token_id is None) == (user is None):
        fail("give a token ID or --user, not both")
    c = Client()
    out = c.delete(f"/api/v1/tokens/{token_id}") if token_id is not None else \
        c.post("/api/v1/tokens/revoke", json={"user": user})
    if as_json:
        print_json(out)
        return
    done = out["revoked"]
    if not done:
        typer.echo("nothing to revoke: already revoked")
    for t in done:
        who = f"{clean(t['user'])} ({t['role']}{', team ' + clean(t['team']) if t['team'] else ''})"
        typer.echo(f"revoked token {t['id']} of {who}")
