"""Admin reservations: nodes held for some users and teams over a time window (Slurm's
`scontrol create reservation`), kept in the versioned cluster configuration (`reservations:`,
`spec.models.ReservationSpec`), so every create and delete is a configuration version (who, when, diff,
rollback) and the control loop sees it on its next pass.

- `create` (admin): nodes in Slurm's hostlist form, a start (UNIX seconds, or `parse_begin`'s
  forms read in the server's time zone; the CLI sends seconds), a duration, users and/or teams,
  an optional name (default `resv-N`). Bad input is a `ServiceError` naming the field (`nodes`,
  `start`, `duration`, `users`, `teams`, `name`) and nothing is stored; a name in use is 409.
- `delete` (admin): the reservation leaves the configuration; jobs waiting in it stay pending
  with the reason `ReservationDeleted` (as Slurm keeps them), until cancelled.
- `list` (anyone who may read the cluster): each with its state (`planned`, `active`, `ended`).
- `check_job`, at submission: a job's `--reservation` must name a reservation that has not ended,
  whose users or teams include the submitter or the job's team (403 otherwise), with nodes in the
  job's pool. The engine (`sched/reservations.py`) does the rest.

Known users are the users of the plane's tokens and the configuration's `users:` mapping: a
reservation for a user nobody can act as is a typo.
"""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr
from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.contracts import compress_hostlist, expand_hostlist
from trainyard.spec.parsing import parse_begin, parse_duration
from trainyard.services import config, yaml_edit
from trainyard.services.auth import Principal
from trainyard.services.errors import Conflict, Forbidden, NotFound, ServiceError
from trainyard.spec.models import ReservationSpec
from trainyard.spec.bounds import MAX_NODES
from trainyard.store.models import TokenRow


class ReservationCreate(BaseModel):
    """`POST /api/v1/reservations`."""

    model_config = ConfigDict(extra="forbid")
    name: str | None = Field(None, max_length=100)
    nodes: str = Field(max_length=20_000, description="Slurm's hostlist form: node-[0-1],gpu-3")
    start: StrictFloat | StrictInt | StrictStr = Field(
        description="UNIX seconds, or now, now+1hour, 16:00, 2026-12-02T10:00 (server's time zone)")
    duration: StrictFloat | StrictInt | StrictStr = Field(description="seconds, or 30m, 2h, 1-00:00:00")
    users: list[str] = Field(default_factory=list, max_length=1000)
    teams: list[str] = Field(default_factory=list, max_length=1000)
    message: str = Field("", max_length=1000)


def _bad(msg: str, field: str) -> ServiceError:
    return ServiceError(msg, field=field)


def state_of(r: ReservationSpec, now: float) -> str:
    return "ended" if r.end <= now else "active" if r.start <= now else "planned"


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def as_dict(r: ReservationSpec, now: float) -> dict[str, Any]:
    return {"name": r.name, "nodes": compress_hostlist(r.nodes), "node_names": list(r.nodes), "start": r.start,
            "end": r.end, "duration_s": r.duration, "users": list(r.users), "teams": list(r.teams),
            "state": state_of(r, now)}


def list_reservations(cfg: config.ConfigVersion, now: float | None = None) -> list[dict[str, Any]]:
    now = time.time() if now is None else now
    return [as_dict(r, now) for r in sorted(cfg.spec.reservations, key=lambda r: (r.start, r.name))]


def known_users(s: Session, cfg: config.ConfigVersion) -> set[str]:
    return set(s.scalars(select(TokenRow.user).where(TokenRow.job_id.is_(None)).distinct())) | set(cfg.spec.users)


def create(s: Session, cfg: config.ConfigVersion, body: ReservationCreate, by: Principal,
           now: float | None = None) -> tuple[int, str]:
    """Store a new reservation as a configuration version; returns (version, name).

    Raises:
        Forbidden: not an admin.
        ServiceError: a malformed or unknown node list, start, duration, user or team (the field named).
        Conflict: the name is taken, or the nodes are held by another reservation then.
    """
    if not by.is_admin:
        raise Forbidden("only an admin can create reservations")
    now = time.time() if now is None else now
    spans = sum(int(b) - int(a) + 1 for a, b in re.findall(r"(\d+)-(\d+)", body.nodes) if len(a) < 12 and len(b) < 12)
    if spans > MAX_NODES or any(len(x) >= 12 for x in re.findall(r"\d+", body.nodes)):
        raise _bad(f"{body.nodes[:100]!r} names more nodes than a cluster has", "nodes")
    try:
        names = expand_hostlist(body.nodes)
    except ValueError as e:
        raise _bad(str(e), "nodes") from None
    if not names:
        raise _bad("give the nodes to reserve", "nodes")
    have = {n.name for n in cfg.nodes}
    unknown = [n for n in names if n not in have]
    if unknown:
        raise _bad(f"unknown node {unknown[0]!r}; nodes are {compress_hostlist(sorted(have))}", "nodes")
    try:
        start = parse_begin(body.start, now) if isinstance(body.start, str) else float(body.start)
    except ValueError as e:
        raise _bad(str(e), "start") from None
    if not 0 <= start <= 4102444800:
        raise _bad("a start must be UNIX seconds before 2100", "start")
    try:
        duration = parse_duration(body.duration)
    except ValueError as e:
        raise _bad(str(e), "duration") from None
    if duration is None or duration <= 0:
        raise _bad(f"a duration must be positive, got {body.duration!r}", "duration")
    if start + duration <= now:
        raise _bad(f"it would end at {_iso(start + duration)}, in the past", "start")
    if not body.users and not body.teams:
        raise _bad("give the users or teams the reservation is for", "users")
    teams = {t.name for t in cfg.spec.teams}
    for t in body.teams:
        if t not in teams:
            raise _bad(f"unknown team {t!r}; teams are {sorted(teams)}", "teams")
    if body.users:
        users = known_users(s, cfg)
        for u in body.users:
            if u not in users:
                raise _bad(f"unknown user {u!r}: no token or users: entry names it", "users")
    taken = {r.name for r in cfg.spec.reservations}
    name = body.name
    if name is None:
        n = 1
        while f"resv-{n}" in taken:
            n += 1
        name = f"resv-{n}"
    elif name in taken:
        raise Conflict(f"a reservation {name!r} exists; delete it first or choose another name")
    end = start + duration
    for r in cfg.spec.reservations:
        both = sorted(set(names) & set(r.nodes))
        if both and start < r.end and r.start < end:
            raise Conflict(f"node {both[0]!r} is held by reservation {r.name!r} from {_iso(r.start)} to {_iso(r.end)}")
    entry = {"name": name, "nodes": compress_hostlist(names), "start": _iso(start), "duration": duration,
             **({"users": list(body.users)} if body.users else {}), **({"teams": list(body.teams)} if body.teams else {})}
    try:
        ReservationSpec.model_validate(entry)
    except ValueError as e:
        raise _bad(str(e).splitlines()[-1].strip() if str(e) else "invalid reservation", "name") from None
    text = _edit(cfg.text, lambda lst: lst.append(entry))
    version = config.apply(s, text, by, body.message or f"reservation {name} created")
    return version, name


def delete(s: Session, cfg: config.ConfigVersion, name: str, by: Principal, message: str = "") -> int:
    """Remove reservation `name`; returns the new configuration version.

    Raises:
        Forbidden: not an admin.
        NotFound: no reservation of that name.
    """
    if not by.is_admin:
        raise Forbidden("only an admin can delete reservations")
    if name not in {r.name for r in cfg.spec.reservations}:
        raise NotFound(f"no reservation {name!r}")

    def drop(lst: Any) -> None:
        for i in [i for i, r in enumerate(lst) if isinstance(r, dict) and r.get("name") == name][::-1]:
            del lst[i]

    return config.apply(s, _edit(cfg.text, drop), by, message or f"reservation {name} deleted")


def check_job(cfg: config.ConfigVersion, name: str | None, user: str, team: str, pool: str,
              now: float | None = None) -> None:
    """A submission's `--reservation`, checked (nothing when it names none).

    Raises:
        ServiceError: no such reservation, it ended, or it holds no node of the job's pool.
        Forbidden: neither the user nor the team is among the reservation's.
    """
    if name is None:
        return
    now = time.time() if now is None else now
    r = next((r for r in cfg.spec.reservations if r.name == name), None)
    if r is None:
        known = sorted(x.name for x in cfg.spec.reservations if x.end > now)
        raise _bad(f"unknown reservation {name!r}; reservations are {known}", "reservation")
    if r.end <= now:
        raise _bad(f"reservation {name!r} ended at {_iso(r.end)}", "reservation")
    if user not in r.users and team not in r.teams:
        raise Forbidden(f"reservation {name!r} is not for user {user!r} or team {team!r} "
                        f"(it is for users {list(r.users)}, teams {list(r.teams)})")
    pools = {n.pool for n in cfg.nodes if n.name in set(r.nodes)}
    if pool not in pools:
        raise _bad(f"reservation {name!r} holds no node of pool {pool!r} (its pools: {sorted(pools)})", "pool")


def _edit(text: str, change: Callable[[list[Any]], None]) -> str:
    """`text` with `change` applied to its `reservations:` list (made when missing), comments kept
    (`yaml_edit.edited`)."""
    def on_list(doc: Any) -> None:
        if not isinstance(doc.get("reservations"), list):
            doc["reservations"] = []
        change(doc["reservations"])
    return yaml_edit.edited(text, on_list)
