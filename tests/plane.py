"""Starting a real control plane for tests: store, loop, local backend, and an API client per token.

`Plane` runs everything in this process (FastAPI's TestClient over the real app, the real loop
thread, real rank processes); tests that kill the control plane start `yard up` as a process
instead (`tests/control/lifecycle/test_restart.py`).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx
from fastapi.testclient import TestClient

from trainyard.api.app import create_app
from trainyard.contracts import JobDir
from trainyard.control.loop.orchestrator import LoopParams
from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane
from trainyard.services import auth

FIXTURES = Path(__file__).parent / "fixtures"
TWO_TEAMS = FIXTURES / "two_teams.yaml"
PY = sys.executable

# Tests that are not about identity run their jobs as the account that runs the tests (root in
# CI), and say so in the configuration they store: run_as (token users like "alice" have no
# account here) and, for root, allow_root_jobs. The identity tests (tests/control/test_owners.py,
# tests/backends/slurm/test_slurm_owners.py) start their planes without these and with real accounts.
TEST_ACCOUNT = pwd.getpwuid(os.geteuid()).pw_name
TEST_IDENTITY: dict[str, Any] = {"run_as": TEST_ACCOUNT, "allow_root_jobs": True if os.geteuid() == 0 else None}
# The token users the tests name. A host may have Unix accounts of these names (a login node with
# LDAP users has an alice), and "user U runs as account U" comes before run_as: the test
# configuration maps each of them to the test's account, so the helpers' run_as is what their
# jobs run as whatever accounts the host has (issue 35, point 7). The identity tests map their own.
TEST_USERS = ("admin", "alice", "ann", "bob", "carol", "dave", "eve", "mallory", "nora", "olga", "olga2", "u",
              "vera", "vic", "victor", "watcher")
TEST_USERS_MAP = {u: TEST_ACCOUNT for u in TEST_USERS}
IDENTITY_YAML = ("".join(f"{k}: {json.dumps(v)}\n" for k, v in TEST_IDENTITY.items() if v is not None)
                 + f"users: {json.dumps(TEST_USERS_MAP)}\n")


def with_test_users(text: str) -> str:
    """`text` with TEST_USERS mapped to the test's account, unless it maps users of its own."""
    if re.search(r"^users:", text, re.MULTILINE):
        return text
    from trainyard.services.config import with_top_level

    return with_top_level(text, {"users": TEST_USERS_MAP})


def identity_config_text(path: Path = TWO_TEAMS) -> str:
    """A configuration file's text with TEST_IDENTITY in it: what a test applies through the API
    when its plane's jobs must go on running as the test's account."""
    from trainyard.services.config import with_top_level

    return with_test_users(with_top_level(path.read_text(), {k: v for k, v in TEST_IDENTITY.items() if v is not None}))


YARD_UP_IDENTITY = ("--run-as", TEST_ACCOUNT, *(("--allow-root-jobs",) if os.geteuid() == 0 else ()))


class Plane:
    def __init__(self, data_dir: Path, *, config: Path | None = TWO_TEAMS, db_url: str | None = None,
                 tick_s: float = 0.1, kill_wait_s: float = 3.0, start: bool = True, **kw: Any):
        text = config.read_text() if config is not None else None
        if text is not None and kw.get("run_as", TEST_ACCOUNT) == TEST_ACCOUNT:
            text = with_test_users(text)
        self.cp = build_plane(PlaneSettings(data_dir, db_url=db_url, config_text=text,
                                            loop_params=LoopParams(tick_s=tick_s, kill_wait_s=kill_wait_s,
                                                                   retry_backoff_s=0.5, hung_after_s=1.0),
                                            **{**TEST_IDENTITY, **kw}))
        self.app = create_app(self.cp)
        self.http = TestClient(self.app)
        self.admin_token = (self.cp.data_dir / "admin.token").read_text().strip()
        self.admin = self.client(self.admin_token)
        if start:
            self.cp.start()

    def client(self, token: str) -> TestClient:
        c = TestClient(self.app)
        c.headers["Authorization"] = f"Bearer {token}"
        return c

    def token(self, user: str, role: str, team: str | None = None) -> str:
        r = self.admin.post("/api/v1/tokens", json={"user": user, "role": role, "team": team})
        assert r.status_code == 201, r.text
        return r.json()["token"]

    def as_user(self, user: str, role: str, team: str | None = None) -> TestClient:
        return self.client(self.token(user, role, team))

    def submit(self, client: TestClient | None = None, **body: Any) -> dict[str, Any]:
        body.setdefault("workdir", str(self.cp.data_dir))
        r = (client or self.admin).post("/api/v1/jobs", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def job(self, job_id: int) -> dict[str, Any]:
        r = self.admin.get(f"/api/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait(self, job_id: int, pred: Callable[[dict[str, Any]], bool] | str | tuple[str, ...],
             timeout: float = 30.0) -> dict[str, Any]:
        """Poll a job until `pred` holds (a state name or tuple of names, or a function)."""
        pred = job_predicate(pred)
        deadline = time.monotonic() + timeout
        while True:
            j = self.job(job_id)
            if pred(j):
                return j
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} still {j['state']} ({j['reason']}) after {timeout}s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Cancel what still runs, wait for it, stop the plane: tests leave no process behind."""
        try:
            for j in self.admin.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
                self.admin.post(f"/api/v1/jobs/{j['id']}/cancel")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                left = self.admin.get("/api/v1/jobs", params={"state": "RUNNING,COMPLETING"}).json()["jobs"]
                if not left:
                    break
                time.sleep(0.1)
        finally:
            self.cp.stop()
        stats = self.cp.loop.stats
        assert stats.errors == 0, f"the control loop failed {stats.errors} times; last: {stats.last_error}"


def job_predicate(pred: Callable[[dict[str, Any]], bool] | str | tuple[str, ...]) -> Callable[[dict[str, Any]], bool]:
    """A job predicate from a state name, a tuple of names, or a function (returned as it is)."""
    if isinstance(pred, str):
        pred = (pred,)
    if isinstance(pred, tuple):
        states = pred
        return lambda j: j["state"] in states
    return pred


def script(body: str) -> list[str]:
    """A rank command: Python code run by this interpreter."""
    return [PY, "-c", body]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


YARD = str(Path(sys.executable).parent / "yard")


class YardServer:
    """`yard up` as a real process on a data dir: start it, kill -9 it, start it again."""

    def __init__(self, data_dir: Path, *, config_file: Path = TWO_TEAMS, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None, identity: bool = True):
        self.data_dir = data_dir
        self.config_file = config_file
        self.identity = YARD_UP_IDENTITY if identity else ()  # False: a test that runs no job
        self.args = args  # more `yard up` options (e.g. --backend slurm)
        self.env = env  # the server's environment (default: this process's)
        self.proc: subprocess.Popen | None = None

    def start(self, config: bool = True) -> httpx.Client:
        (self.data_dir / "server.json").unlink(missing_ok=True)
        # no login socket in /run unless the test gives one (a killed plane would leave its socket there)
        no_socket = () if "--login-socket" in self.args else ("--login-socket", "none")
        args = [YARD, "up", "--data-dir", str(self.data_dir), "--port", "0", "--tick", "0.2", *self.identity,
                *no_socket, *self.args]
        if config:
            args += ["--config", str(self.test_config() if self.identity else self.config_file)]
        with open(self.data_dir / "up.log", "a") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=self.env)
        deadline = time.monotonic() + 30
        while not (self.data_dir / "server.json").exists():
            assert self.proc.poll() is None, (self.data_dir / "up.log").read_text()
            assert time.monotonic() < deadline, "yard up did not start"
            time.sleep(0.05)
        self.url = url = json.loads((self.data_dir / "server.json").read_text())["url"]
        self.token = token = (self.data_dir / "admin.token").read_text().strip()
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        while True:
            try:
                c.get("/healthz")
                return c
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)

    def test_config(self) -> Path:
        """The configuration file with TEST_USERS mapped (`with_test_users`), written beside the
        data dir afresh at every start (a test may change its file between starts)."""
        copy = self.data_dir.parent / f"{self.data_dir.name}-{self.config_file.name}"
        copy.write_text(with_test_users(self.config_file.read_text()))
        return copy

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def job_dir(data_dir: Path, job_id: int) -> Path:
    """A job's directory (`contracts.JobDir`: `jobs/<id>-<key>`), its key read from the plane's
    SQLite store (read-only, beside the running plane): known from the job's submission on, before
    the directory exists."""
    with sqlite3.connect(f"file:{Path(data_dir) / 'trainyard.db'}?mode=ro", uri=True) as db:
        row = db.execute("SELECT dir_key FROM jobs WHERE id = ?", (job_id,)).fetchone()
    assert row is not None, f"no job {job_id} in {data_dir}"
    return JobDir.of(data_dir, job_id, row[0]).root


def wait_until(pred: Callable[[], Any], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


def node_info(p: Plane, name: str) -> dict[str, Any]:
    """One node as the API shows it (state, reason, GPUs)."""
    return p.admin.get(f"/api/v1/nodes/{name}").json()


__all__ = ["Plane", "YardServer", "TWO_TEAMS", "script", "alive", "auth", "wait_until", "node_info", "job_dir"]
