"""`yard plan …`: sizing questions answered by simulation.

`yard plan capacity` loads the workload once (on a cluster of `--max-nodes` nodes, so no job is
left out as too large), then lets `trainyard.plan.capacity.find_min_nodes` probe node counts, each
probe a full simulation of the same jobs on a resized cluster (quotas rescaled in proportion).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.common import BadInput, check_choice, load_workload, parse_seconds, resolve_policies, run_guarded

app = typer.Typer(help="Capacity planning by simulation.", no_args_is_help=True)


@app.callback()
def _group() -> None:
    """Capacity planning by simulation."""


def _prepare(trace, fmt, date_from, date_to, warmup_days, policy, gpus_per_node, min_nodes, max_nodes,
             tolerance, estimates, seed, jobs, target):
    from trainyard.plan.capacity import load_start, min_nodes_for_jobs
    from trainyard.sim.estimates import MODES, apply_estimates

    if "," in policy or policy.strip() == "all":
        raise BadInput("--policy: give one policy")
    if tolerance < 1:
        raise BadInput("--tolerance: must be at least 1")
    if target is None:
        raise BadInput("--target-p99-wait: required")
    target_s = parse_seconds(target, "--target-p99-wait")
    check_choice(estimates, MODES, "--estimates")
    if gpus_per_node < 1:
        raise BadInput("--gpus-per-node: must be at least 1")
    if max_nodes < 1 or (min_nodes is not None and not 1 <= min_nodes <= max_nodes):
        raise BadInput("--min-nodes/--max-nodes: need 1 <= min-nodes <= max-nodes")
    w = load_workload(fmt, trace, date_from=date_from, date_to=date_to, warmup_days=warmup_days,
                      cluster=f"{max_nodes}x{gpus_per_node}", seed=seed, jobs=jobs)
    (name,) = resolve_policies(policy, "--policy")
    w.jobs = apply_estimates(w.jobs, estimates, seed)
    lo = max(min_nodes or 1, min_nodes_for_jobs(w, gpus_per_node))
    if lo > max_nodes:
        raise BadInput(f"--max-nodes: the largest job needs {lo} nodes")
    return w, name, target_s, lo, min(max_nodes, max(lo, load_start(w, gpus_per_node)))


@app.command("capacity")
def capacity(
    trace: Optional[Path] = typer.Option(None, "--trace"),
    fmt: str = typer.Option("philly", "--format", help="philly | synthetic"),
    target: str = typer.Option(..., "--target-p99-wait", help="Wait target, e.g. 2h."),
    date_from: Optional[str] = typer.Option(None, "--from"),
    date_to: Optional[str] = typer.Option(None, "--to"),
    warmup_days: float = typer.Option(2.0, "--warmup-days"),
    policy: str = typer.Option("trainyard", "--policy"),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node"),
    min_nodes: Optional[int] = typer.Option(None, "--min-nodes", help="Default: the fewest the largest job needs."),
    max_nodes: int = typer.Option(2048, "--max-nodes"),
    tolerance: int = typer.Option(1, "--tolerance", help="Stop when the answer is known within this many nodes."),
    estimates: str = typer.Option("user", "--estimates"),
    seed: int = typer.Option(1, "--seed"),
    jobs: int = typer.Option(400, "--jobs", help="Number of jobs (synthetic)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The smallest cluster (in nodes) whose simulated p99 wait meets the target."""
    w, name, target_s, lo, start = run_guarded(_prepare, trace, fmt, date_from, date_to, warmup_days, policy,
                                               gpus_per_node, min_nodes, max_nodes, tolerance, estimates, seed,
                                               jobs, target)
    from rich.console import Console
    from rich.table import Table

    from trainyard.plan.capacity import find_min_nodes, resize_workload
    from trainyard.sched.policy import get_policy
    from trainyard.sim.result import metrics
    from trainyard.sim.simulator import SimParams, simulate

    err = Console(stderr=True)

    def evaluate(n: int) -> dict:
        with err.status(f"simulating {name} on {n} nodes x {gpus_per_node} GPUs"):
            m = metrics(simulate(resize_workload(w, n, gpus_per_node), get_policy(name), SimParams(seed=seed)))
        err.print(f"  {n:>5} nodes: p99 wait {m['p99_wait_s'] / 3600:.2f} h, utilization {m['utilization']:.3f}")
        return m

    ans = find_min_nodes(evaluate, target_s, lo=lo, start=start, max_nodes=max_nodes, tolerance=tolerance)
    probes = [{"nodes": p.nodes, "gpus": p.nodes * gpus_per_node, "ok": p.ok,
               **{k: p.metrics.get(k) for k in ("p99_wait_s", "avg_wait_s", "avg_jct_s", "utilization")}}
              for p in ans.sorted_probes()]
    if as_json:
        typer.echo(json.dumps({"nodes": ans.nodes, "gpus": ans.nodes * gpus_per_node if ans.nodes else None,
                               "gpus_per_node": gpus_per_node, "policy": name, "target_p99_wait_s": target_s,
                               "workload": w.name, "probes": probes}, indent=2))
        return
    table = Table(title=f"probes ({name}, target p99 wait {target_s / 3600:.2f} h)")
    for c in ("nodes", "GPUs", "p99 wait h", "avg wait h", "avg JCT h", "utilization", "meets"):
        table.add_column(c, justify="right")
    for p in probes:
        table.add_row(str(p["nodes"]), str(p["gpus"]), f"{p['p99_wait_s'] / 3600:.2f}", f"{p['avg_wait_s'] / 3600:.2f}",
                      f"{p['avg_jct_s'] / 3600:.2f}", f"{p['utilization']:.3f}", "yes" if p["ok"] else "no")
    Console().print(table)
    if ans.nodes is None:
        typer.echo(f"no cluster up to {max_nodes} nodes meets a p99 wait of {target}")
        raise typer.Exit(1)
    typer.echo(f"smallest cluster meeting p99 wait <= {target}: {ans.nodes} nodes x {gpus_per_node} GPUs "
               f"= {ans.nodes * gpus_per_node} GPUs (within {tolerance} node{'s' if tolerance > 1 else ''})")
