"""A real `yard up` process for a test module, and `yard` commands run against it as a person types
them (subprocesses with the server's URL and token in their environment)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

import httpx

from tests.plane import YARD, YardServer


def yard_process(tmp_path_factory, name: str = "cli", config_file: Path | None = None) -> Iterator:
    """Yields `run(*args, ok=True, env_extra=None, cwd=None)`; cancels what is left and stops the server after."""
    server = YardServer(tmp_path_factory.mktemp(name) / "yard", **({"config_file": config_file} if config_file else {}))
    server.data_dir.mkdir()
    server.start()
    env = {**os.environ, "YARD_URL": server.url, "YARD_TOKEN": server.token}

    def run(*args: str, ok: bool = True, env_extra: dict | None = None, cwd: Path | None = None):
        p = subprocess.run([YARD, *args], capture_output=True, text=True, env={**env, **(env_extra or {})},
                           cwd=cwd or server.data_dir, timeout=60)
        if ok:
            assert p.returncode == 0, f"yard {' '.join(args)} → {p.returncode}\n{p.stdout}\n{p.stderr}"
        return p

    run.server = server  # type: ignore[attr-defined]
    yield run
    for j in json.loads(run("queue", "--json").stdout):
        run("cancel", str(j["id"]), ok=False)
    # a second for the plane to end what it was told to cancel before it stops, no longer than
    # that takes (the whole second was waited out by every module, most of which leave nothing running)
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=10) as c:
        deadline = time.monotonic() + 1
        while c.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"] and time.monotonic() < deadline:
            time.sleep(0.1)
    server.terminate()


def stored(yard) -> list[dict]:
    """Every job the plane has stored, in any state."""
    return json.loads(yard("queue", "-t", "all", "--json").stdout)


def job_id_of(p: subprocess.CompletedProcess) -> int:
    assert p.stdout.startswith("Submitted job "), p.stdout
    return int(p.stdout.split()[-1])
