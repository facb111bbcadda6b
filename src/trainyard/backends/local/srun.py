"""`srun` inside a local-backend batch script: start a job step's tasks across the allocation.

Usage (the `srun` the local backend puts first on a batch script's PATH, see `job_tools.py`):
    python -I -S local/srun.py <run-dir> [-n N] [-N M] [--ntasks-per-node K] [-w LIST] [-l]
                               [--gpus-per-task G] [--] CMD [ARGS...]

Why: Slurm runs a batch script once, on the first node of the allocation, and the script's
`srun` starts the tasks. A published script (`srun torchrun --nnodes $SLURM_NNODES ...`, `srun
python train.py`) works here only if `srun` starts one task per allocated task slot, each with
its own rank's environment, and returns what the tasks returned.

What a step is here:
- Its layout (`step_counts`): no option, the allocation's own tasks, node after node (the command
  form's layout); `-N M` the first M nodes; `-n N` N tasks spread over the nodes as Slurm's block
  distribution does (3 over 2 nodes: 2,1); `--ntasks-per-node K` K on each node. A layout that
  needs more nodes than the allocation has is refused (exit 1), as Slurm refuses it. The emulated
  nodes have no CPU count, so more tasks on a node than the allocation placed there are allowed.
  `-w LIST` (a hostlist) puts those nodes of the allocation first (`step_nodes`; -N more adds the
  others), and refuses a node that is not the job's.
- `--gpus-per-task G`: each task sees only its own G of its node's GPUs (`gpu_split`), as Slurm's
  implicit --gpu-bind=per_task; SLURM_GPUS_PER_TASK is set.
- `-l/--label`: each line a task writes to srun's output starts with `<task id>: ` (its rank log
  keeps the line as written).
- Each task's environment: the script's own (what it exported goes through, as
  `--export=ALL`), then `contracts.rank_env` for the step's gang (RANK, LOCAL_RANK, WORLD_SIZE,
  GROUP_RANK, torchelastic's and Slurm's variables; SLURM_NTASKS, SLURM_NNODES, SLURM_NODELIST and
  SLURM_TASKS_PER_NODE are the step's, as srun sets them), SLURM_JOB_NODELIST/SLURM_JOB_NUM_NODES
  the job's, SLURM_STEP_ID/SLURM_STEP_NODELIST/SLURM_STEP_NUM_NODES/SLURM_STEP_NUM_TASKS/
  SLURM_STEP_TASKS_PER_NODE. MASTER_ADDR and MASTER_PORT are the script's (the backend sets them
  for the allocation; a script that exports its own keeps them). Every task on a node sees all
  the job's GPUs on that node (CUDA_VISIBLE_DEVICES), as Slurm gives a step's tasks without
  --gpus-per-task or --gpu-bind.
- Output: task 0 writes where srun writes (the batch script's log, `logs/rank-0.log`, unless the
  script redirects it); task r > 0 writes, line by line, both to `logs/rank-<r>.log` (`yard logs
  --rank r`, and what an `--output` with %t links) and where srun writes, so the batch log holds
  every task's output as Slurm's does.
- Its end: srun waits for every task. When one fails (an exit code other than 0 and 75, or a
  signal) the others get SIGTERM, then SIGKILL after `KILL_WAIT_S` (Slurm's --kill-on-bad-exit;
  the command form's plane does the same). srun's exit: the first failing task's code, else 75
  if a task asked to be requeued, else 128+N for a task killed by signal N, else 0.
- Signals: SIGTERM, SIGINT and SIGHUP reaching srun go on to the tasks and srun keeps waiting
  for them (a task that checkpoints on SIGTERM and exits 75 makes srun exit 75). SIGUSR1 (the
  preemption notice) is not handled: the plane sends it to the processes of the attempt that
  listen for it, the tasks.

Containment, limits and identity: the tasks are srun's children, so they are in the batch
script's cell (the attempt's cgroup, or the runner's descendants): a stop reaches them, and
whatever is left when the script ends is killed by the batch rank's runner. They run as the job's
owner, as the script does. A task on another node than the script's has that node's name (`hostname`
in it says so) when the script's cell is named after its node: its own UTS namespace, in a user
namespace of its own where the owner is not root (`node_name.py`, which says what that costs).

Standard library only, run with -I -S by the job's owner from the attempt's own copy of the tools
(`job_tools.py`): `contracts.py` is loaded by path (by_path.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any
from datetime import datetime, timezone

_HERE = os.path.dirname(os.path.abspath(__file__))
if __package__:  # imported as trainyard.backends.local.backend.X (tests, the control plane)
    from trainyard.backends.rundir import by_path
else:  # run as a file with -I -S: by path, from this directory and the run-dir layer beside it
    sys.path[:0] = [os.path.join(os.path.dirname(_HERE), "rundir")]
    import by_path  # type: ignore[no-redef]  # noqa: E402
BATCH_FILE = "batch.json"  # in the attempt's run dir, written by the local backend
STEPS_DIR = "steps"  # in the run dir, the owner's: one entry per step id taken
KILL_WAIT_S = 10.0
REQUEUE_EXIT = 75
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class SrunError(Exception):
    """A step that cannot start as asked; the message is srun's."""


# -- options and layout ----------------------------------------------------------------------------

_VALUED = {"-n": "ntasks", "--ntasks": "ntasks", "-N": "nodes", "--nodes": "nodes",
           "--ntasks-per-node": "per_node", "--tasks-per-node": "per_node", "--gpus-per-task": "gpus_per_task",
           "-w": "nodelist", "--nodelist": "nodelist"}
_TEXT = {"nodelist"}  # valued options whose value is not a number
_FLAGS = {"-l": "label", "--label": "label"}
# Accepted and without effect here: I/O buffering, MPI and binding plugins, what the step may share.
_NO_EFFECT_FLAGS = {"-u", "--unbuffered", "--overlap", "--exact", "-K", "--kill-on-bad-exit"}
_NO_EFFECT_VALUED = {"--mpi", "--cpu-bind", "--cpu_bind", "--export", "--kill-on-bad-exit", "--gpu-bind",
                     "--distribution", "-m", "--hint", "--cpus-per-task", "-c"}  # block and one cell: as here
VERSION = "srun (trainyard's, for the local backend) 1"


def _node_name() -> Any:
    """node_name.py, by path: a task on another emulated node than the script's, under its name."""
    return by_path.load("backends/local/node_name")


def _step_container() -> Any:
    """step_container.py, by path (pyxis's --container-* on a step: the job's image)."""
    return by_path.load("backends/local/step_container")


def parse_args(argv: Sequence[str]) -> tuple[dict, list[str]]:
    """srun's options (those above) and the command: counts as ints, `nodelist` as given, `label`
    True when asked.

    Raises:
        SrunError: an option we do not know (named), a bad number, or no command.
    """
    opts: dict = {}
    i = 0
    while i < len(argv):
        w = argv[i]
        if w == "--":
            i += 1
            break
        if not w.startswith("-") or w == "-":
            break
        name, eq, val = w.partition("=")
        if name in _step_container().flags() and not eq:  # pyxis's, on a step: checked against the job's
            key, flag = _step_container().flags()[name]
            opts.setdefault("container", {})[key] = flag
            i += 1
            continue
        if name in _step_container().valued():
            if not eq:
                if i + 1 >= len(argv):
                    raise SrunError(f"option {name} needs a value")
                val, i = argv[i + 1], i + 1
            opts.setdefault("container", {})[_step_container().valued()[name]] = val
            i += 1
            continue
        if name in _NO_EFFECT_FLAGS and not eq:
            i += 1
            continue
        if name in _NO_EFFECT_VALUED and (eq or name != "--kill-on-bad-exit"):
            i += 1 if eq else 2
            continue
        if name in _FLAGS and not eq:
            opts[_FLAGS[name]] = True
            i += 1
            continue
        if name not in _VALUED and len(name) > 2 and not name.startswith("--") and name[:2] in _VALUED:
            name, val, eq = name[:2], name[2:], "="  # -n4, -N2, -wnode0
        if name not in _VALUED:
            raise SrunError(f"unrecognized option {name!r} (srun here takes -n/--ntasks, -N/--nodes, "
                            "--ntasks-per-node, -w/--nodelist, -l/--label, --gpus-per-task)")
        if not eq:
            if i + 1 >= len(argv):
                raise SrunError(f"option {name} needs a value")
            val = argv[i + 1]
            i += 1
        i += 1
        if _VALUED[name] in _TEXT:
            if not val.strip():
                raise SrunError(f"{name}: an empty node list")
            opts[_VALUED[name]] = val
            continue
        try:
            n = int(val)
        except ValueError:
            raise SrunError(f"{name}={val!r}: not a number") from None
        if n < 1:
            raise SrunError(f"{name}={n}: must be at least 1")
        opts[_VALUED[name]] = n
    command = list(argv[i:])
    if not command:
        raise SrunError("no command to run")
    return opts, command


def step_counts(alloc: Sequence[int], ntasks: int | None = None, nodes: int | None = None,
                per_node: int | None = None) -> list[int]:
    """Tasks on each of the step's nodes (the allocation's first ones, in order); `alloc` is the
    allocation's tasks per node. See the module docstring.

    Raises:
        SrunError: more nodes than allocated, or fewer tasks than nodes.
    """
    have = len(alloc)
    if nodes is not None and nodes > have:
        raise SrunError(f"-N {nodes}: the allocation has {have} node(s)")
    if per_node is not None:
        m = nodes or (min(have, -(-ntasks // per_node)) if ntasks else have)
        total = ntasks or m * per_node
        if total > m * per_node:
            raise SrunError(f"{total} tasks do not fit {m} node(s) x --ntasks-per-node {per_node}")
        counts = [min(per_node, total - i * per_node) for i in range(m)]
    elif ntasks is not None:
        m = nodes or min(have, ntasks)
        base, extra = divmod(ntasks, m)
        counts = [base + 1] * extra + [base] * (m - extra)
    else:
        m = nodes or have
        counts = list(alloc[:m])
    if any(c < 1 for c in counts):
        raise SrunError(f"{sum(counts)} task(s) cannot cover {len(counts)} node(s): each node of a step runs one")
    return counts


def step_nodes(job_nodes: Sequence[str], nodelist: list[str] | None, nodes: int | None) -> list[str]:
    """The allocation's nodes in the order the step uses them: with -w, the named ones first (in
    the allocation's order), then, when -N asks for more, the allocation's others, as Slurm adds
    nodes to a -w list; without -w, the allocation's order.

    Raises:
        SrunError: a named node is not one of the allocation's, or -N is fewer than the list names.
    """
    if not nodelist:
        return list(job_nodes)
    stray = [n for n in nodelist if n not in job_nodes]
    if stray:
        raise SrunError(f"-w {','.join(stray)}: not in this job's allocation ({', '.join(job_nodes)}); "
                        "a step runs only on the job's own nodes")
    named = [n for n in job_nodes if n in nodelist]
    if nodes is not None and nodes < len(named):
        raise SrunError(f"-N {nodes} is fewer than the {len(named)} node(s) -w names")
    return named + [n for n in job_nodes if n not in named]


def gpu_split(node_gpus: Sequence[str], local_id: int, tasks_here: int, per_task: int, node: str) -> list[str]:
    """Task `local_id`'s own GPUs with --gpus-per-task: its slice of the node's GPUs (Slurm binds
    each task to its own, --gpu-bind=per_task).

    Raises:
        SrunError: the node's GPUs of this job do not give every task its share.
    """
    if per_task * tasks_here > len(node_gpus):
        raise SrunError(f"--gpus-per-task {per_task}: {tasks_here} task(s) on {node} need {per_task * tasks_here} "
                        f"GPU(s); the job has {len(node_gpus)} there")
    return list(node_gpus[local_id * per_task:(local_id + 1) * per_task])


# -- the step ---------------------------------------------------------------------------------------


def _take_step_id(run_dir: str) -> int:
    """The next step id of the attempt (0, 1, ...): one directory entry made per step, atomically."""
    base = os.path.join(run_dir, STEPS_DIR)
    n = 0
    while True:
        try:
            os.mkdir(os.path.join(base, str(n)))
            return n
        except FileExistsError:
            n += 1
        except OSError:
            return 0  # no steps dir to count in (a plane that made none): every step is 0


def task_envs(batch: dict, nodes: Sequence[str], counts: Sequence[int], environ: dict[str, str], step_id: int,
              opts: dict) -> list[dict[str, str]]:
    """Every task's environment (see the module docstring); `nodes` are the step's, `counts` the
    tasks on each.

    Raises:
        SrunError: --gpus-per-task asks for more GPUs than the job has on a node.
    """
    contracts = by_path.load("contracts")
    job_nodes = list(dict.fromkeys(s["node"] for s in batch["slots"]))
    node_gpus = batch.get("node_gpus") or {}
    per_task = opts.get("gpus_per_task")
    slots: list = []  # contracts.RankPlacement, rank by rank (contracts is loaded by path)
    devices_of: list[list[str] | None] = []
    for n, c in zip(nodes, counts):
        gpus = list(node_gpus.get(n) or ())
        devs = list((batch.get("devices") or {}).get(n) or [])
        for local in range(c):
            if per_task:  # each task its own GPUs (and their device files), as --gpu-bind=per_task
                mine = gpu_split(gpus, local, c, per_task, n)
                slots.append(contracts.RankPlacement(len(slots), n, tuple(map(int, mine))))
                devices_of.append([devs[gpus.index(g)] for g in mine if gpus.index(g) < len(devs)])
            else:
                slots.append(contracts.RankPlacement(len(slots), n, tuple(map(int, gpus))))
                devices_of.append(devs)
    gang = contracts.Gang(tuple(slots))
    info = dict(batch.get("info") or {})
    if "per_node" in opts:
        info["tasks_per_node"] = opts["per_node"]
    job = contracts.JobInfo(**info)
    addr = environ.get("MASTER_ADDR") or batch["master_addr"]
    port = int(environ.get("MASTER_PORT") or batch["master_port"])
    step = {"SLURM_STEP_ID": str(step_id), "SLURM_STEPID": str(step_id),
            "SLURM_STEP_NODELIST": contracts.compress_hostlist(nodes),
            "SLURM_STEP_NUM_NODES": str(len(nodes)), "SLURM_STEP_NUM_TASKS": str(gang.world_size),
            "SLURM_STEP_TASKS_PER_NODE": contracts.format_tasks_per_node(list(counts)),
            "SLURM_JOB_NODELIST": contracts.compress_hostlist(job_nodes), "SLURM_JOB_NUM_NODES": str(len(job_nodes))}
    if per_task:
        step["SLURM_GPUS_PER_TASK"] = str(per_task)
    out = []
    for r in range(gang.world_size):
        env = dict(environ)
        env.update(contracts.rank_env(gang, r, job_id=int(batch["job_id"]), attempt=int(batch["attempt"]),
                                      checkpoint_dir=batch["checkpoint_dir"], master_addr=addr, master_port=port,
                                      workdir=batch.get("workdir", ""), info=job, parts=contracts.EnvPart.ALL))
        env.update(step)
        env.update((batch.get("datasets") or {}).get(gang.slots[r].node) or {})  # its own node's staged copies
        if devices_of[r]:
            env[contracts.JobVar.GPU_DEVICES] = ",".join(devices_of[r] or ())
        out.append(env)
    return out


class _Tee(threading.Thread):
    """Task r's output, line by line, to its rank log (none for task 0, whose log is srun's own
    stdout) and to srun's own stdout.

    Every task's output goes through one of these, under one lock, so that lines from tasks
    writing at once stay whole, as srun's line-buffered I/O keeps them: a Python task with
    PYTHONUNBUFFERED writes a print's text and its newline apart."""

    def __init__(self, pipe, log, lock: threading.Lock, out=None, label: bytes = b"") -> None:  # noqa: ANN001
        super().__init__(daemon=True)
        self.pipe, self.log, self.lock, self.out, self.label = pipe, log, lock, out, label

    def run(self) -> None:
        out = self.out or sys.stdout.buffer
        sinks = [f for f in (self.log, out) if f is not None]
        for line in self.pipe:
            for f in sinks:
                try:
                    with self.lock:  # -l/--label: srun's own output says whose line it is ("3: ...")
                        f.write(self.label + line if f is out else line)
                        f.flush()
                except (OSError, ValueError):
                    pass  # a closed or full stream must not stop the task (its pipe would fill)
        self.pipe.close()


def _exit_code(codes: Sequence[int]) -> int:
    """srun's exit from the tasks' Popen return codes (negative: killed by that signal)."""
    bad = [c for c in codes if c > 0 and c != REQUEUE_EXIT]
    if bad:
        return bad[0]
    if REQUEUE_EXIT in codes:
        return REQUEUE_EXIT
    sigs = [-c for c in codes if c < 0]
    return 128 + sigs[0] if sigs else 0


def _signal_groups(procs: Sequence[subprocess.Popen], sig: int) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except OSError:
                pass


def run_step(run_dir: str, argv: Sequence[str], environ: dict[str, str] | None = None) -> int:
    """Start the step, wait for its tasks, return srun's exit code."""
    environ = dict(os.environ if environ is None else environ)
    try:
        opts, command = parse_args(argv)
        with open(os.path.join(run_dir, BATCH_FILE)) as f:
            batch = json.load(f)
        try:
            _step_container().check(opts.get("container") or {}, batch.get("container"))
        except _step_container().StepContainerError as e:
            raise SrunError(str(e)) from None
        job_nodes = list(dict.fromkeys(s["node"] for s in batch["slots"]))
        per = {n: sum(1 for s in batch["slots"] if s["node"] == n) for n in job_nodes}
        named = by_path.load("contracts").expand_hostlist(opts["nodelist"]) if "nodelist" in opts else None
        order = step_nodes(job_nodes, named, opts.get("nodes"))
        counts = step_counts([per[n] for n in order], opts.get("ntasks"),
                             opts.get("nodes") or (len(set(named)) if named else None), opts.get("per_node"))
        nodes = order[:len(counts)]
        step_id = _take_step_id(run_dir)
        envs = task_envs(batch, nodes, counts, environ, step_id, opts)
    except SrunError as e:
        print(f"srun: error: {e}", file=sys.stderr, flush=True)
        return 1
    except ValueError as e:  # a -w list that is not a hostlist
        if "nodelist" in opts and not isinstance(e, json.JSONDecodeError):
            print(f"srun: error: -w {opts['nodelist']}: {e}", file=sys.stderr, flush=True)
            return 1
        print(f"srun: error: cannot read this job's allocation ({run_dir}/{BATCH_FILE}): {e}", file=sys.stderr, flush=True)
        return 1
    except (OSError, KeyError) as e:
        print(f"srun: error: cannot read this job's allocation ({run_dir}/{BATCH_FILE}): {e}", file=sys.stderr, flush=True)
        return 1
    logs_dir = os.path.join(batch["job_dir"], "logs")
    procs: list[subprocess.Popen] = []
    tees: list[_Tee] = []
    lock = threading.Lock()
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: _signal_groups(procs, s))
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    def label(r: int) -> bytes:
        return f"{r}: ".encode() if opts.get("label") else b""

    names = _node_name().renamer(job_nodes[0])  # the script runs on the first node

    def preexec(env: dict[str, str]) -> Any:
        return None if names is None else names.preexec(env["SLURMD_NODENAME"])

    try:
        apart = bool(batch.get("stderr_apart"))  # -e/--error: stderr to rank-<r>.err and srun's stderr
        for r, env in enumerate(envs):
            if r == 0:  # its output is the batch script's: srun's own stdout and stderr
                p = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE if apart else subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=preexec(env))
                procs.append(p)
                tees.append(_Tee(p.stdout, None, lock, label=label(0)))
                if apart:
                    tees.append(_Tee(p.stderr, None, lock, sys.stderr.buffer, label(0)))
                for t in tees:
                    t.start()
                continue
            logs = [open(os.path.join(logs_dir, f"rank-{r}.{ext}"), "ab") for ext in (("log", "err") if apart else ("log",))]
            for log in logs:
                log.write(f"=== trainyard: step {step_id} task {r} started {now} on {env['SLURMD_NODENAME']} ===\n"
                          .encode())
                log.flush()
            p = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE if apart else subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=preexec(env))
            procs.append(p)
            tees.append(_Tee(p.stdout, logs[0], lock, label=label(r)))
            if apart:
                tees.append(_Tee(p.stderr, logs[1], lock, sys.stderr.buffer, label(r)))
            for t in tees[-len(logs):]:
                t.start()
    except OSError as e:
        print(f"srun: error: task {len(procs)}: execve(): {command[0]}: {e.strerror or e}", file=sys.stderr, flush=True)
        _signal_groups(procs, signal.SIGKILL)
        for p in procs:
            p.wait()
        contracts = by_path.load("contracts")
        return contracts.NOT_FOUND_EXIT if isinstance(e, FileNotFoundError) else contracts.CANNOT_EXECUTE_EXIT
    killed_at: float | None = None
    while [p.poll() for p in procs].count(None):  # every task polled on each pass (not any(): it stops early)
        failed = any(p.returncode is not None and p.returncode not in (0, REQUEUE_EXIT) for p in procs)
        if failed and killed_at is None:
            print(f"srun: error: step {step_id}: a task failed; terminating the others", file=sys.stderr, flush=True)
            _signal_groups(procs, signal.SIGTERM)
            killed_at = time.monotonic()
        elif killed_at is not None and time.monotonic() - killed_at > KILL_WAIT_S:
            _signal_groups(procs, signal.SIGKILL)
        time.sleep(0.05)
    for t in tees:
        t.join(timeout=5)
    return _exit_code([p.returncode for p in procs])


def main(argv: list[str]) -> int:
    if "--version" in argv[:2]:  # `srun --version`, and what `yard up` runs to see that owners can run us
        print(VERSION)
        return 0
    if not argv:
        print("usage: local/srun.py <run-dir> [options] CMD...", file=sys.stderr)
        return 1
    return run_step(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
