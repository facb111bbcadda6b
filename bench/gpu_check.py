"""The prepared GPU check (issue 19 part 7): what only a real GPU can show, in under 8 minutes.

    bash bench/gpu_check.sh [--out DIR] [--dry-run]      # the wrapper: python, wheels, time box
    python bench/gpu_check.py --out DIR [--stages a,b] [--budget-s 450] [--peak-tflops 989] [--dry-run]

Stages, in this order, each in a process of its own, time-boxed, reporting pass, fail or skip on
its own (a failed stage does not stop the next; one that needs another's result is skipped
without it):

| stage | what | pass when |
|---|---|---|
| env | torch, CUDA, the GPUs, NCCL's version; an 8192³ bf16 matmul (the achievable peak) | a CUDA device is there |
| nvml | the control plane's NVML health check (`control/health/nvml.py`) on the real GPUs, and the node agent's telemetry read (`backends/local/gpu_agent.py`, issue 39) | OK, every GPU read by both, the agent's with source `nvml`, utilization, memory, power and temperature |
| recipe_nccl | `llama-pretrain` (3M parameters) on CUDA over NCCL: one GPU, one rank in an NCCL group of one, started as the control plane starts a rank (NCCL refuses two ranks on one GPU); two or more GPUs: `yard run --nproc 2`, DDP | exit 0, NCCL initialised, the loss falls |
| throughput | `yard run llama-pretrain` at ~1B parameters (hidden 2048, 22 layers, GQA 16/4 heads, SwiGLU 5632, sequence 2048, bf16 autocast, 16 × 2048 tokens a step) | tokens/s and MFU measured, MFU ≥ `--min-mfu` |
| planner | `plan.memory` for that run (one process, SDPA, 2 micro-batches) against its `max_memory_allocated` (the runtime's `finished` event); the run trains fp32 weights under bf16 autocast, which the planner has no mode for, so its bf16 and fp32 plans bound it | within [0.9 × the bf16 plan, 1.1 × the fp32 plan] |
| checkpoint | the ~1B model and its AdamW state on the GPU: the runtime's async save (what the loop waits for) against a blocking save | async stall ≤ 0.20 × the blocking save |
| resume | `yard run` stopped by SIGUSR1, run again, against an uninterrupted run: per-step losses | bit-identical |

MFU = tokens/s × FLOPs per token / (GPUs × peak). FLOPs per token = 6·N + 12·L·d·s (PaLM,
appendix B: forward and backward of the matmuls, N the parameters outside the input embedding,
plus attention's QKᵀ and AV with L layers, d = heads × head size, s the sequence length; causal
masking is not discounted; the convention of `recipes/throughput.py`). The peak is
`--peak-tflops`, else the dense bf16 figure of the GPU's data sheet by name
(`recipes/throughput.py`: H200 989); the share of the env stage's measured matmul is reported
beside it, and the recipe's own `mfu` where its metrics carry one.

Outputs in `--out`: `gpu_check.json` (every stage: status, reason, seconds, figures),
`gpu_check.md` (a summary table), `gpu_check.log` (this driver's log and the tail of each stage
that did not pass). Large files (checkpoints of 12 GB, run dirs) go to `--work` (default a new
directory under /var/tmp, removed at the end unless `--keep-work`).

Without a CUDA device (or with `--dry-run`) the GPU stages are skipped — `skipped: no CUDA
device` — after the checks that need none: every stage's recipe and `--set` values validate,
the 1B configuration has 0.9–1.1 B parameters, the FLOPs, MFU, planner and NVML judgement code
runs on made-up figures. Exit code: 0 when no stage failed, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# ~1B parameters (0.99e9 with the byte vocabulary): TinyLlama's shape with 16 heads of 128
ONE_B = {"hidden_size": 2048, "intermediate_size": 5632, "num_layers": 22, "num_heads": 16, "num_kv_heads": 4,
         "max_seq_len": 2048}
SMALL = ("data.max_bytes=2000000", "precision=bf16", "optim.warmup_steps=10")  # the default 3M-parameter model


@dataclass(frozen=True)
class Sizes:
    """The sizes of the stages: `GPU`, or `CPU_SMOKE` (`--cpu-smoke`: every stage's code on this CPU)."""

    big: dict[str, int]  # model.* of the throughput and checkpoint stages
    seq: int
    batch: int
    micro: int
    small: tuple[str, ...]  # --set values of recipe_nccl and resume
    nccl_steps: int
    resume_steps: int
    resume_signal_at: int
    resume_checkpoint_every: int
    matmul_n: int


GPU = Sizes(ONE_B, 2048, 16, 8, SMALL, 80, 300, 40, 100, 8192)
CPU_SMOKE = Sizes({"hidden_size": 64, "intermediate_size": 172, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                   "max_seq_len": 128}, 64, 8, 4,
                  ("data.max_bytes=400000", "data.seq_len=64", "batch.global_batch_size=8", "model.hidden_size=64",
                   "model.intermediate_size=172", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2",
                   "optim.warmup_steps=2"), 40, 60, 10, 20, 256)


def sizes(a: argparse.Namespace) -> Sizes:
    return CPU_SMOKE if getattr(a, "cpu_smoke", False) else GPU
STATUSES = ("pass", "fail", "skip")


@dataclass
class Result:
    stage: str
    status: str  # pass | fail | skip
    reason: str = ""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)


# -- the model and its arithmetic (no torch) -------------------------------------------------------------


def one_b_sets(steps: int, sz: Sizes = GPU) -> list[str]:
    return [*(f"model.{k}={v}" for k, v in sz.big.items()), f"data.seq_len={sz.seq}",
            f"batch.global_batch_size={sz.batch}", f"batch.micro_batch_size={sz.micro}", "precision=bf16",
            "deterministic=false", f"steps={steps}", "checkpoint_every=null", "print_every=5",
            "optim.warmup_steps=5", "keep_last=1"]


def one_b_arch(sz: Sizes = GPU):  # noqa: ANN201 - plan.memory.ModelArch
    from trainyard.plan.memory import ModelArch

    b = sz.big
    return ModelArch("recipe-1b", layers=b["num_layers"], hidden=b["hidden_size"], heads=b["num_heads"],
                     kv_heads=b["num_kv_heads"], ffn=b["intermediate_size"], vocab=264, max_positions=b["max_seq_len"])


def flops_per_token(arch: Any, seq: int) -> float:
    """6·N + 12·L·d·s (module docstring); N excludes the input embedding (a lookup, no matmul)."""
    n = arch.params - arch.embedding_params
    return 6.0 * n + 12.0 * arch.layers * arch.heads * arch.head_size * seq


def peak_tflops(device_name: str, override: float | None) -> float | None:
    """`--peak-tflops`, else the recipes' table of dense bf16 peaks (`recipes/throughput.py`)."""
    if override:
        return override
    from trainyard.recipes.throughput import device_peak_tflops

    return device_peak_tflops(device_name, "bf16")


def throughput(records: list[dict[str, Any]], *, tokens_per_step: int, warmup: int) -> dict[str, Any]:
    """Median step time over the steps after `warmup`, and tokens/s from it."""
    steps = {r["step"]: r for r in records if "event" not in r and "step_time_s" in r}
    timed = [steps[s]["step_time_s"] for s in sorted(steps) if s > warmup]
    if not timed:
        raise ValueError(f"no step after the first {warmup} in the metrics")
    med = statistics.median(timed)
    return {"steps_timed": len(timed), "step_time_s_median": round(med, 5), "step_time_s_min": round(min(timed), 5),
            "tokens_per_step": tokens_per_step, "tokens_per_s": round(tokens_per_step / med, 1)}


def mfu(tokens_per_s: float, fpt: float, gpus: int, peak: float | None) -> dict[str, Any]:
    achieved = tokens_per_s * fpt / 1e12
    return {"flops_per_token": fpt, "achieved_tflops": round(achieved, 2),
            "mfu": None if not peak else round(achieved / (gpus * peak), 4), "peak_tflops": peak}


def plan_prediction(precision: str = "bf16", sz: Sizes = GPU) -> tuple[float, str]:
    """(bytes, moment) `plan.memory` predicts for the throughput run on one GPU: one process (no
    wrapper), SDPA, no recompute, `batch / micro` micro-batches a step, in `precision`."""
    from trainyard.plan.memory import TrainSetup, memory_per_gpu

    setup = TrainSetup(strategy="ddp", precision=precision, seq=sz.seq, micro_batch=sz.micro,
                       grad_accumulation=sz.batch // sz.micro)
    bd = memory_per_gpu(one_b_arch(sz), setup, dp=1)
    return bd.total, bd.moment


def judge_plan(measured: float, low: float, high: float) -> tuple[str, str]:
    """The run trains fp32 weights under bf16 autocast, which the planner has no mode for: its bf16
    plan (16-bit weights and activations) and its fp32 plan (32-bit everything) bound the run
    from below and above. Pass: the measurement within [0.9 x bf16 plan, 1.1 x fp32 plan]."""
    where = f"measured {measured / low:.2f}x the bf16 plan, {measured / high:.2f}x the fp32 plan"
    if measured > 1.10 * high:
        return "fail", f"{where}: above both plans (the planner under-estimates)"
    if measured < 0.9 * low:
        return "fail", f"{where}: below both plans (the planner over-estimates)"
    return "pass", where


def read_metrics(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if isinstance(r, dict):
            out.append(r)
    return out


def last_per_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in records if "event" not in r and "step" in r}


# -- helpers for the stages ------------------------------------------------------------------------------


def yard_cmd(*args: str) -> list[str]:
    """`yard …` through this interpreter (the `yard` script may not be installed)."""
    return [sys.executable, "-m", "trainyard.cli.main", *args]


def run_cmd(recipe: str, out: Path, nproc: int, sets: list[str]) -> list[str]:
    cmd = yard_cmd("run", recipe, "--nproc", str(nproc), "--out", str(out))
    for s in sets:
        cmd += ["--set", s]
    return cmd


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update(PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)
    return env


# the children of this process (and the run dir whose ranks they started), ended on a time-out or SIGTERM
_CHILDREN: list[tuple[subprocess.Popen, Path | None]] = []


def start(cmd: list[str], fh: Any, env: dict[str, str] | None = None, run_dir: Path | None = None) -> subprocess.Popen:
    fh.write(f"$ {' '.join(cmd)}\n")
    fh.flush()
    p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env or child_env(), start_new_session=True)
    _CHILDREN.append((p, run_dir))
    return p


def run_logged(cmd: list[str], log: Path, timeout: float, env: dict[str, str] | None = None,
               run_dir: Path | None = None) -> int:
    with open(log, "a") as fh:
        p = start(cmd, fh, env, run_dir)
        try:
            return p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            end_children()
            raise


def _kill_group(p: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def end_children() -> None:
    """End every child still running: its process group, then the ranks its `yard run` started
    (each in a group of its own; their pids are in the run dir's run.json)."""
    while _CHILDREN:
        p, run_dir = _CHILDREN.pop()
        if p.poll() is None:
            _kill_group(p)
        try:
            pids = json.loads((run_dir / "run.json").read_text()).get("pids", []) if run_dir else []
        except (OSError, ValueError, AttributeError):
            pids = []
        for pid in pids:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, PermissionError, ValueError):
                pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- the stages (each runs in its own process: `--stage NAME`) --------------------------------------------


def stage_env(a: argparse.Namespace) -> Result:
    try:
        import torch
    except ImportError as e:
        return Result("env", "skip", f"no CUDA device (torch is not importable: {e})", figures={"cuda": False})
    f: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                         "python": sys.version.split()[0]}
    if not f["cuda"] and a.cpu_smoke:
        return Result("env", "pass", "no CUDA device: --cpu-smoke runs the stages on the CPU", figures={**f, "gpus": 1})
    if not f["cuda"]:
        return Result("env", "skip", "no CUDA device", figures=f)
    f.update(cuda_version=torch.version.cuda, gpus=torch.cuda.device_count(),
             device_name=torch.cuda.get_device_name(0),
             capability=".".join(map(str, torch.cuda.get_device_capability(0))),
             memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    try:
        f["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception as e:  # noqa: BLE001
        f["nccl"] = f"unknown ({e})"
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        f["driver"] = smi.stdout.strip().splitlines()[0] if smi.returncode == 0 and smi.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        f["driver"] = None
    n = sizes(a).matmul_n
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        x @ y
    end.record()
    torch.cuda.synchronize()
    f["matmul_bf16_tflops"] = round(10 * 2 * n**3 / (start.elapsed_time(end) / 1000) / 1e12, 1)
    f["peak_tflops"] = peak_tflops(f["device_name"], a.peak_tflops)
    return Result("env", "pass", f"{f['gpus']} x {f['device_name']}, torch {f['torch']}, CUDA {f['cuda_version']}, "
                                 f"NCCL {f['nccl']}", figures=f)


def stage_nvml(a: argparse.Namespace) -> Result:
    from trainyard.control.health.checks import OK
    from trainyard.control.health.nvml import check, session
    from trainyard.spec.models import CheckSpec

    t = time.monotonic()
    status, message = check(CheckSpec(name="nvml", kind="nvml"))
    f: dict[str, Any] = {"status": status, "message": message, "check_s": round(time.monotonic() - t, 3)}
    s = session()
    if message.startswith("no NVML here"):
        return Result("nvml", "fail", message, figures=f)
    readings = s.readings()
    f.update(gpus_read=len(readings), notes=s.notes,
             readings=[asdict(r) for r in readings])
    if len(readings) < a.gpus:
        return Result("nvml", "fail", f"NVML read {len(readings)} GPUs, torch sees {a.gpus}", figures=f)
    if status != OK:
        return Result("nvml", "fail", f"{status}: {message}", figures=f)
    agent = agent_readings()
    f["agent_readings"] = agent
    whole = [r for r in agent if r["source"] == "nvml" and r["power_w"] is not None and r["temp_c"] is not None]
    if len(whole) < a.gpus:
        return Result("nvml", "fail", f"the node agent read {len(whole)} GPUs whole by NVML, torch sees {a.gpus}",
                      figures=f)
    return Result("nvml", "pass", f"{status}: {message} ({len(readings)} GPUs; the node agent read them all)", figures=f)


def agent_readings() -> list[dict[str, Any]]:
    """The local backend's node agent on this machine's GPUs, as one node (issue 39's telemetry):
    NVML's utilization, memory, power and temperature per GPU, timed; [] without NVML."""
    from trainyard.backends.base import NodeInfo
    from trainyard.backends.local import gpu_use
    from trainyard.backends.local.gpu_agent import NodeAgent

    nv = gpu_use.nvml()
    if nv is None:
        return []
    node = NodeInfo("node0", int(nv.nvmlDeviceGetCount()), "gpu", 0)
    t = time.monotonic()
    got = NodeAgent([node], {"node0": 0}, nvml=lambda: nv).read([])
    return [{**asdict(r), "read_s": round(time.monotonic() - t, 4)} for r in got]


def stage_recipe_nccl(a: argparse.Namespace) -> Result:
    out = Path(a.work) / "nccl"
    log = Path(a.work) / "recipe_nccl.log"
    sz = sizes(a)
    sets = [*sz.small, f"steps={sz.nccl_steps}", f"checkpoint_every={sz.nccl_steps // 2}", "print_every=20"]
    env = child_env(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT")
    if a.gpus >= 2:
        how = "yard run --nproc 2 (DDP over NCCL)"
        rc = run_logged(run_cmd("llama-pretrain", out, 2, sets), log, a.timeout, env, out)
    else:
        how = ("one rank in an NCCL group of one (as the control plane starts a rank)" if not a.cpu_smoke else
               "one rank in a gloo group of one (--cpu-smoke)")
        out.mkdir(parents=True, exist_ok=True)
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()), TRAINYARD_CHECKPOINT_DIR=str(out / "checkpoints"),
                   TRAINYARD_METRICS_DIR=str(out / "metrics"))
        cmd = [sys.executable, "-m", "trainyard.recipes", "llama-pretrain"]
        for s in sets:
            cmd += ["--set", s]
        rc = run_logged(cmd, log, a.timeout, env)
    text = log.read_text(errors="replace")
    f: dict[str, Any] = {"how": how, "exit_code": rc, "nccl_initialised": "NCCL INFO" in text}
    if rc != 0:
        return Result("recipe_nccl", "fail", f"{how}: exit {rc}", figures=f)
    m = last_per_step(read_metrics(out / "metrics" / "metrics.jsonl"))
    losses = [m[s]["loss"] for s in sorted(m)]
    f.update(steps=len(losses), loss_first=round(statistics.mean(losses[:10]), 4),
             loss_last=round(statistics.mean(losses[-10:]), 4), on_cuda="(cuda)" in text,
             tokens_per_s=m[max(m)].get("tokens_per_s"))
    if not f["on_cuda"] and not a.cpu_smoke:
        return Result("recipe_nccl", "fail", "the rank did not train on CUDA", figures=f)
    if not f["nccl_initialised"] and not a.cpu_smoke:
        return Result("recipe_nccl", "fail", "no NCCL INFO lines in the ranks' output: NCCL was not used", figures=f)
    if len(losses) != sz.nccl_steps or not f["loss_last"] < f["loss_first"] - 0.3:
        return Result("recipe_nccl", "fail", f"{len(losses)} steps, loss {f['loss_first']} -> {f['loss_last']}",
                      figures=f)
    return Result("recipe_nccl", "pass", f"{how}: {len(losses)} steps, loss {f['loss_first']} -> {f['loss_last']}",
                  figures=f)


def stage_throughput(a: argparse.Namespace) -> Result:
    out = Path(a.work) / "throughput"
    log = Path(a.work) / "throughput.log"
    sz = sizes(a)
    rc = run_logged(run_cmd("llama-pretrain", out, 1, one_b_sets(a.steps, sz)), log, a.timeout, run_dir=out)
    f: dict[str, Any] = {"exit_code": rc, "setup": one_b_sets(a.steps, sz)}
    try:
        if rc != 0:
            return Result("throughput", "fail", f"yard run exit {rc}", figures=f)
        records = read_metrics(out / "metrics" / "metrics.jsonl")
        f.update(throughput(records, tokens_per_step=sz.batch * sz.seq, warmup=a.warmup_steps))
        arch = one_b_arch(sz)
        f["parameters"] = arch.params
        f.update(mfu(f["tokens_per_s"], flops_per_token(arch, sz.seq), 1, a.peak))
        if a.matmul_tflops:
            f["of_measured_matmul_peak"] = round(f["achieved_tflops"] / a.matmul_tflops, 4)
        own = [r["mfu"] for s, r in sorted(last_per_step(records).items()) if s > a.warmup_steps and "mfu" in r]
        if own:  # the recipe's own figure, where its trainer sets FLOPs and peak (runtime metrics)
            f["recipe_mfu_median"] = statistics.median(own)
        fin = [r for r in records if r.get("event") == "finished"]
        if fin and "peak_gpu_mem_mib" in fin[-1]:
            f["peak_gpu_mem_mib"] = fin[-1]["peak_gpu_mem_mib"]
        text = f"{f['tokens_per_s']:,.0f} tokens/s, {f['achieved_tflops']} TFLOP/s"
        if f["mfu"] is None:
            return Result("throughput", "pass", text + "; MFU unknown (no peak for this GPU: --peak-tflops)",
                          figures=f)
        text += f", MFU {f['mfu']:.1%} of {f['peak_tflops']} TFLOP/s"
        if f["mfu"] < a.min_mfu:
            return Result("throughput", "fail", f"{text} < --min-mfu {a.min_mfu}", figures=f)
        return Result("throughput", "pass", text, figures=f)
    finally:
        shutil.rmtree(out / "checkpoints", ignore_errors=True)  # 12 GB: the checkpoint stage needs the disk


def stage_planner(a: argparse.Namespace) -> Result:
    from trainyard.plan.memory import GIB

    prev = _load_result(Path(a.work), "throughput")
    measured_mib = (prev or {}).get("figures", {}).get("peak_gpu_mem_mib")
    if measured_mib is None:
        return Result("planner", "skip", "no max_memory_allocated from the throughput stage")
    measured = measured_mib * 2**20
    (low, low_at), (high, high_at) = plan_prediction("bf16", sizes(a)), plan_prediction("fp32", sizes(a))
    status, why = judge_plan(measured, low, high)
    f = {"measured_gib": round(measured / GIB, 2), "planned_bf16_gib": round(low / GIB, 2), "bf16_peak_at": low_at,
         "planned_fp32_gib": round(high / GIB, 2), "fp32_peak_at": high_at,
         "ratio_bf16": round(measured / low, 3), "ratio_fp32": round(measured / high, 3)}
    return Result("planner", status, f"{why} ({f['measured_gib']} GiB measured; planned {f['planned_bf16_gib']} "
                                     f"GiB in bf16, {f['planned_fp32_gib']} GiB in fp32)", figures=f)


def stage_checkpoint(a: argparse.Namespace) -> Result:
    import torch

    import trainyard.runtime as yr
    from trainyard.recipes.models import model_config
    from trainyard.recipes.spec import load_recipe
    from trainyard.recipes.train import build_optimizer  # the recipe's own AdamW

    deadline = time.monotonic() + a.timeout - 15
    spec = load_recipe("llama-pretrain", one_b_sets(a.steps, sizes(a)))
    ctx = yr.init(seed=0)
    cfg = model_config(spec.model)
    from transformers import LlamaForCausalLM

    with ctx.device:  # built where it trains: on the GPU, in seconds
        model = LlamaForCausalLM(cfg)
    opt = build_optimizer(model, spec)
    ids = torch.randint(0, 256, (1, 128), device=ctx.device)
    with torch.autocast(ctx.device.type, dtype=torch.bfloat16, enabled=ctx.device.type == "cuda"):
        model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    state_bytes += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                       if torch.is_tensor(t))
    root = Path(a.work) / "ckpt"
    free = shutil.disk_usage(a.work).free
    f: dict[str, Any] = {"state_gb": round(state_bytes / 1e9, 2), "disk_free_gb": round(free / 1e9, 1),
                         "dir": str(root)}
    if free < 2.3 * state_bytes:
        return Result("checkpoint", "skip", f"{f['disk_free_gb']} GB free under {a.work}, need "
                                            f"{2.3 * state_bytes / 1e9:.0f} GB for two checkpoints", figures=f)
    mgr = yr.CheckpointManager(root, model=model, optimizer=opt, keep_last=1, group=ctx.checkpoint_group,
                               control_group=ctx.control_group)
    step = 1
    t = time.perf_counter()
    mgr.save(step, blocking=False)
    f["first_async_blocking_s"] = round(time.perf_counter() - t, 3)  # allocates the staging buffers
    mgr.wait()
    f["first_async_until_committed_s"] = write_s = round(time.perf_counter() - t, 3)
    sync_s, block_s, commit_s = [], [], []
    while True:
        # a round is a blocking save and an async one: it runs only if it fits, 3 rounds at most
        if len(sync_s) >= 3 or time.monotonic() + 2.4 * write_s > deadline:
            break
        step += 1
        t = time.perf_counter()
        mgr.save(step, blocking=True)
        sync_s.append(time.perf_counter() - t)
        step += 1
        t = time.perf_counter()
        mgr.save(step, blocking=False)
        block_s.append(time.perf_counter() - t)
        mgr.wait()
        commit_s.append(time.perf_counter() - t)
        write_s = max(sync_s[-1], commit_s[-1])
    mgr.close()
    shutil.rmtree(root, ignore_errors=True)
    if not sync_s:
        return Result("checkpoint", "fail", f"one save of {f['state_gb']} GB took {write_s:.0f} s: no time left for "
                                            "a blocking and an async one", figures=f)
    ms, mb = statistics.median(sync_s), statistics.median(block_s)
    f.update(rounds=len(sync_s), sync_save_s=round(ms, 3), async_blocking_s=round(mb, 4),
             async_until_committed_s=round(statistics.median(commit_s), 3), ratio=round(mb / ms, 4),
             write_gb_per_s=round(state_bytes / 1e9 / ms, 2), target_ratio=0.20)
    text = (f"{f['state_gb']} GB of model and AdamW state: the loop waits {mb:.3f} s for an async save, "
            f"{ms:.2f} s for a blocking one (ratio {mb / ms:.3f})")
    if a.cpu_smoke:  # a tiny state's saves are fixed costs: the code ran, the ratio means nothing
        return Result("checkpoint", "pass", text + " (--cpu-smoke: not judged)", figures=f)
    return Result("checkpoint", "pass" if mb / ms <= 0.20 else "fail", text, figures=f)


def stage_resume(a: argparse.Namespace) -> Result:
    nproc = 2 if a.gpus >= 2 else 1
    sz = sizes(a)
    steps = sz.resume_steps
    sets = [*sz.small, f"steps={steps}", f"checkpoint_every={sz.resume_checkpoint_every}", "print_every=50",
            "deterministic=true", "log_every=1"]  # every step's loss (CUDA's default writes every 10th)
    log = Path(a.work) / "resume.log"
    ref, out = Path(a.work) / "resume-ref", Path(a.work) / "resume"
    deadline = time.monotonic() + a.timeout
    rc = run_logged(run_cmd("llama-pretrain", ref, nproc, sets), log, max(10, deadline - time.monotonic()),
                    run_dir=ref)
    if rc != 0:
        return Result("resume", "fail", f"the uninterrupted run exited {rc}")
    metrics = out / "metrics" / "metrics.jsonl"
    with open(log, "a") as fh:
        p = start(run_cmd("llama-pretrain", out, nproc, sets), fh, run_dir=out)
        seen = 0
        while seen < sz.resume_signal_at and p.poll() is None and time.monotonic() < deadline:
            if metrics.exists():
                seen = max(last_per_step(read_metrics(metrics)) or [0])
            time.sleep(0.02)
        p.send_signal(signal.SIGUSR1)
        try:
            rc = p.wait(timeout=max(10, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            end_children()
            raise
    if rc != 75:
        return Result("resume", "fail", f"SIGUSR1 at step {seen}: exit {rc}, not 75", figures={"signal_at": seen})
    stopped = max(last_per_step(read_metrics(metrics)))
    rc = run_logged(run_cmd("llama-pretrain", out, nproc, sets), log, max(10, deadline - time.monotonic()),
                    run_dir=out)
    f: dict[str, Any] = {"nproc": nproc, "signal_at": seen, "stopped_at": stopped, "steps": steps}
    if rc != 0:
        return Result("resume", "fail", f"the rerun exited {rc}", figures=f)
    got = {s: r["loss"] for s, r in last_per_step(read_metrics(metrics)).items()}
    want = {s: r["loss"] for s, r in last_per_step(read_metrics(ref / "metrics" / "metrics.jsonl")).items()}
    differ = [s for s in range(1, steps + 1) if s not in got or s not in want or float(got[s]).hex() !=
              float(want[s]).hex()]
    f.update(differing_steps=len(differ), first_difference=None if not differ else
             {"step": differ[0], "got": got.get(differ[0]), "want": want.get(differ[0])})
    if differ:
        return Result("resume", "fail", f"stopped at step {stopped}; {len(differ)} of {steps} losses differ "
                                        f"(first at step {differ[0]})", figures=f)
    return Result("resume", "pass", f"stopped at step {stopped} by SIGUSR1, resumed: {steps} of {steps} losses "
                                    "bit-identical", figures=f)


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[argparse.Namespace], Result]
    timeout_s: float  # the most it may take on one H200 (its share of the 8 minutes)
    needs: str | None = None  # a stage whose result it reads


STAGES = (
    Stage("env", stage_env, 40),
    Stage("nvml", stage_nvml, 20),
    Stage("recipe_nccl", stage_recipe_nccl, 60),
    Stage("throughput", stage_throughput, 120),
    Stage("planner", stage_planner, 15, needs="throughput"),
    Stage("checkpoint", stage_checkpoint, 110),
    Stage("resume", stage_resume, 85),
)
BY_NAME = {s.name: s for s in STAGES}


# -- what runs without a GPU ------------------------------------------------------------------------------


def validate(a: argparse.Namespace) -> list[str]:
    """The checks that need no GPU (module docstring). Raises on a problem; returns what was checked."""
    from trainyard.control.health.checks import CRITICAL, OK
    from trainyard.control.health.nvml import GpuReading, evaluate
    from trainyard.recipes.spec import load_recipe

    done = []
    for name, nproc, sets in (("recipe_nccl", 1, [*SMALL, "steps=80", "checkpoint_every=40"]),
                              ("recipe_nccl (2 GPUs)", 2, [*SMALL, "steps=80", "checkpoint_every=40"]),
                              ("throughput", 1, one_b_sets(a.steps)),
                              ("resume", 2, [*SMALL, "steps=300", "checkpoint_every=100", "deterministic=true"]),
                              ("--cpu-smoke", 2, [*CPU_SMOKE.small, "steps=60"]),
                              ("--cpu-smoke throughput", 1, one_b_sets(a.steps, CPU_SMOKE))):
        spec = load_recipe("llama-pretrain", sets)
        spec.check_world_size(nproc)
        done.append(f"{name}: llama-pretrain with {len(sets)} --set values validates on {nproc} rank(s)")
    arch = one_b_arch()
    spec = load_recipe("llama-pretrain", one_b_sets(a.steps))
    assert (arch.hidden, arch.layers, arch.heads, arch.kv_heads, arch.ffn) == (
        spec.model.hidden_size, spec.model.num_layers, spec.model.num_heads, spec.model.num_kv_heads,
        spec.model.intermediate_size), "the planner's model is not the recipe's"
    assert 0.9e9 <= arch.params <= 1.1e9, arch.params
    done.append(f"the 1B configuration has {arch.params:,} parameters")
    fpt = flops_per_token(arch, GPU.seq)
    assert 6 * arch.params < fpt < 8 * arch.params, fpt
    records = [{"step": s, "step_time_s": 0.5 if s <= 3 else 0.25} for s in range(1, 11)]
    tp = throughput(records, tokens_per_step=GPU.batch * GPU.seq, warmup=3)
    m = mfu(tp["tokens_per_s"], fpt, 1, peak_tflops("NVIDIA H200", None))
    assert tp["tokens_per_s"] == GPU.batch * GPU.seq / 0.25 and 0 < m["mfu"] < 1, (tp, m)
    done.append(f"FLOPs per token {fpt:.3e}; made-up 0.25 s steps give {tp['tokens_per_s']:,.0f} tokens/s, "
                f"MFU {m['mfu']:.1%} on an H200")
    (low, _), (high, _) = plan_prediction("bf16"), plan_prediction("fp32")
    assert low < high and judge_plan(low, low, high)[0] == "pass" and judge_plan(1.2 * high, low, high)[0] == "fail"
    done.append(f"the planner predicts {low / 2**30:.1f} GiB (bf16) to {high / 2**30:.1f} GiB (fp32) for the "
                "throughput run")
    assert evaluate([GpuReading(0, 40.0)], [], max_temp_c=90, since=0, now=0)[0] == OK
    assert evaluate([GpuReading(0, 40.0, ecc_uncorrected=1)], [], max_temp_c=90, since=0, now=0)[0] == CRITICAL
    done.append("the NVML judgement runs on made-up readings")
    assert sum(s.timeout_s for s in STAGES) <= 8 * 60 - 30, "the stages' time boxes exceed the 8 minutes"
    done.append(f"{len(STAGES)} stages, time boxes {sum(s.timeout_s for s in STAGES):.0f} s in all")
    return done


# -- the driver ------------------------------------------------------------------------------------------


def _load_result(work: Path, stage: str) -> dict[str, Any] | None:
    try:
        return json.loads((work / f"{stage}.result.json").read_text())
    except (OSError, ValueError):
        return None


def run_stage(stage: Stage, a: argparse.Namespace, timeout: float, extra: list[str], say: Callable[[str], None]
              ) -> Result:
    work = Path(a.work)
    (work / f"{stage.name}.result.json").unlink(missing_ok=True)
    log = work / f"{stage.name}.stage.log"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--stage", stage.name, "--work", str(work),
           "--timeout", str(timeout), "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps),
           "--min-mfu", str(a.min_mfu), *(["--cpu-smoke"] if a.cpu_smoke else []), *extra]
    t = time.monotonic()
    with open(log, "w") as fh:
        p = start(cmd, fh)
        try:
            rc = p.wait(timeout=timeout + 10)
        except subprocess.TimeoutExpired:
            end_children()  # SIGTERM first: the stage ends its own children
            rc = None
        _CHILDREN.clear()
    seconds = round(time.monotonic() - t, 1)
    found = _load_result(work, stage.name)
    if found is not None:
        r = Result(**found)
        r.seconds = seconds
    elif rc is None:
        r = Result(stage.name, "fail", f"timed out after {timeout:.0f} s", seconds)
    else:
        r = Result(stage.name, "fail", f"exited {rc} without a result", seconds)
    if r.status == "fail":
        say(f"--- {stage.name}: the last lines of its output ---\n{tail(log)}")
        for extra_log in sorted(work.glob(f"{stage.name}*.log")):
            if extra_log != log:
                say(f"--- {extra_log.name} ---\n{tail(extra_log)}")
    return r


def stage_main(a: argparse.Namespace) -> int:
    """One stage in this process: its Result in `<work>/<stage>.result.json`."""
    stage = BY_NAME[a.stage]

    def on_term(*_: Any) -> None:  # the driver's time box: end what this stage started, then go
        end_children()
        os._exit(124)

    signal.signal(signal.SIGTERM, on_term)
    t = time.monotonic()
    try:
        r = stage.run(a)
    except subprocess.TimeoutExpired as e:
        r = Result(stage.name, "fail", f"timed out: {' '.join(map(str, e.cmd))[:200]}")
    except Exception as e:  # noqa: BLE001 - the stage failed; the driver goes on
        import traceback

        traceback.print_exc()
        r = Result(stage.name, "fail", f"{type(e).__name__}: {e}"[:500])
    r.seconds = round(time.monotonic() - t, 1)
    (Path(a.work) / f"{stage.name}.result.json").write_text(json.dumps(asdict(r), default=str))
    sys.stdout.flush()
    os._exit(0)  # no interpreter teardown: CUDA/NCCL destructors at exit are not the stage's result


def summary(results: list[Result], validated: list[str], seconds: float) -> str:
    lines = ["# GPU check (bench/gpu_check.sh)", "",
             f"{time.strftime('%Y-%m-%d %H:%M:%S')}, {seconds:.0f} s in all", "",
             "| stage | status | seconds | result |", "|---|---|---:|---|"]
    lines += [f"| {r.stage} | {r.status} | {r.seconds:.0f} | {r.reason} |" for r in results]
    if validated:
        lines += ["", "Checked without a GPU:", *[f"- {v}" for v in validated]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/gpu_check.py", description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="where gpu_check.json/.md/.log go (default $OUT or ./gpu-check-out)")
    ap.add_argument("--work", type=Path, default=None, help="run dirs and checkpoints (default: new under /var/tmp)")
    ap.add_argument("--keep-work", action="store_true", help="leave --work in place")
    ap.add_argument("--stages", default="all", help=f"comma-separated, of: {', '.join(BY_NAME)} (default all)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="the most the stages may take in all (default 450)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="the GPU's bf16 dense peak, for MFU")
    ap.add_argument("--min-mfu", type=float, default=0.10, help="the throughput stage fails below this MFU")
    ap.add_argument("--steps", type=int, default=30, help="steps of the ~1B throughput run (default 30)")
    ap.add_argument("--warmup-steps", type=int, default=5, help="its first steps not timed (default 5)")
    ap.add_argument("--dry-run", action="store_true", help="validate everything, run no GPU stage")
    ap.add_argument("--cpu-smoke", action="store_true", help="no GPU: run every stage on this CPU at tiny sizes "
                                                                 "(their code, not their figures; for development)")
    # a stage process (the driver starts these)
    ap.add_argument("--stage", choices=list(BY_NAME), help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    ap.add_argument("--gpus", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--peak", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--matmul-tflops", type=float, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    names = list(BY_NAME) if a.stages == "all" else [s.strip() for s in a.stages.split(",") if s.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        ap.error(f"--stages: unknown stage {unknown[0]!r}; known: {', '.join(BY_NAME)}" if unknown else
                 "--stages: none given")
    if "env" not in names:
        names.insert(0, "env")  # every other stage needs to know the GPUs
    a.stage_names = [s.name for s in STAGES if s.name in names]
    for name in ("budget_s", "steps", "warmup_steps"):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')}: must be positive")
    if a.steps <= a.warmup_steps:
        ap.error("--steps: must exceed --warmup-steps")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.stage:
        return stage_main(a)
    started = time.monotonic()
    out = Path(a.out or os.environ.get("OUT") or "gpu-check-out").resolve()
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "gpu_check.log"
    log = open(log_path, "w")

    def say(msg: str) -> None:
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    # SIGTERM (the wrapper's time box): leave through `finally`, so the report is still written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    own_work = a.work is None
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None  # a disk, where /tmp may be memory
    a.work = Path(a.work or tempfile.mkdtemp(prefix="gpu-check-", dir=base)).resolve()
    a.work.mkdir(parents=True, exist_ok=True)
    say(f"gpu_check: stages {', '.join(a.stage_names)}; budget {a.budget_s:.0f} s; out {out}; work {a.work}")
    results: list[Result] = []
    validated: list[str] = []
    try:
        try:
            validated = validate(a)
            for v in validated:
                say(f"validated: {v}")
        except Exception as e:  # noqa: BLE001
            say(f"validation failed: {type(e).__name__}: {e}")
            results.append(Result("validate", "fail", f"{type(e).__name__}: {e}"[:500]))
        env: Result | None = None
        no_gpu = "dry run: no GPU stage runs" if a.dry_run else None
        for stage in STAGES:
            if stage.name not in a.stage_names:
                continue
            if no_gpu is not None:
                r = Result(stage.name, "skip", f"skipped: {no_gpu}")
            else:
                left = a.budget_s - (time.monotonic() - started)
                need = results_by(results, stage.needs) if stage.needs else None
                if stage.needs and (need is None or need.status != "pass"):
                    r = Result(stage.name, "skip", f"skipped: needs the {stage.needs} stage, which did not pass")
                elif left < min(stage.timeout_s, 20):
                    r = Result(stage.name, "skip", f"skipped: {left:.0f} s left of the --budget-s")
                else:
                    extra = []
                    if env is not None:
                        fig = env.figures
                        extra += ["--gpus", str(fig.get("gpus", 1))]
                        if fig.get("peak_tflops"):
                            extra += ["--peak", str(fig["peak_tflops"])]
                        if fig.get("matmul_bf16_tflops"):
                            extra += ["--matmul-tflops", str(fig["matmul_bf16_tflops"])]
                    if a.peak_tflops:
                        extra += ["--peak-tflops", str(a.peak_tflops)]
                    r = run_stage(stage, a, min(stage.timeout_s, left), extra, say)
                if stage.name == "env":
                    env = r
                    if r.status != "pass":
                        no_gpu = "no CUDA device" if not r.figures.get("cuda") and r.status == "skip" else \
                            f"the env stage failed ({r.reason})"
                        if r.status == "skip":
                            r.reason = f"skipped: {r.reason}"
            results.append(r)
            say(f"{r.stage}: {r.status}{' (' + str(r.seconds) + ' s)' if r.seconds else ''} — {r.reason}")
    finally:
        end_children()
        report = {"started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.monotonic() - started, 1),
                  "dry_run": a.dry_run, "budget_s": a.budget_s, "validated": validated,
                  "stages": [asdict(r) for r in results]}
        (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
        (out / "gpu_check.md").write_text(summary(results, validated, time.monotonic() - started))
        if own_work and not a.keep_work:
            shutil.rmtree(a.work, ignore_errors=True)
        log.close()
    failed = [r.stage for r in results if r.status == "fail"]
    print(f"gpu_check: {sum(r.status == 'pass' for r in results)} passed, {len(failed)} failed"
          f"{' (' + ', '.join(failed) + ')' if failed else ''}, {sum(r.status == 'skip' for r in results)} skipped; "
          f"{out / 'gpu_check.md'}", flush=True)
    return 1 if failed else 0


def results_by(results: list[Result], name: str | None) -> Result | None:
    return next((r for r in results if r.stage == name), None)


if __name__ == "__main__":
    sys.exit(main())
