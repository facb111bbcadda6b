"""`yard plan …`: sizing questions answered by simulation.

`yard plan capacity` loads the workload once (on a cluster of `--max-nodes` nodes, so no job is
left out as too large), then lets `trainyard.plan.capacity.find_min_nodes` probe node counts, each
probe a full simulation of the same jobs on a resized cluster (quotas rescaled in proportion).

`yard plan memory` is arithmetic, not simulation: bytes per GPU for a training setup and the
fewest GPUs it fits on (`trainyard.plan.memory`, docs/memory-planner.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from trainyard.cli.common import BadInput, check_choice, load_workload, parse_seconds, resolve_policies, run_guarded

app = typer.Typer(help="Planning: cluster capacity by simulation, GPU memory of a model by formula.", no_args_is_help=True)


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
    probes: list[dict[str, Any]] = [
        {"nodes": p.nodes, "gpus": p.nodes * gpus_per_node, "ok": p.ok,
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


# --- yard plan memory -----------------------------------------------------------------------------


def _memory_prepare(model_name, config, params, strategy, precision, tp, pp, seq, micro_batch, recompute,
                    sequence_parallel, gpu_mem, gpus_per_node, margin, gpus, attention="sdpa", activations="inventory",
                    grad_accumulation=1):
    from trainyard.plan.memory import (ArchError, PlanError, TrainSetup, get_model, load_hf_config,
                                       parse_param_count, usable_bytes)

    given = [o for o, v in (("--model", model_name), ("--config", config), ("--params", params)) if v is not None]
    if not given:
        raise BadInput("--model: required (or --config PATH to an HF config.json, or --params N)")
    if len(given) > 1:
        raise BadInput(f"{'/'.join(given)}: give only one of --model, --config, --params")
    try:
        if model_name is not None:
            model = get_model(model_name)
        elif config is not None:
            model = load_hf_config(config)
        else:
            model = parse_param_count(params)
        setup = TrainSetup(strategy=strategy.strip().lower(), precision=precision.strip().lower(), tp=tp, pp=pp,
                           seq=seq, micro_batch=micro_batch, recompute=recompute.strip().lower(),
                           sequence_parallel=sequence_parallel, attention=attention.strip().lower(),
                           activation_model=activations.strip().lower(), grad_accumulation=grad_accumulation)
        setup.check(model)
        capacity = usable_bytes(gpu_mem, margin)
    except ArchError as e:
        raise BadInput(f"--config: {e}") from None
    except PlanError as e:
        flag = {"activation_model": "activations"}.get(e.field, e.field)
        raise BadInput(f"--{flag.replace('_', '-')}: {e.message}") from None
    if gpus_per_node < 1:
        raise BadInput(f"--gpus-per-node: must be at least 1, got {gpus_per_node}")
    if gpus is not None and (gpus < 1 or gpus % setup.model_parallel):
        raise BadInput(f"--gpus: must be a positive multiple of tp x pp = {setup.model_parallel}, got {gpus}")
    return model, setup, capacity


def _gb(x: float) -> str:
    """GB (10^9 bytes), one decimal, halves rounded up as the ZeRO paper does (1.875 → 1.9)."""
    from decimal import ROUND_HALF_UP, Decimal

    return str((Decimal(x) / Decimal(10**9)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP))


def _gib(x: float) -> str:
    return f"{x / 2**30:.2f}"


def _memory_notes(model, setup, gpus_per_node) -> list[str]:
    from trainyard.plan.memory import ModelArch

    notes: list[str] = []
    if isinstance(model, ModelArch):
        notes.extend(model.notes)
        approx = []
        if setup.activation_model == "paper":
            if model.gated_mlp:
                approx.append("a gated MLP")
            if model.ffn != 4 * model.hidden:
                approx.append(f"an MLP width of {model.ffn} (the paper's is 4h = {4 * model.hidden})")
            if model.is_gqa:
                approx.append(f"grouped-query attention ({model.kv_heads} KV heads for {model.heads}; "
                              f"K and V activations are counted at full width)")
            if approx:
                notes.append("activations use Korthikanti et al.'s GPT formulas; approximate for " + ", ".join(approx))
        elif not model.gated_mlp:
            notes.append("a 2-matrix MLP is counted without dropout masks (the recipes' models have none)")
        if model.max_positions and setup.seq > model.max_positions:
            notes.append(f"--seq {setup.seq} exceeds the model's {model.max_positions} positions")
    else:
        notes.append("activations not computed: a bare parameter count has no architecture "
                     "(give --model or --config for them)")
    if setup.pp > 1:
        notes.append(f"pipeline: 1F1B with at least {setup.pp} micro-batches per step; the first stage keeps "
                     f"{setup.pp} in flight")
    if setup.tp > gpus_per_node:
        notes.append(f"tensor parallel degree {setup.tp} spans nodes of {gpus_per_node} GPUs")
    if setup.activation_model == "paper":
        if setup.recompute == "full":
            notes.append("full recompute: the recomputed layer's working set during backward is not counted")
        if setup.zero_stage == 3:
            notes.append("ZeRO-3/FSDP: the gathered parameters of the layers in flight are not counted")
    elif isinstance(model, ModelArch):
        if setup.recompute == "selective":
            notes.append("selective recompute is torchtitan's op-level policy (every other matmul's output saved)")
        if setup.strategy in ("zero1", "zero2"):
            notes.append("ZeRO-1/2: the communication buckets are not counted (the margin stands for them)")
    return notes


def _memory_compare(model, setup, dp, capacity, gpus_per_node) -> list[dict]:
    from dataclasses import replace

    from trainyard.plan.memory import memory_per_gpu, min_gpus

    rows = []
    for strat in ("ddp", "zero1", "zero2", "zero3"):
        s = replace(setup, strategy=strat)
        bd, fit = memory_per_gpu(model, s, dp), min_gpus(model, s, capacity, gpus_per_node)
        rows.append({"strategy": strat, "requested": setup.zero_stage == s.zero_stage,
                     "model_state_bytes": round(bd.model_state), "activations_bytes": round(bd.activations or 0),
                     "total_bytes": round(bd.total), "fits": bd.total <= capacity,
                     "min_gpus": fit.gpus if fit else None, "min_nodes": fit.nodes if fit else None})
    return rows


@app.command("memory")
def memory(
    model_name: Optional[str] = typer.Option(None, "--model", help="A known architecture, e.g. llama-2-7b."),
    config: Optional[Path] = typer.Option(None, "--config", help="An HF-style config.json instead of --model."),
    params: Optional[str] = typer.Option(None, "--params",
                                         help="Only a parameter count (e.g. 7.5e9): model state, no activations."),
    strategy: str = typer.Option("ddp", "--strategy", help="ddp | zero1 | zero2 | zero3 | fsdp (= zero3)"),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp16 (mixed precision) | fp32"),
    tp: int = typer.Option(1, "--tp", help="Tensor parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline parallel degree."),
    seq: int = typer.Option(2048, "--seq", help="Sequence length."),
    micro_batch: int = typer.Option(1, "--micro-batch"),
    recompute: str = typer.Option("none", "--recompute",
                                  help="none | selective (torchtitan's op-level policy) | full"),
    attention: str = typer.Option("sdpa", "--attention", help="sdpa (fused: no stored scores) | eager"),
    activations: str = typer.Option("inventory", "--activations",
                                    help="inventory (each saved tensor of the recipes' layers) | paper "
                                         "(Korthikanti et al.'s GPT formulas)"),
    grad_accumulation: int = typer.Option(1, "--grad-accumulation",
                                          help="Micro-batches per step (above 1 the gradients live through backward)."),
    sequence_parallel: bool = typer.Option(True, "--sequence-parallel/--no-sequence-parallel",
                                           help="Megatron sequence parallelism with --tp > 1."),
    gpu_mem: float = typer.Option(80.0, "--gpu-mem", help="GPU memory in GiB (an '80 GB' A100/H100: 80)."),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node"),
    margin: float = typer.Option(0.10, "--margin", help="Fraction of GPU memory kept free (context, fragmentation)."),
    gpus: Optional[int] = typer.Option(None, "--gpus",
                                       help="Show the breakdown at this many GPUs (default: the minimum)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Bytes per GPU for parameters, gradients, optimizer states and activations, and the fewest GPUs that fit.

    Model state per the ZeRO paper; activations, the loss's temporaries and FSDP's gathered units as
    the recipes run them (or Korthikanti et al.'s formulas with --activations paper); the peak is
    the largest moment of a step: docs/memory-planner.md.
    """
    model, setup, capacity = run_guarded(_memory_prepare, model_name, config, params, strategy, precision, tp, pp,
                                         seq, micro_batch, recompute, sequence_parallel, gpu_mem, gpus_per_node,
                                         margin, gpus, attention, activations, grad_accumulation)
    from rich.console import Console, JustifyMethod
    from rich.markup import escape
    from rich.table import Table

    from trainyard.plan.memory import (STRATEGY_LABELS, ModelArch, activation_formula, arch_dict, layer_activation_bytes,
                                       memory_per_gpu, min_gpus, setup_dict, state_bytes_per_param, suggest,
                                       unsharded_bytes)

    fit = min_gpus(model, setup, capacity, gpus_per_node)
    dp = gpus // setup.model_parallel if gpus is not None else (fit.dp if fit else 1)
    bd = memory_per_gpu(model, setup, dp)
    floor = unsharded_bytes(model, setup)
    hint = suggest(model, setup, capacity, gpus_per_node) if fit is None else None
    compare = _memory_compare(model, setup, dp, capacity, gpus_per_node)
    notes = _memory_notes(model, setup, gpus_per_node)
    is_arch = isinstance(model, ModelArch)
    per_layer = layer_activation_bytes(model, setup) if is_arch else None
    if as_json:
        out = {
            "model": arch_dict(model),
            "setup": {**setup_dict(setup), "gpu_mem_gib": gpu_mem, "gpus_per_node": gpus_per_node, "margin": margin},
            "units": {"GB": 10**9, "GiB": 2**30},
            "usable_bytes_per_gpu": round(capacity),
            "per_gpu": {"gpus": bd.gpus, "dp": bd.dp, "tp": setup.tp, "pp": setup.pp, "stage": bd.stage,
                        "shard_params": round(bd.shard_params), "parameters": round(bd.parameters),
                        "gradients": round(bd.gradients), "optimizer_states": round(bd.optimizer),
                        "model_state": round(bd.model_state),
                        "activations": None if bd.activations is None else round(bd.activations),
                        "activations_per_layer": None if per_layer is None else round(per_layer),
                        "activation_formula": activation_formula(setup) if is_arch else None,
                        "loss_temporaries": round(bd.loss), "working_set": round(bd.working_set),
                        "buffers": round(bd.buffers), "peak_moment": bd.moment or None,
                        "moments": {name: round(v) for name, v in bd.moments},
                        "total": round(bd.total), "model_state_gb": float(_gb(bd.model_state)),
                        "total_gb": float(_gb(bd.total)), "total_gib": round(bd.total / 2**30, 2),
                        "fits": bd.total <= capacity},
            "minimum": None if fit is None else {"gpus": fit.gpus, "nodes": fit.nodes, "dp": fit.dp,
                                                 "total": round(fit.breakdown.total)},
            "unsharded_bytes": round(floor),
            "suggestion": None if hint is None else {**{k: getattr(hint[0], k) for k in ("strategy", "recompute",
                                                                                         "tp", "pp")},
                                                     "gpus": hint[1].gpus, "nodes": hint[1].nodes},
            "strategies": compare,
            "notes": notes,
        }
        typer.echo(json.dumps(out, indent=2))
        return

    con = Console()
    w, g, o = state_bytes_per_param(setup.precision)
    if is_arch:
        mlp = "gated" if model.gated_mlp else "2-matrix"
        con.print(f"[bold]{model.name}[/]: {model.params:,} parameters ({model.layers} layers, hidden {model.hidden}, "
                  f"{model.heads} heads, {model.kv_heads} KV heads, FFN {model.ffn} {mlp}, vocab {model.vocab}, "
                  f"{'tied' if model.tied_embeddings else 'untied'} embeddings)", highlight=False)
    else:
        con.print(f"[bold]{model.params:,} parameters[/] (no architecture)", highlight=False)
    mixed = "mixed precision" if setup.precision != "fp32" else "full precision"
    sp = ", sequence parallel" if setup.tp > 1 and setup.sequence_parallel else ""
    con.print(f"{STRATEGY_LABELS[setup.strategy]}, {setup.precision} {mixed} with Adam ({w}+{g}+{o} bytes per "
              f"parameter), tp {setup.tp} x pp {setup.pp}, seq {setup.seq}, micro-batch {setup.micro_batch}, "
              f"recompute {setup.recompute}{sp}", highlight=False)
    where = {"all": "", "first": ", first pipeline stage", "last": ", last pipeline stage",
             "each": ", each pipeline stage"}[bd.stage]
    n_gpus = f"{bd.gpus} GPU{'s' if bd.gpus > 1 else ''}"
    table = Table(title=f"per GPU at {n_gpus} (dp {bd.dp} x tp {setup.tp} x pp {setup.pp}{where})")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("", "left"), ("bytes", "right"), ("GB", "right"),
                                                      ("GiB", "right"), ("how", "left"))
    for c, j in columns:
        table.add_column(c, justify=j)
    z = setup.zero_stage
    shard = f"{bd.shard_params:,.0f} params"

    def per(n, sharded):
        return f"{n} B x {shard}" + (f" / dp {bd.dp}" if sharded and bd.dp > 1 else "")

    opt_what = "fp32 master, momentum, variance" if setup.precision != "fp32" else "momentum, variance"
    rows = [("parameters", bd.parameters, per(w, z >= 3)), ("gradients", bd.gradients, per(g, z >= 2)),
            ("optimizer states", bd.optimizer, per(o, z >= 1) + f" ({opt_what})"),
            ("model state", bd.model_state, "")]
    for name, value, how in rows:
        table.add_row(name, f"{value:,.0f}", _gb(value), _gib(value), how)
    if bd.activations is None or per_layer is None:  # (both: no architecture)
        table.add_row("activations", "-", "-", "-", "not computed (no architecture)")
    else:
        layers = bd.layers_in_flight
        outside = bd.activations - layers * per_layer
        table.add_row("activations", f"{bd.activations:,.0f}", _gb(bd.activations), _gib(bd.activations),
                      escape(f"{layers:g} layers x {per_layer:,.0f} B, {activation_formula(setup)}; "
                             f"+ {outside:,.0f} B embedding/output"))
    if bd.moments:
        for name, value, how in (
                ("loss temporaries", bd.loss, "fp32 log-softmax, its and the NLL's gradients (start of backward)"),
                ("layer backward", bd.working_set, "one layer's backward working set"
                                                   + (" (recomputed layer included)" if setup.recompute != "none"
                                                      else "")),
                ("buffers", bd.buffers, {3: "FSDP: gathered root unit + prefetched layer",
                                         0: "DDP gradient buckets"}.get(setup.zero_stage, "")
                 if bd.buffers else "none (one process: no wrapper)" if bd.dp == 1 else "not counted")):
            table.add_row(name, f"{value:,.0f}", _gb(value), _gib(value), how)
        live = ", ".join(f"{n} {_gib(v)} GiB" for n, v in bd.moments)
        table.add_row("[bold]peak[/]", f"[bold]{bd.total:,.0f}[/]", f"[bold]{_gb(bd.total)}[/]",
                      f"[bold]{_gib(bd.total)}[/]", escape(f"at the {bd.moment} (moments: {live})"))
    else:
        table.add_row("[bold]total[/]", f"[bold]{bd.total:,.0f}[/]", f"[bold]{_gb(bd.total)}[/]",
                      f"[bold]{_gib(bd.total)}[/]", "")
    table.add_row("usable", f"{capacity:,.0f}", _gb(capacity), _gib(capacity),
                  f"{gpu_mem:g} GiB x (1 - {margin:.0%} margin)")
    con.print(table)
    con.print("GB = 10^9 bytes (as in the ZeRO paper), GiB = 2^30 bytes", highlight=False)
    con.print(f"needs {bd.total / (1 - margin) / 2**30:.1f} GiB of GPU memory per GPU at {bd.gpus} GPUs (the peak "
              f"with the {margin:.0%} margin)", highlight=False)
    if fit is not None:
        con.print(f"[bold]minimum: {fit.gpus} GPUs = {fit.nodes} node{'s' if fit.nodes > 1 else ''} of "
                  f"{gpus_per_node}[/] (dp {fit.dp} x tp {setup.tp} x pp {setup.pp}): {_gb(fit.breakdown.total)} GB "
                  f"per GPU <= {_gb(capacity)} GB usable ({gpu_mem:g} GiB less {margin:.0%} margin)",
                  highlight=False)
        if gpus is not None and bd.total > capacity:
            con.print(f"does not fit at {gpus} GPUs: {_gb(bd.total)} GB > {_gb(capacity)} GB usable", highlight=False)
    else:
        con.print(f"[bold red]does not fit[/] on {gpu_mem:g} GiB GPUs ({_gb(capacity)} GB usable with {margin:.0%} "
                  f"margin) with any number of GPUs: {STRATEGY_LABELS[setup.strategy]} keeps {_gb(floor)} GB per GPU "
                  f"that more data parallelism does not divide", highlight=False)
        if hint is not None:
            s, f = hint
            changes = " ".join(f"--{k.replace('_', '-')} {getattr(s, k)}" for k in ("strategy", "recompute", "tp", "pp")
                               if getattr(s, k) != getattr(setup, k))
            con.print(f"suggestion: {changes}: fits on {f.gpus} GPUs = {f.nodes} node{'s' if f.nodes > 1 else ''} "
                      f"({_gb(f.breakdown.total)} GB per GPU)", highlight=False)
        else:
            con.print("no strategy, recompute mode or tp/pp up to a node fits: larger GPUs or a smaller "
                      "micro-batch/sequence are needed", highlight=False)
    cmp_table = Table(title=f"strategies at {n_gpus} (same model, precision, tp, pp, recompute)")
    for c in ("strategy", "model state GB", "activations GB", "total GB", "total GiB", "fits", "min GPUs", "nodes"):
        cmp_table.add_column(c, justify="left" if c == "strategy" else "right")
    for r in compare:
        mark = " *" if r["requested"] else ""
        cmp_table.add_row(STRATEGY_LABELS[r["strategy"]] + mark, _gb(r["model_state_bytes"]),
                          _gb(r["activations_bytes"]) if is_arch else "-", _gb(r["total_bytes"]),
                          _gib(r["total_bytes"]), "yes" if r["fits"] else "no",
                          str(r["min_gpus"]) if r["min_gpus"] else "never", str(r["min_nodes"] or "-"))
    con.print(cmp_table)
    for n in notes:
        con.print(escape(f"note: {n}"), highlight=False)
    if fit is None:
        raise typer.Exit(1)
