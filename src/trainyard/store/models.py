"""The control plane's tables (SQLAlchemy 2.0 declarative). The store is the truth (DESIGN rule 3).

What lives where:
- `jobs`: one row per job, its request and its current state (Slurm's names, with a reason);
- `attempts`: one row per start of a job (a requeue starts a new attempt), with placement and exit;
- `events`: the audit trail — every state change, who did it, when and why;
- `nodes`: runtime state of the nodes (drained, down) — their shape comes from the configuration;
- `config_versions`: the cluster configuration (nodes, teams and quotas, classes) as versioned
  YAML; the newest row is in force, older ones allow diff and rollback;
- `tokens`: API tokens (only a SHA-256 hash is kept) with the role and team they grant.

Times are UNIX seconds (floats) so that the engine, which takes time as a number, reads them
without conversion. Schema changes go through Alembic (`store/migrations`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


def engine(request_field: str | None = "") -> dict[str, Any]:
    """Column `info` of a job field the scheduling engine reads: the one declaration that the
    schedule step's query (`control.schedule.PENDING_COLUMNS`), the snapshot (`control.snapshot`)
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
    gpu_mem_mib: Mapped[int | None] = mapped_column(Integer, nullable=True, info=engine())
    time_limit_s: Mapped[float | None] = mapped_column(Float, nullable=True, info=engine("est_runtime_s"))
    checkpoint_interval_s: Mapped[float | None] = mapped_column(Float, nullable=True, info=engine())

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

    __table_args__ = (Index("ix_jobs_state_id", "state", "id"),)


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


class NodeRow(Base):
    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    state: Mapped[str] = mapped_column(String(20), default="up")  # up | drain | down
    reason: Mapped[str] = mapped_column(String(200), default="")
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)
    updated_by: Mapped[str] = mapped_column(String(100), default="")


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
