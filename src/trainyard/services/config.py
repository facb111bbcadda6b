"""The cluster configuration as versioned data (DESIGN rule 5).

The configuration (nodes and their topology, teams and quotas, job classes) is kept as YAML text,
one row per version. Applying a change validates it first and appends a version; nothing is ever
edited in place, so `history`, `diff` and `rollback` (which applies an old text as a new version)
are exact. The newest version is the one in force; `ConfigCache` parses it once per version.
"""

from __future__ import annotations

import difflib
import threading
import time
from dataclasses import dataclass
from functools import cached_property

import yaml
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, NotFound, ServiceError
from trainyard.services.events import record
from trainyard.sched.cluster import Node
from trainyard.sched.types import JobClass, Team
from trainyard.spec import EXAMPLE_CONFIG, ConfigError, ConfigSpec, parse_config
from trainyard.store.models import ConfigVersionRow


_applied = 0  # versions applied by this process: `ConfigCache` re-reads the newest version when it moves


def _count_applied(_session: Session) -> None:
    global _applied
    _applied += 1


@dataclass(frozen=True)
class ConfigVersion:
    version: int
    spec: ConfigSpec
    text: str
    author: str
    created_at: float
    message: str

    # Derived once per version: every submission and every loop pass reads them.
    @cached_property
    def nodes(self) -> list[Node]:
        """The configuration's nodes, `count` expanded (`ClusterSpec.expand`)."""
        return self.spec.cluster.expand()

    @cached_property
    def sched(self) -> tuple[dict[str, Team], dict[str, JobClass]]:
        """Teams and classes as the engine takes them (`ConfigSpec.to_sched`)."""
        _, teams, classes = self.spec.to_sched()
        return teams, classes


def default_config_text(nodes: list[tuple[str, int, str, int]], team: str = "default",
                        topology: dict[str, dict[str, str]] | None = None) -> str:
    """The configuration `yard up` starts with when given none: the given nodes
    (name, GPUs, model, GPU MiB) with their `block`/`rack` from `topology` where known, one team
    owning them all, and the example's three classes."""
    example = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    total = sum(g for _, g, _, _ in nodes)
    doc = {
        "cluster": {"name": "local", "nodes": [
            {"name": n, "gpus": g, "gpu_model": m, "gpu_mem_gb": round(mib / 1024, 3), **(topology or {}).get(n, {})}
            for n, g, m, mib in nodes]},
        "teams": [{"name": team, "quotas": {"default": {"nominal": total}}}],
        "classes": example["classes"],
        "default_class": example.get("default_class", "training"),
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _validated(text: str, where: str = "config") -> ConfigSpec:
    try:
        return parse_config(text, where)
    except ConfigError as e:
        raise ServiceError(str(e), field=e.field) from None


def apply(s: Session, text: str, by: Principal, message: str = "") -> int:
    """Validate `text` and store it as the newest version; returns the version number."""
    if not by.is_admin:
        raise Forbidden("only an admin can change the cluster configuration")
    _validated(text)
    latest = s.scalar(select(func.max(ConfigVersionRow.version))) or 0
    if latest:
        current = s.get(ConfigVersionRow, latest)
        if current is not None and current.text == text:
            return latest  # applying the same text twice makes no new version
    version = latest + 1
    event.listen(s, "after_commit", _count_applied, once=True)  # caches look again once it is visible
    s.add(ConfigVersionRow(version=version, text=text, author=by.user, created_at=time.time(), message=message))
    record(s, by.user, "config.applied", message or f"configuration version {version}", data={"version": version})
    return version


def get_version(s: Session, version: int | None = None) -> ConfigVersionRow:
    if version is None:
        version = s.scalar(select(func.max(ConfigVersionRow.version)))
    row = s.get(ConfigVersionRow, version) if version is not None else None
    if row is None:
        raise NotFound(f"no configuration version {version}")
    return row


def history(s: Session) -> list[dict]:
    rows = s.scalars(select(ConfigVersionRow).order_by(ConfigVersionRow.version.desc()))
    return [{"version": r.version, "author": r.author, "created_at": r.created_at, "message": r.message} for r in rows]


def diff(s: Session, a: int, b: int) -> str:
    ra, rb = get_version(s, a), get_version(s, b)
    return "".join(difflib.unified_diff(ra.text.splitlines(True), rb.text.splitlines(True),
                                        fromfile=f"version {a}", tofile=f"version {b}"))


def rollback(s: Session, version: int, by: Principal) -> int:
    old = get_version(s, version)
    return apply(s, old.text, by, message=f"rollback to version {version}")


class ConfigCache:
    """The configuration in force, parsed once per version (the control loop reads it every tick)."""

    RECHECK_S = 5.0  # a version applied by another process is seen within this time

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._current: ConfigVersion | None = None
        self._seen: tuple[int, float] = (-1, 0.0)  # (this process's apply count, when checked)

    def current(self, s: Session) -> ConfigVersion:
        cur = self._current
        applied, checked = self._seen
        if cur is not None and applied == _applied and time.monotonic() - checked < self.RECHECK_S:
            return cur  # every request asks: skip the query while nothing was applied here
        seen = (_applied, time.monotonic())
        latest = s.scalar(select(func.max(ConfigVersionRow.version)))
        if cur is not None and cur.version == latest:
            self._seen = seen
            return cur
        row = get_version(s, latest)
        parsed = ConfigVersion(row.version, _validated(row.text), row.text, row.author, row.created_at, row.message)
        with self._lock:
            self._current, self._seen = parsed, seen
        return parsed
