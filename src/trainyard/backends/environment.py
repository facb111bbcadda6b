"""A node's software environment as one comparable record: the fingerprint of issue 37.

Why: a gang whose nodes run different library versions fails in ways that take days to find (a
collective hangs, a checkpoint will not load, losses drift). A job with an image runs the same
digest everywhere; a bare job runs whatever each node has. So, before a bare gang's ranks start,
each of its nodes reports what a training process would see — Python, PyTorch, its CUDA and NCCL,
and the GPU driver — and the plane compares them (`differences`), refusing or warning as the
configuration's `images:` section says (its `fingerprint` key).

`fingerprint(python)` runs `FINGERPRINT_CODE` with the interpreter the node's jobs use, isolated
(`-I`: no user site, no PYTHON* variables), with a minimal environment and a time limit; the
answer is bounded and must be one JSON object of strings. Standard library only.
"""

from __future__ import annotations

import json
import subprocess

FIELDS = ("python", "torch", "cuda", "nccl", "driver")
OUTPUT_MAX = 4096
TIMEOUT_S = 120.0

# Run by the node's job interpreter; prints one JSON object. Absent parts are "none".
FINGERPRINT_CODE = r"""
import json, platform
out = {"python": platform.python_version(), "torch": "none", "cuda": "none", "nccl": "none", "driver": "none"}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda or "none"
    try:
        v = torch.cuda.nccl.version() if torch.cuda.is_available() else None
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else (str(v) if v else "none")
    except Exception:
        pass
except Exception:
    pass
try:
    import pynvml
    pynvml.nvmlInit()
    d = pynvml.nvmlSystemGetDriverVersion()
    out["driver"] = d.decode() if isinstance(d, bytes) else str(d)
except Exception:
    pass
print(json.dumps(out))
"""


def fingerprint(python: str, timeout_s: float = TIMEOUT_S) -> dict[str, str]:
    """The environment `python` gives a job on this machine; `{"error": why}` when it cannot tell."""
    try:
        done = subprocess.run([python, "-I", "-c", FINGERPRINT_CODE], capture_output=True, timeout=timeout_s,
                              env={"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"error": f"cannot run {python}: {e}"[:200]}
    try:
        data = json.loads(done.stdout[:OUTPUT_MAX].decode(errors="replace").strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"{python} gave no fingerprint (exit {done.returncode})"}
    if not isinstance(data, dict):
        return {"error": f"{python} gave no fingerprint"}
    return {k: str(data.get(k, "none"))[:100] for k in FIELDS}


def differences(by_node: dict[str, dict[str, str]]) -> list[str]:
    """One line per node whose environment differs from the gang's first node's, naming the node
    and each differing field (`n2: torch 2.14.1 (n1: 2.13.0)`); nodes that could not tell are skipped."""
    known = {n: fp for n, fp in by_node.items() if fp and "error" not in fp}
    if len(known) < 2:
        return []
    first, base = next(iter(known.items()))
    lines = []
    for node, fp in list(known.items())[1:]:
        diff = [f"{k} {fp.get(k, 'none')} ({first}: {base.get(k, 'none')})" for k in FIELDS
                if fp.get(k, "none") != base.get(k, "none")]
        if diff:
            lines.append(f"{node}: " + ", ".join(diff))
    return lines
