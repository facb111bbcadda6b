"""`bench/gpu_check.sh` without a GPU (issue 19 part 7's acceptance: it must parse and skip cleanly).

- `bash -n` parses the wrapper; a bad argument is `error: …`, exit 2.
- `--dry-run`: every stage's recipe and `--set` values validate, the 1B configuration and the
  FLOPs, MFU, planner and NVML judgement code run on made-up figures; every stage is skipped;
  exit 0; gpu_check.json/.md/.log in --out.
- On a machine without CUDA (this one), the plain run: the env stage finds no CUDA device and
  every stage reports `skipped: no CUDA device`; exit 0.
- `bench/gpu_check.py`'s arguments parse (and bad ones exit 2), its stages' time boxes fit the
  8 minutes, its arithmetic is right.
- (slow) `--cpu-smoke`: every stage's code runs on this CPU at tiny sizes — the recipe over a
  process group of one, the throughput run and its figures, the async against blocking
  checkpoint, the SIGUSR1 resume compared bit for bit — so that the one run on a lent GPU does
  not end on a typo.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def load_module():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def sh(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINYARD_", "OUT"))}
    env.update(GPU_CHECK_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout, env=env)


def report(out: Path) -> dict:
    assert {p.name for p in out.iterdir()} == {"gpu_check.json", "gpu_check.md", "gpu_check.log"}
    return json.loads((out / "gpu_check.json").read_text())


def test_the_wrapper_parses_and_refuses_bad_arguments(tmp_path):
    p = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    p = sh("--frobnicate")
    assert p.returncode == 2 and p.stderr.startswith("error: unknown argument '--frobnicate'"), p.stderr
    p = sh("--budget-s", "soon")
    assert p.returncode == 2 and "error: --budget-s:" in p.stderr
    assert sh("--help").returncode == 0


def test_dry_run_validates_the_stages_and_skips_them(tmp_path):
    out = tmp_path / "out"
    p = sh("--dry-run", "--out", str(out))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = report(out)
    names = [s["stage"] for s in r["stages"]]
    assert names == ["env", "nvml", "recipe_nccl", "throughput", "planner", "checkpoint", "resume"]
    assert all(s["status"] == "skip" and s["reason"].startswith("skipped: dry run") for s in r["stages"])
    assert any("the 1B configuration has 993,126,400 parameters" in v for v in r["validated"])
    assert any("throughput: llama-pretrain with" in v for v in r["validated"]) and r["dry_run"] is True
    assert "0 passed, 0 failed, 7 skipped" in p.stdout
    assert "| resume | skip |" in (out / "gpu_check.md").read_text()


def test_without_a_cuda_device_every_stage_is_skipped(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    out = tmp_path / "out"
    p = sh("--out", str(out))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "env: skip" in p.stdout and "skipped: no CUDA device" in p.stdout
    r = report(out)
    assert [s["status"] for s in r["stages"]] == ["skip"] * 7
    assert all(s["reason"] == "skipped: no CUDA device" for s in r["stages"]), r["stages"]
    assert r["stages"][0]["figures"]["cuda"] is False and r["validated"]


def test_the_helper_s_arguments_and_arithmetic():
    g = load_module()
    a = g.parse_args(["--stages", "throughput,planner", "--peak-tflops", "500", "--steps", "20"])
    assert a.stage_names == ["env", "throughput", "planner"] and a.peak_tflops == 500 and a.steps == 20
    for bad in (["--stages", "warp"], ["--steps", "3"], ["--budget-s", "0"], ["--nope"]):
        with pytest.raises(SystemExit) as e:
            g.parse_args(bad)
        assert e.value.code == 2, bad
    assert sum(s.timeout_s for s in g.STAGES) <= 8 * 60 - 30
    arch = g.one_b_arch()
    assert arch.params == 993_126_400
    # 6N (N without the 264 x 2048 input embedding) + 12 L d s
    assert g.flops_per_token(arch, 2048) == 6 * (arch.params - 264 * 2048) + 12 * 22 * 2048 * 2048
    assert g.peak_tflops("NVIDIA H200", None) == 989.0 and g.peak_tflops("NVIDIA A100-SXM4-80GB", None) == 312.0
    assert g.peak_tflops("Tesla T4", None) is None and g.peak_tflops("Tesla T4", 65.0) == 65.0
    m = g.mfu(100_000.0, 7e9, 1, 989.0)
    assert m["achieved_tflops"] == 700.0 and m["mfu"] == round(700 / 989.0, 4)
    records = [{"step": 1, "step_time_s": 9.0}, {"event": "checkpoint", "step": 1},
               *({"step": s, "step_time_s": 0.5} for s in range(2, 8))]
    assert g.throughput(records, tokens_per_step=1000, warmup=1)["tokens_per_s"] == 2000.0
    assert g.judge_plan(100, 90, 120)[0] == "pass" and g.judge_plan(133, 90, 120)[0] == "fail"
    assert g.judge_plan(80, 90, 120)[0] == "fail"


def test_its_flops_count_is_the_recipes_own():
    """The arch-based count (no torch in the driver) equals `recipes/throughput.py`'s on the built model."""
    from trainyard.recipes.models import build_model
    from trainyard.recipes.spec import ModelSpec
    from trainyard.recipes.throughput import flops_per_token

    g = load_module()
    sz = g.CPU_SMOKE
    model = build_model(ModelSpec.model_validate(sz.big))
    assert g.flops_per_token(g.one_b_arch(sz), sz.seq) == flops_per_token(model, sz.seq)
    assert g.one_b_arch(sz).params == sum(p.numel() for p in model.parameters())


def test_the_nvml_and_planner_stages_judge_what_they_read(tmp_path, monkeypatch):
    import argparse

    import trainyard.control.health.nvml as nvml
    from tests.control.health.test_health_nvml import FakeNvml

    from tests.backends.local.test_gpu_agent import FakeNvml as AgentNvml, NoPowerSensor
    from trainyard.backends.local import gpu_use

    g = load_module()
    monkeypatch.setattr(nvml, "_session", nvml.NvmlSession(FakeNvml([{"ecc": 0, "temp": 41}])))
    agent = AgentNvml({0: (55, 1024, 300_000, 60)})
    agent.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    monkeypatch.setattr(gpu_use, "nvml", lambda: agent)
    r = g.stage_nvml(argparse.Namespace(gpus=1))
    assert r.status == "pass" and r.figures["readings"][0]["temp_c"] == 41.0, r
    assert {k: r.figures["agent_readings"][0][k] for k in ("util", "mem_mib", "power_w", "temp_c", "source")} == \
        {"util": 55.0, "mem_mib": 1024.0, "power_w": 300.0, "temp_c": 60.0, "source": "nvml"}
    blind = NoPowerSensor({0: (55, 1024, 300_000, 60)})
    blind.nvmlDeviceGetCount = lambda: 1  # type: ignore[attr-defined]
    monkeypatch.setattr(gpu_use, "nvml", lambda: blind)
    assert g.stage_nvml(argparse.Namespace(gpus=1)).reason == \
        "the node agent read 0 GPUs whole by NVML, torch sees 1"
    monkeypatch.setattr(gpu_use, "nvml", lambda: agent)
    assert g.stage_nvml(argparse.Namespace(gpus=2)).reason == "NVML read 1 GPUs, torch sees 2"
    monkeypatch.setattr(nvml, "_session", nvml.NvmlSession(FakeNvml([{"ecc": 3}])))
    assert g.stage_nvml(argparse.Namespace(gpus=1)).reason == "critical: GPU 0: 3 uncorrectable ECC errors"

    a = argparse.Namespace(work=str(tmp_path), cpu_smoke=False)
    assert g.stage_planner(a).status == "skip"  # no throughput result
    low, high = (g.plan_prediction(p)[0] / 2**20 for p in ("bf16", "fp32"))
    for measured, status in (((low + high) / 2, "pass"), (high * 1.3, "fail"), (low * 0.8, "fail")):
        (tmp_path / "throughput.result.json").write_text(json.dumps(
            {"stage": "throughput", "status": "pass", "figures": {"peak_gpu_mem_mib": measured}}))
        r = g.stage_planner(a)
        assert r.status == status and r.figures["ratio_bf16"] == round(measured / low, 3), r


@pytest.mark.slow
def test_cpu_smoke_runs_every_stage_s_code(tmp_path):
    out = tmp_path / "out"
    p = sh("--out", str(out), "--", "--cpu-smoke", "--steps", "10", "--stages",
           "recipe_nccl,throughput,planner,checkpoint,resume", timeout=400)
    r = report(out)
    got = {s["stage"]: (s["status"], s["reason"]) for s in r["stages"]}
    assert p.returncode == 0, (got, p.stdout[-4000:])
    assert got["env"][0] == got["recipe_nccl"][0] == got["throughput"][0] == got["checkpoint"][0] == "pass", got
    assert got["resume"] == ("pass", got["resume"][1]) and "bit-identical" in got["resume"][1], got
    assert got["planner"][0] == "skip"  # no GPU memory to compare with
    figures = {s["stage"]: s["figures"] for s in r["stages"]}
    assert figures["throughput"]["tokens_per_s"] > 0 and figures["checkpoint"]["ratio"] > 0
