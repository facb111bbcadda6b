"""The shapes of `yard share` (sshare) and `yard prio` (sprio): what `GET /api/v1/share` and
`GET /api/v1/priority` answer. `control/reports/priority.py` computes them from the schedule step's inputs;
they live here so the API names its response models without importing `control/`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TeamShare(BaseModel):
    team: str
    pool: str
    cohort: str | None
    nominal_gpus: int
    borrowing_limit: int | None
    lending_limit: int | None
    gpus_allocated: int = Field(description="GPUs its running jobs hold now")
    norm_shares: float = Field(description="its nominal quota / all teams' in the pool")
    raw_usage_gpu_hours: float = Field(description="decayed GPU-hours (half-life 7 days)")
    norm_usage: float = Field(description="its decayed usage / all teams'")
    level_fs: float | None = Field(description="norm_shares / norm_usage (Slurm's Level FS; >1 under-served)")
    fairshare_factor: float = Field(description="the engine's multiplier on its jobs' score (1 on share, >1 waits)")
    fairshare: float = Field(description="sshare's FAIRSHARE, Slurm's classic 2^(-norm_usage/norm_shares): 0-1, "
                                         "higher = more priority (1: unused, 0.5: used its share)")


class ShareReport(BaseModel):
    now: float
    policy: str
    half_life_s: float
    fairshare_weight: float
    teams: list[TeamShare]


class JobPriority(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    rank: int = Field(description="1: the first job the next cycle considers")
    id: int
    name: str
    user: str
    team: str
    pool: str
    job_class: str = Field(serialization_alias="class")
    class_priority: int
    tier: str = Field(description="'in-quota' (fits the team's unused nominal quota) or 'borrowing'")
    urgent: bool = Field(description="waited reserve_at of its class's max wait: oldest first, may reserve")
    waited_fraction: float = Field(description="time waited / the class's max wait")
    remaining_gpu_s: float = Field(description="estimated remaining GPU-seconds (time limit, class max run "
                                               "time or the default, less the work done)")
    fairshare_factor: float
    score: float | None = Field(description="log(remaining × GPUs × fair share) − aging; lower first "
                                            "(null for urgent jobs, ordered by waited_fraction)")
    gpus: int
    reason: str
    est_start: float | None


class PriorityReport(BaseModel):
    now: float
    policy: str
    ordering: dict[str, float] = Field(description="the ordering parameters in force")
    jobs: list[JobPriority]

