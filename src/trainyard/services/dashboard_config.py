"""The dashboard's configuration page (`/ui/config`): the configuration in force, its versions and
a diff, and the pilot pool's trial (a what-if's table rows: sim/side_by_side.py, shared with the CLI).

Each part is what the API answers for the same caller (`GET /api/v1/cluster/config`, `/versions`,
`/diff`, `GET /api/v1/cluster/pilot/status`, `POST /api/v1/cluster/config/what-if`): this module
calls the same services, so the page and the API never disagree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from trainyard.services import config, pilot_status
from trainyard.services.config import ConfigVersion

def page(s: Session, cfg: ConfigVersion, now: float, data_dir: Path | None, diff_from: int | None) -> dict[str, Any]:
    """The page's data: the version in force, the history (newest first), the diff from
    `diff_from` to the version in force (None: no diff asked), and the pilot's status.

    Raises:
        NotFound: `diff_from` names no stored version (as `GET /diff`).
    """
    diff = None
    if diff_from is not None:
        diff = {"from": diff_from, "to": cfg.version, "text": config.diff(s, diff_from, cfg.version)}
    return {"current": {"version": cfg.version, "text": cfg.text, "author": cfg.author,
                        "created_at": cfg.created_at, "message": cfg.message},
            "versions": config.history(s), "diff": diff,
            "pilot": pilot_status.status(s, cfg, now, data_dir)}
