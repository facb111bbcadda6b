"""How good the start-time estimates were: `yard report estimates`, `GET /api/v1/report/estimates`.

Over the attempts that started in a period after being given an estimate (`estimate_outcomes`,
services/estimates.py), per class (or team) and for the whole cluster: how many, the p50 and p90 of
|actual start − first estimate| (nearest rank, as the other reports), the share that started more
than `sim.result.LATE_AFTER_S` after it (the simulator's figure too), the mean signed error (positive: late on the whole), and the
same p50/p90 for the last estimate before the start. Aggregates only: no job or user is named, so
any principal may read it.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services.accounting import Window
from trainyard.services.errors import ServiceError
from trainyard.sim.result import LATE_AFTER_S
from trainyard.services.usage_report import nearest_rank
from trainyard.store.models import EstimateOutcomeRow

BY = ("class", "team")


class ErrorRow(BaseModel):
    key: str = Field(description="the class's or team's name; '(all)' for every start of the period")
    starts: int = Field(description="attempts that started after being given an estimate")
    p50_abs_error_s: float = Field(description="p50 of |actual start - first estimate|")
    p90_abs_error_s: float
    late_share: float = Field(description=f"share that started more than {LATE_AFTER_S:.0f} s after the first estimate")
    mean_error_s: float = Field(description="mean of actual start - first estimate (positive: late)")
    p50_abs_last_error_s: float = Field(description="p50 of |actual start - last estimate|")
    p90_abs_last_error_s: float


class EstimatesReport(BaseModel):
    start: float
    end: float
    by: str
    late_after_s: float = LATE_AFTER_S
    rows: list[ErrorRow] = Field(description="one per class (or team), then '(all)'")


def row_of(key: str, errors: list[float], last_errors: list[float]) -> ErrorRow:
    """The figures of one group: `errors` and `last_errors` are actual − estimate, one per start."""
    a = sorted(abs(e) for e in errors)
    b = sorted(abs(e) for e in last_errors)
    return ErrorRow(key=key, starts=len(errors), p50_abs_error_s=nearest_rank(a, 50), p90_abs_error_s=nearest_rank(a, 90),
                    late_share=sum(1 for e in errors if e > LATE_AFTER_S) / len(errors),
                    mean_error_s=sum(errors) / len(errors), p50_abs_last_error_s=nearest_rank(b, 50),
                    p90_abs_last_error_s=nearest_rank(b, 90))


def report(s: Session, win: Window, by: str = "class") -> EstimatesReport:
    """The estimate errors of the attempts that started in `win` (start inclusive, end exclusive).

    Raises:
        ServiceError: `by` is not one of `BY` (a 400 naming `by`).
    """
    if by not in BY:
        raise ServiceError(f"by: {by[:40]!r} is not one of {', '.join(BY)}", field="by")
    t = EstimateOutcomeRow
    col = t.job_class if by == "class" else t.team
    q = select(col, t.error_s, t.last_error_s).where(t.started_at >= win.start, t.started_at < win.end)
    groups: dict[str, tuple[list[float], list[float]]] = {}
    every: tuple[list[float], list[float]] = ([], [])
    for key, err, last in s.execute(q):
        g = groups.setdefault(key, ([], []))
        for lists in (g, every):
            lists[0].append(err)
            lists[1].append(last)
    rows = [row_of(k, *v) for k, v in sorted(groups.items())]
    if every[0]:
        rows.append(row_of("(all)", *every))
    return EstimatesReport(start=win.start, end=win.end, by=by, rows=rows)
