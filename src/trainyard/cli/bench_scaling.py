"""`yard bench scaling RECIPE -N 1,2,4`: how much a step speeds up when the nodes double (issue 39).

The seed's advice is "measure how much the step speeds up when the nodes double; if the growth
falls, change the scheme or topology". This command runs the recipe once per size, as ordinary jobs
through the scheduler (each waits its turn like any other; one at a time, so the runs do not share
the cluster with each other), and prints per size:

    step time      the mean wall time of a step: the GPU-seconds the ledger puts inside steps (compute,
                   data_wait, checkpoint_stall, comm_wait) over the job's GPUs and its steps
    throughput     samples (and tokens) per second over that time, from the runtime's counters
    speedup        throughput against the smallest size's
    efficiency     speedup over the growth in nodes (1.0: perfect scaling); `per doubling` compares
                   each size with the one before it
    the ledger     each bucket's share of the run's allocated GPU-seconds, so a team sees where the
                   scaling is lost (startup, data, checkpoints, waiting on collectives)

Every `yard submit` option but the job's shape is accepted and applies to each run (`-A`, `-q`,
`--gpus-per-node`, `--set`, a container image...); the recipe is checked once, before anything is
submitted, and a size that cannot divide the recipe's global batch is refused naming `-N`.
Ctrl-C cancels the run in progress and exits 1. A run that does not complete is shown with its state
and makes the command exit 1.
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import typer

from trainyard.cli import jobs
from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.cli.sbatch import gpu_spec
from trainyard.cli.shared_options import with_options
from trainyard.contracts import LEDGER_BUCKETS
from trainyard.states import TERMINAL_STATES

STEP_BUCKETS = ("compute", "data_wait", "checkpoint_stall", "comm_wait")  # inside the steps
POLL_S = 1.0
# `yard submit`'s options that are not a run's: its shape (-N is a list here), what it runs, and what
# would keep it from starting now (a hold, a dependency, a begin time: the command waits for each run)
DROP = ("args", "after_dashdash", "interactive", "nodes", "recipe", "array", "wrap", "hold", "dependency",
        "begin")
FIXED: dict[str, Any] = {"array": None, "wrap": None, "hold": False, "dependency": None, "begin": None}


def parse_sizes(text: str) -> list[int]:
    """`1,2,4` → [1, 2, 4] (sorted, each once); anything else: exit 2 naming -N."""
    try:
        sizes = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        fail(f"-N/--nodes: {text!r} is not a list of node counts (e.g. 1,2,4)")
    if not sizes or sizes[0] < 1:
        fail(f"-N/--nodes: {text!r}: give node counts of at least 1 (e.g. 1,2,4)")
    if len(sizes) > 16:
        fail("-N/--nodes: at most 16 sizes")
    return sizes


@dataclass
class RunFigures:
    """One size's run: what the table shows."""

    nodes: int
    job_id: int
    state: str
    gpus: int = 0
    steps: int = 0
    step_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    allocated_gpu_s: float = 0.0
    share: dict[str, float] = field(default_factory=dict)  # bucket → share of the allocated GPU-seconds
    speedup: float | None = None
    efficiency: float | None = None
    per_doubling: float | None = None


def figures_of(nodes: int, job: dict[str, Any], goodput: dict[str, Any]) -> RunFigures:
    """A run's figures from its job record (`GET /jobs/{id}`: the runtime's last progress) and its
    ledger (`GET /jobs/{id}/goodput`)."""
    run = RunFigures(nodes=nodes, job_id=int(job["id"]), state=str(job.get("state")))
    buckets = goodput.get("buckets") or {}
    run.allocated_gpu_s = float(goodput.get("allocated_gpu_s") or 0.0)
    attempts = goodput.get("attempts") or []
    run.gpus = max((int(a.get("gpus") or 0) for a in attempts), default=0)
    if run.allocated_gpu_s > 0:
        run.share = {b: float(buckets.get(b, 0.0)) / run.allocated_gpu_s for b in LEDGER_BUCKETS}
    progress = job.get("progress") or {}
    metrics = progress.get("metrics") or {}
    run.steps = int(progress.get("step") or 0)
    in_steps = sum(float(buckets.get(b, 0.0)) for b in STEP_BUCKETS)
    if run.gpus and run.steps and in_steps > 0:
        wall = in_steps / run.gpus  # every GPU is in the steps for the same wall time
        run.step_s = wall / run.steps
        for key, attr in (("samples", "samples_per_s"), ("tokens", "tokens_per_s")):
            total = metrics.get(key)
            if isinstance(total, (int, float)) and not isinstance(total, bool) and total > 0:
                setattr(run, attr, float(total) / wall)
    return run


def compare(runs: list[RunFigures]) -> None:
    """Speedup and efficiency of each run against the smallest size, and per doubling against the
    size before it; by samples per second (tokens where a run counts no samples)."""
    def rate(r: RunFigures) -> float | None:
        return r.samples_per_s if r.samples_per_s is not None else r.tokens_per_s

    done = [(r, x) for r in runs if (x := rate(r))]
    if not done:
        return
    (base, base_rate), (prev, prev_rate) = done[0], done[0]
    for r, x in done:
        r.speedup = x / base_rate
        r.efficiency = r.speedup / (r.nodes / base.nodes)
        if r is not base:  # the growth per doubling of the nodes, as a share of a doubling
            r.per_doubling = (x / prev_rate) ** (1 / math.log2(r.nodes / prev.nodes)) / 2.0
        prev, prev_rate = r, x


def table(recipe: str, runs: list[RunFigures]) -> str:
    short = {"startup": "startup", "compute": "compute", "data_wait": "data", "checkpoint_stall": "ckpt",
             "comm_wait": "comm", "recompute": "recomp", "idle": "idle", "teardown": "teardwn"}
    head = (f"{'nodes':>5} {'gpus':>4} {'job':>6} {'state':<10} {'steps':>6} {'step s':>8} {'samples/s':>10} "
            f"{'speedup':>7} {'eff':>5} {'/2x':>5}  " + " ".join(f"{short[b]:>7}" for b in LEDGER_BUCKETS))
    lines = [f"{recipe}: scaling over {', '.join(str(r.nodes) for r in runs)} nodes "
             "(ledger columns: % of each run's allocated GPU-seconds)", head]

    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in runs:
        lines.append(
            f"{r.nodes:>5} {r.gpus:>4} {r.job_id:>6} {r.state:<10} {r.steps:>6} {num(r.step_s, '.4f'):>8} "
            f"{num(r.samples_per_s, '.1f'):>10} {num(r.speedup, '.2f'):>7} {num(r.efficiency, '.2f'):>5} "
            f"{num(r.per_doubling, '.2f'):>5}  "
            + " ".join(f"{num(100 * r.share[b] if r.share else None, '.1f'):>7}" for b in LEDGER_BUCKETS))
    return "\n".join(lines)


class _Interrupted(Exception):
    pass


def _raise(_signum: int, _frame: Any) -> None:
    raise _Interrupted()


def run_one(c: Client, body: dict[str, Any], where: dict[str, str], nodes: int, timeout_s: float) -> RunFigures:
    """Submit one size, wait for it to end (Ctrl-C or the time-out cancels it), read its figures."""
    job = c.post("/api/v1/jobs", json=body, where=where)
    job_id = int(job["id"])
    typer.echo(f"bench scaling: {nodes} node(s): job {job_id}", err=True)
    t0 = time.monotonic()
    old = signal.signal(signal.SIGINT, _raise)
    try:
        while str(job.get("state")) not in TERMINAL_STATES:
            if time.monotonic() - t0 > timeout_s:
                c.post(f"/api/v1/jobs/{job_id}/cancel")
                typer.echo(f"bench scaling: job {job_id} ran past --run-timeout; cancelled", err=True)
                break
            time.sleep(POLL_S)
            job = c.get(f"/api/v1/jobs/{job_id}")
    except _Interrupted:
        c.post(f"/api/v1/jobs/{job_id}/cancel")
        typer.echo(f"bench scaling: interrupted: job {job_id} cancelled", err=True)
        raise typer.Exit(1) from None
    finally:
        signal.signal(signal.SIGINT, old)
    for _ in range(50):  # the cancel above ends it within a pass or two
        if str(job.get("state")) in TERMINAL_STATES:
            break
        time.sleep(0.2)
        job = c.get(f"/api/v1/jobs/{job_id}")
    return figures_of(nodes, job, c.get(f"/api/v1/jobs/{job_id}/goodput"))


def check_world(recipe: str, options: dict[str, Any], nodes: int) -> None:
    """The recipe's global batch must divide over the ranks of `nodes` nodes (one per GPU unless
    --ntasks-per-node says otherwise): refused naming -N before anything runs."""
    from trainyard.recipes.spec import RecipeError, load_recipe, recipe_path, shipped

    per_node = options.get("tasks_per_node")
    if per_node is None and options.get("gpus_per_node") is not None:
        per_node = gpu_spec(options["gpus_per_node"], "--gpus-per-node")[1]
    try:
        spec = load_recipe(recipe if recipe in shipped() else str(recipe_path(recipe)), list(options.get("sets") or []))
        spec.check_world_size(nodes * int(per_node or 1))
    except RecipeError as e:
        fail(f"-N/--nodes: {nodes} node(s): {e}")


@with_options(jobs.job_request, drop=DROP)
def scaling(
    recipe: str = typer.Argument(..., help="a training recipe (llama-pretrain, ...) or a recipe YAML file"),
    sizes: str = typer.Option(..., "-N", "--nodes", help="node counts to run at, comma-separated: 1,2,4"),
    run_timeout: str = typer.Option("1h", "--run-timeout", help="cancel a run that takes longer (e.g. 30m)"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object: every run's figures"),
    **options: Any,
) -> None:
    """Run a recipe at each node count (as jobs, through the scheduler) and print step time,
    throughput, speedup and efficiency per doubling, with the goodput ledger's split of each run."""
    from trainyard.spec.parsing import parse_duration

    counts = parse_sizes(sizes)
    try:
        timeout_s = parse_duration(run_timeout)
    except ValueError as e:
        fail(f"--run-timeout: {e}")
    if timeout_s is None or timeout_s <= 0:
        fail("--run-timeout: give a positive duration (e.g. 30m)")
    # every body first: a bad option or a size the recipe cannot take is refused before any run
    bodies = []
    for n in counts:
        body, where = jobs.job_request([], False, None, **options, **FIXED, nodes=str(n), recipe=recipe)
        check_world(recipe, options, n)
        body["name"] = f"{body.get('name') or 'scaling'}-N{n}"
        bodies.append((n, body, where))
    c = Client()
    runs = [run_one(c, body, where, n, timeout_s) for n, body, where in bodies]
    compare(runs)
    if as_json:
        typer.echo(json.dumps({"recipe": recipe, "runs": [asdict(r) for r in runs]}, indent=2))
    else:
        typer.echo(table(recipe, runs))
    if any(r.state != "COMPLETED" for r in runs):
        sys.exit(1)
