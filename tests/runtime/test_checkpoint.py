"""CheckpointManager in one process: layout, round trip, retention, damage, full disk.

Real files throughout; the full-disk test writes to a real 1.5 MiB tmpfs (needs root to mount;
skipped where mounting is not allowed).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import uuid

import numpy as np
import pytest
import torch

from trainyard.contracts import CHECKPOINT_MARKER, committed_steps, newest_checkpoint
from trainyard.runtime import (
    CheckpointManager,
    CheckpointSaveError,
    NoValidCheckpointError,
    ResumableSampler,
)

# DCP warns that it runs without a process group; here that is the point.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def make(directory, hidden=16, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    sampler = ResumableSampler(100, 10, seed=3)
    mgr = CheckpointManager(directory, model=model, optimizer=opt, scheduler=sched, sampler=sampler, **kw)
    return mgr, model, opt, sched, sampler


def train(model, opt, sched, sampler, steps=1):
    for _ in range(steps):
        x = torch.randn(4, 8)
        model(x).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        sampler.advance()


def snapshot(model, opt, sched, sampler):
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "exp_avg": [opt.state[p]["exp_avg"].clone() for p in model.parameters()],
        "lr": opt.param_groups[0]["lr"],
        "sched": sched.state_dict(),
        "sampler": sampler.state_dict(),
        "rng": (random.random(), float(np.random.rand()), torch.rand(1).item()),
    }


def same(a, b):
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"]))
    assert all(torch.equal(x, y) for x, y in zip(a["exp_avg"], b["exp_avg"]))
    assert (a["lr"], a["sched"], a["sampler"], a["rng"]) == (b["lr"], b["sched"], b["sampler"], b["rng"])


@pytest.mark.parametrize("blocking", [True, False])
def test_round_trip_restores_everything(tmp_path, blocking):
    mgr, *state = make(tmp_path)
    train(*state, steps=3)
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    mgr.save(3, blocking=blocking)
    assert mgr.wait() in (None, 3)
    want = snapshot(*state)  # draws from the generators after the save

    mgr2, *fresh = make(tmp_path)
    train(*fresh, steps=1)  # diverge, then restore
    assert mgr2.load_latest() == 3
    same(snapshot(*fresh), want)

    d = tmp_path / "step-3"
    assert sorted(os.listdir(d)) == [".metadata", CHECKPOINT_MARKER, "__0_0.distcp", "rank-0.pt"]
    manifest = json.loads((d / CHECKPOINT_MARKER).read_text())
    assert manifest["step"] == 3 and manifest["world_size"] == 1
    assert manifest["files"] == {n: os.path.getsize(d / n) for n in os.listdir(d) if n != CHECKPOINT_MARKER}
    assert newest_checkpoint(tmp_path)[0] == 3  # the control loop's reader agrees


def test_no_checkpoint_is_a_fresh_start(tmp_path):
    mgr, *_ = make(tmp_path / "none")
    assert mgr.load_latest() is None


def test_retention_keeps_last_k_and_every_mth(tmp_path):
    mgr, *state = make(tmp_path, keep_last=2, keep_every=4)
    for step in range(1, 11):
        train(*state)
        mgr.save(step)  # async: each save waits for the previous one
    mgr.wait()
    assert [s for s, _ in committed_steps(tmp_path)] == [4, 8, 9, 10]
    assert sorted(os.listdir(tmp_path)) == ["step-10", "step-4", "step-8", "step-9"]


def test_saving_a_step_twice_is_a_no_op_and_leftovers_are_replaced(tmp_path):
    mgr, *state = make(tmp_path)
    leftover = tmp_path / "step-2"
    leftover.mkdir(parents=True)
    (leftover / "junk").write_text("from an interrupted attempt")
    train(*state, steps=2)
    mgr.save(2, blocking=True)
    mtime = os.path.getmtime(leftover / CHECKPOINT_MARKER)
    mgr.save(2, blocking=True)
    assert os.path.getmtime(leftover / CHECKPOINT_MARKER) == mtime
    assert not (leftover / "junk").exists()


def three_checkpoints(tmp_path):
    mgr, *state = make(tmp_path)
    snaps = {}
    for step in (1, 2, 3):
        train(*state)
        mgr.save(step, blocking=True)
        snaps[step] = [p.detach().clone() for p in state[0].parameters()]
    return snaps


def test_truncated_shard_falls_back_to_previous_with_warning(tmp_path):
    snaps = three_checkpoints(tmp_path)
    shard = tmp_path / "step-3" / "__0_0.distcp"
    with open(shard, "r+b") as fh:
        fh.truncate(os.path.getsize(shard) // 2)
    mgr, model, *_ = make(tmp_path)
    with pytest.warns(RuntimeWarning, match=r"step-3 is damaged \(__0_0.distcp has \d+ bytes"):
        assert mgr.load_latest() == 2
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), snaps[2]))
    assert (tmp_path / "step-3.damaged").is_dir() and not (tmp_path / "step-3").exists()
    assert newest_checkpoint(tmp_path)[0] == 2  # the control plane no longer sees the damaged one


def test_corrupt_shard_of_right_size_falls_back(tmp_path):
    three_checkpoints(tmp_path)
    shard = tmp_path / "step-3" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[: len(data) // 2] = b"\x00" * (len(data) // 2)
    shard.write_bytes(bytes(data))  # same size: only the load itself can tell
    mgr, *_ = make(tmp_path)
    with pytest.warns(RuntimeWarning, match="step-3 is damaged"):
        assert mgr.load_latest() == 2


def test_missing_marker_falls_back_with_warning(tmp_path):
    three_checkpoints(tmp_path)
    (tmp_path / "step-3" / CHECKPOINT_MARKER).unlink()
    mgr, *_ = make(tmp_path)
    with pytest.warns(RuntimeWarning, match="step-3 has no commit marker"):
        assert mgr.load_latest() == 2


def test_missing_rank_file_and_unreadable_marker_are_damage(tmp_path):
    three_checkpoints(tmp_path)
    (tmp_path / "step-3" / "rank-0.pt").unlink()
    (tmp_path / "step-2" / CHECKPOINT_MARKER).write_text("{not json")
    mgr, *_ = make(tmp_path)
    with pytest.warns(RuntimeWarning) as rec:
        assert mgr.load_latest() == 1
    msgs = " ".join(str(w.message) for w in rec)
    assert "rank-0.pt is missing" in msgs and "commit marker unreadable" in msgs


def test_all_damaged_refuses_to_start_from_scratch(tmp_path):
    mgr, *state = make(tmp_path)
    train(*state)
    mgr.save(1, blocking=True)
    (tmp_path / "step-1" / ".metadata").write_bytes(b"garbage")
    mgr2, *_ = make(tmp_path)
    with pytest.warns(RuntimeWarning), pytest.raises(NoValidCheckpointError, match="refusing to start from scratch"):
        mgr2.load_latest()


@pytest.fixture
def tiny_disk(tmp_path):
    mnt = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("blocking", [True, False])
def test_full_disk_keeps_previous_checkpoint_and_says_so(tiny_disk, blocking):
    # ~0.6 MiB per checkpoint (model + AdamW moments): the first fits, the second does not.
    mgr, model, *rest = make(tiny_disk, hidden=6000)
    train(model, *rest)
    mgr.save(1, blocking=True)
    want = [p.detach().clone() for p in model.parameters()]
    train(model, *rest)
    (tiny_disk / "ballast").write_bytes(b"\0" * 400_000)
    with pytest.raises(CheckpointSaveError) as err:
        mgr.save(2, blocking=blocking)
        mgr.wait()
    msg = str(err.value)
    assert "step-2" in msg and "the disk is full" in msg and "step-1 is intact" in msg
    assert sorted(os.listdir(tiny_disk)) == ["ballast", "step-1"]  # the partial step-2 is gone

    mgr2, model2, *_ = make(tiny_disk, hidden=6000)
    assert mgr2.load_latest() == 1
    assert all(torch.equal(p, q) for p, q in zip(model2.parameters(), want))
