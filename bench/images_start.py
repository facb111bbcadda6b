"""Issue 37's benchmark: what an image costs a job (bench/README.md, "Environment images").

    .venv/bin/python bench/images_start.py [--rounds 5] [--steps 40] [--json FILE]

Run as root (the node caches and runc are root's), with the image tools installed
(scripts/images-setup.sh). It starts Debian's docker-registry on loopback, builds (or takes from
`.cache/test-images/`) the tests' images — `10mb` (busybox and filler, ~10 MB compressed) and `torch` (Debian's Python,
the pinned CPU PyTorch, trainyard) — pushes them, and drives a real `yard up` on the local backend:

1. time from submit (the HTTP POST) to the job's first line in its log, for each image with a cold
   node cache (a fresh data dir: pull, unpack, run) and a warm one (the same node again), and for a
   bare job (no image) in the same run as the baseline;
2. a rank's start overhead in a container against a bare process: the warm median minus the bare
   median of (1), goal <= 0.5 s;
3. steps per second of the `llama-pretrain` recipe (tiny model, 1 rank) inside the torch image and
   outside it with the very same software (the image's site-packages on this machine's Debian
   python3.11, which is the image's package), goal: within 2%; and, for reference, outside with the
   plane's own venv (another Python build and transformers release). The runs alternate,
   `--rounds` of each after one to warm the page cache, and the medians are compared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT)]

from _yard import YardServer, conditions  # noqa: E402

from tests import image_builds  # noqa: E402
from tests.image_registry import Registry  # noqa: E402
from tests.recipes.helpers import TINY_PRETRAIN  # noqa: E402

FIRST = "first-line-of-the-job"
WORKDIR = Path(tempfile.mkdtemp(prefix="bench-images-work-"))


def _config(path: Path, registry: str) -> Path:
    path.write_text(f"""\
cluster:
  name: bench-images
  nodes:
    - {{name: node-0, gpus: 4, gpu_model: a100, gpu_mem_gb: 16}}
teams:
  - name: bench
    quotas:
      default: {{nominal: 4}}
classes:
  - {{name: training, priority: 100}}
default_class: training
images:
  allowed_registries: ["{registry}"]
""")
    return path


def _submit(y: YardServer, body: dict[str, Any]) -> tuple[int, float]:
    with y.client() as c:
        t0 = time.perf_counter()
        r = c.post("/api/v1/jobs", json={"team": "bench", "gpus_per_node": 1, "nodes": 1, "workdir": str(WORKDIR), **body})
        r.raise_for_status()
        return int(r.json()["id"]), t0


def _job_dir(y: YardServer, job: int) -> Path:
    """DATA_DIR/jobs/<id>-<key> (contracts.JobDir), once the plane has made it."""
    deadline = time.monotonic() + 900
    while not (found := sorted((y.data_dir / "jobs").glob(f"{job}-*"))):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job}: no job dir after 900 s: {y.log_tail()}")
        time.sleep(0.01)
    return found[0]


def _first_line_s(y: YardServer, image: str | None) -> float:
    body: dict[str, Any] = {"name": "first", "command": ["/bin/sh", "-c", f"echo {FIRST}"]}
    if image:
        body["container"] = {"image": image}
    job, t0 = _submit(y, body)
    log = _job_dir(y, job) / "logs" / "rank-0.log"
    deadline = time.monotonic() + 900
    while True:
        try:
            if FIRST in log.read_text():
                took = time.perf_counter() - t0
                break
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job}: no first line after 900 s: {y.log_tail()}")
        time.sleep(0.01)
    _wait_done(y, job)
    return took


def _wait_done(y: YardServer, job: int, timeout: float = 900) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    with y.client() as c:
        while True:
            j = c.get(f"/api/v1/jobs/{job}").json()
            if j["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                return j
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job} still {j['state']} after {timeout}s")
            time.sleep(0.05)


def _image_site_packages(built: Any, into: Path) -> Path:
    """The torch image's layers unpacked with plain `tar` (no whiteouts in them) under `into`: its
    /opt/venv's site-packages, for the same software run outside a container."""
    into.mkdir(parents=True, exist_ok=True)
    for digest in built.layer_digests():
        algo, hexa = digest.split(":", 1)
        subprocess.run(["tar", "-xzf", str(built.layout / "blobs" / algo / hexa), "-C", str(into)], check=True)
    found = sorted(into.glob("opt/venv/lib/python3*/site-packages"))
    if not found:
        raise RuntimeError(f"no /opt/venv site-packages in {built.layout}")
    return found[0]


def _steps_per_s(y: YardServer, image: str | None, steps: int, python: str = "python3",
                 pythonpath: str | None = None) -> float:
    """Steps per second of the tiny llama-pretrain recipe, one rank: in `image`, else bare with
    `python` (and `pythonpath`)."""
    sets = [*TINY_PRETRAIN, f"steps={steps}", "checkpoint_every=1000"]
    env = {"OMP_NUM_THREADS": "1", **({"PYTHONPATH": pythonpath} if pythonpath else {})}
    body: dict[str, Any] = {"name": "steps", "env": env,
                            "command": [python, "-m", "trainyard.recipes", "llama-pretrain",
                                        *[x for s in sets for x in ("--set", s)]]}
    if image:
        body["container"] = {"image": image}
    job, _ = _submit(y, body)
    j = _wait_done(y, job)
    if j["state"] != "COMPLETED":
        raise RuntimeError(f"recipe job {job} {j['state']}: {j['reason']}")
    times = []
    for line in (_job_dir(y, job) / "metrics" / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if "event" not in rec and rec.get("step", 0) > 3 and "step_time_s" in rec:
            times.append(rec["step_time_s"])
    return 1.0 / statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out: dict[str, Any] = {"conditions": conditions()}
    t0 = time.perf_counter()
    # ~10 MB compressed: busybox and 19 MB of hexadecimal text (deterministic: built once, then cached)
    filler = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(300_000))
    built = {"10mb": image_builds.variant(image_builds.tiny(), "ten-mb", {"opt/filler.hex": filler}),
             "torch": image_builds.torch()}
    out["build_or_cache_s"] = round(time.perf_counter() - t0, 1)
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        (Path(tmp) / "registry").mkdir()
        reg = Registry(Path(tmp) / "registry")
        reg.start()
        try:
            images = {}
            for name, b in built.items():
                b.push(reg.address, f"bench/{name}:1")
                images[name] = f"{reg.address}/bench/{name}:1"
                out[f"{name}_compressed_mb"] = round(b.compressed_bytes() / 1e6, 1)
            cfg = _config(Path(tmp) / "bench.yaml", reg.address)
            first: dict[str, Any] = {}
            for name, image in images.items():
                with YardServer(config=cfg) as y:  # a fresh data dir: a cold cache
                    cold = _first_line_s(y, image)
                    warm, bare = [], []
                    for _ in range(args.rounds):
                        warm.append(_first_line_s(y, image))
                        bare.append(_first_line_s(y, None))
                    first[name] = {"cold_s": round(cold, 2), "warm_median_s": round(statistics.median(warm), 3),
                                   "bare_median_s": round(statistics.median(bare), 3),
                                   "warm_s": [round(x, 3) for x in warm], "bare_s": [round(x, 3) for x in bare]}
                    first[name]["container_overhead_s"] = round(
                        first[name]["warm_median_s"] - first[name]["bare_median_s"], 3)
                    print(name, json.dumps(first[name]), flush=True)
            out["submit_to_first_line"] = first
            # outside: the image's own software (its site-packages, Debian's python3.11 of this
            # machine: the image's is the same package) run bare; and the plane's venv, for reference
            # (not under /tmp: a job's /tmp is its own tmpfs, the host's is not there)
            site = _image_site_packages(built["torch"], Path(tempfile.mkdtemp(prefix="bench-torch-", dir=ROOT / ".cache")))
            with YardServer(config=cfg) as y:
                inside, outside, plane_venv = [], [], []
                _steps_per_s(y, images["torch"], args.steps)  # the page cache warm for both
                for _ in range(args.rounds):
                    outside.append(_steps_per_s(y, None, args.steps, "/usr/bin/python3", str(site)))
                    inside.append(_steps_per_s(y, images["torch"], args.steps))
                    plane_venv.append(_steps_per_s(y, None, args.steps, sys.executable))
                ratio = statistics.median(inside) / statistics.median(outside)
                out["recipe_steps_per_s"] = {
                    "inside": [round(x, 2) for x in inside], "outside_same_software": [round(x, 2) for x in outside],
                    "outside_plane_venv": [round(x, 2) for x in plane_venv],
                    "inside_over_outside": round(ratio, 4),
                    "inside_over_plane_venv": round(statistics.median(inside) / statistics.median(plane_venv), 4)}
                print("steps/s", json.dumps(out["recipe_steps_per_s"]), flush=True)
        finally:
            reg.stop()
            for d in (ROOT / ".cache").glob("bench-torch-*"):
                subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
