"""At start: does the data dir hold work the store does not know? Said, never silently reused.

A store can go back in time while the data dir does not: it is restored from an older backup,
its SQLite WAL is deleted (every transaction since the last checkpoint is gone), or the data dir
is given another database. Jobs the store acknowledged are then unknown to it, and it would hand
their ids out again. Job directories are keyed so that a new job never gets an old one's
directory (`contracts.JobDir`, `control/jobfiles/claim.py`); this audit says what was lost, once per
start, in the log, as a `store.unknown_work` event and in `yard up`'s output:

- `wal_missing`: SQLite's shared-memory index (`trainyard.db-shm`) is there but its WAL
  (`trainyard.db-wal`) is not. Both exist while a plane runs or after it was killed; a clean stop
  removes both. So the WAL was deleted, and the transactions it held are lost.
  (`recover_missing_wal` checks before the store is opened, and moves the stale index aside.)
- `ids_lost`: the data dir's record of the store (`store-seen.json`, rewritten by the control
  loop whenever the newest job id moves) names job ids beyond the store's newest: those jobs were
  acknowledged and are gone, directory or not.
- `other_store`: that record names another store (`store/identity.py`): the data dir was used
  with another database.
- `unknown_dirs`: job directories no job of the store owns (an id beyond the store's newest, or
  a known id with another key: its earlier life), and `unknown_attempts`: an attempt's run state
  (`run/attempt-<a>/`) beyond the store's last attempt of that job. Their processes, if any run,
  are orphans to the control loop's first pass, which kills them (design rule 3: the store is the
  truth); the directories themselves, logs, checkpoints and scripts, are left where they are for
  an admin to look at and move aside.

Nothing here changes the store's jobs or the disk but `store-seen.json`.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.contracts import JobDir
from trainyard.services.events import record
from trainyard.control.lifecycle import plane_files
from trainyard.store import identity
from trainyard.store.models import JobRow

log = logging.getLogger("trainyard.audit")

SEEN_FILE = "store-seen.json"
SHOWN = 10  # names listed in one message; the event's data holds up to `KEPT`
KEPT = 200


@dataclass(frozen=True)
class Finding:
    kind: str  # wal_missing | ids_lost | other_store | unknown_dirs | unknown_attempts
    message: str
    data: dict[str, Any] = field(default_factory=dict)


def sqlite_path(url: str) -> Path | None:
    """The database file of a `sqlite:///` URL; None for any other store."""
    for prefix in ("sqlite:///", "sqlite+pysqlite:///"):
        if url.startswith(prefix):
            return Path(url[len(prefix):].split("?", 1)[0])
    return None


def recover_missing_wal(url: str) -> Finding | None:
    """Before the store is opened: an SQLite database whose WAL was deleted (see the module
    docstring) is reported, and its index, which now describes frames that are gone (SQLite
    answers "disk I/O error" to every query through it), is moved aside as `<db>-shm.stale`, so
    that the database opens as of its last checkpoint. None when all is as it should be, or the
    store is not SQLite."""
    db = sqlite_path(url)
    if db is None or not db.exists():  # plane's own: the store's files
        return None
    shm, wal = Path(f"{db}-shm"), Path(f"{db}-wal")
    if not shm.exists() or wal.exists():  # plane's own: the store's files
        return None
    stale = Path(f"{shm}.stale")
    os.replace(shm, stale)  # plane's own: the store's files
    return Finding("wal_missing", f"the store's write-ahead log {wal} is missing while its index {shm.name} is "
                   "there: it was deleted, and every transaction since the last checkpoint is lost (jobs "
                   f"submitted, started or ended since then); the index, stale now, was moved to {stale.name}",
                   {"wal": str(wal), "stale_index": str(stale)})


def read_seen(data_dir: Path) -> dict[str, Any] | None:
    rec = jobfs.Tree(data_dir).read_json(SEEN_FILE)
    return rec if isinstance(rec, dict) else None


def write_seen(data_dir: Path, store_id: str, max_job_id: int) -> None:
    """Record the store's id and newest job id in the data dir (atomically; no fsync: what it
    guards against is a database that goes back in time, not a machine that loses its page cache)."""
    plane_files.write_private(data_dir / SEEN_FILE, json.dumps({"store": store_id, "max_job_id": max_job_id}))  # 0600


def audit(s: Session, data_dir: Path, store_id: str, wal: Finding | None = None) -> list[Finding]:
    """Everything on disk the store does not know (read only); `wal` from `recover_missing_wal`."""
    found = [wal] if wal is not None else []
    max_id = s.scalar(select(func.max(JobRow.id))) or 0
    seen = read_seen(data_dir)
    if seen is not None and seen.get("store") not in (None, store_id):
        found.append(Finding("other_store", f"this data dir was last used with another store ({seen.get('store')}); "
                             f"this one is {store_id}", {"seen": seen.get("store"), "store": store_id}))
    elif seen is not None and isinstance(seen.get("max_job_id"), int) and seen["max_job_id"] > max_id:
        lost = seen["max_job_id"]
        found.append(Finding("ids_lost", f"the store had given out job ids up to {lost} but now knows jobs up to "
                             f"{max_id} only: jobs {max_id + 1}..{lost} are lost (a restore from an older backup, or "
                             f"a lost WAL); their ids will be given out again, never their directories",
                             {"store_max_job_id": max_id, "seen_max_job_id": lost}))
    dirs, attempts = _unknown_on_disk(s, data_dir, max_id)
    if dirs:
        found.append(Finding("unknown_dirs", f"{len(dirs)} job director{'y' if len(dirs) == 1 else 'ies'} under "
                             f"{data_dir / 'jobs'} belong to no job of this store: {_names(dirs)}; left as they are "
                             "(never reused: a new job gets a directory of its own)",
                             {"dirs": [d for d, _ in dirs[:KEPT]], "count": len(dirs)}))
    if attempts:
        found.append(Finding("unknown_attempts", f"{len(attempts)} attempt{'s' if len(attempts) != 1 else ''}' run "
                             f"state the store does not know: {_names(attempts)}; processes still running there are "
                             "killed as orphans by the first pass",
                             {"attempts": [a for a, _ in attempts[:KEPT]], "count": len(attempts)}))
    return found


def report(s: Session, findings: list[Finding], now: float) -> None:
    """Log each finding and record them all as one `store.unknown_work` event."""
    for f in findings:
        log.warning("store audit: %s", f.message)
    if findings:
        record(s, "yard-up", "store.unknown_work", " | ".join(f.message for f in findings), at=now,
               data={f.kind: f.data for f in findings})


def _names(items: list[tuple[str, str]]) -> str:
    shown = ", ".join(f"{name} ({why})" for name, why in items[:SHOWN])
    return shown + (f" and {len(items) - SHOWN} more" if len(items) > SHOWN else "")


def _unknown_on_disk(s: Session, data_dir: Path, max_id: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(job dirs, attempt run dirs) the store does not know, each with why, in id order."""
    # job dirs hold what jobs wrote: listed through no link below `jobs/` (`jobfs`); `jobs/` itself
    # may be the admin's link to another file system (control/lifecycle/plane_files.py)
    tree = jobfs.Tree(data_dir / "jobs")
    named: list[tuple[str, int, str | None]] = []
    for name, mode in tree.list_dir(""):
        parsed = JobDir.parse_name(name)
        if parsed is not None and stat.S_ISDIR(mode):
            named.append((name, *parsed))
    rows: dict[int, tuple[str | None, int]] = {}
    ids = sorted({jid for _, jid, _ in named})
    for i in range(0, len(ids), 500):  # bound the IN list
        q = select(JobRow.id, JobRow.dir_key, JobRow.attempt).where(JobRow.id.in_(ids[i:i + 500]))
        rows.update({jid: (key, att) for jid, key, att in s.execute(q)})
    dirs, attempts = [], []
    for name, jid, key in sorted(named, key=lambda n: (n[1], n[0])):
        row = rows.get(jid)
        if row is None or row[0] != key:
            why = (f"beyond the store's newest job {max_id}" if jid > max_id else
                   "no such job" if row is None else f"job {jid} of the store has another directory")
            dirs.append((name, why))
            attempts += [(f"{name}/run/{r}", "its job is unknown") for r in _runs(tree, name)]
            continue
        for run in _runs(tree, name):
            n = run.removeprefix("attempt-")
            if n.isdigit() and int(n) > row[1]:
                attempts.append((f"{name}/run/{run}", f"the store knows attempts up to {row[1]}"))
    return dirs, attempts


def _runs(tree: jobfs.Tree, name: str) -> list[str]:
    return [n for n, _ in tree.list_dir(f"{name}/run") if n.startswith("attempt-")]


class SeenRecord:
    """Keeps `store-seen.json` up to date: the control loop runs it at the end of every pass,
    and it rewrites the file only when the newest job id has moved (a submission wakes the loop,
    so the record trails an acknowledged job by one pass)."""

    def __init__(self, store: Any, data_dir: Path) -> None:  # store: trainyard.store.db.Store
        self.store, self.data_dir = store, data_dir
        self._written: tuple[str, int] | None = None

    def run(self) -> None:
        with self.store.session() as s:
            now = (identity.instance_id(s), s.scalar(select(func.max(JobRow.id))) or 0)
        if now != self._written and now[0]:
            write_seen(self.data_dir, *now)
            self._written = now
