"""/api/v1/acct, /report, /share, /priority, /audit: accounting, fair share, the engine's order and the
audit trail (issue 18).

Times (`starttime`, `endtime`, `start`, `end`, `since`, `until`) are UNIX seconds or text the
server reads in its own time zone (`spec.parsing.parse_time`: now-7days, 2026-11-01T08:00, today…);
the CLI converts in the user's time zone and sends seconds. A bad time, an unknown state or an
end before the start is a 400 naming the parameter; lists (`user`, `team`, `state`…) are
comma-separated. Pages are keyset pages: pass `next_after` back as `after`.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import MAX_ID, plane, principal, reader, session, storable_input
from trainyard.control.reports import priority
from trainyard.control.lifecycle.plane import ControlPlane
from trainyard.services import accounting as acct
from trainyard.services import audit, usage_report
from trainyard.services.auth import Principal

router = APIRouter(prefix="/api/v1", tags=["accounting"], dependencies=[Depends(storable_input)])

TIME = "UNIX seconds, or now-7days, today, 2026-11-01T08:00, 11/01 … (the server's time zone)"


def _filters(jobs: str | None, user: str | None, team: str | None, state: str | None, job_class: str | None,
             pool: str | None, node: str | None) -> acct.Filters:
    return acct.Filters(ids=acct.ids_of(jobs), users=acct.split(user), teams=acct.split(team), states=acct.states_of(state),
                        classes=acct.split(job_class), pools=acct.split(pool), nodes=acct.split(node))


@router.get("/acct/jobs", response_model=acct.AcctJobPage)
def acct_jobs(starttime: str | None = Query(None, max_length=100, description=f"window start ({TIME}); "
                                            "default 00:00 today"),
              endtime: str | None = Query(None, max_length=100, description=f"window end ({TIME}); default now"),
              jobs: str | None = Query(None, max_length=2000, description="job ids, comma-separated"),
              user: str | None = Query(None, max_length=2000), team: str | None = Query(None, max_length=2000),
              state: str | None = Query(None, max_length=2000, description="states or codes: CD,F,OOM,…"),
              job_class: str | None = Query(None, alias="class", max_length=2000),
              pool: str | None = Query(None, max_length=2000), node: str | None = Query(None, max_length=2000),
              truncate: bool = Query(False, description="count only the time inside the window (sacct --truncate)"),
              after: int = Query(0, ge=0, le=MAX_ID, description="the previous page's next_after"),
              limit: int = Query(1000, ge=1, le=acct.MAX_PAGE),
              by: Principal = Depends(principal), cp: ControlPlane = Depends(plane),
              s: Session = Depends(session)) -> acct.AcctJobPage:
    """Jobs that were in the system during the window, one record each (sacct)."""
    now = cp.clock()
    win = acct.window(starttime, endtime, now, default_start=acct.midnight(now))
    return acct.job_page(s, by, win, now, _filters(jobs, user, team, state, job_class, pool, node), truncate=truncate,
                         after=after, limit=limit)


@router.get("/acct/attempts", response_model=acct.AcctAttemptPage)
def acct_attempts(starttime: str | None = Query(None, max_length=100, description=f"window start ({TIME})"),
                  endtime: str | None = Query(None, max_length=100, description=f"window end ({TIME})"),
                  jobs: str | None = Query(None, max_length=2000, description="job ids, comma-separated"),
                  user: str | None = Query(None, max_length=2000), team: str | None = Query(None, max_length=2000),
                  state: str | None = Query(None, max_length=2000, description="the job's state"),
                  job_class: str | None = Query(None, alias="class", max_length=2000),
                  pool: str | None = Query(None, max_length=2000), node: str | None = Query(None, max_length=2000),
                  truncate: bool = False, after: int = Query(0, ge=0, le=MAX_ID),
                  limit: int = Query(1000, ge=1, le=acct.MAX_PAGE),
                  by: Principal = Depends(principal), cp: ControlPlane = Depends(plane),
                  s: Session = Depends(session)) -> acct.AcctAttemptPage:
    """Attempts that ran during the window, one record each (sacct --duplicates)."""
    now = cp.clock()
    win = acct.window(starttime, endtime, now, default_start=acct.midnight(now))
    return acct.attempt_page(s, by, win, now, _filters(jobs, user, team, state, job_class, pool, node),
                             truncate=truncate, after=after, limit=limit)


@router.get("/report", response_model=usage_report.UsageReport)
def report(start: str | None = Query(None, max_length=100, description=f"period start ({TIME}); default 00:00 "
                                     "yesterday, as sreport"),
           end: str | None = Query(None, max_length=100, description=f"period end ({TIME}); default now "
                                   "when a start is given, else 00:00 today"),
           by: Principal = Depends(principal), cp: ControlPlane = Depends(plane),
           s: Session = Depends(session)) -> usage_report.UsageReport:
    """Usage per cluster, pool, team and user over a period (sreport)."""
    now = cp.clock()
    start, end = (x if x and x.strip() else None for x in (start, end))
    win = acct.window(start, end if end is not None or start is not None else f"@{acct.midnight(now)}", now,
                      default_start=acct.midnight(now, 1), start_field="start", end_field="end")
    return usage_report.report(s, cp.configs.current(s), by, win, now)


@router.get("/share", response_model=priority.ShareReport)
def share(by: Principal = Depends(reader), cp: ControlPlane = Depends(plane),
          s: Session = Depends(session)) -> priority.ShareReport:
    """Decayed usage, fair-share factor and quota per team and pool (sshare)."""
    return priority.share(s, cp.configs.current(s), cp.clock())


@router.get("/priority", response_model=priority.PriorityReport)
def job_priority(jobs: str | None = Query(None, max_length=2000, description="only these job ids"),
                 by: Principal = Depends(reader), cp: ControlPlane = Depends(plane),
                 s: Session = Depends(session)) -> priority.PriorityReport:
    """The waiting jobs in the engine's order, with the factors of each one's place (sprio)."""
    return priority.priority(s, cp.configs.current(s), cp.clock(), acct.ids_of(jobs))


@router.get("/audit", response_model=audit.AuditPage)
def audit_events(since: str | None = Query(None, max_length=100, description=f"from ({TIME}); default: 7 days ago"),
                 until: str | None = Query(None, max_length=100, description=f"to ({TIME}); default now"),
                 kind: str | None = Query(None, max_length=2000, description="only these kinds"),
                 actor: str | None = Query(None, max_length=2000, description="only these actors"),
                 after: int = Query(0, ge=0, le=MAX_ID), limit: int = Query(1000, ge=1, le=acct.MAX_PAGE),
                 by: Principal = Depends(principal), cp: ControlPlane = Depends(plane),
                 s: Session = Depends(session)) -> audit.AuditPage:
    """Every change (configuration, quotas, tokens, users' job actions, node states) with actor,
    time and before/after, oldest first."""
    now = cp.clock()
    win = acct.window(since, until, now, default_start=now - 7 * acct.DAY_S, start_field="since", end_field="until")
    return audit.page(s, by, win, kinds=acct.split(kind), actors=acct.split(actor), after=after, limit=limit)
