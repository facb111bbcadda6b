"""One rank of a Slurm attempt: the job environment from Slurm's, then the rank runner.

Usage (by `srun`, once per task): python -I -S slurm_task.py <run-dir> <job-dir> -- <command...>

`srun` starts one task per rank and describes the allocation in Slurm's own variables
(SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE, ...).
Those stay exactly as Slurm set them: `srun`, `scontrol` and MPI inside the job read them. From
them this builds the gang (`contracts.Gang.block`: Slurm's default block layout, checked against
the task's own SLURM_NODEID/SLURM_LOCALID) and adds the parts of `contracts.rank_env` Slurm does
not supply (`EnvPart.NOT_SLURM`: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR/MASTER_PORT from the batch script, CUDA_VISIBLE_DEVICES narrowed to the rank's own
GPUs out of the node's when the batch script exports TRAINYARD_GPUS_PER_RANK, torchelastic's
variables and TRAINYARD_*). It then sends the rank's output to the job dir's rank log as the local
backend does, records the node it landed on, and becomes the rank runner (`rank_runner.py`: exit
records in the run dir, on the shared file system the control plane reads).

Standard library only and run with -I -S, like the runner: nothing in the job's environment can
change how a rank starts. `contracts.py` is loaded by its path for the same reason.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import rank_runner  # noqa: E402  (a sibling file, imported by path: -I -S has no site-packages)


def _load_contracts():  # noqa: ANN202 - a module
    path = os.path.join(os.path.dirname(_HERE), "contracts.py")
    spec = importlib.util.spec_from_file_location("_trainyard_contracts", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up while the classes are made
    spec.loader.exec_module(mod)
    return mod


contracts = _load_contracts()


def tasks_on_node(spec: str, node_index: int) -> int:
    """SLURM_TASKS_PER_NODE ("4(x2)", "3,1", "2(x2),1") → the count on node `node_index`."""
    counts = contracts.parse_tasks_per_node(spec)
    return counts[node_index] if node_index < len(counts) else 1


def task_env(environ: dict[str, str]) -> dict[str, str]:
    """What this task adds to Slurm's environment (see the module docstring).

    Raises:
        ValueError: Slurm's variables are missing or disagree with a block layout.
    """
    rank = int(environ["SLURM_PROCID"])
    nodes = contracts.expand_hostlist(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST")
                                      or environ.get("SLURMD_NODENAME", ""))
    counts = contracts.parse_tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE")
                                            or environ.get("SLURM_TASKS_PER_NODE") or "1")
    layout = contracts.Gang.block(nodes, counts)
    world = int(environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS") or layout.world_size)
    if world != layout.world_size or not 0 <= rank < world:
        raise ValueError(f"SLURM_PROCID={rank}, SLURM_NTASKS={world} and SLURM_TASKS_PER_NODE={counts} disagree")
    local = int(environ.get("SLURM_LOCALID", "0"))
    node_id = int(environ.get("SLURM_NODEID", "0"))
    if (layout.node_index(rank), layout.peers(rank).index(rank)) != (node_id, local):
        raise ValueError(f"rank {rank} is task {local} of node {node_id} in Slurm, not a block layout "
                         f"of {counts} over {nodes}")
    per = int(environ.get("TRAINYARD_GPUS_PER_RANK", "0") or 0)
    visible = [g for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    mine = tuple(visible[local * per:(local + 1) * per]) if per and len(visible) >= per * (local + 1) else None
    if environ.get("SLURMD_NODENAME", layout.slots[rank].node) != layout.slots[rank].node:
        raise ValueError(f"rank {rank} runs on {environ['SLURMD_NODENAME']}, node {node_id} of {nodes} in Slurm's list")
    slots = [contracts.RankSlot(s.node, mine if r == rank else None) for r, s in enumerate(layout.slots)]
    env = contracts.rank_env(
        contracts.Gang(tuple(slots)), rank, job_id=int(environ["TRAINYARD_JOB_ID"]),
        attempt=int(environ["TRAINYARD_ATTEMPT"]), checkpoint_dir=environ["TRAINYARD_CHECKPOINT_DIR"],
        master_addr=environ["MASTER_ADDR"], master_port=int(environ["MASTER_PORT"]),
        parts=contracts.EnvPart.NOT_SLURM)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        print("usage: slurm_task.py <run-dir> <job-dir> -- <command...>", file=sys.stderr)
        return 2
    run_dir, job_dir, command = argv[0], argv[1], argv[3:]
    try:
        env = task_env(dict(os.environ))
    except (KeyError, ValueError) as e:  # into the batch log: no rank log without a rank
        print(f"trainyard: slurm_task: cannot build the job environment: {e!r}", file=sys.stderr, flush=True)
        return 2
    os.environ.update(env)
    rank = env["RANK"]
    log = contracts.JobDir(job_dir).rank_log(int(rank))
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"=== trainyard: attempt {env['TRAINYARD_ATTEMPT']} started {stamp} on "
          f"{env['TRAINYARD_NODE']} (slurm job {os.environ.get('SLURM_JOB_ID', '?')}) gpus "
          f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'none')} ===", flush=True)
    with open(os.path.join(run_dir, f"rank-{rank}.node"), "w") as f:
        f.write(env["TRAINYARD_NODE"])
    # Slurm signals the task's process group (`scancel --signal`): the runner survives them and
    # the command, in the same group, gets them. The group must stay Slurm's to be tracked.
    return rank_runner.main([run_dir, rank, "--", *command])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
