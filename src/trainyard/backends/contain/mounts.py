"""Where this process's cgroups are: the mounted hierarchies and the plane's own place in each.

Trainyard makes its cgroups *under the plane's own cgroup* of each hierarchy (as systemd's
delegation and Slurm's `slurmd` do), so whatever limits the plane itself runs under (a systemd
slice, a container, a sandbox) still hold for its jobs. Reads /proc/self/mountinfo (mount point
and the mount's root inside the hierarchy) and /proc/self/cgroup (the process's path in each).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

V1_CONTROLLERS = ("freezer", "pids", "memory", "devices", "cpu", "cpuacct", "cpuset", "blkio")


@dataclass(frozen=True)
class Hierarchies:
    """v1: controller -> the plane's own cgroup dir in it; v2: the plane's own dir on the
    unified hierarchy (None when no cgroup2 is mounted)."""

    v1: dict[str, str]
    v2: str | None


def _unescape(path: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (\\040 ...)."""
    out, i = [], 0
    while i < len(path):
        if path[i] == "\\" and i + 3 < len(path) and path[i + 1 : i + 4].isdigit():
            out.append(chr(int(path[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(path[i])
            i += 1
    return "".join(out)


def _own_dir(mount_point: str, mount_root: str, own: str) -> str:
    """The directory of path `own` (in the hierarchy) under a mount of the hierarchy's `mount_root`."""
    if mount_root != "/" and (own == mount_root or own.startswith(mount_root.rstrip("/") + "/")):
        own = own[len(mount_root.rstrip("/")) :] or "/"
    return os.path.normpath(mount_point + "/" + own.lstrip("/"))


def find(mountinfo: str = "/proc/self/mountinfo", cgroup: str = "/proc/self/cgroup") -> Hierarchies:
    """The hierarchies mounted here and this process's directory in each."""
    own_v1: dict[str, str] = {}
    own_v2: str | None = None
    try:
        with open(cgroup) as f:
            for line in f:
                hid, ctrls, path = line.rstrip("\n").split(":", 2)
                if hid == "0" and ctrls == "":
                    own_v2 = path
                for c in ctrls.split(","):
                    if c:
                        own_v1[c] = path
    except OSError:
        return Hierarchies({}, None)
    v1: dict[str, str] = {}
    v2: str | None = None
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        root, point, fstype, opts = _unescape(fields[3]), _unescape(fields[4]), tail[0], tail[2].split(",")
        if fstype == "cgroup2" and own_v2 is not None and v2 is None:
            v2 = _own_dir(point, root, own_v2)
        elif fstype == "cgroup":
            for c in opts:
                if c in V1_CONTROLLERS and c in own_v1 and c not in v1:
                    v1[c] = _own_dir(point, root, own_v1[c])
    return Hierarchies(v1, v2)
