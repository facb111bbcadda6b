"""Phase timings (issue 39): each rank's data wait, checkpoint stall and time in collectives, in its
phase file — measured against sleeps and saves whose length the test knows, in real processes
where ranks must differ (DDP on gloo), read while it is being written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import trainyard.runtime as yr
from trainyard.contracts import JobDir
from trainyard.runtime.phases import union_s

from .helpers import REPO, Ranks

SCRIPT = Path(__file__).with_name("phases_script.py")
SLEEP = 0.05


def phase_file(metrics: Path, rank: int = 0, attempt: int = 0) -> dict:
    return json.loads((metrics / "phases" / f"attempt-{attempt}-rank-{rank}.json").read_text())


def assert_consistent(rec: dict) -> None:
    """What every version of the file keeps: the contract's fields, phases within the steps."""
    assert rec["v"] == 1 and set(rec) == {"v", "attempt", "rank", "began", "last", "step", "steps", "phases",
                                          "after_last", "ended", "recent"}
    p = rec["phases"]
    assert all(p[k] >= 0 for k in ("data_wait", "checkpoint_stall", "comm"))
    assert p["data_wait"] + p["checkpoint_stall"] + p["comm"] <= p["step"] + 1e-5
    assert len(rec["recent"]) <= min(rec["steps"], 32)
    assert all(0 <= comm <= step_s + 1e-6 for _, step_s, comm in rec["recent"])
    assert [r[0] for r in rec["recent"]] == sorted(r[0] for r in rec["recent"])


def tiny_run(tmp_path: Path, **kw) -> tuple[yr.Run, torch.nn.Module, torch.optim.Optimizer]:
    ctx = yr.init(seed=0, env=yr.JobEnv())
    model = kw.pop("model", None) or torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = yr.Run(ctx, model=model, optimizer=opt, checkpoint_dir=str(tmp_path / "ckpt"),
                 metrics_dir=str(tmp_path / "metrics"), **kw)
    return run, model, opt


def train(run: yr.Run, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, data_sleep: float = 0.0):
    def loader():
        while True:
            if data_sleep:
                time.sleep(data_sleep)
            yield torch.randn(4, 8)

    for _, x in zip(run.steps(steps), run.data(loader())):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log(loss=loss)


def test_a_loader_that_sleeps_is_data_wait(tmp_path):
    run, model, opt = tiny_run(tmp_path)
    t0 = time.time()
    train(run, model, opt, 8, data_sleep=SLEEP)
    rec = phase_file(tmp_path / "metrics")
    assert_consistent(rec)
    assert rec["steps"] == 8 and rec["step"] == 8 and [r[0] for r in rec["recent"]] == list(range(1, 9))
    assert t0 <= rec["began"] <= rec["last"] <= rec["ended"] <= time.time()
    # every next() sleeps 50 ms: at least that, and not much more than the wrapper's own time
    assert 8 * SLEEP <= rec["phases"]["data_wait"] <= 8 * SLEEP + 0.15, rec["phases"]
    assert rec["phases"]["checkpoint_stall"] == 0 and rec["phases"]["comm"] == 0
    assert rec["phases"]["step"] - rec["phases"]["data_wait"] < 0.5  # the compute of eight tiny steps


def test_a_synchronous_checkpoint_is_checkpoint_stall_and_the_final_save_is_after_the_last_step(tmp_path):
    run, model, opt = tiny_run(tmp_path, checkpoint_every=2, async_checkpoint=False)
    saves: dict[int, float] = {}
    run.checkpoints.on_commit.append(lambda step, path, seconds: saves.__setitem__(step, seconds))
    train(run, model, opt, 5)
    rec = phase_file(tmp_path / "metrics")
    assert_consistent(rec)
    assert sorted(saves) == [2, 4, 5]
    # the saves of steps 2 and 4 start after those steps are logged: the loop waits for them in
    # steps 3 and 5; the final save of step 5 comes after the newest step
    stall, after = rec["phases"]["checkpoint_stall"], rec["after_last"]["checkpoint_stall"]
    assert saves[2] + saves[4] <= stall <= saves[2] + saves[4] + 0.1, (stall, saves)
    assert saves[5] <= after <= saves[5] + 0.1, (after, saves)
    by_step = {s: t for s, t, _ in rec["recent"]}
    assert by_step[3] >= saves[2] and by_step[5] >= saves[4]
    assert rec["ended"] is not None


def test_the_preemption_save_is_after_the_last_step(tmp_path):
    run, model, opt = tiny_run(tmp_path, exit_on_preempt=False)
    saves: dict[int, float] = {}
    run.checkpoints.on_commit.append(lambda step, path, seconds: saves.__setitem__(step, seconds))
    for step in run.steps(10):
        model(torch.randn(4, 8)).sum().backward()
        if step == 3:
            run.preemption.request()  # as if the notice had come: this step is saved, then the loop ends
    deadline = time.monotonic() + 5
    while (during := phase_file(tmp_path / "metrics"))["steps"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)  # handed to the writer thread at the preemption, before finish()
    assert during["steps"] == 3 and during["ended"] is None
    run.finish()
    rec = phase_file(tmp_path / "metrics")
    assert_consistent(rec)
    assert list(saves) == [3] and rec["phases"]["checkpoint_stall"] == 0
    after = rec["after_last"]["checkpoint_stall"]
    assert saves[3] <= after <= saves[3] + 0.1 and after == pytest.approx(during["after_last"]["checkpoint_stall"], abs=0.01)
    assert rec["ended"] is not None


def test_a_phase_name_outside_the_three_is_refused_and_phases_do_not_nest(tmp_path):
    run, model, opt = tiny_run(tmp_path)
    with pytest.raises(ValueError, match="phase 'compute': expected one of data_wait, checkpoint_stall, comm"):
        run.phase("compute")
    run.resume()
    with run.phase("checkpoint_stall"):
        with run.phase("data_wait"):  # inside another phase: counts for the outer one
            time.sleep(SLEEP)
    run.step_done(1)
    run.finish()
    p = phase_file(tmp_path / "metrics")["phases"]
    assert p["data_wait"] == 0 and SLEEP <= p["checkpoint_stall"] <= p["step"]


def test_the_union_of_overlapping_collectives_within_the_step():
    spans = [(1.0, 3.0), (2.0, 4.0), (6.0, 7.0), (0.0, 0.5)]
    assert union_s(spans, 0.0, 10.0) == pytest.approx(4.5)
    assert union_s(spans, 2.5, 6.5) == pytest.approx(2.0)  # clipped to the step
    assert union_s([], 0.0, 1.0) == 0.0


def test_no_writable_phase_dir_warns_once_and_training_goes_on(tmp_path, capsys):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "phases").write_text("a file where the directory should be")
    run, model, opt = tiny_run(tmp_path, phases_every_s=0.0)  # try to write at every step
    train(run, model, opt, 4)
    err = capsys.readouterr().err
    assert err.count("cannot write the phase timings") == 1, err
    assert "training goes on without them" in err
    assert sorted(yr.read_metrics(tmp_path / "metrics")) == [1, 2, 3, 4]


def test_off_switch_writes_nothing_and_leaves_the_loader_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINYARD_PHASES", "0")
    run, model, opt = tiny_run(tmp_path)
    loader = [torch.randn(4, 8)]
    assert run.phases is None and run.data(loader) is loader
    train(run, model, opt, 2)
    assert not (tmp_path / "metrics" / "phases").exists()
    assert sorted(yr.read_metrics(tmp_path / "metrics")) == [1, 2]


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_ddp_gets_the_timed_hook_unless_it_has_its_own(tmp_path, one_rank_group):
    ddp = DDP(torch.nn.Linear(8, 1))
    run, _, opt = tiny_run(tmp_path / "ours", model=ddp)
    assert run.comm_hook is not None
    train(run, ddp, opt, 3)
    rec = phase_file(tmp_path / "ours" / "metrics")
    assert rec["phases"]["comm"] > 0 and all(comm > 0 for _, _, comm in rec["recent"])

    calls: list[int] = []

    def own_hook(state, bucket):
        calls.append(1)
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    theirs = DDP(torch.nn.Linear(8, 1))
    theirs.register_comm_hook(None, own_hook)
    run, _, opt = tiny_run(tmp_path / "theirs", model=theirs)
    assert run.comm_hook is None
    train(run, theirs, opt, 3)
    assert len(calls) == 3 and theirs._comm_hooks == [(own_hook, None)]  # theirs ran, ours was not added


# -- real ranks ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_rank(tmp_path_factory) -> Path:
    """Two DDP ranks on gloo; rank 1 does 100 ms more own work per step."""
    out = tmp_path_factory.mktemp("slow-rank")
    ranks = Ranks(out, 2, ["--steps", "8", "--slow-rank", "1", "--slow-s", "0.1"], script=SCRIPT)
    assert ranks.wait(90) == [0, 0], ranks.log(0)[-2000:] + ranks.log(1)[-2000:]
    return out


def test_the_slow_rank_has_the_most_own_work_and_the_fast_one_waits_in_the_all_reduce(slow_rank):
    r0, r1 = (phase_file(slow_rank / "metrics", rank) for rank in (0, 1))
    for rec in (r0, r1):
        assert_consistent(rec)
        assert rec["steps"] == 8
    own0 = r0["phases"]["step"] - r0["phases"]["comm"]
    own1 = r1["phases"]["step"] - r1["phases"]["comm"]
    extra = 8 * 0.1
    assert own1 - own0 > 0.6 * extra, (r0["phases"], r1["phases"])
    assert r0["phases"]["comm"] - r1["phases"]["comm"] > 0.6 * extra, (r0["phases"], r1["phases"])
    # per step too, as the straggler detector reads it: rank 0 waits ~100 ms in every step after the first
    waits = [c0 - c1 for (_, _, c0), (_, _, c1) in zip(r0["recent"][1:], r1["recent"][1:])]
    assert sum(w > 0.05 for w in waits) >= len(waits) - 1, waits


def test_a_wait_in_ddps_buffer_broadcast_before_the_forward_is_comm_too(tmp_path):
    """Rank 1 slow before its forward, the model with a buffer: rank 0 waits in DDP's broadcast of
    the buffers at the next forward, not in the all-reduce; its own work stays small."""
    ranks = Ranks(tmp_path, 2, ["--steps", "8", "--slow-rank", "1", "--slow-s", "0.1", "--slow-before-forward",
                                "--buffer"], script=SCRIPT)
    assert ranks.wait(90) == [0, 0], ranks.log(0)[-2000:] + ranks.log(1)[-2000:]
    r0, r1 = (phase_file(tmp_path / "metrics", rank) for rank in (0, 1))
    own = [{step: step_s - comm for step, step_s, comm in r["recent"][2:]} for r in (r0, r1)]  # after DDP's set-up
    slow = [s for s in own[1] if own[1][s] > 0.08]
    assert len(slow) >= 4, own
    assert all(own[0][s] < 0.05 for s in slow), own  # rank 0's wait for it is all in collectives


def test_the_timed_hook_is_ddps_own_all_reduce(slow_rank, tmp_path):
    """The same training with phase timing off (DDP's built-in all-reduce) ends bit for bit the same."""
    ranks = Ranks(tmp_path, 2, ["--steps", "8"], script=SCRIPT, env={"TRAINYARD_PHASES": "0"})
    assert ranks.wait(90) == [0, 0], ranks.log(0)[-2000:]
    assert not (tmp_path / "metrics" / "phases").exists()
    for rank in (0, 1):
        on = torch.load(slow_rank / f"params-rank{rank}.pt")
        off = torch.load(tmp_path / f"params-rank{rank}.pt")
        assert on.keys() == off.keys() and all(torch.equal(on[k], off[k]) for k in on)


def test_the_file_is_valid_json_at_every_moment_in_the_job_dir(tmp_path):
    """Read every 2 ms while a rank rewrites it every 10 ms: always whole, always consistent;
    under a control plane it is the job dir's `metrics/phases/attempt-<a>-rank-<r>.json`."""
    job = JobDir(tmp_path / "jobs" / "5-abc")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update(OMP_NUM_THREADS="1", TRAINYARD_JOB_ID="5", TRAINYARD_ATTEMPT="3",
               TRAINYARD_CHECKPOINT_DIR=str(job.checkpoints),
               PYTHONPATH=str(REPO / "src") + os.pathsep + env.get("PYTHONPATH", ""))
    path = job.phases_file(3, 0)
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--out", str(tmp_path), "--steps", "60",
                             "--step-sleep", "0.02", "--every", "0.01"], env=env, stderr=subprocess.PIPE, text=True)
    reads, versions = 0, set()
    try:
        while proc.poll() is None:
            time.sleep(0.002)  # leave the rank a core: this machine may have two
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            rec = json.loads(text)  # never a torn or half-written file
            assert_consistent(rec)
            assert (rec["attempt"], rec["rank"]) == (3, 0)
            reads += 1
            versions.add(rec["steps"])
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    final = json.loads(path.read_text())
    assert final["steps"] == 60 and final["ended"] is not None
    assert reads > 50 and len(versions) > 10, (reads, versions)
    assert not [p.name for p in path.parent.iterdir() if p.name != path.name]  # no temporary file left
