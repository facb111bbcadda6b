"""A control plane started as a plain user (a real `yard up` run as a throwaway account): it runs
every job as itself, says so at start, and refuses the jobs of a token user who is someone else."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts, python_for_accounts, shared_dir
from tests.plane import TWO_TEAMS

pytestmark = ROOT_ONLY


@pytest.fixture(scope="module")
def plain() -> Iterator[tuple[Accounts, Path, list[str]]]:
    py = python_for_accounts()
    if py is None:
        pytest.skip("no Python interpreter of this version that other accounts may run")
    with accounts({"alice": [], "bob": []}, []) as acc, shared_dir("ty-plain-") as d:
        yield acc, d, ["runuser", "-u", acc.user("alice"), "--", "env", f"PYTHONPATH={py[1]}", py[0], "-m",
                       "trainyard.cli.main"]


def test_a_plane_run_as_a_plain_user_runs_its_own_jobs_and_refuses_others(plain):
    acc, d, yard = plain
    data = d / "yard"
    data.mkdir()
    os.chown(data, acc.uid("alice"), -1)
    proc = subprocess.Popen([*yard, "up", "--data-dir", str(data), "--port", "0", "--nodes", "1",
                             "--gpus-per-node", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (data / "server.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.1)
        url = json.loads((data / "server.json").read_text())["url"]
        # server.json names the address as soon as it is bound; the plane serves once /readyz
        # answers (what `yard up --wait-ready` waits for). Under load the two are seconds apart.
        while not _ready(url):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        for name in ("server.json", "admin.token", "trainyard.db", "store-seen.json"):
            assert stat.S_IMODE((data / name).stat().st_mode) == 0o600, name
        admin = httpx.Client(base_url=url, timeout=30,
                             headers={"Authorization": f"Bearer {(data / 'admin.token').read_text().strip()}"})
        # The admin token's user has no account: on a plain plane it runs as the plane's account.
        r = admin.post("/api/v1/jobs", json={"command": ["/bin/sh", "-c", "id -un"], "workdir": str(data)})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        while (j := admin.get(f"/api/v1/jobs/{jid}").json())["state"] not in ("COMPLETED", "FAILED"):
            assert time.monotonic() < deadline + 60, j
            time.sleep(0.1)
        log = admin.get(f"/api/v1/jobs/{jid}/logs").text
        assert j["state"] == "COMPLETED" and acc.user("alice") in log.splitlines(), log
        # A token user who is another account (bob) is refused, clearly.
        tok = admin.post("/api/v1/tokens", json={"user": acc.user("bob"), "role": "member", "team": "default"})
        bob = httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {tok.json()['token']}"})
        r = bob.post("/api/v1/jobs", json={"command": ["true"], "workdir": str(data)})
        assert r.status_code == 403 and "not root, so it runs only its own jobs" in r.json()["detail"], r.text
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert f"this control plane runs as '{acc.user('alice')}', not root" in out, out


def test_a_plain_plane_told_to_run_jobs_as_someone_else_exits_2_naming_the_entry(plain):
    acc, d, yard = plain
    data = d / "yard2"
    data.mkdir()
    os.chown(data, acc.uid("alice"), -1)
    cfg = d / "bad.yaml"
    cfg.write_text(TWO_TEAMS.read_text() + f"users:\n  carol: {acc.user('bob')}\n")
    r = subprocess.run([*yard, "up", "--data-dir", str(data), "--port", "0", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "users.carol" in r.stderr and "not this control plane's account" in r.stderr, r.stderr


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/readyz", timeout=5).status_code == 200
    except httpx.TransportError:
        return False
