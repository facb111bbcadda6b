"""`yard bench …`: micro-benchmarks of the engine, and `yard bench scaling` (cli/bench_scaling.py).

`yard bench sched` builds a synthetic snapshot (`trainyard.sched.synthetic_snapshot`) and times
`policy.cycle(snapshot)` with `time.perf_counter`: one untimed warm-up cycle, then `--cycles`
timed ones on the same snapshot (a cycle must not modify its input, so every cycle does the
same work).
"""

from __future__ import annotations

import json
import statistics
import time

import typer

from trainyard.cli import bench_scaling
from trainyard.cli.common import BadInput, resolve_policies, run_guarded

app = typer.Typer(help="Benchmarks.", no_args_is_help=True)
app.command("scaling", context_settings={"allow_interspersed_args": True})(bench_scaling.scaling)


@app.callback()
def _group() -> None:
    """Benchmarks."""


def _check(nodes, gpus_per_node, pending, running, cycles, policy):
    for opt, v, lo in (("--nodes", nodes, 1), ("--gpus-per-node", gpus_per_node, 1), ("--pending", pending, 0),
                       ("--running", running, 0), ("--cycles", cycles, 1)):
        if v < lo:
            raise BadInput(f"{opt}: must be at least {lo}")
    names = resolve_policies(policy, "--policy")
    if len(names) != 1:
        raise BadInput("--policy: give one policy")
    return names[0]


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(len(s) - 1, int(k) + 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


@app.command("sched")
def sched(
    nodes: int = typer.Option(1250, "--nodes"),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node"),
    pending: int = typer.Option(5000, "--pending"),
    running: int = typer.Option(8000, "--running"),
    cycles: int = typer.Option(20, "--cycles"),
    policy: str = typer.Option("trainyard", "--policy"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Time scheduling cycles on a synthetic snapshot."""
    name = run_guarded(_check, nodes, gpus_per_node, pending, running, cycles, policy)
    from trainyard.sched.policy import get_policy
    from trainyard.sched.synthetic_snapshot import build_snapshot

    snap = build_snapshot(nodes=nodes, gpus_per_node=gpus_per_node, pending=pending, running=running, seed=seed)
    pol = get_policy(name)
    pol.cycle(snap)  # warm-up, untimed
    times = []
    for _ in range(cycles):
        t0 = time.perf_counter()
        pol.cycle(snap)
        times.append((time.perf_counter() - t0) * 1000.0)
    res = {"median_ms": round(statistics.median(times), 2), "p95_ms": round(percentile(times, 0.95), 2),
           "cycles": cycles, "policy": name, "nodes": nodes, "gpus_per_node": gpus_per_node,
           "pending": len(snap.pending), "running": len(snap.running)}
    if as_json:
        typer.echo(json.dumps(res))
    else:
        typer.echo(f"{name}: {nodes} nodes x {gpus_per_node} GPUs, {res['pending']} pending, {res['running']} running: "
                   f"median {res['median_ms']} ms, p95 {res['p95_ms']} ms over {cycles} cycles")
