"""The control plane's tables (SQLAlchemy 2.0 declarative). The store is the truth (design rule 3).

What lives where:
- `jobs`: one row per job, its request and its current state (Slurm's names, with a reason);
- `attempts`: one row per start of a job (a requeue starts a new attempt), with placement and exit;
- `events`: the audit trail — every state change, who did it, when and why;
- `nodes`: runtime state of the nodes (drained, down, suspect) — their shape comes from the configuration;
- `start_estimates`, `estimate_outcomes`: each waiting job's estimated start as it changed, and
  per started attempt the error of its first and last estimates (issue 40, services/estimates.py);
- `gpu_samples`: per-GPU telemetry of the jobs, a bounded time series per job (issue 39);
- `config_versions`: the cluster configuration (nodes, teams and quotas, classes) as versioned
  YAML; the newest row is in force, older ones allow diff and rollback;
- `tokens`: API tokens (only a SHA-256 hash is kept) with the role and team they grant;
- `store_meta`: facts about the store itself: `instance_id`, made once when the store is created
  (`store/identity.py`);
- `usage_carry`: what rows purged by retention had added to the Prometheus counters, so that the
  counters never go down.

Times are UNIX seconds (floats) so that the engine, which takes time as a number, reads them
without conversion. Schema changes go through Alembic (`store/migrations`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Table, Text, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    if TYPE_CHECKING:  # each model here maps one Table (DeclarativeBase allows any FromClause)
        __table__: ClassVar[Table]


def engine(request_field: str | None = "") -> dict[str, Any]:
    """Column `info` of a job field the scheduling engine reads: the one declaration that the
    schedule step's query (`control.loop.schedule.PENDING_COLUMNS`), the snapshot (`control.loop.snapshot`)
    and the API's job view (`services.jobs`) derive their column lists from.

    `request_field`: the `sched.types.JobRequest` field the column fills as is; "" (the default)
    when it has the column's own name; None when the snapshot converts it itself (the id, the
    shape, the history a `PendingJob` carries). A new field the engine should see is a column
    with `info=engine()`, a JobRequest field of the same name, and a migration (docs/architecture.md).
    """
    return {"engine": request_field}


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True, info=engine(None))
    name: Mapped[str] = mapped_column(String(200), default="")
    user: Mapped[str] = mapped_column(String(100))
    team: Mapped[str] = mapped_column(String(100), index=True, info=engine())
    job_class: Mapped[str] = mapped_column(String(100), info=engine())
    pool: Mapped[str] = mapped_column(String(100), default="default", info=engine())
    state: Mapped[str] = mapped_column(String(20), index=True)
    reason: Mapped[str] = mapped_column(String(200), default="")
    held: Mapped[bool] = mapped_column(Boolean, default=False, info=engine(None))

    # what to run
    command: Mapped[list[str]] = mapped_column(JSON)
    script: Mapped[str | None] = mapped_column(Text, nullable=True)  # batch script text, if any
    workdir: Mapped[str] = mapped_column(String(1000))
    env: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    output: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    # a random key made at submission: the job's directory is `jobs/<id>-<key>` (contracts.JobDir),
    # which a store restored from an older backup cannot hand to another job; None: stored before
    # keys (its directory is `jobs/<id>`)
    dir_key: Mapped[str | None] = mapped_column(String(32), nullable=True)

    # what it asks for
    nodes_min: Mapped[int] = mapped_column(Integer, default=1, info=engine("min_nodes"))
    nodes_max: Mapped[int] = mapped_column(Integer, default=1, info=engine("max_nodes"))
    gpus_per_node: Mapped[int | None] = mapped_column(Integer, nullable=True, info=engine())
    gpus: Mapped[int] = mapped_column(Integer, info=engine(None))  # total at the minimum size
    tasks_per_node: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # host resources, as sbatch's --mem (per node), --mem-per-gpu and --cpus-per-task ask them
    mem_mib: Mapped[int | None] = mapped_column(Integer, nullable=True)
    mem_per_gpu_mib: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cpus_per_task: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the pids limit per node its latest attempt was launched with (migration 0012): the
    # configuration's, not the job's to ask (control/loop/attempt_start.py); None before its first launch
    pids_max: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_mem_mib: Mapped[int | None] = mapped_column(Integer, nullable=True, info=engine())
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True, info=engine("est_runtime_s"))
    # what the user's past jobs of the same name ran (migration 0016, services/learned_runtimes.py), at
    # most the limit, set at submission: only the start estimates read it (sched/estimate.py)
    expected_runtime_s: Mapped[float | None] = mapped_column(Float, nullable=True, info=engine())
    checkpoint_interval_s: Mapped[float | None] = mapped_column(Float, nullable=True, info=engine())
    # --signal: `[B:]NAME@secs` (spec/signals.py), and the attempt it was last sent to (once per attempt)
    notice_signal: Mapped[str | None] = mapped_column(String, nullable=True)
    notice_sent_attempt: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # where it may run (migration 0011): -C/--constraint on node features, the GPU model of
    # --gpus=TYPE:N, -w/--nodelist and -x/--exclude (node names), --exclusive (whole nodes), -n/--ntasks
    # (the engine reads them as one `JobRequest.where`, made by `control.loop.snapshot.request_of`)
    constraint: Mapped[str | None] = mapped_column(Text, nullable=True, info=engine(None))
    gpu_model: Mapped[str | None] = mapped_column(String(100), nullable=True, info=engine(None))
    nodelist: Mapped[list[str] | None] = mapped_column(JSON, nullable=True, info=engine(None))
    exclude_nodes: Mapped[list[str] | None] = mapped_column(JSON, nullable=True, info=engine(None))
    exclusive: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false(), info=engine(None))
    ntasks: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # --reservation: the admin reservation it runs in (sched/reservations.py)
    reservation: Mapped[str | None] = mapped_column(String(100), nullable=True, info=engine())
    # --mail-type / --mail-user: what the cluster's webhook reports of this job
    mail_type: Mapped[str | None] = mapped_column(String(200), nullable=True)
    mail_user: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # -e/--error (stderr apart from --output) and --open-mode (append|truncate)
    error: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    open_mode: Mapped[str | None] = mapped_column(String(10), nullable=True)
    # its environment image (migration 0013): `spec.container.ContainerOptions.to_record()` (None:
    # a bare job), and the manifest digest its first attempt pinned (`sha256:` + 64 hex digits),
    # which every later attempt runs
    container: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # an interactive allocation (migration 0014, issue 38): {"kind": "alloc" | "srun" | "notebook", …;
    # "exit": its session's exit code once the session ended it}; None: a batch job
    interactive: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    image_digest: Mapped[str | None] = mapped_column(String(71), nullable=True)
    # its datasets (migration 0017, issue 41), pinned at submit: [{"name", "version", "checksum",
    # "source", "bytes", "reader"}, …] in the order asked (`services/datasets.py`); None: none
    datasets: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)

    # history the scheduler weighs
    submit_time: Mapped[float] = mapped_column(Float, info=engine(None))
    queued_since: Mapped[float] = mapped_column(Float, info=engine(None))
    attempt: Mapped[int] = mapped_column(Integer, default=0, info=engine(None))
    progress_s: Mapped[float] = mapped_column(Float, default=0.0, info=engine(None))
    attained_gpu_s: Mapped[float] = mapped_column(Float, default=0.0, info=engine(None))
    est_start: Mapped[float | None] = mapped_column(Float, nullable=True)

    # the current (or last) attempt
    start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    end_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    placement: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    last_checkpoint: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    signal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # the newest report of the in-job runtime (step, last checkpoint, metrics), if it sends any
    progress: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    # automatic retries after failures (their budget is the class's `max_retries`)
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    retry_after: Mapped[float | None] = mapped_column(Float, nullable=True)  # backoff: not scheduled before
    lost_gpu_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")  # work thrown away, in total
    # nodes its failures pointed at (a hung or crashed rank's node): placed elsewhere when it can be
    avoid_nodes: Mapped[list[str] | None] = mapped_column(JSON, nullable=True, info=engine(None))
    # `--dependency` as stored (services/dependencies.py), and whether the job still waits on it
    dependency: Mapped[str | None] = mapped_column(Text, nullable=True)
    dependency_pending: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Slurm's EligibleTime: when it last became free to run (submitted, begin time reached,
    # dependency met, released).
    # The scheduler counts a job's wait against its class's max_wait from here, not from its
    # submission: a day spent waiting on another job, or held, is no reason to jump the queue.
    # None: not yet eligible, or a row from before this column (which counts from submit_time).
    eligible_time: Mapped[float | None] = mapped_column(Float, nullable=True, info=engine(None))
    # `--begin`: not scheduled before this time (reason BeginTime until then)
    begin_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    # a task of a job array (services/arrays.py): the array's id (its first task's), the task's
    # index, and the array's `%N` throttle
    array_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    array_task_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_throttle: Mapped[int | None] = mapped_column(Integer, nullable=True)

    # a stop in progress: why (preempt, cancel, timeout, requeue, node) and since when
    stop_kind: Mapped[str | None] = mapped_column(String(20), nullable=True)
    stop_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    stop_stage: Mapped[int] = mapped_column(Integer, default=0)  # 0 none, 1 notice, 2 SIGTERM, 3 SIGKILL

    __table_args__ = (Index("ix_jobs_state_id", "state", "id"),
                      Index("ix_jobs_user_state", "user", "state"),  # a user's live jobs (max_submit_jobs)
                      # a user's newest completed jobs of a name, the learned run time at each submission
                      # (services/learned_runtimes.py): 0.02 ms against 53 ms off ix_jobs_user_state for a
                      # user with 200,000 completed jobs
                      Index("ix_jobs_user_name_state_end", "user", "name", "state", "end_time"),
                      # accounting windows: the jobs ended in a period, counted off the index alone
                      Index("ix_jobs_end_time_acct", "end_time", "team", "user", "pool", "state"))


# Derived from the `engine()` marks above, in column order: what the engine reads of a job, and the
# columns it takes as they are, by JobRequest field.
ENGINE_COLUMNS: tuple[str, ...] = tuple(c.name for c in JobRow.__table__.columns if "engine" in c.info)
REQUEST_FIELDS: dict[str, str] = {c.name: c.info["engine"] or c.name for c in JobRow.__table__.columns
                                  if c.info.get("engine") is not None}


class AttemptRow(Base):
    __tablename__ = "attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    placement: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(20))
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    signal: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(String(200), default="")
    cause: Mapped[str] = mapped_column(String(20), default="", server_default="")  # outcome.CAUSES
    lost_gpu_s: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")  # since the last checkpoint
    first_step_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # the runtime's first report of a step
    # GPUs its placement holds (one per GPU index, as the loop counts them): the accounting sums
    # GPU-seconds in SQL without decoding every placement
    gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # the highest memory the in-job runtime reported for this attempt (its progress metrics), if any
    max_rss_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    peak_gpu_mem_mib: Mapped[float | None] = mapped_column(Float, nullable=True)
    # the image digest this attempt ran (None: a bare job; migration 0013)
    image_digest: Mapped[str | None] = mapped_column(String(71), nullable=True)
    # the goodput ledger (migration 0015, issue 39): {bucket: GPU-seconds} over contracts.LEDGER_BUCKETS,
    # adding up to gpus x (ended_at - started_at); set when the attempt ends (a running one is split live)
    ledger: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)
    # when the plane first saw output from the attempt (a rank's log grew): the end of a bare job's startup
    first_output_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    # per-GPU telemetry summed up: {"<node>/<gpu>": {"util_mean", "util_peak", "mem_peak_mib", "samples"}}
    gpu_summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    __table_args__ = (Index("ix_attempts_started_at", "started_at"), Index("ix_attempts_ended_at", "ended_at"))


class EventRow(Base):
    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    time: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(100))  # a user name, or "scheduler" / "backend"
    kind: Mapped[str] = mapped_column(String(50))  # e.g. job.submitted, job.state, node.drained
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True, index=True)
    node: Mapped[str | None] = mapped_column(String(100), nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")  # the why, for people
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    __table_args__ = (Index("ix_events_kind_time", "kind", "time"),)


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    state: Mapped[str] = mapped_column(String(20), default="up")  # up | drain | down
    reason: Mapped[str] = mapped_column(String(200), default="")
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)
    updated_by: Mapped[str] = mapped_column(String(100), default="")
    # flagged as a straggler in unrelated jobs (migration 0015, issue 39): no new work until its
    # speed check passes; None when not suspect
    suspect_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    suspect_reason: Mapped[str] = mapped_column(String(200), default="", server_default="")


class GpuSampleRow(Base):
    """Per-GPU telemetry of the jobs (issue 39), a bounded time series per job: the node agent's
    samples averaged over a flush period, one row per GPU per period."""

    __tablename__ = "gpu_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    node: Mapped[str] = mapped_column(String(100))
    gpu: Mapped[int] = mapped_column(Integer)  # the GPU's index on its node
    time: Mapped[float] = mapped_column(Float)  # the end of the period
    period_s: Mapped[float] = mapped_column(Float)
    util: Mapped[float] = mapped_column(Float)  # percent, mean over the period
    util_peak: Mapped[float] = mapped_column(Float)
    mem_mib: Mapped[float] = mapped_column(Float)  # the highest in the period
    power_w: Mapped[float | None] = mapped_column(Float, nullable=True)
    temp_c: Mapped[float | None] = mapped_column(Float, nullable=True)
    source: Mapped[str] = mapped_column(String(20), default="nvml")  # nvml | emulated | nvidia-smi

    __table_args__ = (Index("ix_gpu_samples_job_time", "job_id", "time"),)


class StartEstimateRow(Base):
    """A waiting job's estimated start, recorded when it changed (services/estimates.py): per
    pending spell (`attempt`: the attempt the job waits to start as), the first and the latest
    `estimates.KEPT` - 1 changes are kept."""

    __tablename__ = "start_estimates"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)  # when the loop made it
    est_start: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_start_estimates_job", "job_id", "attempt", "id"),)


class EstimateOutcomeRow(Base):
    """An attempt that started after being given an estimated start: the first estimate (what the
    user was told when the wait began: THE error, `error_s`), the last one, and when it started.
    Errors are actual − estimate: positive when it started late."""

    __tablename__ = "estimate_outcomes"

    job_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_class: Mapped[str] = mapped_column(String(100))
    team: Mapped[str] = mapped_column(String(100))
    user: Mapped[str] = mapped_column(String(100))
    queued_since: Mapped[float] = mapped_column(Float)  # the wait's start (submission or requeue)
    first_at: Mapped[float] = mapped_column(Float)
    first_estimate: Mapped[float] = mapped_column(Float)
    last_at: Mapped[float] = mapped_column(Float)
    last_estimate: Mapped[float] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)
    error_s: Mapped[float] = mapped_column(Float)  # started_at - first_estimate
    last_error_s: Mapped[float] = mapped_column(Float)  # started_at - last_estimate
    changes: Mapped[int] = mapped_column(Integer)  # estimates kept for the spell (at most `estimates.KEPT`)

    __table_args__ = (Index("ix_estimate_outcomes_started_at", "started_at"),)


class ConfigVersionRow(Base):
    __tablename__ = "config_versions"

    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    author: Mapped[str] = mapped_column(String(100))
    created_at: Mapped[float] = mapped_column(Float)
    message: Mapped[str] = mapped_column(String(500), default="")


class TokenRow(Base):
    __tablename__ = "tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user: Mapped[str] = mapped_column(String(100))
    role: Mapped[str] = mapped_column(String(20))  # admin | operator | member | viewer | job
    team: Mapped[str | None] = mapped_column(String(100), nullable=True)
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # job-scoped tokens
    created_at: Mapped[float] = mapped_column(Float)
    created_by: Mapped[str] = mapped_column(String(100), default="")
    last_used_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # `yard token list` shows it
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class StoreMetaRow(Base):
    """One fact about the store itself, by key (`store/identity.py`)."""

    __tablename__ = "store_meta"

    key: Mapped[str] = mapped_column(String(50), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class UsageCarryRow(Base):
    """A Prometheus sample's share from rows that retention purged: `name` is the sample's name,
    `labels` its labels as sorted JSON. The metrics add it to what the rows left give."""

    __tablename__ = "usage_carry"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    labels: Mapped[str] = mapped_column(String(500), primary_key=True)
    value: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class DatasetRow(Base):
    """A dataset version a member added (`yard dataset add`; migration 0017). The configuration's
    `datasets:` are the operator's and are not stored here; `services/datasets.py` reads both."""

    __tablename__ = "datasets"
    __table_args__ = (Index("ux_datasets_name_version", "name", "version", unique=True),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(63))
    version: Mapped[str] = mapped_column(String(64))
    team: Mapped[str] = mapped_column(String(100))
    source: Mapped[str] = mapped_column(Text)
    checksum: Mapped[str] = mapped_column(String(71))
    bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[int] = mapped_column(Integer)
    grants: Mapped[list[str]] = mapped_column(JSON, default=list)
    description: Mapped[str] = mapped_column(Text, default="")
    added_by: Mapped[str] = mapped_column(String(100))
    added_at: Mapped[float] = mapped_column(Float)
    # who a path source is read as (`staging.types.Reader`): {"uid", "gid", "groups"}; None: an s3:// source
    reader: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class NodeDatasetRow(Base):
    """What the plane knows of a node's dataset cache (migration 0017): written when a staging
    ends and when an entry is evicted or removed; the schedule step's tie-break and `yard dataset
    ls --node` read it. The node's cache itself is the truth (`staging/cache.py`)."""

    __tablename__ = "node_datasets"

    node: Mapped[str] = mapped_column(String(100), primary_key=True)
    checksum: Mapped[str] = mapped_column(String(71), primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    version: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(BigInteger)
    staged_at: Mapped[float] = mapped_column(Float)
    last_used_at: Mapped[float] = mapped_column(Float)


class CheckpointCopyRow(Base):
    """A committed checkpoint of a job in one tier (migration 0017): `fast` (the job dir's
    `checkpoints/step-N`, as the plane last saw it) or `archive` (a verified copy at `location`).
    The archiver and the lifecycle rules keep it (issue 41); `yard storage` and a resume read it."""

    __tablename__ = "checkpoint_copies"

    job_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    tier: Mapped[str] = mapped_column(String(10), primary_key=True)  # fast | archive
    bytes: Mapped[int] = mapped_column(BigInteger)
    files: Mapped[int] = mapped_column(Integer)
    at: Mapped[float] = mapped_column(Float)  # when it was recorded (committed, or archived and verified)
    location: Mapped[str] = mapped_column(Text, default="")
    metrics: Mapped[dict[str, float] | None] = mapped_column(JSON, nullable=True)  # the manifest's, for keep_best


class CheckpointKeepRow(Base):
    """A checkpoint marked `keep` (`yard checkpoints keep JOB STEP`): it stays in the fast tier and
    no rule deletes it (migration 0017)."""

    __tablename__ = "checkpoint_keeps"

    job_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    by: Mapped[str] = mapped_column(String(100))
    at: Mapped[float] = mapped_column(Float)
