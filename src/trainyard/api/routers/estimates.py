"""/api/v1/report/estimates: how far the estimated starts were from the actual ones (issue 40).

Per class or team over a period (services/estimates_report.py); aggregates only, for any
principal. Times as in the accounting router.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from trainyard.api.deps import plane, principal, session, storable_input
from trainyard.api.queries import TIME
from trainyard.services import accounting as acct
from trainyard.services import estimates_report
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/api/v1", tags=["estimates"], dependencies=[Depends(storable_input)])


@router.get("/report/estimates", response_model=estimates_report.EstimatesReport)
def report_estimates(start: str | None = Query(None, max_length=100, description=f"period start ({TIME}); "
                                               "default 00:00 yesterday"),
                     end: str | None = Query(None, max_length=100, description=f"period end ({TIME}); default now"),
                     by_: str = Query("class", alias="by", max_length=20, description="class | team"),
                     _by: Principal = Depends(principal), cp: Plane = Depends(plane),
                     s: Session = Depends(session)) -> estimates_report.EstimatesReport:
    """p50/p90 of |actual start - estimate| and the late share of the attempts started in a period."""
    now = cp.clock()
    win = acct.window(start, end, now, default_start=acct.midnight(now, 1), start_field="start", end_field="end")
    return estimates_report.report(s, win, by_)
