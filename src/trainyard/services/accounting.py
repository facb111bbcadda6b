"""Accounting, job by job: where every GPU-hour went (`yard acct`, `GET /api/v1/acct/jobs|attempts`).

sacct's habits: jobs in a time window (`starttime`, `endtime`; sacct's default window is today,
from 00:00 to now), filtered by user, team (sacct's account), state, class (its QOS), pool (its
partition) and node; one record per job or, with `attempts`, per attempt (a requeued or retried
job has several, as sacct shows with `--duplicates`). A job is in the window when it was in the
system during it: submitted before the window's end and not ended before its start (pending and
running jobs have not ended). An attempt is in it when it ran during it.

What the figures mean (one definition each, shared with `yard report`, the metrics and the
dashboard):
- GPU-hours (allocated): each attempt holds `attempts.gpus` GPUs from its start to its end (a
  running one: to now). `truncate` (sacct's `--truncate`) counts only the part inside the window,
  as `yard report` does; without it a job's whole attempts count, as sacct reports them.
- lost GPU-hours: the work thrown away when an attempt ended (`attempts.lost_gpu_s`, measured by
  `control/rules/lost_work.py` from the runtime's step records: training time since the last
  checkpoint), by the attempt's cause. With `truncate`, only attempts that ended in the window.
- useful GPU-hours: allocated minus lost.
- the goodput ledger (`ledger`, GPU-hours per bucket of `contracts.LEDGER_BUCKETS`, adding up to
  the allocated GPU-hours; `goodput`: the compute share): services/goodput_report.py's, an ended
  attempt's stored ledger, a running one's split live. With `truncate`, each attempt's buckets
  scaled to the part of its run inside the window.
- wait: an attempt waits from the job's eligible time (Slurm's EligibleTime; its submission when
  the eligible time is not known or came later) for the first attempt, from the previous attempt's
  end for the others (`attempt_waits`); a job's wait is its attempts' waits, plus the wait so far
  of a job still pending. The metrics' `trainyard_queue_wait_seconds` counts the same (`wait_base`).
- elapsed: the attempts' run times, added up (a job that ran twice ran for both).

Who sees what (sacct with PrivateData=jobs,usage): admins and operators every job; a member only
their team's (asking for another team is refused, naming `team`); a viewer no job records, only
the totals `yard report` gives; a job token nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import ColumnElement, and_, case, func, or_, select
from sqlalchemy.orm import Session, aliased

from trainyard.spec.parsing import parse_time
from trainyard.services import goodput, goodput_report
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, ServiceError
from trainyard.services.telemetry import acct_figures
from trainyard.states import ALL_STATES, PENDING_STATES, STATE_CODES
from trainyard.store.models import AttemptRow, JobRow

MAX_PAGE = 10_000
DAY_S = 86400.0


# -- the window ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Window:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


def read_time(value: str | float | None, now: float, field: str) -> float | None:
    """A time from the API or the CLI (`spec.parsing.parse_time`); a bad one is a 400 naming `field`."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        return parse_time(value, now)
    except ValueError as e:
        raise ServiceError(f"{field}: {e}", field=field) from None


def window(start: str | float | None, end: str | float | None, now: float, *, default_start: float,
           start_field: str = "starttime", end_field: str = "endtime") -> Window:
    """The window from two times (None: `default_start` and now). An end before the start is a
    400 naming the end's field; nothing is read."""
    s = read_time(start, now, start_field)
    e = read_time(end, now, end_field)
    s = default_start if s is None else s
    e = now if e is None else e
    if e < s:
        raise ServiceError(f"{end_field} ({_iso(e)}) is before {start_field} ({_iso(s)})", field=end_field)
    return Window(s, e)


def midnight(now: float, days_back: int = 0) -> float:
    """00:00 local time of today (or `days_back` days before): sacct's and sreport's defaults."""
    import datetime as dt

    d = dt.datetime.fromtimestamp(now).astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
    return (d - dt.timedelta(days=days_back)).timestamp()


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")


# -- waits: one definition --------------------------------------------------------------------------

def first_wait_base(submit_time: float, eligible_time: float | None, started_at: float) -> float:
    """Where the first attempt's wait starts: the eligible time when it is known and not after the
    start (a later one belongs to a later release), else the submission."""
    return eligible_time if eligible_time is not None and eligible_time <= started_at else submit_time


def attempt_waits(submit_time: float, eligible_time: float | None,
                  attempts: Sequence[tuple[float, float | None]]) -> list[float]:
    """The wait of each attempt ((start, end) pairs in attempt order), as the module docstring says."""
    out, prev_end = [], None
    for i, (started, ended) in enumerate(attempts):
        base = first_wait_base(submit_time, eligible_time, started) if i == 0 or prev_end is None else prev_end
        out.append(max(0.0, started - base))
        prev_end = ended
    return out


def wait_base(prev_ended_at: Any, job: Any = JobRow, attempt: Any = AttemptRow) -> ColumnElement[float]:
    """`attempt_waits`' base as SQL, for a query that joins the attempt, its job and the previous
    attempt (`prev_ended_at`: that attempt's `ended_at`, NULL for a first attempt)."""
    first = case((and_(job.eligible_time.is_not(None), job.eligible_time <= attempt.started_at), job.eligible_time),
                 else_=job.submit_time)
    return func.coalesce(prev_ended_at, first)


# -- the records (the API's typed responses) ---------------------------------------------------------

class AcctAttempt(BaseModel):
    """One attempt of a job: a start on a placement, until it ended (or now, while it runs)."""

    model_config = ConfigDict(populate_by_name=True)

    job_id: int
    attempt: int
    name: str
    user: str
    team: str
    job_class: str = Field(serialization_alias="class")
    pool: str
    state: str = Field(description="how the attempt ended (RUNNING while it runs)")
    cause: str = Field(description="why it ended: completed, preempted, node_lost, hung, oom, crash, ...")
    reason: str
    exit_code: int | None
    signal: int | None
    start: float
    end: float | None
    elapsed_s: float
    wait_s: float = Field(description="from eligible (or the previous attempt's end) to this start")
    nnodes: int
    nodelist: list[str]
    gpus: int
    gpu_hours: float
    lost_gpu_hours: float = Field(description="work since the last checkpoint thrown away when it ended")
    useful_gpu_hours: float
    ledger: dict[str, float] = Field(default_factory=dict, description="GPU-hours per goodput bucket")
    goodput: float | None = Field(None, description="the compute share of the allocated GPU-hours")
    max_rss_mib: float | None = Field(None, description="as the in-job runtime reported it (rank 0)")
    peak_gpu_mem_mib: float | None = None
    image: str | None = Field(None, description="the job's image (None: it ran bare)")
    image_digest: str | None = Field(None, description="the image digest this attempt ran")
    gpu_util_mean: float | None = Field(None, description="GPU utilization %, mean over its GPUs' readings (telemetry)")
    gpu_util_peak: float | None = Field(None, description="the highest utilization % a GPU of it read")
    gpu_mem_peak_mib: float | None = Field(None, description="the most memory a GPU of it held (telemetry)")


class AcctJob(BaseModel):
    """One job over all its attempts (in the window, when truncated)."""

    model_config = ConfigDict(populate_by_name=True)

    id: int
    name: str
    user: str
    team: str
    job_class: str = Field(serialization_alias="class")
    pool: str
    state: str
    reason: str
    exit_code: int | None
    signal: int | None
    cause: str = Field(description="why its last attempt ended ('' if it never ran)")
    submit: float
    eligible: float | None
    start: float | None = Field(description="its first attempt's start")
    end: float | None
    elapsed_s: float = Field(description="its attempts' run times, added up")
    wait_s: float = Field(description="its attempts' waits, plus the wait so far of a job still pending")
    time_limit_s: float | None
    nnodes: int = Field(description="nodes of its last attempt")
    nodelist: list[str]
    gpus: int = Field(description="GPUs of its last attempt (0 if it never ran)")
    req_gpus: int
    gpu_hours: float
    useful_gpu_hours: float
    lost_gpu_hours: float
    lost_by_cause: dict[str, float] = Field(description="lost GPU-hours by the cause of the attempt that lost them")
    ledger: dict[str, float] = Field(default_factory=dict, description="GPU-hours per goodput bucket")
    goodput: float | None = Field(None, description="the compute share of the allocated GPU-hours")
    attempts: int
    retries: int
    max_rss_mib: float | None = None
    peak_gpu_mem_mib: float | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    image: str | None = Field(None, description="its image (None: a bare job)")
    image_digest: str | None = Field(None, description="the digest its first attempt pinned, which every attempt ran")
    gpu_util_mean: float | None = Field(None, description="GPU utilization %, mean over its GPUs' readings (telemetry)")
    gpu_util_peak: float | None = Field(None, description="the highest utilization % a GPU of it read")
    gpu_mem_peak_mib: float | None = Field(None, description="the most memory a GPU of it held (telemetry)")


class AcctJobPage(BaseModel):
    start: float
    end: float
    jobs: list[AcctJob]
    next_after: int | None = Field(description="pass as `after` for the next page; null: this was the last")


class AcctAttemptPage(BaseModel):
    start: float
    end: float
    attempts: list[AcctAttempt]
    next_after: int | None = Field(description="pass as `after` for the next page; null: this was the last")


# -- filters and who may read -------------------------------------------------------------------------

@dataclass(frozen=True)
class Filters:
    ids: tuple[int, ...] = ()  # jobs by id (sacct -j)
    users: tuple[str, ...] = ()
    teams: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()
    pools: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()


def split(text: str | None) -> tuple[str, ...]:
    """A comma-separated list (sacct's `-u a,b`), empty parts dropped."""
    return tuple(dict.fromkeys(x.strip() for x in (text or "").split(",") if x.strip()))


def states_of(text: str | None) -> tuple[str, ...]:
    """States by name or squeue/sacct code (CD, F, PD…), any case; an unknown one is a 400 naming `state`."""
    out = []
    for name in split(text):
        full = str(STATE_CODES.get(name.upper(), name.upper()))
        if full not in ALL_STATES:
            raise ServiceError(f"unknown state {name!r}; states are {[str(x) for x in ALL_STATES]} "
                               f"(or the codes {', '.join(STATE_CODES)})", field="state")
        out.append(full)
    return tuple(dict.fromkeys(out))


def scoped(by: Principal, f: Filters) -> Filters:
    """The filters `by` may read with: a member's are narrowed to their team.

    Raises:
        Forbidden: a viewer or job token (no job records), or a member asking for another team.
    """
    if by.role in ("admin", "operator"):
        return f
    if by.role == "member" and by.team:
        other = [t for t in f.teams if t != by.team]
        if other:
            raise Forbidden(f"a member of team {by.team!r} reads only their team's job records, not {other[0]!r} "
                            "(the totals of every team: yard report)", field="team")
        return Filters(f.ids, f.users, (by.team,), f.states, f.classes, f.pools, f.nodes)
    if by.role == "viewer":
        raise Forbidden("a viewer reads totals only (yard report, GET /api/v1/report), not job records")
    raise Forbidden("a job token reads only its own job")


def ids_of(text: str | None) -> tuple[int, ...]:
    """Job ids, comma-separated (sacct's `-j 12,13`); anything else is a 400 naming `jobs`."""
    out = []
    for x in split(text):
        if not (x.isascii() and x.isdigit()) or not 1 <= int(x) <= 2**31 - 1:
            raise ServiceError(f"jobs: {x[:40]!r} is not a job id", field="jobs")
        out.append(int(x))
    return tuple(out)


def _filtered(q: Any, f: Filters) -> Any:
    if f.ids:
        q = q.where(JobRow.id.in_(f.ids))
    for col, values in ((JobRow.user, f.users), (JobRow.team, f.teams), (JobRow.state, f.states),
                        (JobRow.job_class, f.classes), (JobRow.pool, f.pools)):
        if values:
            q = q.where(col.in_(values))
    return q


def _page_size(limit: int) -> int:
    return max(1, min(int(limit), MAX_PAGE))


# -- jobs ---------------------------------------------------------------------------------------------

_JOB_COLUMNS = (JobRow.id, JobRow.name, JobRow.user, JobRow.team, JobRow.job_class, JobRow.pool, JobRow.state,
                JobRow.reason, JobRow.exit_code, JobRow.signal, JobRow.submit_time, JobRow.eligible_time,
                JobRow.end_time, JobRow.time_limit_s, JobRow.gpus, JobRow.retries, JobRow.attempt,
                JobRow.queued_since, JobRow.array_job_id, JobRow.array_task_id, JobRow.container, JobRow.image_digest,
                JobRow.dir_key, JobRow.stop_kind, JobRow.stop_since, JobRow.tasks_per_node)
_ATTEMPT_COLUMNS = (AttemptRow.job_id, AttemptRow.attempt, AttemptRow.placement, AttemptRow.started_at,
                    AttemptRow.ended_at, AttemptRow.gpus, AttemptRow.cause, AttemptRow.lost_gpu_s,
                    AttemptRow.max_rss_mib, AttemptRow.peak_gpu_mem_mib, AttemptRow.state, AttemptRow.reason,
                    AttemptRow.exit_code, AttemptRow.signal, AttemptRow.image_digest, AttemptRow.gpu_summary,
                    AttemptRow.ledger, AttemptRow.first_output_at)


def in_window(win: Window) -> tuple[ColumnElement[bool], ...]:
    """A job was in the system during the window: submitted before its end, not ended before its start."""
    return (JobRow.submit_time <= win.end, or_(JobRow.end_time.is_(None), JobRow.end_time >= win.start))


def job_page(s: Session, by: Principal, win: Window, now: float, f: Filters = Filters(), *, truncate: bool = False,
             after: int = 0, limit: int = 1000, data_dir: Path | None = None, spec: Any = None) -> AcctJobPage:
    """Up to `limit` jobs in the window with ids above `after`, in id order (keyset pages: a page
    costs the same wherever it starts). `data_dir` and `spec`: the running attempts' phase files
    and the classes' idle thresholds, for their live ledger."""
    f = scoped(by, f)
    n = _page_size(limit)
    q = _filtered(select(*_JOB_COLUMNS).where(JobRow.id > after, *in_window(win)), f).order_by(JobRow.id).limit(n)
    jobs = s.execute(q).all()
    tries: dict[int, list[Any]] = {}
    if jobs:
        aq = (select(*_ATTEMPT_COLUMNS).where(AttemptRow.job_id.in_([j.id for j in jobs]))
              .order_by(AttemptRow.job_id, AttemptRow.attempt))
        for a in s.execute(aq):
            tries.setdefault(a.job_id, []).append(a)
    out = []
    for j in jobs:
        ref = goodput_report.JobRef(j.id, j.dir_key, j.stop_kind, j.stop_since, j.attempt, j.tasks_per_node,
                                    j.job_class)
        ledgers = [_ledger(s, a, ref, win, now, truncate, data_dir, spec) for a in tries.get(j.id, [])]
        rec = _job_record(j, tries.get(j.id, []), win, now, truncate, ledgers)
        if f.nodes and not set(f.nodes) & {p["node"] for a in tries.get(j.id, []) for p in a.placement or []}:
            continue
        out.append(rec)
    return AcctJobPage(start=win.start, end=win.end, jobs=out,
                       next_after=jobs[-1].id if len(jobs) == n else None)


class _Ran(Protocol):
    """What `_span` and `_lost_counts` read of an attempt (a row of `_ATTEMPT_COLUMNS`)."""
    @property
    def started_at(self) -> float: ...
    @property
    def ended_at(self) -> float | None: ...


def _span(a: _Ran, win: Window, now: float, truncate: bool) -> float:
    end = now if a.ended_at is None else a.ended_at
    if truncate:
        return max(0.0, min(end, win.end) - max(a.started_at, win.start))
    return max(0.0, end - a.started_at)


def _lost_counts(a: _Ran, win: Window, truncate: bool) -> bool:
    """Whether the attempt's lost work counts: it ended, and (truncated) ended inside the window
    [start, end), as `yard report` counts it."""
    return a.ended_at is not None and (not truncate or win.start <= a.ended_at < win.end)


def _nodes(placement: Iterable[dict[str, Any]] | None) -> list[str]:
    return list(dict.fromkeys(p["node"] for p in placement or []))


def _image(container: dict[str, Any] | None) -> str | None:
    """The image of a job's `container` record (`spec.container.ContainerOptions.to_record()`)."""
    return container.get("image") if isinstance(container, dict) else None


def _peak(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return max(xs) if xs else None


def _ledger(s: Session, a: Any, job: Any, win: Window, now: float, truncate: bool, data_dir: Path | None,
            spec: Any) -> dict[str, float]:
    """The attempt's goodput buckets in GPU-seconds, over the part of its run that counts."""
    return goodput_report.in_period(s, a, job, _span(a, win, now, truncate), now, data_dir=data_dir, spec=spec)


def _hours(buckets: dict[str, float]) -> dict[str, float]:
    return {k: v / 3600.0 for k, v in buckets.items()}


def _job_record(j: Any, tries: list[Any], win: Window, now: float, truncate: bool,
                ledgers: list[dict[str, float]]) -> AcctJob:
    total = goodput.empty()
    for b in ledgers:
        for k, v in b.items():
            total[k] += v
    gpu_s = run_s = lost_s = 0.0
    lost_by: dict[str, float] = {}
    for a in tries:
        span = _span(a, win, now, truncate)
        run_s += span
        gpu_s += a.gpus * span
        if a.lost_gpu_s and _lost_counts(a, win, truncate):
            lost_s += a.lost_gpu_s
            lost_by[a.cause or "unknown"] = lost_by.get(a.cause or "unknown", 0.0) + a.lost_gpu_s / 3600.0
    waits = attempt_waits(j.submit_time, j.eligible_time, [(a.started_at, a.ended_at) for a in tries])
    wait = sum(waits)
    if j.state in PENDING_STATES:  # waiting now: since the last attempt's end, or since it became eligible
        since = tries[-1].ended_at if tries and tries[-1].ended_at is not None else \
            (j.eligible_time if not tries else None)
        if since is not None:
            wait += max(0.0, now - since)
    last = tries[-1] if tries else None
    start = tries[0].started_at if tries else None
    end = j.end_time
    if truncate:
        start = None if start is None else max(start, win.start)
        end = None if end is None else min(end, win.end)
    nodes = _nodes(last.placement) if last is not None else []
    return AcctJob(
        id=j.id, name=j.name, user=j.user, team=j.team, job_class=j.job_class, pool=j.pool, state=j.state,
        reason=j.reason, exit_code=j.exit_code, signal=j.signal, cause=last.cause if last is not None else "",
        submit=j.submit_time, eligible=j.eligible_time, start=start, end=end, elapsed_s=run_s, wait_s=wait,
        time_limit_s=j.time_limit_s, nnodes=len(nodes), nodelist=nodes, gpus=last.gpus if last is not None else 0,
        req_gpus=j.gpus, gpu_hours=gpu_s / 3600.0, useful_gpu_hours=(gpu_s - lost_s) / 3600.0,
        lost_gpu_hours=lost_s / 3600.0, lost_by_cause=lost_by, ledger=_hours(total), goodput=goodput.share(total),
        attempts=len(tries), retries=j.retries,
        max_rss_mib=_peak(a.max_rss_mib for a in tries), peak_gpu_mem_mib=_peak(a.peak_gpu_mem_mib for a in tries),
        array_job_id=j.array_job_id, array_task_id=j.array_task_id, image=_image(j.container),
        image_digest=j.image_digest, **acct_figures(a.gpu_summary for a in tries))


# -- attempts -----------------------------------------------------------------------------------------

def attempt_page(s: Session, by: Principal, win: Window, now: float, f: Filters = Filters(), *,
                 truncate: bool = False, after: int = 0, limit: int = 1000, data_dir: Path | None = None,
                 spec: Any = None) -> AcctAttemptPage:
    """Up to `limit` attempts that ran during the window, above the cursor `after` (an attempt's
    row id), in that order."""
    f = scoped(by, f)
    n = _page_size(limit)
    prev = aliased(AttemptRow)
    q = (select(AttemptRow.id.label("row_id"), *_ATTEMPT_COLUMNS, JobRow.name, JobRow.user, JobRow.team,
                JobRow.job_class, JobRow.pool, JobRow.submit_time, JobRow.eligible_time, JobRow.container,
                JobRow.tasks_per_node, JobRow.dir_key, JobRow.stop_kind, JobRow.stop_since,
                JobRow.attempt.label("job_attempt"), wait_base(prev.ended_at).label("wait_from"))
         .join(JobRow, JobRow.id == AttemptRow.job_id)
         .outerjoin(prev, and_(prev.job_id == AttemptRow.job_id, prev.attempt == AttemptRow.attempt - 1))
         .where(AttemptRow.id > after, AttemptRow.started_at <= win.end,
                or_(AttemptRow.ended_at.is_(None), AttemptRow.ended_at >= win.start)))
    rows = s.execute(_filtered(q, f).order_by(AttemptRow.id).limit(n)).all()
    out = []
    for a in rows:
        nodes = _nodes(a.placement)
        if f.nodes and not set(f.nodes) & set(nodes):
            continue
        span = _span(a, win, now, truncate)
        lost = a.lost_gpu_s if _lost_counts(a, win, truncate) else 0.0
        ledger = _ledger(s, a, goodput_report.job_ref(a), win, now, truncate, data_dir, spec)
        start, end = a.started_at, a.ended_at
        if truncate:
            start, end = max(start, win.start), None if end is None else min(end, win.end)
        out.append(AcctAttempt(
            job_id=a.job_id, attempt=a.attempt, name=a.name, user=a.user, team=a.team, job_class=a.job_class,
            pool=a.pool, state=a.state, cause=a.cause, reason=a.reason, exit_code=a.exit_code, signal=a.signal,
            start=start, end=end, elapsed_s=span, wait_s=max(0.0, a.started_at - a.wait_from), nnodes=len(nodes),
            nodelist=nodes, gpus=a.gpus, gpu_hours=a.gpus * span / 3600.0, lost_gpu_hours=lost / 3600.0,
            useful_gpu_hours=(a.gpus * span - lost) / 3600.0, ledger=_hours(ledger), goodput=goodput.share(ledger),
            max_rss_mib=a.max_rss_mib,
            peak_gpu_mem_mib=a.peak_gpu_mem_mib, image=_image(a.container), image_digest=a.image_digest,
            **acct_figures([a.gpu_summary])))
    return AcctAttemptPage(start=win.start, end=win.end, attempts=out,
                           next_after=rows[-1].row_id if len(rows) == n else None)
