"""Teams and quotas: read from the configuration in force; an update is a new configuration version.

Two updates: `PUT` (TeamUpdate) replaces the quotas of the pools it names, `PATCH` (TeamPatch,
what `yard teams set` sends) changes only the fields it names, so `--nominal 3` leaves the
borrowing limit alone. Either edits the stored text in place, comments kept
(`services/config_edit.py`), and answers with `warnings`: pools whose nominal quotas add up to
more GPUs than the pool has (allowed, as Kueue allows it, but rarely meant: not every team can
have its quota at once)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.spec import bounds as B
from trainyard.services import config
from trainyard.services.config_edit import UNSET, edit_team
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, NotFound
from trainyard.states import ACTIVE_STATES, PENDING_STATES
from trainyard.spec.models import ConfigSpec, QuotaSpec
from trainyard.store.models import JobRow


class TeamUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cohort: str | None = None
    quotas: dict[str, QuotaSpec] | None = None
    message: str = ""


class QuotaPatch(BaseModel):
    """The quota fields to change in one pool; a field sent as null is removed (no limit)."""

    model_config = ConfigDict(extra="forbid")
    nominal: int | None = Field(None, ge=0, le=B.MAX_QUOTA_GPUS)
    borrowing_limit: int | None = Field(None, ge=0, le=B.MAX_QUOTA_GPUS)
    lending_limit: int | None = Field(None, ge=0, le=B.MAX_QUOTA_GPUS)

    def given(self) -> dict[str, int | None]:
        return {k: getattr(self, k) for k in type(self).model_fields if k in self.model_fields_set}


class TeamPatch(BaseModel):
    """Only what is named changes: per pool, the fields given (a pool sent as null loses its quota)."""

    model_config = ConfigDict(extra="forbid")
    cohort: str | None = None
    quotas: dict[str, QuotaPatch | None] | None = None
    message: str = ""


def list_teams(s: Session, cfg: config.ConfigVersion) -> list[dict[str, Any]]:
    used: dict[str, int] = {}
    for team, placement in s.execute(select(JobRow.team, JobRow.placement).where(JobRow.state.in_(ACTIVE_STATES))):
        used[team] = used.get(team, 0) + sum(len(p["gpus"]) for p in placement or [])
    waiting: dict[str, int] = {}
    for team, gpus in s.execute(select(JobRow.team, JobRow.gpus).where(JobRow.state.in_(PENDING_STATES))):
        waiting[team] = waiting.get(team, 0) + gpus
    return [{"name": t.name, "cohort": t.cohort,
             "quotas": {p: q.model_dump() for p, q in t.quotas.items()},
             "gpus_used": used.get(t.name, 0), "gpus_pending": waiting.get(t.name, 0)} for t in cfg.spec.teams]


def get_team(s: Session, cfg: config.ConfigVersion, name: str) -> dict[str, Any]:
    for t in list_teams(s, cfg):
        if t["name"] == name:
            return t
    raise NotFound(f"no team {name!r}")


def update_team(s: Session, cfg: config.ConfigVersion, name: str, upd: TeamUpdate | TeamPatch, by: Principal) -> int:
    """Store the configuration with team `name` changed as a new version; returns its number.

    Raises:
        Forbidden: not an admin.
        NotFound: no such team.
        ServiceError: the result is not a valid configuration (e.g. a new pool's quota with no nominal).
    """
    if not by.is_admin:
        raise Forbidden("only an admin can change teams and quotas")
    cohort = UNSET if upd.cohort is None else upd.cohort  # "" removes it
    if isinstance(upd, TeamPatch):
        quotas = None if upd.quotas is None else {p: None if q is None else q.given() for p, q in upd.quotas.items()}
        text = edit_team(cfg.text, name, cohort=cohort, quotas=quotas)
    else:
        quotas = None if upd.quotas is None else {p: q.model_dump(exclude_none=True) for p, q in upd.quotas.items()}
        text = edit_team(cfg.text, name, cohort=cohort, quotas=quotas, replace=True)
    return config.apply(s, text, by, upd.message or f"team {name} updated")


def overcommitted(spec: ConfigSpec) -> list[str]:
    """A warning per pool whose teams' nominal quotas add up to more GPUs than its nodes have."""
    gpus: dict[str, int] = {}
    for n in spec.cluster.expand():
        gpus[n.pool] = gpus.get(n.pool, 0) + n.gpus
    nominal: dict[str, int] = {}
    for t in spec.teams:
        for pool, q in t.quotas.items():
            nominal[pool] = nominal.get(pool, 0) + q.nominal
    return [f"pool {pool!r}: nominal quotas add up to {total} GPUs, more than its {gpus.get(pool, 0)}; "
            "not every team can have its quota at once" for pool, total in sorted(nominal.items())
            if total > gpus.get(pool, 0)]
