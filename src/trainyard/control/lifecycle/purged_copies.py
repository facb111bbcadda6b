"""What the archive still holds of a job whose records `retention.jobs` purged (issue 41): step 3
of the checkpoint tiers thread's round (control/lifecycle/checkpoint_tiers.py).

A purge removes a job's rows and moves its job dir aside (services/retention.py, one
`retention.deleted` event); its archive copies lie outside the data dir and may be slow to remove
(an object store), so they are not removed under the purge's transaction but here, after it: each
archived step is removed, then its record dropped with one `checkpoint.deleted` audit event (rule
`retention.jobs`); once none is left, the job's fast-copy records and keep marks are forgotten. A
keep mark keeps a step as long as its job's records are kept, not past them. A copy lying in an
archive other than the configured one (its URL changed) stays, and so do its job's records, until
an archive that holds it is configured again: nothing is forgotten unseen.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from trainyard.services import checkpoint_copies as copies
from trainyard.services.checkpoint_plan import ARCHIVE
from trainyard.services.events import record
from trainyard.staging.archive_io import Archive, ArchiveError
from trainyard.store.db import Store

log = logging.getLogger("trainyard.checkpoint_tiers")

ACTOR = "lifecycle"
RULE = "retention.jobs"


def forget(store: Store, lock: threading.RLock, archive: Archive | None, clock: Callable[[], float],
           stopping: Callable[[], bool]) -> tuple[int, int]:
    """Remove and forget what is left of purged jobs; returns (jobs forgotten, archived steps deleted)."""
    with store.session() as s:
        purged = copies.purged_jobs(s)
    jobs = steps = 0
    for jid in purged:
        if stopping():
            break
        with store.session() as s:
            held = [(r.step, r.location, r.bytes) for r in copies.copies(s, jid) if r.tier == ARCHIVE]
        if held and (archive is None or not all(archive.holds(where) for _, where, _ in held)):
            log.warning("checkpoint tiers: purged job %s has archive copies outside the configured archive; kept", jid)
            continue
        try:
            for step, where, nbytes in held:
                assert archive is not None  # held: checked above
                archive.remove(where)
                with lock, store.session.begin() as s:
                    copies.drop(s, jid, step, ARCHIVE)
                    record(s, ACTOR, "checkpoint.deleted",
                           f"step {step}: {nbytes} bytes deleted from the archive ({RULE}: the job's records were "
                           "purged)", job_id=jid, at=clock(),
                           data={"step": step, "tier": ARCHIVE, "bytes": nbytes, "rule": RULE, "location": where})
                steps += 1
        except (OSError, ArchiveError) as e:
            log.warning("checkpoint tiers: purged job %s: %s", jid, e)
            continue
        with lock, store.session.begin() as s:
            copies.forget_job(s, jid)
        jobs += 1
    return jobs, steps
