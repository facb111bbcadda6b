"""One rank of a Slurm attempt: the job environment from Slurm's, then the rank runner.

Usage (by `srun`, once per task): python -I -S slurm_task.py <run-dir> <log-dir> -- <command...>

`srun` starts one task per rank; Slurm numbers them (SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID,
SLURM_TASKS_PER_NODE). This turns that into the job-environment contract of DESIGN.md — RANK,
LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, TRAINYARD_NODE, and CUDA_VISIBLE_DEVICES narrowed to the
rank's own GPUs out of the node's (the batch script exports TRAINYARD_GPUS_PER_RANK) — sends the
rank's output to `<log-dir>/rank-<r>.log` as the local backend does, records the node it landed
on, and then becomes the rank runner (`rank_runner.py`: exit records in the run dir, on the
shared file system the control plane reads).

Standard library only and run with -I -S, like the runner: nothing in the job's environment can
change how a rank starts.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rank_runner  # noqa: E402  (a sibling file, imported by path: -I -S has no site-packages)


def tasks_on_node(spec: str, node_index: int) -> int:
    """SLURM_TASKS_PER_NODE ("4(x2)", "3,1", "2(x2),1") → the count on node `node_index`."""
    counts: list[int] = []
    for part in spec.split(","):
        if "(x" in part:
            n, times = part.split("(x")
            counts += [int(n)] * int(times.rstrip(")"))
        elif part:
            counts.append(int(part))
    return counts[node_index] if node_index < len(counts) else 1


def rank_env(environ: dict[str, str]) -> dict[str, str]:
    """The contract's variables for this task, from Slurm's."""
    rank = int(environ["SLURM_PROCID"])
    local = int(environ.get("SLURM_LOCALID", "0"))
    world = int(environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or "1")
    local_world = tasks_on_node(environ.get("SLURM_TASKS_PER_NODE", "1"), int(environ.get("SLURM_NODEID", "0")))
    env = {
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "TRAINYARD_NODE": environ.get("SLURMD_NODENAME", ""),
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    per = int(environ.get("TRAINYARD_GPUS_PER_RANK", "0") or 0)
    visible = [g for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    if per and len(visible) >= per * (local + 1):
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible[local * per:(local + 1) * per])
    return env


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: slurm_task.py <run-dir> <log-dir> -- <command...>", file=sys.stderr)
        return 2
    run_dir, log_dir, command = argv[0], argv[1], argv[3:]
    env = rank_env(dict(os.environ))
    os.environ.update(env)
    rank = env["RANK"]
    os.makedirs(log_dir, exist_ok=True)
    fd = os.open(os.path.join(log_dir, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"=== trainyard: attempt {os.environ.get('TRAINYARD_ATTEMPT', '?')} started {stamp} on "
          f"{env['TRAINYARD_NODE']} (slurm job {os.environ.get('SLURM_JOB_ID', '?')}) gpus "
          f"{env.get('CUDA_VISIBLE_DEVICES', 'none')} ===", flush=True)
    with open(os.path.join(run_dir, f"rank-{rank}.node"), "w") as f:
        f.write(env["TRAINYARD_NODE"])
    # Slurm signals the task's process group (`scancel --signal`): the runner survives them and
    # the command, in the same group, gets them. The group must stay Slurm's to be tracked.
    return rank_runner.main([run_dir, rank, "--", *command])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
