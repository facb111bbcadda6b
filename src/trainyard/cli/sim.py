"""`yard sim`: replay a workload through each policy and write a side-by-side report.

Order of work, so that bad input never leaves anything behind: check every argument, load the
workload (the trace is validated row by row), resolve the policies; only then simulate, writing
the report into a temporary folder next to `--out` that is renamed into place at the end.

`--config FILE` is the cluster configuration `yard up` runs: its job classes replace the
workload's, and its `scheduler:` section is simulated as configured, so that what is simulated is
what runs. `--policies` still chooses which policies run; the configured policy's entry among them
runs with the configured parameters instead of its defaults (the others, the baselines it is
compared with, keep theirs). The report's meta records, per policy, every parameter it ran with
(`params`) and which policy the configuration names (`configured_policy`).

`--format trainyard` replays the cluster's own history (`yard trace export`; `sim/history.py`) on
`--config`'s nodes and teams too, which it then requires; its `--estimates user` are the jobs' own
time limits. `yard cluster apply --what-if` replays the same records the same way.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer

from trainyard.cli.common import (DEFAULT_CLUSTERS, BadInput, check_choice, command_line, load_workload, parse_seconds,
                                  resolve_policies, run_guarded)


def _prepare(trace, fmt, date_from, date_to, warmup_days, cluster, policies, estimates, seed, jobs, teams, node_mtbf,
             config=None):
    from trainyard.sim.estimates import MODES, apply_estimates

    check_choice(estimates, MODES, "--estimates")
    mtbf = parse_seconds(node_mtbf, "--node-mtbf")
    if mtbf is not None and mtbf <= 0:
        raise BadInput("--node-mtbf: must be positive")
    if jobs < 1:
        raise BadInput("--jobs: must be at least 1")
    if warmup_days < 0:
        raise BadInput("--warmup-days: cannot be negative")
    if fmt == "trainyard":
        w = _history(trace, config, cluster)
    else:
        w = load_workload(fmt, trace, date_from=date_from, date_to=date_to, warmup_days=warmup_days,
                          cluster=cluster, seed=seed, jobs=jobs, teams=teams)
    names = resolve_policies(policies)
    runs: dict[str, dict] = {n: {} for n in names}  # policy -> the parameters it runs with (none: defaults)
    configured = None
    if config is not None:
        from trainyard.spec.models import load_config

        spec = load_config(config)
        _use_classes(w, spec, config)
        configured = spec.scheduler
        for note in configured.deprecations():  # the flat parameter names of before the groups
            typer.echo(f"warning: {note}", err=True)
        if configured.policy in runs:
            runs[configured.policy] = configured.params
        else:
            typer.echo(f"note: --config names policy {configured.policy!r}, which --policies leaves out; "
                       f"it is not simulated", err=True)
    if fmt != "trainyard" or estimates != "user":  # a trainyard trace's user estimates are its time limits
        w.jobs = apply_estimates(w.jobs, estimates, seed)
    return w, runs, configured, mtbf


def _history(trace: Path | None, config: Path | None, cluster: str | None):
    """The cluster's own history (`yard trace export`) on the configuration's nodes and teams."""
    from trainyard.sim.history import read_history, workload_from
    from trainyard.spec.models import load_config

    if trace is None or config is None:
        raise BadInput("--format trainyard: give --trace FILE (from yard trace export) and --config CLUSTER.yaml")
    if cluster is not None:
        raise BadInput("--cluster: not with --format trainyard (the nodes are --config's)")
    return workload_from(read_history(trace), load_config(config), name=f"trainyard history {trace.name}")


def _use_classes(w, spec, config: Path) -> None:
    """Take the job classes (priorities, max waits, min run times, grace) from a cluster config."""
    _, _, classes = spec.to_sched()
    missing = sorted({j.req.job_class for j in w.jobs} - set(classes))
    if missing:
        raise BadInput(f"--config: {config} has no class {', '.join(map(repr, missing))}, which the workload uses")
    w.classes = classes


def _install(tmp: Path, out: Path) -> None:
    """Move the finished report into `out` (replacing files of the same name there)."""
    if not out.exists():
        tmp.rename(out)
        return
    if not out.is_dir():
        raise BadInput(f"--out: {out} exists and is not a folder")
    for f in tmp.iterdir():
        f.replace(out / f.name)
    tmp.rmdir()


def sim(
    trace: Optional[Path] = typer.Option(None, "--trace", help="Trace file (--format philly or pollux)."),
    fmt: str = typer.Option("philly", "--format", help="philly | pollux | synthetic | trainyard (yard trace export)"),
    date_from: Optional[str] = typer.Option(None, "--from", help="First day loaded, YYYY-MM-DD (philly)."),
    date_to: Optional[str] = typer.Option(None, "--to", help="Day after the last day loaded (exclusive)."),
    warmup_days: float = typer.Option(2.0, "--warmup-days", help="Days from --from not measured (philly)."),
    cluster: Optional[str] = typer.Option(None, "--cluster",
                                          help="NODESxGPUS, e.g. 80x8 (default: 80x8; pollux: 16x4)."),
    policies: str = typer.Option("all", "--policies", help="'all' or a comma-separated list."),
    estimates: str = typer.Option("user", "--estimates", help="none | user | oracle"),
    start_estimator: Optional[str] = typer.Option(None, "--start-estimator", help="limit | learned: measure the "
                                                  "estimated starts of the jobs that waited (sim/estimates.py)"),
    seed: int = typer.Option(1, "--seed"),
    out: Path = typer.Option(..., "--out", help="Folder for report.json, report.md and the plots."),
    jobs: int = typer.Option(400, "--jobs", help="Number of jobs (synthetic)."),
    teams: int = typer.Option(3, "--teams", help="Number of teams (synthetic)."),
    node_mtbf: Optional[str] = typer.Option(None, "--node-mtbf", help="Mean time between node failures, e.g. 30d."),
    config: Optional[Path] = typer.Option(None, "--config",
                                          help="Cluster config: its job classes replace the defaults, and its "
                                          "scheduler: section's policy runs with its parameters."),
) -> None:
    """Simulate a workload under each policy and write a report comparing them."""
    if start_estimator is not None:
        from trainyard.sim.estimates import START_ESTIMATORS
        run_guarded(check_choice, start_estimator, START_ESTIMATORS, "--start-estimator")
    w, runs, configured, mtbf = run_guarded(_prepare, trace, fmt, date_from, date_to, warmup_days, cluster,
                                            policies, estimates, seed, jobs, teams, node_mtbf, config)
    names = list(runs)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    from trainyard.sched.policy import get_policy, resolved_params
    from trainyard.sim.report import format_table, write_report
    from trainyard.sim.simulator import SimParams, simulate

    params = SimParams(node_mtbf_s=mtbf, seed=seed, start_estimator=start_estimator)
    err = Console(stderr=True)
    results = {}
    with Progress(TextColumn("{task.description:<10}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                  TimeElapsedColumn(), console=err, transient=False) as bar:
        tasks = {n: bar.add_task(n, total=1.0) for n in names}
        for n in names:
            task = tasks[n]

            def progress(f: float, task: TaskID = task) -> None:
                bar.update(task, completed=min(1.0, max(0.0, f)))

            results[n] = simulate(w, get_policy(n, runs[n]), params, progress=progress)
            bar.update(task, completed=1.0)
    # Outside a terminal (make demo in CI, a pipe) Rich assumes 80 columns and cuts the table.
    Console(width=None if sys.stdout.isatty() else 160).print(format_table(results, title=w.name))
    meta = {"command": command_line(), "format": fmt, "trace": str(trace) if trace else None, "from": date_from,
            "to": date_to, "warmup_days": warmup_days, "cluster": cluster or DEFAULT_CLUSTERS.get(fmt, "--config"), "policies": names,
            "estimates": estimates, "start_estimator": start_estimator, "seed": seed, "jobs": jobs if fmt == "synthetic" else None,
            "node_mtbf_s": mtbf, "config": str(config) if config else None,
            "configured_policy": configured.policy if configured is not None else None,
            "params": {n: resolved_params(n, runs[n]) for n in names}}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write_report(tmp, results, w, meta)
        run_guarded(_install, tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    typer.echo(f"report written to {out}/report.md", err=True)
