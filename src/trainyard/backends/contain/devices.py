"""GPU device files, so the devices cgroup can keep a rank to its own GPUs.

Real NVIDIA GPUs are character devices /dev/nvidia<minor>, major 195 (nvidiactl is 195:255 and
nvidia-uvm has its own major; both stay open to every rank, as under Slurm's ConstrainDevices).
The emulated GPUs of the local backend get the same shape: `<data_dir>/dev/nvidia<minor>`, made
with mknod as character devices 195:<minor>, one distinct minor per GPU of the machine (emulated
node i's GPU j is minor sum(GPUs of nodes before i) + j). No driver answers for those numbers, so
a rank opening its *own* emulated device gets ENXIO (past the cgroup, no device behind it); a
rank opening another rank's gets EPERM from the devices cgroup.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

NVIDIA_MAJOR = 195


@dataclass(frozen=True)
class Device:
    path: str
    major: int
    minor: int


def gpu_devices(data_dir: str, nodes: Sequence[tuple[str, int, bool]], offsets: Mapping[str, int]) -> tuple[
        dict[str, list[Device]], str]:
    """node -> its GPUs' devices by node-local index, and a note when they could not be made.

    `nodes`: (name, GPU count, emulated?) in configuration order; `offsets`: a real node's
    physical index of its GPU 0. A real GPU's device is /dev/nvidia<physical index> as found
    (its numbers are read from the file); a missing one leaves that node without devices.
    """
    out: dict[str, list[Device]] = {}
    note, minor = "", 0
    for name, count, emulated in nodes:
        devs: list[Device] = []
        for j in range(count):
            if emulated:
                path = os.path.join(data_dir, "dev", f"nvidia{minor + j}")
                try:
                    _mknod(path, minor + j)
                except OSError as e:
                    note = f"emulated GPU devices not made ({path}: {e.strerror})"
                    return {}, note
            else:
                path = f"/dev/nvidia{offsets.get(name, 0) + j}"
            try:
                st = os.stat(path)
            except OSError:
                devs = []
                break
            if stat.S_ISCHR(st.st_mode):
                devs.append(Device(path, os.major(st.st_rdev), os.minor(st.st_rdev)))
        if emulated:
            minor += count
        out[name] = devs
    return out, note


def _mknod(path: str, minor: int) -> None:
    """Make (or keep) a character device 195:<minor>; a wrong file there is replaced."""
    want = os.makedev(NVIDIA_MAJOR, minor)
    try:
        st = os.lstat(path)
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == want:
            return
        os.unlink(path)
    except FileNotFoundError:
        pass
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.mknod(path, 0o666 | stat.S_IFCHR, want)
    os.chmod(path, 0o666)  # the umask must not make it unopenable: the cgroup decides
