"""The Slurm backend: the control loop's decisions carried out by an existing Slurm cluster.

trainyard keeps deciding (quotas, classes, preemption by checkpoint, retries); Slurm starts the
processes across nodes. Each attempt is one batch job pinned to the engine's placement:

    sbatch --nodelist=<the placement's nodes> --nodes=N --ntasks-per-node=K --gres=gpu:G
           --no-requeue --job-name=<the job's name> --comment="trainyard job J attempt A" --chdir=<workdir> <run dir>/batch.sh

and the batch script runs one `srun` step that starts every rank through `slurm/task.py` (Slurm's
own SLURM_* variables, plus the rest of `contracts.rank_env` built from them; MASTER_ADDR = the
first node's address; each rank's output in `JobDir.rank_log`) and the same rank runner as the local backend,
whose exit records land in `<job dir>/run/attempt-<a>/` — the job dir is on a file system the
control plane and the nodes share, as a Slurm cluster's home or project space is.

A batch script (`LaunchSpec.batch`: `yard submit job.sbatch`) runs as sbatch runs one: the same
allocation is asked for, but batch.sh then `exec`s `slurm/task.py --batch`, which runs the
script once, in Slurm's own batch step on the first node, with the batch step's environment and
the job's under it (`task.batch_env`), behind the same rank runner: the attempt has one
rank, 0, the script, and its exit record is the attempt's outcome (75 = requeue me, as for a
rank). The `srun` and `scontrol` the script runs are Slurm's own; the tasks its `srun` starts get
the batch step's environment (srun's default) and write to the script's output, rank 0's log.
Signals to a batch attempt (`signal`): the notices SIGUSR1/SIGUSR2 go to the tasks of its steps
only, as Slurm's `--signal=SIG@secs` without `B:` sends them (the script's shell, which would die
of a signal it does not trap, is left alone; the tasks its srun started get the notice, exit 75,
and srun's exit is the script's); every other signal goes with `scancel --full` (the batch
shell, its children, the steps), as plain `scancel` sends SIGTERM to the batch step too. A
batch attempt's rank is `lost` when any node of its allocation goes down (Slurm ends such a job).

Facts come from those records and from Slurm: `squeue` for the batch jobs, `scontrol show node`
for the inventory (GPUs from GRES, block and rack from node features; GPU memory, which Slurm does
not know, from the cluster configuration the backend is created with). A node Slurm reports DOWN, DRAIN, FAIL or NOT_RESPONDING is unhealthy; a rank
on it with no exit record is `lost`, like a rank of a dead emulated node. Signals go through
`scancel --signal=<SIG>` (every task of every step: the preemption notice is SIGUSR1), and
`release` cancels the batch job. A job Slurm shows STOPPED (its tasks got SIGSTOP) has frozen
ranks: `running` and `stopped`, as on the local backend. When `squeue` does not answer, `poll`
raises `BackendError` (the control loop skips that pass) rather than report ranks lost. `--no-requeue`: Slurm never restarts an attempt on its own —
requeues are the control loop's, with a new attempt number.

Nothing in slurm.conf changes. What trainyard needs there: a partition for its jobs whose nodes
it alone schedules (or at least whose GPUs it alone hands out), GPUs as GRES (`gres/gpu`), and
the job dir on a shared file system. Whole-GPU placements ask Slurm for the same GPU count per
node; a placement that shares GPUs (`gpu_mem` requests) asks for none and narrows
CUDA_VISIBLE_DEVICES itself.
"""

from __future__ import annotations

import math
import os
import pwd
import re
import shlex
import shutil
import signal as _signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from trainyard import jobfs
from trainyard.backends import registry
from trainyard.backends.rundir import job_tools
from trainyard.backends.rundir import terminal
from trainyard.backends.rundir import port as rank_port
from trainyard.backends.slurm import env as slurm_env
from trainyard.backends.rundir.attempt_dir import open_attempt
from trainyard.backends.rundir.exit_watch import ExitWatch, WatchesExits
from trainyard.backends.base import AttemptState, BackendError, LaunchSpec, NodeInfo, RankState, Terminal, Tunnel
from trainyard.backends.base import GpuReading
from trainyard.backends.slurm import pyxis
from trainyard.images.types import UNSUPPORTED, CachedImage, EntryInfo, ImageConfig, ImagePullError, RegistryAccess
from trainyard.contracts import NOTICE_SIGNAL, JobDir
from trainyard.staging.cache import NodeCaches
from trainyard.staging.types import DatasetEntry, DatasetRef, SourceAccess, StagedDataset

TASK = "backends/slurm/task.py"  # the rank wrapper, run from the attempt's copy (job_tools.copy_files)
UNHEALTHY_FLAGS = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "REBOOT", "MAINT", "UNKNOWN")
# Job states (squeue(1) "JOB STATE CODES") in which the batch job is not over: its ranks run, wait
# or are held. STOPPED is a job whose tasks were sent SIGSTOP (frozen: running, `stopped`), not one
# that ended; the *_HOLD/REQUEUE* ones do not occur with --no-requeue but are not ends either.
ACTIVE_JOB_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING",
                     "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT", "STAGE_OUT",
                     "SIGNALING")
# Signals a batch attempt gets in its steps' tasks only (Slurm's --signal without B:): preemption notices.
NOTICE_SIGNALS = (NOTICE_SIGNAL, _signal.SIGUSR2)  # the preemption notice, and --signal's usual


@dataclass
class _Attempt:
    job_id: int
    attempt: int
    run_dir: Path
    world_size: int
    slurm_id: int
    nodes: dict[int, str] = field(default_factory=dict)  # rank → planned node (actual: rank-<r>.node)
    batch: bool = False  # a batch script: one rank (the script) on the first node of `allocation`
    allocation: tuple[str, ...] = ()  # every node of the Slurm job, in order
    owner: str | None = None  # the account the job runs as (None: the plane's own)


def parse_kv_line(line: str) -> dict[str, str]:
    """`scontrol show … -o` output: space-separated Key=Value pairs (values without spaces)."""
    out: dict[str, str] = {}
    for tok in line.split():
        k, sep, v = tok.partition("=")
        if sep:
            out[k] = v
    return out


def gres_gpus(gres: str) -> tuple[int, str]:
    """`gpu:4`, `gpu:a100:8(S:0-1)`, `gpu:a100:4,shard:8` → (GPU count, model)."""
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and len(parts) >= 2:
            try:
                return int(parts[-1]), parts[1] if len(parts) == 3 else "gpu"
            except ValueError:
                continue
    return 0, "gpu"


def features_topology(features: str) -> dict[str, str]:
    """Node features naming its place (`block=b1`, `block:b1` or `block_b1`; the same for `rack`)
    → {"block": "b1", "rack": "r3"}: what topology-aware gang placement groups nodes by."""
    out: dict[str, str] = {}
    for feat in features.split(","):
        for key in ("block", "rack"):
            for sep in ("=", ":", "_"):
                if feat.startswith(key + sep) and len(feat) > len(key) + 1:
                    out[key] = feat[len(key) + 1:]
    return out


def node_health(state: str) -> tuple[bool, str]:
    """Slurm's node state (`IDLE`, `MIXED+DRAIN`, `DOWN*`, `IDLE+NOT_RESPONDING`) → (healthy, why)."""
    flags = state.upper().replace("*", "+NOT_RESPONDING").split("+")
    bad = [f for f in flags if f in UNHEALTHY_FLAGS]
    return (not bad, "up" if not bad else "-".join(b.lower() for b in bad))


# While a launch waits for its ranks: how often slurmctld is asked whether the job still lives (a
# job that ended before every rank started failed to launch); each squeue is a process and an RPC.
SQUEUE_EVERY_S = 0.5


class SlurmBackend(WatchesExits):
    """Runs each attempt as a Slurm batch job; see the module docstring.

    Args:
        data_dir: the control plane's data dir (job dirs under it must be visible on the nodes).
        partition: the Slurm partition trainyard's jobs go to (None: the cluster's default).
        gpu_mem_mib: GPU memory per node name (from the cluster configuration), or one value for
            all (Slurm does not know it); a node missing from the mapping gets 81920.
        env: extra environment for the Slurm commands (e.g. SLURM_CONF).
        launch_timeout_s: how long a launch waits for Slurm to start every rank.
        python: the interpreter the nodes run the rank wrapper with, as the job's owner
            (`job_python`: the plane's own may be where owners cannot enter); the wrapper itself
            is copied into each attempt's run dir for the same reason (`job_tools.copy_files`).
    """

    name = "slurm"
    launch_waits = True  # sbatch, slurmctld's scheduling, then the ranks: seconds

    def __init__(self, data_dir: str | Path, *, partition: str | None = None,
                 gpu_mem_mib: int | dict[str, int] = 81920, env: dict[str, str] | None = None,
                 launch_timeout_s: float = 60.0, python: str | None = None) -> None:
        self._data_dir = Path(data_dir)
        self._partition = partition
        self._gpu_mem = gpu_mem_mib
        # Slurm's commands: found once, on the plane's own PATH at start (the operator's), then run
        # by absolute path with an environment of the plane's choosing (`slurm_env.command_env`).
        self._bin = find_commands(env)
        self._env = slurm_env.command_env(os.environ, env)
        self._env["PATH"] = ":".join(dict.fromkeys([*self._env["PATH"].split(":"),
                                                    *(os.path.dirname(b) for b in self._bin.values())]))
        self._launch_timeout_s = launch_timeout_s
        self._python = job_tools.resolve(python)
        self._lock = threading.RLock()
        self._attempts: dict[tuple[int, int], _Attempt] = {}
        self._exit_watch: ExitWatch | None = None
        self._launching: set[tuple[int, int]] = set()  # launches under way (no lock held while they wait)
        self._node_cache: tuple[float, dict[str, dict[str, str]]] | None = None
        self._pyxis: bool | None = None  # asked once, at the first job with an image (`pyxis.has_pyxis`)
        self._dataset_caches = NodeCaches(self._data_dir / "datasets")
        self._discover()

    # -- Slurm commands --------------------------------------------------------------------------

    def _run(self, *args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
        try:
            r = subprocess.run([self._bin.get(args[0], args[0]), *args[1:]], env=self._env, capture_output=True,
                               text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as e:
            raise BackendError(f"slurm: `{' '.join(args[:2])}` did not answer in {timeout:.0f}s") from e
        except OSError as e:
            raise BackendError(f"slurm: cannot run {args[0]}: {e.strerror}") from e
        if check and r.returncode != 0:
            raise BackendError(f"slurm: `{' '.join(args[:3])}` failed ({r.returncode}): {r.stderr.strip()[:500]}")
        return r

    def _nodes(self, max_age_s: float = 0.5) -> dict[str, dict[str, str]]:
        """`scontrol show node -o`, parsed, cached for a moment (poll and inventory both read it)."""
        now = time.monotonic()
        if self._node_cache is not None and now - self._node_cache[0] < max_age_s:
            return self._node_cache[1]
        out = self._run("scontrol", "show", "node", "-o").stdout
        nodes = {}
        for line in out.splitlines():
            kv = parse_kv_line(line)
            if "NodeName" not in kv:
                continue
            if self._partition and self._partition not in kv.get("Partitions", "").split(","):
                continue
            nodes[kv["NodeName"]] = kv
        self._node_cache = (now, nodes)
        return nodes

    def _job_states(self, slurm_ids: list[int]) -> dict[int, str] | None:
        """State of each batch job Slurm still knows (`squeue -t all` keeps ended ones a while), or
        None when Slurm did not answer (slurmctld busy or down: squeue failed or timed out).

        No answer is no fact: a caller must not read "the job is gone" into it (that made every
        rank of every attempt `lost`, and their jobs NODE_FAIL, whenever slurmctld was slow to
        answer under load). Asked about one job it no longer knows, squeue exits 1 with "Invalid
        job id specified": that is an answer (gone).
        """
        if not slurm_ids:
            return {}
        try:
            r = self._run("squeue", "-h", "-t", "all", "-o", "%i %T", "-j", ",".join(map(str, slurm_ids)),
                          check=False)
        except BackendError:
            return None
        if r.returncode != 0 and "Invalid job id" not in r.stderr:
            return None
        states = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                states[int(parts[0])] = parts[1]
        return states

    # -- images (pyxis.py) ------------------------------------------------------------------------

    def _check_pyxis(self, image: str) -> None:
        if self._pyxis is None:
            self._pyxis = pyxis.has_pyxis(self._bin["srun"], self._env)
        if not self._pyxis:
            raise ImagePullError(UNSUPPORTED, image, "this Slurm cluster has no pyxis (its `srun --help` lists no "
                                 "--container-image): the Slurm backend runs images through pyxis; submit without "
                                 "--container-image, or to a cluster that has it")

    def prepare_image(self, node: str, ref: str, access: RegistryAccess) -> CachedImage:
        """Nothing to pull ahead: enroot imports the image on the node at the step's start (its own
        cache). Fails when the cluster has no pyxis."""
        self._check_pyxis(ref)
        digest = ref.rsplit("@", 1)[-1]
        return CachedImage(digest, ref.rsplit("@", 1)[0], (), ImageConfig(), "", 0)

    def image_entries(self, node: str) -> list[EntryInfo]:
        return []  # enroot's cache, not trainyard's

    def remove_image(self, node: str, digest: str) -> bool:
        return False

    # -- datasets (`staging.cache`) ------------------------------------------------------------------
    # The nodes of the Slurm clusters trainyard is tested on are this machine: each node's cache is a
    # `NodeDatasetCache` under `<data_dir>/datasets/<node>` (`NodeCaches`), staged by the plane itself.
    # On a real cluster the copy must run on the node (an `srun -w NODE` of the staging), left for later.

    def stage_dataset(self, node: str, ref: DatasetRef, access: SourceAccess,
                      job: tuple[int, int] | None = None) -> StagedDataset:
        try:
            return self._dataset_caches.stage(node, ref, access, job)
        except ValueError as e:  # not a node name
            raise BackendError(str(e)) from None

    def dataset_entries(self, node: str) -> list[DatasetEntry]:
        try:
            return self._dataset_caches.entries(node)
        except ValueError as e:
            raise BackendError(str(e)) from None

    def remove_dataset(self, node: str, checksum: str) -> bool:
        try:
            return self._dataset_caches.remove(node, checksum)
        except ValueError as e:
            raise BackendError(str(e)) from None

    def _unpin_datasets(self, job_id: int, attempt: int) -> None:
        self._dataset_caches.unpin(job_id, attempt)

    def _running_rank(self, job_id: int, attempt: int, rank: int) -> tuple[_Attempt, str | None]:
        """The attempt of a rank that runs now, and its node (not down): what a terminal or a
        forwarded port may enter (asks slurmctld for the job's and the nodes' states).

        Raises:
            BackendError: no such attempt or rank here, its node is down, or the rank has ended.
        """
        where = f"job {job_id} attempt {attempt} rank {rank}"
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None or not 0 <= rank < att.world_size:
                raise BackendError(f"{where}: no such running rank on the {self.name} backend")
            states = self._job_states([att.slurm_id])
            nodes = self._nodes()
            down = {n for n, kv in nodes.items() if not node_health(kv.get("State", "UNKNOWN"))[0]}
            st = self._rank_state(att, rank, None if states is None else states.get(att.slurm_id), down)
            node = att.nodes.get(rank)
            if node in down:
                raise BackendError(f"{where}: its node {node} is down")
            if not st.running:
                raise BackendError(f"{where}: the rank is not running (it has ended)")
            return att, node

    def open_terminal(self, job_id: int, attempt: int, rank: int, argv: list[str], *, rows: int = 24,
                      cols: int = 80, term: str = terminal.DEFAULT_TERM, session: bool = False) -> Terminal:
        """Slurm's own way in: `runuser -u <owner> -- srun --jobid=<the batch job> --overlap --pty
        -w <the rank's node> -N1 -n1 argv` on a new pty (argv empty: the owner's login shell), so
        slurmstepd starts it in the job's allocation and cgroups, as the owner. Its environment is
        the step's Slurm gives (the plane's clean command environment, the account's, SLURM_* of
        the step, TERM), not the rank's own TRAINYARD_* additions; a container rank's image is not
        entered (pyxis's `--container-name` would be needed). Tested on the Slurm test cluster
        (tests/backends/slurm/test_slurm_terminal.py, test_slurm_interactive.py).

        `session` (an allocation's session, rank 0 of its batch attempt: the hold): argv runs
        behind `slurm/task.py --session`, which makes the step's environment the allocation's, as
        salloc's interactive step has it (SLURM_NNODES, SLURM_NTASKS, SLURM_TASKS_PER_NODE,
        SLURM_JOB_NODELIST of the whole job, no SLURM_STEP_*; the job's own variables under them;
        in the job's workdir): `srun` typed there starts tasks across the allocation.

        Raises:
            BackendError: no such attempt or rank here, its node is down, or the rank has ended.
        """
        where = f"job {job_id} attempt {attempt} rank {rank}"
        att, node = self._running_rank(job_id, attempt, rank)
        owner = att.owner
        command = list(argv) or [_login_shell(owner)]
        if session and att.batch:
            command = [self._python, "-I", "-S", str(job_tools.copied(att.run_dir, TASK)), "--session",
                       str(att.run_dir), "--", *command]
        srun = [self._bin["srun"], f"--jobid={att.slurm_id}", "--overlap", "--pty", "-N1", "-n1",
                *([f"--nodelist={node}"] if node else []), *command]
        if owner is not None:
            srun = [self._bin["runuser"], "-u", owner, "--", *srun]
        try:
            return terminal.spawn(terminal.with_ctty(srun), {**self._env, "TERM": term}, rows, cols)
        except OSError as e:
            raise BackendError(f"{where}: cannot open a terminal: {e}") from e

    def open_port(self, job_id: int, attempt: int, rank: int, port: int) -> Tunnel:
        """Slurm's own way in, as `open_terminal`'s: `runuser -u <owner> -- srun --jobid=<the batch
        job> --overlap -N1 -n1 -w <the rank's node> python3 -I -S -c RELAY <port>` with pipes
        (`rundir/port.py`): the relay, a step of the job's as the owner on the rank's node,
        connects to the port on the node's loopback and copies bytes both ways; the Tunnel's `pid`
        is runuser's (its own process group). A container rank's network is the node's (pyxis
        shares it). Untested here: the Slurm test cluster (tests/slurm_cluster.py) takes minutes
        to start.

        Raises:
            BackendError: no such attempt or rank here, its node is down, the rank has ended, or
                nothing listens on `port` there.
        """
        where = f"job {job_id} rank {rank}"
        att, node = self._running_rank(job_id, attempt, rank)
        owner = att.owner
        # --unbuffered: slurmstepd passes the task's output on line by line otherwise, and the
        # relay's b"+" (and every byte after it) would wait for a newline.
        srun = [self._bin["srun"], f"--jobid={att.slurm_id}", "--overlap", "--unbuffered", "-N1", "-n1",
                *([f"--nodelist={node}"] if node else []), *rank_port.relay_argv(self._python, port)]
        if owner is not None:
            srun = [self._bin["runuser"], "-u", owner, "--", *srun]
        try:
            return rank_port.start_relay(srun, dict(self._env))
        except rank_port.PortError as e:
            raise rank_port.backend_error(e, job_id, rank, port) from None
        except OSError as e:
            raise BackendError(f"{where}: cannot start the relay: {e}") from e

    def cpu_seconds(self, job_id: int, attempt: int) -> float | None:
        """None: not read. Slurm keeps the figure (the job's cgroup under slurmd, `sstat`'s
        TotalCPU), but on another host or by a command per job and pass; an idle allocation here
        is told by its terminal input alone (docs/control-plane.md, "Idle allocations")."""
        return None

    def gpu_percent(self, job_id: int, attempt: int) -> float | None:
        """None: the job's GPUs are on Slurm's nodes, which this plane's NVML does not see."""
        return None

    def gpu_readings(self) -> list[GpuReading]:
        """Nothing yet: reading a Slurm node's GPUs needs a step in each job, or DCGM there
        (docs/control-plane.md, "GPU telemetry")."""
        return []

    def node_environment(self, node: str) -> dict[str, str]:
        """Not asked of Slurm's nodes (it would take a job step): {"error"}, which the check skips."""
        return {"error": "the Slurm backend does not fingerprint its nodes"}

    # -- interface ------------------------------------------------------------------------------

    def inventory(self) -> list[NodeInfo]:
        """Slurm's nodes (of the partition): GPUs from GRES, health from the node state, block and
        rack from the node features (`features_topology`)."""
        out = []
        for name, kv in sorted(self._nodes(max_age_s=0).items()):
            gpus, model = gres_gpus(kv.get("Gres", ""))
            healthy, why = node_health(kv.get("State", "UNKNOWN"))
            mem = self._gpu_mem.get(name, 81920) if isinstance(self._gpu_mem, dict) else self._gpu_mem
            topo = features_topology(kv.get("ActiveFeatures") or kv.get("AvailableFeatures") or "")
            out.append(NodeInfo(name, gpus, model, mem, healthy=healthy, state=why,
                                block=topo.get("block", ""), rack=topo.get("rack", "")))
        return out

    def launch(self, spec: LaunchSpec) -> None:
        """Submit the attempt as one batch job and wait until every rank has started, or none.

        The wait (slurmctld schedules the job, then its ranks start: seconds) holds no lock:
        `poll`, `signal` and other launches go on meanwhile (`launch_waits`; the control loop
        launches on threads of its own). The attempt is known to them once every rank has started.

        Raises:
            BackendError: unknown or unhealthy node, workdir missing, Slurm refused the job, or
                the ranks did not all start within `launch_timeout_s` (the job is cancelled).
        """
        key = (spec.job_id, spec.attempt)
        with self._lock:
            if key in self._attempts or key in self._launching:
                raise BackendError(f"job {spec.job_id} attempt {spec.attempt}: already launched (release it first)")
            self._launching.add(key)
        try:
            att = self._submit_and_await(spec)
            with self._lock:
                self._attempts[key] = att
        finally:
            with self._lock:
                self._launching.discard(key)

    def _submit_and_await(self, spec: LaunchSpec) -> _Attempt:
        """`launch` without the bookkeeping: the batch job submitted, its ranks started."""
        where = f"job {spec.job_id} attempt {spec.attempt}"
        if not spec.command or not spec.ranks:
            raise BackendError(f"{where}: empty command or no ranks")
        if (problem := jobfs.cannot_enter(spec.owner, spec.workdir)) is not None:  # asked as the owner
            raise BackendError(f"{where}: {problem}")
        nodes = self._nodes(max_age_s=0)
        order: list[str] = []
        for r in sorted(spec.ranks, key=lambda r: r.rank):
            if r.node not in nodes:
                raise BackendError(f"{where}: rank {r.rank} placed on {r.node!r}, which Slurm does not know")
            if r.node not in order:
                order.append(r.node)
        for n in order:
            healthy, why = node_health(nodes[n].get("State", "UNKNOWN"))
            if not healthy:
                raise BackendError(f"{where}: placed on {n}, which Slurm reports {why}")
        per_node = {n: [r for r in spec.ranks if r.node == n] for n in order}
        counts = {len(v) for v in per_node.values()}
        if len(counts) != 1:
            raise BackendError(f"{where}: the Slurm backend runs the same number of ranks on every node; "
                               f"the placement has {sorted(len(v) for v in per_node.values())}")
        k = counts.pop()
        gpus_per_node = {n: len({g for r in v for g in r.gpus}) for n, v in per_node.items()}
        gpn = max(gpus_per_node.values())
        per_rank = max(len(r.gpus) for r in spec.ranks)

        try:
            tree, run_dir = open_attempt(spec.job_dir, spec.attempt)
            tree.remove_tree(run_dir)  # an earlier try of this attempt (the owner's dir: never followed)
            tree.make_dir(run_dir, None, exist_ok=False)
        except OSError as e:
            raise BackendError(f"{where}: cannot create {e.filename}: {e.strerror}") from e
        script = run_dir / "batch.sh"
        try:
            self._hand_over(run_dir, self._batch_script(spec, run_dir, per_rank), spec)
        except OSError as e:
            _remove_run_dir(run_dir)
            raise BackendError(f"{where}: cannot prepare {run_dir}: {e.strerror}") from e
        # --export=ALL exports the clean environment sbatch runs with (slurm_env), nothing of the
        # job's: that one reaches the tasks through job-env.json.
        # The job's own name (SLURM_JOB_NAME, %x, squeue's NAME); which trainyard job and attempt
        # it is stays in the comment, for an operator reading squeue -o %k.
        args = ["sbatch", "--parsable", f"--job-name={spec.job.name or f'yard-{spec.job_id}'}",
                f"--comment=trainyard job {spec.job_id} attempt {spec.attempt}",
                f"--nodes={len(order)}", f"--nodelist={','.join(order)}", f"--ntasks-per-node={k}",
                "--no-requeue", f"--chdir={spec.workdir}", f"--output={run_dir / 'batch.log'}",
                "--open-mode=append", "--export=ALL"]
        if self._partition:
            args.append(f"--partition={self._partition}")
        c = spec.constraints  # the job's own options: slurmctld checks them against the pinned nodes too
        if gpn:
            args.append(f"--gres=gpu:{c.gpu_model}:{gpn}" if c.gpu_model else f"--gres=gpu:{gpn}")
        if c.constraint:
            args.append(f"--constraint={c.constraint}")
        if c.exclude:
            args.append(f"--exclude={','.join(c.exclude)}")
        if c.exclusive:
            args.append("--exclusive")
        if spec.job.team:  # Slurm's accounting and limits see the team as the account
            args.append(f"--account={spec.job.team}")
        if spec.limits.cpus_per_task:  # SLURM_CPUS_PER_TASK, and Slurm's CPUs for each task
            args.append(f"--cpus-per-task={spec.limits.cpus_per_task}")
        if spec.limits.mem_mib:  # SLURM_MEM_PER_NODE, and Slurm's memory limit where it enforces one
            args.append(f"--mem={spec.limits.mem_mib}M")
        elif spec.limits.mem_per_gpu_mib:
            args.append(f"--mem-per-gpu={spec.limits.mem_per_gpu_mib}M")
        if spec.time_limit_s:  # a backstop: the plane stops the job at its limit first
            args.append(f"--time={math.ceil(spec.time_limit_s / 60)}")
        command = [self._bin["sbatch"], *args[1:], str(script)]
        if spec.owner is not None:  # submitted by the owner: Slurm runs and charges the job as them
            command = [self._bin["runuser"], "-u", spec.owner.user, "--", *command]
        try:
            # from the job's directory: Slurm makes sbatch's own the job's SLURM_SUBMIT_DIR
            sub = subprocess.run(command, env=self._env, capture_output=True, text=True, timeout=30,
                                 stdin=subprocess.DEVNULL, cwd=spec.workdir or None)
        except (OSError, subprocess.TimeoutExpired) as e:
            _remove_run_dir(run_dir)
            raise BackendError(f"{where}: sbatch failed: {e}") from e
        if sub.returncode != 0 or not sub.stdout.strip().split(";")[0].isdigit():
            _remove_run_dir(run_dir)
            raise BackendError(f"{where}: Slurm refused the job: {sub.stderr.strip()[:500]}")
        slurm_id = int(sub.stdout.strip().split(";")[0])
        # A batch attempt reports one rank, the script, on the first node (as the local backend).
        ranks = {0: order[0]} if spec.batch else {r_.rank: r_.node for r_ in spec.ranks}
        owner = spec.owner.user if spec.owner is not None else None
        att = _Attempt(spec.job_id, spec.attempt, run_dir, len(ranks), slurm_id, nodes=ranks,
                       batch=spec.batch, allocation=tuple(order), owner=owner)
        meta = {"job_id": spec.job_id, "attempt": spec.attempt, "world_size": len(ranks),
                "slurm_job_id": slurm_id, "ranks": [{"rank": x, "node": n} for x, n in ranks.items()],
                "owner_user": owner}  # not `owner`: the rank runner reads that (a dict: who to become)
        if spec.batch:
            meta.update(batch=True, allocation=list(order))
        try:
            jobfs.write_record(run_dir / "attempt.json", meta)
        except OSError as e:  # the owner's directory: something took the name
            self._cancel(att)
            _remove_run_dir(run_dir)
            raise BackendError(f"{where}: cannot record the attempt in {run_dir}: {e.strerror}") from e
        try:
            self._await_ranks(att)
        except BaseException:
            self._cancel(att)
            _remove_run_dir(run_dir)
            raise
        return att

    def _hand_over(self, run_dir: Path, script: str, spec: LaunchSpec) -> None:
        """Write the batch script and the job's environment into the new attempt dir, then give the
        dir to the job's owner, whose tasks write their records there (mode 0700: the job token is
        in job-env.json, the owner's, 0600). Written while the dir is still the plane's (`jobfs`)."""
        tree = jobfs.Tree(run_dir)
        who = (spec.owner.uid, spec.owner.gid) if spec.owner is not None else None
        tree.create_file("batch.sh", script.encode(), 0o644, owner=who, exist_ok=False)
        job_tools.copy_files(run_dir, job_tools.SLURM_TASK_FILES)  # the plane's, the owner runs them
        slurm_env.write_job_env(run_dir, spec)
        jobfs.Tree(run_dir.parent).make_dir(run_dir.name, 0o700, owner=who)

    def _batch_script(self, spec: LaunchSpec, run_dir: Path, per_rank: int) -> str:
        """batch.sh: the rendezvous (the first node's address, a free port), then every rank in
        one srun step (the command form) or the job's own script in this batch step (a batch spec)."""
        mode = (["--batch"] if spec.batch else []) + (["--stderr-apart"] if spec.stderr_apart else [])
        python, ctr = self._python, []
        if spec.container is not None:  # through pyxis (`pyxis.py`): the image's python3 runs the wrapper
            python = pyxis.IMAGE_PYTHON
            ctr = pyxis.srun_options(spec.container, [spec.job_dir, spec.workdir])
        task = [python, "-I", "-S", str(job_tools.copied(run_dir, TASK)), *mode, str(run_dir), str(spec.job_dir), "--", *spec.command]
        pick_port = ("import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])")
        lines = [
            "#!/bin/bash",
            f"# trainyard job {spec.job_id}, attempt {spec.attempt}: "
            + ("the job's batch script, once, in this batch step" if spec.batch else "every rank in one srun step"),
            'MASTER_ADDR=$(scontrol show node "$SLURMD_NODENAME" -o 2>/dev/null | tr " " "\\n" '
            '| sed -n "s/^NodeAddr=//p")',
            'export MASTER_ADDR="${MASTER_ADDR:-$(hostname)}"',
            f"export MASTER_PORT=$({shlex.quote(self._python)} -c {shlex.quote(pick_port)})",
        ]
        if spec.batch and ctr:  # the script in the image too: a one-task step of pyxis's on the first node
            lines.append("exec srun -N1 -n1 --overlap --unbuffered " + " ".join(shlex.quote(a) for a in [*ctr, *task]))
        elif spec.batch:
            lines.append("exec " + " ".join(shlex.quote(a) for a in task))
        else:
            lines += [f"export TRAINYARD_GPUS_PER_RANK={per_rank}",
                      # --kill-on-bad-exit=0: a failed rank does not take the others down; the control loop decides.
                      "exec srun --kill-on-bad-exit=0 --unbuffered " + " ".join(shlex.quote(a) for a in [*ctr, *task])]
        return "\n".join([*lines, ""])

    def _await_ranks(self, att: _Attempt) -> None:
        where = f"job {att.job_id} attempt {att.attempt}"
        deadline = time.monotonic() + self._launch_timeout_s
        asked = 0.0  # when squeue was last asked: the rank records are read every 50 ms, squeue less
        state = None
        while True:
            recs = [jobfs.read_record(att.run_dir / f"rank-{r}.json") for r in range(att.world_size)]
            for r, rec in enumerate(recs):
                if rec is not None and rec.get("error"):
                    raise BackendError(f"{where}: rank {r}: {rec['error']}")
            if all(rec is not None for rec in recs):
                return
            if time.monotonic() - asked < SQUEUE_EVERY_S:
                time.sleep(0.05)
                continue
            asked = time.monotonic()
            states = self._job_states([att.slurm_id])
            state = None if states is None else states.get(att.slurm_id)  # None: not known (yet)
            if state is not None and state not in ACTIVE_JOB_STATES:
                # A short job can start its ranks and end between the read above and squeue's
                # answer: read the records again, after the end, before calling it a failed start.
                if all(jobfs.read_record(att.run_dir / f"rank-{r}.json") is not None for r in range(att.world_size)):
                    return
                tail = _tail(att.run_dir / "batch.log")
                raise BackendError(f"{where}: the Slurm job {att.slurm_id} ended ({state}) before every rank "
                                   f"started{': ' + tail if tail else ''}")
            if time.monotonic() > deadline:
                waiting = [r for r, rec in enumerate(recs) if rec is None]
                raise BackendError(f"{where}: ranks {waiting} did not start in {self._launch_timeout_s:.0f}s "
                                   f"(Slurm job {att.slurm_id} is {state or 'unknown'})")
            time.sleep(0.05)

    def signal(self, job_id: int, attempt: int, sig: int, *, batch_shell: bool = False) -> None:
        """`scancel --signal`: every task of the attempt's step gets `sig`; gone is fine. A batch
        attempt's notices (SIGUSR1/2) go to its steps' tasks only, anything else with `--full`
        (the script's shell and children too): see the module docstring. `batch_shell` (the job's
        --signal=B:SIG) sends it to the script's shell alone, `scancel --batch`, as Slurm does."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                return
            if sig == _signal.SIGKILL:
                jobfs.touch_record(att.run_dir / "killed")  # the owner's dir: never through a link
            name = _signal.Signals(sig).name.removeprefix("SIG")
            full = ["--full"] if att.batch and sig not in NOTICE_SIGNALS else []
            if att.batch and batch_shell:
                full = ["--batch"]
            self._run("scancel", *full, f"--signal={name}", str(att.slurm_id), check=False)

    def poll(self) -> list[AttemptState]:
        with self._lock:
            if not self._attempts:
                return []
            states = self._job_states([a.slurm_id for a in self._attempts.values()])
            if states is None:
                raise BackendError("slurm: `squeue` did not answer; the attempts' states are unknown this time")
            nodes = self._nodes()
            down = {n for n, kv in nodes.items() if not node_health(kv.get("State", "UNKNOWN"))[0]}
            return [AttemptState(a.job_id, a.attempt, [self._rank_state(a, r, states.get(a.slurm_id), down)
                                                       for r in range(a.world_size)])
                    for _, a in sorted(self._attempts.items())]

    def _rank_state(self, att: _Attempt, r: int, job_state: str | None, down: set[str]) -> RankState:
        rec = jobfs.read_record(att.run_dir / f"rank-{r}.json")
        pid = rec["pid"] if rec else None
        ex = jobfs.read_record(att.run_dir / f"rank-{r}.exit")
        if ex is not None:
            return RankState(r, pid, running=False, exit_code=ex.get("exit_code"), signal=ex.get("signal"))
        try:
            node = (jobfs.Tree(att.run_dir).read_text(f"rank-{r}.node", 1024) or "").strip() or att.nodes.get(r)
        except OSError:
            node = att.nodes.get(r)
        if node in down or (att.batch and down.intersection(att.allocation)):
            return RankState(r, pid, running=False, exit_code=None, signal=None, lost=True)
        if job_state in ACTIVE_JOB_STATES:
            return RankState(r, pid, running=True, exit_code=None, signal=None, stopped=job_state == "STOPPED")
        if jobfs.record_exists(att.run_dir / "killed") or job_state == "CANCELLED":
            return RankState(r, pid, running=False, exit_code=None, signal=int(_signal.SIGKILL))
        return RankState(r, pid, running=False, exit_code=None, signal=None, lost=True)

    def check_node(self, name: str) -> tuple[bool, str]:
        kv = self._nodes(max_age_s=0).get(name)
        if kv is None:
            return False, f"Slurm does not know {name!r}"
        healthy, why = node_health(kv.get("State", "UNKNOWN"))
        return (True, f"{name} is {kv.get('State')} in Slurm") if healthy else (False, f"{name} is {why} in Slurm")

    def release(self, job_id: int, attempt: int) -> None:
        """Cancel the batch job (whatever is left of it) and forget the run state (logs stay).

        It does not wait for Slurm to finish the job (COMPLETING, epilog): the loop releases
        every ended attempt in the pass that records its end, and two seconds of waiting each,
        under this backend's lock, held up the next pass and the exit watch (a job's end was
        recorded 3.2 s late at p95 in bench/vs_slurm.py). A launch onto the same nodes waits
        for them in its own thread (control/loop/launch_threads.py). An attempt whose every rank has written
        its exit record is ending on its own: no scancel (two RPCs to a slurmctld that is busy
        finishing the job; sent for every ended attempt, they delayed the next notices by seconds)."""
        with self._lock:
            self._unpin_datasets(job_id, attempt)
            att = self._attempts.pop((job_id, attempt), None)
            if att is None:
                return
            if not all(jobfs.record_exists(att.run_dir / f"rank-{r}.exit") for r in range(att.world_size)):
                self._cancel(att, wait_s=0.0)
            _remove_run_dir(att.run_dir)

    def _cancel(self, att: _Attempt, wait_s: float = 2.0) -> None:
        """Kill every process of the batch job and cancel it. Slurm finishes that on its own
        (COMPLETING, epilog): wait only briefly, the control loop must not stall on it."""
        self._run("scancel", "--full", "--signal=KILL", str(att.slurm_id), check=False)
        self._run("scancel", str(att.slurm_id), check=False)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            states = self._job_states([att.slurm_id])
            if states is not None and states.get(att.slurm_id) not in ACTIVE_JOB_STATES:
                return  # gone, or ended
            time.sleep(0.1)

    def close(self) -> None:
        """Forget everything; Slurm keeps running the jobs and the next owner re-attaches."""
        with self._lock:
            if self._exit_watch is not None:
                self._exit_watch.stop()
                self._exit_watch = None
            self._attempts.clear()

    def _discover(self) -> None:
        for run_dir in JobDir.attempt_runs(self._data_dir):
            # the plane wrote it; one the job's owner put there (it owns the dir) names nothing
            st = jobfs.Tree(run_dir).lstat("attempt.json")
            if st is None or st.st_uid != jobfs.plane_uid():
                continue
            meta = jobfs.read_record(run_dir / "attempt.json")
            if not meta or "slurm_job_id" not in meta:
                continue
            self._attempts[(int(meta["job_id"]), int(meta["attempt"]))] = _Attempt(
                int(meta["job_id"]), int(meta["attempt"]), run_dir, int(meta["world_size"]), int(meta["slurm_job_id"]),
                nodes={int(x["rank"]): str(x["node"]) for x in meta.get("ranks", [])},
                batch=bool(meta.get("batch")), allocation=tuple(str(n) for n in meta.get("allocation", ())),
                owner=str(meta["owner_user"]) if meta.get("owner_user") else None)


def _login_shell(user: str | None) -> str:
    """The account's login shell (the plane's own user's when None), else /bin/sh."""
    try:
        shell = pwd.getpwnam(user).pw_shell if user else pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:
        shell = ""
    return shell if os.path.isabs(shell) else "/bin/sh"


def require_commands(env: Mapping[str, str] | None = None) -> None:
    """Raises BackendError unless Slurm's client commands are on PATH."""
    find_commands(env)


def find_commands(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The absolute paths of Slurm's client commands (and runuser), found on the plane's PATH at
    start (`env`'s PATH first, when it has one) and the standard system directories.

    Raises:
        BackendError: a Slurm command is not there.
    """
    path = ":".join(p for p in ((env or {}).get("PATH"), os.environ.get("PATH"), slurm_env.COMMAND_PATH) if p)
    found = {}
    for cmd in ("sbatch", "squeue", "scancel", "scontrol"):
        where = shutil.which(cmd, path=path)
        if where is None:
            raise BackendError(f"slurm backend: `{cmd}` is not on PATH (install Slurm's client commands)")
        found[cmd] = os.path.abspath(where)
    found["runuser"] = shutil.which("runuser", path=slurm_env.COMMAND_PATH) or "runuser"
    found["srun"] = shutil.which("srun", path=path) or "srun"  # `open_terminal`'s and pyxis's detection
    return found


def _create(data_dir: Path, nodes: list[NodeInfo], options: Mapping[str, object]) -> SlurmBackend:
    partition = options.get("partition")
    python = options.get("job_python")
    return SlurmBackend(data_dir, partition=str(partition) if partition else None,
                        gpu_mem_mib={n.name: n.gpu_mem_mib for n in nodes},
                        python=str(python) if python else None)


def _discover_nodes(data_dir: Path, options: Mapping[str, object]) -> list[NodeInfo]:
    return _create(data_dir, [], options).inventory()


registry.register(registry.BackendKind(
    "slurm", "an existing Slurm cluster, through sbatch/squeue/scancel/scontrol", _create, _discover_nodes,
    options=frozenset({"partition", "job_python"}), check=lambda options: require_commands()))


def _remove_run_dir(run_dir: Path) -> None:
    """An attempt's run dir (the owner's inside: what its tasks left is never followed), and `run/`
    itself once no attempt is left in it."""
    jobfs.Tree(run_dir.parent).remove_tree(run_dir.name)
    jobfs.Tree(run_dir.parents[1]).rmdir(run_dir.parent.name)


def _tail(path: Path, n: int = 5) -> str:
    """The last `n` lines of a file a job's owner writes (Slurm's batch output): 64 KiB at most."""
    lines = jobfs.Tree(path.parent).tail_lines(path.name, 64 * 1024)
    return " | ".join(x.decode("utf-8", "replace") for x in lines[-n:])
