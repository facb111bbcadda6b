"""The contracts module, pure: one rank's environment, Slurm's list formats, the job directory.

The hostlist cases are what `scontrol show hostlist` / `show hostnames` of Slurm 22.05 print for
the same input (checked on the test cluster of tests/slurm_cluster.py).
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainyard import contracts
from trainyard.contracts import (
    EnvPart,
    Gang,
    JobDir,
    JobInfo,
    RankPlacement,
    array_env,
    compress_hostlist,
    expand_hostlist,
    format_tasks_per_node,
    parse_tasks_per_node,
    rank_env,
)

TWO_BY_TWO = Gang((RankPlacement(0, "node0", (0,)), RankPlacement(1, "node0", (1,)), RankPlacement(2, "node1", (2,)),
                   RankPlacement(3, "node1", (3,))))
INFO = JobInfo(name="pretrain", team="vision", pool="a100", job_class="training", cluster="lab",
               submit_host="login1", tasks_per_node=2)


def env_of(gang: Gang, rank: int, *, attempt: int = 1, info: JobInfo = INFO, parts: EnvPart = EnvPart.ALL) -> dict:
    return rank_env(gang, rank, job_id=42, attempt=attempt, checkpoint_dir="/d/jobs/42/checkpoints",
                    master_addr="10.0.0.1", master_port=29500, workdir="/home/ana/run", info=info, parts=parts)


def test_a_two_node_two_rank_gang_gets_the_contract_torchelastic_and_slurm_variables():
    e = env_of(TWO_BY_TWO, 3, attempt=3)
    assert e == {
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "3",
        "TRAINYARD_JOB_ID": "42", "TRAINYARD_ATTEMPT": "3", "TRAINYARD_CHECKPOINT_DIR": "/d/jobs/42/checkpoints",
        "TRAINYARD_NODE": "node1",
        "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "42", "TORCHELASTIC_RESTART_COUNT": "2",
        "SLURM_JOB_ID": "42", "SLURM_JOBID": "42", "SLURM_JOB_NAME": "pretrain",
        "SLURM_NTASKS": "4", "SLURM_NPROCS": "4", "SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
        "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[0-1]",
        "SLURM_NODELIST": "node[0-1]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "2,3", "SLURMD_NODENAME": "node1",
        "SLURM_SUBMIT_DIR": "/home/ana/run", "SLURM_SUBMIT_HOST": "login1", "SLURM_JOB_ACCOUNT": "vision",
        "SLURM_JOB_PARTITION": "a100", "SLURM_JOB_QOS": "training", "SLURM_CLUSTER_NAME": "lab",
        "SLURM_RESTART_COUNT": "2",
    }


def test_every_rank_of_a_gang_agrees_on_the_shared_values_and_numbers_itself():
    envs = [env_of(TWO_BY_TWO, r) for r in range(4)]
    shared = ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_NODELIST", "SLURM_TASKS_PER_NODE",
              "SLURM_NTASKS", "TORCHELASTIC_RUN_ID")
    assert all(e[k] == envs[0][k] for e in envs for k in shared)
    assert [e["RANK"] for e in envs] == [e["SLURM_PROCID"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["LOCAL_RANK"] for e in envs] == [e["SLURM_LOCALID"] for e in envs] == ["0", "1", "0", "1"]
    assert [e["GROUP_RANK"] for e in envs] == [e["SLURM_NODEID"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["SLURM_JOB_GPUS"] for e in envs] == ["0,1", "0,1", "2,3", "2,3"]
    assert [e["TRAINYARD_NODE"] for e in envs] == [e["SLURMD_NODENAME"] for e in envs]
    assert expand_hostlist(envs[0]["SLURM_JOB_NODELIST"]) == ["node0", "node1"]


def test_a_one_rank_job_leaves_unasked_and_unknown_slurm_values_unset():
    e = env_of(Gang((RankPlacement(0, "gpu-07", (5,)),)), 0, info=JobInfo())
    assert (e["RANK"], e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) == ("0", "1", "1", "0")
    assert (e["SLURM_JOB_NODELIST"], e["SLURM_TASKS_PER_NODE"], e["SLURM_NNODES"]) == ("gpu-07", "1", "1")
    assert e["CUDA_VISIBLE_DEVICES"] == "5" and e["SLURM_GPUS_ON_NODE"] == "1"
    assert e["TORCHELASTIC_RESTART_COUNT"] == "0"
    assert e["SLURM_SUBMIT_DIR"] == "/home/ana/run"  # the working directory when no submit dir is known
    for unset in ("SLURM_RESTART_COUNT", "SLURM_NTASKS_PER_NODE", "SLURM_CPUS_PER_TASK", "SLURM_JOB_NAME",
                  "SLURM_JOB_ACCOUNT", "SLURM_JOB_PARTITION", "SLURM_JOB_QOS", "SLURM_CLUSTER_NAME",
                  "SLURM_SUBMIT_HOST"):
        assert unset not in e, unset
    assert env_of(Gang((RankPlacement(0, "n1"),)), 0, info=JobInfo(cpus_per_task=4))["SLURM_CPUS_PER_TASK"] == "4"


def test_gpus_none_or_left_to_the_launcher():
    no_gpu = env_of(Gang((RankPlacement(0, "n1", ()),)), 0)
    assert no_gpu["CUDA_VISIBLE_DEVICES"] == "" and "SLURM_GPUS_ON_NODE" not in no_gpu and "SLURM_JOB_GPUS" not in no_gpu
    bound = env_of(Gang((RankPlacement(0, "n1", (0,)),), gpus_known=False), 0)  # left to the launcher (Slurm)
    assert "CUDA_VISIBLE_DEVICES" not in bound and "SLURM_JOB_GPUS" not in bound


def test_parts_are_disjoint_and_together_are_everything():
    by_part = {p: env_of(TWO_BY_TWO, 2, parts=p) for p in (EnvPart.CONTRACT, EnvPart.TRAINYARD, EnvPart.TORCHELASTIC,
                                                            EnvPart.SLURM)}
    keys = [set(e) for e in by_part.values()]
    assert sum(len(k) for k in keys) == len(set().union(*keys)) == len(env_of(TWO_BY_TWO, 2))
    assert all(k.startswith(("SLURM_", "SLURMD_")) for k in by_part[EnvPart.SLURM])
    assert all(k.startswith("TRAINYARD_") for k in by_part[EnvPart.TRAINYARD])
    under_slurm = env_of(TWO_BY_TWO, 2, parts=EnvPart.NOT_SLURM)
    assert not [k for k in under_slurm if k.startswith("SLURM")] and "RANK" in under_slurm


def test_node_order_follows_first_use_and_tasks_per_node_line_up():
    g = Gang(tuple(RankPlacement(r, n) for r, n in enumerate("babc")))
    e = [env_of(g, r) for r in range(4)]
    assert e[0]["SLURM_JOB_NODELIST"] == "b,a,c" and e[0]["SLURM_TASKS_PER_NODE"] == "2,1(x2)"
    assert [x["SLURM_NODEID"] for x in e] == ["0", "1", "0", "2"]
    assert [x["LOCAL_RANK"] for x in e] == ["0", "0", "1", "0"]
    assert [x["LOCAL_WORLD_SIZE"] for x in e] == ["2", "1", "2", "1"]


def test_block_layout_and_bad_ranks():
    g = Gang.block(["n1", "n2"], [3, 1])
    assert [s.node for s in g.slots] == ["n1", "n1", "n1", "n2"] and not g.gpus_known
    assert [s.rank for s in g.slots] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="do not match"):
        Gang.block(["n1"], [1, 2])
    with pytest.raises(ValueError, match="not in a gang of 4"):
        env_of(TWO_BY_TWO, 4)
    with pytest.raises(ValueError, match="at least one rank"):
        Gang(())
    with pytest.raises(ValueError, match="0..n-1 in order"):
        Gang((RankPlacement(1, "n1"), RankPlacement(0, "n1")))


# -- hostlists ---------------------------------------------------------------------------------------

COMPRESSED = [
    (["n1", "n2"], "n[1-2]"),
    (["n1"], "n1"),
    (["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07"], "gpu-[01-04,07]"),
    (["node1", "node2", "node10", "gpu-01", "gpu-02", "a", "b"], "node[1-2,10],gpu-[01-02],a,b"),
    (["n0009", "n0010", "n0011"], "n[0009-0011]"),
    (["n9", "n10", "n011"], "n[9-10,011]"),
    (["node-0", "node-1"], "node-[0-1]"),
    (["x1y2", "x1y3"], "x1y[2-3]"),
    (["rack1-n01", "rack1-n02", "rack2-n01"], "rack1-n[01-02],rack2-n01"),
    (["n1", "n3", "n2"], "n[1,3,2]"),
    (["n01", "n1"], "n[01,1]"),
    (["n2", "n1"], "n[2,1]"),
    (["n1", "m1", "n2"], "n1,m1,n2"),
    ([], ""),
]


@pytest.mark.parametrize("names,expr", COMPRESSED)
def test_compress_hostlist_as_scontrol_does(names, expr):
    assert compress_hostlist(names) == expr
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("expr,names", [
    ("gpu-[01-04,07]", ["gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-07"]),
    ("n[1-2],m[001-003]", ["n1", "n2", "m001", "m002", "m003"]),
    ("n[9-11]", ["n9", "n10", "n11"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),  # Slurm 22.05 refuses this one; we keep the suffix
    (" n1 , n2 ", ["n1", "n2"]),
])
def test_expand_hostlist(expr, names):
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("bad", ["n[1-2", "n1]", "n[a-b]", "n[3-1]", "n[]", "n[1-]"])
def test_expand_hostlist_names_what_is_wrong(bad):
    with pytest.raises(ValueError, match="hostlist"):
        expand_hostlist(bad)


def test_hostlists_round_trip():
    rnd = random.Random(7)
    prefixes = ["n", "gpu-", "rack1-n", "x1y", ""]
    for _ in range(300):
        names = list(dict.fromkeys(
            rnd.choice(prefixes) + str(rnd.randint(0, 30)).zfill(rnd.choice([1, 1, 2, 3]))
            for _ in range(rnd.randint(1, 12))))
        names = [n for n in names if n]
        assert expand_hostlist(compress_hostlist(names)) == names, names


@pytest.mark.parametrize("counts,text", [([2, 2, 2, 1], "2(x3),1"), ([4, 4], "4(x2)"), ([3, 1], "3,1"), ([1], "1"),
                                         ([1, 2, 1], "1,2,1")])
def test_tasks_per_node(counts, text):
    assert format_tasks_per_node(counts) == text
    assert parse_tasks_per_node(text) == counts


def test_tasks_per_node_refuses_other_forms():
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node("2x3")


def test_array_env_as_slurm_names_it():
    assert array_env(40, 8, [0, 4, 8, 12], step=4) == {
        "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "8", "SLURM_ARRAY_TASK_COUNT": "4",
        "SLURM_ARRAY_TASK_MIN": "0", "SLURM_ARRAY_TASK_MAX": "12", "SLURM_ARRAY_TASK_STEP": "4"}


# -- the job directory ----------------------------------------------------------------------------


def test_job_dir_layout(tmp_path: Path):
    jd = JobDir.of(tmp_path, 7)
    assert jd == JobDir(str(tmp_path / "jobs" / "7"))
    root = tmp_path / "jobs" / "7"
    assert (jd.root, jd.logs, jd.rank_log(3)) == (root, root / "logs", root / "logs" / "rank-3.log")
    assert (jd.checkpoints, jd.metrics_dir, jd.metrics_file) == (
        root / "checkpoints", root / "metrics", root / "metrics" / "metrics.jsonl")
    assert (jd.script, jd.run, jd.attempt_run(2)) == (root / "script.sh", root / "run", root / "run" / "attempt-2")
    assert jd.tensorboard == root / "metrics" / "tensorboard"
    jd.create()
    assert all(d.is_dir() for d in (jd.logs, jd.checkpoints, jd.metrics_dir))
    JobDir.of(tmp_path, 9).attempt_run(1).mkdir(parents=True)
    jd.attempt_run(1).mkdir(parents=True)
    assert JobDir.attempt_runs(tmp_path) == [jd.attempt_run(1), JobDir.of(tmp_path, 9).attempt_run(1)]


def test_contracts_load_by_path_with_the_standard_library_only():
    """As slurm/task.py loads it on a Slurm node: `python -I -S`, by file path, nothing of trainyard."""
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('c', {str(Path(contracts.__file__))!r})\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['c'] = m; spec.loader.exec_module(m)\n"
        "print(m.compress_hostlist(['n1', 'n2']))\n"
        "print(sorted(n for n in sys.modules if n.split('.')[0] in ('trainyard', 'pydantic', 'sqlalchemy')))\n"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["n[1-2]", "[]"]


# -- hostlists, drawn by hypothesis -------------------------------------------------------------------

_PREFIX = st.sampled_from(["n", "gpu-", "rack1-n", "x1y", "node", ""])
_NAME = st.builds(lambda p, n, w: p + str(n).zfill(w), _PREFIX, st.integers(0, 120), st.sampled_from([1, 2, 3]))


@given(st.lists(_NAME, min_size=1, max_size=20, unique=True).map(lambda names: [n for n in names if n]))
def test_any_list_of_names_round_trips_through_its_hostlist(names):
    assert expand_hostlist(compress_hostlist(names)) == names  # order and zero padding kept


@given(st.lists(st.integers(1, 9), min_size=1, max_size=12))
def test_any_tasks_per_node_round_trips(counts):
    assert parse_tasks_per_node(format_tasks_per_node(counts)) == counts
