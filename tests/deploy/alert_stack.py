"""A real Prometheus and Alertmanager for a live `yard up`, run from deploy/prometheus's example
files (tests/deploy/test_alerts_live.py).

The examples are used as they are but for what must differ on a test machine: addresses (free
loopback ports), paths (the test's directory), the intervals and waits (seconds, not minutes). Each
change names a key the example must already have, so an example that loses or renames one fails
the test instead of being silently completed by it. Debian's packages (`prometheus`,
`prometheus-alertmanager`) come from scripts/alertmanager-setup.sh, run once when missing and the
tests run as root; otherwise the tests skip, saying why.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.setup_once import install_once

ROOT = Path(__file__).parents[2]
PROM = ROOT / "deploy" / "prometheus"
SETUP = ROOT / "scripts" / "alertmanager-setup.sh"
TOOLS = ("prometheus", "prometheus-alertmanager")


def tools_or_skip() -> dict[str, str]:
    """The two binaries, installed by scripts/alertmanager-setup.sh if need be; a skip saying why not."""
    failed = install_once(SETUP, lambda: any(shutil.which(t) is None for t in TOOLS),
                          "TRAINYARD_ALERTMANAGER_NO_INSTALL")
    found = {t: shutil.which(t) for t in TOOLS}
    missing = [t for t, p in found.items() if p is None]
    if missing:
        why = failed or "not run: it needs root (and TRAINYARD_ALERTMANAGER_NO_INSTALL unset)"
        pytest.skip(f"{', '.join(missing)} not installed and scripts/{SETUP.name} (root, apt-get) could not "
                    f"install them: {why}")
    return {t: p for t, p in found.items() if p is not None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _set(doc: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    """doc[path] = value, where the example already has that key (else KeyError/IndexError)."""
    node: Any = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]]  # noqa: B018 - the key must exist in the example
    node[path[-1]] = value


def prometheus_config(*, plane: str, token_file: Path, rules: list[Path], alertmanager: str,
                      interval_s: float, evaluation_s: float | None = None) -> dict[str, Any]:
    """deploy/prometheus/prometheus.yml for this machine: `plane` and `alertmanager` as host:port,
    scraping every `interval_s` and evaluating the rules every `evaluation_s` (default the same)."""
    doc = yaml.safe_load((PROM / "prometheus.yml").read_text())
    _set(doc, ("global", "scrape_interval"), f"{interval_s:g}s")
    _set(doc, ("global", "evaluation_interval"), f"{round(1000 * (evaluation_s or interval_s))}ms")  # "0.5s" is no duration to Prometheus
    by_name = {p.name: p for p in rules}
    assert sorted(Path(p).name for p in doc["rule_files"]) == sorted(by_name)
    _set(doc, ("rule_files",), [str(by_name[Path(p).name]) for p in doc["rule_files"]])
    _set(doc, ("alerting", "alertmanagers", 0, "static_configs", 0, "targets"), [alertmanager])
    job = doc["scrape_configs"][0]
    assert job["job_name"] == "trainyard"
    _set(job, ("authorization", "credentials_file"), str(token_file))
    _set(job, ("static_configs", 0, "targets"), [plane])
    return doc


def alertmanager_config(*, webhook: str, group_wait_s: float, group_interval_s: float) -> dict[str, Any]:
    """deploy/prometheus/alertmanager.yml for this machine: every receiver's URL on `webhook`
    (keeping its path, so the test sees which receiver was told), the waits in seconds."""
    doc = yaml.safe_load((PROM / "alertmanager.yml").read_text())
    _set(doc, ("route", "group_wait"), f"{group_wait_s:g}s")
    _set(doc, ("route", "group_interval"), f"{group_interval_s:g}s")
    for i, sub in enumerate(doc["route"].get("routes", [])):
        if "group_wait" in sub:
            _set(doc, ("route", "routes", i, "group_wait"), f"{group_wait_s:g}s")
    for r in doc["receivers"]:
        for w in r.get("webhook_configs", []):
            w["url"] = webhook.rstrip("/") + "/" + w["url"].split("/", 3)[3]
    return doc


def rules_for(tmp: Path, alert: str, for_: str) -> list[Path]:
    """Copies of the repository's rule files in `tmp`, `alert`'s `for:` set to `for_` (a YAML
    rewrite of that one field), everything else as it is."""
    out = []
    for src in sorted((PROM / "rules").glob("*.yml")):
        doc = yaml.safe_load(src.read_text())
        hits = [r for g in doc["groups"] for r in g["rules"] if r.get("alert") == alert]
        for r in hits:
            r["for"] = for_
        dst = tmp / src.name
        dst.write_text(yaml.safe_dump(doc, sort_keys=False) if hits else src.read_text())
        out.append(dst)
    return out


@dataclass
class Post:
    at: float  # time.time() on arrival
    path: str
    body: dict[str, Any]


@dataclass
class Webhook:
    """An HTTP receiver on a loopback port recording every POST (Alertmanager's webhook JSON)."""

    posts: list[Post] = field(default_factory=list)

    def __post_init__(self) -> None:
        posts, cond = self.posts, threading.Condition()
        self.cond = cond

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                at = time.time()
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with cond:
                    posts.append(Post(at, self.path, body))
                    cond.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, pred: Any, timeout: float) -> Post:
        """The first POST for which pred(post) holds, waiting up to `timeout` s for it."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for p in self.posts:
                    if pred(p):
                        return p
                left = deadline - time.monotonic()
                assert left > 0, f"no such POST in {timeout:g} s; got {[(p.path, p.body.get('status')) for p in self.posts]}"
                self.cond.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Daemon:
    """A server process with its log in `log`, ready once GET `ready_url` answers 200."""

    def __init__(self, args: list[str], log: Path, ready_url: str, timeout: float = 30.0):
        self.log = log
        with open(log, "w") as fh:
            self.proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"{args[0]} exited {self.proc.returncode}:\n{log.read_text()[-3000:]}"
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{args[0]} not ready in {timeout:g} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_alertmanager(binary: str, workdir: Path, config: dict[str, Any]) -> tuple[Daemon, str]:
    """Alertmanager on a free loopback port, clustering off (no gossip port); returns it and host:port."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    addr = f"127.0.0.1:{free_port()}"
    d = Daemon([binary, f"--config.file={workdir / 'alertmanager.yml'}", f"--storage.path={workdir / 'data'}",
                f"--web.listen-address={addr}", "--cluster.listen-address="],
               workdir / "alertmanager.log", f"http://{addr}/-/ready")
    return d, addr


def start_prometheus(binary: str, workdir: Path, config: dict[str, Any]) -> tuple[Daemon, str]:
    """Prometheus on a free loopback port; returns it and its base URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    addr = f"127.0.0.1:{free_port()}"
    d = Daemon([binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address={addr}"], workdir / "prometheus.log", f"http://{addr}/-/ready")
    return d, f"http://{addr}"


def query(prom: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's result vector."""
    r = httpx.get(f"{prom}/api/v1/query", params={"query": expr}, timeout=5)
    assert r.status_code == 200, r.text
    return list(r.json()["data"]["result"])
