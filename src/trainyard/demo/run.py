"""`yard demo`: start an emulated 2-node × 4-GPU cluster, run a mixed workload of two teams, watch.

What it shows, in about a minute and a half:
- deferrable `batch` jobs of team vision fill the idle cluster, borrowing nlp's idle quota;
- nlp's two-node `training` job reclaims that quota: the borrowed batch jobs get the preemption
  notice, checkpoint, exit 75, are requeued and later resume from their checkpoint;
- short `interactive` jobs of both teams start within seconds, ahead of everything else.

It runs `yard up` as a real process on `DIR/yard` (a fresh data dir), submits as two team
members with their own tokens, shows the queue live (Rich), prints a summary, stops the control
plane and checks that no process of it is left.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from trainyard.spec.models import EXAMPLE_CONFIG

DEMO_CONFIG = EXAMPLE_CONFIG.with_name("demo.yaml")
WORK = [sys.executable, "-m", "trainyard.demo.work"]


@dataclass(frozen=True)
class Planned:
    at: float  # seconds after the start
    user: str
    body: dict[str, Any]


def workload() -> list[Planned]:
    def work(steps: int, every: int = 5) -> list[str]:
        return WORK + ["--steps", str(steps), "--step-time", "0.5", "--ckpt-every", str(every)]

    plan = [Planned(0, "alice", {"name": f"sweep-{i}", "class": "batch", "gpus": 2, "command": work(30)})
            for i in range(4)]
    plan.append(Planned(5, "bob", {"name": "pretrain", "class": "training", "nodes": 2, "gpus_per_node": 2,
                                   "time": "5m", "command": work(40)}))
    for i, (t, who) in enumerate([(9, "alice"), (14, "bob"), (20, "alice"), (26, "bob")]):
        plan.append(Planned(t, who, {"name": f"notebook-{i}", "class": "interactive", "gpus": 1, "time": "1m",
                                     "command": work(10, every=100)}))
    plan += [Planned(30, "alice", {"name": f"eval-{i}", "class": "batch", "gpus": 1, "command": work(16)})
             for i in range(2)]
    return plan


class Demo:
    def __init__(self, out: Path, console: Console):
        self.out, self.console = out, console
        self.data_dir = Path(out).absolute() / "yard"  # its jobs' workdir, which the API wants absolute
        self.proc: subprocess.Popen | None = None
        self.url = ""

    # -- the control plane as a process --------------------------------------------------------

    def start(self) -> None:
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)
        self.data_dir.mkdir(parents=True)
        yard = Path(sys.executable).parent / "yard"
        cmd = [str(yard) if yard.exists() else sys.executable, *([] if yard.exists() else ["-m", "trainyard.cli.main"]),
               "up", "--config", str(DEMO_CONFIG), "--data-dir", str(self.data_dir), "--port", "0", "--tick", "0.5",
               # The demo's members (alice, bob) have no Unix accounts: their jobs run as whoever runs
               # the demo, root included (an emulation on one's own machine, not a shared cluster).
               "--run-as", pwd.getpwuid(os.geteuid()).pw_name, *(["--allow-root-jobs"] if os.geteuid() == 0 else [])]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.data_dir / "up.log", "w"),
                                     start_new_session=True)
        deadline = time.monotonic() + 60
        while not (self.data_dir / "server.json").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("yard up did not start:\n" + (self.data_dir / "up.log").read_text())
            time.sleep(0.1)
        self.url = json.loads((self.data_dir / "server.json").read_text())["url"]
        self.admin = httpx.Client(base_url=self.url, timeout=30, headers={
            "Authorization": "Bearer " + (self.data_dir / "admin.token").read_text().strip()})
        self.members = {}
        for user, team in (("alice", "vision"), ("bob", "nlp")):
            tok = self.admin.post("/api/v1/tokens", json={"user": user, "role": "member", "team": team}).json()["token"]
            self.members[user] = httpx.Client(base_url=self.url, timeout=30, headers={"Authorization": f"Bearer {tok}"})

    def stop(self) -> int:
        """Cancel what runs, stop `yard up`, and count processes of this demo still alive (want 0)."""
        try:
            for j in self.admin.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
                self.admin.post(f"/api/v1/jobs/{j['id']}/cancel")
            deadline = time.monotonic() + 20
            while self.admin.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        except httpx.HTTPError:
            pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return len(leftover_processes(self.data_dir))

    # -- the run ---------------------------------------------------------------------------------

    def run(self, live: bool, limit_s: float = 150.0) -> dict[str, Any]:
        plan = sorted(workload(), key=lambda p: p.at)
        t0 = time.time()
        ids: list[int] = []
        view = Live(console=self.console, refresh_per_second=4, transient=False) if live else None
        last_print = 0.0
        if view:
            view.start()
        try:
            while True:
                now = time.time() - t0
                while plan and plan[0].at <= now:
                    p = plan.pop(0)
                    body = {**p.body, "workdir": str(self.data_dir)}
                    ids.append(self.members[p.user].post("/api/v1/jobs", json=body).json()["id"])
                jobs = self.admin.get("/api/v1/jobs").json()["jobs"]
                nodes = self.admin.get("/api/v1/nodes").json()["nodes"]
                events = self.admin.get("/api/v1/events", params={"limit": 6, "newest": "true"}).json()["events"]
                if view:
                    view.update(render(jobs, nodes, events, now))
                elif now - last_print >= 5:
                    last_print = now
                    self.console.print(progress_line(jobs, nodes, now))
                done = not plan and jobs and all(j["state"] not in ("PENDING", "REQUEUED", "RUNNING", "COMPLETING")
                                                 for j in jobs)
                if done or now > limit_s:
                    break
                time.sleep(0.5)
        finally:
            if view:
                view.stop()
        return summarize(self.admin, ids, t0, time.time())


def leftover_processes(data_dir: Path) -> list[int]:
    """Live processes whose command line mentions the demo's data dir (rank runners, `yard up`)."""
    out, needle = [], str(data_dir).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{pid}/stat") as fh:
                zombie = fh.read().rsplit(")", 1)[-1].split()[0] == "Z"
        except OSError:
            continue
        if needle in cmd and not zombie:
            out.append(int(pid))
    return out


STATE_STYLE = {"RUNNING": "cyan", "PENDING": "yellow", "REQUEUED": "magenta", "COMPLETED": "green",
               "COMPLETING": "cyan", "FAILED": "red", "CANCELLED": "dim"}


def render(jobs: list[dict], nodes: list[dict], events: list[dict], now: float) -> Group:
    nt = Table(title=f"trainyard demo — t+{now:4.0f}s", title_justify="left", box=None, header_style="bold")
    for h in ("node", "GPUs"):
        nt.add_column(h)
    used: dict[str, dict[int, str]] = {}
    for j in jobs:
        if j["state"] in ("RUNNING", "COMPLETING"):
            for p in j["placement"] or []:
                for g in p["gpus"]:
                    used.setdefault(p["node"], {})[g] = j["team"]
    for n in nodes:
        cells = [("[blue]■[/]" if used.get(n["name"], {}).get(g) == "vision" else
                  "[magenta]■[/]" if used.get(n["name"], {}).get(g) == "nlp" else "[dim]□[/]") for g in range(n["gpus"])]
        nt.add_row(n["name"], " ".join(cells) + "   [blue]■ vision[/] [magenta]■ nlp[/]")
    qt = Table(box=None, header_style="bold")
    for h in ("id", "name", "team", "class", "state", "try", "reason / nodes"):
        qt.add_column(h, no_wrap=True)
    for j in jobs:
        where = ", ".join(f"{p['node']}{p['gpus']}" for p in j["placement"] or []) if j["state"] == "RUNNING" else j["reason"]
        st = j["state"]
        qt.add_row(str(j["id"]), j["name"], j["team"], j["class"], f"[{STATE_STYLE.get(st, 'white')}]{st}[/]",
                   str(j["attempt"]), where)
    et = Table(box=None, show_header=False)
    et.add_column(style="dim")
    et.add_column()
    for e in reversed(events):
        et.add_row(time.strftime("%H:%M:%S", time.localtime(e["time"])),
                   f"{'job ' + str(e['job_id']) + ': ' if e['job_id'] else ''}{e['message']}")
    return Group(nt, qt, et)


def progress_line(jobs: list[dict], nodes: list[dict], now: float) -> str:
    counts: dict[str, int] = {}
    for j in jobs:
        counts[j["state"]] = counts.get(j["state"], 0) + 1
    busy = sum(n["gpus_used"] for n in nodes)
    total = sum(n["gpus"] for n in nodes)
    return f"t+{now:4.0f}s  GPUs busy {busy}/{total}  " + "  ".join(f"{k} {v}" for k, v in sorted(counts.items()))


def summarize(admin: httpx.Client, ids: list[int], t0: float, t1: float) -> dict[str, Any]:
    jobs = [admin.get(f"/api/v1/jobs/{i}").json() for i in ids]
    total_gpus = sum(n["gpus"] for n in admin.get("/api/v1/nodes").json()["nodes"])
    gpu_s = 0.0
    waits: dict[str, list[float]] = {}
    for j in jobs:
        for a in j["attempts"]:
            gpu_s += sum(len(p["gpus"]) for p in a["placement"]) * ((a["ended_at"] or t1) - a["started_at"])
        if j["attempts"]:
            waits.setdefault(j["class"], []).append(j["attempts"][0]["started_at"] - j["submit_time"])
    first = min((j["submit_time"] for j in jobs), default=t0)
    last = max((a["ended_at"] or t1 for j in jobs for a in j["attempts"]), default=t1)
    events = admin.get("/api/v1/events", params={"limit": 10000}).json()["events"]
    ledger: dict[str, float] = {}  # the goodput ledger's GPU-seconds per bucket, every job together
    for i in ids:
        for b, v in (admin.get(f"/api/v1/jobs/{i}/goodput").json().get("buckets") or {}).items():
            ledger[b] = ledger.get(b, 0.0) + float(v)
    states: dict[str, int] = {}
    for j in jobs:
        states[j["state"]] = states.get(j["state"], 0) + 1
    return {
        "jobs": len(jobs), "states": states,
        "utilization": gpu_s / (total_gpus * max(1e-9, last - first)),
        "makespan_s": last - first,
        "wait_s": {c: {"avg": sum(w) / len(w), "max": max(w)} for c, w in waits.items()},
        "preemptions": sum(1 for e in events if e["kind"] == "job.preempting"),
        "resumed_from_checkpoint": sum(1 for j in jobs if j["attempt"] > 1 and j["state"] == "COMPLETED"),
        "ledger": ledger,
    }


def print_summary(console: Console, s: dict[str, Any], url: str, data_dir: Path, left: int) -> None:
    t = Table(title="demo summary", title_justify="left", box=None, show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("jobs", f"{s['jobs']}: " + ", ".join(f"{v} {k}" for k, v in sorted(s["states"].items())))
    t.add_row("GPU utilization", f"{s['utilization']:.0%} of 8 GPUs over {s['makespan_s']:.0f}s")
    for c, w in sorted(s["wait_s"].items()):
        t.add_row(f"wait ({c})", f"avg {w['avg']:.1f}s, max {w['max']:.1f}s")
    t.add_row("preemptions", f"{s['preemptions']} (by checkpoint; {s['resumed_from_checkpoint']} jobs resumed "
                             "from a checkpoint and completed)")
    total = sum(s["ledger"].values())
    if total > 0:  # where the GPU-seconds went (docs/accounting.md, "Goodput ledger"): the buckets over 0.5%
        t.add_row("GPU-seconds went to", ", ".join(f"{b.replace('_', ' ')} {v / total:.0%}" for b, v in sorted(
            s["ledger"].items(), key=lambda kv: -kv[1]) if v / total >= 0.005) + "  (yard report goodput)")
    t.add_row("processes left", str(left))
    console.print(t)
    console.print(f"API: {url}/api/v1 (OpenAPI docs {url}/docs)   dashboard: {url}/ui/")
    console.print(f"The demo stopped its control plane. Bring it back with the demo's jobs, events and logs:\n"
                  f"  yard up --data-dir {data_dir}    # then open its /ui/ and log in with the token in "
                  f"{data_dir / 'admin.token'}")


def main(out: Path, live: bool | None = None) -> int:
    console = Console()
    demo = Demo(out, console)
    console.print(f"[bold]trainyard demo[/]: starting an emulated 2-node x 4-GPU cluster (teams vision and nlp) "
                  f"in {demo.data_dir}")
    left = 0
    try:
        demo.start()
        console.print(f"control plane at {demo.url}; alice (vision) and bob (nlp) submit with their member tokens")
        summary = demo.run(live=console.is_terminal if live is None else live)
    finally:
        left = demo.stop()
    print_summary(console, summary, demo.url, demo.data_dir, left)
    (out / "demo-summary.json").write_text(json.dumps(summary, indent=2))
    return 0 if left == 0 and summary["states"].get("COMPLETED", 0) == summary["jobs"] else 1
