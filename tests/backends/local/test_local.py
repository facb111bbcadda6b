"""The local backend with real processes: environment, exit facts, signals, re-attach, failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from trainyard.backends import BackendError, LocalBackend, NodeInfo, detect_local_nodes
from trainyard.backends.rundir.procfs import read_stat
from trainyard.backends.local.backend import _nvml_gpus
from trainyard.contracts import Gang, JobInfo, RankPlacement, rank_env

from tests.backends.helpers import (
    NODES,
    attempt_state,
    live,
    make_spec,
    marked_processes,
    wait_done,
    wait_until,
)

PY = sys.executable
# Writes the rank's environment to <job_dir>/env-<RANK>.json (job_dir is argv[1]).
DUMP_ENV = [
    PY,
    "-c",
    "import json, os, sys; json.dump(dict(os.environ), open(os.path.join(sys.argv[1], 'env-' + os.environ['RANK'] + '.json'), 'w'))",
]



def envs(job_dir: Path, n: int) -> list[dict[str, str]]:
    return [json.loads((job_dir / f"env-{r}.json").read_text()) for r in range(n)]


# -- environment contract ------------------------------------------------------------------------


def test_two_ranks_on_one_node_get_distinct_gpus_and_the_contract_env(backend, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINYARD_DATABASE_URL", "secret")  # the control plane's own setting
    job_dir = tmp_path / "jobs" / "1"
    spec = make_spec(
        tmp_path, 1, DUMP_ENV + [str(job_dir)], ranks=[(0, "node0", (0, 1)), (1, "node0", (2, 3))],
        env={"USER_VAR": "u", "TRAINYARD_API": "http://cp", "RANK": "overridden-by-contract"},
    )
    backend.launch(spec)
    state = wait_done(backend, 1)
    assert [(r.exit_code, r.signal, r.lost) for r in state.ranks] == [(0, None, False)] * 2
    e0, e1 = envs(job_dir, 2)
    for r, e in enumerate((e0, e1)):
        assert e["RANK"] == str(r) and e["LOCAL_RANK"] == str(r)
        assert e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["MASTER_ADDR"] == "127.0.0.1"
        assert e["TRAINYARD_JOB_ID"] == "1" and e["TRAINYARD_ATTEMPT"] == "1"
        assert e["TRAINYARD_CHECKPOINT_DIR"] == str(job_dir / "ckpt")
        assert e["TRAINYARD_NODE"] == "node0"
        assert e["USER_VAR"] == "u" and e["TRAINYARD_API"] == "http://cp"
        assert "TRAINYARD_DATABASE_URL" not in e
        assert e["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert e0["CUDA_VISIBLE_DEVICES"] == "0,1" and e1["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert e0["MASTER_PORT"] == e1["MASTER_PORT"] and 0 < int(e0["MASTER_PORT"]) < 65536
    log = (job_dir / "logs" / "rank-1.log").read_text()
    assert log.startswith("=== trainyard: attempt 1 started ") and log.rstrip().endswith("on node0 gpus 2,3 ===")


def test_two_nodes_of_two_gpus_number_local_ranks_per_node(backend, tmp_path):
    job_dir = tmp_path / "jobs" / "2"
    ranks = [(0, "node0", (0,)), (1, "node0", (1,)), (2, "node1", (0,)), (3, "node1", (1,))]
    backend.launch(make_spec(tmp_path, 2, DUMP_ENV + [str(job_dir)], ranks=ranks))
    wait_done(backend, 2)
    es = envs(job_dir, 4)
    assert [e["RANK"] for e in es] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in es] == ["0", "1", "0", "1"]
    assert {e["WORLD_SIZE"] for e in es} == {"4"} and {e["LOCAL_WORLD_SIZE"] for e in es} == {"2"}
    assert len({e["MASTER_PORT"] for e in es}) == 1
    assert [e["TRAINYARD_NODE"] for e in es] == ["node0", "node0", "node1", "node1"]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in es] == ["0", "1", "0", "1"]  # emulated: node-local


def test_a_two_node_gang_sees_the_whole_job_environment_built_by_contracts(backend, tmp_path, monkeypatch):
    """Every part of `contracts.rank_env`, exactly, and nothing of a Slurm allocation the plane itself runs in."""
    monkeypatch.setenv("SLURM_STEP_ID", "3")  # as if `yard up` ran inside a Slurm job
    monkeypatch.setenv("SLURM_JOB_ID", "999")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/slurm.conf")
    job_dir = tmp_path / "jobs" / "4"
    ranks = [(0, "node0", (0,)), (1, "node0", (1,)), (2, "node1", (0,)), (3, "node1", (1,))]
    info = JobInfo(name="sweep", team="vision", pool="default", job_class="training", cluster="lab",
                   submit_host="login1", tasks_per_node=2)
    spec = replace(make_spec(tmp_path, 4, DUMP_ENV + [str(job_dir)], ranks=ranks, attempt=2), job=info)
    backend.launch(spec)
    wait_done(backend, 4, attempt=2)
    es = envs(job_dir, 4)
    gang = Gang(tuple(RankPlacement(r, n, g) for r, n, g in ranks))
    for r, e in enumerate(es):
        want = rank_env(gang, r, job_id=4, attempt=2, checkpoint_dir=spec.checkpoint_dir, master_addr="127.0.0.1",
                        master_port=int(es[0]["MASTER_PORT"]), workdir=spec.workdir, info=info)
        assert {k: e.get(k) for k in want} == want
        assert e["SLURM_RESTART_COUNT"] == "1" and e["SLURM_JOB_ID"] == "4"
        assert "SLURM_STEP_ID" not in e and e["SLURM_CONF"] == "/etc/slurm/slurm.conf"
    assert [e["SLURM_JOB_NODELIST"] for e in es] == ["node[0-1]"] * 4


def test_nodes_sliced_from_real_gpus_map_to_physical_indices(tmp_path):
    nodes = [NodeInfo("node0", 2, "NVIDIA H200", 143771), NodeInfo("node1", 2, "NVIDIA H200", 143771)]
    be = LocalBackend(tmp_path, nodes)
    job_dir = tmp_path / "jobs" / "3"
    be.launch(make_spec(tmp_path, 3, DUMP_ENV + [str(job_dir)], ranks=[(0, "node0", (1,)), (1, "node1", (0, 1))]))
    wait_done(be, 3)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs(job_dir, 2)] == ["1", "2,3"]
    be.release(3, 1)


# -- exit facts ----------------------------------------------------------------------------------


def test_exit_codes_and_signal_deaths_are_reported_and_runners_reaped(backend, tmp_path):
    for job, code in ((10, 0), (11, 3), (12, 75)):
        backend.launch(make_spec(tmp_path, job, ["sh", "-c", f"exit {code}"]))
    backend.launch(make_spec(tmp_path, 13, ["sh", "-c", "kill -TERM $$"]))
    got = {job: wait_done(backend, job).ranks[0] for job in (10, 11, 12, 13)}
    assert [(got[j].exit_code, got[j].signal, got[j].running) for j in (10, 11, 12)] == [
        (0, None, False), (3, None, False), (75, None, False),
    ]
    assert (got[13].exit_code, got[13].signal, got[13].lost) == (None, signal.SIGTERM, False)
    # Polling reaped our runners: not even a zombie is left.
    assert all(read_stat(r.pid) is None for r in got.values())


def test_sigkill_takes_the_whole_group_including_grandchildren(backend, tmp_path):
    gc_file = tmp_path / "grandchild.pid"
    backend.launch(make_spec(tmp_path, 30, ["sh", "-c", 'sleep 60 & echo $! > "$0"; sleep 60; wait', str(gc_file)]))
    grandchild = int(wait_until(lambda: gc_file.exists() and gc_file.read_text().strip(), what="grandchild"))
    runner = attempt_state(backend, 30).ranks[0].pid
    assert live(grandchild) and live(runner)
    backend.signal(30, 1, signal.SIGKILL)
    rank = wait_done(backend, 30).ranks[0]
    assert (rank.signal, rank.lost) == (signal.SIGKILL, False)  # we watched the runner die
    wait_until(lambda: not live(grandchild), timeout=5, what="grandchild gone")
    assert marked_processes(tmp_path) == []
    # What this owner saw is on disk: a later owner reports the same.
    later = LocalBackend(tmp_path, NODES).poll()[0].ranks[0]
    assert (later.signal, later.lost) == (signal.SIGKILL, False)


# -- re-attach after the owner is killed ---------------------------------------------------------

OWNER = textwrap.dedent(
    """
    import json, sys, time
    from trainyard.backends import LocalBackend
    from tests.backends.helpers import NODES, make_spec
    from pathlib import Path
    data_dir = Path(sys.argv[1])
    be = LocalBackend(data_dir, NODES)
    for job, cmd in json.loads(sys.argv[2]):
        be.launch(make_spec(data_dir, job, cmd))
    print("launched", flush=True)
    time.sleep(120)
    """
)


def test_a_new_owner_reattaches_to_ranks_left_by_a_killed_one(tmp_path):
    jobs = [
        (1, ["sh", "-c", "while [ ! -e go1 ]; do sleep 0.05; done; exit 7"]),  # ends after re-attach
        (2, ["sh", "-c", "while [ ! -e go2 ]; do sleep 0.05; done; exit 5"]),  # ends while no owner
        (3, ["sleep", "60"]),  # its runner gets SIGKILLed while no owner
    ]
    repo = Path(__file__).resolve().parents[3]
    owner = subprocess.Popen(
        [PY, "-c", OWNER, str(tmp_path), json.dumps(jobs)], cwd=repo, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout.readline().strip() == "launched"
    finally:
        owner.kill()  # kill -9 of the control plane
        owner.wait()
        owner.stdout.close()

    (tmp_path / "go2").touch()
    wait_until(lambda: (tmp_path / "jobs/2/run/attempt-1/rank-0.exit").exists(), what="job 2 recorded")
    runner3 = json.loads((tmp_path / "jobs/3/run/attempt-1/rank-0.json").read_text())["pid"]
    os.kill(runner3, signal.SIGKILL)
    wait_until(lambda: not live(runner3), what="runner of job 3 gone")

    be = LocalBackend(tmp_path, NODES)
    states = {a.job_id: a.ranks[0] for a in be.poll()}
    assert states[1].running and not states[1].lost
    assert (states[2].running, states[2].exit_code, states[2].lost) == (False, 5, False)
    assert (states[3].running, states[3].exit_code, states[3].signal, states[3].lost) == (False, None, None, True)
    assert states[3].pid == runner3

    (tmp_path / "go1").touch()
    rank = wait_done(be, 1).ranks[0]
    assert (rank.exit_code, rank.signal, rank.lost) == (7, None, False)

    # Job 3's command outlived its runner. Its attempt is over (the rank is lost), so nothing of
    # it may run on: the poll that reported it ended it through its cell (cgroup modes), and a
    # release would have otherwise.
    wait_until(lambda: not marked_processes(tmp_path), what="job 3's command ended")
    for job in (1, 2, 3):
        be.release(job, 1)
    assert be.poll() == [] and LocalBackend(tmp_path, NODES).poll() == []
    assert marked_processes(tmp_path) == []
    assert (tmp_path / "jobs/1/logs/rank-0.log").exists()


def test_a_recorded_pid_now_used_by_another_process_is_lost_and_never_signalled(tmp_path):
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        run_dir = tmp_path / "jobs/99/run/attempt-1"
        run_dir.mkdir(parents=True)
        (run_dir / "attempt.json").write_text(json.dumps({"job_id": 99, "attempt": 1, "world_size": 1}))
        real_start = read_stat(stranger.pid).start_time
        record = {"pid": stranger.pid, "pgid": stranger.pid, "start_time": real_start + 1}
        (run_dir / "rank-0.json").write_text(json.dumps(record))

        be = LocalBackend(tmp_path, NODES)
        rank = attempt_state(be, 99).ranks[0]
        assert (rank.pid, rank.running, rank.lost) == (stranger.pid, False, True)
        be.signal(99, 1, signal.SIGTERM)
        be.release(99, 1)
        assert stranger.poll() is None and not run_dir.exists()
    finally:
        stranger.kill()
        stranger.wait()


# -- launch failures and bookkeeping -------------------------------------------------------------


def test_uncreatable_job_dir_raises_and_starts_nothing(backend, tmp_path):
    (tmp_path / "jobs").write_text("a file where the jobs directory should be")
    with pytest.raises(BackendError, match="cannot create"):
        backend.launch(make_spec(tmp_path, 40, ["sleep", "30"]))
    assert backend.poll() == [] and marked_processes(tmp_path) == []


@pytest.mark.parametrize("make_command", ["missing", "not-executable"])
def test_command_that_cannot_run_fails_the_launch_for_every_rank(backend, tmp_path, make_command):
    if make_command == "missing":
        command = ["no-such-command-trainyard"]
    else:
        tool = tmp_path / "tool.sh"
        tool.write_text("#!/bin/sh\nexit 0\n")
        command = [str(tool)]
    two = [(0, "node0", (0,)), (1, "node1", (0,))]
    with pytest.raises(BackendError, match=r"cannot execute .*(No such file|Permission denied)"):
        backend.launch(make_spec(tmp_path, 41, command, ranks=two))
    assert backend.poll() == [] and marked_processes(tmp_path) == []
    assert not (tmp_path / "jobs/41/run/attempt-1").exists()
    logs = [(tmp_path / f"jobs/41/logs/rank-{r}.log").read_text() for r in (0, 1)]
    assert any("trainyard: cannot execute" in log for log in logs)  # the other rank may be killed first
    # Nothing stale blocks a corrected launch of the same attempt.
    backend.launch(make_spec(tmp_path, 41, ["true"], ranks=two))
    assert [r.exit_code for r in wait_done(backend, 41).ranks] == [0, 0]


def test_bad_placement_or_workdir_is_refused_before_anything_starts(backend, tmp_path):
    with pytest.raises(BackendError, match="unknown node"):
        backend.launch(make_spec(tmp_path, 42, ["true"], ranks=[(0, "node7", (0,))]))
    with pytest.raises(BackendError, match="has no GPU"):
        backend.launch(make_spec(tmp_path, 42, ["true"], ranks=[(0, "node0", (4,))]))
    with pytest.raises(BackendError, match="ranks must be 0..n-1"):
        backend.launch(make_spec(tmp_path, 42, ["true"], ranks=[(1, "node0", (0,))]))
    with pytest.raises(BackendError, match="cannot enter the working directory .*nope.* does not exist"):
        backend.launch(make_spec(tmp_path, 42, ["true"], workdir=tmp_path / "nope"))
    assert backend.poll() == []


def test_requeued_attempt_appends_to_the_same_log_and_release_keeps_it(backend, tmp_path):
    backend.launch(make_spec(tmp_path, 50, ["sh", "-c", "echo first; exit 75"]))
    assert wait_done(backend, 50).ranks[0].exit_code == 75
    with pytest.raises(BackendError, match="already launched"):
        backend.launch(make_spec(tmp_path, 50, ["true"]))
    backend.release(50, 1)
    assert attempt_state(backend, 50) is None
    backend.launch(make_spec(tmp_path, 50, ["sh", "-c", "echo second"], attempt=2))
    assert wait_done(backend, 50, attempt=2).ranks[0].exit_code == 0
    log = (tmp_path / "jobs/50/logs/rank-0.log").read_text().splitlines()
    assert [line.split(" started")[0] for line in log if line.startswith("===")] == [
        "=== trainyard: attempt 1", "=== trainyard: attempt 2",
    ]
    assert "first" in log and "second" in log


def test_detect_local_nodes_emulates_without_nvml():
    nodes = detect_local_nodes(2, 4)
    assert [n.name for n in nodes] == ["node0", "node1"]
    if _nvml_gpus():  # a machine with real GPUs: slices of them
        assert all(n.gpus == 4 and n.gpu_model != "emulated" for n in nodes)
    else:
        assert nodes == [NodeInfo(f"node{i}", 4, "emulated", 16384) for i in range(2)]
        assert detect_local_nodes() == [NodeInfo("node0", 4, "emulated", 16384)]
    with pytest.raises(ValueError):
        detect_local_nodes(0)


def test_runner_whose_attempt_was_released_while_starting_ends_its_command(tmp_path):
    # An owner died mid-launch and the next one released the attempt before this runner reported
    # in: the runner must not leave its command running untracked.
    from trainyard.backends.local.backend import RUNNER

    env = {**os.environ, "TRAINYARD_TEST_MARK": str(tmp_path)}
    runner = subprocess.Popen(
        [PY, "-I", "-S", str(RUNNER), str(tmp_path / "released"), "0", "--", "sleep", "30"],
        env=env, start_new_session=True,
    )
    assert runner.wait(timeout=10) == -signal.SIGKILL
    wait_until(lambda: marked_processes(tmp_path) == [], timeout=5, what="command gone")
