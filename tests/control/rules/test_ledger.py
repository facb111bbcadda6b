"""An ended attempt's ledger (control/rules/ledger.py): the phase files the job wrote, read through
`jobfs` into a real SQLite store's `attempts.ledger`; a link, a FIFO or a huge file where a phase
file should be is no phase file (the split falls back to the coarse one), and the read never blocks."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.plane import Plane
from trainyard.contracts import LEDGER_BUCKETS, PHASES_MAX_BYTES, JobDir
from trainyard.control.rules.ledger import store_ledger
from trainyard.services.goodput import DEFAULT_IDLE_BELOW
from trainyard.store.models import AttemptRow, GpuSampleRow, JobRow

T0 = 1_760_000_400.0


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Plane]:
    p = Plane(tmp_path / "yard", start=False)
    yield p
    p.cp.stop()


def add(p: Plane, *, gpus: int = 2, ranks: int = 2, stop_since: float | None = None) -> tuple[int, JobDir]:
    with p.cp.store.session.begin() as s:
        j = JobRow(name="j", user="alice", team="vision", job_class="training", pool="default", state="RUNNING",
                   reason="None", command=["true"], workdir="/tmp", env={}, gpus=gpus, submit_time=T0,
                   queued_since=T0, attempt=1, start_time=T0, tasks_per_node=ranks, dir_key="k1",
                   stop_kind=None if stop_since is None else "cancel", stop_since=stop_since)
        s.add(j)
        s.flush()
        s.add(AttemptRow(job_id=j.id, attempt=1, placement=[{"node": "node-0", "gpus": list(range(gpus)),
                                                              "mem_mib": 0}],
                         started_at=T0, ended_at=T0 + 100, state="COMPLETED", gpus=gpus, lost_gpu_s=10.0))
        jid = j.id
    return jid, JobDir.of(p.cp.data_dir, jid, "k1")


def phase(rank: int, **kw: float) -> dict:
    return {"v": 1, "attempt": 1, "rank": rank, "began": T0 + 20, "last": T0 + 95, "step": 75, "steps": 75,
            "phases": {"step": 75.0, "data_wait": kw.get("data_wait", 0.0), "checkpoint_stall": 6.0,
                       "comm": kw.get("comm", 0.0)},
            "after_last": {"checkpoint_stall": 2.0}, "ended": T0 + 99, "recent": [[74, 1.0, 0.1], [75, 1.0, 0.1]]}


def write(jd: JobDir, rank: int, obj: dict) -> None:
    jd.phases_dir.mkdir(parents=True, exist_ok=True)
    jd.phases_file(1, rank).write_text(json.dumps(obj))


def ledger(p: Plane, jid: int, jd: JobDir) -> dict[str, float]:
    with p.cp.store.session.begin() as s:
        j = s.get(JobRow, jid)
        a = s.query(AttemptRow).filter_by(job_id=jid, attempt=1).one()
        got = store_ledger(s, j, a, jd, p.cp.configs.current(s).spec, T0 + 100)
    with p.cp.store.session.begin() as s:
        a = s.query(AttemptRow).filter_by(job_id=jid, attempt=1).one()
        stored, allocated = a.ledger, a.gpus * (a.ended_at - a.started_at)
    assert stored == got and set(stored) == set(LEDGER_BUCKETS)
    assert math.isclose(math.fsum(stored.values()), allocated, abs_tol=1e-6)
    return stored


def test_the_phase_files_of_every_rank_are_split_and_stored(plane):
    jid, jd = add(plane)
    write(jd, 0, phase(0, data_wait=10.0, comm=3.0))
    write(jd, 1, phase(1, data_wait=4.0, comm=1.0))
    b = ledger(plane, jid, jd)
    assert b["startup"] == pytest.approx(2 * 20)
    assert b["data_wait"] == pytest.approx(10.0 + 4.0)  # the ranks' mean, times 2 GPUs
    assert b["comm_wait"] == pytest.approx(2.0)  # rank 0's 2 s beyond rank 1, averaged over 2 ranks
    assert b["checkpoint_stall"] == pytest.approx(2 * (6.0 + 2.0))
    assert b["teardown"] == pytest.approx(2 * 3.0)
    assert b["recompute"] == pytest.approx(10.0)


def test_a_bare_job_gets_the_coarse_split_from_its_telemetry_and_stop(plane):
    jid, jd = add(plane, gpus=1, ranks=1, stop_since=T0 + 80)
    with plane.cp.store.session.begin() as s:
        s.query(AttemptRow).filter_by(job_id=jid).one().first_output_at = T0 + 10
        s.add_all([GpuSampleRow(job_id=jid, attempt=1, node="node-0", gpu=0, time=T0 + t, period_s=10.0,
                                util=u, util_peak=u, mem_mib=0.0, source="emulated")
                   for t, u in ((20, 50.0), (30, DEFAULT_IDLE_BELOW - 1), (40, 0.0))])
    b = ledger(plane, jid, jd)
    assert b["startup"] == pytest.approx(10) and b["teardown"] == pytest.approx(20)
    assert b["idle"] == pytest.approx(20) and b["compute"] + b["recompute"] == pytest.approx(50)


def coarse(b: dict[str, float]) -> bool:
    """No phase file was read: nothing but compute and recompute (no output, no sample, no stop)."""
    return b["startup"] == 0 and b["data_wait"] == 0 and b["checkpoint_stall"] == 0 and b["teardown"] == 0


def test_a_symlink_in_place_of_a_phase_file_is_not_followed(plane, tmp_path):
    jid, jd = add(plane, ranks=1)
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(phase(0, data_wait=50.0)))
    jd.phases_dir.mkdir(parents=True)
    os.symlink(elsewhere, jd.phases_file(1, 0))
    assert coarse(ledger(plane, jid, jd))


def test_a_symlinked_phases_dir_is_not_followed(plane, tmp_path):
    jid, jd = add(plane, ranks=1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / jd.phases_file(1, 0).name).write_text(json.dumps(phase(0, data_wait=50.0)))
    jd.metrics_dir.mkdir(parents=True)
    os.symlink(tmp_path / "other", jd.phases_dir)
    assert coarse(ledger(plane, jid, jd))


def test_a_fifo_in_place_of_a_phase_file_is_absent_and_does_not_block(plane):
    jid, jd = add(plane, ranks=1)
    jd.phases_dir.mkdir(parents=True)
    os.mkfifo(jd.phases_file(1, 0))
    assert coarse(ledger(plane, jid, jd))


def test_a_phase_file_over_the_bound_is_absent(plane):
    jid, jd = add(plane, ranks=1)
    write(jd, 0, phase(0, data_wait=50.0))
    with open(jd.phases_file(1, 0), "a") as fh:
        fh.write(" " * PHASES_MAX_BYTES)
    assert coarse(ledger(plane, jid, jd))


def test_garbage_in_a_phase_file_is_absent(plane):
    jid, jd = add(plane, ranks=1)
    jd.phases_dir.mkdir(parents=True)
    jd.phases_file(1, 0).write_bytes(b"\xff{not json")
    assert coarse(ledger(plane, jid, jd))


def test_a_phase_file_nested_too_deep_to_decode_is_absent(plane):
    """`json.loads` raises RecursionError (not ValueError) on arrays nested thousands deep: within
    the bound, such a file must not fail the loop's pass that ends the attempt."""
    jid, jd = add(plane, ranks=1)
    jd.phases_dir.mkdir(parents=True)
    jd.phases_file(1, 0).write_text("[" * 30000 + "]" * 30000)
    assert coarse(ledger(plane, jid, jd))
