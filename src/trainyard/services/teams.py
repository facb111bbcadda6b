"""Teams and quotas: read from the configuration in force; an update is a new configuration version."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict
from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services import config
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, NotFound
from trainyard.states import ACTIVE_STATES, PENDING_STATES
from trainyard.spec import QuotaSpec
from trainyard.store.models import JobRow


class TeamUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cohort: str | None = None
    quotas: dict[str, QuotaSpec] | None = None
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


def update_team(s: Session, cfg: config.ConfigVersion, name: str, upd: TeamUpdate, by: Principal) -> int:
    if not by.is_admin:
        raise Forbidden("only an admin can change teams and quotas")
    doc = yaml.safe_load(cfg.text)
    for t in doc.get("teams", []):
        if t.get("name") == name:
            if upd.cohort is not None:
                t["cohort"] = upd.cohort or None
            if upd.quotas is not None:
                t["quotas"] = {p: q.model_dump(exclude_none=True) for p, q in upd.quotas.items()}
            break
    else:
        raise NotFound(f"no team {name!r}")
    return config.apply(s, yaml.safe_dump(doc, sort_keys=False), by, upd.message or f"team {name} updated")
