"""`yard audit`: the audit trail as JSON lines, one change a line (services/audit.py lists what is kept).

    yard audit --since now-30days > audit.jsonl
    yard audit --since 2026-11-01 --until 2026-12-01 --kind quota.changed,config.applied
    yard audit --actor alice

Each line: id, time (UNIX seconds) and `iso` (local time), actor, kind, job_id, node, message,
data (with `before` and `after` where a value changed). Lines are written as the pages arrive.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Optional

import typer

from trainyard.cli.acct import when
from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.spec.parsing import parse_time

PAGE = 5000


def audit(
    since: Optional[str] = typer.Option(None, "--since", "-S", help="from (default: 7 days ago): now-30days, "
                                        "2026-11-01, 11/01 …"),
    until: Optional[str] = typer.Option(None, "--until", "-E", help="to (default: now)"),
    kind: Optional[str] = typer.Option(None, "--kind", help="only these kinds (comma-separated)"),
    actor: Optional[str] = typer.Option(None, "--actor", help="only these actors (comma-separated)"),
) -> None:
    """Export the audit trail (every change, who, when, before/after) as JSON lines."""
    now = time.time()
    times = {}
    for option, value in (("--since", since), ("--until", until)):
        try:
            times[option] = None if value is None else parse_time(value, now)
        except ValueError as e:
            fail(f"{option}: {e}")
    start = times["--since"] if times["--since"] is not None else now - 7 * 86400
    end = times["--until"] if times["--until"] is not None else now
    if end < start:
        fail(f"--until ({when(end)}) is before --since ({when(start)})")
    params = {"since": f"@{start!r}", "until": f"@{end!r}", **({"kind": kind} if kind else {}),
              **({"actor": actor} if actor else {})}
    c, after, out = Client(), 0, sys.stdout
    while True:
        page = c.get("/api/v1/audit", params={**params, "after": after, "limit": PAGE})
        for ev in page["events"]:
            out.write(json.dumps({"id": ev["id"], "time": ev["time"], "iso": when(ev["time"]), "actor": ev["actor"],
                                  "kind": ev["kind"], "job_id": ev["job_id"], "node": ev["node"],
                                  "message": ev["message"], "data": ev["data"]}) + "\n")
        out.flush()
        if page["next_after"] is None:
            return
        after = page["next_after"]
