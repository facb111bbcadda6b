"""What the Slurm backend reads from Slurm's output: node lines, GRES, states, topology features,
and the task layout a rank works out its environment from. Pure functions: no Slurm needed."""

from __future__ import annotations

import pytest

from trainyard.backends.slurm.backend import features_topology, gres_gpus, node_health, parse_kv_line
from trainyard.backends.slurm.task import allocation_vars, batch_env, batch_path, session_env, task_env, tasks_on_node

LINE = ("NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUTot=8 AvailableFeatures=block_b0,rack=r1,ib "
        "ActiveFeatures=block_b0,rack=r1,ib Gres=gpu:a100:4(S:0-1) NodeAddr=10.0.0.1 State=IDLE+DRAIN "
        "Partitions=main,debug")


def test_a_node_line_gives_gpus_model_address_health_and_topology():
    kv = parse_kv_line(LINE)
    assert kv["NodeName"] == "n1" and kv["NodeAddr"] == "10.0.0.1" and kv["Partitions"] == "main,debug"
    assert gres_gpus(kv["Gres"]) == (4, "a100")
    assert node_health(kv["State"]) == (False, "drain")
    assert features_topology(kv["ActiveFeatures"]) == {"block": "b0", "rack": "r1"}


@pytest.mark.parametrize("gres,want", [("gpu:4", (4, "gpu")), ("gpu:h100:8,shard:16", (8, "h100")),
                                       ("(null)", (0, "gpu")), ("shard:8", (0, "gpu"))])
def test_gres(gres, want):
    assert gres_gpus(gres) == want


@pytest.mark.parametrize("state,healthy", [("IDLE", True), ("MIXED", True), ("ALLOCATED", True),
                                           ("DOWN*", False), ("IDLE+NOT_RESPONDING", False), ("DOWN+NOT_RESPONDING", False),
                                           ("MIXED+DRAIN", False), ("IDLE*", False), ("FAIL", False)])
def test_node_states(state, healthy):
    assert node_health(state)[0] is healthy


def test_tasks_per_node_forms():
    assert [tasks_on_node("4(x2)", i) for i in (0, 1)] == [4, 4]
    assert [tasks_on_node("3,1", i) for i in (0, 1)] == [3, 1]
    assert [tasks_on_node("2(x2),1", i) for i in (0, 1, 2)] == [2, 2, 1]


SLURM_TASK = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_TASKS_PER_NODE": "4(x2)",
              "SLURM_NODEID": "1", "SLURMD_NODENAME": "n2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_ID": "31",
              "CUDA_VISIBLE_DEVICES": "0,1,2,3", "TRAINYARD_GPUS_PER_RANK": "1", "TRAINYARD_JOB_ID": "7",
              "TRAINYARD_ATTEMPT": "2", "TRAINYARD_CHECKPOINT_DIR": "/ck", "MASTER_ADDR": "10.0.0.1",
              "MASTER_PORT": "29500"}


def test_a_task_gets_the_contract_and_its_own_gpus_out_of_the_nodes():
    env = task_env(SLURM_TASK)
    assert env["RANK"] == "5" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "8" and env["GROUP_RANK"] == "1"
    assert env["LOCAL_WORLD_SIZE"] == "4" and env["TRAINYARD_NODE"] == "n2" and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "29500")
    assert (env["TRAINYARD_JOB_ID"], env["TRAINYARD_ATTEMPT"], env["TRAINYARD_CHECKPOINT_DIR"]) == ("7", "2", "/ck")
    assert (env["ROLE_RANK"], env["ROLE_WORLD_SIZE"], env["TORCHELASTIC_RUN_ID"]) == ("5", "8", "7")
    # Slurm's own variables stay Slurm's: the task adds none
    assert not [k for k in env if k.startswith(("SLURM_", "SLURMD_"))]


def test_a_task_without_gpus_per_rank_keeps_slurms_cuda_visible_devices():
    env = task_env({**SLURM_TASK, "TRAINYARD_GPUS_PER_RANK": "0"})
    assert "CUDA_VISIBLE_DEVICES" not in env


def test_a_task_refuses_a_layout_that_is_not_slurms_block_one():
    with pytest.raises(ValueError, match="block layout"):
        task_env({**SLURM_TASK, "SLURM_LOCALID": "2"})
    with pytest.raises(ValueError, match="runs on n1"):
        task_env({**SLURM_TASK, "SLURMD_NODENAME": "n1"})


def _tools(tmp_path, name: str, *tools: str) -> str:
    d = tmp_path / name
    d.mkdir()
    for t in tools:
        (d / t).write_text("#!/bin/sh\n")
        (d / t).chmod(0o755)
    return str(d)


def test_a_batch_script_finds_slurms_srun_behind_the_jobs_path(tmp_path):
    slurm = _tools(tmp_path, "slurm", "srun", "scontrol")
    mine = _tools(tmp_path, "mine", "python")
    assert batch_path(f"{mine}:/nowhere", f"/usr/sbin:{slurm}") == f"{mine}:/nowhere:{slurm}"
    assert batch_path(f"{slurm}:{mine}", slurm) == f"{slurm}:{mine}"  # already there: the job's order kept


def test_the_batch_step_keeps_slurms_variables_over_the_jobs_and_gets_no_task_ones(tmp_path):
    step = {"SLURM_JOB_ID": "12", "SLURMD_NODENAME": "n1", "CUDA_VISIBLE_DEVICES": "0,1", "MASTER_PORT": "29500",
            "PATH": _tools(tmp_path, "slurm", "srun", "scontrol"), "TRAINYARD_GPUS_PER_RANK": "1"}
    job = {"SLURM_JOB_ID": "999", "CUDA_VISIBLE_DEVICES": "7", "MINE": "yes", "TRAINYARD_JOB_ID": "3", "PATH": ""}
    env = batch_env(step, job)
    assert (env["SLURM_JOB_ID"], env["CUDA_VISIBLE_DEVICES"], env["MASTER_PORT"]) == ("12", "0,1", "29500")
    assert (env["MINE"], env["TRAINYARD_JOB_ID"], env["TRAINYARD_NODE"]) == ("yes", "3", "n1")
    assert env["PATH"] == step["PATH"]
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "TRAINYARD_GPUS_PER_RANK"} & set(env)


# What Slurm 22.05 gives a one-task `srun --jobid=J --overlap --pty -N1 -n1 -w n1` step of a 2-node
# job (abridged, as printed on the test cluster) and the batch step of that job.
STEP = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_NNODES": "1", "SLURM_NTASKS": "1", "SLURM_NPROCS": "1",
        "SLURM_TASKS_PER_NODE": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_NODELIST": "n[1-2]", "SLURM_JOB_NAME": "bash",
        "SLURM_STEP_ID": "0", "SLURM_STEPID": "0", "SLURM_STEP_NODELIST": "n1", "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_PTY_PORT": "4000", "CUDA_VISIBLE_DEVICES": "0", "SLURM_TASK_PID": "99", "PATH": "/usr/bin"}
BATCH = {"SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n1", "SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
         "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NODELIST": "n[1-2]",
         "SLURM_JOB_NAME": "interactive", "SLURM_JOB_NUM_NODES": "2", "SLURM_SUBMIT_DIR": "/home/a",
         "SLURM_TASK_PID": "42", "SLURM_PROCID": "0", "SLURM_CONF": "/etc/slurm.conf", "CUDA_VISIBLE_DEVICES": "0"}


def test_the_sessions_environment_is_the_allocations_as_in_sallocs_interactive_step():
    alloc = allocation_vars(BATCH)
    assert "SLURM_TASK_PID" not in alloc and "SLURM_PROCID" not in alloc and "CUDA_VISIBLE_DEVICES" not in alloc
    env = session_env(STEP, alloc, {"TRAINYARD_JOB_ID": "3", "MINE": "yes", "SLURM_NNODES": "9", "PATH": ""})
    got = {k: env.get(k) for k in ("SLURM_NNODES", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE",
                                   "SLURM_JOB_NODELIST", "SLURM_JOB_NAME", "SLURM_TASK_PID", "SLURM_PTY_PORT")}
    assert got == {"SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_TASKS_PER_NODE": "1(x2)",
                   "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NAME": "interactive", "SLURM_TASK_PID": "99",
                   "SLURM_PTY_PORT": "4000"}
    assert not [k for k in env if k.startswith("SLURM_STEP")]
    assert (env["TRAINYARD_JOB_ID"], env["MINE"], env["TRAINYARD_NODE"], env["CUDA_VISIBLE_DEVICES"]) == ("3", "yes", "n1", "0")


def test_without_the_batch_steps_record_the_session_spans_the_nodes_slurm_names():
    env = session_env(STEP, None, {})
    assert (env["SLURM_NNODES"], env["SLURM_JOB_NUM_NODES"], env["SLURM_JOB_NODELIST"]) == ("2", "2", "n[1-2]")
    assert not {"SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE"} & set(env)  # srun's defaults: a task a node
    assert not [k for k in env if k.startswith("SLURM_STEP")]
