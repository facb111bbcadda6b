"""The cluster configuration as versioned data (design rule 5).

The configuration (nodes and their topology, teams and quotas, job classes) is kept as YAML text,
one row per version. Applying a change validates it first and appends a version; nothing is ever
edited in place, so `history`, `diff` and `rollback` (which applies an old text as a new version)
are exact. The newest version is the one in force; `ConfigCache` parses it once per version.

The scheduling policy is part of it (the `scheduler:` section, `trainyard.spec.models.SchedulerSpec`),
so a change of policy or of a parameter is applied, listed, diffed and rolled back like any other
change, and the control loop runs `ConfigVersion.policy` of the version in force on every pass.
`yard up --policy NAME` is `set_policy`: a new version with `scheduler.policy` changed, never a
setting outside the history.
"""

from __future__ import annotations

import difflib
import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypedDict

import yaml
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from trainyard.services import images, owners
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, NotFound, ServiceError
from trainyard.services.events import record
from trainyard.sched.cluster import Node
from trainyard.sched.policy import Policy
from trainyard.sched.types import AdminReservation, JobClass, Team
from trainyard.spec.pilot import effective_nodes
from trainyard.spec.models import EXAMPLE_CONFIG, ConfigError, ConfigSpec, parse_config
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
        """The configuration's nodes, `count` expanded (`ClusterSpec.expand`), a pilot node with
        its trial's features (`spec.pilot.effective_nodes`)."""
        return effective_nodes(self.spec)

    @cached_property
    def sched(self) -> tuple[dict[str, Team], dict[str, JobClass]]:
        """Teams and classes as the engine takes them (`ConfigSpec.to_sched`)."""
        _, teams, classes = self.spec.to_sched()
        return teams, classes

    @cached_property
    def reservations(self) -> tuple[AdminReservation, ...]:
        """Its admin reservations as the engine takes them (`ConfigSpec.to_admin_reservations`)."""
        return self.spec.to_admin_reservations()

    @cached_property
    def policy(self) -> Policy:
        """The scheduling policy this version configures, built once: a policy holds its
        configuration but no state between cycles (`trainyard.sched.policy`), so every pass
        under this version can run the same object, and a new version brings a new one."""
        return self.spec.scheduler.build()


def default_config_text(nodes: list[tuple[str, int, str, int]], team: str = "default",
                        topology: dict[str, dict[str, str]] | None = None) -> str:
    """The configuration `yard up` starts with when given none: the given nodes
    (name, GPUs, model, GPU MiB) with their `block`/`rack` from `topology` where known, one team
    owning them all, and the example's three classes."""
    example = yaml.safe_load(EXAMPLE_CONFIG.read_text())  # plane's own: a file of the package
    total = sum(g for _, g, _, _ in nodes)
    doc = {
        "cluster": {"name": "local", "nodes": [
            {"name": n, "gpus": g, "gpu_model": m, "gpu_mem_gb": round(mib / 1024, 3), **(topology or {}).get(n, {})}
            for n, g, m, mib in nodes]},
        "teams": [{"name": team, "quotas": {"default": {"nominal": total}}}],
        "classes": example["classes"],
        "default_class": example.get("default_class", "training"),
    }
    dumped: str = yaml.safe_dump(doc, sort_keys=False)  # yaml is untyped: a str when no stream is given
    return dumped


def _validated(text: str, where: str = "config") -> ConfigSpec:
    try:
        return parse_config(text, where)
    except ConfigError as e:
        raise ServiceError(str(e), field=e.field) from None


def apply(s: Session, text: str, by: Principal, message: str = "") -> int:
    """Validate `text` and store it as the newest version; returns the version number.

    Beyond the model's own validation, the accounts and groups it names must exist on this
    machine (`owners.check_config`): a `users:` entry or a team `group:` that names nothing is
    an error naming the entry, never a job that later runs as someone else."""
    if not by.is_admin:
        raise Forbidden("only an admin can change the cluster configuration")
    new = check(text)
    latest = s.scalar(select(func.max(ConfigVersionRow.version))) or 0
    current = s.get(ConfigVersionRow, latest) if latest else None
    if current is not None and current.text == text:
        return latest  # applying the same text twice makes no new version
    version = latest + 1
    event.listen(s, "after_commit", _count_applied, once=True)  # caches look again once it is visible
    s.add(ConfigVersionRow(version=version, text=text, author=by.user, created_at=time.time(), message=message))
    record(s, by.user, "config.applied", message or f"configuration version {version}",
           data={"version": version, "before": {"version": latest or None}, "after": {"version": version}})
    old = _validated(current.text) if current is not None else None
    for team, before, after in quota_changes(old, new):
        record(s, by.user, "quota.changed", f"team {team}: quota changed in configuration version {version}",
               data={"team": team, "version": version, "before": before, "after": after})
    return version


def check(text: str) -> ConfigSpec:
    """`text` validated as `apply` validates it, nothing stored: the model, the accounts and groups
    it names (`owners.check_config`), each registry's password file and each object store's
    credentials file (readable now, not at a job's first pull or staging). A what-if
    (`services/whatif.py`) gives a proposal the very same errors.

    Raises:
        ServiceError: the first problem, naming its field.
    """
    spec = _validated(text)
    try:
        owners.check_config(spec)
    except ConfigError as e:
        raise ServiceError(str(e), field=e.field) from None
    images.registry_access(spec)
    from trainyard.services.datasets import source_access  # (imported here: datasets reads this module's types)

    source_access(spec)  # each object store's credentials file, readable now (as a registry's password file)
    return spec


class TeamQuotas(TypedDict):
    """One team's side of a `quota.changed` event (audit data, stored as JSON)."""
    cohort: str | None
    quotas: dict[str, dict[str, Any]]  # pool -> QuotaSpec.model_dump()


def _team_quotas(spec: ConfigSpec | None) -> dict[str, TeamQuotas]:
    if spec is None:
        return {}
    return {t.name: {"cohort": t.cohort, "quotas": {p: q.model_dump() for p, q in sorted(t.quotas.items())}}
            for t in spec.teams}


def quota_changes(old: ConfigSpec | None, new: ConfigSpec) -> list[tuple[str, TeamQuotas | None, TeamQuotas | None]]:
    """(team, before, after) for each team whose cohort or quotas differ between two versions (None:
    the team is new, or gone): the audit trail's `quota.changed` events."""
    a, b = _team_quotas(old), _team_quotas(new)
    return [(t, a.get(t), b.get(t)) for t in sorted(set(a) | set(b)) if a.get(t) != b.get(t)]


def set_policy(s: Session, name: str, by: Principal, message: str) -> tuple[int, bool] | None:
    """Make `name` the policy in force by applying the newest version with `scheduler.policy`
    changed; None when it already is (no new version). Returns (the new version, whether
    `scheduler.params` were dropped): parameters belong to the policy they were written for, so
    they do not carry over to another one (they stay in the earlier version, for a rollback).

    Raises:
        NotFound: no configuration stored yet.
        ServiceError: `name` is not a known policy (field `scheduler.policy`).
    """
    row = get_version(s)
    current = _validated(row.text).scheduler
    if current.policy == name:
        return None
    text = with_policy(row.text, name)
    return apply(s, text, by, message), bool(current.params)


def with_top_level(text: str, values: dict[str, object]) -> str:
    """`text` with each top-level `key: value` of `values` set (its line replaced, or appended),
    every other line as it was. Values are written as JSON scalars, which YAML reads back as is."""
    for key, value in values.items():
        line = f"{key}: {json.dumps(value)}"
        pattern = re.compile(rf"^{re.escape(key)}:.*$", re.MULTILINE)
        if pattern.search(text):
            text = pattern.sub(line, text, count=1)
        else:
            text = text + ("" if text.endswith("\n") or not text else "\n") + line + "\n"
    return text


def set_identity(s: Session, by: Principal, message: str, *, run_as: str | None = None,
                 allow_root_jobs: bool | None = None) -> int | None:
    """`yard up --run-as USER [--allow-root-jobs]`: the newest version with `run_as` and
    `allow_root_jobs` set, applied as a new version (None when nothing changes). As `set_policy`
    does for the policy: a start-up flag that changes who jobs run as is a configuration change
    like any other, listed, diffed and rolled back.

    Raises:
        ServiceError: the account does not exist, or is root without allow_root_jobs (field named).
    """
    row = get_version(s)
    wanted = {k: v for k, v in (("allow_root_jobs", allow_root_jobs), ("run_as", run_as)) if v is not None}
    text, _ = with_identity(row.text, "", wanted, "")
    return None if text == row.text else apply(s, text, by, message)


def with_identity(text: str, why: str, values: Mapping[str, object], flags: str) -> tuple[str, str]:
    """(`text` with `values` of `run_as`/`allow_root_jobs` where they differ, its message): what
    `yard up --config FILE --run-as USER` stores, in one version with the file's text."""
    current = _validated(text)
    changed = {k: v for k, v in values.items() if getattr(current, k) != v}
    return (with_top_level(text, changed), f"{why}, {flags}") if changed else (text, why)


def given_text(text: str, policy: str | None) -> tuple[str, str]:
    """What `yard up --config FILE [--policy NAME]` stores, and the message: the file's text, with
    `scheduler.policy` set (`with_policy`) when `--policy` names another policy. One version for
    the pair, so a restart with the same flags stores nothing new (`apply` skips a text equal to
    the newest version's).

    Raises:
        ServiceError: the file is not a valid configuration.
    """
    why = "configuration given to yard up"
    if policy is None or _validated(text).scheduler.policy == policy:
        return text, why
    return with_policy(text, policy), f"{why}, scheduler.policy from yard up --policy {policy}"


def with_policy(text: str, name: str) -> str:
    """`text` with `scheduler.policy: name` and no `scheduler.params`, every other line as it was.

    The stored text is what `yard cluster get` shows and `diff` compares, comments included, so
    the change is made in place: the policy's scalar replaced (or a `policy:` line added, or a
    `scheduler:` section appended) and the `params:` block cut out. A layout this does not
    follow (flow style, anchors) is re-dumped instead, which keeps the data but not the comments;
    either way the result is checked to load as exactly the intended data.
    """
    data = yaml.safe_load(text)
    want = dict(data)
    sched = want.get("scheduler")
    sched = dict(sched) if isinstance(sched, dict) else {}
    sched.pop("params", None)
    sched = {"policy": name, **{k: v for k, v in sched.items() if k != "policy"}}
    want["scheduler"] = sched
    try:
        edited = _edit_policy(text, name)
    except (ValueError, yaml.YAMLError):
        edited = None
    if edited is not None and yaml.safe_load(edited) == want:
        return edited
    dumped: str = yaml.safe_dump(want, sort_keys=False)  # yaml is untyped: a str when no stream is given
    return dumped


def _edit_policy(text: str, name: str) -> str | None:
    """The in-place edit of `with_policy`, or None where the layout is not the plain block one."""
    root = yaml.compose(text)
    if not isinstance(root, yaml.MappingNode):
        return None
    section = next((v for k, v in root.value if k.value == "scheduler"), None)
    if section is None:
        return text + ("" if text.endswith("\n") or not text else "\n") + f"scheduler:\n  policy: {name}\n"
    if not isinstance(section, yaml.MappingNode) or section.flow_style or not section.value:
        return None
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    edits: list[tuple[int, int, str]] = []  # (from, to, replacement) by character offset
    for key, value in section.value:
        if key.value == "params":
            last = value.end_mark.line if value.end_mark.column else value.end_mark.line - 1
            while last > key.start_mark.line and (not lines[last].strip() or lines[last].lstrip().startswith("#")):
                last -= 1  # comment lines after the block belong to what follows
            edits.append((starts[key.start_mark.line], starts[last + 1], ""))
    policy = next((v for k, v in section.value if k.value == "policy"), None)
    if policy is not None:
        if not isinstance(policy, yaml.ScalarNode):
            return None
        edits.append((policy.start_mark.index, policy.end_mark.index, name))
    else:
        first = section.value[0][0]
        at = starts[first.start_mark.line]
        edits.append((at, at, " " * first.start_mark.column + f"policy: {name}\n"))
    for lo, hi, rep in sorted(edits, reverse=True):
        text = text[:lo] + rep + text[hi:]
    return text


def get_version(s: Session, version: int | None = None) -> ConfigVersionRow:
    if version is None:
        version = s.scalar(select(func.max(ConfigVersionRow.version)))
    row = s.get(ConfigVersionRow, version) if version is not None else None
    if row is None:
        raise NotFound(f"no configuration version {version}")
    return row


class VersionView(TypedDict):
    """One stored configuration version as `yard cluster history` lists it (JSON)."""
    version: int
    author: str
    created_at: float
    message: str


def history(s: Session) -> list[VersionView]:
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
