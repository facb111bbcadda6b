"""The pilot pool's steps as configuration versions (spec/pilot.py says what a trial is).

- `apply_trial` (`yard cluster apply FILE --pilot`): the file is validated exactly as `apply`
  validates it (the same errors, nothing stored), then must differ from the configuration in force
  only in what a pilot can try; the new version is the one in force with `pilot.trial` holding the
  proposed values.
- `promote`: the new version has the trial's values everywhere (`health:`, the nodes' `features`)
  and no trial.
- `rollback`: the new version is the one in force without the trial: every node back to the
  configuration's own settings.

Each is one version (`config.apply`: its `config.applied` event) and one `pilot.*` audit event
naming the version, the pilot's nodes and what the trial changes. The text is edited in place
(services/pilot_text.py), so the rest of the stored configuration, comments included, stays as it
was: rolling back a trial started on version N gives N's settings again.
"""

from __future__ import annotations

from typing import Any

import yaml
from sqlalchemy.orm import Session

from trainyard.services import config, pilot_text
from trainyard.services.auth import Principal
from trainyard.services.errors import Conflict, Forbidden, ServiceError
from trainyard.services.events import record
from trainyard.spec import pilot
from trainyard.spec.models import ConfigSpec


def checked(text: str) -> ConfigSpec:
    """`text` validated as `config.apply` validates it (`config.check`: the model, the accounts
    and groups it names, the registries' password files): the same errors, naming the field."""
    return config.check(text)


def _admin(by: Principal) -> None:
    if not by.is_admin:
        raise Forbidden("only an admin can change the cluster configuration")


def apply_trial(s: Session, text: str, by: Principal, message: str, now: float) -> int:
    """Start a trial of the file `text` on the pilot: a new version (module docstring).

    Raises:
        ServiceError: the file is invalid (as `apply`), holds a trial, differs outside the pilotable
            sections (field: the section) or changes nothing a pilot can try.
        Conflict: the configuration in force has no pilot, or a trial is in progress.
    """
    _admin(by)
    proposed = checked(text)
    row = config.get_version(s)
    base = checked(row.text)
    try:
        health, feats = pilot.trial_of(base, proposed)
    except pilot.Refused as e:
        raise (Conflict if e.state else ServiceError)(e.message, field=e.field) from None
    entry: dict[str, Any] = {"since": now, "base_version": row.version}
    if message:
        entry["message"] = message
    if health is not None:
        entry["health"] = (yaml.safe_load(text) or {}).get("health") or {}
    if feats:
        entry["features"] = feats
    new_text = pilot_text.with_trial(row.text, entry)
    nodes = base.pilot.nodes if base.pilot else []
    t = pilot.trial(checked(new_text))
    assert t is not None  # just put in
    changes = pilot.what_changes(base, t)
    version = config.apply(s, new_text, by, message or f"pilot trial on {', '.join(nodes)}")
    record(s, by.user, "pilot.applied", f"configuration version {version}: trial on the pilot ({', '.join(nodes)}): "
           f"{'; '.join(changes)}", at=now,
           data={"version": version, "base_version": row.version, "nodes": nodes, "changes": changes})
    return version


def _current_trial(s: Session) -> tuple[str, ConfigSpec]:
    row = config.get_version(s)
    spec = checked(row.text)
    if pilot.trial(spec) is None:
        raise Conflict("no trial is in progress on the pilot (yard cluster apply FILE --pilot starts one)",
                       field="pilot.trial")
    return row.text, spec


def promote(s: Session, by: Principal, message: str, now: float) -> int:
    """The trial's values everywhere, the trial ended: a new version.

    Raises:
        Conflict: no trial is in progress.
    """
    return _end_trial(s, by, message, now, promoted=True)


def rollback(s: Session, by: Principal, message: str, now: float) -> int:
    """The trial ended, every node on the configuration's own settings: a new version.

    Raises:
        Conflict: no trial is in progress.
    """
    return _end_trial(s, by, message, now, promoted=False)


def _end_trial(s: Session, by: Principal, message: str, now: float, *, promoted: bool) -> int:
    """Promote or roll back the trial in progress: the new version and its audit event."""
    _admin(by)
    text, spec = _current_trial(s)
    t = pilot.trial(spec)
    assert t is not None and spec.pilot is not None
    changes = pilot.what_changes(spec, t)
    if promoted:
        new_text, kind = pilot_text.promoted(text), "pilot.promoted"
        default = f"pilot trial of version {t.base_version} promoted to every node"
        what = f"the pilot's trial applies to every node: {'; '.join(changes)}"
    else:
        new_text, kind = pilot_text.without_trial(text), "pilot.rolled_back"
        default = f"pilot trial of version {t.base_version} rolled back"
        what = f"the pilot's trial is rolled back (was: {'; '.join(changes)})"
    version = config.apply(s, new_text, by, message or default)
    record(s, by.user, kind, f"configuration version {version}: {what}", at=now,
           data={"version": version, "base_version": t.base_version, "nodes": spec.pilot.nodes, "changes": changes})
    return version
