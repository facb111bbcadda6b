"""`yard up --config FILE` against what is stored: a file never silently reverts live changes.

The configuration is versioned in the store (`services/config.py`), and it changes while the plane
runs: `yard teams set`, `yard cluster apply`, `yard cluster rollback`. A unit file that always
starts `yard up --config /etc/trainyard/cluster.yaml` used to store the file as a new version at
every restart, so each restart quietly undid everything changed since. Now the file is applied
when it is the truth, and refused when it would revert:

- nothing stored yet, or the stored configuration is the file's (comments and layout aside: the
  stored one written back with `yard cluster get > FILE`): nothing to revert;
- every version since the file was last given to `yard up` is the plane's own (`yard-up`: a
  `--policy`, `--run-as` or default configuration, which never carry an operator's edit): the file
  is applied (the operator edited it);
- a version since then is someone's (an admin through the API or the CLI): refused (`StaleFile`,
  exit 2 from `yard up`), with the diff from the stored version to the file and the two ways
  out: `--config-wins` (store the file anyway; the old versions stay for `yard cluster rollback`),
  or write the stored one to the file first (`yard cluster get > FILE`).
"""

from __future__ import annotations

import difflib

import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services.errors import ServiceError
from trainyard.store.models import ConfigVersionRow

PLANE = "yard-up"  # the author of what `yard up` itself stores (control/lifecycle/plane.py's principal)
FROM_FILE = "configuration given to yard up"  # the message of a version stored from --config (config.given_text)
DIFF_LINES = 60  # of the diff shown in the refusal (the rest is counted)


def _same(a: str, b: str) -> bool:
    """The same configuration, comments and layout aside."""
    try:
        same: bool = yaml.safe_load(a) == yaml.safe_load(b)  # yaml is untyped: plain Python values
        return same
    except yaml.YAMLError:
        return False


class StaleFile(ServiceError):
    """The file would revert live changes; the message says which, and how to go on."""


def check(s: Session, text: str, name: str = "the file") -> None:
    """Refuse `text` (what `yard up --config` would store from the file `name`) when versions
    made since the file was last applied would be reverted by it (see the module docstring).

    Raises:
        StaleFile: field `config`.
    """
    rows = s.execute(select(ConfigVersionRow.version, ConfigVersionRow.author, ConfigVersionRow.message)
                     .order_by(ConfigVersionRow.version)).all()
    if not rows:
        return
    newest = s.get(ConfigVersionRow, rows[-1].version)
    if newest is None or newest.text == text or _same(newest.text, text):
        return  # the same settings (the stored one written back, `yard cluster get`'s header comment and all)
    last_file = max((r.version for r in rows if r.author == PLANE and (r.message or "").startswith(FROM_FILE)),
                    default=0)
    live = [r for r in rows if r.version > last_file and r.author != PLANE]
    if not live:
        return
    changes = ", ".join(f"{r.version} by {r.author} ({r.message or 'no message'})" for r in live[-5:])
    more = f" and {len(live) - 5} more" if len(live) > 5 else ""
    lines = list(difflib.unified_diff(newest.text.splitlines(True), text.splitlines(True),
                                      fromfile=f"stored version {newest.version}", tofile=name))
    shown = "".join(lines[:DIFF_LINES]) + (f"... {len(lines) - DIFF_LINES} more lines\n" if len(lines) > DIFF_LINES
                                           else "")
    since = f"since {name} was last given to yard up (version {last_file})" if last_file else \
        f"and {name} was never given to yard up before"
    raise StaleFile(
        f"the stored configuration has changes made {since}: version{'s' if len(live) > 1 else ''} "
        f"{changes}{more}. Starting with {name} would revert them:\n{shown}"
        f"Either start with --config-wins to store {name} anyway (the old versions stay: yard cluster history, "
        f"yard cluster rollback), or write the stored configuration to the file first: "
        f"yard cluster get > {name}", field="config")
