"""A store that goes back in time (restored from an older backup, its WAL deleted mid-run) beside a
data dir that does not: job directories are never reused, and the start says what was lost.

`yard up` runs as a real process on real SQLite, and is stopped, killed and restarted for real.
"""

from __future__ import annotations

import shutil
import sqlite3
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.plane import YardServer, alive, job_dir, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path):
    s = YardServer(tmp_path / "yard")
    s.data_dir.mkdir()
    yield s
    s.terminate()


def submit(c: httpx.Client, data_dir: Path, **body) -> int:
    r = c.post("/api/v1/jobs", json={"workdir": str(data_dir), **body})
    assert r.status_code == 201, r.text
    return r.json()["id"]


def wait_for(c: httpx.Client, job_id: int, states: tuple[str, ...], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = c.get(f"/api/v1/jobs/{job_id}").json()
        if j["state"] in states:
            return j
        assert time.monotonic() < deadline, f"job {job_id} is {j['state']} ({j['reason']}), wanted {states}"
        time.sleep(0.1)


def audit_events(c: httpx.Client) -> list[dict]:
    return [e for e in c.get("/api/v1/events", params={"limit": 1000}).json()["events"]
            if e["kind"] == "store.unknown_work"]


def up_log_since(server: YardServer, offset: int) -> str:
    return (server.data_dir / "up.log").read_text()[offset:]


def up_log_size(server: YardServer) -> int:
    path = server.data_dir / "up.log"
    return len(path.read_text()) if path.exists() else 0


def script_job(text: str) -> dict:
    return {"script": f"#!/bin/bash\n{text}\n", "command": []}


def test_a_store_restored_from_an_older_backup_gives_no_new_job_the_old_ones_directory(server, tmp_path):
    c = server.start()
    db = server.data_dir / "trainyard.db"
    first = submit(c, server.data_dir, team="vision", **script_job("echo first job"))
    wait_for(c, first, ("COMPLETED",))
    # An online backup, as docs/control-plane.md tells (Python's sqlite3 Connection.backup).
    backup = tmp_path / "backup.db"
    with sqlite3.connect(db) as src, sqlite3.connect(backup) as dst:
        src.backup(dst)
    old = submit(c, server.data_dir, team="vision", **script_job("echo secret of the old job"))
    wait_for(c, old, ("COMPLETED",))
    old_dir = job_dir(server.data_dir, old)
    assert "secret of the old job" in (old_dir / "logs" / "rank-0.log").read_text()

    server.terminate()  # the restore: stop the plane, put the backup in place of the database
    for leftover in (Path(f"{db}-wal"), Path(f"{db}-shm")):
        leftover.unlink(missing_ok=True)
    shutil.copy(backup, db)
    seen = up_log_size(server)
    c = server.start(config=False)

    said = up_log_since(server, seen)
    assert f"jobs {old}..{old} are lost" in said and old_dir.name in said and "belong to no job" in said
    (event,) = audit_events(c)
    assert event["data"]["ids_lost"] == {"store_max_job_id": first, "seen_max_job_id": old}
    assert event["data"]["unknown_dirs"]["dirs"] == [old_dir.name]

    # Another team's new job gets the lost job's id, but a directory of its own: its own script,
    # and a log without the old job's output.
    new = submit(c, server.data_dir, team="nlp", **script_job("echo the new job"))
    assert new == old
    done = wait_for(c, new, ("COMPLETED",))
    assert done["job_dir"] != str(old_dir) and Path(done["job_dir"]).name.startswith(f"{new}-")
    log = c.get(f"/api/v1/jobs/{new}/logs").text
    assert "the new job" in log and "secret of the old job" not in log
    assert "echo the new job" in (Path(done["job_dir"]) / "script.sh").read_text()
    assert "secret of the old job" in (old_dir / "script.sh").read_text()  # left as it was, for an admin
    assert "secret of the old job" in (old_dir / "logs" / "rank-0.log").read_text()


RANK = """
import os, pathlib, time
ck = pathlib.Path(os.environ['TRAINYARD_CHECKPOINT_DIR'])
(ck / 'pid').write_text(str(os.getpid()))
time.sleep(300)
"""


def test_a_wal_deleted_mid_run_is_reported_at_start_and_its_orphans_are_killed(server):
    server.start()
    server.terminate()  # a plane that ran a while: its configuration and token are checkpointed
    c = server.start(config=False)
    running = submit(c, server.data_dir, team="vision", command=[sys.executable, "-c", RANK])
    queued = submit(c, server.data_dir, team="nlp", command=["true"], hold=True)
    wait_for(c, running, ("RUNNING",))
    pid_file = job_dir(server.data_dir, running) / "checkpoints" / "pid"
    wait_until(pid_file.exists)
    pid = int(pid_file.read_text())
    running_dir = job_dir(server.data_dir, running)
    wait_until(lambda: f'"max_job_id": {queued}' in (server.data_dir / "store-seen.json").read_text())

    # A plain kill -9 and restart is no loss: nothing to report, the job is re-attached.
    server.kill9()
    seen = up_log_size(server)
    c = server.start(config=False)
    assert "warning:" not in up_log_since(server, seen) and audit_events(c) == []
    assert wait_for(c, running, ("RUNNING",))["attempt"] == 1 and alive(pid)

    # The WAL deleted under the running plane, then the plane dies: both jobs were acknowledged.
    wal = server.data_dir / "trainyard.db-wal"
    assert wal.exists()
    wal.unlink()
    server.kill9()
    seen = up_log_size(server)
    c = server.start(config=False)

    said = up_log_since(server, seen)
    assert f"write-ahead log {wal} is missing" in said and "moved to trainyard.db-shm.stale" in said
    assert f"jobs 1..{queued} are lost" in said or f"jobs {running}..{queued} are lost" in said
    assert running_dir.name in said and f"{running_dir.name}/run/attempt-1" in said
    (event,) = audit_events(c)
    assert set(event["data"]) == {"wal_missing", "ids_lost", "unknown_dirs", "unknown_attempts"}
    # The store is the truth: the running job's processes belong to no job of it and are killed
    # as orphans; its directory (logs, checkpoints) stays for an admin.
    wait_until(lambda: not alive(pid))
    assert pid_file.exists()
    assert c.get(f"/api/v1/jobs/{running}").status_code == 404
