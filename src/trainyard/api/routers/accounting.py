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
from trainyard.api.queries import TIME, AcctAttemptsQuery, AcctJobsQuery
from trainyard.services import accounting as acct
from trainyard.services import audit, usage_report
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane
from trainyard.services.priority_report import PriorityReport, ShareReport

router = APIRouter(prefix="/api/v1", tags=["accounting"], dependencies=[Depends(storable_input)])


@router.get("/acct/jobs", response_model=acct.AcctJobPage)
def acct_jobs(q: AcctJobsQuery = Depends(), by: Principal = Depends(principal), cp: Plane = Depends(plane),
              s: Session = Depends(session)) -> acct.AcctJobPage:
    """Jobs that were in the system during the window, one record each (sacct)."""
    now = cp.clock()
    return acct.job_page(s, by, q.window(now), now, q.filters(), truncate=q.truncate, after=q.after, limit=q.limit,
                         data_dir=cp.data_dir, spec=cp.configs.current(s).spec)


@router.get("/acct/attempts", response_model=acct.AcctAttemptPage)
def acct_attempts(q: AcctAttemptsQuery = Depends(), by: Principal = Depends(principal), cp: Plane = Depends(plane),
                  s: Session = Depends(session)) -> acct.AcctAttemptPage:
    """Attempts that ran during the window, one record each (sacct --duplicates)."""
    now = cp.clock()
    return acct.attempt_page(s, by, q.window(now), now, q.filters(), truncate=q.truncate, after=q.after,
                             limit=q.limit, data_dir=cp.data_dir, spec=cp.configs.current(s).spec)


@router.get("/report", response_model=usage_report.UsageReport)
def report(start: str | None = Query(None, max_length=100, description=f"period start ({TIME}); default 00:00 "
                                     "yesterday, as sreport"),
           end: str | None = Query(None, max_length=100, description=f"period end ({TIME}); default now "
                                   "when a start is given, else 00:00 today"),
           by: Principal = Depends(principal), cp: Plane = Depends(plane),
           s: Session = Depends(session)) -> usage_report.UsageReport:
    """Usage per cluster, pool, team and user over a period (sreport)."""
    now = cp.clock()
    start, end = (x if x and x.strip() else None for x in (start, end))
    win = acct.window(start, end if end is not None or start is not None else f"@{acct.midnight(now)}", now,
                      default_start=acct.midnight(now, 1), start_field="start", end_field="end")
    return usage_report.report(s, cp.configs.current(s), by, win, now, data_dir=cp.data_dir)


@router.get("/share", response_model=ShareReport)
def share(by: Principal = Depends(reader), cp: Plane = Depends(plane),
          s: Session = Depends(session)) -> ShareReport:
    """Decayed usage, fair-share factor and quota per team and pool (sshare)."""
    return cp.share(s, cp.configs.current(s), cp.clock())


@router.get("/priority", response_model=PriorityReport)
def job_priority(jobs: str | None = Query(None, max_length=2000, description="only these job ids"),
                 by: Principal = Depends(reader), cp: Plane = Depends(plane),
                 s: Session = Depends(session)) -> PriorityReport:
    """The waiting jobs in the engine's order, with the factors of each one's place (sprio)."""
    return cp.priority(s, cp.configs.current(s), cp.clock(), acct.ids_of(jobs))


@router.get("/audit", response_model=audit.AuditPage)
def audit_events(since: str | None = Query(None, max_length=100, description=f"from ({TIME}); default: 7 days ago"),
                 until: str | None = Query(None, max_length=100, description=f"to ({TIME}); default now"),
                 kind: str | None = Query(None, max_length=2000, description="only these kinds"),
                 actor: str | None = Query(None, max_length=2000, description="only these actors"),
                 after: int = Query(0, ge=0, le=MAX_ID), limit: int = Query(1000, ge=1, le=acct.MAX_PAGE),
                 by: Principal = Depends(principal), cp: Plane = Depends(plane),
                 s: Session = Depends(session)) -> audit.AuditPage:
    """Every change (configuration, quotas, tokens, users' job actions, node states) with actor,
    time and before/after, oldest first."""
    now = cp.clock()
    win = acct.window(since, until, now, default_start=now - 7 * acct.DAY_S, start_field="since", end_field="until")
    return audit.page(s, by, win, kinds=acct.split(kind), actors=acct.split(actor), after=after, limit=limit)
