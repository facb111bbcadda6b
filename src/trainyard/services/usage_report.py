"""Usage over a period, per cluster, pool, team and user (`yard report`, `GET /api/v1/report`; sreport's habits).

Every figure is the accounting's (services/accounting.py), counted inside the period [start, end):
- GPU-hours allocated: each attempt's GPUs × the part of its run inside the period (a running one
  up to now): what `yard acct --truncate` gives for the same window, job by job;
- lost GPU-hours by cause, attempts ended, preemptions suffered: the attempts that *ended* in the
  period (an attempt's lost work is known when it ends); useful (goodput) = allocated − lost;
- jobs by outcome and the OOM rate: the jobs that ended in the period, by final state
  (OUT_OF_MEMORY / all ended);
- preemptions caused: the preemptions the engine asked for in the period to make room for the
  team's (or user's) jobs (`job.preempting` events naming them);
- busy %: allocated GPU-hours / (the pool's GPUs × the period), the pool's GPUs as configured now;
- share of the pool: the team's allocated GPU-hours / the pool's capacity; quota used: allocated /
  (nominal × the period);
- borrowed and lent GPU-hours: at every instant a team that holds more than its nominal quota in
  a pool borrows the excess; the members of its cohort lend it out of their unused nominal quota
  (each at most its lending limit), in proportion to what each could lend then. So a cohort's
  lent GPU-hours add up to its borrowed ones. Quotas are those of the configuration in force now
  (`config_version` in the report);
- queue wait per class: the attempts that started in the period, their wait as the accounting
  defines it (`accounting.attempt_waits`); nearest-rank percentiles;
- the goodput ledger per team and user (`buckets`, GPU-hours per bucket, adding up to the
  allocated GPU-hours): services/goodput_report.py's, the same figures `yard report goodput` gives.

Who sees what: admins and operators everything; a member the cluster, every team's totals and
the users of their own team only; a viewer the cluster and the teams' totals, no users
(`users_shown` says whose); a job token nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from trainyard.contracts import LEDGER_BUCKETS
from trainyard.services import goodput_report
from trainyard.services.accounting import Window
from trainyard.services.auth import Principal
from trainyard.services.config import ConfigVersion
from trainyard.services.errors import Forbidden
from trainyard.store.models import AttemptRow, EventRow, JobRow

H = 3600.0


class Totals(BaseModel):
    gpu_hours: float = 0.0
    useful_gpu_hours: float = 0.0
    lost_gpu_hours: float = 0.0
    lost_by_cause: dict[str, float] = Field(default_factory=dict, description="lost GPU-hours by the attempts' cause")
    attempts_ended: int = 0
    jobs_ended: int = 0
    jobs_by_state: dict[str, int] = Field(default_factory=dict, description="jobs that ended, by final state")
    oom_rate: float | None = Field(None, description="OUT_OF_MEMORY jobs / jobs ended (null: none ended)")
    preemptions_suffered: int = 0
    preemptions_caused: int = 0
    buckets: dict[str, float] | None = Field(None, description="the goodput ledger: GPU-hours per bucket (teams, users)")


class ClusterUsage(Totals):
    cluster: str
    gpus: int
    capacity_gpu_hours: float
    busy_pct: float


class PoolUsage(Totals):
    pool: str
    gpus: int
    capacity_gpu_hours: float
    busy_pct: float


class TeamUsage(Totals):
    team: str
    pool: str
    cohort: str | None = None
    nominal_gpus: int = 0
    borrowing_limit: int | None = None
    lending_limit: int | None = None
    nominal_gpu_hours: float = 0.0
    share_of_pool_pct: float = 0.0
    quota_used_pct: float | None = Field(None, description="allocated / nominal GPU-hours (null: no nominal quota)")
    borrowed_gpu_hours: float = 0.0
    lent_gpu_hours: float = 0.0


class UserUsage(Totals):
    team: str
    user: str


class ClassWait(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    job_class: str = Field(serialization_alias="class")
    attempts: int
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float


class UsageReport(BaseModel):
    start: float
    end: float
    now: float
    config_version: int = Field(description="the configuration whose nodes and quotas the report uses")
    cluster: ClusterUsage
    pools: list[PoolUsage]
    teams: list[TeamUsage]
    users: list[UserUsage]
    users_shown: str = Field(description="'all', a team's name (a member sees their team's users), or 'none'")
    waits: list[ClassWait]


def _bump(t: Totals, *, gpu_s: float = 0.0, lost_s: float = 0.0, cause: str | None = None, ended: int = 0,
          state: str | None = None, jobs: int = 0, preempted: int = 0, caused: int = 0) -> None:
    t.gpu_hours += gpu_s / H
    if lost_s:
        t.lost_gpu_hours += lost_s / H
        t.lost_by_cause[cause or "unknown"] = t.lost_by_cause.get(cause or "unknown", 0.0) + lost_s / H
    t.attempts_ended += ended
    t.preemptions_suffered += preempted
    t.preemptions_caused += caused
    if state is not None:
        t.jobs_ended += jobs
        t.jobs_by_state[state] = t.jobs_by_state.get(state, 0) + jobs


def _finish(t: Totals) -> None:
    t.useful_gpu_hours = t.gpu_hours - t.lost_gpu_hours
    t.oom_rate = t.jobs_by_state.get("OUT_OF_MEMORY", 0) / t.jobs_ended if t.jobs_ended else None


def report(s: Session, cfg: ConfigVersion, by: Principal, win: Window, now: float, *,
           data_dir: Path | None = None) -> UsageReport:
    if by.role == "job":
        raise Forbidden("a job token reads only its own job")
    capacity: dict[str, int] = defaultdict(int)
    for node in cfg.nodes:
        capacity[node.pool] += node.gpus
    seconds = win.seconds
    cluster = ClusterUsage(cluster=cfg.spec.cluster.name, gpus=sum(capacity.values()),
                           capacity_gpu_hours=sum(capacity.values()) * seconds / H, busy_pct=0.0)
    pools: dict[str, PoolUsage] = {}
    teams: dict[tuple[str, str], TeamUsage] = {}
    users: dict[tuple[str, str], UserUsage] = {}
    specs = {t.name: t for t in cfg.spec.teams}

    def pool(name: str) -> PoolUsage:
        if name not in pools:
            g = capacity.get(name, 0)
            pools[name] = PoolUsage(pool=name, gpus=g, capacity_gpu_hours=g * seconds / H, busy_pct=0.0)
        return pools[name]

    def team(name: str, pool_name: str) -> TeamUsage:
        key = (name, pool_name)
        if key not in teams:
            spec = specs.get(name)
            q = spec.quotas.get(pool_name) if spec is not None else None
            teams[key] = TeamUsage(team=name, pool=pool_name, cohort=spec.cohort if spec else None,
                                   nominal_gpus=q.nominal if q else 0, borrowing_limit=q.borrowing_limit if q else None,
                                   lending_limit=q.lending_limit if q else None,
                                   nominal_gpu_hours=(q.nominal if q else 0) * seconds / H)
        return teams[key]

    def user(team_name: str, name: str) -> UserUsage:
        return users.setdefault((team_name, name), UserUsage(team=team_name, user=name))

    for spec in cfg.spec.teams:  # every configured team shows, used or not
        for p in spec.quotas:
            team(spec.name, p)
    for p in capacity:
        pool(p)

    def every(t: str, u: str, p: str) -> Iterable[Totals]:
        return (cluster, pool(p), team(t, p), user(t, u))

    # 1-2. one scan of the attempts that ran in the period: allocation, lost work by cause and
    # preemptions of those that ended in it, the waits of those that started in it, the spans
    scan = _scan(s, win, now)
    for (t, u, p), gpu_s in scan.alloc.items():
        for x in every(t, u, p):
            _bump(x, gpu_s=gpu_s)
    for (t, u, p, cause), (ended, lost) in scan.ended.items():
        for x in every(t, u, p):
            _bump(x, lost_s=lost, cause=cause, ended=ended, preempted=ended if cause == "preempted" else 0)
    # 3. jobs that ended in the period, by final state
    by_state = (select(JobRow.team, JobRow.user, JobRow.pool, JobRow.state, func.count())
                .where(JobRow.end_time >= win.start, JobRow.end_time < win.end)
                .group_by(JobRow.team, JobRow.user, JobRow.pool, JobRow.state))
    for t, u, p, state, jobs in s.execute(by_state):
        for x in every(t, u, p):
            _bump(x, state=state, jobs=jobs)
    # 4. preemptions asked for on behalf of each team's jobs
    wanted: dict[int, int] = defaultdict(int)
    asks = select(EventRow.data).where(EventRow.kind == "job.preempting", EventRow.time >= win.start,
                                       EventRow.time < win.end)
    for (data,) in s.execute(asks):
        jid = (data or {}).get("for_job")
        if isinstance(jid, int):
            wanted[jid] += 1
    if wanted:
        owners = select(JobRow.id, JobRow.team, JobRow.user, JobRow.pool).where(JobRow.id.in_(list(wanted)))
        for jid, t, u, p in s.execute(owners):
            for x in every(t, u, p):
                _bump(x, caused=wanted[jid])
    # 5. borrowing and lending, from the spans
    for (t, p), (borrowed, lent) in lending(scan.spans, teams, win).items():
        team(t, p).borrowed_gpu_hours, team(t, p).lent_gpu_hours = borrowed / H, lent / H
    # 6. the goodput ledger per team and user (data_dir: running attempts' phase files)
    live = goodput_report.pieces(s, win, now, data_dir=data_dir, spec=cfg.spec, running=True)
    for (t, u, p), buckets in [*scan.ledger.items(), *(((x.team, x.user, x.pool), x.buckets) for x in live)]:
        for x in (team(t, p), user(t, u)):
            x.buckets = x.buckets or {b: 0.0 for b in LEDGER_BUCKETS}
            for b, v in buckets.items():
                x.buckets[b] += v / H
    # 7. shares and busy-ness
    for x in [cluster, *pools.values(), *teams.values(), *users.values()]:
        _finish(x)
    cluster.busy_pct = _pct(cluster.gpu_hours, cluster.capacity_gpu_hours) or 0.0
    for pu in pools.values():
        pu.busy_pct = _pct(pu.gpu_hours, pu.capacity_gpu_hours) or 0.0
    for tu in teams.values():
        tu.share_of_pool_pct = _pct(tu.gpu_hours, pool(tu.pool).capacity_gpu_hours) or 0.0
        tu.quota_used_pct = _pct(tu.gpu_hours, tu.nominal_gpu_hours)
    shown, visible = _visible_users(by, users)
    return UsageReport(start=win.start, end=win.end, now=now, config_version=cfg.version, cluster=cluster,
                       pools=sorted(pools.values(), key=lambda x: x.pool),
                       teams=sorted(teams.values(), key=lambda x: (x.team, x.pool)),
                       users=sorted(visible, key=lambda x: (x.team, x.user)), users_shown=shown,
                       waits=scan.waits)


def _pct(part: float, whole: float) -> float | None:
    return 100.0 * part / whole if whole > 0 else None


def _visible_users(by: Principal, users: dict[tuple[str, str], UserUsage]) -> tuple[str, list[UserUsage]]:
    if by.role in ("admin", "operator"):
        return "all", list(users.values())
    if by.role == "member" and by.team:
        return by.team, [u for (t, _), u in users.items() if t == by.team]
    return "none", []


def lending(spans: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
            teams: dict[tuple[str, str], TeamUsage], win: Window) -> dict[tuple[str, str], tuple[float, float]]:
    """(borrowed, lent) GPU-seconds per (team, pool), by a sweep over the attempts' spans (arrays of
    team, pool, GPUs, start, end, all inside the window): between two consecutive starts or ends
    every team's usage is constant, so each stretch is weighed by its length."""
    out: dict[tuple[str, str], tuple[float, float]] = {}
    team_a, pool_a, g_a, start_a, end_a = spans
    for p in sorted(set(pool_a.tolist())):
        here = pool_a == p
        names = sorted(set(team_a[here].tolist()) | {t for (t, pp) in teams if pp == p})
        k = {t: i for i, t in enumerate(names)}
        starts, ends, g = start_a[here], end_a[here], g_a[here]
        who = np.array([k[t] for t in team_a[here].tolist()], dtype=np.int64)
        times = np.unique(np.concatenate([starts, ends, [win.start, win.end]]))
        n_t = len(times)
        # +GPUs at each start, -GPUs at each end, per team (one bincount each: np.add.at is slower)
        cells = len(names) * n_t
        delta = (np.bincount(who * n_t + np.searchsorted(times, starts), weights=g, minlength=cells)
                 - np.bincount(who * n_t + np.searchsorted(times, ends), weights=g, minlength=cells))
        used = np.cumsum(delta.reshape(len(names), n_t), axis=1)[:, :-1]  # on [times[i], times[i+1])
        dt = np.diff(times)
        tu = [teams.get((t, p)) for t in names]
        nominal = np.array([[x.nominal_gpus if x else 0] for x in tu], dtype=float)
        borrowed = np.clip(used - nominal, 0.0, None)
        cap = np.array([[x.lending_limit if x and x.lending_limit is not None else math.inf] for x in tu])
        lendable = np.minimum(np.clip(nominal - used, 0.0, None), cap)
        lent = np.zeros_like(borrowed)
        cohorts: dict[str | None, list[int]] = defaultdict(list)
        for i, x in enumerate(tu):
            cohorts[x.cohort if x else None].append(i)
        for cohort, members in cohorts.items():
            if cohort is None:
                continue
            need = borrowed[members].sum(axis=0)
            can = lendable[members].sum(axis=0)
            frac = np.divide(need, can, out=np.zeros_like(need), where=can > 0)
            lent[members] = lendable[members] * np.minimum(frac, 1.0)
        for t, i in k.items():
            out[(t, p)] = (float((borrowed[i] * dt).sum()), float((lent[i] * dt).sum()))
    return out


@dataclass
class _Scan:
    alloc: dict[tuple[str, str, str], float]  # GPU-seconds in the period per (team, user, pool)
    ended: dict[tuple[str, str, str, str], tuple[int, float]]  # (attempts, lost GPU-s) per (team, user, pool, cause)
    spans: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # team, pool, GPUs, start, end
    waits: list[ClassWait]
    ledger: dict[tuple[str, str, str], dict[str, float]] = field(default_factory=dict)  # ended attempts' buckets


def _ledgers(keys: dict[tuple[str, str, str], int], tup: np.ndarray, done: np.ndarray, g: np.ndarray,
             st: np.ndarray, en: np.ndarray, part: np.ndarray, lost: np.ndarray, first_out: np.ndarray,
             stored: np.ndarray) -> dict[tuple[str, str, str], dict[str, float]]:
    """The ended attempts' goodput buckets in the period, per (team, user, pool), with numpy: a stored
    ledger (`stored`: one row of LEDGER_BUCKETS each, NaN where none) scaled to the part of the run
    inside the period; an attempt without one split from its row as services/goodput_report.py
    splits it (startup to its first output, the rest compute, its lost work recomputed out of
    compute, then startup).
    `tests/services/test_goodput_report.py` keeps the two ways equal."""
    whole = np.where(done, en - st, 0.0)
    frac = np.where(done & (whole > 0), part / np.where(whole > 0, whole, 1.0), 0.0)
    has = ~np.isnan(stored[:, 0])
    out = np.where(has[:, None], np.nan_to_num(stored, nan=0.0), 0.0)
    fo = np.clip(np.where(first_out >= 0, first_out - st, 0.0), 0.0, np.maximum(whole, 0.0))
    startup = g * fo
    rest = g * whole - startup
    recompute = np.minimum(np.maximum(lost, 0.0), g * np.maximum(whole, 0.0))  # out of compute, then startup
    from_compute = np.minimum(recompute, rest)
    i = {b: k for k, b in enumerate(LEDGER_BUCKETS)}
    bare = ~has
    out[bare, i["startup"]] = (startup - (recompute - from_compute))[bare]
    out[bare, i["recompute"]] = recompute[bare]
    out[bare, i["compute"]] = (rest - from_compute)[bare]
    out *= np.where(g > 0, frac, 0.0)[:, None]
    sums = np.stack([np.bincount(tup, weights=out[:, k], minlength=len(keys)) for k in range(len(LEDGER_BUCKETS))],
                    axis=1)
    ended = np.bincount(tup[done], minlength=len(keys))
    return {k: dict(zip(LEDGER_BUCKETS, sums[n].tolist())) for k, n in keys.items() if ended[n]}


def _scan(s: Session, win: Window, now: float) -> _Scan:
    """The attempts that ran during the period (a month of a busy cluster is ~100,000), read once as
    plain rows of as few columns as will do, in (job, attempt) order, and added up with numpy: the
    allocation, the lost work of those that ended in the period, the spans of the borrowing sweep
    and the waits (`accounting.attempt_waits`: the previous attempt is the row before, or, for
    the few whose previous attempt ended before the period, read by job). One read and no
    self-join: a GROUP BY and a second scan joined to the previous attempts cost 3x as much."""
    a, j = AttemptRow, JobRow
    overlap = (a.started_at < win.end, or_(a.ended_at.is_(None), a.ended_at >= win.start))
    # No NULLs come out (times are positive: -1 stands for none), so columns become arrays at once.
    q = (select(a.job_id, a.attempt, j.team, j.user, j.pool, j.job_class, func.coalesce(a.cause, "unknown"),
                func.coalesce(a.gpus, 0), a.started_at, func.coalesce(a.ended_at, -1.0),
                func.coalesce(a.lost_gpu_s, 0.0), j.submit_time, func.coalesce(j.eligible_time, -1.0),
                func.coalesce(a.first_output_at, -1.0), *(a.ledger[b].as_float() for b in LEDGER_BUCKETS))
         .select_from(a).join(j, j.id == a.job_id).where(*overlap).order_by(a.job_id, a.attempt))
    rows = s.connection().execute(q).all()
    if not rows:
        empty = np.zeros(0)
        return _Scan({}, {}, (np.zeros(0, dtype=object), np.zeros(0, dtype=object), empty, empty, empty), [])
    jid, att, team, user, pool, cls, cause, gpus, started, ended, lost, submit, eligible, first_out, *stored = zip(*rows)
    jid_a, att_a = np.array(jid), np.array(att)
    g, st, en, lost_a, sub, elig = (np.array(x, dtype=float) for x in (gpus, started, ended, lost, submit, eligible))
    running = en < 0
    en[running] = math.nan
    a0 = np.maximum(st, win.start)
    b0 = np.minimum(np.where(running, now, en), win.end)
    held = np.where(b0 > a0, g * (b0 - a0), 0.0)
    done = (en >= win.start) & (en < win.end)  # NaN compares False: a running attempt has not ended
    # allocation per (team, user, pool); attempts ended and their lost work per (..., cause)
    keys: dict[tuple[str, str, str], int] = {}
    tup = np.array([keys.setdefault(k, len(keys)) for k in zip(team, user, pool)])
    alloc = dict(zip(keys, np.bincount(tup, weights=held, minlength=len(keys)).tolist()))
    causes: dict[str, int] = {}
    cause_code = np.array([causes.setdefault(c, len(causes)) for c in cause])
    n_c = len(causes)
    cd = (tup * n_c + cause_code)[done]  # one cell per (team, user, pool, cause)
    n_by = np.bincount(cd, minlength=len(keys) * n_c)
    lost_by = np.bincount(cd, weights=lost_a[done], minlength=len(keys) * n_c)
    out_done: dict[tuple[str, str, str, str], tuple[int, float]] = {}
    for k, i in keys.items():
        for c, ci in causes.items():
            if n_by[i * n_c + ci]:
                out_done[(*k, c)] = (int(n_by[i * n_c + ci]), float(lost_by[i * n_c + ci]))
    ledger = _ledgers(keys, tup, done, g, st, en, np.where(done, b0 - a0, 0.0), lost_a,
                      np.array(first_out, dtype=float), np.array(stored, dtype=float).T)
    # the spans inside the period, for the borrowing sweep
    keep = np.nonzero((g > 0) & (b0 > a0))[0]
    team_o, pool_o = np.asarray(team, dtype=object), np.asarray(pool, dtype=object)
    spans = (team_o[keep], pool_o[keep], g[keep], a0[keep], b0[keep])
    # waits of the attempts that started in the period
    starts = np.nonzero((st >= win.start) & (st < win.end))[0]
    first = np.where((elig >= 0) & (elig <= st), elig, sub)
    prev_end = np.full(len(rows), math.nan)
    follows = np.zeros(len(rows), dtype=bool)
    follows[1:] = (jid_a[1:] == jid_a[:-1]) & (att_a[1:] == att_a[:-1] + 1)
    prev_end[1:][follows[1:]] = en[:-1][follows[1:]]
    missing = [i for i in starts.tolist() if att_a[i] > 1 and not follows[i]]
    if missing:
        for i, e in _previous_ends(s, [(int(jid_a[i]), int(att_a[i]) - 1, i) for i in missing]):
            prev_end[i] = e
    base = np.where((att_a > 1) & ~np.isnan(prev_end), prev_end, first)
    waited = np.maximum(st - base, 0.0)
    classes: dict[str, int] = {}
    cls_code = np.array([classes.setdefault(c, len(classes)) for c in cls])[starts]
    out = []
    for c, code in sorted(classes.items()):
        arr = np.sort(waited[starts[cls_code == code]])
        if not len(arr):
            continue
        out.append(ClassWait(job_class=c, attempts=len(arr), mean_s=float(arr.mean()), max_s=float(arr[-1]),
                             **{f"p{q}_s": nearest_rank(arr, q) for q in (50, 90, 99)}))
    return _Scan(alloc, out_done, spans, out, ledger)


def _previous_ends(s: Session, wanted: list[tuple[int, int, int]]) -> Iterable[tuple[int, float]]:
    """(row index, end) of the attempts `wanted` ((job, attempt, row index) each) that ended before
    the period: the previous attempts of jobs whose later attempt started in it."""
    a = AttemptRow
    where = {(jid, att): i for jid, att, i in wanted}
    ids = sorted({jid for jid, _, _ in wanted})
    for k in range(0, len(ids), 500):
        q = select(a.job_id, a.attempt, a.ended_at).where(a.job_id.in_(ids[k:k + 500]))
        for jid, att, e in s.connection().execute(q):
            i = where.get((jid, att))
            if i is not None and e is not None:
                yield i, float(e)


def nearest_rank(sorted_values: Any, q: float) -> float:
    """The q-th percentile by nearest rank: the smallest value with at least q% at or below it."""
    n = len(sorted_values)
    return float(sorted_values[max(0, min(n - 1, math.ceil(q / 100.0 * n) - 1))])
