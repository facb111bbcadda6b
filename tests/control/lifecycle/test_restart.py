"""`kill -9` of the control plane while jobs run, then a restart: no job lost, duplicated or orphaned.

The control plane runs as a real `yard up` process here, so that it can be killed for real.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.plane import TEST_IDENTITY, TWO_TEAMS, YardServer as Server, alive, job_dir, with_test_users

def wait_for(c: httpx.Client, job_id: int, states: tuple[str, ...], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = c.get(f"/api/v1/jobs/{job_id}").json()
        if j["state"] in states:
            return j
        assert time.monotonic() < deadline, f"job {job_id} is {j['state']} ({j['reason']}), wanted {states}"
        time.sleep(0.1)


def pids_of(data_dir: Path, job_id: int) -> list[int]:
    """Every process the job's ranks wrote down (the rank itself and what it started)."""
    out = []
    for f in (job_dir(data_dir, job_id) / "checkpoints").glob("pids-*"):
        out += [int(x) for x in f.read_text().split()]
    return out


def finish(data_dir: Path, job_id: int, code: int) -> None:
    """Tell the job's ranks to exit with `code`: written aside and renamed, since a rank that saw
    the gate file while it was still empty would read exit code 0 (seen under load: a job meant to
    end FAILED with 3 ended COMPLETED)."""
    gate = job_dir(data_dir, job_id) / "finish"
    tmp = gate.with_name("finish.tmp")
    tmp.write_text(str(code))
    os.replace(tmp, gate)


RANK = """
import os, pathlib, subprocess, sys, time
ck = pathlib.Path(os.environ['TRAINYARD_CHECKPOINT_DIR'])
child = subprocess.Popen(['sleep', '300'])
(ck / ('pids-' + os.environ['RANK'])).write_text(f'{os.getpid()} {child.pid}')
(ck / ('started-' + os.environ['TRAINYARD_ATTEMPT'] + '-' + os.environ['RANK'])).write_text('')
gate = ck.parent / 'finish'
while not gate.exists():
    time.sleep(0.05)
child.kill()
sys.exit(int(gate.read_text() or 0))
"""


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "yard")
    s.data_dir.mkdir()
    yield s
    s.terminate()


def test_kill_9_then_restart_loses_no_job_duplicates_none_and_orphans_none(server):
    c = server.start()
    submit = lambda **kw: c.post("/api/v1/jobs", json={"command": [sys.executable, "-c", RANK], "team": "vision",  # noqa: E731
                                                        "workdir": str(server.data_dir), **kw}).json()["id"]
    keeps_running = submit(gpus=2)
    ends_while_down = submit(gpus=2)
    dies_unwatched = submit(gpus=1)
    pending = submit(gpus=8)
    for jid in (keeps_running, ends_while_down, dies_unwatched):
        wait_for(c, jid, ("RUNNING",))
    deadline = time.monotonic() + 120
    while any(len(pids_of(server.data_dir, j)) < 2 * n for j, n in
              ((keeps_running, 2), (ends_while_down, 2), (dies_unwatched, 1))):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    before = {j: pids_of(server.data_dir, j) for j in (keeps_running, ends_while_down, dies_unwatched)}

    server.kill9()
    # While nobody watches: one job finishes with code 3; another loses its whole process group.
    finish(server.data_dir, ends_while_down, 3)
    runner_pids = []
    for rec in (job_dir(server.data_dir, dies_unwatched) / "run").glob("attempt-*/rank-*.json"):
        runner_pids.append(json.loads(rec.read_text())["pid"])
    assert runner_pids
    for pid in runner_pids:
        os.killpg(pid, signal.SIGKILL)
    time.sleep(0.5)

    c = server.start(config=False)
    assert wait_for(c, ends_while_down, ("FAILED",))["exit_code"] == 3
    # Its processes vanished with no exit: a node-level loss, retried automatically after a backoff.
    lost = wait_for(c, dies_unwatched, ("RUNNING",), timeout=40)
    assert lost["attempt"] == 2 and lost["retries"] == 1
    assert lost["attempts"][0]["state"] == "NODE_FAIL" and lost["attempts"][0]["cause"] == "node_lost"
    finish(server.data_dir, dies_unwatched, 0)
    wait_for(c, dies_unwatched, ("COMPLETED",))
    # The job that kept running is re-attached, not restarted: same processes, one attempt.
    j = c.get(f"/api/v1/jobs/{keeps_running}").json()
    assert j["state"] == "RUNNING" and j["attempt"] == 1
    assert all(alive(p) for p in before[keeps_running])
    started = list((job_dir(server.data_dir, keeps_running) / "checkpoints").glob("started-*"))
    assert len(started) == 2  # never launched twice
    finish(server.data_dir, keeps_running, 0)
    done = wait_for(c, keeps_running, ("COMPLETED",))
    assert done["exit_code"] == 0 and len(done["attempts"]) == 1
    # The pending job was neither lost nor doubled: it runs once, after the others.
    p = wait_for(c, pending, ("RUNNING",))
    assert p["attempt"] == 1
    finish(server.data_dir, pending, 0)
    wait_for(c, pending, ("COMPLETED",))
    ids = [x["id"] for x in c.get("/api/v1/jobs").json()["jobs"]]
    assert sorted(ids) == sorted({keeps_running, ends_while_down, dies_unwatched, pending})
    # No orphans: every process any rank ever started is gone.
    everything = [p for ps in before.values() for p in ps] + pids_of(server.data_dir, pending)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in everything) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in everything if alive(p)]


def test_a_start_committed_but_never_launched_goes_back_to_the_queue(server, tmp_path):
    """The plane dies between committing a start and launching it: the job is requeued, not lost."""
    from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane
    from trainyard.services.jobs import JobSubmit, submit
    from trainyard.services.auth import Principal
    from trainyard.store.models import AttemptRow

    cp = build_plane(PlaneSettings(server.data_dir, config_text=with_test_users(TWO_TEAMS.read_text()), **TEST_IDENTITY))
    with cp.store.session.begin() as s:
        cfg = cp.configs.current(s)
        row = submit(s, JobSubmit(command=[sys.executable, "-c", "pass"], team="vision", workdir=str(tmp_path)),
                     Principal("admin", "admin"), cfg, cp.data_dir)
        row.state, row.attempt, row.start_time = "RUNNING", 1, time.time()
        row.placement = [{"node": "node-0", "gpus": [0], "mem_mib": 16384}]
        s.add(AttemptRow(job_id=row.id, attempt=1, placement=row.placement, started_at=row.start_time, state="RUNNING"))
        jid = row.id
    cp.stop()
    c = server.start(config=False)
    j = wait_for(c, jid, ("COMPLETED",))
    assert [a["state"] for a in j["attempts"]] == ["REQUEUED", "COMPLETED"]
