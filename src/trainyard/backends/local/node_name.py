"""A task of a batch script's step, started by the in-job `srun` (`srun.py`) on another emulated
node than the script's, under that node's name: `srun hostname` in a 2-node allocation prints
both nodes, as Slurm's does.

Why: a batch script (and an allocation's hold, whose session shell joins it) is one rank, on the
first node, in a cell named after it (its own UTS namespace, `private_tmp.named`); the in-job
`srun` starts every task as its own child, as the owner, in that cell. Without this, every task
has the first node's name (only SLURMD_NODENAME says which node it is on).

How: in the forked child, before the exec (Popen's `preexec_fn`, `Renamer.preexec`): the owner
cannot make a UTS namespace in the host's user namespace, but any process may make a user
namespace together with one: `unshare(CLONE_NEWUSER | CLONE_NEWUTS)`, its uid and gid mapped to
themselves (`/proc/self/setgroups` "deny", `uid_map` "UID UID 1", `gid_map` "GID GID 1"), then
`sethostname(node)`, then the exec. The task runs with the very same uid, gid and groups: its
capabilities are in its own namespace only and a non-root program drops them at the exec. A root
task (a root plane's job without an owner) needs no user namespace: CLONE_NEWUTS alone (a user
namespace would take its host capabilities away). Each such task has a namespace of its own
(two tasks on node-1 have the same name, not the same namespace).

When (`renamer`): only when the script's cell is a named one (the host name is the job's first
node, as the root plane's tmpfs mode sets it; the `dir` mode and a non-root plane leave the
host's name) and the task's node is in /etc/hosts (the cell's file maps every emulated node, so
the new name resolves as its peers resolve it); ctypes must load. A failing unshare (user
namespaces off: `user.max_user_namespaces` 0, AppArmor's restriction, a chroot, a seccomp
filter) leaves the task in the script's UTS namespace, silently: never a failed task for it.

What a task in its own user namespace sees (docs/control-plane.md, "Interactive work"): files and
processes of other uids (root's included) show as `nobody`/`nogroup`, and so do its own
supplementary groups in `id` (their access is kept: the kernel checks the real ids); setuid and
file-capability programs do not gain (`mount`, `sudo`, `su` say they need root); the mount and
network namespaces, cgroups, /tmp, /dev/shm, the GPUs and their devices are the script's. The
owner's processes outside (the script, its `srun`, a `yard shell` into the rank) still signal
and trace it (same uid; the owner of a user namespace has every capability in it): srun's
signal forwarding, its kill on a failed task and the cell's drain at the end reach it.

Standard library only (ctypes), part of the in-job tools (run with -I -S: `job_tools.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

CLONE_NEWUSER, CLONE_NEWUTS = 0x10000000, 0x04000000
HOSTS = "/etc/hosts"
MAX_HOSTS_BYTES = 1 << 20


def hosts_names(path: str = HOSTS) -> set[str]:
    """The names /etc/hosts maps (read bounded); none when it cannot be read."""
    try:
        with open(path, "rb") as f:
            text = f.read(MAX_HOSTS_BYTES).decode(errors="replace")
    except OSError:
        return set()
    return {w for line in text.splitlines() for w in line.split("#", 1)[0].split()[1:]}


class Renamer:
    """Gives a task started on `node` its node's name: `preexec(node)` for Popen, or None."""

    def __init__(self, here: str, known: Iterable[str]) -> None:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        # resolved here, in srun: the forked child (srun has threads) calls, looks nothing up
        self._unshare, self._sethostname = libc.unshare, libc.sethostname
        self._unshare.argtypes, self._unshare.restype = [ctypes.c_int], ctypes.c_int
        self._sethostname.argtypes, self._sethostname.restype = [ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int
        self.here, self.known = here, set(known)
        uid, gid = os.geteuid(), os.getegid()
        self._root = uid == 0
        self._maps = [("/proc/self/setgroups", b"deny"), ("/proc/self/uid_map", f"{uid} {uid} 1".encode()),
                      ("/proc/self/gid_map", f"{gid} {gid} 1".encode())]
        self._own = uid == os.getuid() and gid == os.getgid()  # a set-id srun maps nothing: stays as it is

    def preexec(self, node: str) -> Callable[[], None] | None:
        """The function the forked child runs before the exec, or None: the task stays in the
        script's UTS namespace (its own node, a node the cell does not map, or no way to)."""
        if node == self.here or node not in self.known or not (self._root or self._own):
            return None
        name = node.encode()
        return lambda: self._enter(name)

    def _enter(self, name: bytes) -> None:
        """In the child: a UTS namespace named `name` (with a user namespace unless root). Never
        raises: a task that cannot have its name runs under the script's."""
        try:
            if self._unshare(CLONE_NEWUTS if self._root else CLONE_NEWUSER | CLONE_NEWUTS) != 0:
                return
            if not self._root:
                for path, data in self._maps:
                    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                    try:
                        os.write(fd, data)
                    finally:
                        os.close(fd)
            self._sethostname(name, len(name))
        except Exception:  # noqa: BLE001, S110  # never the task's failure (see the module docstring)
            pass


def renamer(script_node: str) -> Renamer | None:
    """A Renamer when the script's cell is named after `script_node` (see the module docstring),
    else None: every task keeps the script's name, as before."""
    if os.uname().nodename != script_node:
        return None
    try:
        return Renamer(script_node, hosts_names())
    except (ImportError, OSError, AttributeError):  # no ctypes in the image's python, no libc symbol
        return None
