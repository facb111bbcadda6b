"""The telemetry sampler (`control/lifecycle/telemetry.py`, issue 39): readings joined to the attempts
holding each GPU by placement, one row per GPU per flush, each job's rows bounded, `gpu_summary` and
`first_output_at` — on a real store with scripted readings (the fake backend), the rank logs through
jobfs (a link or FIFO in their place is no output), and end to end on the local backend with real
ranks (a busy rank's GPU busy, a sleeping one's idle)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from tests.plane import TWO_TEAMS, Plane, script
from trainyard.backends.base import GpuReading, NodeInfo
from trainyard.backends.fake import FakeBackend
from trainyard.contracts import JobDir
from trainyard.control.lifecycle import first_output
from trainyard.control.lifecycle.telemetry import Telemetry
from trainyard.states import AttemptOutcome
from trainyard.store.models import AttemptRow, GpuSampleRow, JobRow

NODES = [NodeInfo("node-0", 4, "emulated", 16384), NodeInfo("node-1", 4, "emulated", 16384)]


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    yield p
    p.cp.stop()


def running_attempt(p: Plane, placement: list[dict], started_at: float = 1000.0) -> tuple[int, JobDir]:
    """A held job given a running attempt on `placement` by hand (the loop is not running)."""
    jid = p.submit(team="vision", command=["true"], hold=True)["id"]
    with p.cp.store.session.begin() as s:
        j = s.get(JobRow, jid)
        s.add(AttemptRow(job_id=jid, attempt=1, placement=placement, started_at=started_at,
                         state=AttemptOutcome.RUNNING, gpus=sum(len(x["gpus"]) for x in placement)))
        jd = JobDir.of(p.cp.data_dir, jid, j.dir_key)
    jd.logs.mkdir(parents=True, exist_ok=True)
    return jid, jd


def sampler(p: Plane, tmp_path: Path) -> tuple[Telemetry, FakeBackend]:
    be = FakeBackend(tmp_path / "fake", NODES)
    return Telemetry(p.cp.loop_store, p.cp.configs, p.cp.lock, be, p.cp.data_dir), be


def rows(p: Plane, job_id: int) -> list[GpuSampleRow]:
    with p.cp.store.session() as s:
        return list(s.execute(select(GpuSampleRow).where(GpuSampleRow.job_id == job_id)
                              .order_by(GpuSampleRow.time)).scalars())


def attempt(p: Plane, job_id: int) -> AttemptRow:
    with p.cp.store.session() as s:
        return s.execute(select(AttemptRow).where(AttemptRow.job_id == job_id)).scalar_one()


def test_readings_join_the_holders_by_placement_and_flush_one_row_per_gpu(plane, tmp_path):
    a, _ = running_attempt(plane, [{"node": "node-0", "gpus": [0, 1], "mem_mib": 0}])
    b, _ = running_attempt(plane, [{"node": "node-0", "gpus": [1], "mem_mib": 4096}])  # shares GPU 1
    t, be = sampler(plane, tmp_path)
    reading = [GpuReading("node-0", 0, 90.0, 1000.0, 300.0, 60.0, "emulated"),
               GpuReading("node-0", 1, 10.0, 500.0, 100.0, 40.0, "emulated"),
               GpuReading("node-1", 3, 50.0, 50.0, None, None, "nvml")]  # held by nobody: dropped
    for i, util in enumerate((90.0, 70.0)):
        be.set_gpu_readings([GpuReading("node-0", 0, util, 1000.0 + i * 1000, 300.0, 60.0 + i, "emulated"),
                             *reading[1:]])
        assert t.sample(2000.0 + i) == 3  # a's two GPUs, and b's one
    assert t.flush(2015.0, 2000) == 3
    got = {(r.node, r.gpu): r for r in rows(plane, a)}
    assert set(got) == {("node-0", 0), ("node-0", 1)}
    g0 = got[("node-0", 0)]
    assert (g0.util, g0.util_peak, g0.mem_mib, g0.power_w, g0.temp_c, g0.source) == \
        (80.0, 90.0, 2000.0, 300.0, 61.0, "emulated")
    assert g0.time == 2015.0 and g0.period_s == 15.0
    assert [(r.node, r.gpu, r.util) for r in rows(plane, b)] == [("node-0", 1, 10.0)]
    summary = attempt(plane, a).gpu_summary
    assert summary == {"node-0/0": {"util_mean": 80.0, "util_peak": 90.0, "mem_peak_mib": 2000.0, "samples": 2},
                       "node-0/1": {"util_mean": 10.0, "util_peak": 10.0, "mem_peak_mib": 500.0, "samples": 2}}
    # the next period folds into the summary, weighted by readings
    be.set_gpu_readings([GpuReading("node-0", 0, 20.0, 10.0, 100.0, 40.0, "emulated")])
    t.sample(2016.0)
    t.flush(2030.0, 2000)
    assert attempt(plane, a).gpu_summary["node-0/0"] == {"util_mean": 60.0, "util_peak": 90.0,
                                                         "mem_peak_mib": 2000.0, "samples": 3}
    # an ended attempt holds nothing
    with plane.cp.store.session.begin() as s:
        s.execute(select(AttemptRow).where(AttemptRow.job_id == a)).scalar_one().ended_at = 2031.0
    assert t.sample(2032.0) == 0


def test_an_ended_attempts_readings_not_yet_flushed_are_written_for_its_ledger(plane, tmp_path):
    # an attempt shorter than a flush: the reconcile step writes its readings before its ledger is split
    a, _ = running_attempt(plane, [{"node": "node-0", "gpus": [0], "mem_mib": 0}], started_at=2000.0)
    b, _ = running_attempt(plane, [{"node": "node-0", "gpus": [1], "mem_mib": 0}], started_at=2000.0)
    t, be = sampler(plane, tmp_path)
    be.set_gpu_readings([GpuReading("node-0", g, 0.0, 10.0, None, None, "emulated") for g in (0, 1)])
    for i in range(4):
        t.sample(2001.0 + i)
    with plane.cp.lock, plane.cp.store.session.begin() as s:
        assert t.flush_attempt(s, a, 1, 2005.0) == 1
        assert t.flush_attempt(s, a, 1, 2005.0) == 0  # taken once
    (r,) = rows(plane, a)
    assert (r.time, r.util, r.period_s) == (2005.0, 0.0, 4.0) and attempt(plane, a).gpu_summary["node-0/0"]["samples"] == 4
    assert rows(plane, b) == []  # the other attempt's readings wait for the next flush
    assert t.flush(2010.0, 2000) == 1 and len(rows(plane, b)) == 1


def test_a_reading_speaks_for_the_time_since_the_previous_round_not_the_attempts_start(plane, tmp_path):
    # Placed at 1990, the attempt staged its data and launched; the agent's first reading of it comes
    # at the round of 2003 and speaks for 2002-2003 only: the period (and so a bare job's `startup`
    # in its ledger) does not claim the staging as GPU activity (a CI run had startup 0 this way).
    a, _ = running_attempt(plane, [{"node": "node-0", "gpus": [0], "mem_mib": 0}], started_at=1990.0)
    t, be = sampler(plane, tmp_path)
    for now in (2000.0, 2001.0, 2002.0):
        assert t.sample(now) == 0  # no reading of it yet (the emulation's first sight gives none)
    be.set_gpu_readings([GpuReading("node-0", 0, 90.0, 10.0, None, None, "emulated")])
    t.sample(2003.0)
    t.flush(2010.0, 2000)
    (r,) = rows(plane, a)
    assert (r.time, r.period_s, r.util) == (2010.0, 8.0, 90.0)


def test_a_jobs_rows_stay_bounded_and_thinning_keeps_time_and_the_mean(plane, tmp_path):
    jid, _ = running_attempt(plane, [{"node": "node-1", "gpus": [2, 3], "mem_mib": 0}])
    t, be = sampler(plane, tmp_path)
    now = 1000.0
    for i in range(40):  # 40 periods x 2 GPUs: 80 rows asked for, 10 kept
        be.set_gpu_readings([GpuReading("node-1", 2, float(i % 4) * 25, float(i), 100.0, 40.0, "emulated"),
                             GpuReading("node-1", 3, 0.0, 0.0, 100.0, 40.0, "emulated")])
        t.sample(now)
        now += 10.0
        t.flush(now, 10)
        assert len(rows(plane, jid)) <= 10
    kept = [r for r in rows(plane, jid) if r.gpu == 2]
    assert sum(r.period_s for r in kept) == pytest.approx(400.0)  # every second of the series is still there
    assert sum(r.util * r.period_s for r in kept) / 400.0 == pytest.approx(37.5)  # its mean, exactly
    assert max(r.util_peak for r in kept) == 75.0 and max(r.mem_mib for r in kept) == 39.0
    assert kept[-1].period_s == 10.0  # the newest rows stay fine; the oldest are coarse
    assert kept[0].period_s > 10.0
    assert attempt(plane, jid).gpu_summary["node-1/2"]["samples"] == 40  # the summary is exact


def test_first_output_is_what_follows_the_attempts_marker_and_never_a_link_or_fifo(plane, tmp_path):
    jid, jd = running_attempt(plane, [{"node": "node-0", "gpus": [0, 1], "mem_mib": 0}], started_at=time.time() - 5)
    t, _ = sampler(plane, tmp_path)
    log0, log1 = jd.rank_log(0), jd.rank_log(1)
    log0.write_text("old output of an earlier attempt\n=== trainyard: attempt 1 started now on node-0 gpus 0 ===\n")
    big = tmp_path / "big"
    big.write_bytes(b"x" * (1 << 20))
    log1.symlink_to(big)  # the job's own link, to a big file, in place of its log
    t.sample(time.time())
    assert attempt(plane, jid).first_output_at is None
    log1.unlink()
    os.mkfifo(log1)  # a FIFO: never opened (nothing would ever write it: an open would hang)
    t.sample(time.time())
    assert attempt(plane, jid).first_output_at is None
    with log0.open("a") as f:
        f.write("step 1\n")
    t.sample(5000.0)
    assert attempt(plane, jid).first_output_at == 5000.0
    t.sample(6000.0)
    assert attempt(plane, jid).first_output_at == 5000.0  # the first, once


def test_output_pushed_past_the_tail_counts_when_written_since_the_start_and_an_old_log_does_not(tmp_path):
    jd = JobDir(tmp_path / "job")
    jd.logs.mkdir(parents=True)
    jd.rank_log(0).write_text("=== trainyard: attempt 1 started …\n" + "line\n" * 5000)
    started = time.time() - 1
    assert first_output.printed(jd, 1, 2, started)  # attempt 2's marker not in the tail: written since it started
    os.utime(jd.rank_log(0), (started - 100, started - 100))
    assert not first_output.printed(jd, 1, 2, started)  # attempt 1's output, from before attempt 2
    assert not first_output.printed(jd, 0, 2, started)


LINKS_ITS_LOG = """
import os, time
jobdir = os.path.dirname(os.environ["TRAINYARD_CHECKPOINT_DIR"])
log = os.path.join(jobdir, "logs", "rank-0.log")
big = os.path.join(os.getcwd(), "big")
with open(big, "wb") as f:
    f.write(b"x" * (1 << 20))
os.remove(log)
os.symlink(big, log)
time.sleep(300)
"""


def test_end_to_end_a_busy_rank_reads_busy_a_sleeping_one_idle_and_printing_sets_first_output(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(TWO_TEAMS.read_text() + "telemetry: {interval: 0.25s, flush: 1s, max_rows_per_job: 10}\n")
    p = Plane(tmp_path / "yard", config=cfg)
    try:
        busy = p.submit(team="vision", gpus=1, command=script("print('started', flush=True)\nwhile True: pass"))["id"]
        idle = p.submit(team="nlp", gpus=2, command=["sleep", "300"])["id"]
        # a job that says nothing and puts a link to a big file of its own in its log's place
        linked = p.submit(team="nlp", gpus=1, command=script(LINKS_ITS_LOG))["id"]
        for j in (busy, idle, linked):
            p.wait(j, "RUNNING")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(rows(p, busy)) + len(rows(p, idle)) < 12:
            time.sleep(0.2)
        # each job keeps at most its 10 rows, whatever has run
        assert 0 < len(rows(p, busy)) <= 10 and 0 < len(rows(p, idle)) <= 10
        hot = attempt(p, busy).gpu_summary
        cold = attempt(p, idle).gpu_summary
        assert len(hot) == 1 and len(cold) == 2, (hot, cold)
        # a busy loop on a machine of 2 cores shared with other work (load 8 seen): a third of a core
        # at worst, far above a sleeper
        assert max(g["util_peak"] for g in hot.values()) >= 20, hot
        assert all(g["util_mean"] < 5 for g in cold.values()), cold
        assert {r.source for r in rows(p, busy)} == {"emulated"}
        assert attempt(p, busy).first_output_at is not None
        assert attempt(p, idle).first_output_at is None
        assert attempt(p, linked).first_output_at is None
        assert (p.cp.data_dir / "big").stat().st_size > 0  # the link was there to be seen
        series = p.admin.get(f"/api/v1/jobs/{busy}/gpus").json()
        assert len(series["gpus"]) == 1 and series["gpus"][0]["points"], series
        assert series["fields"][2] == "util"
    finally:
        p.stop()
