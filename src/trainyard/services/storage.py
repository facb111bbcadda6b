"""Disk per team, as the store records it: the warning events of a quota or the reserve crossed,
and the report `yard storage` and `GET /api/v1/storage` show (the measuring is
`control/lifecycle/storage.py`'s).

Each crossing is one event, never one per pass: a team that goes over its quota gets
`team.storage_quota` (data: team, bytes, quota_bytes) and each of its running jobs one
`job.storage_quota`; back under, `team.storage_quota_cleared`. The reserve: `plane.disk_reserve`
and `plane.disk_reserve_cleared`. `known_state` reads the newest of them at start, so a restart of
the plane neither warns again nor forgets a team that is over (the events' (kind, time) index
makes that a few rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services.events import record
from trainyard.spec.models import ConfigSpec
from trainyard.states import ACTIVE_STATES
from trainyard.store.models import EventRow, JobRow

TEAM_OVER, TEAM_OK, JOB_OVER = "team.storage_quota", "team.storage_quota_cleared", "job.storage_quota"
RESERVE_LOW, RESERVE_OK = "plane.disk_reserve", "plane.disk_reserve_cleared"
ACTOR = "storage"
KINDS = ("checkpoints", "logs", "metrics", "other")  # what a job dir holds, as `yard storage` sorts it
STORAGE_QUOTA, DISK_RESERVE = "StorageQuota", "DiskReserve"  # a waiting job's reason, as `yard queue` shows it


def size(n: float | None) -> str:
    """Bytes as people read them (binary units, as `du -h`)."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def known_state(s: Session) -> tuple[set[str], dict[int, str], bool]:
    """(teams over their quota, the jobs warned since their team went over (id: team), whether the
    reserve is crossed), as the newest events say."""
    over: dict[str, float] = {}
    seen: set[str] = set()
    q = (select(EventRow.kind, EventRow.data, EventRow.time).where(EventRow.kind.in_((TEAM_OVER, TEAM_OK)))
         .order_by(EventRow.id.desc()).limit(10_000))
    for kind, data, at in s.execute(q):
        team = (data or {}).get("team")
        if isinstance(team, str) and team not in seen:
            seen.add(team)
            if kind == TEAM_OVER:
                over[team] = at
    warned: dict[int, str] = {}
    if over:
        q2 = select(EventRow.job_id, EventRow.data, EventRow.time).where(EventRow.kind == JOB_OVER,
                                                                          EventRow.time >= min(over.values()))
        warned = {jid: data["team"] for jid, data, at in s.execute(q2)
                  if jid is not None and (data or {}).get("team") in over and at >= over[data["team"]]}
    newest = s.scalar(select(EventRow.kind).where(EventRow.kind.in_((RESERVE_LOW, RESERVE_OK)))
                      .order_by(EventRow.id.desc()).limit(1))
    return set(over), warned, newest == RESERVE_LOW


def team_over(s: Session, team: str, used: int, quota: int, now: float) -> None:
    record(s, ACTOR, TEAM_OVER, f"team {team}'s job dirs hold {size(used)}, over its storage quota of "
           f"{size(quota)}: its new attempts wait (StorageQuota) until it is under again",
           data={"team": team, "bytes": used, "quota_bytes": quota}, at=now)


def team_under(s: Session, team: str, used: int, quota: int | None, now: float) -> None:
    record(s, ACTOR, TEAM_OK, f"team {team}'s job dirs hold {size(used)}, within its storage quota "
           f"{'(none now)' if quota is None else 'of ' + size(quota)}: its jobs start again",
           data={"team": team, "bytes": used, "quota_bytes": quota}, at=now)


def unwarned(s: Session, team: str, warned: dict[int, str]) -> list[int]:
    """The running jobs of `team` not in `warned`."""
    return [jid for jid in s.scalars(select(JobRow.id).where(JobRow.team == team, JobRow.state.in_(ACTIVE_STATES)))
            if jid not in warned]


def warn_jobs(s: Session, team: str, ids: Iterable[int], used: int, quota: int, now: float) -> None:
    """One `job.storage_quota` event for each of `ids`, running jobs of `team`."""
    for jid in ids:
        record(s, ACTOR, JOB_OVER, f"team {team} is over its storage quota ({size(used)} of {size(quota)}): this "
               "job runs on, but the team's new attempts wait until its job dirs hold less; delete checkpoints "
               "and logs it no longer needs", job_id=jid, data={"team": team, "bytes": used, "quota_bytes": quota},
               at=now)


def reserve_crossed(s: Session, low: Iterable[dict[str, Any]], now: float) -> None:
    text = "; ".join(f"{f['path']} has {size(f['free'])} free ({f['inodes_free']} inodes), under the reserve of "
                     f"{size(f['reserve'])}" for f in low)
    record(s, ACTOR, RESERVE_LOW, f"{text}: no new attempt starts (DiskReserve) until space is freed; the rest is "
           "the store's and the plane's", data={"file_systems": list(low)}, at=now)


def reserve_ok(s: Session, now: float) -> None:
    record(s, ACTOR, RESERVE_OK, "free space is above the reserve again: jobs start again", at=now)


def report(spec: ConfigSpec, dirs: Iterable[Any], file_systems: list[dict[str, Any]], over: Iterable[str],
           reserve_crossed: bool, measured_at: float | None, sweep_s: float, jobs: int = 0) -> dict[str, Any]:
    """Per team (every configured one, and `team: null` for dirs no job owns), the file systems,
    and the `jobs` biggest job dirs. `dirs`: `control.lifecycle.storage_figures.DirUsage`s.
    Each team's `bytes` are allocated blocks (`du -sx`, what the quota counts); `apparent_bytes` and
    `kinds` (checkpoints, logs, metrics, other) are apparent sizes (`du -sbx`)."""
    dirs = list(dirs)
    def blank(team: str | None, quota: int | None) -> dict[str, Any]:
        return {"team": team, "bytes": 0, "quota_bytes": quota, "jobs": 0, "complete": True, "apparent_bytes": 0,
                "kinds": dict.fromkeys(KINDS, 0)}

    teams: dict[str | None, dict[str, Any]] = {t.name: blank(t.name, spec.storage.quota_bytes(t)) for t in spec.teams}
    for d in dirs:
        row = teams.setdefault(d.team, blank(d.team, None))
        row["bytes"] += d.bytes
        row["apparent_bytes"] += d.apparent
        for kind, n in d.kinds:
            row["kinds"][kind] = row["kinds"].get(kind, 0) + n
        row["jobs"] += 1
        row["complete"] = row["complete"] and d.complete
    over = set(over)
    for row in teams.values():
        row["over"] = row["team"] in over
    biggest = sorted((d for d in dirs if d.job_id is not None), key=lambda d: -d.bytes)[:max(0, jobs)]
    return {
        "measured_at": measured_at, "sweep_s": round(sweep_s, 3), "interval_s": spec.storage.interval,
        "complete": all(d.complete for d in dirs), "reserve_crossed": reserve_crossed,
        "teams": sorted(teams.values(), key=lambda r: (r["team"] is None, r["team"] or "")),
        "file_systems": file_systems,
        "jobs": [{"job_id": d.job_id, "team": d.team, "user": d.user, "bytes": d.bytes, "complete": d.complete,
                  "measured_at": d.measured_at, "apparent_bytes": d.apparent, "kinds": dict(d.kinds)} for d in biggest],
    }
