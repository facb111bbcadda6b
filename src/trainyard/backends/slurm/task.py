"""One rank of a Slurm attempt: the job environment from Slurm's, then the rank runner.

Usage (by `srun`, once per task): python -I -S slurm/task.py <run-dir> <job-dir> -- <command...>
       (as Slurm's batch step, a batch script): python -I -S slurm/task.py --batch <run-dir> <job-dir> -- <command...>
       `--stderr-apart` (after --batch, if any): stderr to `JobDir.rank_err` (sbatch's -e/--error)
       (an interactive allocation's session, by `srun --overlap --pty`): python -I -S slurm/task.py --session <run-dir> -- <command...>

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

The job's own environment (its variables, the job token, TRAINYARD_JOB_ID/ATTEMPT/CHECKPOINT_DIR)
is not in the task's: the plane writes it to `<run-dir>/job-env.json` (the owner's, 0600) and it is
laid over the task's environment here, under what is the task's own (`TASK_OWN`: Slurm's variables,
its GPUs, MASTER_ADDR/PORT); see `slurm.env`.

With `--batch` (`LaunchSpec.batch`: a submitted script) this runs once, as Slurm's own batch step
on the first node, and the attempt has one rank, 0: the script. Its environment is the batch
step's as Slurm made it (the whole allocation's SLURM_*, the first node's GPUs) with the job's
laid under it as for a task, and none of the per-task variables (`contracts.rank_env` is not
applied: RANK, WORLD_SIZE, ... of a task have no meaning in the batch step, as in Slurm's). The
job's PATH comes first, with the directory of Slurm's own `srun`/`scontrol` after it when it lacks
them: the `srun` the script runs is Slurm's, and the tasks it starts get the batch step's
environment (srun's default --export=ALL): the job's, MASTER_ADDR/PORT, TRAINYARD_*. Their output
goes to srun's, the script's: rank 0's log. The script's exit is the rank's exit record.

With `--session` (issue 38: `yard alloc`'s shell, salloc's interactive step) this is the command
of a one-task `srun --jobid=J --overlap --pty -N1 -n1` step on the allocation's first node, which
Slurm gives a step's environment: SLURM_NNODES=1, SLURM_NTASKS=1, SLURM_STEP_*, so a plain `srun`
typed there would start one task. Slurm's own interactive step (`srun --interactive --preserve-env
--pty $SHELL`, run by salloc with LaunchParameters=use_interactive_step) keeps salloc's SLURM_NNODES
and SLURM_NTASKS instead. Here the batch step (the allocation's hold) records its Slurm variables,
the allocation's as sbatch describes it (`ALLOC_ENV_FILE`, less what is its own process's), and
the session's environment is the step's with those laid over it and SLURM_STEP_* gone, then the
job's under it and PATH as for a batch script (`batch_env`); it starts in SLURM_SUBMIT_DIR (the
job's workdir) and `exec`s the command, so the shell is the step's task: `srun` in it spreads tasks
over the allocation, as in salloc's shell or the batch script.

Standard library only and run with -I -S, like the runner: nothing in the job's environment can
change how a rank starts. `contracts.py` is loaded by its path for the same reason (by_path.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(_HERE), "rundir"))
import by_path  # noqa: E402  (the run-dir layer's, imported by path: -I -S has no site-packages)
import rank_runner  # noqa: E402

contracts = by_path.load("contracts")


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
    per = int(environ.get(contracts.JobVar.GPUS_PER_RANK, "0") or 0)
    visible = [g for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    mine = tuple(visible[local * per:(local + 1) * per]) if per and len(visible) >= per * (local + 1) else None
    if environ.get("SLURMD_NODENAME", layout.slots[rank].node) != layout.slots[rank].node:
        raise ValueError(f"rank {rank} runs on {environ['SLURMD_NODENAME']}, node {node_id} of {nodes} in Slurm's list")
    env = contracts.rank_env(
        layout, rank, job_id=int(environ[contracts.JobVar.JOB_ID]),
        attempt=int(environ[contracts.JobVar.ATTEMPT]), checkpoint_dir=environ[contracts.JobVar.CHECKPOINT_DIR],
        master_addr=environ["MASTER_ADDR"], master_port=int(environ["MASTER_PORT"]),
        parts=contracts.EnvPart.NOT_SLURM)
    if mine is not None:  # Slurm bound the node's GPUs; this rank's own share of them, as Slurm names them
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


# What the task's own environment says and the job's may not change: Slurm's variables, the GPUs
# Slurm bound to the task, and the rendezvous the batch script chose.
TASK_OWN_PREFIXES = ("SLURM_", "SLURMD_")
TASK_OWN = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT",
            contracts.JobVar.GPUS_PER_RANK)


def read_job_env(run_dir: str) -> dict[str, str]:
    """The job's environment the plane wrote for this attempt (`slurm_env.JOB_ENV_FILE`, written by the plane).

    Raises:
        ValueError: the file is missing or not a mapping of strings.
    """
    try:
        with open(os.path.join(run_dir, "job-env.json")) as f:
            env = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read the job's environment in {run_dir}: {e}") from None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError(f"{run_dir}/job-env.json is not a mapping of strings")
    try:  # the staged datasets' copies on this task's own node (`LaunchSpec.dataset_paths`)
        with open(os.path.join(run_dir, "job-datasets.json")) as f:
            mine = json.load(f).get(os.environ.get("SLURMD_NODENAME", ""), {})
    except FileNotFoundError:
        mine = {}
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"cannot read the job's datasets in {run_dir}: {e}") from None
    env.update({str(k): str(v) for k, v in mine.items()})
    return env


def with_job_env(task: dict[str, str], job: dict[str, str]) -> dict[str, str]:
    """The task's environment with the job's laid over it, but for what is the task's own."""
    out = {**task, **job}
    out.update({k: v for k, v in task.items() if k.startswith(TASK_OWN_PREFIXES) or k in TASK_OWN})
    return out


# Slurm's commands a batch script calls: found on the batch step's own PATH (the plane's command
# PATH, which sbatch exported), kept reachable behind the job's PATH.
SLURM_TOOLS = ("srun", "scontrol")


def batch_path(job_path: str, step_path: str) -> str:
    """The job's PATH, then the directories of Slurm's `srun`/`scontrol` it does not find (or has
    not at all): the script's `srun` is Slurm's own, as under sbatch."""
    dirs = [d for d in job_path.split(":") if d]
    for tool in SLURM_TOOLS:
        if shutil.which(tool, path=":".join(dirs)) is None:
            where = shutil.which(tool, path=step_path)
            if where is not None and os.path.dirname(where) not in dirs:
                dirs.append(os.path.dirname(where))
    return ":".join(dirs)


def batch_env(environ: dict[str, str], job: dict[str, str]) -> dict[str, str]:
    """The batch step's environment (see the module docstring): Slurm's and the batch script's
    own over the job's, PATH from `batch_path`, TRAINYARD_NODE the node it runs on.

    Raises:
        KeyError: Slurm did not say which node this is (SLURMD_NODENAME).
    """
    env = with_job_env(environ, job)
    env["PATH"] = batch_path(job.get("PATH", ""), environ.get("PATH", ""))
    env.pop(contracts.JobVar.GPUS_PER_RANK, None)
    env[contracts.JobVar.NODE] = environ["SLURMD_NODENAME"]
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


# The batch step's Slurm variables (the allocation's), written by the hold for its session.
ALLOC_ENV_FILE = "alloc-env.json"
# Of the batch step's variables, those that are its own process's or node's, not the allocation's.
NOT_THE_ALLOCATIONS = ("SLURM_TASK_PID", "SLURM_PRIO_PROCESS", "SLURM_GTIDS", "SLURM_PROCID", "SLURM_LOCALID",
                       "SLURM_NODEID", "SLURM_CPUS_ON_NODE", "SLURM_GPUS_ON_NODE", "SLURM_TOPOLOGY_ADDR",
                       "SLURM_TOPOLOGY_ADDR_PATTERN", "SLURM_CONF", "SLURM_UMASK")
STEP_PREFIX = "SLURM_STEP"  # SLURM_STEP_ID, SLURM_STEPID, SLURM_STEP_NODELIST, SLURM_STEP_NUM_TASKS, ...


def allocation_vars(environ: dict[str, str]) -> dict[str, str]:
    """The batch step's Slurm variables that describe the allocation (see the module docstring)."""
    return {k: v for k, v in environ.items() if k.startswith("SLURM_") and k not in NOT_THE_ALLOCATIONS
            and not k.startswith(STEP_PREFIX)}


def session_env(step: dict[str, str], alloc: dict[str, str] | None, job: dict[str, str]) -> dict[str, str]:
    """The session's environment: the one-task step's, without SLURM_STEP_*, with the allocation's
    variables over it (`alloc`, as the batch step recorded them; None when it did not: then what
    the step says of the job, SLURM_NODELIST, makes the node count and the task counts are left to
    `srun`), the job's under it (`batch_env`)."""
    env = {k: v for k, v in step.items() if not k.startswith(STEP_PREFIX)}
    if alloc is not None:
        env.update(alloc)
    else:
        nodes = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST", "")
        count = str(len(contracts.expand_hostlist(nodes))) if nodes else "1"
        env.update(SLURM_JOB_NODELIST=nodes, SLURM_NNODES=count, SLURM_JOB_NUM_NODES=count)
        for k in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_TASKS_PER_NODE"):
            env.pop(k, None)
    return batch_env(env, job)


def read_alloc_env(run_dir: str) -> dict[str, str] | None:
    """What the batch step recorded (`ALLOC_ENV_FILE`), or None."""
    try:
        with open(os.path.join(run_dir, ALLOC_ENV_FILE)) as f:
            env = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    return env


def session_main(argv: list[str]) -> int:
    """`--session <run-dir> -- <command...>`: the command, exec'd with `session_env`."""
    if len(argv) < 3 or argv[1] != "--":
        print("usage: slurm/task.py --session <run-dir> -- <command...>", file=sys.stderr)
        return 2
    run_dir, command = argv[0], argv[2:]
    try:
        env = session_env(dict(os.environ), read_alloc_env(run_dir), read_job_env(run_dir))
    except (KeyError, ValueError) as e:
        print(f"trainyard: slurm_task: cannot build the session's environment: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        os.chdir(env.get("SLURM_SUBMIT_DIR") or env.get("HOME") or "/")
    except OSError:
        pass  # where srun started it, as srun does when it cannot enter the directory
    try:
        os.execvpe(command[0], command, env)
    except OSError as e:
        print(f"trainyard: {command[0]}: {e.strerror}", file=sys.stderr, flush=True)
        return contracts.NOT_FOUND_EXIT if isinstance(e, FileNotFoundError) else contracts.CANNOT_EXECUTE_EXIT
    return 0  # not reached


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--session":
        return session_main(argv[1:])
    batch = bool(argv) and argv[0] == "--batch"
    if batch:
        argv = argv[1:]
    apart = bool(argv) and argv[0] == "--stderr-apart"  # -e/--error: stderr to the rank's .err file
    if apart:
        argv = argv[1:]
    if len(argv) < 4 or argv[2] != "--":
        print("usage: slurm/task.py [--batch] [--stderr-apart] <run-dir> <job-dir> -- <command...>", file=sys.stderr)
        return 2
    run_dir, job_dir, command = argv[0], argv[1], argv[3:]
    try:
        if batch:  # the script's environment is the batch step's, not a task's (no RANK...)
            env = batch_env(dict(os.environ), read_job_env(run_dir))
            _record_allocation(run_dir, allocation_vars(dict(os.environ)))
            os.environ.clear()
        else:
            os.environ.update(with_job_env(dict(os.environ), read_job_env(run_dir)))
            env = task_env(dict(os.environ))
    except (KeyError, ValueError) as e:  # into the batch log: no rank log without a rank
        print(f"trainyard: slurm_task: cannot build the job environment: {e!r}", file=sys.stderr, flush=True)
        return 2
    os.environ.update(env)
    rank = "0" if batch else env["RANK"]  # a batch attempt's one rank is its script
    log = contracts.JobDir(job_dir).rank_log(int(rank))
    log.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    if apart:
        fd = os.open(contracts.JobDir(job_dir).rank_err(int(rank)), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    header = (f"=== trainyard: attempt {env.get('TRAINYARD_ATTEMPT', '?')} started {stamp} on "
              f"{env['TRAINYARD_NODE']} (slurm job {os.environ.get('SLURM_JOB_ID', '?')}) gpus "
              f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'none')} ===")
    print(header, flush=True)
    if apart:
        print(header, file=sys.stderr, flush=True)
    with open(os.path.join(run_dir, f"rank-{rank}.node"), "w") as f:
        f.write(env[contracts.JobVar.NODE])
    # Slurm signals the task's process group (`scancel --signal`): the runner survives them and
    # the command, in the same group, gets them. The group must stay Slurm's to be tracked. A batch
    # step's notice with `scancel --batch` (--signal=B:) reaches this process alone: passed on to
    # the script, the shell that traps it (no step gets notices otherwise, and --full reaches the
    # script itself, so nothing arrives twice).
    notices = (contracts.NOTICE_SIGNAL, signal.SIGUSR2) if batch else ()
    return rank_runner.main([run_dir, rank, "--", *command], forward=notices)


def _record_allocation(run_dir: str, alloc: dict[str, str]) -> None:
    """`ALLOC_ENV_FILE`, written whole (a new name, then renamed) or not at all: the run dir is
    this owner's own, and only a session of theirs reads it."""
    tmp = os.path.join(run_dir, f".{ALLOC_ENV_FILE}.{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            json.dump(alloc, f)
        os.replace(tmp, os.path.join(run_dir, ALLOC_ENV_FILE))
    except OSError as e:
        print(f"trainyard: slurm_task: cannot record the allocation's variables: {e}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
