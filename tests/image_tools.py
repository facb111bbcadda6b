"""Whether the image tests can run here, installing what they need first (as the Slurm tests do).

The image tests need Debian's docker-registry, skopeo, umoci, runc and mmdebstrap
(`scripts/images-setup.sh`), root (the node caches keep owners and write overlay whiteouts; runc
runs as root) and mount namespaces. When a tool is missing and we are root, the set-up script runs
once for the whole test run (`tests/setup_once.install_once`, under a file lock);
`TRAINYARD_IMAGES_NO_INSTALL=1` forbids that. What is left is a skip with the reason: a machine
whose kernel forbids namespaces, or a run as a plain user.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from tests.setup_once import install_once

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "images-setup.sh"
NEEDED = ("docker-registry", "skopeo", "umoci", "runc", "mmdebstrap")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
NO_INSTALL_ENV = "TRAINYARD_IMAGES_NO_INSTALL"


def _missing() -> list[str]:
    return [t for t in NEEDED if shutil.which(t) is None and shutil.which(t, path=SYSTEM_PATH) is None]


@functools.cache
def unavailable() -> str:
    """Why the image tests cannot run here; "" when they can (tools installed if need be)."""
    if os.geteuid() != 0:
        return "the image tests run as root (the node caches keep owners; runc runs as root)"
    tail = install_once(SCRIPT, lambda: bool(_missing()), NO_INSTALL_ENV)
    if _missing():
        return (f"{', '.join(_missing())} not installed (run scripts/images-setup.sh)"
                + (f": {tail}" if tail else ""))
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"this kernel forbids mount namespaces: {probe.stderr.strip()[:200]}"
    return ""
