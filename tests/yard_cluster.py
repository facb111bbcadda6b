"""A real `yard up` on either backend, driven through the `yard` CLI as a user would: the local
backend's two emulated nodes, or the Slurm backend on the real 2-node test cluster
(tests/slurm_cluster.py). The shared CLI suite and the Slurm scenarios build on it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.plane import FIXTURES, TWO_TEAMS, YARD, YardServer, job_dir
from tests.slurm_cluster import SlurmCluster, slurm_available

SLURM_TWO_TEAMS = FIXTURES / "slurm_two_teams.yaml"


class YardCluster:
    def __init__(self, workdir: Path, backend: str, config_file: Path | None = None,
                 slurm_nodes: tuple[str, ...] = ("n1", "n2"), slurm_options: dict[str, Any] | None = None):
        """`config_file`: the configuration (default: TWO_TEAMS, nodes node-0/node-1, on the local
        backend; SLURM_TWO_TEAMS, nodes n1/n2, on Slurm). `slurm_nodes`: the test Slurm cluster's
        node names, which a Slurm `config_file` names too (a corpus that runs the same on both
        backends gives both the same names); `slurm_options`: more of SlurmCluster's arguments
        (node features, the GPU type)."""
        self.backend = backend
        self.data_dir = workdir / "yard"
        self.data_dir.mkdir(parents=True)
        self.slurm: SlurmCluster | None = None
        env = dict(os.environ)
        env["OMP_NUM_THREADS"] = "1"  # ranks inherit it: several share two cores
        if backend == "slurm":
            reason = slurm_available()
            if reason:
                pytest.skip(reason)
            self.slurm = SlurmCluster(workdir / "slurm", nodes=slurm_nodes, **(slurm_options or {})).start()
            env.update(self.slurm.env())
            self.server = YardServer(self.data_dir, config_file=config_file or SLURM_TWO_TEAMS,
                                     args=("--backend", "slurm"), env=env)
            self.nodes = list(slurm_nodes)
        else:
            self.server = YardServer(self.data_dir, config_file=config_file or TWO_TEAMS, env=env)
            self.nodes = ["node-0", "node-1"]
        self._env = env
        try:
            self.http = self.server.start()
        except BaseException:
            self.stop()
            raise

    def restart(self) -> None:
        """`yard up` again on the same data dir (after the test killed it)."""
        self.http.close()
        self.http = self.server.start()

    def stop(self) -> None:
        try:
            if getattr(self, "http", None) is not None:
                for j in self.http.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
                    self.http.post(f"/api/v1/jobs/{j['id']}/cancel")
                deadline = time.monotonic() + 20
                while self.http.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self.server.terminate()
        if self.slurm is not None:
            self.slurm.stop()

    def env(self) -> dict[str, str]:
        e = {k: v for k, v in self._env.items() if not k.startswith(("TRAINYARD_", "YARD_"))}
        e["YARD_DATA_DIR"] = str(self.data_dir)
        return e

    def yard(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        r = subprocess.run([YARD, *args], env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"yard {' '.join(args)}: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r

    def submit(self, *args: str) -> int:
        out = self.yard("submit", *args).stdout
        return int(out.split("Submitted job")[1].split()[0])

    def job(self, job_id: int) -> dict[str, Any]:
        r = self.http.get(f"/api/v1/jobs/{job_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def wait(self, job_id: int, pred: Callable[[dict], bool] | str, timeout: float = 120.0) -> dict[str, Any]:
        check = (lambda j: j["state"] == pred) if isinstance(pred, str) else pred
        deadline = time.monotonic() + timeout
        while True:
            j = self.job(job_id)
            if check(j):
                return j
            assert time.monotonic() < deadline, f"job {job_id}: {j['state']} ({j['reason']}) after {timeout}s"
            time.sleep(0.1)

    def job_dir(self, job_id: int) -> Path:
        return job_dir(self.data_dir, job_id)

    def wait_committed(self, job_id: int, step: int, timeout: float = 120.0) -> None:
        ckpt = self.job_dir(job_id) / "checkpoints"
        deadline = time.monotonic() + timeout
        while not any(int(p.parent.name.split("-")[1]) >= step for p in ckpt.glob("step-*/COMMITTED")):
            j = self.job(job_id)
            assert j["state"] in ("PENDING", "CONFIGURING", "RUNNING"), f"job {job_id} {j['state']} before step {step}: {j['reason']}"
            assert time.monotonic() < deadline, f"no checkpoint of step {step} after {timeout}s"
            time.sleep(0.1)

    def wait_slurm_empty(self, timeout: float = 30.0) -> None:
        """Until Slurm runs nothing of ours (an ended job passes through COMPLETING first)."""
        deadline = time.monotonic() + timeout
        while left := self.slurm_jobs():
            assert time.monotonic() < deadline, f"still in Slurm after {timeout}s: {left}"
            time.sleep(0.2)

    def slurm_jobs(self) -> list[str]:
        """Slurm's view: jobs still pending or running (empty on the local backend)."""
        if self.slurm is None:
            return []
        return [x for x in self.slurm.run("squeue", "-h", "-o", "%i %j %T").stdout.splitlines() if x.strip()]


def losses(job_dir: Path) -> dict[int, float]:
    """The last loss logged for each step (metrics.jsonl, rank 0)."""
    out = {}
    for line in (job_dir / "metrics" / "metrics.jsonl").read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if "event" not in r and "step" in r and "loss" in r:
            out[r["step"]] = r["loss"]
    return out
