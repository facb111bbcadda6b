"""Benchmark: `pip install trainyard` without extras, in a fresh venv (issue 17, acceptance line 6).

    .venv/bin/python bench/install_base.py [--runs 9] [--keep DIR] [--json]

Builds a wheel from this checkout (`pip wheel --no-deps`), makes a fresh venv (`python -m venv`,
from the Python of `.venv`), installs the wheel there without extras (pip resolves the base
dependencies from its configured index), then checks what a login node would get:

- `pip list` of the new venv names none of torch, transformers, tensorboard, matplotlib;
- its size on disk (MiB, every file under the venv) against the full dev venv that runs this
  script, `.venv` (`make venv`: `.[all,test]`), both measured in this run;
- `yard --help` from the new venv exits 0;
- a real `yard up` from the new venv (its own temporary data dir, tests/fixtures/two_teams.yaml)
  answers /healthz, and `yard queue` from the new venv against it exits 0;
- `yard queue` start-up, wall clock from exec to exit against that server, median of `--runs`
  runs, the base venv's and `.venv`'s `yard` interleaved, and their ratio: the base install has no
  torch to import, and the CLI should not import it either.

Why a wheel and a fresh venv rather than the shim of tests/test_install_extras.py: only a real
install shows that the metadata, the package data and the entry point are right, and what a user
actually downloads. Prints a table, or with `--json` one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _yard import RUN_AS_ME, conditions

ROOT = Path(__file__).resolve().parents[1]
DEV_VENV = Path(sys.prefix)  # the venv running this: `.venv`, the full one (make venv)
DEV_PY = Path(sys.executable)
CONFIG = ROOT / "tests" / "fixtures" / "two_teams.yaml"
HEAVY = ("torch", "transformers", "tensorboard", "matplotlib")
# The children's environment: no YARD_* of the caller's, and no PYTHONPATH, which would make the
# fresh venv import a source tree instead of the installed wheel.
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith(("YARD_", "TRAINYARD_")) and k != "PYTHONPATH"}


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("env", CLEAN_ENV)
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return p


def size_mib(path: Path) -> float:
    """Bytes on disk of every file under `path` (st_blocks, symlinks not followed), in MiB."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total / 2**20


def build_and_install(work: Path) -> tuple[Path, dict]:
    """The wheel from this checkout, a fresh venv, the wheel installed there without extras."""
    out: dict = {}
    dist = work / "dist"
    t0 = time.perf_counter()
    run([str(DEV_PY), "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], cwd=work)
    (wheel,) = dist.glob("trainyard-*.whl")
    out["wheel"] = wheel.name
    out["wheel_kib"] = round(wheel.stat().st_size / 1024)
    out["wheel_build_s"] = round(time.perf_counter() - t0, 1)
    venv = work / "venv"
    run([str(DEV_PY), "-m", "venv", str(venv)])
    t0 = time.perf_counter()
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)])
    out["install_s"] = round(time.perf_counter() - t0, 1)
    return venv, out


def installed(venv: Path) -> dict[str, str]:
    rows = json.loads(run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"]).stdout)
    return {r["name"].lower(): r["version"] for r in rows}


def start_yard(yard: Path, data_dir: Path) -> tuple[subprocess.Popen, str, str]:
    """`yard up` as tests/plane.py's YardServer starts it: URL from server.json, token from admin.token."""
    data_dir.mkdir(parents=True)
    env = CLEAN_ENV
    log = open(data_dir / "up.log", "a")
    proc = subprocess.Popen([str(yard), "up", "--data-dir", str(data_dir), "--port", "0", "--config", str(CONFIG),
                             *RUN_AS_ME], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    deadline = time.monotonic() + 120
    import httpx  # the dev venv's, only to wait for /healthz

    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"yard up exited {proc.returncode}: {(data_dir / 'up.log').read_text()[-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("yard up did not answer /healthz in 120 s")
        try:
            meta = json.loads((data_dir / "server.json").read_text())
            if meta.get("pid") == proc.pid:
                url = meta["url"]
                token = (data_dir / "admin.token").read_text().strip()
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    return proc, url, token
        except (OSError, ValueError, KeyError, httpx.TransportError):
            pass
        time.sleep(0.05)


def stop_yard(proc: subprocess.Popen) -> int:
    proc.terminate()
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def queue_once(yard: Path, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    run([str(yard), "queue", "-t", "all"], env=env, timeout=120)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=9, help="`yard queue` runs per venv (median)")
    ap.add_argument("--keep", type=Path, help="build in this directory and keep it (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    work = a.keep.resolve() if a.keep else Path(tempfile.mkdtemp(prefix="yard-install-"))
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"conditions": conditions()}
    try:
        venv, res["build"] = build_and_install(work)
        pkgs = installed(venv)
        res["packages"] = len(pkgs)
        res["heavy_installed"] = sorted(m for m in HEAVY if m in pkgs)
        res["base_venv_mib"] = round(size_mib(venv), 1)
        res["full_venv_mib"] = round(size_mib(DEV_VENV), 1)
        res["size_ratio"] = round(res["base_venv_mib"] / res["full_venv_mib"], 3)
        yard = venv / "bin" / "yard"
        res["help_ok"] = "queue" in run([str(yard), "--help"], env=CLEAN_ENV, timeout=120).stdout
        proc, url, token = start_yard(yard, work / "data")
        try:
            env = {**CLEAN_ENV, "YARD_URL": url, "YARD_TOKEN": token}
            res["queue_ok"] = "Traceback" not in run([str(yard), "queue", "-t", "all"], env=env, timeout=120).stderr
            base, full = [], []
            for _ in range(a.runs):  # interleaved, so both see the same load
                base.append(queue_once(yard, env))
                full.append(queue_once(DEV_VENV / "bin" / "yard", env))
        finally:
            res["up_exit"] = stop_yard(proc)
        res["queue_base_ms"] = round(statistics.median(base) * 1000)
        res["queue_full_ms"] = round(statistics.median(full) * 1000)
        res["queue_ratio"] = round(statistics.median(base) / statistics.median(full), 2)
        res["queue_base_range_ms"] = [round(min(base) * 1000), round(max(base) * 1000)]
        res["queue_full_range_ms"] = [round(min(full) * 1000), round(max(full) * 1000)]
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    ok = not res["heavy_installed"] and res["help_ok"] and res["queue_ok"]
    if a.json:
        print(json.dumps(res))
        sys.exit(0 if ok else 1)
    c, b = res["conditions"], res["build"]
    print(f"{b['wheel']} ({b['wheel_kib']} KiB), built in {b['wheel_build_s']} s, installed without extras in "
          f"{b['install_s']} s; load {c['load1']}, 1M-loop calibration {c['calibration_1m_loop_ms']} ms")
    print(f"{'':28} {'base (no extras)':>18} {'.venv [all,test]':>18} {'ratio':>7}")
    print(f"{'venv size MiB':28} {res['base_venv_mib']:>18,.1f} {res['full_venv_mib']:>18,.1f} {res['size_ratio']:>7}")
    print(f"{'yard queue start-up ms (p50)':28} {res['queue_base_ms']:>18} {res['queue_full_ms']:>18} "
          f"{res['queue_ratio']:>7}")
    print(f"packages {res['packages']}; torch/transformers/tensorboard/matplotlib installed: "
          f"{res['heavy_installed'] or 'none'}; yard --help ok: {res['help_ok']}; yard up + yard queue ok: "
          f"{res['queue_ok']} (yard up exit {res['up_exit']})")
    print(f"yard queue ms min-max: base {res['queue_base_range_ms']}, .venv {res['queue_full_range_ms']}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
