"""The scheduler's vocabulary: what a cycle reads (a `Snapshot`) and what it returns (`CycleResult`).

These are plain slotted dataclasses rather than pydantic models on purpose: a cycle at 1,250 nodes
and 13,000 jobs must run in tens of milliseconds, and the validated, user-facing models live in
`trainyard.spec.models` and are converted once at the edge (`trainyard.spec.models`, `trainyard.control.loop.snapshot`).

Units everywhere: time in seconds (floats, an arbitrary epoch), GPU memory in integer MiB (as the
store keeps it and `ClusterState` counts it: no float drift, no conversion inside a cycle; GB is
converted once where people write it, `trainyard.spec.models` and the API). Job ids are `JobId`, ints, as
the store numbers jobs: the control loop passes them through, and traces number their jobs too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from trainyard.sched.cluster import ClusterState, Placement
from trainyard.sched.constraints import Where

# A job's id: the store's integer primary key, or a trace's job number in the simulator. Ties in
# every ordering are broken by it, so ints (not strings: "10" < "9") keep submission order.
JobId = int


@dataclass(frozen=True, slots=True)
class JobClass:
    """A class of service: how urgent, how long it may wait and how it may be interrupted.

    `checkpoint_on_notice`: its jobs checkpoint when they get a preemption notice and exit 75
    (trainyard's runtime does; docs/design.md, contracts), so a preemption loses only the save and the
    restart, not the work since the last periodic checkpoint. False for jobs that ignore the
    notice (a plain script): they lose what they did since their last checkpoint.
    """

    name: str
    priority: int
    preemptible: bool = True
    max_wait_s: float = 24 * 3600.0
    min_run_s: float = 0.0
    max_run_s: float | None = None
    grace_s: float = 60.0
    checkpoint_on_notice: bool = True


@dataclass(frozen=True, slots=True)
class Quota:
    """A team's share of one pool, in GPUs (Kueue's ResourceQuota).

    `borrowing_limit` caps how far beyond `nominal` the team may go by borrowing idle quota of its
    cohort; `lending_limit` caps how much of its own unused nominal quota others may borrow.
    None means unlimited.
    """

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


# In `Team.las`: least-attained-service preemption for every class of the team.
ALL_CLASSES = "*"


@dataclass(frozen=True, slots=True)
class Team:
    """A team: its cohort, its quotas per pool, and whether its own short or young jobs may take
    GPUs from its own long-running ones (`las`: the classes for which it does, `ALL_CLASSES` for
    every class, empty for none: the engine's step 5c, least-attained-service within the team's
    own quota; its choice, as it is its own work that waits)."""

    name: str
    cohort: str | None = None
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    las: frozenset[str] = frozenset()

    def quota(self, pool: str) -> Quota:
        return self.quotas.get(pool, _NO_QUOTA)

    def las_for(self, job_class: str) -> bool:
        return bool(self.las) and (ALL_CLASSES in self.las or job_class in self.las)


_NO_QUOTA = Quota(nominal=0, borrowing_limit=0, lending_limit=0)


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a job asks for; immutable across its attempts.

    Two shapes, as in Slurm: `gpus_per_node` set → a gang of `min_nodes..max_nodes` nodes with that
    many GPUs each (elastic when the range is wider than one value); `gpus_per_node` None → `gpus`
    GPUs anywhere, packed on as few nodes (and blocks) as possible.
    `gpu_mem_mib` is the memory needed on each GPU, in MiB; None asks for whole GPUs. A job with a
    `gpu_mem_mib` smaller than the GPU's memory may share that GPU with others whose requests fit
    beside it. `where`: the nodes it may use (features, GPU model, node lists) and whether it takes
    them whole (`sched/constraints.py`); None for a job that asked for none of that.
    """

    id: JobId
    team: str
    job_class: str
    submit_time: float
    gpus: int = 1
    gpus_per_node: int | None = None
    min_nodes: int = 1
    max_nodes: int = 1
    gpu_mem_mib: int | None = None
    est_runtime_s: float | None = None
    checkpoint_interval_s: float | None = None
    pool: str = "default"
    avoid: frozenset[str] = frozenset()  # node names to use only when nothing else fits (suspects)
    where: Where | None = None
    reservation: str | None = None  # the admin reservation it runs in (sbatch --reservation; sched/reservations.py)
    # (node name, bytes of the job's datasets its cache holds), for the nodes holding any: a tie-break
    # among equal placements (sched/placement.py, rule 6), never a rule
    data_on: tuple[tuple[str, int], ...] = ()
    # What the cluster has learned the job will run (services/learned_runtimes.py; the simulator's
    # sim/estimates.py `learned`), at most its limit; read only by the start-time estimates
    # (sched/estimate.py), never by a decision: the limit stays what backfill and reservations trust.
    expected_runtime_s: float | None = None

    # Derived once at construction: read on every job in every cycle.
    min_gpus: int = field(init=False, compare=False, repr=False)
    max_gpus: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        gpn = self.gpus_per_node
        object.__setattr__(self, "min_gpus", self.gpus if gpn is None else gpn * self.min_nodes)
        object.__setattr__(self, "max_gpus", self.gpus if gpn is None else gpn * self.max_nodes)

    @property
    def elastic(self) -> bool:
        return self.gpus_per_node is not None and self.max_nodes > self.min_nodes


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A job waiting to (re)start, with the history the policies may weigh."""

    req: JobRequest
    attempt: int = 0
    queued_since: float = 0.0  # when it last entered the queue (submit or requeue)
    progress_s: float = 0.0  # checkpointed work already done, in wall seconds at its size
    attained_gpu_s: float = 0.0  # GPU-seconds it has held so far (Tiresias' attained service)
    held: bool = False


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs: its placement and what an interruption would cost."""

    req: JobRequest
    placement: Placement
    start_time: float  # start of the current attempt
    last_checkpoint: float  # time of its newest complete checkpoint (start_time if none yet)
    attempt: int = 0
    progress_s: float = 0.0  # checkpointed work before this attempt
    attained_gpu_s: float = 0.0  # GPU-seconds held before this attempt
    preempting: bool = False  # a notice was sent; it is checkpointing and will leave
    # Its attempt is still being launched (the backend has not started its ranks yet, 1-3 s on
    # Slurm): never a victim, since stopping it saves nothing and its notice could only wait.
    starting: bool = False

    @property
    def gpus(self) -> int:
        return self.placement.gpus

    @property
    def nodes(self) -> int:
        return len(self.placement.nodes)

    def saved_at(self, now: float) -> float:
        """The newest moment whose work is safe in a checkpoint, as far as the scheduler can tell.

        `last_checkpoint` is the newest checkpoint reported (or the moment the attempt began
        making progress); when the job declares a checkpoint interval, the checkpoints it has
        made since are projected forward from there. Before that moment (a restart still
        loading), nothing of this attempt is at risk but the time spent, so `start_time`.
        """
        a = self.last_checkpoint
        if now < a:
            return self.start_time
        step = self.req.checkpoint_interval_s
        if step:
            return a + ((now - a) // step) * step
        return a

    def lost_if_stopped(self, now: float) -> float:
        """GPU-seconds of work an interruption now would throw away.

        `saved_at` inlined: the engine asks this of thousands of candidate victims per cycle."""
        a = self.last_checkpoint
        if now < a:
            return (now - self.start_time) * self.placement.gpus  # saved_at is start_time
        step = self.req.checkpoint_interval_s
        if step:
            a += ((now - a) // step) * step
        start = self.start_time
        return (now - (a if a > start else start)) * self.placement.gpus


@dataclass(frozen=True, slots=True)
class AdminReservation:
    """An admin reservation (Slurm's `scontrol create reservation`): `nodes` (names) held from
    `start` until `end` for the jobs submitted with `--reservation=name` (`sched/reservations.py`).
    Who may submit into it is checked at submission, not here."""

    name: str
    nodes: frozenset[str]
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one cycle may look at. The cycle must not modify it.

    `cluster` holds the nodes and their free GPUs and memory, consistent with `running`
    (`ClusterState.build(nodes, running)` derives it; the simulator keeps it up to date
    incrementally). `usage` is each team's decayed GPU-seconds (fair share's history).
    `explain` asks for a reason and an estimated start for every pending job; the simulator
    turns it off since nobody reads them there.
    """

    now: float
    cluster: ClusterState
    teams: Mapping[str, Team]
    classes: Mapping[str, JobClass]
    running: Sequence[RunningJob]
    pending: Sequence[PendingJob]
    usage: Mapping[str, float] = field(default_factory=dict)
    explain: bool = True
    # GPUs held per (team, pool), as the running jobs add up. Optional: a caller that keeps it
    # incrementally (the simulator) saves every cycle a pass over the running jobs.
    allocated: Mapping[tuple[str, str], int] | None = None
    # The same per (team, pool, class): a team's quota is filled by its highest-priority work
    # first (`sched/budget.py`). Optional, for the same reason; consistent with `running`.
    allocated_by_class: Mapping[tuple[str, str, str], int] | None = None
    # Jobs stopped for another job that still waits: victim -> the job it was stopped for. The
    # cycle tries a victim only after that job, so a victim that would come back ahead of it (an
    # in-quota job stopped for its own team's higher-priority job that borrows) cannot take the
    # GPUs it left straight back and be preempted again.
    stopped_for: Mapping[JobId, JobId] = field(default_factory=dict)
    # Admin reservations (`sched/reservations.py`): nodes held for some users and teams over a
    # time window; ended ones hold nothing.
    reservations: Sequence[AdminReservation] = ()


class Reason(str, enum.Enum):
    """Why a pending job did not start in this cycle (Slurm's REASON column)."""

    QUOTA = "quota"  # its team's quota (nominal + borrowing, or the cohort) is used up
    CAPACITY = "capacity"  # not enough free GPUs right now
    TOPOLOGY = "topology"  # enough GPUs in total, but not in the shape asked for
    MEMORY = "memory"  # no GPU has (or could have) the free memory asked for
    RESERVATION = "reservation"  # it would delay a reservation made for an older job
    PRIORITY = "priority"  # jobs ahead of it come first (the policy does not backfill)
    HELD = "held"  # held by a user or operator
    PREEMPTING = "preempting"  # victims are checkpointing to make room for it
    # admin reservations (`sched/reservations.py`):
    RESERVED = "reserved"  # it would fit but on nodes an admin reservation holds (now, or before it would end)
    RESV_WAIT = "resv_wait"  # its reservation has not started yet
    RESV_GONE = "resv_gone"  # its reservation ended or was deleted


@dataclass(frozen=True, slots=True)
class Start:
    job_id: JobId
    placement: Placement


class PreemptionKind(enum.StrEnum):
    """Why a running job is stopped for another (`Preempt.reason`). A `StrEnum`: each kind is the
    very string stored in event rows and shown by the API and `yard` ("preempted (share) to make
    room for job 7"), so rows written before the enum read back equal to it."""

    RECLAIM = "reclaim"  # quota taken back by a team owed it (step 5)
    PRIORITY = "priority"  # a lower-priority job stopped for a higher one (step 5)
    SHARE = "share"  # time-sharing of borrowed GPUs by attained service (step 5b)
    LAS = "las"  # least-attained-service within a team's own quota (step 5c)
    OVERDUE = "overdue"  # an overdue job takes its place back from its team's younger jobs (step 5d)
    MOVE = "move"  # moved aside for a gang blocked by fragmentation (step 5e)
    BORROW = "borrow"  # a lower-priority borrower stopped so a job may borrow within its cohort (step 5f)


@dataclass(frozen=True, slots=True)
class Preempt:
    job_id: JobId
    reason: PreemptionKind
    for_job: JobId


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: JobId
    start_at: float  # the shadow time: when the reserved GPUs are expected to be free
    nodes: tuple[int, ...]


@dataclass(slots=True)
class PendingInfo:
    """Why a job still waits, and when it may start. Not frozen: a cycle makes one per pending
    job (thousands), and a frozen dataclass's __init__ costs twice as much."""

    reason: Reason
    est_start: float | None  # None: cannot be estimated (unknown run times ahead)
    # Which limit holds a job blocked by quota when no step can help it (`sched/cycle/explain.py`):
    # BORROWING_LIMIT (its team's borrowing limit) or COHORT_IN_USE (the cohort's lendable GPUs are
    # held by work it may not preempt); None otherwise.
    detail: str | None = None


BORROWING_LIMIT = "borrowing_limit"
COHORT_IN_USE = "cohort_in_use"


@dataclass(slots=True)
class CycleResult:
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)
    pending: dict[JobId, PendingInfo] = field(default_factory=dict)
