"""What `yard storage` and `GET /api/v1/storage` show beyond the meter's figures (services/storage.py):
each team's usage per tier — fast (its job dirs, per kind), archive (its jobs' archived checkpoints,
the `checkpoint_copies` rows of tier archive), datasets (the node caches' copies of its datasets,
the `node_datasets` rows) — and what the lifecycle rules will delete next, with when and which rule:
checkpoints from `checkpoint_plan.plan` over the `checkpoint_copies` and `checkpoint_keeps` rows,
logs and job dirs from their due dates (services/retention.py).

The quota (`storage.quota_gb`) is on the fast tier, the plane's data disk, as before; the other
tiers are shown beside it, not charged against it.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainyard.services import retention
from trainyard.services.auth import Principal
from trainyard.services.checkpoint_plan import ARCHIVE, FAST, Checkpoint, plan
from trainyard.services.errors import Forbidden
from trainyard.services.plane_facade import Plane
from trainyard.spec.lifecycle import CheckpointRules
from trainyard.spec.models import ConfigSpec
from trainyard.states import TERMINAL_STATES
from trainyard.store.models import CheckpointCopyRow, CheckpointKeepRow, DatasetRow, JobRow, NodeDatasetRow

MAX_COPY_ROWS = 200_000  # checkpoint copies the plan of "next" looks at, at most
IN_CHUNK = 500  # ids in one IN list


@dataclass(frozen=True)
class _Job:
    team: str
    job_class: str
    ended_at: float | None  # None: it may still run


def _jobs(s: Session, ids: set[int]) -> dict[int, _Job]:
    out: dict[int, _Job] = {}
    order = sorted(ids)
    for i in range(0, len(order), IN_CHUNK):
        q = select(JobRow.id, JobRow.team, JobRow.job_class, JobRow.state, JobRow.end_time).where(
            JobRow.id.in_(order[i:i + IN_CHUNK]))
        for jid, team, cls, state, end in s.execute(q):
            out[jid] = _Job(team, cls, end if state in TERMINAL_STATES and end is not None else None)
    return out


def tiers(s: Session, spec: ConfigSpec) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
    """(team -> {bytes, checkpoints} in the archive tier, team -> {bytes, copies} in the node caches)."""
    archive: dict[str, dict[str, int]] = defaultdict(lambda: {"bytes": 0, "checkpoints": 0})
    q = (select(JobRow.team, func.sum(CheckpointCopyRow.bytes), func.count())
         .join(JobRow, JobRow.id == CheckpointCopyRow.job_id).where(CheckpointCopyRow.tier == ARCHIVE)
         .group_by(JobRow.team))
    for team, nbytes, n in s.execute(q):
        archive[team] = {"bytes": int(nbytes or 0), "checkpoints": int(n)}
    owner = {(d.name, d.version): d.team for d in spec.datasets}
    owner.update({(n, v): t for n, v, t in s.execute(select(DatasetRow.name, DatasetRow.version, DatasetRow.team))})
    cached: dict[str, dict[str, int]] = defaultdict(lambda: {"bytes": 0, "copies": 0})
    q2 = (select(NodeDatasetRow.name, NodeDatasetRow.version, func.sum(NodeDatasetRow.bytes), func.count())
          .group_by(NodeDatasetRow.name, NodeDatasetRow.version))
    for name, version, nbytes, n in s.execute(q2):
        row = cached[owner.get((name, version), "")]  # "": a dataset no longer in any catalogue
        row["bytes"] += int(nbytes or 0)
        row["copies"] += int(n)
    return dict(archive), dict(cached)


def _rule_text(rules: CheckpointRules) -> str:
    set_ = rules.model_dump(exclude_none=True)
    return "checkpoints: " + (", ".join(f"{k}={v}" for k, v in set_.items()) if set_ else "keep_last=3 (default)")


Soon = tuple[float, int, int, Any]  # (when, job id, step or 0, what to make of it): sorted, the first `limit` made


def _checkpoint_deletions(s: Session, spec: ConfigSpec, now: float, limit: int) -> list[Soon]:
    """The `limit` soonest checkpoint deletions, as `Soon`s whose last item makes the row."""
    best = any(layer is not None and layer.checkpoints.keep_best is not None for layer in (
        spec.storage.lifecycle, *(t.storage.lifecycle for t in spec.teams), *(c.lifecycle for c in spec.classes)))
    cols = [CheckpointCopyRow.job_id, CheckpointCopyRow.step, CheckpointCopyRow.tier, CheckpointCopyRow.bytes]
    q = select(*cols, CheckpointCopyRow.metrics) if best else select(*cols)  # metrics only for keep_best
    copies: dict[int, dict[int, list[Any]]] = defaultdict(dict)  # job -> step -> [tiers, bytes, metrics]
    one = {FAST: frozenset({FAST}), ARCHIVE: frozenset({ARCHIVE})}  # shared, not one set per row
    none: frozenset[str] = frozenset()
    for row in s.execute(q.limit(MAX_COPY_ROWS)):
        jid, step, tier, nbytes = row[0], row[1], row[2], row[3]
        assert isinstance(jid, int) and isinstance(step, int) and isinstance(tier, str) and isinstance(nbytes, int)
        metrics = row[4] if best else None
        c = copies[jid].get(step)
        if c is None:
            copies[jid][step] = [one.get(tier, none), nbytes, metrics]
        else:
            c[0] = c[0] | one.get(tier, none)
            c[1] += nbytes
            c[2] = c[2] or metrics
    if not copies:
        return []
    ids = sorted(copies)
    keeps: dict[int, set[int]] = defaultdict(set)  # job -> its steps marked keep
    for i in range(0, len(ids), IN_CHUNK):
        q3 = select(CheckpointKeepRow.job_id, CheckpointKeepRow.step).where(
            CheckpointKeepRow.job_id.in_(ids[i:i + IN_CHUNK]))
        for jid, step in s.execute(q3):
            keeps[jid].add(step)
    jobs = _jobs(s, set(copies))
    out: list[Soon] = []
    rules_of: dict[tuple[str, str], tuple[CheckpointRules, str]] = {}  # per (team, class), not per job
    archive_tier = spec.storage.archive is not None
    for jid, steps in copies.items():
        job = jobs.get(jid)
        if job is None:
            continue
        key = (job.team, job.job_class)
        if key not in rules_of:
            r = spec.lifecycle_for(*key).checkpoints
            rules_of[key] = (r, _rule_text(r))
        rules, text = rules_of[key]
        marked = keeps.get(jid, ())
        cps = [Checkpoint(step, c[0], c[2], step in marked) for step, c in steps.items()]
        now_plan = plan(cps, rules, archive_tier=archive_tier, ended_at=job.ended_at, now=now)
        out += [(now, jid, step, (job.team, steps[step], text)) for step in now_plan.delete]
        if rules.keep_for is not None and job.ended_at is not None and now < job.ended_at + rules.keep_for:
            at = job.ended_at + rules.keep_for
            later = plan(cps, rules, archive_tier=archive_tier, ended_at=job.ended_at, now=at)
            out += [(at, jid, step, (job.team, steps[step], f"checkpoints: keep_for={rules.keep_for:g}"))
                    for step in later.delete - now_plan.delete]
    return heapq.nsmallest(limit, out, key=lambda x: x[:3])


def _checkpoint_row(x: Soon) -> dict[str, Any]:
    at, jid, step, (team, c, rule) = x
    return {"job_id": jid, "team": team, "what": "checkpoint", "step": step, "tiers": sorted(c[0]), "bytes": c[1],
            "at": at, "rule": rule}


def next_deletions(s: Session, spec: ConfigSpec, dirs: list[dict[str, Any]], now: float,
                   limit: int) -> list[dict[str, Any]]:
    """The `limit` soonest deletions the rules will make: checkpoints (the tiers thread's, at its
    next pass or when `keep_for` runs out), logs and job dirs of finished jobs (at their due time).
    `dirs`: the meter's job dirs ({job_id, apparent_bytes, kinds}). A running job's logs and dir
    have no date yet and are not listed."""
    if limit <= 0:
        return []
    out = [_checkpoint_row(x) for x in _checkpoint_deletions(s, spec, now, limit)]
    by_id = {d["job_id"]: d for d in dirs if d.get("job_id") is not None}
    rules_of: dict[tuple[str, str], dict[str, retention.Rule]] = {}
    for jid, job in _jobs(s, set(by_id)).items():
        if job.ended_at is None:
            continue
        key = (job.team, job.job_class)
        if key not in rules_of:
            rules_of[key] = retention.rules_for(spec, *key)
        rules = rules_of[key]
        d = by_id[jid]
        jd, logs = rules.get(retention.JOB_DIR), rules.get(retention.LOGS)
        purge = spec.retention.jobs
        if purge is not None and (jd is None or purge < jd.keep_s):  # the rows go, and the dir with them
            jd = retention.Rule(retention.JOB_DIR, purge, "retention.jobs")
        if logs is not None and (jd is None or logs.keep_s < jd.keep_s) and d["kinds"].get("logs", 0):
            out.append({"job_id": jid, "team": job.team, "what": retention.LOGS, "bytes": d["kinds"]["logs"],
                        "at": job.ended_at + logs.keep_s, "rule": logs.source})
        if jd is not None:
            out.append({"job_id": jid, "team": job.team, "what": retention.JOB_DIR, "bytes": d["apparent_bytes"],
                        "at": job.ended_at + jd.keep_s, "rule": jd.source})
    out.sort(key=lambda r: (r["at"], r["job_id"], r.get("step", 0)))
    return out[:limit]


def view(s: Session, spec: ConfigSpec, meter: dict[str, Any], dirs: list[dict[str, Any]], now: float,
         next_n: int) -> dict[str, Any]:
    """The meter's report (`meter`, its fields kept) with each team's tiers and the next deletions."""
    archive, cached = tiers(s, spec)
    rows = {r["team"]: r for r in meter["teams"]}
    for team in sorted(set(archive) | set(cached)):
        if team and team not in rows:
            rows[team] = {"team": team, "bytes": 0, "quota_bytes": None, "jobs": 0, "complete": True, "over": False,
                          "apparent_bytes": 0, "kinds": {}}
    for r in rows.values():
        key = r["team"] or ""
        r["tiers"] = {"fast": {"bytes": r["bytes"], "apparent_bytes": r.get("apparent_bytes", 0),
                               "kinds": r.get("kinds", {})},
                      "archive": archive.get(key, {"bytes": 0, "checkpoints": 0}),
                      "datasets": cached.get(key, {"bytes": 0, "copies": 0})}
    meter["teams"] = sorted(rows.values(), key=lambda r: (r["team"] is None, r["team"] or ""))
    meter["next"] = next_deletions(s, spec, dirs, now, next_n)
    meter["now"] = now
    return meter


def report(cp: Plane, s: Session, by: Principal, jobs: int = 0, next_n: int = 20,
           refresh: bool = False) -> dict[str, Any]:
    """`GET /api/v1/storage` (and `POST …/refresh`, an admin's: every job dir measured now, whole,
    before the answer, so that it and the disk agree to the byte)."""
    if refresh:
        if not by.is_admin:
            raise Forbidden("only an admin can make the plane measure now")
        cp.storage_refresh()
    spec = cp.configs.current(s).spec
    return view(s, spec, cp.storage_report(spec, jobs), cp.storage_dirs(), cp.clock(), next_n)
