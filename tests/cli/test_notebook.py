"""`yard notebook` (cli/notebook.py, issue 38).

First the notebook job's script on its own, as the job would run it (a real JupyterLab, a stand-in
for the plane's one route it reads: the job's view, asked with the job's token): JupyterLab answers
on its port with the token the plane holds and refuses without it, serves the working directory,
and the token is in neither its command line nor its log. Then `yard notebook` end to end on a real
`yard up` (below).
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.api.test_dashboard_browser import login
from tests.browser import artifacts_dir, browser_available, chromium_path
from tests.cli.yard_process import stored, yard_process
from tests.plane import TWO_TEAMS, YARD
from trainyard.cli.notebook import jupyter_script, new_token, remote_port

VENV_BIN = str(Path(sys.executable).parent)
JOB_TOKEN = "ty_job-token-of-job-7"


def jupyter_missing() -> str | None:
    return None if Path(VENV_BIN, "jupyter-lab").exists() else "JupyterLab is not installed: pip install -e '.[test]'"


class _JobView(BaseHTTPRequestHandler):
    """GET /api/v1/jobs/7 with the job's token → its interactive record; anything else 403/404."""

    token = ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self.headers.get("Authorization") != f"Bearer {JOB_TOKEN}":
            self._send(403, {"detail": "not the job's token"})
        elif self.path != "/api/v1/jobs/7":
            self._send(404, {"detail": "no such job"})
        else:
            self._send(200, {"id": 7, "interactive": {"kind": "notebook", "token": self.token}})

    def _send(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def job_view() -> Iterator[tuple[str, str]]:
    handler = type("H", (_JobView,), {"token": new_token()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", handler.token
    server.shutdown()


def get(url: str, headers: dict | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_http(url: str, headers: dict, proc: subprocess.Popen, timeout: float = 90) -> float:
    """Seconds until `url` answers 200 (the process must stay up)."""
    t0 = time.monotonic()
    while True:
        assert proc.poll() is None, f"exited {proc.returncode}"
        try:
            if get(url, headers)[0] == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        assert time.monotonic() - t0 < timeout, f"{url} did not answer in {timeout}s"
        time.sleep(0.2)


def test_the_script_serves_jupyterlab_with_the_planes_token_and_shows_it_nowhere(tmp_path, job_view):
    reason = jupyter_missing()
    if reason:
        pytest.skip(reason)
    api, token = job_view
    port = remote_port()
    work = tmp_path / "work"
    work.mkdir()
    (work / "mine.txt").write_text("the owner's file\n")
    script = tmp_path / "script.sh"
    script.write_text(jupyter_script(["jupyter", "lab"], port))
    env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "TRAINYARD_API": api.rstrip("/"),
           "TRAINYARD_JOB_ID": "7", "TRAINYARD_TOKEN": JOB_TOKEN}
    log = tmp_path / "log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["/bin/sh", str(script)], cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        took = wait_http(f"{base}/api/status", {"Authorization": f"token {token}"}, proc)
        print(f"JupyterLab answered {took:.1f}s after the script started")
        assert get(f"{base}/api/status")[0] == 403  # no token: refused
        assert get(f"{base}/api/status", {"Authorization": "token not-the-token"})[0] == 403
        status, html = get(f"{base}/lab?token={token}")
        assert status == 200 and "<title>JupyterLab</title>" in html
        status, listing = get(f"{base}/api/contents", {"Authorization": f"token {token}"})
        assert status == 200 and "mine.txt" in {x["name"] for x in json.loads(listing)["content"]}
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()  # the script exec'd JupyterLab
        assert b"jupyter" in cmdline and token.encode() not in cmdline, cmdline
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    text = log.read_text()
    assert f"127.0.0.1:{port}/lab?token=..." in text and token not in text, text


def test_the_script_refuses_to_start_without_its_token(tmp_path, job_view):
    api, _ = job_view
    script = tmp_path / "script.sh"
    script.write_text(jupyter_script(["jupyter", "lab"], remote_port()))
    env = {"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(tmp_path), "TRAINYARD_API": api.rstrip("/"),
           "TRAINYARD_JOB_ID": "7", "TRAINYARD_TOKEN": "ty_someone-elses"}
    p = subprocess.run(["/bin/sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "could not read the notebook's token from the plane" in p.stderr, p.stderr
    env["TRAINYARD_TOKEN"] = JOB_TOKEN
    env["PATH"] = f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"
    script.write_text(jupyter_script(["no-such-jupyter", "lab"], remote_port()))
    p = subprocess.run(["/bin/sh", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 127 and "no-such-jupyter not found on the job's PATH" in p.stderr, p.stderr


# --- `yard notebook` end to end: a real `yard up` (local backend), JupyterLab in the job -------------


GRACE_S = 3  # the plane's connection grace here: a notebook must outlive it with no browser attached


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("notebook-config") / "cluster.yaml"
    cfg.write_text(TWO_TEAMS.read_text() + f"interactive: {{connection_grace: {GRACE_S}s}}\n")
    yield from yard_process(tmp_path_factory, "notebook", config_file=cfg)


@pytest.fixture(scope="module")
def people(yard) -> dict[str, str]:
    """Tokens: the notebook's owner (alice, vision), a teammate, a member of another team."""
    c = httpx.Client(base_url=yard.server.url, headers={"Authorization": f"Bearer {yard.server.token}"}, timeout=10)
    out = {}
    for name, user, team in (("owner", "alice", "vision"), ("teammate", "bob", "vision"), ("other", "nora", "nlp")):
        r = c.post("/api/v1/tokens", json={"user": user, "role": "member", "team": team})
        assert r.status_code == 201, r.text
        out[name] = r.json()["token"]
    return out


class Notebook:
    """`yard notebook` as a subprocess: its URL from stdout, its job id from stderr."""

    def __init__(self, yard, tok: str, *args: str, cwd: Path):
        self.err = cwd / "notebook.err"
        env = {**os.environ, "YARD_URL": yard.server.url, "YARD_TOKEN": tok,
               "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}  # as in an activated venv
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen([YARD, "notebook", *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                                         stderr=err, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stdout], daemon=True).start()

    def url(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout).strip()
        except queue.Empty:
            raise AssertionError(f"no URL in {timeout}s; stderr:\n{self.err.read_text()}") from None

    def job_id(self) -> int:
        m = re.search(r"Pending job allocation (\d+)", self.err.read_text())
        assert m, self.err.read_text()
        return int(m.group(1))


@pytest.mark.slow
@pytest.mark.xdist_group("notebook-yard-up")
def test_yard_notebook_serves_jupyterlab_through_the_forwarded_port_and_the_dashboard_links_it(
        yard, people, tmp_path):
    reason = jupyter_missing()
    if reason:
        pytest.skip(reason)
    (tmp_path / "analysis.ipynb").write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                         "nbformat_minor": 5}))
    t0 = time.monotonic()
    nb = Notebook(yard, people["owner"], "-G", "1", "-A", "vision", cwd=tmp_path)
    try:
        url = nb.url(timeout=120)
        took = time.monotonic() - t0
        print(f"yard notebook printed its URL {took:.1f}s after it started")
        m = re.fullmatch(r"http://127\.0\.0\.1:(\d+)/lab\?token=([A-Za-z0-9_-]{40,})", url)
        assert m, url
        base, token = f"http://127.0.0.1:{m.group(1)}", m.group(2)
        status, html = get(url)
        assert status == 200 and "<title>JupyterLab</title>" in html
        status, body = get(f"{base}/api/status", {"Authorization": f"token {token}"})
        assert status == 200 and "started" in json.loads(body)
        assert get(f"{base}/api/status")[0] == 403  # the forwarded port alone is not enough: the token
        status, listing = get(f"{base}/api/contents", {"Authorization": f"token {token}"})
        assert "analysis.ipynb" in {x["name"] for x in json.loads(listing)["content"]}  # the job's working dir
        job = nb.job_id()
        time.sleep(GRACE_S + 2)  # no browser, no request: yard notebook's own terminal keeps it attached
        shown = json.loads(yard("show", str(job), "--json", env_extra={"YARD_TOKEN": people["owner"]}).stdout)
        assert shown["state"] == "RUNNING" and shown["class"] == "interactive"
        assert shown["interactive"] == {"kind": "notebook", "port": shown["interactive"]["port"], "token": token,
                                        "url": url}
        for who in ("teammate", "other"):
            p = yard("show", str(job), "--json", env_extra={"YARD_TOKEN": people[who]}, ok=False)
            assert token not in p.stdout + p.stderr, who
        log = yard("logs", str(job)).stdout
        assert "/lab?token=..." in log and token not in log, log
        browse_the_link(yard.server.url, people, job, url)
        nb.proc.send_signal(signal.SIGINT)
        assert nb.proc.wait(timeout=30) == 0, nb.err.read_text()
        assert "Relinquishing job allocation" in nb.err.read_text()
        assert json.loads(yard("show", str(job), "--json").stdout)["state"] == "COMPLETED"
    finally:
        if nb.proc.poll() is None:
            nb.proc.kill()
            nb.proc.wait()


def browse_the_link(server: str, people: dict[str, str], job: int, url: str) -> None:
    """The dashboard's job page in headless Chromium: the owner follows "Open notebook" to
    JupyterLab; a member of another team sees that it is a notebook, and no link."""
    reason = browser_available()
    if reason:
        print(f"the dashboard's part not run: {reason}")
        return
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium_path()), headless=True)
        try:
            page = login(browser, server, people["owner"])
            page.goto(f"{server}/ui/jobs/{job}")
            link = page.locator("#open-notebook")
            assert link.get_attribute("href") == url
            with page.context.expect_page() as opened:
                link.click()
            lab = opened.value
            lab.wait_for_selector("#jp-main-dock-panel", timeout=60_000)  # JupyterLab's main panel, drawn
            lab.get_by_text("analysis.ipynb").first.wait_for(timeout=60_000)  # its file browser: the job's dir
            assert "JupyterLab" in lab.title(), lab.title()
            lab.screenshot(path=str(artifacts_dir() / "notebook-jupyterlab.png"))
            other = login(browser, server, people["other"])
            other.goto(f"{server}/ui/jobs/{job}")
            assert other.locator("td.interactive").get_attribute("data-kind") == "notebook"
            assert other.locator("#open-notebook").count() == 0
            assert url.split("token=")[1] not in other.content()
        finally:
            browser.close()


@pytest.mark.slow
@pytest.mark.xdist_group("notebook-yard-up")
def test_a_notebook_whose_client_is_gone_ends_after_the_connection_grace(yard, people, tmp_path):
    reason = jupyter_missing()
    if reason:
        pytest.skip(reason)
    nb = Notebook(yard, people["owner"], "-G", "1", "-A", "vision", cwd=tmp_path)
    try:
        nb.url(timeout=120)
        job = nb.job_id()
        nb.proc.kill()  # no release: as a laptop that went to sleep
        nb.proc.wait()
        t0 = time.monotonic()
        while (j := json.loads(yard("show", str(job), "--json").stdout))["state"] in ("RUNNING", "COMPLETING"):
            assert time.monotonic() - t0 < GRACE_S + 20, j
            time.sleep(0.3)
        assert (j["state"], j["reason"]) == ("CANCELLED", "ConnectionLost"), j
        assert time.monotonic() - t0 >= GRACE_S - 1.5  # not at once: after the grace
    finally:
        if nb.proc.poll() is None:
            nb.proc.kill()
            nb.proc.wait()


@pytest.mark.xdist_group("notebook-yard-up")
def test_a_notebook_that_cannot_start_says_why_and_bad_options_are_refused(yard, people, tmp_path):
    env = {"YARD_TOKEN": people["owner"]}
    p = yard("notebook", "-G", "1", "-A", "vision", "--jupyter", "no-such-jupyter lab", env_extra=env, ok=False)
    assert p.returncode == 1, p.stderr
    assert "ended before JupyterLab answered: FAILED" in p.stderr, p.stderr
    assert "no-such-jupyter not found on the job's PATH" in p.stderr, p.stderr  # the tail of its log
    assert p.stdout == ""  # no URL
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        p = yard("notebook", "-G", "1", "-A", "vision", "--port", str(taken.getsockname()[1]), env_extra=env, ok=False)
    assert p.returncode == 2 and "--port: cannot listen on 127.0.0.1:" in p.stderr, p.stderr
    p = yard("notebook", "-G", "1", "-A", "vision", "--jupyter", " ", env_extra=env, ok=False)
    assert p.returncode == 2 and "--jupyter" in p.stderr, p.stderr
    p = yard("notebook", "-G", "1", "-A", "vision", "--array", "0-3", env_extra=env, ok=False)
    assert p.returncode == 2 and "--array" in p.stderr, p.stderr  # a batch-only option of yard submit
    assert not [j for j in stored(yard) if j["state"] in ("PENDING", "RUNNING")]  # nothing left behind
