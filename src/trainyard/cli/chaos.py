"""`yard chaos SCENARIO`: inject an incident into a running job, as an operator rehearsing one.

Scenarios (faults go through the local backend's fault injection, which acts on the run state on
disk, so this process can inject into ranks the `yard up` process owns):

- `kill-rank`           SIGKILL one rank (`--rank`, default 0) of the job's current attempt;
- `kill-node`           the node (`--node`, default: where rank `--rank` runs) dies: its ranks are
                        SIGKILLed and it stays down until `revive-node`;
- `hang-rank`           SIGSTOP one rank: the job is found hung and retried;
- `revive-node`         the node (`NODE` or `--node`, required) is repaired and passes its check
                        again; a slowed node runs at full speed again;
- `slow-node`           the node (`NODE` or `--node`, required) runs `--factor` F times slower
                        (2.0 = half speed; 1 < F <= 100) until `revive-node`: every rank on it,
                        running now or launched there later (a restarted plane too), gets its
                        cgroup CPU quota divided by F (its --cpus-per-task, or one CPU, over F);
                        the node stays up and healthy. Needs cgroup containment (not subreaper);
- `preempt`             submit an urgent `interactive` job of the victim's team, sized to need its
                        GPUs, so the engine preempts the victim by checkpoint (`--seconds` it runs);
- `corrupt-checkpoint`  truncate one shard of the job's newest committed `checkpoints/step-N/`, then
                        kill a rank: the next attempt must fall back to the previous checkpoint;
- `kill-plane`          ask the plane to requeue the job (the checkpoint notice), then `kill -9` the
                        `yard up` process named in `DATA_DIR/server.json`.

The server and token: `YARD_URL`/`YARD_TOKEN`, else `server.json`/`admin.token` of `--data-dir`
(default `YARD_DATA_DIR` or `~/.trainyard`).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import typer

from trainyard.cli.client import Client, local_job_dir
from trainyard.cli.common import fail

SCENARIOS = ("kill-rank", "kill-node", "hang-rank", "revive-node", "slow-node", "preempt", "corrupt-checkpoint",
             "kill-plane")
_NODE_ONLY = ("revive-node", "slow-node")
_NEEDS_JOB = ("kill-rank", "kill-node", "hang-rank", "preempt", "corrupt-checkpoint", "kill-plane")


def _client(data_dir: Path) -> Client:
    url = os.environ.get("YARD_URL")
    tok = os.environ.get("YARD_TOKEN")
    if not url:
        try:
            url = json.loads((data_dir / "server.json").read_text())["url"]
        except (OSError, ValueError, KeyError):
            fail(f"--data-dir: no running `yard up` found ({data_dir / 'server.json'} missing); set YARD_URL")
    if not tok:
        try:
            tok = (data_dir / "admin.token").read_text().strip()
        except OSError:
            fail(f"--data-dir: no admin token in {data_dir}; set YARD_TOKEN")
    return Client(url, tok)


def _backend(c: Client, data_dir: Path):  # noqa: ANN202
    from trainyard.backends.base import NodeInfo
    from trainyard.backends.local.backend import LocalBackend

    body = c.get("/api/v1/nodes")
    rows = body["nodes"] if isinstance(body, dict) else body
    nodes = [NodeInfo(name=n["name"], gpus=int(n.get("gpus") or 0), gpu_model=str(n.get("gpu_model") or "emulated"),
                      gpu_mem_mib=int(float(n.get("gpu_mem_gb") or 16) * 1024)) for n in rows]
    return LocalBackend(data_dir, nodes), [n["name"] for n in rows], rows


def _running(c: Client, job: int) -> dict[str, Any]:
    j = c.get(f"/api/v1/jobs/{job}")
    if j["state"] != "RUNNING":
        fail(f"--job: job {job} is {j['state']}, not RUNNING")
    return j


def _rank_nodes(data_dir: Path, j: dict[str, Any], attempt: int) -> dict[int, str]:
    """rank -> node of the attempt, from the backend's attempt record (else empty)."""
    try:
        meta = json.loads((local_job_dir(data_dir, j).attempt_run(attempt) / "attempt.json").read_text())
    except (OSError, ValueError):
        return {}
    out: dict[int, str] = {}
    for r in meta.get("ranks", []):
        if isinstance(r, dict) and "rank" in r and "node" in r:
            out[int(r["rank"])] = r["node"]
    return out


def _world(j: dict[str, Any], data_dir: Path) -> int:
    ranks = _rank_nodes(data_dir, j, j["attempt"])
    if ranks:
        return len(ranks)
    return sum(len(p.get("gpus", [])) for p in (j.get("placement") or [])) or 1


def _check_rank(j: dict[str, Any], data_dir: Path, rank: int) -> None:
    world = _world(j, data_dir)
    if not 0 <= rank < world:
        fail(f"--rank: {rank} is not a rank of job {j['id']} (world size {world})")


def _newest_committed(ck: Path) -> list[Path]:
    steps = []
    for d in ck.glob("step-*"):
        tail = d.name.split("-", 1)[1]
        if d.is_dir() and tail.isdigit() and (d / "COMMITTED").exists():
            steps.append((int(tail), d))
    return [d for _, d in sorted(steps, reverse=True)]


def _save_in_flight(ck: Path, newest: Path | None) -> bool:
    """Is a step-N/ newer than the newest committed one being written (no COMMITTED yet)?"""
    floor = int(newest.name.split("-", 1)[1]) if newest is not None else -1
    for d in ck.glob("step-*"):
        tail = d.name.split("-", 1)[1]
        if d.is_dir() and tail.isdigit() and int(tail) > floor and not (d / "COMMITTED").exists():
            return True
    return False


def chaos(
    scenario: str = typer.Argument(..., help=f"one of: {', '.join(SCENARIOS)}"),
    target: Optional[str] = typer.Argument(None, metavar="[NODE]", help="revive-node/slow-node: the node "
                                           "(as --node)"),
    job: Optional[int] = typer.Option(None, "--job", help="the victim job id"),
    node: Optional[str] = typer.Option(None, "--node", help="kill-node/revive-node: the node "
                                       "(kill-node default: where --rank runs)"),
    rank: int = typer.Option(0, "--rank", help="kill-rank/hang-rank/kill-node/corrupt-checkpoint: the rank"),
    seconds: float = typer.Option(3.0, "--seconds", help="preempt: how long the urgent job runs"),
    factor: Optional[float] = typer.Option(None, "--factor", help="slow-node: how many times slower "
                                           "(2.0 = half speed; 1 < F <= 100)"),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="the control plane's data dir "
                                            "(default YARD_DATA_DIR or ~/.trainyard)"),
) -> None:
    """Inject an incident into a running job (rehearsal on the local backend): kill-rank,
    kill-node, hang-rank, revive-node, slow-node, preempt, corrupt-checkpoint, kill-plane."""
    from trainyard.backends.contain.cpu_quota import check_factor
    from trainyard.defaults import default_data_dir

    if scenario not in SCENARIOS:
        fail(f"SCENARIO: {scenario!r} is not one of {', '.join(SCENARIOS)}")
    if target is not None:
        if scenario not in _NODE_ONLY:
            fail(f"NODE: {scenario} takes no node argument (got {target!r})")
        if node is not None and node != target:
            fail(f"NODE: {target!r} and --node {node!r} disagree")
        node = target
    if scenario in _NEEDS_JOB and job is None:
        fail(f"--job: required with {scenario}")
    if scenario in _NODE_ONLY and not node:
        fail(f"NODE (--node): required with {scenario}")
    if scenario == "slow-node":
        if factor is None:
            fail("--factor: required with slow-node (2.0 = half speed)")
        try:
            check_factor(factor)
        except ValueError as e:
            fail(f"--factor: {e}")
    elif factor is not None:
        fail(f"--factor: only with slow-node, not {scenario}")
    if rank < 0:
        fail(f"--rank: must be >= 0, got {rank}")
    if seconds <= 0:
        fail(f"--seconds: must be positive, got {seconds}")
    dd = (data_dir or default_data_dir()).expanduser()
    if not dd.is_dir():
        fail(f"--data-dir: no such directory: {dd}")
    c = _client(dd)

    if scenario in _NODE_ONLY:
        be, names, _ = _backend(c, dd)
        if node not in names:
            fail(f"NODE (--node): unknown node {node!r}; nodes are {', '.join(names)}")
        assert node is not None  # in names
        if scenario == "revive-node":
            be.revive_node(node)
            typer.echo(f"revived node {node}: it passes its health check again, at full speed")
            return
        assert factor is not None  # checked above
        from trainyard.backends.base import BackendError

        try:
            be.slow_node(node, factor)
        except BackendError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1) from None
        typer.echo(f"slowed node {node} by {factor:g}x (its ranks' CPU quota, now and for ranks started there "
                   f"later) until `yard chaos revive-node {node}`")
        return

    assert job is not None  # _NEEDS_JOB: every scenario but revive-node, checked above
    j = _running(c, job)
    attempt = int(j["attempt"])

    if scenario == "kill-rank":
        _check_rank(j, dd, rank)
        be, _, _ = _backend(c, dd)
        be.kill_rank(job, attempt, rank, signal.SIGKILL)
        typer.echo(f"killed rank {rank} of job {job} attempt {attempt} (SIGKILL)")
    elif scenario == "hang-rank":
        _check_rank(j, dd, rank)
        be, _, _ = _backend(c, dd)
        be.hang_rank(job, attempt, rank)
        typer.echo(f"hung rank {rank} of job {job} attempt {attempt} (SIGSTOP); `yard chaos kill-rank` ends it")
    elif scenario == "kill-node":
        be, names, _ = _backend(c, dd)
        if node is None:
            _check_rank(j, dd, rank)
            node = _rank_nodes(dd, j, attempt).get(rank) or (j.get("placement") or [{}])[0].get("node")
        if node not in names:
            fail(f"--node: unknown node {node!r}; nodes are {', '.join(names)}")
        be.kill_node(node)
        typer.echo(f"killed node {node} (job {job} attempt {attempt} ran there); "
                   f"it stays down until `yard chaos revive-node --node {node}`")
    elif scenario == "preempt":
        _, _, rows = _backend(c, dd)
        total = sum(int(n.get("gpus") or 0) for n in rows if n.get("state", "up") in ("up", "idle", "mixed", "alloc"))
        mine = sum(len(p.get("gpus", [])) for p in (j.get("placement") or []))
        others = sum(sum(len(p.get("gpus", [])) for p in (o.get("placement") or []))
                     for o in c.get("/api/v1/jobs", params={"state": "RUNNING"})["jobs"] if o["id"] != job)
        need = max(1, total - others - mine + 1)
        body = {"name": f"chaos-preempt-{job}", "team": j.get("team"), "class": "interactive", "gpus": need,
                "command": [sys.executable, "-c", f"import time; time.sleep({seconds})"],
                "workdir": str(dd)}
        urgent = c.post("/api/v1/jobs", json=body)
        typer.echo(f"submitted urgent interactive job {urgent['id']} of team {j.get('team')} for {need} GPUs "
                   f"({seconds:g}s): job {job} is to be preempted by checkpoint")
    elif scenario == "corrupt-checkpoint":
        _check_rank(j, dd, rank)
        ck = local_job_dir(dd, j).checkpoints
        be, _, _ = _backend(c, dd)
        world = _world(j, dd)
        # Freeze the ranks first, so no newer checkpoint is committed between the damage and the
        # kill. A save in flight at the freeze (a newer step-N/ without COMMITTED) would commit
        # after the thaw and make the damage moot (seen under load: resumed past the damaged
        # step), so wait for a freeze with no save in flight: thaw, let it finish, freeze again.
        for _ in range(100):
            for r in range(world):
                be.hang_rank(job, attempt, r)
            steps = _newest_committed(ck)
            if not _save_in_flight(ck, steps[0] if steps else None):
                break
            for r in range(world):
                be.kill_rank(job, attempt, r, signal.SIGCONT)
            time.sleep(0.1)
        if not steps:
            for r in range(world):
                be.kill_rank(job, attempt, r, signal.SIGCONT)
            fail(f"--job: job {job} has no committed checkpoint in {ck} yet")
        newest = steps[0]
        shards = sorted(p for p in newest.rglob("*") if p.is_file() and p.suffix == ".distcp")
        if not shards:
            shards = sorted((p for p in newest.rglob("*") if p.is_file() and p.name != "COMMITTED"
                             and p.stat().st_size > 0), key=lambda p: -p.stat().st_size)
        if not shards:
            fail(f"--job: no shard file in {newest}")
        shard = shards[0]
        size = shard.stat().st_size
        with open(shard, "r+b") as f:
            f.truncate(size // 2)
        be.kill_rank(job, attempt, rank, signal.SIGKILL)
        for r in range(world):
            if r != rank:
                be.kill_rank(job, attempt, r, signal.SIGCONT)
        typer.echo(f"truncated {shard} ({size} -> {size // 2} bytes) in {newest.name}, the newest committed "
                   f"checkpoint; killed rank {rank} of job {job} attempt {attempt}: the next attempt must "
                   f"fall back to {steps[1].name if len(steps) > 1 else 'the start'}")
    elif scenario == "kill-plane":
        try:
            pid = int(json.loads((dd / "server.json").read_text())["pid"])
        except (OSError, ValueError, KeyError):
            fail(f"--data-dir: no pid in {dd / 'server.json'}")
        c.post(f"/api/v1/jobs/{job}/requeue")
        # kill it in the middle of the preemption: once the loop has sent the checkpoint notice
        deadline = time.monotonic() + 5
        noticed = False
        while time.monotonic() < deadline and not noticed:
            evs = c.get(f"/api/v1/jobs/{job}/events").get("events", [])
            noticed = any("signal" in json.dumps(e) and "SIGUSR1" in json.dumps(e) for e in evs)
            if not noticed:
                time.sleep(0.02)
        time.sleep(0.1)  # the signal goes out right after the event is stored
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
                with open(f"/proc/{pid}/stat") as fh:
                    if fh.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
                        break  # dead; its parent has not reaped it yet
            except (ProcessLookupError, OSError):
                break
            time.sleep(0.01)
        typer.echo(f"requeued job {job} (checkpoint notice {'sent' if noticed else 'not seen yet'}) and killed the control plane (pid {pid}) with -9; "
                   f"restart it with `yard up --data-dir {dd}` (plus its usual --config/--port): it re-attaches "
                   f"the ranks")
