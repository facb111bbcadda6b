"""A batch script on the local backend runs as Slurm runs one: once, on the first node, with the
allocation's environment; its `srun` starts the tasks and `scontrol show hostnames` expands the
node list. Real processes, the real backend."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

from trainyard.contracts import JobInfo

from tests.backends.helpers import make_spec, wait_done

PY = sys.executable
TWO_NODES = ((0, "node0", (0, 1)), (1, "node1", (0, 1)))  # -N 2 --ntasks-per-node=1 --gpus-per-node=2
INFO = JobInfo(name="train", team="nlp", pool="default", job_class="training", cluster="test", submit_host="login1",
               tasks_per_node=1)
DUMP = "import json, os; print(json.dumps(dict(os.environ)))"


def batch(tmp_path: Path, job_id: int, body: str, ranks=TWO_NODES, **kw):  # noqa: ANN001, ANN201
    script = tmp_path / f"job{job_id}.sbatch"
    script.write_text("#!/bin/bash\n" + body)
    spec = make_spec(tmp_path, job_id, ["/bin/bash", str(script)], ranks=ranks, **kw)
    return replace(spec, batch=True, job=INFO)


def log(tmp_path: Path, job_id: int, rank: int) -> str:
    return (tmp_path / "jobs" / str(job_id) / "logs" / f"rank-{rank}.log").read_text()


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_the_script_runs_once_and_srun_starts_one_task_per_slot(backend, tmp_path):
    marker = tmp_path / "ran"
    backend.launch(batch(tmp_path, 1, f"echo once >> {marker}\n"
                                      f"srun {PY} -c 'import os; print(\"task\", os.environ[\"SLURM_PROCID\"])'\n"))
    state = wait_done(backend, 1, timeout=30)
    assert [(r.rank, r.exit_code) for r in state.ranks] == [(0, 0)]  # one rank: the script
    assert marker.read_text() == "once\n"
    out = log(tmp_path, 1, 0)
    assert "task 0" in out and "task 1" in out  # the batch log holds every task's output, as Slurm's
    assert "task 1" in log(tmp_path, 1, 1) and "task 0" not in log(tmp_path, 1, 1)


def test_the_batch_step_has_the_allocations_environment_and_no_per_task_one(backend, tmp_path):
    backend.launch(batch(tmp_path, 2, f"{PY} -c '{DUMP}'\n"))
    wait_done(backend, 2, timeout=30)
    (env,) = json_lines(log(tmp_path, 2, 0))
    expect = {"SLURM_JOB_ID": "2", "SLURM_JOBID": "2", "SLURM_JOB_NAME": "train", "SLURM_NTASKS": "2",
              "SLURM_NPROCS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
              "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[0-1]",
              "SLURM_NODELIST": "node[0-1]", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_NTASKS_PER_NODE": "1",
              "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1",
              "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_SUBMIT_HOST": "login1", "SLURM_JOB_ACCOUNT": "nlp",
              "SLURM_JOB_PARTITION": "default", "SLURM_JOB_QOS": "training", "SLURM_CLUSTER_NAME": "test",
              "SLURMD_NODENAME": "node0", "TRAINYARD_JOB_ID": "2", "TRAINYARD_ATTEMPT": "1"}
    assert {k: env.get(k) for k in expect} == expect
    assert env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"].isdigit()
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "SLURM_RESTART_COUNT"):
        assert k not in env, k
    assert env["PATH"].split(":")[0].endswith("run/attempt-1/bin")


def test_each_srun_task_sees_what_slurm_gives_a_task_of_the_step(backend, tmp_path):
    backend.launch(batch(tmp_path, 3, f"srun {PY} -c '{DUMP}'\n", attempt=2))
    wait_done(backend, 3, attempt=2, timeout=30)
    envs = sorted(json_lines(log(tmp_path, 3, 0)), key=lambda e: int(e["SLURM_PROCID"]))
    assert len(envs) == 2
    for r, e in enumerate(envs):
        expect = {"SLURM_PROCID": str(r), "RANK": str(r), "SLURM_LOCALID": "0", "LOCAL_RANK": "0",
                  "SLURM_NODEID": str(r), "GROUP_RANK": str(r), "ROLE_RANK": str(r), "ROLE_WORLD_SIZE": "2",
                  "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "SLURM_NTASKS": "2", "SLURM_NNODES": "2",
                  "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_STEP_NODELIST": "node[0-1]", "SLURM_STEP_ID": "0",
                  "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
                  "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "2", "SLURM_JOB_GPUS": "0,1",
                  "CUDA_VISIBLE_DEVICES": "0,1", "SLURMD_NODENAME": f"node{r}", "TORCHELASTIC_RUN_ID": "3",
                  "SLURM_RESTART_COUNT": "1", "TRAINYARD_ATTEMPT": "2"}
        assert {k: e.get(k) for k in expect} == expect
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]


def test_srun_options_shape_the_step_and_steps_are_numbered(backend, tmp_path):
    four = ((0, "node0", (0,)), (1, "node0", (1,)), (2, "node1", (0,)), (3, "node1", (1,)))
    body = (f"srun -n 3 {PY} -c 'import os; print(\"a\", os.environ[\"SLURM_PROCID\"], os.environ[\"SLURMD_NODENAME\"], "
            "os.environ[\"SLURM_STEP_ID\"], os.environ[\"SLURM_TASKS_PER_NODE\"])'\n"
            f"srun -N 1 {PY} -c 'import os; print(\"b\", os.environ[\"SLURM_PROCID\"], os.environ[\"SLURM_NODELIST\"], "
            "os.environ[\"SLURM_STEP_ID\"], os.environ[\"SLURM_JOB_NODELIST\"])'\n"
            f"srun --ntasks-per-node 1 {PY} -c 'import os; print(\"c\", os.environ[\"SLURM_PROCID\"], "
            "os.environ[\"SLURMD_NODENAME\"], os.environ[\"SLURM_NTASKS_PER_NODE\"])'\n")
    backend.launch(batch(tmp_path, 4, body, ranks=four))
    assert wait_done(backend, 4, timeout=30).ranks[0].exit_code == 0
    lines = sorted(line for line in log(tmp_path, 4, 0).splitlines() if line[:2] in ("a ", "b ", "c "))
    assert lines == ["a 0 node0 0 2,1", "a 1 node0 0 2,1", "a 2 node1 0 2,1",
                     "b 0 node0 1 node[0-1]", "b 1 node0 1 node[0-1]",
                     "c 0 node0 1", "c 1 node1 1"]


def test_the_scripts_exit_is_the_jobs_and_srun_returns_the_failing_tasks_code(backend, tmp_path):
    body = (f"srun {PY} -c 'import os, sys, time; r = int(os.environ[\"SLURM_PROCID\"]); "
            "time.sleep(0 if r else 60); sys.exit(3 if r else 0)'\n"
            "echo srun said $?\nexit 7\n")
    backend.launch(batch(tmp_path, 5, body))
    state = wait_done(backend, 5, timeout=40)
    assert state.ranks[0].exit_code == 7
    assert "srun said 3" in log(tmp_path, 5, 0)  # task 1's code; task 0 was terminated, not waited for


def test_a_requeue_exit_of_the_tasks_is_the_scripts(backend, tmp_path):
    backend.launch(batch(tmp_path, 6, f"srun {PY} -c 'raise SystemExit(75)'\n"))
    assert wait_done(backend, 6, timeout=30).ranks[0].exit_code == 75


def test_scontrol_show_hostnames_expands_the_node_list(backend, tmp_path):
    body = ('head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\necho "head=$head"\n'
            'echo "all=$(scontrol show hostnames | tr "\\n" " ")"\necho "list=$(scontrol show hostlist n1,n2,n3)"\n'
            'scontrol show job 1 || echo "refused $?"\n')
    backend.launch(batch(tmp_path, 7, body))
    assert wait_done(backend, 7, timeout=30).ranks[0].exit_code == 0
    out = log(tmp_path, 7, 0)
    assert "head=node0" in out and "all=node0 node1 " in out and "list=n[1-3]" in out and "refused 1" in out


def test_srun_refuses_what_it_cannot_do_naming_it(backend, tmp_path):
    body = (f"srun --bogus {PY} -c pass; echo a $?\nsrun -N 3 {PY} -c pass; echo b $?\n"
            "srun definitely-not-a-program; echo c $?\n")
    backend.launch(batch(tmp_path, 8, body))
    wait_done(backend, 8, timeout=30)
    out = log(tmp_path, 8, 0)
    assert "unrecognized option '--bogus'" in out and "a 1" in out
    assert "-N 3: the allocation has 2 node(s)" in out and "b 1" in out
    assert "definitely-not-a-program" in out and "c 127" in out


def test_lines_from_tasks_writing_at_once_stay_whole_in_the_batch_log(backend, tmp_path):
    # A PYTHONUNBUFFERED print writes its text and its newline apart; srun's line-buffered I/O
    # keeps every task's lines whole in the batch log, task 0's among them.
    four = ((0, "node0", (0,)), (1, "node0", (1,)), (2, "node1", (0,)), (3, "node1", (1,)))
    writer = ("import os, sys, time; r = os.environ['SLURM_PROCID']\n"
              "while time.time() < float(sys.argv[1]): pass\n"  # all four write at once
              "for i in range(2000):\n"
              "    os.write(1, f'task {r} line {i} '.encode() + b'x' * 40); os.write(1, b'\\n')\n")
    (tmp_path / "w.py").write_text(writer)
    backend.launch(batch(tmp_path, 9, f"srun {PY} {tmp_path / 'w.py'} $(( $(date +%s) + 2 ))\n", ranks=four))
    wait_done(backend, 9, timeout=60)
    lines = [ln for ln in log(tmp_path, 9, 0).splitlines() if ln.startswith("task ") or "line" in ln]
    assert len(lines) == 4 * 2000
    assert all(re.fullmatch(r"task [0-3] line \d+ x{40}", ln) for ln in lines), \
        next(ln for ln in lines if not re.fullmatch(r"task [0-3] line \d+ x{40}", ln))
