"""The backend interface: how the control loop runs processes without knowing where they run.

A backend *executes decisions and reports facts* (docs/design.md rule 2). It never decides to kill,
requeue or time anything out; the control loop does that and calls `signal`/`release`.

    inventory() -> [NodeInfo]        what can be placed on (nodes, GPUs, topology, health, state)
    launch(LaunchSpec)               start every rank of one attempt, or none (BackendError)
    launch_waits                     whether launch() waits on another system (the loop then
                                     launches off its thread: control/loop/launch_threads.py)
    signal(job, attempt, sig)        deliver `sig` to every rank's process group; gone is fine
    poll() -> [AttemptState]         every attempt it knows, also those re-found after a restart
    check_node(name) -> (ok, why)    health check before a drained node returns to service
    release(job, attempt)            SIGKILL what is left, forget the run state (logs stay)
    watch(wake)                      call wake() when a rank may have ended (news, not a fact:
                                     the loop then polls at once, not at its next tick)
    cpu_seconds(job, attempt)        CPU time its processes used so far (None: cannot tell)
    gpu_percent(job, attempt)        its busiest GPU's utilization now (None: NVML cannot read it)
    gpu_readings()                   each node's GPUs now: utilization, memory, power, temperature
                                     (the node agent's; [] where the backend has none)
    close()                          stop watching; running ranks keep running
    open_terminal(job, attempt, rank, argv)   a command on a new pty in a running rank's place
    open_port(job, attempt, rank, port)       a TCP connection to a port inside a running rank

An attempt is the unit: `(job_id, attempt)` names it, `attempt` increments on every requeue, so
a late fact about attempt 1 can never be confused with attempt 2. Each rank is reported with
exactly one of: `running`, `exit_code` (exited), `signal` (killed by a signal) or `lost` (gone
with no recorded exit: it died while nobody watched, its record points at a recycled pid, or its
node died under it). A running rank may be `stopped` (frozen: alive, making no progress). A node
the backend knows to be down is `healthy=False` with `state` saying why ("dead", "hung").
Interpreting those facts (completed, requeue on 75, node lost, hung, drain, ...) is the control
loop's job; a backend never requeues or drains on its own. Every backend passes the same
conformance suite (tests/backends/conformance.py): the local one, Slurm's and the fake one.

The control plane gets a backend by name from `backends.registry` (which also says how to
discover nodes for a default configuration and how to create one on the configured nodes);
nothing outside this protocol is called on a backend. Fault injection is emulation-only and not
part of `Backend`: the local and fake backends have `kill_node`, `hang_node`, `revive_node`, `kill_rank` and `hang_rank`.

Every rank starts with the job environment `contracts.rank_env` builds (RANK, WORLD_SIZE,
MASTER_ADDR, CUDA_VISIBLE_DEVICES, TRAINYARD_*, torchelastic's and Slurm's variables) on top of
`LaunchSpec.env`, and its output is appended to `contracts.JobDir(job_dir).rank_log(r)`.

Errors: `BackendError` is the only exception a backend raises on purpose; its message says why
(no such workdir, command not found, job dir not creatable, unknown node...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Protocol

from trainyard.contracts import JobInfo, RankPlacement
from trainyard.images.types import CachedImage, EntryInfo, RegistryAccess
from trainyard.staging.types import DatasetEntry, DatasetRef, SourceAccess, StagedDataset
from trainyard.spec.container import ContainerOptions


@dataclass(frozen=True)
class NodeInfo:
    """Inventory a backend reports for one node."""

    name: str
    gpus: int
    gpu_model: str
    gpu_mem_mib: int
    healthy: bool = True
    state: str = "up"  # why it is unhealthy, when the backend knows: "up", "hung", "dead", ...
    block: str = ""  # topology domains, where the backend knows them (Slurm: node features)
    rack: str = ""


@dataclass(frozen=True)
class Owner:
    """The Unix identity an attempt's processes run as (design rule 6): the job owner's account,
    its primary group, and the supplementary groups (the team's group among them). None on a
    `LaunchSpec` means the plane's own identity (a plane run as a plain user runs its own jobs)."""

    user: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class Limits:
    """What an attempt may use on each node, as Slurm's --mem, --mem-per-gpu and --cpus-per-task
    ask it, and the configuration's pids limit; None is no limit of that kind (a backend that
    cannot enforce one says so)."""

    mem_mib: int | None = None  # per node, for all the attempt's ranks there
    mem_per_gpu_mib: int | None = None
    cpus_per_task: int | None = None
    # processes and threads per node, all the attempt's ranks there together (cgroup pids.max), from
    # the configuration (`classes[].pids_max`, `teams[].pids_max`; spec.ConfigSpec.pids_max_for)
    pids_max: int | None = None


@dataclass(frozen=True)
class Constraints:
    """The job's own placement options (sbatch's `-C`, GPU model, `-x`, `--exclusive`): the engine
    has honoured them already; a backend whose engine checks them too (Slurm) passes them on."""

    constraint: str | None = None
    gpu_model: str | None = None
    exclude: tuple[str, ...] = ()
    exclusive: bool = False


@dataclass(frozen=True)
class ContainerLaunch:
    """An attempt's container: the job's options, and the image pinned to the digest every node
    of every attempt runs (`ref` is `registry/repository[:tag]@digest`). The loop has had each node
    pull it (`Backend.prepare_image`) before it launches."""

    options: ContainerOptions
    ref: str
    digest: str


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one attempt of a job; decided by the control loop."""

    job_id: int
    attempt: int  # 1, 2, ... (increments on every requeue)
    command: list[str]  # argv of every rank
    workdir: str  # cwd of the ranks
    job_dir: str  # DATA_DIR/jobs/<id>; logs go to <job_dir>/logs/rank-<r>.log
    ranks: list[RankPlacement]  # where each rank runs, as the schedule step decided (`contracts.RankPlacement`)
    env: dict[str, str]  # user env + TRAINYARD_API, TRAINYARD_TOKEN ...; contract vars go on top
    checkpoint_dir: str  # value of TRAINYARD_CHECKPOINT_DIR
    job: JobInfo = JobInfo()  # name, team, pool, class...: what the environment's Slurm part says
    owner: Owner | None = None  # who the ranks run as (None: the plane's own user)
    limits: Limits = Limits()  # memory and CPUs per node / task
    # When the plane will have ended this attempt for its time limit (SIGTERM, grace, SIGKILL), in
    # seconds from its start; None: no limit. A backend with limits of its own (Slurm's --time)
    # sets one here as a backstop; the plane's own stop comes first.
    time_limit_s: float | None = None
    # A batch script (`yard submit job.sbatch`), run as Slurm runs one: `command` runs once, on the
    # first rank's node, with the whole allocation's environment; its `srun` starts the tasks
    # (`ranks`). The attempt then has one rank to report, 0: the script, whose exit is the job's.
    # False: `command` is every rank's (the command form, `yard submit -- CMD`, like `srun CMD`).
    batch: bool = False
    constraints: Constraints = Constraints()
    # sbatch's -e/--error: each rank's stderr goes to `JobDir.rank_err(r)`, its stdout alone to
    # `rank_log(r)` (False: both to rank_log, as sbatch without --error)
    stderr_apart: bool = False
    # the job's image (None: a bare job, run in the node's own environment)
    container: ContainerLaunch | None = None
    # its datasets (issue 41), pinned at submit; the loop stages each on every node of the attempt
    # (`control/loop/data_staging.py`) and fills `dataset_paths`: node -> {TRAINYARD_DATASET_<NAME>:
    # the staged copy on that node}, which every rank (and task of a batch script's srun) on that
    # node gets in its environment, and a container gets bound read-only at the same path
    datasets: tuple[DatasetRef, ...] = ()
    dataset_paths: dict[str, dict[str, str]] = field(default_factory=dict)
    # the loop's own: the launch may copy a checkpoint back from the archive first (the job has
    # archived steps: `control/loop/checkpoint_fetch.py`), so it runs off the loop's thread
    may_fetch: bool = False


@dataclass(frozen=True)
class RankState:
    """One fact about one rank: running, exited (code), killed (signal) or lost."""

    rank: int
    pid: int | None
    running: bool
    exit_code: int | None  # set when the rank exited normally
    signal: int | None  # set when it was killed by a signal (e.g. 9, 15)
    lost: bool = False  # gone with no recorded exit (died unwatched, pid recycled, or its node died)
    stopped: bool = False  # running but stopped (SIGSTOP, /proc state T): makes no progress
    oom_killed: bool = False  # the kernel's OOM killer killed a process of the rank (its memory limit)
    # a fork or thread of the rank failed at the pids limit (cgroup pids.events), and the backend
    # ended the rank for it; `pids_max` is the limit it hit
    pids_max_hit: bool = False
    pids_max: int | None = None


@dataclass(frozen=True)
class AttemptState:
    job_id: int
    attempt: int
    ranks: list[RankState]

    @property
    def done(self) -> bool:
        """No rank is running (each one exited, was killed or is lost)."""
        return not any(r.running for r in self.ranks)


@dataclass(frozen=True)
class GpuReading:
    """One GPU of one node, read now by the backend's node agent (issue 39, per-GPU telemetry):
    `gpu` is the GPU's index on its node (as placements name it), `util` percent busy, `mem_mib`
    memory in use, `power_w` and `temp_c` where the source tells them. `source` says how it was
    read: "nvml" (the GPU's own counters) or "emulated" (backends/local/gpu_agent.py: derived from
    the holding rank's CPU activity). Which job holds the GPU is the plane's join, not the backend's."""

    node: str
    gpu: int
    util: float
    mem_mib: float
    power_w: float | None = None
    temp_c: float | None = None
    source: str = "nvml"


@dataclass(frozen=True)
class Terminal:
    """A process started inside a running rank (`Backend.open_terminal`, issue 38: `yard shell`,
    `yard alloc`'s shell): `fd` is the plane's end of its pseudo-terminal (read its output, write
    its input), `pid` the plane's child that the caller waits for (`os.waitpid`); its exit status
    is the command's. The caller closes `fd`."""

    fd: int
    pid: int


@dataclass(frozen=True)
class Tunnel:
    """A byte stream to `127.0.0.1:PORT` as a running rank sees it (`Backend.open_port`, issue 38:
    `yard port-forward`, `yard notebook`), connected by a process of the job's owner in the rank's
    network, never by the plane itself. The plane reads the job side's bytes from `read_fd` and writes
    the client's to `write_fd`: one connected socket for both (the local and fake backends), or a
    helper's stdout and stdin pipes (Slurm: a relay started by srun in the job), then `pid` is that
    helper, the plane's child and the leader of its own process group, which the caller ends (the
    group) and reaps. The caller closes the fds; the job
    side's end is an end of file on `read_fd`."""

    read_fd: int
    write_fd: int
    pid: int | None = None


class BackendError(Exception):
    """A backend could not do what it was asked; the message says why."""


class NothingListens(BackendError):
    """`open_port`: the rank runs, but nothing listens on the port in its network (the connection
    was refused): the job's server has not started yet, or listens elsewhere."""


class Backend(Protocol):
    name: str
    # True when `launch` waits on another system for seconds (Slurm: slurmctld schedules the batch
    # job, then its ranks start): the control loop launches on threads of its own, so that the
    # pass (notices, end records) does not wait with it (control/loop/launch_threads.py). The backend must
    # then answer poll/signal/release while a launch is under way.
    launch_waits: bool

    def inventory(self) -> list[NodeInfo]: ...

    def launch(self, spec: LaunchSpec) -> None: ...

    def signal(self, job_id: int, attempt: int, sig: int, *, batch_shell: bool = False) -> None: ...
    # batch_shell: sbatch's --signal=B:SIG, to a batch job's script shell rather than its steps' tasks

    def poll(self) -> list[AttemptState]: ...

    def check_node(self, name: str) -> tuple[bool, str]: ...

    def release(self, job_id: int, attempt: int) -> None: ...

    def watch(self, wake: Callable[[], None]) -> None: ...
    # wake() may be called from any thread; a backend with no such news does nothing

    def close(self) -> None: ...

    # Images (docs/control-plane.md, "Environment images"): each node's cache. `prepare_image`
    # pulls and unpacks `ref` (pinned: `…@sha256:…`) on `node` unless it is there, and returns it;
    # it raises `images.types.ImagePullError` (never leaving half an entry). It may take minutes:
    # the loop calls it off its thread.
    def prepare_image(self, node: str, ref: str, access: RegistryAccess) -> CachedImage: ...

    def image_entries(self, node: str) -> list[EntryInfo]: ...

    def remove_image(self, node: str, digest: str) -> bool: ...  # False: not there, or in use

    # Datasets (issue 41; docs/control-plane.md, "Storage"): each node's cache. `stage_dataset`
    # copies `ref` into `node`'s cache unless it is there (verified against `ref.checksum`, made
    # visible atomically: never half a dataset), evicting least-recently-used entries no running
    # job uses to stay under `access.cache_max_bytes`, and returns where it lies; it raises
    # `staging.types.DataStagingError`. `job` pins the entry for the attempt (job id, attempt)
    # until `release` of that attempt. It may take minutes: the loop calls it off its thread.
    def stage_dataset(self, node: str, ref: DatasetRef, access: SourceAccess,
                      job: tuple[int, int] | None = None) -> StagedDataset: ...

    def dataset_entries(self, node: str) -> list[DatasetEntry]: ...

    def remove_dataset(self, node: str, checksum: str) -> bool: ...  # False: not there, or in use

    # A command in a running rank's place (issue 38): its node, its cell (cgroups), its mount
    # namespace (private /tmp, its container), its environment, as the job's owner, on a new
    # pseudo-terminal of `rows` x `cols`. Raises BackendError when the rank is not running.
    # `session`: it is an interactive allocation's session (salloc's interactive step), whose
    # environment is the whole allocation's, as a batch script's (the Slurm backend's terminal is
    # otherwise a one-task step's; the others' rank 0 of a batch attempt has that environment already).
    def open_terminal(self, job_id: int, attempt: int, rank: int, argv: list[str], *, rows: int = 24,
                      cols: int = 80, term: str = "xterm-256color", session: bool = False) -> Terminal: ...

    # A TCP connection to `port` on the loopback address (127.0.0.1, then ::1) of a running rank's
    # network, made as the job's owner from inside the rank's place (its cgroups and namespaces).
    # Raises BackendError when the rank is not running or nothing listens on the port there.
    def open_port(self, job_id: int, attempt: int, rank: int, port: int) -> Tunnel: ...

    def cpu_seconds(self, job_id: int, attempt: int) -> float | None:
        """How busy an attempt is (issue 38: idle interactive allocations give their GPUs back): the
        CPU time, user + system in seconds, its processes on all its nodes have used since it
        started, exited ones and those a terminal started in a rank included; None when the
        backend cannot tell (an attempt it does not know, no accounting). The caller turns two
        readings into a rate; a reading lower than the one before means "counted anew"."""
        ...

    def gpu_percent(self, job_id: int, attempt: int) -> float | None:
        """The busiest of the attempt's GPUs right now, as NVML's utilization (percent of the last
        sample period a kernel ran); None where NVML cannot read them (no NVML, emulated GPUs, GPUs
        on hosts the backend does not reach)."""
        ...

    def gpu_readings(self) -> list[GpuReading]:
        """A reading of every GPU the backend's node agent can read now (control/lifecycle/telemetry.py
        samples it every `telemetry.interval`): NVML's where it answers, else the local backend's
        emulation; [] where the backend has no agent (Slurm, for now). Cheap: called once a second."""
        ...

    # What a bare job's training process would see on `node` (`backends.environment.fingerprint`:
    # python, torch, cuda, nccl, driver); {"error": why} when the node cannot tell. May take seconds.
    def node_environment(self, node: str) -> dict[str, str]: ...
