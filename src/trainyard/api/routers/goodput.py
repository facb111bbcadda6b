"""/api/v1/jobs/{id}/goodput and /api/v1/report/goodput: the goodput ledger (issue 39).

A job's breakdown, attempt by attempt (`yard bench scaling` reads it: its shape is kept as it
is), for who may read the job; the ledger per cluster, team, user, node and class over a period,
for `yard report`'s readers (services/goodput_report.py). Times as in the accounting router.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import JobId, plane, principal, session, storable_input
from trainyard.api.queries import TIME
from trainyard.services import accounting as acct
from trainyard.services import goodput_report
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1", tags=["goodput"], dependencies=[Depends(storable_input)])


@router.get("/jobs/{job_id}/goodput", response_model=goodput_report.JobGoodput)
def job_goodput(job_id: JobId, by: Principal = Depends(principal), cp: Plane = Depends(plane),
                s: Session = Depends(session)) -> goodput_report.JobGoodput:
    """Where the job's allocated GPU-seconds went, per bucket and per attempt (a running one live)."""
    return goodput_report.job_goodput(s, cp.data_dir, cp.configs.current(s).spec, job_id, by, cp.clock())


@router.get("/report/goodput", response_model=goodput_report.GoodputReport)
def report_goodput(start: str | None = Query(None, max_length=100, description=f"period start ({TIME}); "
                                             "default 00:00 yesterday"),
                   end: str | None = Query(None, max_length=100, description=f"period end ({TIME}); default now"),
                   by_: str | None = Query(None, alias="by", max_length=200, description="cluster,team,user,node,class"),
                   by: Principal = Depends(principal), cp: Plane = Depends(plane),
                   s: Session = Depends(session)) -> goodput_report.GoodputReport:
    """The ledger per cluster, team, user, node and class over a period (as `yard report`)."""
    now = cp.clock()
    win = acct.window(start, end, now, default_start=acct.midnight(now, 1), start_field="start", end_field="end")
    return goodput_report.report(s, cp.configs.current(s).spec, by, win, now, goodput_report.sections_of(by_),
                                 data_dir=cp.data_dir)
