"""The `speed` built-in check: is this node as fast as its GPU model should be?

Issue 39 sends a node that slowed down jobs (a straggler in two unrelated jobs) to a speed check
before new work; it can also run as any other check, periodically or `when: before_work`. Two
figures, against `speed.baselines[<the node's gpu_model>]` in the configuration:

- **matmul TFLOP/s per GPU**: `iters` timed products of two `matmul_n`-sided square matrices
  (bf16 on a GPU, float32 on the CPU, repeated until `CPU_MIN_TIMED_S` has passed) after `WARMUP`
  untimed ones, 2·n³ flops each; the slowest GPU is
  judged (one slow GPU slows every gang it is in) and named;
- **all-reduce bus bandwidth** across the node's GPUs, as nccl-tests define it: a sum all-reduce
  of `allreduce_mib` MiB takes t seconds → algbw = bytes / t, busbw = algbw · 2(n−1)/n (the
  traffic a ring moves per rank, so the figure compares across GPU counts). NCCL on GPUs. With
  one GPU there is nothing to reduce across: the figure is not measured and not judged.

Below `min_fraction` of either baseline figure: CRITICAL, the measured figure and the baseline in
the message (the node is drained and remediated as for any CRITICAL); no baseline for the model:
WARN naming it (a person should write one); otherwise OK with the figures.

**The CPU path** (a machine without GPUs, as this project's test machines): the same code with
device "cpu": `cpu_ranks` processes stand for the GPUs, the all-reduce runs over gloo, the matmuls
run one rank at a time on one thread each (the ranks share the CPU's cores: at once, or with a
thread pool whose threads wait on each other's cores, they would measure each other — on this
project's shared 2-core machine two threads made a 256-sided matmul vary up to 80-fold, one thread
varied by less than 2), and the baseline is `baselines.cpu` — a CPU's figures say nothing about the node's GPU model.
Sizes default small on the CPU (256-sided matrices, 1 MiB) and large on GPUs (8192, 256 MiB).

**Where and how it runs.** On the local backend, inside the node's cell (`backends/local/check_cell.py`:
a cgroup under the node's level with the CPU quota its ranks get, so `yard chaos slow-node` slows
the check as it slows the node's ranks; the child enters it with `--join` once torch is loaded, before
its ranks start). In a child process (`python -m trainyard.control.health.speed`,
the plane's interpreter, the plane's environment less its credentials), so that torch never
loads into the plane and a hung collective is bounded: past `timeout` the child's whole process
group is killed and the check is CRITICAL, as any check past its time-out. The child is rank 0 and
starts the other ranks (forked on the CPU; spawned on GPUs, since CUDA cannot cross a fork); they
meet through a file store in a private temporary directory. Like `nvml`, it measures the GPUs of
the host the plane runs its checks on. Without torch installed (`pip install trainyard[train]`)
the check cannot measure: WARN, saying so (not OK: a suspect node must not be cleared unmeasured).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any

from trainyard.control.health.checks import CRITICAL, OK, WARN, operator_env
from trainyard.spec.models import CheckSpec, SpeedSpec

CPU_MODEL = "cpu"  # the baseline the CPU path is judged by
WARMUP = 2  # untimed repetitions first: threads, connections, caches
DEFAULTS = {"cuda": (8192, 256.0), "cpu": (256, 1.0)}  # matmul_n, allreduce_mib when not configured
# The CPU path repeats its `iters` products until this long has passed: a CPU quota (a slowed
# node's, `yard chaos slow-node`) is granted per 100 ms period, and a measurement inside one
# period's first slice runs at full speed (measured: 60 products of 256 took 77 ms and showed no
# slowdown under a quarter-CPU quota).
CPU_MIN_TIMED_S = 1.0


@dataclass(frozen=True)
class Figures:
    """What one run measured."""

    device: str  # cuda or cpu
    ranks: int  # GPUs (or CPU ranks) measured
    tflops: list[float]  # matmul TFLOP/s, per rank
    busbw_gbps: float | None  # all-reduce bus bandwidth, GB/s; None with one rank
    seconds: float  # the measurement's own time (after the ranks started)


def bus_bandwidth(ranks: int, nbytes: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth of an all-reduce, GB/s: bytes / time · 2(n−1)/n."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def judge(fig: Figures, spec: SpeedSpec, gpu_model: str | None) -> tuple[str, str]:
    """OK/WARN/CRITICAL and a message for `fig`, against the baseline of `gpu_model` (of `cpu`
    when the figures are the CPU's)."""
    model = CPU_MODEL if fig.device == "cpu" else gpu_model
    slow = min(range(fig.ranks), key=lambda r: fig.tflops[r])
    what = "GPU" if fig.device == "cuda" else "CPU rank"
    seen = f"matmul {fig.tflops[slow]:.4g} TFLOP/s ({what} {slow}, slowest of {fig.ranks})"
    if fig.busbw_gbps is not None:
        seen += f", all-reduce bus {fig.busbw_gbps:.4g} GB/s"
    base = spec.baselines.get(model) if model else None
    if base is None:
        if fig.device == "cpu":
            why = f"no baseline for {CPU_MODEL} (measured on the CPU; add speed.baselines.{CPU_MODEL})"
        else:
            why = f"no baseline for GPU model {model or '(unknown)'} (add speed.baselines.{model or 'MODEL'})"
        return WARN, f"{why}; {seen}"
    need = spec.min_fraction
    low = []
    if fig.tflops[slow] < need * base.tflops:
        low.append(f"matmul {fig.tflops[slow]:.4g} TFLOP/s on {what} {slow} < {need:g} × baseline {base.tflops:g}")
    if base.busbw_gbps is not None and fig.busbw_gbps is not None and fig.busbw_gbps < need * base.busbw_gbps:
        low.append(f"all-reduce bus {fig.busbw_gbps:.4g} GB/s < {need:g} × baseline {base.busbw_gbps:g}")
    ref = f"baseline {model}: {base.tflops:g} TFLOP/s" + (f", {base.busbw_gbps:g} GB/s" if base.busbw_gbps else "")
    if low:
        return CRITICAL, f"slow: {'; '.join(low)} ({model})"
    return OK, f"{seen}; {ref}, min {need:g}"


def check(spec: CheckSpec, gpu_model: str | None, join: list[str] | None = None) -> tuple[str, str]:
    """Measure in a child process bounded by the check's `timeout`, and judge. `join`: cgroup
    directories the child enters before it measures (the node's cell: `HealthChecker`'s `cell_of`)."""
    assert spec.speed is not None  # CheckSpec's validator: kind speed has its settings
    if importlib.util.find_spec("torch") is None:
        return WARN, "cannot measure: torch is not installed where the plane runs (pip install trainyard[train])"
    sp = spec.speed
    argv = [sys.executable, "-m", "trainyard.control.health.speed", "--device", sp.device, "--iters", str(sp.iters),
            "--cpu-ranks", str(sp.cpu_ranks)]
    argv += [x for d in join or [] for x in ("--join", d)]
    argv += ["--matmul-n", str(sp.matmul_n)] if sp.matmul_n else []
    argv += ["--allreduce-mib", repr(sp.allreduce_mib)] if sp.allreduce_mib else []
    try:
        code, out, err = _run(argv, spec.timeout)
    except subprocess.TimeoutExpired:
        return CRITICAL, f"speed test timed out after {spec.timeout:g}s"
    last = (out.strip().splitlines() or [""])[-1]
    try:
        got = json.loads(last)
    except ValueError:
        tail = (err.strip().splitlines() or [f"exit {code}"])[-1]
        return CRITICAL, f"speed test failed (exit {code}): {tail[:200]}"
    if "error" in got:
        return CRITICAL, f"speed test failed: {str(got['error'])[:200]}"
    return judge(Figures(**got), sp, gpu_model)


def _run(argv: list[str], timeout: float) -> tuple[int, str, str]:
    """`argv` in a session of its own; past `timeout` the whole group (its ranks too) is killed."""
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=operator_env(), start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.communicate()
        raise
    return p.returncode, out[-100_000:], err[-100_000:]


# -- the child: the measurement itself ------------------------------------------------------------

def _rank(rank: int, ranks: int, device: str, store: str, matmul_n: int, nbytes: int, iters: int,
          results: Any) -> None:
    """One rank: the all-reduce (every rank at once), then its matmul (on the CPU, one rank at a
    time), its figures put on `results`."""
    import torch
    import torch.distributed as dist

    dev = torch.device(device, rank) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    else:
        torch.set_num_threads(1)  # a CPU rank stands for one GPU: one core (module docstring)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if ranks > 1:
        dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}", rank=rank,
                                world_size=ranks)
    busbw = None
    if ranks > 1:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=dev)
        for _ in range(WARMUP):  # the connections are made in the first
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync()
        took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the collective is as slow as its slowest rank
        busbw = bus_bandwidth(ranks, x.numel() * 4, took.item() / iters)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a = torch.randn(matmul_n, matmul_n, dtype=dtype, device=dev)
    b = torch.randn(matmul_n, matmul_n, dtype=dtype, device=dev)
    tflops = 0.0
    for turn in range(ranks if device == "cpu" else 1):
        if device == "cuda" or turn == rank:
            for _ in range(WARMUP):
                c = a @ b
            sync()
            t0, done = time.perf_counter(), 0
            while done == 0 or device == "cpu" and time.perf_counter() - t0 < CPU_MIN_TIMED_S:
                for _ in range(iters):
                    c = a @ b
                done += iters
            sync()
            del c
            tflops = 2 * matmul_n**3 * done / (time.perf_counter() - t0) / 1e12
        if ranks > 1 and device == "cpu":
            dist.barrier()
    results.put((rank, tflops, busbw))
    if ranks > 1:
        dist.destroy_process_group()


def measure(device: str, cpu_ranks: int, matmul_n: int | None, allreduce_mib: float | None, iters: int,
            join: list[str] | None = None) -> Figures:
    """The figures of this host's GPUs (or its CPU): rank 0 here, the others in child processes.
    `join`: cgroup directories entered once torch is loaded, before the ranks start (every process
    that measures is inside; the import, the same on every node, is not slowed with them)."""
    import multiprocessing

    import torch

    for d in join or []:
        with open(os.path.join(d, "cgroup.procs"), "w") as f:  # plane's own: the node cell the backend made
            f.write(str(os.getpid()))

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device cuda asked for, and torch sees no GPU")
    ranks = torch.cuda.device_count() if device == "cuda" else cpu_ranks
    n, mib = matmul_n or DEFAULTS[device][0], allreduce_mib or DEFAULTS[device][1]
    nbytes = int(mib * 2**20)
    # CUDA does not survive a fork; on the CPU a fork spares each rank torch's import
    ctx = multiprocessing.get_context("spawn") if device == "cuda" else multiprocessing.get_context("fork")
    results = ctx.Queue()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="trainyard-speed-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank, args=(r, ranks, device, store, n, nbytes, iters, results), daemon=True)
                 for r in range(1, ranks)]
        for p in procs:
            p.start()
        _rank(0, ranks, device, store, n, nbytes, iters, results)
        got = sorted(results.get() for _ in range(ranks))
        for p in procs:
            p.join()
            if p.exitcode:
                raise RuntimeError(f"rank {procs.index(p) + 1} exited {p.exitcode}")
    return Figures(device, ranks, [t for _, t, _ in got], got[0][2], time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    """Print this host's figures as one JSON line (or `{"error": …}`): the `speed` check's child,
    and a way to find a node's baseline by hand."""
    ap = argparse.ArgumentParser(prog="python -m trainyard.control.health.speed", description=main.__doc__)
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--cpu-ranks", type=int, default=2)
    ap.add_argument("--matmul-n", type=int)
    ap.add_argument("--allreduce-mib", type=float)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--join", action="append", default=[], help="a cgroup directory to enter first (the node's cell)")
    a = ap.parse_args(argv)
    try:
        fig = measure(a.device, a.cpu_ranks, a.matmul_n, a.allreduce_mib, a.iters, a.join)
    except Exception as e:  # noqa: BLE001 - the parent turns it into the check's finding
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    print(json.dumps(asdict(fig)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
