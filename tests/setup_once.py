"""Run a scripts/*-setup.sh once for the whole test run, when what it installs is missing.

The Slurm and browser tests install their Debian packages themselves when run as root (CI starts
on a bare machine): under a file lock, so parallel test workers do not race on dpkg, and only if
still missing once the lock is held (another worker may have installed it meanwhile).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Callable


def install_once(script: Path, still_missing: Callable[[], bool], no_install_env: str) -> str | None:
    """Run `script` if `still_missing()` and we may (root, the script exists, `no_install_env`
    not set to 1). Returns the tail of its output when it ran and the thing is still missing,
    else None (installed, nothing to do, or not allowed: the caller says why it skips)."""
    if not still_missing() or os.geteuid() != 0 or os.environ.get(no_install_env) == "1" or not script.exists():
        return None
    with open(Path(tempfile.gettempdir()) / f"trainyard-{script.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not still_missing():
            return None
        try:
            p = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=900)
            out = f"exit {p.returncode}: " + (p.stdout + p.stderr).strip()
        except subprocess.TimeoutExpired:
            out = "timed out after 900 s"
        if not still_missing():
            return None
        return "\n".join(out.splitlines()[-8:])
