"""Lifecycle rules (issue 41): what is kept of a job's checkpoints, logs and directory, and where.

    storage:
      archive: {url: "s3://ckpt-archive"}     # or a path (/mnt/archive); absent: no archive tier
      lifecycle:                                # the cluster's rules; a team's or a class's replace them field by field
        checkpoints: {keep_last: 2, keep_every: 5, keep_best: {metric: loss, mode: min, count: 1}, keep_for: 30d}
        logs: 90d                               # a finished job's logs
        job_dirs: 180d                          # a finished job's whole directory
    teams:  [{name: nlp, storage: {lifecycle: {checkpoints: {keep_last: 3}}}}]
    classes: [{name: dev, lifecycle: {checkpoints: {keep_last: 1}}}]

Checkpoints (`services/checkpoint_plan.py` decides, the plane applies):
- the fast tier (the job dir, where the runtime writes) holds the newest `keep_last` committed
  steps and every step marked `keep` (`yard checkpoints keep JOB STEP`);
- of the older ones, those a selecting rule keeps (`keep_every`: a multiple of it; `keep_best`: the
  `count` best by a metric of the commit manifest) go to the archive tier; with neither rule given
  every older one is kept; the others are deleted;
- `keep_for` after the job ended, only the steps marked `keep` remain.
Without an archive tier, what would be archived stays in the fast tier.

Logs and job dirs (services/retention.py applies them, control/lifecycle/retention.py runs it):
`logs` and `job_dirs` count from the job's end; where no layer sets `job_dirs`, `retention.job_dirs`
does (the cluster-wide horizon it was before these rules). Each deletion is an audit event.

Precedence, field by field: the team's value, else the class's, else the cluster's (as `pids_max`).
A malformed rule is refused naming its field (`teams.0.storage.lifecycle.checkpoints.keep_last`;
tests/spec/test_lifecycle.py). `yard storage` shows what the rules delete next (services/storage_view.py).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from trainyard.spec import bounds as B
from trainyard.spec.parsing import parse_duration

# `null` is "unset": the bounds apply to a number only (as spec/models.py's OptDuration)
OptDuration = Annotated[Annotated[float, Field(ge=0, le=B.MAX_DURATION_S)] | None, BeforeValidator(parse_duration)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class KeepBest(_Model):
    """Keep the `count` checkpoints with the best `metric` (from the commit manifest's `metrics`)."""

    metric: str = Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_./-]+$")
    mode: Literal["min", "max"] = "min"
    count: int = Field(1, ge=1, le=1000)


class CheckpointRules(_Model):
    """Every field optional, so that a team's or a class's rules replace the cluster's field by field."""

    keep_last: int | None = Field(None, ge=1, le=10_000)
    keep_every: int | None = Field(None, ge=1, le=10_000_000)
    keep_best: KeepBest | None = None
    keep_for: OptDuration = None


class LifecycleSpec(_Model):
    checkpoints: CheckpointRules = Field(default_factory=CheckpointRules)
    logs: OptDuration = None  # a finished job's logs are deleted this long after its end
    job_dirs: OptDuration = None  # a finished job's whole directory (the same as retention.job_dirs)


class ArchiveSpec(_Model):
    """The archive tier: a path (a large, slower file system) or an object-store URL (one of
    `storage.object_stores`). The plane moves checkpoints there every `interval`, at most
    `bandwidth_mb_s` (0: no limit) so that the moves never crowd a running job's saves."""

    url: str = Field(max_length=1000, pattern=r"^(/[^\x00\n]*|s3://[a-z0-9][a-z0-9.-]{1,62}[a-z0-9](/[^\x00\n]*)?)$")
    interval: Annotated[float, BeforeValidator(parse_duration), Field(ge=1, le=B.MAX_DURATION_S)] = 60.0
    bandwidth_mb_s: float = Field(0.0, ge=0, le=1e6)


DEFAULT_KEEP_LAST = 3  # the runtime's own default (CheckpointManager.keep_last)


def merged(*layers: LifecycleSpec | None) -> LifecycleSpec:
    """The rules that apply, from the most specific layer first (team, class, cluster): each field
    the first layer that sets it."""
    ckpt: dict[str, object] = {}
    top: dict[str, object] = {}
    for layer in layers:
        if layer is None:
            continue
        for k, v in layer.checkpoints.model_dump(exclude_none=True).items():
            ckpt.setdefault(k, v)
        for k in ("logs", "job_dirs"):
            if getattr(layer, k) is not None:
                top.setdefault(k, getattr(layer, k))
    return LifecycleSpec(checkpoints=CheckpointRules(**ckpt), **top)
