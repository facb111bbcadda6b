"""Free space on a file system: one definition for the health checks and the metrics."""

from __future__ import annotations

import os
from pathlib import Path


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer can still use on `path`'s file system (statvfs f_bavail)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
