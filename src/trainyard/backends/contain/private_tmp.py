"""Private /tmp and /dev/shm per attempt and node, as Slurm's job_container/tmpfs and systemd's
PrivateTmp: what a job leaves there is gone when its attempt is released, no other job or user
sees it, and it counts against the job's --mem.

Why: /tmp and /dev/shm are shared by every process of the host. A job's files there outlive it
(a 200 MB job OOM-killed over its --mem left 198 MB of /dev/shm in RAM, charged to nobody), and
a job can read what another job left there, or plant files for it.

    tmpfs  (the plane is root and may make mount namespaces) the backend mounts one tmpfs per
           attempt and node, `<data_dir>/tmp/j<job>.a<attempt>.<node>/` (under a 0700 root
           directory no job can pass), holding `tmp/` and `shm/` (mode 1777); its size is the
           node's --mem (else the kernel's default, half of RAM), and its pages are charged to the
           memory cgroup of the process that writes them, so they count against that --mem. Each
           rank's runner, between joining the cgroups and dropping to the owner, enters a mount
           namespace of its own (unshare(CLONE_NEWNS), / made a slave so nothing propagates back
           to the host) and binds `tmp/` on /tmp and `shm/` on /dev/shm (`rank_runner.py`). All
           ranks of an attempt on one node share the one tmpfs: NCCL's shared-memory transport and
           torch's FileStore open each other's files there. Once every rank has bound it, the
           backend detaches its own mount (`detach`): the ranks' namespaces are then all that
           hold the tmpfs, and the kernel frees it, and the memory, with the attempt's last
           process, whether or not the plane is there to release it. `release` (and a restarted
           plane's sweep) unmounts what is still mounted (an attempt whose launch failed) and
           removes the directories.
    dir    (not root, or no mount namespace here) a directory per attempt and node in the
           attempt's run dir, `<job_dir>/run/attempt-<a>/tmp.<node>/`, the owner's, mode 0700,
           removed with the run dir at release, as TMPDIR; /tmp and /dev/shm stay the host's.
           `line()` (yard up's start-up output) says so and why.

Either way TMPDIR is set for the ranks (/tmp, or the directory).

The emulated node's name (tmpfs mode only, where ranks have a mount namespace): each node's plan
also carries `hostname` (the node's name) and `hosts`, a file `<root>/hosts` (root's, 0644, out of
the jobs' reach) holding the host's /etc/hosts and a line mapping every emulated node of the
cluster to 127.0.0.1. The runner gives the rank a UTS namespace of its own with that hostname and
binds the file on /etc/hosts in its mount namespace, so `hostname` in a rank of node-1 says node-1,
and a rank that resolves its own or a peer's name (gloo does) gets a usable address. In dir mode
nothing changes: a hostname that does not resolve would break more than it shows.

What a job must still reach under the host's /tmp: a workdir, job dir or checkpoint dir under
/tmp (a scratch checkout, a test's data dir) would be hidden by the private /tmp. The top
directory under /tmp of each (`/tmp/<name>`) is bound back at its place in the job's namespace,
opened as the owner (`rank_runner.py`), so the job reaches exactly what its owner may reach on the
host and nothing else of the host's /tmp. Its mount point is made here, root's and 0755 in the
sticky tmp/, before any process of the attempt runs: a rank cannot swap it for a link that would
make root mount elsewhere in the namespace of another rank.

Choosing: `choose(mode, data_dir)` with mode `auto` (default), `tmpfs` or `dir`, from the local
backend's `private_tmp` argument or `TRAINYARD_PRIVATE_TMP`; `tmpfs` asked for by name where it
cannot work is a `ContainmentError`, never a silent downgrade.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from trainyard.backends.contain.common import ContainmentError

ENV = "TRAINYARD_PRIVATE_TMP"
MODES = ("tmpfs", "dir")
BASE = "tmp"  # <data_dir>/tmp
MS_NOSUID, MS_NODEV = 0x2, 0x4
MNT_DETACH = 0x2
_ENTRY = re.compile(r"^(j\d+\.a\d+)\.(.+)$")
_SAFE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")

# Run with `python -I -S -c`: can this machine give a process a mount namespace of its own?
_PROBE = ("import ctypes, os, sys\n"
          "libc = ctypes.CDLL(None, use_errno=True)\n"
          "if libc.unshare(0x20000) != 0:\n"
          "    sys.exit(os.strerror(ctypes.get_errno()))\n"
          "if libc.mount(None, b'/', None, 0x4000 | 0x80000, None) != 0:\n"
          "    sys.exit('making / a slave mount: ' + os.strerror(ctypes.get_errno()))\n")


@dataclass(frozen=True)
class PrivateTmp:
    mode: str  # tmpfs | dir
    base: str  # <data_dir>/tmp (the tmpfs mode's mounts)
    why: str = ""  # why not tmpfs ("" when tmpfs, or dir asked for by name)

    def line(self) -> str:
        """The plane's start-up line about /tmp and /dev/shm."""
        if self.mode == "tmpfs":
            return (f"private /tmp and /dev/shm: a tmpfs per attempt and node under {self.base} (sized by --mem), "
                    "in a mount namespace per rank; TMPDIR=/tmp")
        return ("private /tmp and /dev/shm: NO, /tmp and /dev/shm are the host's, shared by every job; each attempt "
                "gets TMPDIR=<job dir>/run/attempt-<a>/tmp.<node> (0700, the owner's, removed at release)"
                + (f" [{self.why}]" if self.why else ""))

    def prepare(self, key: str, node_mem_mib: Mapping[str, int | None], run_dir: str,
                owner: tuple[int, int] | None, expose: Iterable[str] = (),
                names: Iterable[str] = ()) -> dict[str, dict]:
        """Make each node's private tmp for attempt `key`; node -> the plan its ranks' runners
        read (attempt.json's `contain[<rank>].tmp`). `owner`: (uid, gid) the ranks run as (None:
        the plane's own); `expose`: paths under /tmp the job must still reach (workdir, job dir);
        `names`: every emulated node's name, for the ranks' /etc/hosts (tmpfs mode; none: the
        host's name and /etc/hosts stay).

        Raises:
            ContainmentError: a mount or directory could not be made (what is made is undone).
        """
        plans: dict[str, dict] = {}
        hosts = hosts_text(names) if names else None
        try:
            for node, mem in node_mem_mib.items():
                if self.mode == "tmpfs":
                    plans[node] = self._mount(key, node, mem, exposed(expose))
                    if hosts is not None:
                        plans[node].update(named(plans[node]["root"], node, hosts))
                else:
                    plans[node] = _own_dir(os.path.join(run_dir, f"tmp.{safe_name(node)}"), owner)
        except OSError as e:
            self.release(key)
            raise ContainmentError(f"cannot make the attempt's private /tmp: {e.filename or ''}: {e.strerror}") from e
        return plans

    def _mount(self, key: str, node: str, mem_mib: int | None, names: list[str]) -> dict:
        os.makedirs(self.base, mode=0o700, exist_ok=True)
        os.chmod(self.base, 0o700)  # no job may pass: the tmpfs holds every job's /tmp
        d = os.path.join(self.base, f"{key}.{safe_name(node)}")
        _unmount(d)  # what an earlier plane left for this very attempt
        os.mkdir(d, 0o700)
        opts = "mode=0755" + (f",size={mem_mib}m" if mem_mib else "")
        _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, opts)
        for sub in ("tmp", "shm"):
            os.mkdir(os.path.join(d, sub))
            os.chmod(os.path.join(d, sub), 0o1777)
        for name in names:
            os.mkdir(os.path.join(d, "tmp", name), 0o755)
        return {"mode": "tmpfs", "root": d, "expose": [f"/tmp/{n}" for n in names]}

    def detach(self, key: str) -> None:
        """Every rank of attempt `key` has bound its tmpfs: detach the plane's own mount of it, so
        the kernel frees it with the last process of the attempt, whatever the plane does then
        (stops, dies, never releases). The empty directory stays until `release`."""
        for name in self._entries(key):
            for _ in range(16):
                if _c().umount2(os.path.join(self.base, name).encode(), MNT_DETACH) != 0:
                    break

    def _entries(self, key: str) -> list[str]:
        try:
            return [n for n in os.listdir(self.base) if (m := _ENTRY.match(n)) and m.group(1) == key]
        except OSError:
            return []

    def release(self, key: str) -> list[str]:
        """Unmount and remove attempt `key`'s tmpfs mounts; returns those that could not be removed.
        (The dir mode's directories go with the run dir.)"""
        return [os.path.join(self.base, n) for n in self._entries(key) if not _unmount(os.path.join(self.base, n))]

    def sweep(self, keep: set[str]) -> list[str]:
        """Release the private tmp of every attempt whose key is not in `keep` (a restarted plane)."""
        try:
            names = os.listdir(self.base)
        except OSError:
            return []
        keys = sorted({m.group(1) for n in names if (m := _ENTRY.match(n)) and m.group(1) not in keep})
        for key in keys:
            self.release(key)
        return keys


def choose(mode: str | None, data_dir: str) -> PrivateTmp:
    """The private tmp for `mode` (None: $TRAINYARD_PRIVATE_TMP, else auto).

    Raises:
        ContainmentError: an unknown mode, or `tmpfs` asked for where it cannot work (says why).
    """
    asked = (mode or os.environ.get(ENV) or "auto").strip().lower()
    if asked not in ("auto", *MODES):
        raise ContainmentError(f"private tmp: unknown mode {asked!r} (one of auto, {', '.join(MODES)})")
    base = os.path.join(str(data_dir), BASE)
    if asked == "dir":
        return PrivateTmp("dir", base)
    why = _probe(base)
    if not why:
        return PrivateTmp("tmpfs", base)
    if asked == "tmpfs":
        raise ContainmentError(f"private tmp: tmpfs cannot work here: {why}")
    return PrivateTmp("dir", base, why)


def exposed(paths: Iterable[str]) -> list[str]:
    """The names under /tmp of the top directories holding `paths` (those under /tmp), in order."""
    out: list[str] = []
    for p in paths:
        parts = os.path.normpath(p).split("/")
        if len(parts) > 2 and parts[0] == "" and parts[1] == "tmp" and parts[2] not in out:
            out.append(parts[2])
    return out


def safe_name(node: str) -> str:
    """A node's name as one path component (node names are the configuration's: any text)."""
    if _SAFE.match(node) and len(node) <= 100:
        return node
    return "n" + node.encode().hex()[:120]


def _probe(base: str) -> str:
    """Why tmpfs mode cannot work here ("" when it can): root, a tmpfs mount, a mount namespace."""
    if os.geteuid() != 0:
        return "the plane is not root: mounting a tmpfs needs CAP_SYS_ADMIN"
    probe = os.path.join(base, ".probe")
    try:
        os.makedirs(base, mode=0o700, exist_ok=True)
        _unmount(probe)
        os.mkdir(probe, 0o700)
        try:
            _mount("tmpfs", probe, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m")
        finally:
            _unmount(probe)
    except OSError as e:
        return f"cannot mount a tmpfs under {base}: {e.strerror}"
    done = subprocess.run([sys.executable, "-I", "-S", "-c", _PROBE], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"no mount namespace for the ranks: {done.stderr.strip() or done.returncode}"
    return ""


def _own_dir(path: str, owner: tuple[int, int] | None) -> dict:
    """The dir mode: a directory in the plane's own run dir (no job writes there), the owner's."""
    os.mkdir(path, 0o700)
    if owner is not None and os.geteuid() == 0:
        os.chown(path, *owner, follow_symlinks=False)
    return {"mode": "dir", "path": path}


_libc = None


def _c() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


def _mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    if _c().mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), target)


def _unmount(d: str) -> bool:
    """Detach every mount at `d` and remove the (then empty) directory; True when it is gone.
    Never removes what is inside a mount: only an empty directory is removed."""
    for _ in range(16):  # a mount stacked on another, at most a few
        if _c().umount2(d.encode(), MNT_DETACH) != 0:
            break
    try:
        os.rmdir(d)
    except FileNotFoundError:
        return True
    except OSError as e:
        return e.errno == errno.ENOENT
    return True


HOSTS = "/etc/hosts"
MAX_HOSTS_BYTES = 1 << 20


def hosts_text(names: Iterable[str]) -> str:
    """The host's /etc/hosts (the system's, read bounded) and the emulated nodes on 127.0.0.1."""
    try:
        with open(HOSTS, "rb") as f:  # plane's own: the system's file, not a job's
            base = f.read(MAX_HOSTS_BYTES).decode(errors="replace")
    except OSError:
        base = "127.0.0.1 localhost\n"
    if base and not base.endswith("\n"):
        base += "\n"
    ok = [n for n in names if _SAFE.match(n)]
    return base + "# trainyard: the emulated nodes of this cluster (backends/contain/private_tmp.py)\n" + \
        "".join(f"127.0.0.1 {n}\n" for n in ok)


def named(root: str, node: str, hosts: str) -> dict[str, str]:
    """The node's name and hosts file for its ranks' plan (`hostname`, `hosts`); the file written
    in the tmpfs's root directory (root's, out of the jobs' reach), 0644."""
    path = os.path.join(root, "hosts")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)  # plane's own: a fresh tmpfs
    with os.fdopen(fd, "w") as f:
        f.write(hosts)
    os.chmod(path, 0o644)  # plane's own: whatever the umask
    return {"hostname": node, "hosts": path}

