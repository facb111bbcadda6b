"""One check on one node, now: the result type, NHC's exit codes, and the `command` and `disk`
kinds; `nvml`, `dcgm` and `speed` live in their own modules.

A result is OK, WARN or CRITICAL with a one-line message, as LBNL NHC and Meta's GCM report
them. `run_check` never raises: a check that cannot run, or runs past its time-out, is itself a
finding (CRITICAL), so a broken check takes a node out rather than waving it through.

A `command` check (and a remediation action, control/health/remediation.py) is the operator's own
program, configured by an admin and run as the plane's account, as NHC runs under slurmd: it gets
the plane's environment (its PATH to `nvidia-smi`, a proxy for a reimage API), but never the
plane's credentials (`store.url.SECRET_VARS`: the store's password and URL, an admin token), since
its first output line becomes a node's reason that every member reads. One that needs a credential
reads it from a file its own command names.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from trainyard.contracts import JobVar
from trainyard.spec.models import CheckSpec
from trainyard.store.url import SECRET_VARS

OK, WARN, CRITICAL = "ok", "warn", "critical"
RANK = {OK: 0, WARN: 1, CRITICAL: 2}
EXIT_STATUS = {0: OK, 1: WARN, 2: CRITICAL}  # NHC's and GCM's exit codes

PERIODIC, BEFORE_WORK = "periodic", "before_work"  # the two kinds of round a result can come from


@dataclass(frozen=True)
class CheckResult:
    check: str
    status: str  # ok, warn, critical
    message: str
    at: float  # when the check started: it saw the node as it was from then on
    context: str = PERIODIC  # the round it ran in: periodic or before_work


def run_check(spec: CheckSpec, node: str, data_dir: Path, *, since: float = 0.0,
              context: str = PERIODIC, gpu_model: str | None = None,
              cell: Callable[[str], AbstractContextManager[list[str]]] | None = None) -> CheckResult:
    """One check on one node, now. Never raises: a check that cannot run is CRITICAL.

    `since`: findings a stateful check remembers from before this moment are forgotten (the
    node was remediated or an operator resumed it since; see `nvml` and its XID events).
    `gpu_model`: the node's, which picks the `speed` check's baseline.
    `cell`: the backend's `check_cell` where it has one: the `speed` check measures inside the
    node's cgroups (backends/local/check_cell.py), not in the plane's.
    """
    from trainyard.control.health import dcgm, nvml, speed  # the GPU kinds import nothing heavy until used

    now = time.time()
    try:
        if spec.kind == "command":
            status, msg = _command(spec, node, data_dir, context)
        elif spec.kind == "disk":
            status, msg = _disk(spec, node, data_dir)
        elif spec.kind == "dcgm":
            status, msg = dcgm.check(spec)
        elif spec.kind == "speed" and cell is not None:
            with cell(node) as join:
                status, msg = speed.check(spec, gpu_model, join)
        elif spec.kind == "speed":
            status, msg = speed.check(spec, gpu_model)
        else:
            status, msg = nvml.check(spec, since=since, now=now)
    except Exception as e:  # noqa: BLE001 - the check's failure is itself the finding
        status, msg = CRITICAL, f"check could not run: {e}"
    return CheckResult(spec.name, status, msg[:300], now, context)


def worst(results: list[CheckResult]) -> CheckResult | None:
    """The most severe non-OK result, if any."""
    bad = [r for r in results if r.status != OK]
    return max(bad, key=lambda r: RANK[r.status]) if bad else None


def worse(a: str, b: str) -> str:
    return a if RANK[a] >= RANK[b] else b


def first_line(out: str, err: str, code: int) -> str:
    lines = (out.strip() or err.strip()).splitlines()[:1]
    return lines[0] if lines else f"exit {code}"


def operator_env(**more: str) -> dict[str, str]:
    """The environment of an operator's check or remediation command: the plane's, less its
    credentials (module docstring), with `more` set."""
    return {**{k: v for k, v in os.environ.items() if k not in SECRET_VARS}, **more}


def _command(spec: CheckSpec, node: str, data_dir: Path, context: str) -> tuple[str, str]:
    env = {**operator_env(), JobVar.NODE: node, "TRAINYARD_DATA_DIR": str(data_dir),
           "TRAINYARD_CHECK_CONTEXT": context}  # periodic or before_work, as NHC's context
    try:
        r = subprocess.run(spec.command or [], env=env, capture_output=True, text=True, timeout=spec.timeout,
                           stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return CRITICAL, f"timed out after {spec.timeout:g}s"
    except OSError as e:
        return CRITICAL, f"cannot run {spec.command[0] if spec.command else '?'}: {e.strerror}"
    return EXIT_STATUS.get(r.returncode, CRITICAL), first_line(r.stdout, r.stderr, r.returncode)


def _disk(spec: CheckSpec, node: str, data_dir: Path) -> tuple[str, str]:
    status, msgs = OK, []
    for template in spec.paths:
        path = Path(template.format(node=node, data_dir=data_dir))
        if not path.exists():  # plane's own: a path the operator's configuration names
            continue  # a checkpoint dir not made yet is not a problem
        free_gb = shutil.disk_usage(path).free / 2**30  # plane's own: the operator's path
        s = CRITICAL if free_gb < spec.critical_free_gb else WARN if free_gb < spec.warn_free_gb else OK
        status = worse(status, s)
        if s != OK:
            msgs.append(f"{path}: {free_gb:.2f} GB free")
    return status, "; ".join(msgs) or "free space ok"
