"""Real processes: a hung rank, a full disk, and FSDP2's sharded checkpoints."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from trainyard.contracts import WATCHDOG_EXIT, newest_checkpoint
from tests.runtime.helpers import Ranks, base_env, free_port


def test_watchdog_single_process_hang_exits_86_with_stacks(tmp_path):
    out = tmp_path / "job"
    r = Ranks(out, 1, ["--steps", "10", "--hang-at", "3", "--watchdog", "1"])
    assert r.wait(timeout=60) == [WATCHDOG_EXIT]
    log = r.log(0)
    assert "trainyard watchdog (rank 0): a training step did not complete in time" in log
    assert "last completed step: 2" in log
    assert "train_script.py" in log and "most recent call first" in log  # faulthandler's stack dump


def test_watchdog_hung_rank_ends_every_rank(tmp_path):
    # Rank 1 hangs; rank 0 waits for it in DDP's all-reduce: both are stuck, and both end. The
    # hung rank's watchdog exits 86. Its peer exits 86 too when its own watchdog fires first, or
    # fails on the connection the hung rank's exit closed (exit 1) when that comes first: a race
    # on a loaded machine. The control plane blames the watchdog's exit either way
    # (tests/control/rules/test_outcome.py), so the job is recorded as hung, not crashed.
    out = tmp_path / "job"
    r = Ranks(out, 2, ["--steps", "10", "--hang-at", "4", "--hang-rank", "1", "--watchdog", "2"])
    codes = r.wait(timeout=90)
    assert codes[1] == WATCHDOG_EXIT, r.log(1)[-2000:]
    assert "last completed step: 3" in r.log(1)
    if codes[0] == WATCHDOG_EXIT:
        assert "last completed step: 3" in r.log(0)
    else:
        assert codes[0] == 1 and re.search(r"Connection (closed|reset) by peer|gloo", r.log(0)), r.log(0)[-2000:]


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("leave_kb", [4, 40], ids=["rank-files-fail", "shards-fail-in-background"])
def test_disk_full_during_async_save_fails_every_rank_clearly_previous_intact(tmp_path, small_disk, leave_kb):
    out = tmp_path / "job"
    r = Ranks(out, 2, ["--steps", "30", "--checkpoint-every", "5", "--fill-disk-at", "7", "--leave-kb", str(leave_kb)],
              env={"TRAINYARD_CHECKPOINT_DIR": str(small_disk / "ckpt")})
    codes = r.wait(timeout=90)
    assert codes == [1, 1], r.log(0)[-3000:]
    # The cadence picks the steps (it starts saves early when commits take steps), so read them.
    failed = set()
    for rank in (0, 1):
        log = r.log(rank)
        m = re.search(r"step-(\d+) could not be written", log)
        assert "CheckpointSaveError" in log and m, log[-3000:]
        failed.add(int(m.group(1)))
    assert len(failed) == 1  # both name the same save: the first one after the fill at step 7
    lost = failed.pop()
    assert lost >= 7
    # the rank whose write hit the full disk says so; the other may have seen its part fail first
    full = "the disk is full (No space left on device"
    assert any(full in r.log(k) for k in (0, 1)), r.log(0)[-2000:]
    assert all(full in r.log(k) or "another rank failed to write its part" in r.log(k) for k in (0, 1))
    found = newest_checkpoint(small_disk / "ckpt")
    assert found is not None and found[0] < lost
    assert f"the previous checkpoint step-{found[0]} is intact" in r.log(0)
    assert sorted(p.name for p in (small_disk / "ckpt").iterdir()) == [f"step-{found[0]}"]


FSDP = Path(__file__).with_name("fsdp_script.py")


def _fsdp(tmp_path: Path, nproc: int, args: list[str], name: str) -> dict:
    env = base_env(tmp_path, 0)
    if nproc == 1:
        cmd = [sys.executable, str(FSDP)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(FSDP)]
    out = tmp_path / f"{name}.json"
    p = subprocess.run([*cmd, *args[:1], str(out), *args[1:]], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_fsdp2_sharded_checkpoint_exact_resume_and_load_on_one_process(tmp_path):
    whole = _fsdp(tmp_path, 2, [str(tmp_path / "a"), "6", "0"], "whole")
    part1 = _fsdp(tmp_path, 2, [str(tmp_path / "b"), "3", "3"], "part1")
    part2 = _fsdp(tmp_path, 2, [str(tmp_path / "b"), "6", "0"], "part2")
    assert part2["start"] == 3
    assert {**part1["losses"], **part2["losses"]} == whole["losses"]  # bit for bit
    one = _fsdp(tmp_path, 1, [str(tmp_path / "b"), "6", "0"], "one")  # 2 shards → 1 plain module
    assert one["start"] == 3
    for s in ("4", "5", "6"):
        assert one["floats"][s] == pytest.approx(whole["floats"][s], rel=1e-5)
