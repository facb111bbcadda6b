"""What one `yard` process costs before it does anything: the CPU and wall time of a few commands
(median of N runs) and how many modules each imports, for this tree and, with --against REF, for
another commit of it in the same run (a temporary git worktree), so the two figures share the load.

    .venv/bin/python bench/cli_startup.py                      # this tree, 15 runs per command
    .venv/bin/python bench/cli_startup.py --against main --runs 21 [--json]

Why: the test suite starts thousands of `yard` processes (tests/cli, the scenarios), each paying this.
The commands talk to no plane: YARD_URL names a closed local port, so a command that needs the
plane fails at its first request, right after its imports (what is measured); `--version` and
`--help` need none. Both trees are byte-compiled first, as `make pyc` does before the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = [["--version"], ["queue"], ["nodes"], ["submit", "--gpus", "1", "--", "true"], ["token", "list"],
            ["--help"]]
# The modules a command imports: python -c, as the `yard` script does, then counted at exit.
COUNT = ("import sys, atexit; sys.argv = ['yard', *sys.argv[1:]]; "
         "atexit.register(lambda: print('MODULES', len(sys.modules), file=sys.__stderr__)); "
         "from trainyard.cli.main import app; app()")


def env_for(src: Path, data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("YARD_", "TRAINYARD_"))}
    env.update(PYTHONPATH=str(src), YARD_URL="http://127.0.0.1:9", YARD_DATA_DIR=str(data), COLUMNS="80")
    return env


def one(args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one `yard ARGS`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", COUNT, *args], env=env, capture_output=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def modules(args: list[str], env: dict[str, str]) -> int:
    err = subprocess.run([sys.executable, "-c", COUNT, *args], env=env, capture_output=True, text=True).stderr
    return next((int(line.split()[1]) for line in err.splitlines() if line.startswith("MODULES")), -1)


def measure(trees: dict[str, Path], runs: int, data: Path) -> dict[str, dict[str, dict[str, float]]]:
    """Per tree, per command: median wall and CPU ms, modules. Runs interleave the trees (A B A B …)
    so that a change of load hits both alike."""
    samples: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(runs):
        for args in COMMANDS:
            for label, src in trees.items():
                samples.setdefault((label, " ".join(args)), []).append(one(args, env_for(src, data)))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (label, cmd), s in samples.items():
        src = trees[label]
        out.setdefault(label, {})[cmd] = {
            "wall_ms": round(statistics.median(w for w, _ in s) * 1000, 1),
            "cpu_ms": round(statistics.median(c for _, c in s) * 1000, 1),
            "modules": modules(cmd.split(), env_for(src, data)),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--against", metavar="REF", help="also measure this git commit (e.g. main), in the same run")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"this tree": ROOT / "src"}
        if a.against:
            other = Path(tmp) / "against"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(other), a.against],
                           check=True)
            trees = {a.against: other / "src", **trees}
        try:
            for src in trees.values():  # as `make test` runs them (`make pyc`): no process compiles a module
                subprocess.run([sys.executable, "-m", "compileall", "-q", str(src)], check=True, capture_output=True)
            data = Path(tmp) / "data"
            data.mkdir()
            res = measure(trees, a.runs, data)
        finally:
            if a.against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(other)], check=True)
    if a.json:
        print(json.dumps(res, indent=2))
        return
    print(f"median of {a.runs} runs each; load average {os.getloadavg()[0]:.1f}")
    print(f"{'command':28} " + " ".join(f"{label[:26]:>28}" for label in res))
    for cmd in res[next(iter(res))]:
        cells = [f"{r[cmd]['cpu_ms']:6.0f} ms cpu {r[cmd]['wall_ms']:5.0f} wall {r[cmd]['modules']:4d} mod"
                 for r in res.values()]
        print(f"yard {cmd[:23]:23} " + " ".join(f"{c:>28}" for c in cells))


if __name__ == "__main__":
    main()
