"""Small file operations on cgroup directories, the same for v1 and v2 (no driver logic here)."""

from __future__ import annotations

import os
import time


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write(path: str, text: str) -> None:
    """One write(2): cgroup files take a whole value per write."""
    with open(path, "w") as f:
        f.write(text)


def procs(d: str) -> set[int]:
    """Pids in `d` and every cgroup below it (a job may not make sub-cgroups, but be thorough)."""
    out: set[int] = set()
    for root, _, files in os.walk(d):
        if "cgroup.procs" in files:
            try:
                out.update(int(p) for p in read(os.path.join(root, "cgroup.procs")).split())
            except OSError:
                pass
    return out


def make(d: str) -> None:
    """mkdir -p for cgroups. v1 cpuset children start with no CPUs and no memory nodes (unless the
    parent has cgroup.clone_children); copy the parent's so a process may join."""
    if os.path.isdir(d):
        return
    parent = os.path.dirname(d)
    make(parent)
    try:
        os.mkdir(d)
    except FileExistsError:
        return
    for name in ("cpuset.cpus", "cpuset.mems"):
        mine = os.path.join(d, name)
        if os.path.exists(mine) and not read(mine).strip():
            write(mine, read(os.path.join(parent, name)).strip())


def remove(d: str, retry_s: float = 1.0) -> list[str]:
    """rmdir `d` bottom-up; returns what could not be removed (still populated, or gone busy).

    A cgroup whose last process has just died may report EBUSY for a moment; retry briefly."""
    left: list[str] = []
    if not os.path.isdir(d):
        return left
    for root, _, _ in list(os.walk(d, topdown=False)):  # children before their parent
        deadline = time.monotonic() + retry_s
        while True:
            try:
                os.rmdir(root)
                break
            except FileNotFoundError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    left.append(root)
                    break
                time.sleep(0.01)
    return left


def kill_each(pids: set[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
