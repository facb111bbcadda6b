"""A Debian root file system for the container tests, built once and kept across runs.

Until the node cache (the images part's NodeCache) hands out unpacked images in tests, the container tests
make a `CachedImage` by hand whose one layer is this directory: `mmdebstrap --variant=essential`
of bookworm from deb.debian.org (about 10 s, 145 MB; /bin/sh, coreutils, dd), under
`<repo>/.cache/test-images/rootfs-essential-<key>/`. A flock makes parallel workers build it once;
the build goes to a temporary directory renamed into place, so a killed build is never taken for
a finished one.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests import image_tools

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "test-images"
KEY = "bookworm-essential-1"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def missing_tools() -> str:
    """Why the container tests cannot run here ("" when they can; the tools installed first where we may)."""
    return image_tools.unavailable()


NEEDS_RUNC = pytest.mark.skipif(bool(missing_tools()), reason=missing_tools() or "runc")


def essential_rootfs() -> Path:
    """The root file system directory (root's, 0755), built on first use."""
    final = CACHE / f"rootfs-{KEY}"
    if (final / "bin" / "sh").exists():
        return final
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"rootfs-{KEY}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "bin" / "sh").exists():
            return final
        work = Path(tempfile.mkdtemp(prefix=".build-rootfs-", dir=CACHE))
        try:
            env = {"PATH": PATH, "LANG": "C.UTF-8", "HOME": "/root"}
            subprocess.run(["mmdebstrap", "--variant=essential", "--mode=root", "--format=directory", "--quiet",
                            "bookworm", str(work / "rootfs"), "http://deb.debian.org/debian"],
                           check=True, env=env, capture_output=True, timeout=600)
            os.chmod(work / "rootfs", 0o755)
            os.rename(work / "rootfs", final)
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
    return final
