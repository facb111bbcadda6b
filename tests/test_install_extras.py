"""`pip install trainyard` is the CLI and the control plane, without PyTorch (issue 17 item 6).

The package metadata keeps torch, transformers, TensorBoard and matplotlib out of the base
dependencies (extras train, sim, all), and the base really works without them: a real `yard up`,
`yard submit`, `yard queue`, `yard report` and `yard sim` run in processes for which those four
cannot be imported (a directory first on PYTHONPATH whose packages of those names raise
ImportError, as on a login node where they were never installed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from tests.plane import YARD, YardServer

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "tensorboard", "matplotlib")


def _name(req: str) -> str:
    for sep in "<>=!~[; ":
        req = req.split(sep)[0]
    return req.strip().lower()


def test_the_base_install_pulls_no_pytorch_and_the_extras_do():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in meta["dependencies"]}
    assert not base & set(HEAVY), base & set(HEAVY)
    extras = meta["optional-dependencies"]
    assert {_name(r) for r in extras["train"]} >= {"torch", "transformers", "tensorboard"}
    assert "matplotlib" in {_name(r) for r in extras["sim"]}
    assert extras["all"] == ["trainyard[train,sim]"]
    torch_req = next(r for r in extras["train"] if _name(r) == "torch")
    assert ">=" in torch_req and "==" not in torch_req  # a range: installs into an existing PyTorch env


def _without_heavy(tmp: Path) -> dict[str, str]:
    shim = tmp / "not-installed"
    for m in HEAVY:
        (shim / m).mkdir(parents=True)
        (shim / m / "__init__.py").write_text(f"raise ImportError('{m} is not installed here')\n")
    path = os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path}


def test_the_plane_and_the_cli_run_without_torch_transformers_tensorboard_matplotlib(tmp_path):
    env = _without_heavy(tmp_path)
    check = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert check.returncode != 0 and "not installed here" in check.stderr  # the shim works
    server = YardServer(tmp_path / "yard", env=env)
    server.data_dir.mkdir()
    server.start()
    try:
        yenv = {**env, "YARD_URL": server.url, "YARD_TOKEN": server.token}

        def yard(*args: str) -> str:
            p = subprocess.run([YARD, *args], env=yenv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
            assert p.returncode == 0, f"yard {' '.join(args)}: {p.returncode}\n{p.stdout}\n{p.stderr}"
            return p.stdout

        out = yard("submit", "-G", "1", "-A", "vision", "--", "sh", "-c", "echo hello from a job")
        job = int(out.split()[-1])
        deadline = time.monotonic() + 90
        while True:
            (j,) = [x for x in json.loads(yard("queue", "-t", "all", "--json")) if x["id"] == job]
            if j["state"] == "COMPLETED":
                break
            assert j["state"] in ("PENDING", "RUNNING", "COMPLETING"), j
            assert time.monotonic() < deadline, j
            time.sleep(0.3)
        assert "hello from a job" in yard("logs", str(job))
        assert json.loads(yard("report", "--json"))["cluster"]["gpus"] == 8
        sim = tmp_path / "sim"
        yard("sim", "--format", "synthetic", "--jobs", "30", "--cluster", "2x4", "--policies", "fifo",
             "--seed", "1", "--out", str(sim))
        assert (sim / "report.json").exists() and not (sim / "utilization.png").exists()
        assert "trainyard[sim]" in (sim / "report.md").read_text()
        up_log = (server.data_dir / "up.log").read_text()
        assert "not installed here" not in up_log, up_log[-2000:]
    finally:
        server.terminate()
