"""Small file systems made by a test: a tmpfs of a few MiB to fill (a full disk) or to remount
read-only (a read-only store). Needs root (CI runs as root); skips with the reason otherwise."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(path: Path, size_mib: int) -> Iterator[Path]:
    """A fresh tmpfs of `size_mib` at `path` for the block's duration (unmounted after, lazily if busy)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(path)], capture_output=True)
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount(path: Path, mode: str) -> None:
    """`mode`: "ro" or "rw"."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True, capture_output=True)


def fill(path: Path, leave_bytes: int) -> Path:
    """Write a file in `path` until its file system has about `leave_bytes` free; returns the file."""
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    ballast = path / "ballast"
    with open(ballast, "wb") as f:
        left = max(0, free - leave_bytes)
        chunk = b"\0" * (1 << 20)
        while left > 0:
            n = min(left, len(chunk))
            try:
                f.write(chunk[:n])
                f.flush()
            except OSError:
                break
            left -= n
    return ballast
