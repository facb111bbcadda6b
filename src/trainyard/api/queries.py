"""The query parameters of the routes that take many, as dataclasses a route depends on (`Depends()`).

FastAPI reads a dataclass's fields as it reads a function's parameters (names, aliases, bounds,
descriptions: the OpenAPI schema is the same), so a route keeps its signature short and its body
one call. Accounting times are `TIME` (see api/routers/accounting.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Query

from trainyard.api.deps import MAX_ID
from trainyard.services import accounting as acct
from trainyard.services import job_logs

TIME = "UNIX seconds, or now-7days, today, 2026-11-01T08:00, 11/01 … (the server's time zone)"


@dataclass
class AcctAttemptsQuery:
    """`GET /api/v1/acct/attempts` (sacct --duplicates)."""

    starttime: str | None = Query(None, max_length=100, description=f"window start ({TIME})")
    endtime: str | None = Query(None, max_length=100, description=f"window end ({TIME})")
    jobs: str | None = Query(None, max_length=2000, description="job ids, comma-separated")
    user: str | None = Query(None, max_length=2000)
    team: str | None = Query(None, max_length=2000)
    state: str | None = Query(None, max_length=2000, description="the job's state")
    job_class: str | None = Query(None, alias="class", max_length=2000)
    pool: str | None = Query(None, max_length=2000)
    node: str | None = Query(None, max_length=2000)
    truncate: bool = False
    after: int = Query(0, ge=0, le=MAX_ID)
    limit: int = Query(1000, ge=1, le=acct.MAX_PAGE)

    def filters(self) -> acct.Filters:
        return acct.Filters(ids=acct.ids_of(self.jobs), users=acct.split(self.user), teams=acct.split(self.team),
                            states=acct.states_of(self.state), classes=acct.split(self.job_class),
                            pools=acct.split(self.pool), nodes=acct.split(self.node))

    def window(self, now: float) -> acct.Window:
        return acct.window(self.starttime, self.endtime, now, default_start=acct.midnight(now))


@dataclass
class AcctJobsQuery(AcctAttemptsQuery):
    """`GET /api/v1/acct/jobs` (sacct): the same, described as sacct's job records."""

    starttime: str | None = Query(None, max_length=100, description=f"window start ({TIME}); default 00:00 today")
    endtime: str | None = Query(None, max_length=100, description=f"window end ({TIME}); default now")
    jobs: str | None = Query(None, max_length=2000, description="job ids, comma-separated")
    user: str | None = Query(None, max_length=2000)
    team: str | None = Query(None, max_length=2000)
    state: str | None = Query(None, max_length=2000, description="states or codes: CD,F,OOM,…")
    job_class: str | None = Query(None, alias="class", max_length=2000)
    pool: str | None = Query(None, max_length=2000)
    node: str | None = Query(None, max_length=2000)
    truncate: bool = Query(False, description="count only the time inside the window (sacct --truncate)")
    after: int = Query(0, ge=0, le=MAX_ID, description="the previous page's next_after")
    limit: int = Query(1000, ge=1, le=acct.MAX_PAGE)


@dataclass
class JobsQuery:
    """`GET /api/v1/jobs` (squeue)."""

    state: str | None = Query(None, description="comma-separated states or squeue codes, e.g. PENDING,RUNNING or "
                              "PD,R; 'all' for every state")
    team: str | None = None
    user: str | None = None
    job_class: str | None = Query(None, alias="class")
    active: bool = Query(False, description="only pending and running jobs (what squeue shows)")
    limit: int = Query(100_000, ge=1, le=100_000)
    array: int | None = Query(None, ge=1, le=2**62, description="only the tasks of this job array")
    fields: str | None = Query(None, max_length=1000, description="comma-separated keys to return, e.g. "
                               "id,state,reason (default: all)")


@dataclass
class LogQuery:
    """`GET /api/v1/jobs/{id}/logs`: which rank, which bytes, and whether to follow."""

    rank: int = Query(0, ge=0, le=1_000_000)
    offset: int = Query(0, ge=-(2**62), le=2**62, description="byte to start from; negative: that many bytes "
                        "before the end (the log's tail)")
    limit: int = Query(job_logs.PAGE_MAX, ge=0, le=job_logs.PAGE_MAX, description="bytes at most (a page); the "
                       "X-Log-Next-Offset header says where the next page starts, X-Log-Size how big the log is")
    follow: bool = False
