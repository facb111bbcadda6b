"""The server side of `yard up`: uvicorn with a stop that cannot hang, and `--wait-ready`.

Stopping: on SIGTERM/SIGINT the plane first turns `/readyz` off and ends the log streams (a
`yard logs -f` lasts as long as its job and would otherwise hold the shutdown), then uvicorn
stops accepting, gives open requests `GRACEFUL_S` seconds, and the plane stops its loop. Jobs
keep running; the next `yard up` re-attaches them.

`--wait-ready` (as `pg_ctl start -w`): start the same `yard up` in the background, in a session
of its own with its output in `DATA_DIR/up.log`, and return once `/readyz` answers 200 (exit 0,
the URL printed), or when it exited or did not get ready in time (exit 1, the log's tail printed).
The background plane gets this command line and environment: the store's URL comes with
`--db-file` (a path) or `YARD_DB_URL`, never on the command line (`yard up` refuses a password in
`--db` before it starts anything: store/url.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import uvicorn

GRACEFUL_S = 5
# How long an idle keep-alive connection stays open. uvicorn's 5 s default races clients that keep
# connections (httpx, requests, the dashboard's browser): one that sends on a connection just as
# the server closes it gets a bare ReadError, which under a loaded machine (a client's next request
# more than 5 s after its last) happened twice in a 10 s load bench (tests/api/test_load.py). 75 s
# is nginx's default, longer than a client pool's idle limit, so the client closes first.
KEEP_ALIVE_S = 75


class GracefulServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, cp: Any) -> None:
        """`cp`: the ControlPlane whose readiness and log streams end first on a stop."""
        super().__init__(config)
        self.cp = cp

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.cp.liveness.shutting_down = True
        super().handle_exit(sig, frame)


def start_and_wait(argv: list[str], data_dir: Path, timeout_s: float) -> int:
    """Start `argv` minus --wait-ready/--ready-timeout in the background; wait for /readyz."""
    import httpx

    args, skip = [], False
    for a in argv[1:]:
        if skip:
            skip = False
            continue
        if a == "--wait-ready" or a.startswith("--ready-timeout="):
            continue
        if a == "--ready-timeout":
            skip = True
            continue
        args.append(a)
    data_dir = Path(data_dir).expanduser().resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    info = data_dir / "server.json"
    log_path = data_dir / "up.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "trainyard.cli.main", *args], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    why = f"not ready after {timeout_s:g} s"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            why = f"yard up exited with {proc.returncode}"
            break
        try:
            meta = json.loads(info.read_text())
            if meta.get("pid") == proc.pid:
                r = httpx.get(meta["url"] + "/readyz", timeout=5)
                if r.status_code == 200:
                    print(f"trainyard control plane ready at {meta['url']} (pid {proc.pid}; log {log_path})")
                    return 0
                why = f"not ready: {r.json().get('detail')}"
        except (OSError, ValueError, KeyError, httpx.HTTPError):
            pass
        time.sleep(0.1)
    tail = log_path.read_text(errors="replace")[-2000:] if log_path.exists() else ""
    print(f"error: {why}; the last lines of {log_path}:\n{tail}", file=sys.stderr)
    return 1
