"""The demo's stand-in training job (`trainyard.demo.work`) writes the runtime's phase file: real
processes, the job environment a plane gives (job id, attempt, checkpoint dir), the file read as
the plane reads it and split by the ledger (`services/goodput.py`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainyard.contracts import REQUEUE_EXIT, JobDir
from trainyard.services import goodput

REPO = Path(__file__).resolve().parents[2]
STEP = 0.05


def work(jd: JobDir, *args: str, attempt: int = 1, rank: int = 0, world: int = 1,
         extra: dict[str, str] | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update({"TRAINYARD_JOB_ID": "7", "TRAINYARD_ATTEMPT": str(attempt), "RANK": str(rank),
                "WORLD_SIZE": str(world), "TRAINYARD_CHECKPOINT_DIR": str(jd.checkpoints),
                "PYTHONPATH": os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]), **(extra or {})})
    return subprocess.Popen([sys.executable, "-m", "trainyard.demo.work", *args], env=env, cwd=jd.root,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def ran(p: subprocess.Popen, rc: int = 0) -> str:
    out, _ = p.communicate(timeout=60)
    assert p.returncode == rc, out
    return out


def phases(jd: JobDir, attempt: int = 1, rank: int = 0) -> dict:
    return json.loads(jd.phases_file(attempt, rank).read_text())


@pytest.fixture
def jd(tmp_path: Path) -> JobDir:
    (tmp_path / "job").mkdir()
    return JobDir(tmp_path / "job")


def test_its_steps_and_checkpoints_are_in_the_phase_file_of_each_rank(jd):
    t0 = time.time()
    # one after the other: a rank resumes from the newest checkpoint it finds when it starts
    for rank in (1, 0):
        ran(work(jd, "--steps", "10", "--step-time", str(STEP), "--ckpt-every", "3", rank=rank, world=2))
    r0, r1 = phases(jd, rank=0), phases(jd, rank=1)
    for rank, r in ((0, r0), (1, r1)):
        assert r["v"] == 1 and r["attempt"] == 1 and r["rank"] == rank
        assert r["steps"] == 10 and r["step"] == 10 and [s for s, _, _ in r["recent"]] == list(range(1, 11))
        assert t0 <= r["began"] <= r["last"] <= r["ended"] <= time.time()
        # ten sleeps of STEP: the step times are the sleeps (plus bookkeeping, and a loaded machine's delays)
        assert all(t >= STEP for _, t, _ in r["recent"])
        assert r["phases"]["step"] == pytest.approx(sum(t for _, t, _ in r["recent"]), abs=1e-4)
        assert r["phases"]["step"] <= r["last"] - r["began"] + 0.01
        assert r["phases"]["data_wait"] == 0 and r["phases"]["comm"] == 0
    # rank 0 writes the checkpoints (steps 3, 6, 9: each inside the next step's time); rank 1 none
    assert 0 < r0["phases"]["checkpoint_stall"] < 0.5 and r1["phases"]["checkpoint_stall"] == 0
    assert sorted(p.parent.name for p in jd.checkpoints.glob("step-*/COMMITTED")) == ["step-3", "step-6", "step-9"]


def test_a_resumed_attempt_counts_its_own_steps_and_a_preemption_save_comes_after_the_last(jd):
    ran(work(jd, "--steps", "4", "--step-time", str(STEP), "--ckpt-every", "2"))  # commits step-4
    p = work(jd, "--steps", "1000", "--step-time", str(STEP), "--ckpt-every", "1000", attempt=2)
    path = jd.phases_file(2, 0)
    deadline = time.monotonic() + 30
    while not (path.exists() and phases(jd, 2)["steps"] >= 1):  # read while it is written
        assert time.monotonic() < deadline and p.poll() is None
        time.sleep(0.05)
    p.send_signal(signal.SIGUSR1)
    out = ran(p, REQUEUE_EXIT)
    assert "starts at step 4" in out
    r = phases(jd, 2)
    assert r["ended"] is not None and r["step"] == 4 + r["steps"] and r["recent"][-1][0] == r["step"]
    assert r["after_last"]["checkpoint_stall"] > 0 and r["phases"]["checkpoint_stall"] == 0
    assert (jd.checkpoints / f"step-{r['step']}" / "COMMITTED").exists()


def test_the_ledger_of_its_phase_file_is_mostly_compute(jd):
    start = time.time()
    ran(work(jd, "--steps", "20", "--step-time", str(STEP), "--ckpt-every", "5"))
    end = time.time()
    rank = goodput.parse_phases(phases(jd), 1, 0)
    assert rank is not None
    ledger = goodput.split(goodput.AttemptFacts(start=start, end=end, gpus=2, ranks=(rank,)))
    assert sum(ledger.values()) == pytest.approx(2 * (end - start))
    assert ledger["compute"] >= 2 * 20 * STEP and ledger["startup"] > 0 and ledger["checkpoint_stall"] > 0
    assert ledger["idle"] == 0 and ledger["data_wait"] == 0


def test_phases_off_writes_no_file_and_keeps_the_rest(jd):
    ran(work(jd, "--steps", "3", "--step-time", "0.01", "--ckpt-every", "3", extra={"TRAINYARD_PHASES": "0"}))
    assert not jd.phases_dir.exists()
    assert (jd.checkpoints / "step-3" / "COMMITTED").exists()
