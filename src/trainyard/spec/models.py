"""The user-facing configuration: cluster, teams and quotas, job classes, jobs (pydantic v2).

Loaded from YAML by `load_config`/`load_jobs`; every error names the file, the line and the field
(`ConfigError`). Durations accept seconds or strings like `90s`, `30m`, `2h`, `1d`, `1-12:00:00`
(Slurm's D-HH:MM:SS). The scheduler never sees these models: `to_sched()` converts them once into
the slotted dataclasses of `trainyard.sched.types`.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from types import GenericAlias, UnionType
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import yaml
from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, create_model,
                      field_validator, model_validator)
from pydantic_core import PydanticCustomError

from trainyard.spec import bounds as B
from trainyard.spec.parsing import ConfigError, parse_duration, parse_node_range  # noqa: F401 (re-exported)
from trainyard.spec.telemetry import TelemetrySpec
from trainyard.sched.cluster import Node, gb_to_mib
from trainyard.sched.policy import (
    Param, Policy, flat_aliases, get_policy, nest_flat, policy_names, policy_params, resolved_params,
)
from trainyard.sched.types import ALL_CLASSES, AdminReservation, JobClass, JobId, JobRequest, Quota, Team
from trainyard.spec.datasets import MAX_DATASETS, MAX_OBJECT_STORES, DatasetCacheSpec, DatasetSpec, ObjectStoreSpec
from trainyard.spec.idle import IdleSpec
from trainyard.spec.lifecycle import ArchiveSpec, LifecycleSpec
from trainyard.spec.images import ImagesSpec
from trainyard.spec.interactive import InteractiveSpec
from trainyard.spec.limits import LimitsSpec
from trainyard.spec.stragglers import StragglersSpec


# Every duration is bounded (bounds: ten years): `inf` or a typo of many zeros is an error.
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0, le=B.MAX_DURATION_S)]
# `null` in YAML (None) is "unset": the bounds apply to a number only (a bound on None is pydantic's error).
OptDuration = Annotated[Annotated[float, Field(ge=0, le=B.MAX_DURATION_S)] | None, BeforeValidator(parse_duration)]
Name = Annotated[str, Field(min_length=1, max_length=B.MAX_NAME)]
# A job's pids limit per node (cgroup pids.max; docs/control-plane.md "Containment"): unset, the
# team's, else the class's, else DEFAULT_PIDS_MAX (`ConfigSpec.pids_max_for`).
PidsMax = Annotated[int | None, Field(ge=B.MIN_PIDS_MAX, le=B.MAX_PIDS_MAX, strict=True)]
# 4096 tasks per node: a DDP job of 8 ranks with 8 DataLoader workers each, every process with its
# CUDA, NCCL and OpenMP threads (threads count as tasks), uses some hundreds to 2,000; a fork bomb
# reaches it in milliseconds and goes no further.
DEFAULT_PIDS_MAX = 4096
# A Unix user or group name as useradd/groupadd take them (and LDAP's, with dots and @).
UnixName = Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.@-]*\$?$")]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class NodeSpec(_Model):
    """A node, or `count` identical nodes named `name-0`, `name-1`, …"""

    name: Name
    count: int = Field(1, ge=1, le=B.MAX_NODES)
    gpus: int = Field(ge=1, le=B.MAX_GPUS_PER_NODE)
    gpu_model: str = Field("gpu", max_length=B.MAX_NAME)  # what --gpus=TYPE:N / --gres=gpu:TYPE:N ask for
    gpu_mem_gb: float = Field(80.0, gt=0, le=B.MAX_GPU_MEM_GB)
    pool: Name = "default"
    block: str = Field("", max_length=B.MAX_NAME)
    rack: str = Field("", max_length=B.MAX_NAME)
    # what -C/--constraint asks for (Slurm's node features): names, as `sched/constraints.py` reads them
    features: list[Annotated[str, Field(max_length=B.MAX_NAME, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.=:+-]*$")]] = Field(
        default_factory=list, max_length=100)


class PoolSpec(_Model):
    """A pool (Slurm's partition) of the nodes that name it, with other names `-p` may give it
    (`aliases: [train, gpu]`: a site's partition names, so published scripts' `-p` work unchanged)."""

    name: Name
    aliases: list[Name] = Field(default_factory=list, max_length=100)


class ClusterSpec(_Model):
    name: str = Field("cluster", max_length=B.MAX_NAME)
    nodes: list[NodeSpec] = Field(min_length=1, max_length=B.MAX_NODES)
    pools: list[PoolSpec] = Field(default_factory=list, max_length=1000)  # aliases of the nodes' pools

    def pool_names(self) -> dict[str, str]:
        """Every name `-p` may give → the pool it means: each pool's own name, and its aliases."""
        out = {n.pool: n.pool for n in self.nodes}
        for p in self.pools:
            out.update({a: p.name for a in p.aliases})
        return out

    @model_validator(mode="after")
    def _pool_aliases(self) -> "ClusterSpec":
        real = {n.pool for n in self.nodes}
        seen: dict[str, str] = {}
        for i, p in enumerate(self.pools):
            if p.name not in real:
                raise ValueError(f"pools[{i}]: no node is in pool {p.name!r}; pools are {sorted(real)}")
            for a in p.aliases:
                if a in real or seen.get(a, p.name) != p.name:
                    raise ValueError(f"pools[{i}] ({p.name}): alias {a!r} already names pool "
                                     f"{a if a in real else seen[a]!r}")
                seen[a] = p.name
        return self

    def expand(self) -> list[Node]:
        """The engine's nodes. `gpu_mem_gb` is converted to MiB here, once: the engine counts MiB."""
        out: list[Node] = []
        for ns in self.nodes:
            names = [ns.name] if ns.count == 1 else [f"{ns.name}-{i}" for i in range(ns.count)]
            mib = gb_to_mib(ns.gpu_mem_gb)
            feats = frozenset(ns.features)
            out += [Node(nm, ns.gpus, mib, ns.pool, ns.gpu_model, ns.block, ns.rack, features=feats) for nm in names]
        return out

    @model_validator(mode="after")
    def _unique_names(self) -> "ClusterSpec":
        total = sum(ns.count for ns in self.nodes)  # before expanding them: a typo must not build millions
        if total > B.MAX_NODES:
            raise ValueError(f"{total} nodes in all; a configuration holds at most {B.MAX_NODES}")
        seen: set[str] = set()
        for n in self.expand():
            if n.name in seen:
                raise ValueError(f"node name {n.name!r} appears twice")
            seen.add(n.name)
        return self


class QuotaSpec(_Model):
    nominal: int = Field(ge=0, le=B.MAX_QUOTA_GPUS)
    borrowing_limit: int | None = Field(None, ge=0, le=B.MAX_QUOTA_GPUS)
    lending_limit: int | None = Field(None, ge=0, le=B.MAX_QUOTA_GPUS)


class TeamStorageSpec(_Model):
    """A team's own `storage:`: the most its job dirs may hold, in GB (2^30 bytes, as GB counts
    everywhere in the configuration, and as `du -h` and `lfs setquota` count); unset, the cluster's
    `storage.quota_gb` (`StorageSpec`)."""

    quota_gb: float | None = Field(None, gt=0, le=B.MAX_STORAGE_GB)
    lifecycle: LifecycleSpec | None = None  # its rules, over the class's and the cluster's (spec/lifecycle.py)


class TeamSpec(_Model):
    """A team. `group`: the Unix group its job directories belong to (the team reads its jobs' logs
    and checkpoints through it); unset, the group of the team's name where one exists. The group
    must exist where the control plane runs (checked when the configuration is applied,
    `services/owners.py`); its members are the operating system's business, not trainyard's."""

    name: Name
    cohort: str | None = Field(None, max_length=B.MAX_NAME)
    quotas: dict[str, QuotaSpec] = Field(default_factory=dict)
    group: UnixName | None = None
    # Least-attained-service within the team's own quota (docs/scheduler.md, step 5c): its short
    # or young jobs may take GPUs from its own long-running ones. false (off), true (every
    # class) or the list of classes it applies to.
    las: bool | list[str] = False
    storage: TeamStorageSpec = Field(default_factory=TeamStorageSpec)  # its disk quota (StorageSpec)
    pids_max: PidsMax = None  # its jobs' pids limit per node, over the class's (None: the class's)

    def las_classes(self) -> frozenset[str]:
        if self.las is True:
            return frozenset({ALL_CLASSES})
        return frozenset(self.las or ())


class JobClassSpec(_Model):
    name: Name
    priority: int = Field(ge=-B.MAX_PRIORITY, le=B.MAX_PRIORITY)
    preemptible: bool = True
    max_wait: Duration = 86400.0
    min_run_time: Duration = 0.0
    max_run_time: OptDuration = None
    grace_period: Duration = 60.0
    checkpoint_on_notice: bool = True  # its jobs checkpoint on a preemption notice (the runtime does)
    max_retries: int = Field(3, ge=0, le=100)  # automatic retries after a node loss, a hang or a crash
    pids_max: PidsMax = None  # its jobs' processes and threads per node (None: DEFAULT_PIDS_MAX)
    # Exit codes that retry an attempt, within max_retries (Slurm's RequeueExit): a job that does
    # not use the runtime is otherwise told by its exit code and never retried (control/rules/outcome.py).
    requeue_exit: list[Annotated[int, Field(ge=1, le=255)]] = Field(default_factory=list, max_length=255)
    # An interactive allocation idle this long ends (IdleTimeout; spec/interactive.py says what idle is):
    # issue 38's form of `idle: {after: X, action: cancel}` for allocations only (spec/idle.py)
    idle_timeout: OptDuration = None
    # What happens to a job of the class that holds GPUs and does nothing (spec/idle.py)
    idle: IdleSpec | None = None
    # What is kept of its jobs' checkpoints, logs and dirs, under the team's rules (spec/lifecycle.py)
    lifecycle: LifecycleSpec | None = None
    description: str = ""

    @model_validator(mode="after")
    def _one_idle_form(self) -> "JobClassSpec":
        if self.idle is not None and self.idle_timeout is not None:
            raise ValueError(f"class {self.name!r}: give idle (or its old form idle_timeout), not both")
        return self


# `dcgmi diag -r N` takes seconds (1), minutes (2), about half an hour (3), an hour or two (4):
# a check's default time-out follows its level.
DCGM_TIMEOUTS = {1: 300.0, 2: 1200.0, 3: 3600.0, 4: 10800.0}


# A speed check on 8 GPUs starts 8 processes that each import torch and join NCCL before measuring.
SPEED_TIMEOUT = 120.0


class SpeedBaseline(_Model):
    """What one GPU model (or `cpu`) should reach: matmul TFLOP/s per GPU, all-reduce bus GB/s."""

    tflops: float = Field(gt=0, le=1e6, allow_inf_nan=False)
    busbw_gbps: float | None = Field(None, gt=0, le=1e6, allow_inf_nan=False)  # None: not judged


class SpeedSpec(_Model):
    """The `speed` check's settings (control/health/speed.py): baselines by GPU model (`cpu` for
    the CPU path), the fraction of them a node must reach, and the sizes measured (None: the
    device's default, a large one on GPUs, a small one on the CPU)."""

    baselines: dict[Annotated[str, Field(min_length=1, max_length=B.MAX_NAME)], SpeedBaseline] = Field(
        min_length=1, max_length=1000)
    min_fraction: float = Field(0.8, gt=0, le=1, allow_inf_nan=False)
    device: Literal["auto", "cuda", "cpu"] = "auto"  # auto: the GPUs when torch sees any, else the CPU
    matmul_n: int | None = Field(None, ge=16, le=32768)  # square matrices of this side
    allreduce_mib: float | None = Field(None, gt=0, le=16384, allow_inf_nan=False)
    iters: int = Field(10, ge=1, le=10000)  # timed repetitions of each (after one warm-up)
    cpu_ranks: int = Field(2, ge=1, le=16)  # the CPU path's all-reduce processes (its "GPUs")


class CheckSpec(_Model):
    """One node health check (LBNL NHC style): an executable, or a built-in kind.

    - `command`: run with TRAINYARD_NODE, TRAINYARD_DATA_DIR and TRAINYARD_CHECK_CONTEXT
      (`periodic` or `before_work`) set; exit 0 OK, 1 WARN,
      2 CRITICAL (anything else, or a time-out, counts as CRITICAL); its first output line is
      the message.
    - `disk`: free space under each of `paths` (`{node}` and `{data_dir}` are filled in):
      below `critical_free_gb` CRITICAL, below `warn_free_gb` WARN.
    - `nvml`: the node's GPUs (when NVML is present): uncorrectable ECC errors, retired pages or
      row remappings pending, a failed remapping, a GPU NVML cannot reach, or a hardware XID
      event → CRITICAL; temperature at or above `max_temp_c`, or an XID of unknown weight → WARN.
    - `dcgm`: `dcgmi diag -r <level> -j` when `dcgmi` is installed (OK "dcgmi not installed"
      otherwise): a failed test → CRITICAL (WARN when DCGM rates it a configuration or
      monitor-only finding), a warning → WARN; dcgmi that gives no result → WARN.
    - `speed`: a timed matmul on each GPU (TFLOP/s) and an all-reduce across them (bus GB/s), with
      torch, against `speed.baselines[<the node's gpu_model>]` (`cpu` on the CPU path): below
      `speed.min_fraction` of it CRITICAL, no baseline for the model WARN.

    `when: before_work` keeps a check out of the periodic rounds: it runs only in the round a
    node gets before it takes new work (for invasive diagnostics such as `dcgmi diag -r 2`, which
    should not run beside a training job).
    """

    name: str = Field(min_length=1, max_length=100)
    kind: Literal["command", "disk", "nvml", "dcgm", "speed"] = "command"
    when: Literal["always", "before_work"] = "always"
    command: list[str] | None = None
    paths: list[str] = Field(default_factory=lambda: ["{data_dir}"], max_length=B.MAX_CHECKS)
    warn_free_gb: float = Field(5.0, ge=0, allow_inf_nan=False)
    critical_free_gb: float = Field(1.0, ge=0, allow_inf_nan=False)
    max_temp_c: float = Field(90.0, gt=0, le=1000)
    level: int = Field(1, ge=1, le=4)  # dcgm: the `dcgmi diag -r` level
    timeout: Duration = Field(30.0, gt=0)  # dcgm: DCGM_TIMEOUTS[level], speed: SPEED_TIMEOUT unless set
    speed: SpeedSpec | None = None  # kind speed's settings, and only its

    @model_validator(mode="after")
    def _shape(self) -> "CheckSpec":
        if self.kind == "command" and not self.command:
            raise ValueError(f"check {self.name!r}: kind command needs `command` (an argv list)")
        if (self.kind == "speed") != (self.speed is not None):
            raise ValueError(f"check {self.name!r}: kind speed needs `speed` (its baselines)" if self.kind == "speed"
                             else f"check {self.name!r}: `speed` is for kind speed, not {self.kind}")
        if self.critical_free_gb > self.warn_free_gb:
            raise ValueError(f"check {self.name!r}: critical_free_gb must not exceed warn_free_gb")
        if self.kind == "dcgm" and "timeout" not in self.model_fields_set:
            self.timeout = DCGM_TIMEOUTS[self.level]
        if self.kind == "speed" and "timeout" not in self.model_fields_set:
            self.timeout = SPEED_TIMEOUT
        return self


class ActionSpec(_Model):
    """A remediation step (reboot, reimage, replace…): a command run with TRAINYARD_NODE set."""

    name: str = Field(min_length=1, max_length=100)
    command: list[str] = Field(min_length=1)
    timeout: Duration = 600.0


class RemediationSpec(_Model):
    """What to do with a node its checks took out of service: run `actions` in order, then
    check again; again after `cooldown` if it still fails; after `max_attempts`, leave it down
    and alert a person."""

    actions: list[ActionSpec] = Field(default_factory=list, max_length=B.MAX_CHECKS)
    cooldown: Duration = 600.0
    max_attempts: int = Field(3, ge=1, le=B.MAX_REMEDIATION_ATTEMPTS)


class HealthSpec(_Model):
    """Node health checks, run on every node every `interval`, and before a node takes new work
    when its newest round is older than `before_work_max_age` (or older than an operator's
    `resume`): such a node gets no new work until a fresh round, run in the background, passes.

    A WARN makes a node `suspect` (no new work; its jobs run on), CRITICAL takes it `down` (its
    jobs checkpoint and resume elsewhere) and, with `remediation.actions`, through `remediating`.
    """

    interval: Duration = Field(60.0, ge=B.MIN_HEALTH_INTERVAL_S)
    before_work_max_age: Duration = Field(300.0, gt=0)
    checks: list[CheckSpec] = Field(default_factory=list, max_length=B.MAX_CHECKS)
    remediation: RemediationSpec = Field(default_factory=RemediationSpec)

    @model_validator(mode="after")
    def _unique_checks(self) -> "HealthSpec":
        names = [c.name for c in self.checks]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"check names must be unique; {', '.join(map(repr, dup))} appears more than once")
        return self


# -- the scheduler: which policy runs, with which parameters ---------------------------------------

# Parameters that must be above zero, not merely not negative (every other one may be 0):
# Slurm's age factor divides by `max_age_s`.
_POSITIVE_PARAMS = {("slurm", "max_age_s")}


def _param_type(policy: str, path: str, p: Param) -> Any:
    """The pydantic type of one leaf parameter: its declared type, with the rules every built-in
    policy's parameters share: a number is finite and not negative (they are counts, weights,
    fractions and durations); a float named `*_s` is seconds and also takes '5m'-style strings."""
    bound = Field(gt=0, allow_inf_nan=False) if (policy, path) in _POSITIVE_PARAMS else Field(ge=0, allow_inf_nan=False)

    def leaf(tp: Any) -> Any:
        # Strict: YAML gives numbers as numbers, so `yes` is a mistake, not a 1.
        if tp is float and path.endswith("_s"):
            return Annotated[float, BeforeValidator(parse_duration), Field(strict=True), bound]
        if tp is float:
            return Annotated[float, BeforeValidator(_yaml_float), Field(strict=True), bound]
        if tp is int:
            return Annotated[int, Field(strict=True), bound]
        return tp

    origin, args = get_origin(p.type), get_args(p.type)
    if origin in (Union, UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        return Optional[leaf(inner)]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return GenericAlias(tuple, (leaf(args[0]), ...))  # tuple[leaf, ...], built at run time
    return leaf(p.type)


def _yaml_float(v: Any) -> Any:
    """PyYAML reads `1e4` (no dot) as a string, after YAML 1.1: take it as the number it says."""
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            pass
    return v


def _empty_is_default(v: Any) -> Any:
    return {} if v is None else v  # `ordering:` with every line under it commented out


def _group_model(policy: str, title: str, params: tuple[Param, ...], prefix: str = "") -> type[BaseModel]:
    fields: dict[str, Any] = {}
    for p in params:
        if p.group is not None:
            sub = _group_model(policy, f"{title}.{p.name}", p.group, f"{prefix}{p.name}.")
            fields[p.name] = (Annotated[sub, BeforeValidator(_empty_is_default)], Field(default_factory=sub))
        else:
            fields[p.name] = (_param_type(policy, prefix + p.name, p), p.default)
    return create_model(title, __config__=ConfigDict(extra="forbid"), **fields)


@functools.lru_cache(maxsize=None)
def _params_model(policy: str) -> type[BaseModel]:
    """A pydantic model of `policy`'s parameters, built from what the policy declares
    (`trainyard.sched.policy.policy_params`): the scheduler package stays free of pydantic, and a
    parameter added to `EngineParams` is configurable and validated with no edit here. The flat
    names a policy still reads (`policy.flat_aliases`: `share_below_gpu_s` for `share.below_gpu_s`)
    are fields too, typed as their nested twins, so that a value given the old way is checked and
    its error names the key as written."""
    declared = policy_params(policy)
    groups = {p.name: {q.name: q for q in p.group or ()} for p in declared}
    old = tuple(Param(name, groups[g][f].type, groups[g][f].default) for name, (g, f) in flat_aliases(policy).items())
    return _group_model(policy, f"{policy} parameters", declared + old)


def _known_params(model: type[BaseModel], loc: tuple[Any, ...], policy: str) -> list[str]:
    if len(loc) == 1:  # the top level: the groups, not the flat names of before
        return [p.name for p in policy_params(policy)]
    for key in loc[:-1]:
        ann = model.model_fields[key].annotation if key in model.model_fields else None
        ann = get_args(ann)[0] if get_origin(ann) is Annotated else ann
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


class SchedulerSpec(_Model):
    """Which scheduling policy the cluster runs, and its parameters (`trainyard.sched.policy`).

    `policy` is a registered name (`trainyard`, the default, or a baseline); `params` are that
    policy's parameters by name, a nested group as a mapping (`ordering:` for `OrderingParams`,
    `share:` for `ShareParams`, ...). The flat names of before the groups (`share_below_gpu_s`)
    are still read, kept as given here and moved into their groups when the policy is built;
    `deprecations()` says what to write instead.
    Unset parameters keep their defaults: a section that gives none, or no section at all, runs
    exactly `get_policy(policy)`, the policy every simulator report was measured with. Validated
    against what the policy declares: an unknown name, a parameter it does not take, or a value
    of the wrong type or range is an error naming `scheduler.params.<path>` and its line.
    """

    policy: str = "trainyard"
    params: Annotated[dict[str, Any], BeforeValidator(_empty_is_default)] = Field(default_factory=dict)

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        names = policy_names()
        if v not in names:
            raise ValueError(f"unknown policy {v!r}; known: {', '.join(names)}")
        return v

    @field_validator("params")
    @classmethod
    def _valid_params(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        policy = info.data.get("policy")
        if policy is None:
            return v  # the policy's own error is the one to report
        model = _params_model(policy)
        try:
            parsed = model.model_validate(v)
        except ValidationError as e:
            # Re-raised with the locations pydantic gave (below `params`), so that the error
            # names the nested field and its YAML line; unknown names get a message that lists
            # the known ones, as a typo needs.
            errors: list[Any] = []
            for err in e.errors():
                if err["type"] == "extra_forbidden":
                    known = _known_params(model, err["loc"], policy)
                    msg = (f"policy {policy!r} takes no parameters" if not model.model_fields else
                           f"policy {policy!r} has no parameter {'.'.join(map(str, err['loc']))!r}; "
                           f"known: {', '.join(known)}")
                    errors.append({"type": PydanticCustomError("unknown_parameter", msg),  # no context: used as is
                                   "loc": err["loc"], "input": err["input"]})
                elif err["type"] == "model_type":  # a group given as a scalar or a list
                    known = _known_params(model, (*err["loc"], None), policy)
                    errors.append({"type": PydanticCustomError("group_expected", f"a group of parameters: give a "
                                                               f"mapping of {', '.join(known)}"),
                                   "loc": err["loc"], "input": err["input"]})
                else:
                    errors.append(err)
            raise ValidationError.from_exception_data(e.title, errors) from None
        given: dict[str, Any] = parsed.model_dump(exclude_unset=True)
        nest_flat(given, flat_aliases(policy))  # a value given both ways is an error (ValueError)
        return given

    def deprecations(self) -> list[str]:
        """A warning per parameter given by its flat name of before issue 36 (still read): what to
        write instead. `yard cluster apply` prints them (the API's `warnings`)."""
        aliases = flat_aliases(self.policy)
        return [f"scheduler.params.{name} is deprecated; write it in its group: "
                f"{aliases[name][0]}: {{{aliases[name][1]}: ...}}" for name in self.params if name in aliases]

    def build(self) -> Policy:
        """A new policy object as configured. A policy holds no state between cycles, so one
        object per configuration version serves every pass (`ConfigVersion.policy`)."""
        return get_policy(self.policy, self.params)

    def resolved(self) -> dict[str, Any]:
        """Every parameter of the policy with the value it runs with (defaults filled in)."""
        return resolved_params(self.policy, self.params)


class RetentionSpec(_Model):
    """How long finished jobs are kept (services/retention.py); None keeps them for ever (the
    default, as slurmdbd's PurgeJobAfter). Purges run in batches of `batch` jobs every `interval`."""

    jobs: OptDuration = None  # a finished job's rows, attempts and events (audit events are kept)
    job_dirs: OptDuration = None  # its directory (logs, checkpoints, metrics); the accounting rows stay
    batch: int = Field(500, ge=1, le=10_000)
    interval: Duration = Field(600.0, gt=0)


class StorageSpec(_Model):
    """`storage:`, the disk job dirs take (control/lifecycle/storage.py; docs/control-plane.md, "Disk per
    team"). Every `interval` the plane measures each job dir (through no link, hard links once) and
    sums them per team; a team over its quota (`teams[].storage.quota_gb`, else `quota_gb` here;
    neither: none) gets no new attempt (reason StorageQuota) until it is under again, and its
    running jobs one warning event. While the data dir's file system, or that of `jobs/`, has less
    free than the reserve (the larger of `reserve_gb` and `reserve_percent` of its size, and the
    same share of its inodes), no new attempt starts at all (reason DiskReserve): what is left is
    the store's and the plane's."""

    quota_gb: float | None = Field(None, gt=0, le=B.MAX_STORAGE_GB)
    reserve_gb: float = Field(0.0, ge=0, le=B.MAX_STORAGE_GB)
    reserve_percent: float = Field(5.0, ge=0, le=50)  # ext4 keeps 5% for root; kubelet evicts under 10%
    interval: Duration = Field(300.0, ge=B.MIN_STORAGE_INTERVAL_S)
    # Issue 41 (spec/datasets.py, spec/lifecycle.py): the object stores the plane reads and writes,
    # each node's dataset cache, the checkpoints' archive tier and the cluster's lifecycle rules.
    object_stores: list[ObjectStoreSpec] = Field(default_factory=list, max_length=MAX_OBJECT_STORES)
    dataset_cache: DatasetCacheSpec = Field(default_factory=DatasetCacheSpec)
    archive: ArchiveSpec | None = None
    lifecycle: LifecycleSpec = Field(default_factory=LifecycleSpec)

    def quota_bytes(self, team: TeamSpec) -> int | None:
        """`team`'s quota in bytes (its own, else the cluster's), or None for no quota."""
        gb = team.storage.quota_gb if team.storage.quota_gb is not None else self.quota_gb
        return None if gb is None else int(gb * 2**30)

    def reserve_bytes(self, size: int) -> int:
        """The free space kept on a file system of `size` bytes."""
        return max(int(self.reserve_gb * 2**30), int(size * self.reserve_percent / 100))


class NotifySpec(_Model):
    """`notify:`, where the control plane reports what jobs asked for with `--mail-type`
    (`control/lifecycle/notify.py`): a JSON POST to `webhook` per event, in a thread of its own, each
    attempt bounded by `timeout_s`; a failed POST is tried `retries` more times, then dropped
    (logged and counted). `headers` go with every POST (say, an Authorization a receiver wants)."""

    webhook: str = Field(min_length=1, max_length=2000)
    timeout_s: float = Field(5.0, gt=0, le=60)
    retries: int = Field(2, ge=0, le=10)
    headers: dict[Annotated[str, Field(min_length=1, max_length=200)], Annotated[str, Field(max_length=4000)]] = \
        Field(default_factory=dict, max_length=50)

    @field_validator("webhook")
    @classmethod
    def _url(cls, v: str) -> str:
        from urllib.parse import urlsplit

        u = urlsplit(v.strip())
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"expected an http:// or https:// URL, got {v!r}")
        return v.strip()


def _instant(v: Any) -> Any:
    """A point in time: UNIX seconds, or ISO 8601 (`2026-12-02T10:00:00+00:00`; without a zone, this
    machine's), as a reservation's `start` is written (`services/reservations.py` writes UTC)."""
    import datetime as dt

    if isinstance(v, str):
        try:
            t = dt.datetime.fromisoformat(v.strip())
        except ValueError:
            raise PydanticCustomError("instant", "expected UNIX seconds or an ISO 8601 time, got {v}",
                                      {"v": repr(v)}) from None
        return (t if t.tzinfo else t.astimezone()).timestamp()
    if isinstance(v, dt.datetime):
        return v.timestamp()
    return v


def _hostlist(v: Any) -> Any:
    """Node names: a list, or Slurm's hostlist form (`node-[0-1],gpu-3`) expanded."""
    from trainyard.contracts import expand_hostlist

    if isinstance(v, str):
        try:
            names = expand_hostlist(v)
        except ValueError as e:
            raise PydanticCustomError("hostlist", "{e}", {"e": str(e)}) from None
        if not names:
            raise PydanticCustomError("hostlist", "no node named", {})
        return names
    return v


class ReservationSpec(_Model):
    """An admin reservation (`yard reservation create`, Slurm's `scontrol create reservation`):
    `nodes` held from `start` for `duration` for the jobs submitted with `--reservation=name` by
    its `users` or members of its `teams` (`sched/reservations.py`; ended ones hold nothing)."""

    name: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")]
    nodes: Annotated[list[Name], BeforeValidator(_hostlist), Field(min_length=1, max_length=B.MAX_NODES)]
    start: Annotated[float, BeforeValidator(_instant), Field(ge=0, le=4102444800)]  # before 2100
    duration: Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=B.MAX_DURATION_S)]
    users: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(default_factory=list, max_length=1000)
    teams: list[Annotated[str, Field(min_length=1, max_length=100)]] = Field(default_factory=list, max_length=1000)

    @property
    def end(self) -> float:
        return self.start + self.duration

    @model_validator(mode="after")
    def _someone(self) -> "ReservationSpec":
        if not self.users and not self.teams:
            raise ValueError(f"reservation {self.name!r}: give the users or teams it is for")
        dup = sorted({n for n in self.nodes if self.nodes.count(n) > 1})
        if dup:
            raise ValueError(f"reservation {self.name!r}: node {dup[0]!r} named twice")
        return self


Feature = Annotated[str, Field(max_length=B.MAX_NAME, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.=:+-]*$")]


class TrialSpec(_Model):
    """A change tried on the pilot pool (spec/pilot.py): the proposed values of the pilotable
    sections only, written by `yard cluster apply FILE --pilot`, never by hand. `health`: the
    proposed `health:` section (None: unchanged); `features`: each node's proposed features where
    they differ from its own (all nodes, so that `promote` can apply them everywhere)."""

    since: Annotated[float, Field(ge=0, le=4102444800)]  # when the trial began (epoch seconds)
    base_version: int = Field(ge=1)  # the version in force when it began
    message: str = Field("", max_length=500)
    health: HealthSpec | None = None
    features: dict[Name, list[Feature]] = Field(default_factory=dict, max_length=B.MAX_NODES)


class PilotSpec(_Model):
    """`pilot:` the nodes that take a change of health checks, remediation or node features first,
    and the trial in progress, if any (docs/control-plane.md, "Pilot pool")."""

    nodes: Annotated[list[Name], BeforeValidator(_hostlist), Field(min_length=1, max_length=B.MAX_NODES)]
    trial: TrialSpec | None = None


class ConfigSpec(_Model):
    """A whole cluster configuration: the file `yard up --config` and `yard sim --config` read."""

    cluster: ClusterSpec
    teams: list[TeamSpec] = Field(min_length=1, max_length=B.MAX_TEAMS)
    classes: list[JobClassSpec] = Field(min_length=1, max_length=B.MAX_CLASSES)
    default_class: str = "training"
    health: HealthSpec = Field(default_factory=HealthSpec)
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)  # per user and team (spec/limits.py)
    # Who jobs run as (design rule 6; `services/owners.py`): a token's user runs as the Unix
    # account of the same name unless `users` maps it to another one; `run_as` is the account of
    # token users with neither (unset: they are refused at submit); root only with allow_root_jobs.
    users: dict[Annotated[str, Field(min_length=1, max_length=200)], UnixName] = Field(default_factory=dict)
    run_as: UnixName | None = None
    allow_root_jobs: bool = False
    # The interpreter job owners run the in-job srun/scontrol/squeue/sinfo with (backends/rundir/job_tools.py);
    # None: the host's first python3. `yard up` checks that every job account can execute it.
    job_python: str | None = Field(None, max_length=4096, pattern=r"^/[^\x00\n]*$")
    retention: RetentionSpec = Field(default_factory=RetentionSpec)
    storage: StorageSpec = Field(default_factory=StorageSpec)  # disk per team, the reserve (StorageSpec)
    notify: NotifySpec | None = None  # --mail-type's webhook (control/lifecycle/notify.py); None: nothing is sent
    # Admin reservations (`yard reservation create/delete` edit this list; sched/reservations.py).
    reservations: list[ReservationSpec] = Field(default_factory=list, max_length=1000)
    # Per-GPU telemetry: how often the node agents are read and rows kept (spec/telemetry.py)
    telemetry: TelemetrySpec = Field(default_factory=TelemetrySpec)
    # Environment images: registries, credentials, team defaults, the nodes' caches (spec/images.py)
    images: ImagesSpec = Field(default_factory=ImagesSpec)
    # Allocations, terminals, forwarded ports, notebooks (spec/interactive.py)
    interactive: InteractiveSpec = Field(default_factory=InteractiveSpec)
    # Slow ranks within a job, nodes slow in several jobs (spec/stragglers.py, control/loop/stragglers.py)
    stragglers: StragglersSpec = Field(default_factory=StragglersSpec)
    # Nodes that take a change first, and the trial in progress (spec/pilot.py)
    pilot: PilotSpec | None = None
    # The operator's dataset catalogue (spec/datasets.py); members add theirs with `yard dataset add`
    datasets: list[DatasetSpec] = Field(default_factory=list, max_length=MAX_DATASETS)

    @model_validator(mode="after")
    def _references(self) -> "ConfigSpec":
        self._storage_references()
        pools = {n.pool for n in self.cluster.nodes}
        for i, t in enumerate(self.teams):
            for pool in t.quotas:
                if pool not in pools:
                    raise ValueError(f"teams[{i}] ({t.name}): quota for unknown pool {pool!r}; pools are {sorted(pools)}")
        names = [c.name for c in self.classes]
        for i, t in enumerate(self.teams):
            unknown = [c for c in (t.las if isinstance(t.las, list) else ()) if c not in names]
            if unknown:
                raise ValueError(f"teams[{i}] ({t.name}): las names unknown class(es) {unknown}; classes are {names}")
        teams = {t.name for t in self.teams}
        for i, c in enumerate(self.classes):
            unknown = [t for t in (c.idle.exempt_teams if c.idle else ()) if t not in teams]
            if unknown:
                raise ValueError(f"classes[{i}] ({c.name}): idle.exempt_teams: no team {unknown[0]!r}; "
                                 f"teams are {sorted(teams)}")
        if self.default_class not in names:
            raise ValueError(f"default_class {self.default_class!r} is not one of the classes {names}")
        unknown = [t for t in self.images.teams if t not in {t.name for t in self.teams}]
        if unknown:
            raise ValueError(f"images.teams: no team {unknown[0]!r}; teams are {sorted(t.name for t in self.teams)}")
        unknown = self.limits.unknown_teams({t.name for t in self.teams})
        if unknown:
            raise ValueError(f"limits.teams: no team {unknown[0]!r}; teams are {sorted(t.name for t in self.teams)}")
        for kind, items in (("team", [t.name for t in self.teams]), ("class", names)):
            dup = {x for x in items if items.count(x) > 1}
            if dup:
                raise ValueError(f"{kind} names must be unique; repeated: {sorted(dup)}")
        self._check_reservations()
        self._check_pilot()
        return self

    def _storage_references(self) -> None:
        """Datasets and object stores name known teams; `name:version` is unique; an s3:// source
        or archive lies under a configured object store that the dataset's team may use."""
        teams = {t.name for t in self.teams}
        stores = self.storage.object_stores
        for i, o in enumerate(stores):
            unknown = [t for t in (o.teams or ()) if t not in teams]
            if unknown:
                raise ValueError(f"storage.object_stores.{i}.teams: no team {unknown[0]!r}; teams are {sorted(teams)}")
        seen: set[tuple[str, str]] = set()
        for i, d in enumerate(self.datasets):
            for field, name in [("team", d.team)] + [(f"grants.{k}", g) for k, g in enumerate(d.grants)]:
                if name not in teams:
                    raise ValueError(f"datasets.{i}.{field}: no team {name!r}; teams are {sorted(teams)}")
            if (d.name, d.version) in seen:
                raise ValueError(f"datasets.{i}: {d.name}:{d.version} is listed twice")
            seen.add((d.name, d.version))
            if d.source.startswith("s3://"):
                store = max((o for o in stores if d.source == o.url or d.source.startswith(o.url + "/")),
                            key=lambda o: len(o.url), default=None)
                if store is None:
                    raise ValueError(f"datasets.{i}.source: {d.source!r} is under no storage.object_stores url")
                if store.teams is not None and d.team not in store.teams:
                    raise ValueError(f"datasets.{i}.source: team {d.team!r} may not read {store.url!r}")
        a = self.storage.archive
        if a is not None and a.url.startswith("s3://") and not any(
                a.url == o.url or a.url.startswith(o.url + "/") for o in stores):
            raise ValueError(f"storage.archive.url: {a.url!r} is under no storage.object_stores url")

    def lifecycle_for(self, team: str, job_class: str) -> LifecycleSpec:
        """The lifecycle rules for a job of `team` and `job_class`: field by field the team's, else the
        class's, else the cluster's (spec/lifecycle.py)."""
        from trainyard.spec.lifecycle import merged

        t = next((x for x in self.teams if x.name == team), None)
        c = next((x for x in self.classes if x.name == job_class), None)
        return merged(t.storage.lifecycle if t else None, c.lifecycle if c else None, self.storage.lifecycle)

    def _check_pilot(self) -> None:
        """The pilot's nodes (and a trial's features) name known nodes; some node stays out of it."""
        if self.pilot is None:
            return
        nodes = [n.name for n in self.cluster.expand()]
        for where, named in (("pilot.nodes", self.pilot.nodes),
                             ("pilot.trial.features", list(self.pilot.trial.features) if self.pilot.trial else [])):
            unknown = [n for n in named if n not in nodes]
            if unknown:
                raise ValueError(f"{where}: unknown node {unknown[0]!r}")
        dup = sorted({n for n in self.pilot.nodes if self.pilot.nodes.count(n) > 1})
        if dup:
            raise ValueError(f"pilot.nodes: node {dup[0]!r} named twice")
        if set(nodes) <= set(self.pilot.nodes):
            raise ValueError("pilot.nodes: every node is in the pilot; leave some out to compare the pilot with")

    def _check_reservations(self) -> None:
        """Reservations name known nodes and teams, have unique names, and no two hold one node at
        once (as Slurm refuses overlapping reservations without its OVERLAP flag)."""
        if not self.reservations:
            return
        nodes = {n.name for n in self.cluster.expand()}
        teams = {t.name for t in self.teams}
        seen: dict[str, ReservationSpec] = {}
        for i, r in enumerate(self.reservations):
            where = f"reservations[{i}] ({r.name})"
            if r.name in seen:
                raise ValueError(f"{where}: reservation names must be unique")
            unknown = [n for n in r.nodes if n not in nodes]
            if unknown:
                raise ValueError(f"{where}: unknown node {unknown[0]!r}")
            unknown = [t for t in r.teams if t not in teams]
            if unknown:
                raise ValueError(f"{where}: unknown team {unknown[0]!r}; teams are {sorted(teams)}")
            for o in seen.values():
                both = sorted(set(r.nodes) & set(o.nodes))
                if both and r.start < o.end and o.start < r.end:
                    raise ValueError(f"{where}: overlaps reservation {o.name!r} on node {both[0]!r}")
            seen[r.name] = r

    def pids_max_for(self, team: str, job_class: str) -> int:
        """A job's pids limit per node: its team's `pids_max`, else its class's, else the built-in
        DEFAULT_PIDS_MAX (a team or class no longer configured counts as one without a limit set)."""
        t = next((t for t in self.teams if t.name == team), None)
        c = next((c for c in self.classes if c.name == job_class), None)
        for v in (t.pids_max if t else None, c.pids_max if c else None):
            if v is not None:
                return v
        return DEFAULT_PIDS_MAX

    def to_admin_reservations(self) -> tuple[AdminReservation, ...]:
        """The reservations as the engine takes them (`Snapshot.reservations`)."""
        return tuple(AdminReservation(r.name, frozenset(r.nodes), r.start, r.end) for r in self.reservations)

    def to_sched(self) -> tuple[list[Node], dict[str, Team], dict[str, JobClass]]:
        nodes = self.cluster.expand()
        teams = {
            t.name: Team(t.name, t.cohort, {p: Quota(q.nominal, q.borrowing_limit, q.lending_limit) for p, q in t.quotas.items()},
                         t.las_classes())
            for t in self.teams
        }
        classes = {
            c.name: JobClass(c.name, c.priority, c.preemptible, c.max_wait, c.min_run_time, c.max_run_time, c.grace_period,
                             c.checkpoint_on_notice)
            for c in self.classes
        }
        return nodes, teams, classes


class JobSpec(_Model):
    """A job as submitted. Give either `nodes` (+ `gpus_per_node`) or a total `gpus` count."""

    name: str = ""
    team: str
    job_class: str = Field("training", alias="class")
    nodes: int | str | None = None
    gpus_per_node: int | None = Field(None, ge=1)
    gpus: int | None = Field(None, ge=1)
    gpu_mem_gb: float | None = Field(None, gt=0)
    runtime_estimate: OptDuration = None
    checkpoint_interval: OptDuration = None
    submit_time: float = Field(0.0, ge=0)
    pool: str = "default"

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, v: Any) -> Any:
        if v is not None:
            parse_node_range(v)
        return v

    @model_validator(mode="after")
    def _shape(self) -> "JobSpec":
        if self.nodes is None and self.gpus is None:
            raise ValueError("give either gpus, or nodes with gpus_per_node")
        if self.nodes is not None and self.gpus is not None and self.gpus_per_node is not None:
            raise ValueError("give gpus or gpus_per_node with nodes, not both")
        return self

    def to_request(self, job_id: JobId) -> JobRequest:
        """The engine's request; `gpu_mem_gb` becomes MiB here, once (`gb_to_mib`)."""
        mib = None if self.gpu_mem_gb is None else gb_to_mib(self.gpu_mem_gb)
        if self.nodes is None:
            return JobRequest(job_id, self.team, self.job_class, self.submit_time, gpus=int(self.gpus or 1),
                              gpu_mem_mib=mib, est_runtime_s=self.runtime_estimate,
                              checkpoint_interval_s=self.checkpoint_interval, pool=self.pool)
        lo, hi = parse_node_range(self.nodes)
        gpn = self.gpus_per_node
        if gpn is None:
            total = self.gpus or lo
            if total % lo:
                raise ConfigError(f"gpus={total} does not divide evenly over {lo} nodes", field="gpus")
            gpn = total // lo
        return JobRequest(job_id, self.team, self.job_class, self.submit_time, gpus=gpn * lo, gpus_per_node=gpn,
                          min_nodes=lo, max_nodes=hi, gpu_mem_mib=mib, est_runtime_s=self.runtime_estimate,
                          checkpoint_interval_s=self.checkpoint_interval, pool=self.pool)


# -- loading with errors that point at the line -------------------------------------------------


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """Follow a pydantic error location through the YAML node tree to a 1-based line number."""
    line = None if node is None else node.start_mark.line + 1
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = None
            for k, v in node.value:
                if k.value == key or (key == "job_class" and k.value == "class"):
                    nxt = v
                    line = k.start_mark.line + 1
                    break
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
        else:
            break
        if node is None:
            break
    return line


def _read_yaml(path: Path) -> tuple[Any, yaml.Node | None]:
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror or e}", file=str(path)) from None
    return _parse_yaml(text, str(path))


def _parse_yaml(text: str, file: str) -> tuple[Any, yaml.Node | None]:
    B.check_yaml(text, file)  # size, depth and expansion, before anything recursive reads it
    try:
        return yaml.safe_load(text), yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(f"not valid YAML: {getattr(e, 'problem', e)}", file=file,
                          line=mark.line + 1 if mark else None) from None


def validate(model: type[BaseModel], data: Any, file: str | None = None, node: yaml.Node | None = None,
             loc_prefix: tuple[Any, ...] = ()) -> Any:
    """`model.model_validate(data)`, turning the first error into a `ConfigError` with file/line/field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = loc_prefix + tuple(err["loc"])
        field = ".".join(str(x) for x in loc) or None
        msg = err["msg"].removeprefix("Value error, ")
        named = _NAMED.match(msg) if err["type"] == "value_error" else None
        if named is not None and not loc and named.group(1).startswith(_NAMED_SECTIONS):
            # a check across fields of issue 41's sections names the one it refuses ("storage.archive.url: …")
            loc = tuple(int(x) if x.isdigit() else x for x in named.group(1).split("."))
            field, msg = named.group(1), msg[named.end():]
        raise ConfigError(msg, file=file, line=_line_of(node, loc), field=field) from None


_NAMED = re.compile(r"([a-z_]+(?:\.[A-Za-z0-9_]+)+): ")
_NAMED_SECTIONS = ("storage.", "datasets.")


def load_config(path: str | Path) -> ConfigSpec:
    path = Path(path)
    data, node = _read_yaml(path)
    return _config_from(data, node, str(path))


def parse_config(text: str, file: str = "<config>") -> ConfigSpec:
    """A configuration from YAML text (the control plane stores versions as text)."""
    data, node = _parse_yaml(text, file)
    return _config_from(data, node, file)


def _config_from(data: Any, node: yaml.Node | None, file: str) -> ConfigSpec:
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping with cluster, teams and classes", file=file, line=1)
    return validate(ConfigSpec, data, file, node)


def load_jobs(path: str | Path) -> list[JobSpec]:
    """A YAML list of jobs (or a mapping with a `jobs:` list)."""
    path = Path(path)
    data, node = _read_yaml(path)
    prefix: tuple[Any, ...] = ()
    if isinstance(data, dict) and "jobs" in data:
        data, prefix = data["jobs"], ("jobs",)
    if not isinstance(data, list):
        raise ConfigError("expected a list of jobs", file=str(path), line=1)
    return [validate(JobSpec, item, str(path), node, prefix + (i,)) for i, item in enumerate(data)]


EXAMPLE_CONFIG = Path(__file__).parents[1] / "examples" / "cluster.yaml"
