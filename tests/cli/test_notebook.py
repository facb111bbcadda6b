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
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

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
