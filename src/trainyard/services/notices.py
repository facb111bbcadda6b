"""What a job's `--mail-type` asks to hear, noted in the transaction that makes it happen and
handed on only once that transaction commits.

The job's transitions (`services/transitions.py`) call `note(j, kind, now)`; the note waits in
the session (`Session.info`) and `attach`'s listener gives it to the plane's notifier
(`control/lifecycle/notify.py`) after the commit, in commit order, or drops it with a rollback. So a
webhook never hears of a start that was rolled back, and the loop never waits for a receiver:
the listener only puts the notes on a queue. Kinds noted (the notifier decides, from the job's
mail types, what is sent):

    begin            an attempt started (BEGIN; the TIME_LIMIT_NN clocks start)
    time_limit       the plane is stopping it at its time limit (TIME_LIMIT)
    requeue          it went back to the queue (REQUEUE)
    invalid_depend   its dependency can never be met (INVALID_DEPEND)
    end              it ended for good (END, or FAIL when it failed)
    idle_warning     an idle job's class's idle policy acts on it soon (issue 39, spec/idle.py;
                     an allocation's IdleTimeout, issue 38; control/loop/idle_actions.py)
    idle             it has been idle `after`: notified, requeued or cancelled (`idle_action`)
                     Both are noted whatever the job's mail types (`always`), since `yard alloc`
                     asks for none and the owner should hear before losing the GPUs
"""

from __future__ import annotations

import time
from typing import Any, Callable

from sqlalchemy import event
from sqlalchemy.orm import Session, object_session, sessionmaker

from trainyard.store.models import JobRow

KEY = "trainyard.notices"


def payload(j: JobRow, kind: str, now: float) -> dict[str, Any]:
    """The facts of `j` as they are now (after the transition), for the webhook's JSON."""
    return {"kind": kind, "job_id": j.id, "array_job_id": j.array_job_id, "array_task_id": j.array_task_id,
            "name": j.name, "user": j.user, "team": j.team, "class": j.job_class, "pool": j.pool,
            "state": str(j.state), "reason": j.reason, "exit_code": j.exit_code, "signal": j.signal,
            "attempt": j.attempt, "mail_type": j.mail_type, "mail_user": j.mail_user or j.user,
            "submit_time": j.submit_time, "start_time": j.start_time, "end_time": j.end_time,
            "time_limit_s": j.time_limit_s, "time": now}


def note(j: JobRow, kind: str, now: float, s: Session | None = None, *, always: bool = False,
         extra: dict[str, Any] | None = None) -> None:
    """Note `kind` for `j` in its session's transaction, if the job asked for any mail (or
    `always`: a note the notifier sends whatever the mail types); `extra`: facts of this note
    beside the job's (they go into the webhook's JSON)."""
    if not j.mail_type and not always:
        return
    s = s if s is not None else object_session(j)
    if s is None:
        return
    s.info.setdefault(KEY, []).append({**payload(j, kind, now), **(extra or {})})


def attach(factory: sessionmaker[Session], sink: Callable[[list[dict[str, Any]]], None]) -> Callable[[], None]:
    """Hand the notes of every session `factory` makes to `sink` after each commit (it must not
    block); returns the function that detaches the listeners."""
    def after_commit(session: Session) -> None:
        items = session.info.pop(KEY, None)
        if items:
            sink(items)

    def after_rollback(session: Session) -> None:
        session.info.pop(KEY, None)

    event.listen(factory, "after_commit", after_commit)
    event.listen(factory, "after_rollback", after_rollback)

    def detach() -> None:
        event.remove(factory, "after_commit", after_commit)
        event.remove(factory, "after_rollback", after_rollback)
    return detach


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
