"""The contracts between the parts (docs/design.md): constants both sides import, the job directory's
layout, and the environment every rank of every backend starts with.

- Exit code 75: "I checkpointed; requeue me" (the answer to a preemption notice).
- Preemption notice: SIGUSR1 to every rank; SIGTERM after the class's grace period; then SIGKILL.
- Checkpoints: `<TRAINYARD_CHECKPOINT_DIR>/step-<N>/` counts once `step-<N>/COMMITTED` exists;
  the newest committed step is the one to resume from.
- Exit code 86: the job's watchdog saw no training step within its timeout (hung, not crashed).
- The job directory: `JobDir`, the one definition of where a job's logs, checkpoints, metrics,
  batch script and run state live.
- The job environment: `rank_env` (below), built here once for every backend.

Standard library only, and importable by file path: `backends/slurm/task.py` runs on Slurm nodes
under `python -I -S` (no site-packages, no trainyard package) and loads this file with
`importlib.util.spec_from_file_location`, so nothing here may import the rest of trainyard.

The job environment
-------------------
`rank_env(gang, rank, ...)` returns one rank's variables in four parts (`EnvPart`); a backend
asks for the parts it supplies:

    CONTRACT      RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR,
                  MASTER_PORT, CUDA_VISIBLE_DEVICES (this rank's GPUs; left alone when the
                  launcher binds them: `Gang.gpus_known` False). What
                  `init_process_group("env://")` and docs/design.md's contract need.
    TRAINYARD     TRAINYARD_JOB_ID, TRAINYARD_ATTEMPT, TRAINYARD_CHECKPOINT_DIR, TRAINYARD_NODE.
    TORCHELASTIC  torchrun's worker variables (torch/distributed/run.py, "Environment Variables")
                  that CONTRACT does not already hold: ROLE_RANK (= RANK: one role),
                  ROLE_WORLD_SIZE (= WORLD_SIZE), TORCHELASTIC_RUN_ID (the job id, as a
                  `--rdzv-id=$JOB_ID` would make it), TORCHELASTIC_RESTART_COUNT (attempt - 1).
                  GROUP_RANK and LOCAL_WORLD_SIZE are torchrun's too, and are in CONTRACT.
                  Note: torch's `is_torchelastic_launched()` is true wherever TORCHELASTIC_RUN_ID
                  is set, as under torchrun; TORCHELASTIC_USE_AGENT_STORE is not set, so
                  `init_process_group("env://")` still creates its own TCP store on MASTER_PORT.
    SLURM         Slurm's job variables, named and formatted as sbatch(1)/srun(1) "OUTPUT
                  ENVIRONMENT VARIABLES" say (Slurm 22.05, checked against a real Slurm):
                  SLURM_JOB_ID = SLURM_JOBID, SLURM_JOB_NAME, SLURM_NTASKS = SLURM_NPROCS,
                  SLURM_PROCID, SLURM_LOCALID, SLURM_NODEID, SLURM_NNODES = SLURM_JOB_NUM_NODES,
                  SLURM_JOB_NODELIST = SLURM_NODELIST (hostlist form, `compress_hostlist`),
                  SLURM_TASKS_PER_NODE ("2(x3),1"), SLURM_NTASKS_PER_NODE, SLURM_GPUS_ON_NODE,
                  SLURM_JOB_GPUS, SLURM_SUBMIT_DIR, SLURM_SUBMIT_HOST, SLURM_JOB_ACCOUNT,
                  SLURM_JOB_PARTITION, SLURM_JOB_QOS, SLURM_CLUSTER_NAME, SLURM_RESTART_COUNT,
                  SLURM_CPUS_PER_TASK, and SLURMD_NODENAME (the node, as slurmd names it).

Which backend supplies what: the local and fake backends emulate every part (`EnvPart.ALL`).
Under a real Slurm (`EnvPart.NOT_SLURM`) the SLURM part is Slurm's own — `srun`, `scontrol` and
MPI inside the job read those variables, so they must describe the real allocation — and the
backend's task wrapper derives the gang from them (`Gang.block`) and adds the other three parts.
The backend then lays the result over the job's own environment (`LaunchSpec.env`): the contract
wins over anything the user set. A batch script on the local backend (`backends/local/batch.py`)
gets the SLURM and TRAINYARD parts of rank 0 with the whole allocation's counts and no per-task
variable, as Slurm's batch step; its `srun` (`backends/local/srun.py`) gives each task all four
parts for the step, plus SLURM_STEP_*.

Where our emulation differs from Slurm, and why:
- Our job id is trainyard's (the same as TRAINYARD_JOB_ID), not a Slurm job id.
- SLURM_JOB_ACCOUNT is the job's team, SLURM_JOB_PARTITION its pool, SLURM_JOB_QOS its job class,
  SLURM_CLUSTER_NAME the cluster config's `cluster.name`: the nearest trainyard notions.
- A value trainyard does not know is left unset rather than invented: SLURM_JOB_NAME for a job
  without a name, SLURM_SUBMIT_HOST when the caller gives none, SLURM_JOB_ACCOUNT/PARTITION/QOS/
  CLUSTER_NAME when empty, SLURM_GPUS_ON_NODE and SLURM_JOB_GPUS when the node has no GPU of the
  job (Slurm also leaves them unset without a GPU allocation).
- SLURM_NTASKS_PER_NODE and SLURM_CPUS_PER_TASK are set only when the job asked for
  --ntasks-per-node / --cpus-per-task (`JobInfo`), as Slurm does: Slurm leaves them unset
  otherwise, and `srun` reads both as *input*, so a made-up value would change what a nested
  `srun` asks for.
- SLURM_RESTART_COUNT: Slurm sets it only once a job has been requeued; ours is attempt - 1, set
  from attempt 2 on. (Under a real Slurm each attempt is a new, never-requeued Slurm job, so
  there Slurm leaves it unset.)
- SLURM_SUBMIT_DIR is the job's working directory (where `yard submit` ran unless --chdir said
  otherwise); Slurm's is the directory sbatch ran in, which trainyard does not record.
- SLURM_JOB_NODELIST orders nodes as the placement first uses them (rank order), so that
  SLURM_NODEID and SLURM_TASKS_PER_NODE line up with it; Slurm orders them as slurm.conf does.
- SLURM_ARRAY_JOB_ID/TASK_ID/TASK_COUNT/TASK_MIN/TASK_MAX/TASK_STEP are a task's at submission
  (`array_env`, stored with the job by `services.arrays.task_env`) and reach the ranks through
  the job's environment on every backend (Slurm sets none of them for trainyard's sbatch jobs,
  which are not Slurm arrays). SLURM_ARRAY_TASK_STEP follows Slurm: the step of the expression's
  `lo-hi:step` range, 1 without one (`1,3,5` has step 1 in Slurm too).
"""

from __future__ import annotations

import enum
import os
import re
import secrets
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REQUEUE_EXIT = 75
NOTICE_SIGNAL = signal.SIGUSR1
# A command that could not run, as a shell says it (and Slurm reports it): not executable (or the
# owner's identity, cgroup, workdir or /tmp could not be taken) and not found. Told as `UserError`.
CANNOT_EXECUTE_EXIT = 126
NOT_FOUND_EXIT = 127
CHECKPOINT_MARKER = "COMMITTED"
METRICS_FILE = "metrics.jsonl"
EXPORTS_DIR = "exports"  # in a job dir: the owner's directory for a recipe's exports
OWNER_FILE = ".trainyard-job"  # in a job dir: the store, job id and key that made it (JSON)

# -- the goodput ledger (issue 39) -------------------------------------------------------------------
# Every allocated GPU-second of an attempt lands in exactly one of these buckets (docs/accounting.md
# defines each); the plane splits, the runtime measures the phases inside steps.
LEDGER_BUCKETS = ("startup", "compute", "data_wait", "checkpoint_stall", "comm_wait", "recompute", "idle",
                  "teardown")
# Each rank of a job that uses the runtime keeps one small JSON file per attempt in the job dir
# (`JobDir.phases_file`), replaced atomically (write a temporary file, rename) at most every
# PHASES_EVERY_S and when the run ends; the plane reads it bounded, through no link (jobfs):
#   {"v": 1, "attempt": a, "rank": r,
#    "began": unix time the steps began (after imports, process group and the checkpoint load),
#    "last": unix time the newest step ended (null before the first), "step": its number, "steps": how many,
#    "phases": {"step": wall seconds of those steps, "data_wait": …, "checkpoint_stall": …, "comm": …}
#              (cumulative over this attempt's steps, up to `last`),
#    "after_last": {"checkpoint_stall": seconds saving after the newest step: a final or preemption save},
#    "ended": unix time the run finished (null while it runs),
#    "recent": [[step, step seconds, comm seconds], …] the newest PHASES_RECENT steps, oldest first}
PHASES_DIR = "phases"  # under the job dir's metrics/
# 1 s: the straggler detector's lag is the window's fill plus this plus its own read period (half
# this); at 2 s a rank slowed to 0.2 s a step was flagged up to 29 steps after (CI, stop 48)
PHASES_EVERY_S = 1.0
PHASES_RECENT = 32
PHASES_MAX_BYTES = 64 * 1024  # what the plane reads of one file at most


class JobVar:
    """The names of trainyard's own variables in a job's environment (the TRAINYARD part of
    `rank_env`, and the ones the plane or a backend adds beside it), written here once so the
    side that sets one and the side that reads it use the same name."""

    JOB_ID = "TRAINYARD_JOB_ID"
    ATTEMPT = "TRAINYARD_ATTEMPT"
    CHECKPOINT_DIR = "TRAINYARD_CHECKPOINT_DIR"
    NODE = "TRAINYARD_NODE"
    METRICS_DIR = "TRAINYARD_METRICS_DIR"  # where the runtime writes metrics (else beside checkpoints)
    WATCHDOG_S = "TRAINYARD_WATCHDOG_S"  # the job's watchdog timeout (exit 86)
    API = "TRAINYARD_API"  # the plane's URL, for the runtime's progress reports
    TOKEN = "TRAINYARD_TOKEN"  # the job's own token (role `job`) for those reports
    GPUS_PER_RANK = "TRAINYARD_GPUS_PER_RANK"  # Slurm backend: each rank's share of the node's GPUs
    GPU_DEVICES = "TRAINYARD_GPU_DEVICES"  # local backend: the device files the containment allows
    ARRAY_JOB_ID = "TRAINYARD_ARRAY_JOB_ID"
    ARRAY_TASK_ID = "TRAINYARD_ARRAY_TASK_ID"
    # a job in an image (issue 37): its name as normalised and the digest the attempt runs; the
    # launch sets them, an exported model's lineage records them (recipes/export.py)
    IMAGE = "TRAINYARD_IMAGE"
    IMAGE_DIGEST = "TRAINYARD_IMAGE_DIGEST"
    # a job's datasets (issue 41): TRAINYARD_DATASET_<NAME> is the staged copy on the rank's node
    # (`staging.types.dataset_var` makes the name)
    DATASET_PREFIX = "TRAINYARD_DATASET_"
    # "plane": the plane's lifecycle rules keep this job's checkpoints (issue 41,
    # control/lifecycle/checkpoint_tiers.py): the runtime deletes no committed step itself
    CHECKPOINT_RETENTION = "TRAINYARD_CHECKPOINT_RETENTION"


PLANE_RETENTION = "plane"  # the value of JobVar.CHECKPOINT_RETENTION that hands retention to the plane


_KEY = re.compile(r"[0-9a-f]{1,32}")
_STEP = re.compile(r"step-(\d+)$")


def committed_steps(checkpoint_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every committed checkpoint, oldest first."""
    out = []
    try:
        entries = list(os.scandir(checkpoint_dir))
    except OSError:
        return []
    for e in entries:
        m = _STEP.match(e.name)
        if m and e.is_dir() and os.path.exists(os.path.join(e.path, CHECKPOINT_MARKER)):
            out.append((int(m.group(1)), Path(e.path)))
    return sorted(out)


def newest_checkpoint(checkpoint_dir: str | Path) -> tuple[int, Path, float] | None:
    """(step, directory, commit time) of the newest committed checkpoint, or None."""
    steps = committed_steps(checkpoint_dir)
    if not steps:
        return None
    step, path = steps[-1]
    return step, path, os.path.getmtime(path / CHECKPOINT_MARKER)


# -- additions for the in-job runtime (trainyard.runtime) ------------------------------------------

# Exit code of a job whose watchdog fired: no training step completed within the configured time
# (a hung rank, a frozen GPU, a deadlocked collective). Distinct from 75 (requeue me), from 1 (a
# Python exception) and from 128+N (killed by signal N), so the control plane can classify the
# attempt as hung rather than crashed. 86 has no conventional meaning elsewhere (Python uses 1 and
# 2, shells 126 and 127, signals 128+N).
WATCHDOG_EXIT = 86

# The signals the runtime treats as "checkpoint at the next step boundary, then exit 75": the
# notice, and the SIGTERM that follows it after the grace period (some launchers only send SIGTERM).
PREEMPT_SIGNALS = (NOTICE_SIGNAL, signal.SIGTERM)


# -- the job directory ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobDir:
    """Where one job's files live: the one definition of the layout.

        <data_dir>/jobs/<id>-<key>/     root (`of`); <key> is random, made when the job is stored
            .trainyard-job              who made the directory (`OWNER_FILE`: store, job id, key)
            logs/rank-<r>.log           each rank's output, appended across attempts (--open-mode=truncate:
                                        each attempt's alone)
            logs/rank-<r>.err           its stderr, with -e/--error (else stderr is in rank-<r>.log)
            checkpoints/step-<N>/       TRAINYARD_CHECKPOINT_DIR (COMMITTED marks a whole one)
            metrics/metrics.jsonl       the runtime's step records (rank 0); metrics/tensorboard/
            metrics/phases/attempt-<a>-rank-<r>.json   each rank's phase timings (issue 39)
            exports/                    the owner's: where a recipe's relative `export:` goes under a plane
            script.sh                   the batch script, for a job submitted as one
            run/attempt-<a>/            a backend's run state of one attempt (deleted on release)

    The layout is shared by the control plane, the backends (which may run elsewhere: Slurm nodes
    see the job dir on a shared file system) and the tools that read a job's output.

    Why a key: job ids come from the store, and a store restored from an older backup (or one
    that lost its SQLite WAL) hands out ids it had already given; `jobs/<id>` would then give a
    new job the old one's script, logs and checkpoints. The key is made at random with each job
    and kept on its row, so a restored store makes other keys, hence other directories. A job
    stored before keys existed has none and keeps `jobs/<id>`.
    """

    root: Path

    def __init__(self, root: str | Path) -> None:
        # A path or its text (a launch spec carries text across processes): held as a Path.
        object.__setattr__(self, "root", Path(root))

    @classmethod
    def of(cls, data_dir: str | Path, job_id: int, key: str | None = None) -> JobDir:
        """The directory of job `job_id` with directory key `key` (the job row's `dir_key`; None
        for a job stored before keys, and for a backend's own tests)."""
        return cls(Path(data_dir) / "jobs" / cls.name_of(job_id, key))

    @staticmethod
    def new_key() -> str:
        """A job's directory key: 48 random bits, so that two stores (or one store before and
        after a restore) giving out the same id practically never give the same directory."""
        return secrets.token_hex(6)

    @staticmethod
    def name_of(job_id: int, key: str | None) -> str:
        return f"{job_id}-{key}" if key else str(job_id)

    @staticmethod
    def parse_name(name: str) -> tuple[int, str | None] | None:
        """(job id, key or None) of a directory name under `jobs/`; None if it is not one."""
        head, _, key = name.partition("-")
        if not (head.isascii() and head.isdigit()) or (key and not _KEY.fullmatch(key)):
            return None
        return int(head), key or None

    @property
    def owner_file(self) -> Path:
        return self.root / OWNER_FILE

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.log"

    def rank_err(self, rank: int) -> Path:
        """The rank's stderr, when the job asked for it apart (sbatch's -e/--error)."""
        return self.logs / f"rank-{rank}.err"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def metrics_dir(self) -> Path:
        return self.root / "metrics"

    @property
    def metrics_file(self) -> Path:
        return self.metrics_dir / METRICS_FILE

    @property
    def phases_dir(self) -> Path:
        """Where the runtime's per-rank phase files go (`PHASES_DIR`, issue 39)."""
        return self.metrics_dir / PHASES_DIR

    def phases_file(self, attempt: int, rank: int) -> Path:
        """One rank's phase timings of one attempt (the format above `PHASES_DIR`)."""
        return self.phases_dir / f"attempt-{attempt}-rank-{rank}.json"

    @property
    def exports(self) -> Path:
        """Where a recipe's relative `export:` goes under a control plane (the job dir itself is the
        plane's: recipes/export.py `recipe_target`)."""
        return self.root / EXPORTS_DIR

    @property
    def tensorboard(self) -> Path:
        return self.metrics_dir / "tensorboard"

    @property
    def script(self) -> Path:
        return self.root / "script.sh"

    @property
    def run(self) -> Path:
        return self.root / "run"

    def attempt_run(self, attempt: int) -> Path:
        return self.run / f"attempt-{attempt}"

    def create(self) -> None:
        """Make the directories a job's ranks write to (logs, checkpoints, metrics).

        Raises:
            OSError: one cannot be created.
        """
        for d in (self.logs, self.checkpoints, self.metrics_dir):
            d.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def attempt_runs(data_dir: str | Path) -> list[Path]:
        """Every attempt's run dir under a data dir, whoever left it: what a backend re-attaches to."""
        return sorted(Path(data_dir).glob("jobs/*/run/attempt-*"))


# -- Slurm's list formats --------------------------------------------------------------------------

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def slurm_node_order(name: str) -> tuple[str, int, str]:
    """The sort key of Slurm's node order: by name, a trailing number by its value (alpha,
    node-2, node-10, zeta), whatever order slurm.conf lists them in. An allocation's nodes come in
    this order in SLURM_JOB_NODELIST, and the first is where the batch script runs (checked on
    Slurm 22.05: slurm.conf `zeta alpha node-2 node-10` gives `alpha,node-[2,10],zeta`, batch on alpha)."""
    m = _NUMBERED.match(name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def compress_hostlist(names: Iterable[str]) -> str:
    """Node names in Slurm's hostlist form, keeping their order: n1,n2 -> n[1-2];
    gpu-01,gpu-02,gpu-03,gpu-04,gpu-07 -> gpu-[01-04,07]; node1,node2,gpu-01 -> node[1-2],gpu-01.

    As `scontrol show hostlist` does: consecutive names with the same prefix share one bracket;
    a run joins numbers that follow one another and are written with the run's zero padding
    (n9,n10 -> n[9-10], n09,n10 -> n[09-10], but n01,n1 -> n[01,1]); nothing is sorted or merged
    across other prefixes (n1,m1,n2 stays as it is); a name without a trailing number stays whole.
    """
    groups: list[tuple[str, list[tuple[str, int]]]] = []  # (prefix, [(first digits, last number), ...]) or (name, [])
    for name in names:
        m = _NUMBERED.match(name)
        if m is None:
            groups.append((name, []))
            continue
        prefix, digits = m.groups()
        if groups and groups[-1][1] and groups[-1][0] == prefix:
            runs = groups[-1][1]
            first, last = runs[-1]
            n = int(digits)
            if n == last + 1 and f"{n:0{len(first)}d}" == digits:
                runs[-1] = (first, n)
            else:
                runs.append((digits, n))
        else:
            groups.append((prefix, [(digits, int(digits))]))
    out = []
    for prefix, runs in groups:
        if not runs:
            out.append(prefix)
        elif len(runs) == 1 and int(runs[0][0]) == runs[0][1]:
            out.append(prefix + runs[0][0])
        else:
            parts = [first if int(first) == last else f"{first}-{last:0{len(first)}d}" for first, last in runs]
            out.append(f"{prefix}[{','.join(parts)}]")
    return ",".join(out)


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's hostlist form back to names, as `scontrol show hostnames` does:
    gpu-[01-04,07] -> gpu-01 gpu-02 gpu-03 gpu-04 gpu-07; n[1-2],m3 -> n1 n2 m3; a[1-2]b[3-4] ->
    a1b3 a1b4 a2b3 a2b4. A range keeps the zero padding of its first number (n[09-10] -> n09 n10).
    One difference: text after the last bracket (n[1-2]-ib) is kept as a suffix here; Slurm 22.05
    refuses it.

    Raises:
        ValueError: an unclosed bracket, an empty or non-numeric range, or a range that goes down.
    """
    out: list[str] = []
    for item in _split_top(expr):
        if item:
            out += _expand_item(item, expr)
    return out


def _split_top(expr: str) -> list[str]:
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    items.append("".join(cur))
    return [i.strip() for i in items]


def _expand_item(item: str, expr: str) -> list[str]:
    i = item.find("[")
    if i < 0:
        if "]" in item:
            raise ValueError(f"hostlist {expr!r}: ']' without '[' in {item!r}")
        return [item]
    j = item.find("]", i)
    if j < 0:
        raise ValueError(f"hostlist {expr!r}: '[' without ']' in {item!r}")
    numbers: list[str] = []
    for part in item[i + 1 : j].split(","):
        lo, sep, hi = part.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"hostlist {expr!r}: {part.strip()!r} is not a number or a lo-hi range")
        if sep and int(hi) < int(lo):
            raise ValueError(f"hostlist {expr!r}: the range {part.strip()!r} goes down")
        numbers += [f"{n:0{len(lo)}d}" for n in range(int(lo), int(hi if sep else lo) + 1)]
    rest = _expand_item(item[j + 1 :], expr) if item[j + 1 :] else [""]
    return [item[:i] + n + r for n in numbers for r in rest]


def format_tasks_per_node(counts: Sequence[int]) -> str:
    """Tasks per node in SLURM_TASKS_PER_NODE's form: [2, 2, 2, 1] -> "2(x3),1"."""
    out: list[str] = []
    i = 0
    while i < len(counts):
        j = i
        while j + 1 < len(counts) and counts[j + 1] == counts[i]:
            j += 1
        out.append(str(counts[i]) if i == j else f"{counts[i]}(x{j - i + 1})")
        i = j + 1
    return ",".join(out)


def parse_tasks_per_node(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE ("4(x2)", "3,1", "2(x3),1") -> the count on each node, in order.

    Raises:
        ValueError: not in that form.
    """
    counts: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if m is None:
            raise ValueError(f"SLURM_TASKS_PER_NODE={text!r}: cannot read {part!r} (e.g. 2(x3),1)")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def array_env(array_id: int, index: int, indices: Sequence[int], step: int = 1) -> dict[str, str]:
    """What a task of a job array sees under Slurm's names: SLURM_ARRAY_JOB_ID (the array's id),
    SLURM_ARRAY_TASK_ID (this task's index), SLURM_ARRAY_TASK_COUNT/MIN/MAX over all `indices`,
    and SLURM_ARRAY_TASK_STEP (`step`: that of the array's `lo-hi:step` range, else 1)."""
    return {"SLURM_ARRAY_JOB_ID": str(array_id), "SLURM_ARRAY_TASK_ID": str(index),
            "SLURM_ARRAY_TASK_COUNT": str(len(indices)), "SLURM_ARRAY_TASK_MIN": str(min(indices)),
            "SLURM_ARRAY_TASK_MAX": str(max(indices)), "SLURM_ARRAY_TASK_STEP": str(step)}


# -- the job environment ---------------------------------------------------------------------------


class EnvPart(enum.Flag):
    """The parts of a rank's environment (see the module docstring); a backend asks for those it
    supplies."""

    CONTRACT = 1
    TRAINYARD = 2
    TORCHELASTIC = 4
    SLURM = 8
    NOT_SLURM = CONTRACT | TRAINYARD | TORCHELASTIC  # under a real Slurm, which sets SLURM_* itself
    ALL = CONTRACT | TRAINYARD | TORCHELASTIC | SLURM


@dataclass(frozen=True)
class JobInfo:
    """What the environment says about the job beyond its ranks (the SLURM part); every field has a
    default, and an empty one leaves its variable unset.

    Args:
        name: SLURM_JOB_NAME.
        team: SLURM_JOB_ACCOUNT.
        pool: SLURM_JOB_PARTITION.
        job_class: SLURM_JOB_QOS.
        cluster: SLURM_CLUSTER_NAME (the cluster config's `cluster.name`).
        submit_dir: SLURM_SUBMIT_DIR; empty: the ranks' working directory.
        submit_host: SLURM_SUBMIT_HOST.
        tasks_per_node: SLURM_NTASKS_PER_NODE, only when the job asked for it (--ntasks-per-node).
        cpus_per_task: SLURM_CPUS_PER_TASK, only when the job asked for it (--cpus-per-task).
        gpus_per_node: SLURM_GPUS_PER_NODE, the GPUs the job holds on each node (--gpus-per-node,
            or what -N with --gpus or --exclusive gave it); None for GPUs anywhere.
        gpus: SLURM_GPUS, the job's GPUs in all.
        mem_per_node_mib: SLURM_MEM_PER_NODE (--mem), in MB as Slurm writes it.
        mem_per_gpu_mib: SLURM_MEM_PER_GPU (--mem-per-gpu).
    """

    name: str = ""
    team: str = ""
    pool: str = ""
    job_class: str = ""
    cluster: str = ""
    submit_dir: str = ""
    submit_host: str = ""
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    gpus_per_node: int | None = None
    gpus: int | None = None
    mem_per_node_mib: int | None = None
    mem_per_gpu_mib: int | None = None


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs: the engine's decision for it, the one value carried from the schedule
    step (`control.loop.snapshot.NodeIndex.ranks`) through `LaunchSpec.ranks` to the rank's environment.

    `gpus` are the node's GPU indices the rank is given, as the node numbers its devices
    (CUDA_VISIBLE_DEVICES; () for none). The engine's indices are the node's own; a backend that
    emulates several nodes on one machine shifts them to the machine's numbering before it builds
    the `Gang` (`backends/local/backend.py`). The stored form of a placement is per node, not per rank
    (`jobs.placement` rows); `ranks_of` is the one rule that turns a node's GPUs into ranks.
    """

    rank: int
    node: str
    gpus: tuple[int, ...] = ()


def ranks_of(parts: Iterable[tuple[str, Sequence[int]]], tasks_per_node: int | None) -> list[RankPlacement]:
    """The ranks of a placement given node by node, as (node, its GPU indices), in node order:
    one rank per GPU, or `tasks_per_node` ranks sharing each node's GPUs evenly, numbered in order.

    The control loop launches these, the API reports a job's world size from them and the fault
    handling maps a failed rank back to its node with them, so the rule lives in one place."""
    out: list[RankPlacement] = []
    for node, gpus in parts:
        k = tasks_per_node or len(gpus)
        per = max(1, len(gpus) // k)
        for t in range(k):
            out.append(RankPlacement(len(out), node, tuple(gpus[t * per:(t + 1) * per])))
    return out


@dataclass(frozen=True)
class Gang:
    """Every rank of one attempt, in rank order (`slots[r].rank == r`). Node order is the order in
    which ranks first use the nodes: node i is GROUP_RANK i and SLURM_NODEID i.

    `gpus_known` False: the launcher binds each task's GPUs (a Slurm step: `Gang.block`), so
    CUDA_VISIBLE_DEVICES and the SLURM GPU variables are left as it set them."""

    slots: tuple[RankPlacement, ...]
    gpus_known: bool = True
    nodes: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not self.slots:
            raise ValueError("a gang has at least one rank")
        object.__setattr__(self, "slots", tuple(self.slots))
        if any(s.rank != r for r, s in enumerate(self.slots)):
            raise ValueError(f"a gang's ranks are 0..n-1 in order, got {[s.rank for s in self.slots]}")
        object.__setattr__(self, "nodes", tuple(dict.fromkeys(s.node for s in self.slots)))

    @classmethod
    def block(cls, nodes: Sequence[str], tasks_per_node: Sequence[int]) -> Gang:
        """Ranks laid out node after node (Slurm's default `block` distribution), GPUs unknown.

        Raises:
            ValueError: the two lists differ in length, or a node has no task.
        """
        if len(nodes) != len(tasks_per_node) or any(n < 1 for n in tasks_per_node):
            raise ValueError(f"nodes {list(nodes)} and tasks per node {list(tasks_per_node)} do not match")
        on = [node for node, n in zip(nodes, tasks_per_node) for _ in range(n)]
        return cls(tuple(RankPlacement(r, node) for r, node in enumerate(on)), gpus_known=False)

    @property
    def world_size(self) -> int:
        return len(self.slots)

    def node_index(self, rank: int) -> int:
        return self.nodes.index(self.slots[rank].node)

    def peers(self, rank: int) -> list[int]:
        """The ranks on `rank`'s node, itself included, in rank order."""
        node = self.slots[rank].node
        return [r for r, s in enumerate(self.slots) if s.node == node]

    def tasks_per_node(self) -> list[int]:
        return [sum(1 for s in self.slots if s.node == n) for n in self.nodes]

    def node_gpus(self, node: str) -> list[str]:
        """The job's GPU ids on `node` (each rank's there, in first-use order), as the environment
        writes them; none when the launcher binds them (`gpus_known` False)."""
        if not self.gpus_known:
            return []
        return list(dict.fromkeys(str(g) for s in self.slots if s.node == node for g in s.gpus))


def rank_env(gang: Gang, rank: int, *, job_id: int, attempt: int, checkpoint_dir: str, master_addr: str,
             master_port: int, workdir: str = "", info: JobInfo = JobInfo(),
             parts: EnvPart = EnvPart.ALL) -> dict[str, str]:
    """The variables `parts` of rank `rank` of `gang`'s environment (see the module docstring).

    Pure: the same arguments give the same variables on the control plane and on a node.

    Raises:
        ValueError: `rank` is not a rank of the gang.
    """
    if not 0 <= rank < gang.world_size:
        raise ValueError(f"rank {rank} is not in a gang of {gang.world_size}")
    slot = gang.slots[rank]
    peers = gang.peers(rank)
    world, local, local_world = gang.world_size, peers.index(rank), len(peers)
    node_id = gang.node_index(rank)
    env: dict[str, str] = {}
    if EnvPart.CONTRACT in parts:
        env.update(RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(local_world),
                   GROUP_RANK=str(node_id), MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        if gang.gpus_known:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, slot.gpus))
    if EnvPart.TRAINYARD in parts:
        env.update({JobVar.JOB_ID: str(job_id), JobVar.ATTEMPT: str(attempt),
                    JobVar.CHECKPOINT_DIR: checkpoint_dir, JobVar.NODE: slot.node})
    if EnvPart.TORCHELASTIC in parts:
        env.update(ROLE_RANK=str(rank), ROLE_WORLD_SIZE=str(world), TORCHELASTIC_RUN_ID=str(job_id),
                   TORCHELASTIC_RESTART_COUNT=str(max(0, attempt - 1)))
    if EnvPart.SLURM in parts:
        env.update(_slurm_env(gang, rank, local, node_id, job_id=job_id, attempt=attempt, workdir=workdir, info=info))
    return env


def _slurm_env(gang: Gang, rank: int, local: int, node_id: int, *, job_id: int, attempt: int, workdir: str,
               info: JobInfo) -> dict[str, str]:
    nodelist = compress_hostlist(gang.nodes)
    env = {
        "SLURM_JOB_ID": str(job_id), "SLURM_JOBID": str(job_id),
        "SLURM_NTASKS": str(gang.world_size), "SLURM_NPROCS": str(gang.world_size),
        "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node_id),
        "SLURM_NNODES": str(len(gang.nodes)), "SLURM_JOB_NUM_NODES": str(len(gang.nodes)),
        "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
        "SLURM_TASKS_PER_NODE": format_tasks_per_node(gang.tasks_per_node()),
        "SLURMD_NODENAME": gang.slots[rank].node,
    }
    gpus = gang.node_gpus(gang.slots[rank].node)
    if gpus:
        env.update(SLURM_GPUS_ON_NODE=str(len(gpus)), SLURM_JOB_GPUS=",".join(gpus))
    optional = {
        "SLURM_JOB_NAME": info.name, "SLURM_JOB_ACCOUNT": info.team, "SLURM_JOB_PARTITION": info.pool,
        "SLURM_JOB_QOS": info.job_class, "SLURM_CLUSTER_NAME": info.cluster,
        "SLURM_SUBMIT_DIR": info.submit_dir or workdir, "SLURM_SUBMIT_HOST": info.submit_host,
        "SLURM_NTASKS_PER_NODE": "" if info.tasks_per_node is None else str(info.tasks_per_node),
        "SLURM_CPUS_PER_TASK": "" if info.cpus_per_task is None else str(info.cpus_per_task),
        "SLURM_GPUS_PER_NODE": "" if info.gpus_per_node is None else str(info.gpus_per_node),
        "SLURM_GPUS": "" if info.gpus is None else str(info.gpus),
        "SLURM_MEM_PER_NODE": "" if info.mem_per_node_mib is None else str(info.mem_per_node_mib),
        "SLURM_MEM_PER_GPU": "" if info.mem_per_gpu_mib is None else str(info.mem_per_gpu_mib),
        "SLURM_RESTART_COUNT": str(attempt - 1) if attempt > 1 else "",
    }
    env.update({k: v for k, v in optional.items() if v})
    return env
