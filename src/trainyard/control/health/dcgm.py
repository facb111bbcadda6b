"""The `dcgm` built-in check: NVIDIA DCGM's diagnostics, `dcgmi diag -r <level> -j`.

Without `dcgmi` on PATH the check is OK with "dcgmi not installed (skipped)" — the same stance
as `nvml` without NVML: a cluster that has no DCGM is not unhealthy for it, and the message
says the diagnostics did not run. (An operator who wants DCGM to be mandatory writes a
`command` check that fails without it.)

`parse_diag` reads both JSON shapes dcgmi has written (NVIDIA/DCGM, `nvvs` JsonOutput and
`testing/python3/dcgm_diag_schema.json`):

- DCGM 3.x: `{"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"gpu_ids", "status": "Pass|Fail|Warn|Skip", "warnings": [...]}]}]}]}}`;
  `tests` may hold nulls and `warnings` plain strings or `{"warning", "error_id"}` objects;
- DCGM 4.x: `{"DCGM Diagnostic": {"test_categories": [... "results": [{"entity_group",
  "entity_id", "status", "warnings": [{"warning", "error_id", "error_category",
  "error_severity"}]}], "test_summary": {"status"}]}, "runtime_error"?}`.

Verdict (as Meta GCM's `check-dcgmi diag` has it, refined by DCGM's own severities): a test
that failed → CRITICAL, unless every warning it carries is one DCGM rates MONITOR (1: "can
perform workload, but needs to be monitored") or CONFIG (5: "can be configured", e.g.
persistence mode off), which → WARN (`dcgm_errors.h`, `dcgmErrorSeverity_t`); a test that
warned → WARN; Pass, Skip and Not Run are OK. dcgmi that produced no result (no host engine, a
runtime error, unreadable output) → WARN: DCGM is broken there, which a person should fix, but
a node should not be rebooted for it. A diagnostic that ran past its time-out → CRITICAL (a GPU
test that hangs is a finding).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

from trainyard.control.health.checks import CRITICAL, OK, RANK, WARN, first_line, operator_env, worse
from trainyard.spec.models import CheckSpec

SEVERITY_MONITOR, SEVERITY_CONFIG = 1, 5  # dcgmErrorSeverity_t: fixable without taking the GPU out
_STATUS = {"pass": OK, "skip": OK, "skipped": OK, "not run": OK, "warn": WARN, "warning": WARN, "fail": CRITICAL}


def _json_in(text: str) -> Any:
    """The JSON document in dcgmi's output (it may print a warning line before it)."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON in the output")
    return json.JSONDecoder().raw_decode(text[start:])[0]


def _warnings(result: dict) -> list[tuple[str, int | None]]:
    out = []
    for w in result.get("warnings") or []:
        if isinstance(w, dict):
            sev = w.get("error_severity")
            out.append((str(w.get("warning") or w.get("message") or ""), sev if isinstance(sev, int) else None))
        elif w:
            out.append((str(w), None))
    return out


def _where(result: dict) -> str:
    if "entity_id" in result:
        return f"{str(result.get('entity_group') or 'GPU')} {result['entity_id']}"
    ids = result.get("gpu_ids", result.get("gpu_id"))
    return f"GPU {ids}" if ids not in (None, "") else ""


def parse_diag(text: str) -> tuple[str, str]:
    """OK/WARN/CRITICAL and a message naming the failed tests, from `dcgmi diag -j` output. Pure."""
    try:
        doc = _json_in(text)
    except ValueError:
        first = text.strip().splitlines()[:1]
        return WARN, f"dcgmi diag gave no result: {first[0][:150] if first else 'no output'}"
    root = doc.get("DCGM Diagnostic") or doc.get("DCGM GPU Diagnostic") if isinstance(doc, dict) else None
    if not isinstance(root, dict):
        return WARN, "dcgmi diag gave no result: no diagnostic in its JSON"
    error = root.get("runtime_error") or doc.get("runtime_error")
    categories = root.get("test_categories") or []
    if error and not categories:
        return WARN, f"dcgmi diag could not run: {error}"
    status, found, ran = OK, [], 0
    for cat in categories:
        for test in (cat or {}).get("tests") or []:
            if not isinstance(test, dict):
                continue  # DCGM 3.x writes nulls between tests
            ran += 1
            name = str(test.get("name") or "?")
            results = [r for r in test.get("results") or [] if isinstance(r, dict)]
            summary = (test.get("test_summary") or {}).get("status")
            worst_here, why = OK, []
            for r in results:
                s = _STATUS.get(str(r.get("status", "")).strip().lower(), OK)
                warns = _warnings(r)
                if s == CRITICAL and warns and all(sev in (SEVERITY_MONITOR, SEVERITY_CONFIG) for _, sev in warns):
                    s = WARN  # DCGM itself says the GPU can work: a configuration or watch-only finding
                if s != OK:
                    where = _where(r)
                    text_ = warns[0][0] if warns else ""
                    why.append(": ".join(x for x in (where, text_) if x))
                worst_here = worse(worst_here, s)
            if summary and not results:
                worst_here = _STATUS.get(str(summary).strip().lower(), OK)
            if worst_here != OK:
                verb = "failed" if worst_here == CRITICAL else "warned"
                found.append((worst_here, f"{name} {verb}" + (f" ({'; '.join(why[:2])})" if why else "")))
                status = worse(status, worst_here)
    if not ran:
        return WARN, "dcgmi diag ran no tests" + (f": {error}" if error else "")
    found.sort(key=lambda f: -RANK[f[0]])
    return status, "; ".join(m for _, m in found) or f"dcgm diagnostics passed ({ran} tests)"


def check(spec: CheckSpec) -> tuple[str, str]:
    """Run `dcgmi diag -r <level> -j` (when dcgmi is installed) and judge its result."""
    dcgmi = shutil.which("dcgmi")
    if dcgmi is None:
        return OK, "dcgmi not installed (skipped)"
    argv = [dcgmi, "diag", "-r", str(spec.level), "-j"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=spec.timeout, stdin=subprocess.DEVNULL,
                           env=operator_env())
    except subprocess.TimeoutExpired:
        return CRITICAL, f"dcgmi diag -r {spec.level} timed out after {spec.timeout:g}s"
    except OSError as e:
        return WARN, f"cannot run dcgmi: {e.strerror}"
    # dcgmi exits non-zero when a test fails (its JSON says which), so the exit code alone says little
    status, msg = parse_diag(r.stdout)
    if msg.startswith("dcgmi diag gave no result") and r.returncode:
        msg = f"dcgmi diag -r {spec.level} exited {r.returncode}: {first_line(r.stdout, r.stderr, r.returncode)[:150]}"
    return status, msg
