"""What the plane itself did to an attempt, so that a failure is blamed on its cause: the signals
it sent, and the rank it saw fail before it signalled anything.

When one rank fails, the loop stops the others (SIGTERM, then SIGKILL: control/loop/stops.py), and
they end by the plane's own signals. Those are consequences. A rank killed from outside (`kill -9`
by another process, the kernel) ended first, by a signal the plane did not send, and it is the
cause (`outcome.first_failure` orders them so). Two facts from the store say which is which:

- `signals_sent`: every signal of the attempt's stop sequence up to the stage it reached (the
  stored `stop_stage`), and the `--signal` notice when it went to this attempt;
- `first_failed`: the rank the loop saw ended before it asked for the stop (`job.rank_failed`,
  recorded with the rank and the attempt when the stop is asked for, so it holds after a restart).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.control.loop.stops import SIGNAL_OF
from trainyard.spec.signals import parse_signal
from trainyard.states import StopKind, StopStage
from trainyard.store.models import EventRow, JobRow

RANK_FAILED_EVENT = "job.rank_failed"


def signals_sent(kind: StopKind | str | None, stage: int, notice: str | None = None) -> frozenset[int]:
    """The signals a stop of `kind` has sent by `stage` (next_stage's sequences: the notice only for
    a stop that checkpoints first, SIGTERM never for a hung job), and `notice` (a `--signal` spec)."""
    sent: set[int] = set()
    if kind is not None:
        kind = StopKind(kind)
        for st in (StopStage.NOTICE, StopStage.TERM, StopStage.KILL):
            if st > stage or (st == StopStage.NOTICE and not kind.checkpoints_first) or \
                    (st == StopStage.TERM and kind == StopKind.HUNG):
                continue
            sent.add(int(SIGNAL_OF[st]))
    if notice:
        sent.add(int(parse_signal(notice).sig))
    return frozenset(sent)


def sent_to(j: JobRow) -> frozenset[int]:
    """The signals the plane sent to the job's current attempt (see `signals_sent`)."""
    notice = j.notice_signal if j.notice_sent_attempt == j.attempt else None
    return signals_sent(j.stop_kind, j.stop_stage or 0, notice)


def first_failed(s: Session, j: JobRow) -> int | None:
    """The rank whose failure made the loop stop the current attempt's other ranks, or None (no such
    stop, or one asked for before the rank was recorded with it)."""
    if j.stop_kind != StopKind.RANK_FAILED:
        return None
    data = s.scalars(select(EventRow.data).where(EventRow.job_id == j.id, EventRow.kind == RANK_FAILED_EVENT)
                     .order_by(EventRow.id.desc()).limit(1)).first() or {}
    rank = data.get("rank")
    return rank if data.get("attempt") == j.attempt and isinstance(rank, int) and not isinstance(rank, bool) else None
