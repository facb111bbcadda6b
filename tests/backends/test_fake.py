"""The fake backend's own promises, beyond the conformance suite: scripted lives on a FakeClock,
the files a real rank leaves (logs, checkpoints with fake mtimes, metrics), signals recorded with
their fake times, frozen and lost ranks, node faults, programs, and the registry entry."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.backends.helpers import NODES
from trainyard.backends import registry
from trainyard.backends.base import BackendError, LaunchSpec
from trainyard.contracts import RankPlacement
from trainyard.backends.fake import FakeBackend, FakeCluster, Program, SentSignal, parse_program
from trainyard.clock import FakeClock
from trainyard.contracts import JobDir, newest_checkpoint
from trainyard.control.rules.lost_work import last_steps
from trainyard.control.rules.outcome import OOM_MARKERS

T0 = 1_700_000_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def fake(tmp_path: Path, clock: FakeClock):
    be = FakeBackend(tmp_path, NODES, clock=clock)
    yield be
    FakeCluster.forget(tmp_path)


def spec(data_dir: Path, job_id: int, *tokens: str, ranks=((0, "node0", (0,)),), attempt: int = 1) -> LaunchSpec:  # noqa: ANN001
    jd = JobDir.of(data_dir, job_id)
    return LaunchSpec(job_id, attempt, ["yard-fake", *tokens], str(data_dir), str(jd.root),
                      [RankPlacement(r, n, g) for r, n, g in ranks], {}, str(jd.checkpoints))


def rank(be: FakeBackend, job_id: int, r: int = 0, attempt: int = 1):  # noqa: ANN201
    return next(a for a in be.poll() if (a.job_id, a.attempt) == (job_id, attempt)).ranks[r]


def test_the_fake_clock_moves_only_when_told():
    c = FakeClock(10)
    assert c() == c.time() == 10
    assert c.advance(2.5) == 12.5 and c() == 12.5
    c.sleep(1)
    assert c() == 13.5
    c.set(5)
    assert c() == 5
    with pytest.raises(ValueError, match=">= 0"):
        c.advance(-1)


def test_a_rank_exits_with_its_code_after_its_run_time_in_fake_time(fake, clock, tmp_path):
    fake.launch(spec(tmp_path, 1, "run=30", "exit=3"))
    clock.advance(29.9)
    assert rank(fake, 1).running
    clock.advance(0.1)
    r = rank(fake, 1)
    assert (r.running, r.exit_code, r.signal) == (False, 3, None)
    log = JobDir.of(tmp_path, 1).rank_log(0).read_text()
    assert log.startswith("=== trainyard: attempt 1 started 2023-11-14T22:13:20Z on node0 gpus 0 ===")


def test_steps_write_metrics_and_commit_checkpoints_at_fake_times_and_a_notice_checkpoints_then_75(fake, clock, tmp_path):
    fake.launch(spec(tmp_path, 2, "step=2", "ckpt=3", "usr1=1"))
    clock.advance(13)  # steps 1..6 at T0+2..T0+12; checkpoints at steps 3 and 6
    jd = JobDir.of(tmp_path, 2)
    assert newest_checkpoint(jd.checkpoints)[::2] == (6, T0 + 12)
    records = last_steps(jd.metrics_file, 2 - 1)  # what control/lost_work reads
    assert [(r["step"], r["time"], r["step_time_s"]) for r in records] == [(s, T0 + 2 * s, 2.0) for s in range(1, 7)]
    fake.signal(2, 1, signal.SIGUSR1)
    clock.advance(0.5)
    assert rank(fake, 2).running
    clock.advance(0.5)
    assert rank(fake, 2).exit_code == 75
    assert newest_checkpoint(jd.checkpoints)[::2] == (7, T0 + 14)  # step 7 ends as it leaves: committed then
    assert fake.signals == [SentSignal(T0 + 13, 2, 1, signal.SIGUSR1)]


def test_a_new_attempt_resumes_from_the_newest_committed_step(fake, clock, tmp_path):
    fake.launch(spec(tmp_path, 3, "step=1", "ckpt=5", "run=12", "exit=75"))
    clock.advance(12)
    assert rank(fake, 3).exit_code == 75
    fake.release(3, 1)
    fake.launch(spec(tmp_path, 3, "step=1", "ckpt=5", attempt=2))
    clock.advance(3)
    jd = JobDir.of(tmp_path, 3)
    assert "resumed from step 10" in jd.rank_log(0).read_text()
    assert [r["step"] for r in last_steps(jd.metrics_file, 2)] == [11, 12, 13]


def test_the_stop_sequence_is_recorded_with_fake_times_and_sigkill_ends_an_ignoring_rank(fake, clock, tmp_path):
    fake.launch(spec(tmp_path, 4, "term=ignore"))
    fake.signal(4, 1, signal.SIGUSR1)  # no handler: the default action kills it...
    assert rank(fake, 4).signal == signal.SIGUSR1
    fake.launch(spec(tmp_path, 5, "term=ignore", "usr1=100"))
    fake.signal(5, 1, signal.SIGUSR1)
    clock.advance(30)
    fake.signal(5, 1, signal.SIGTERM)
    clock.advance(5)
    assert rank(fake, 5).running
    fake.signal(5, 1, signal.SIGKILL)
    assert (rank(fake, 5).signal, rank(fake, 5).exit_code) == (signal.SIGKILL, None)
    assert [(s.at - T0, s.sig) for s in fake.signals if s.job_id == 5] == [
        (0, signal.SIGUSR1), (30, signal.SIGTERM), (35, signal.SIGKILL)]


def test_a_frozen_rank_makes_no_progress_and_gets_its_signals_when_it_continues(fake, clock, tmp_path):
    fake.launch(spec(tmp_path, 6, "step=1", "run=10"))
    clock.advance(2)
    fake.hang_rank(6, 1, 0)
    clock.advance(100)
    r = rank(fake, 6)
    assert (r.running, r.stopped) == (True, True)
    assert [s["step"] for s in last_steps(JobDir.of(tmp_path, 6).metrics_file, 1)] == [1, 2]
    fake.signal(6, 1, signal.SIGTERM)  # waits while it is stopped
    assert rank(fake, 6).running
    fake.kill_rank(6, 1, 0, signal.SIGCONT)
    assert rank(fake, 6).signal == signal.SIGTERM
    fake.launch(spec(tmp_path, 7, "run=10"))
    fake.hang_rank(7, 1, 0)
    fake.kill_rank(7, 1, 0)  # SIGKILL needs no SIGCONT
    assert rank(fake, 7).signal == signal.SIGKILL


def test_node_faults_as_the_local_emulation_has_them(fake, clock, tmp_path):
    two = ((0, "node0", (0,)), (1, "node1", (0,)))
    fake.launch(spec(tmp_path, 8, "step=1", ranks=two))
    fake.kill_node("node1")
    r0, r1 = rank(fake, 8, 0), rank(fake, 8, 1)
    assert r0.running and (r1.running, r1.lost) == (False, True)
    assert [(n.name, n.healthy, n.state) for n in fake.inventory()] == [("node0", True, "up"), ("node1", False, "dead")]
    assert fake.check_node("node1") == (False, "node1 is dead")
    with pytest.raises(BackendError, match="node1, which is dead"):
        fake.launch(spec(tmp_path, 9, ranks=((0, "node1", (0,)),)))
    fake.revive_node("node1")
    assert rank(fake, 8, 1).lost and fake.check_node("node1")[0]
    fake.hang_node("node0")
    assert rank(fake, 8, 0).stopped and not fake.inventory()[0].healthy
    fake.revive_node("node0")
    assert not rank(fake, 8, 0).stopped
    with pytest.raises(BackendError, match="unknown node"):
        fake.kill_node("node7")


def test_an_oom_program_leaves_what_the_loop_greps_for(fake, clock, tmp_path):
    fake.launch(spec(tmp_path, 10, "run=3", "oom"))
    clock.advance(3)
    assert rank(fake, 10).exit_code == 1
    assert any(m in JobDir.of(tmp_path, 10).rank_log(0).read_text() for m in OOM_MARKERS)


def test_per_rank_programs_and_the_programs_hook(fake, clock, tmp_path):
    two = ((0, "node0", (0,)), (1, "node1", (0,)))
    fake.launch(spec(tmp_path, 11, "run=60", "rank1:run=2", "rank1:exit=1", ranks=two))
    clock.advance(2)
    assert rank(fake, 11, 0).running and rank(fake, 11, 1).exit_code == 1
    be = FakeBackend(tmp_path / "other", NODES, clock=clock, programs={"train.py": Program(run_s=5, exit_code=4)})
    (tmp_path / "other").mkdir()
    be.launch(LaunchSpec(1, 1, ["train.py", "--lr", "3e-4"], str(tmp_path), str(tmp_path / "other/jobs/1"),
                         [RankPlacement(0, "node0", (0,))], {}, str(tmp_path / "other/ck")))
    be.launch(LaunchSpec(2, 1, ["true"], str(tmp_path), str(tmp_path / "other/jobs/2"),
                         [RankPlacement(0, "node0", (0,))], {}, str(tmp_path / "other/ck2")))
    clock.advance(5)
    assert [a.ranks[0].exit_code for a in be.poll()] == [4, 0]  # the hook's; `true`: the default program
    FakeCluster.forget(tmp_path / "other")


def test_bad_programs_are_refused_naming_the_token():
    with pytest.raises(BackendError, match="unknown token 'sleep=3'"):
        parse_program(["yard-fake", "sleep=3"])
    with pytest.raises(BackendError, match="'run=soon'"):
        parse_program(["yard-fake", "run=soon"])
    base, per = parse_program(["yard-fake", "usr1=2", "term=ignore", "rank2:exit=9", "log=a", "log=b"])
    assert base == Program(on_usr1_s=2.0, on_term="ignore", log=("a", "b"))
    assert per == {2: Program(on_usr1_s=2.0, on_term="ignore", log=("a", "b"), exit_code=9)}


def test_a_data_dir_has_one_fake_cluster_and_one_clock(tmp_path, clock):
    be = FakeBackend(tmp_path, NODES, clock=clock)
    assert FakeBackend(tmp_path, NODES).cluster is be.cluster and FakeBackend(tmp_path, NODES).clock is clock
    with pytest.raises(ValueError, match="another clock"):
        FakeBackend(tmp_path, NODES, clock=FakeClock())
    FakeCluster.forget(tmp_path)


def test_the_registry_makes_a_fake_plane(tmp_path):
    kind = registry.get("fake")
    nodes = kind.discover(tmp_path, {"nodes": 2, "gpus_per_node": 8})
    assert [(n.name, n.gpus) for n in nodes] == [("node0", 8), ("node1", 8)]
    be = kind.create(tmp_path, nodes, {})
    assert isinstance(be, FakeBackend) and be.name == "fake"
    FakeCluster.forget(tmp_path)


def test_env_is_the_contract_over_the_jobs_own(fake, tmp_path):
    s = spec(tmp_path, 12)
    fake.launch(LaunchSpec(**{**s.__dict__, "env": {"USER_VAR": "u", "RANK": "overridden"}}))
    env = fake.rank_env(12, 1, 0)
    assert env["USER_VAR"] == "u" and env["RANK"] == "0" and env["SLURM_JOB_ID"] == "12"
    assert json.loads(json.dumps(env)) == env
    with pytest.raises(BackendError, match="no rank 3"):
        fake.rank_env(12, 1, 3)


def test_a_forgotten_cluster_no_longer_follows_its_clock(tmp_path, clock):
    be = FakeBackend(tmp_path, NODES, clock=clock)
    be.launch(spec(tmp_path, 13, "step=1"))
    clock.advance(2)
    FakeCluster.forget(tmp_path)
    clock.advance(5)  # no more steps written for it
    assert [r["step"] for r in last_steps(JobDir.of(tmp_path, 13).metrics_file, 1)] == [1, 2]


def test_the_real_control_loop_drives_the_fake_backend_it_got_by_name(tmp_path):
    """`PlaneSettings(backend_kind="fake")`: the loop launches, polls and classifies scripted ranks
    (real clock here; the loop's own tests put both on a FakeClock)."""
    from tests.plane import Plane

    plane = Plane(tmp_path, backend_kind="fake")
    try:
        assert isinstance(plane.cp.backend, FakeBackend)
        ok = plane.submit(command=["yard-fake", "run=0.2"], nodes=2, gpus_per_node=2, team="vision")
        bad = plane.submit(command=["yard-fake", "run=0.2", "rank1:exit=3"], nodes=2, gpus_per_node=1, team="vision")
        assert plane.wait(ok["id"], "COMPLETED")["exit_code"] == 0
        assert plane.wait(bad["id"], ("FAILED", "PENDING", "REQUEUED"), timeout=30)["state"] != "RUNNING"
        env = plane.cp.backend.rank_env(ok["id"], 1, 3)
        assert (env["RANK"], env["WORLD_SIZE"], env["SLURM_JOB_ACCOUNT"]) == ("3", "4", "vision")
    finally:
        plane.stop()
        FakeCluster.forget(tmp_path)
