"""The runc `config.json` of one rank's container, built on the plane from facts alone (pure).

Why these choices (docs/images-probe.md §5–6 ran each of them here by hand):

- namespaces: `mount` only (plus `user` with `--container-remap-root`). No pid namespace: the
  job's processes keep host pids, so the plane's signals, the preemption notice (which goes to the
  processes that catch it) and `yard shell` reach them as they reach a bare rank (in a pid
  namespace the job would be pid 1, and the kernel drops a signal to pid 1 that has no handler).
  No network namespace: NCCL and the rendezvous use the host's network, as bare ranks do.
- identity: the owner's uid, gid and groups (`process.user`), no capabilities, `noNewPrivileges`:
  never root inside, except with `remap_root`, where a user namespace maps 0 inside to the owner
  outside (size 1), with the two fixes that mapping needs (no `gid=5` on /dev/pts; /sys and /proc
  bound from the host: neither can be mounted fresh in a user namespace that owns no network or
  pid namespace).
- cgroups: a relative `cgroupsPath`: runc makes it under its own cgroups, which are the rank's
  (the rank runner joins them before it executes runc), so the rank's limits hold for the
  container and the plane's walk of the rank's cgroups finds its processes.
- environment (`process_env`): the image's `Env` first; then the rank's variables, except those
  the image defines (its PATH, its LD_LIBRARY_PATH win), unless the job named them in
  `--container-env` (the host's win), and the contract's variables always the host's
  (`is_contract`: trainyard's, Slurm's, torchelastic's, the rendezvous', CUDA's device choice,
  the identity).
- mounts: /proc, a /dev tmpfs (runc makes null, zero, full, random, urandom, tty in it), /dev/pts,
  /dev/shm (the rank's private shm), /sys read-only, the private /tmp, the host's /etc/hosts and
  /etc/resolv.conf (host network: the same names), an /etc/passwd and /etc/group holding the owner
  (`passwd_with`, `group_with`: `id`, `whoami`, getpwuid work), then the job's binds (job dir,
  workdir, home, `--container-mounts`), parents before children. Every bind is nosuid, nodev.
- devices: exactly the rank's GPU device files (`linux.devices`, and `resources.devices` allows
  just those beyond runc's defaults). With `remap_root` they are bound from the host instead
  (a user namespace cannot mknod).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainyard.images.types import ImageConfig
from trainyard.spec.container import ContainerOptions

OCI_VERSION = "1.0.2-dev"
# Variables that are always the host's, whatever the image says: how the job finds its peers,
# its GPUs, its checkpoints and itself (contracts.rank_env, backends/local's limits, the identity).
CONTRACT_NAMES = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "USER", "LOGNAME", "TMPDIR"})
CONTRACT_PREFIXES = ("TRAINYARD_", "SLURM_", "SLURMD_", "TORCHELASTIC_")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_CAPS = ("CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE")  # runc's default set, for uid 0 inside
BIND_SAFE = ("nosuid", "nodev")
HOST_FILES = ("/etc/hosts", "/etc/resolv.conf")


@dataclass(frozen=True)
class Bind:
    """A host path (or a staging point the rank runner fills) at `destination` in the container."""

    source: str
    destination: str
    read_only: bool = False
    flags: tuple[str, ...] = ()  # pyxis's extra flags (noexec, a propagation); nosuid and nodev always


# Where the node's GPU driver (libcuda, NVML: the host's, matching its kernel module) appears in a
# container: the place NVIDIA's CUDA images already name on LD_LIBRARY_PATH (nvidia-docker's
# convention); an image that does not is given it last on LD_LIBRARY_PATH.
DRIVER_DIR = "/usr/local/nvidia"
DRIVER_LIB_DIR = f"{DRIVER_DIR}/lib64"
DRIVER_BIN_DIR = f"{DRIVER_DIR}/bin"


@dataclass(frozen=True)
class GpuDevice:
    """A GPU device file of the rank: `host_path` on the node, `path` in the container."""

    host_path: str
    path: str
    major: int
    minor: int


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class RankContainer:
    """What one rank's container is made of (everything decided; `config` only writes it down)."""

    command: Sequence[str]
    env: Mapping[str, str]  # the rank's variables, as a bare rank would get them
    image: ImageConfig
    options: ContainerOptions
    identity: Identity
    workdir: str  # the job's workdir (the cwd unless --container-workdir)
    rootfs: str
    cgroups_path: str  # relative: under the rank's cgroups
    tmp: str  # host directory bound on /tmp
    shm: str | None = None  # host directory bound on /dev/shm (None: a tmpfs of its own)
    binds: tuple[Bind, ...] = ()
    devices: tuple[GpuDevice, ...] = ()
    passwd: str | None = None  # host file bound on /etc/passwd (None: the image's)
    group: str | None = None
    path_prefix: str = ""  # put before PATH (a batch script's own srun and scontrol)
    host_files: tuple[str, ...] = field(default=HOST_FILES)


def is_contract(name: str) -> bool:
    return name in CONTRACT_NAMES or name.startswith(CONTRACT_PREFIXES)


def process_env(image_env: Sequence[str], host: Mapping[str, str], host_wins: Sequence[str] = (),
                path_prefix: str = "", library_dir: str = "") -> list[str]:
    """The container's `KEY=VALUE` list (see the module docstring for the order of precedence);
    `library_dir` (the node's GPU driver libraries, bound in) goes last on LD_LIBRARY_PATH."""
    env: dict[str, str] = {}
    for item in image_env:
        key, sep, value = item.partition("=")
        if key and sep:
            env[key] = value
    image_names = set(env)
    keep = set(host_wins)
    for key, value in host.items():
        if key in image_names and key not in keep and not is_contract(key):
            continue
        env[key] = value
    env.setdefault("PATH", DEFAULT_PATH)
    if path_prefix:
        env["PATH"] = f"{path_prefix}:{env['PATH']}" if env["PATH"] else path_prefix
    env["TMPDIR"] = "/tmp"
    if library_dir and library_dir not in env.get("LD_LIBRARY_PATH", "").split(":"):
        env["LD_LIBRARY_PATH"] = ":".join(p for p in (env.get("LD_LIBRARY_PATH", ""), library_dir) if p)
    return [f"{k}={v}" for k, v in env.items()]


def process_args(command: Sequence[str], image: ImageConfig, entrypoint: bool) -> list[str]:
    """The command, after the image's ENTRYPOINT with `--container-entrypoint` (as pyxis runs it)."""
    return [*image.entrypoint, *command] if entrypoint else list(command)


def _depth(path: str) -> int:
    return len([p for p in posixpath.normpath(path).split("/") if p])


def _bind(b: Bind) -> dict:
    opts = ["rbind", "ro" if b.read_only else "rw", *BIND_SAFE, *(f for f in b.flags if f not in BIND_SAFE)]
    return {"destination": b.destination, "type": "bind", "source": b.source, "options": opts}


def mounts(rc: RankContainer) -> list[dict]:
    """Every mount of the container, in the order runc makes them (parents before children)."""
    remap = rc.options.remap_root
    out: list[dict] = []
    if remap:
        out.append({"destination": "/proc", "type": "bind", "source": "/proc", "options": ["rbind", "nosuid", "noexec", "nodev"]})
    else:
        out.append({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]})
    out.append({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
                "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]})
    out.append({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
                "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] + ([] if remap else ["gid=5"])})
    if rc.shm is not None:
        out.append(_bind(Bind(rc.shm, "/dev/shm")))
    else:
        out.append({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
                    "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]})
    if remap:
        out.append({"destination": "/sys", "type": "bind", "source": "/sys",
                    "options": ["rbind", "nosuid", "noexec", "nodev", "ro"]})
    else:
        out.append({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]})
    if remap:  # a user namespace cannot mknod: the device files are bound from the host
        out += [_bind(Bind(d.host_path, d.path)) | {"options": ["bind", "rw", "nosuid"]} for d in rc.devices]
    out.append(_bind(Bind(rc.tmp, "/tmp")))
    out += [_bind(Bind(f, f, read_only=True)) for f in rc.host_files]
    if rc.passwd is not None:
        out.append(_bind(Bind(rc.passwd, "/etc/passwd", read_only=True)))
    if rc.group is not None:
        out.append(_bind(Bind(rc.group, "/etc/group", read_only=True)))
    out += [_bind(b) for b in sorted(rc.binds, key=lambda b: _depth(b.destination))]  # stable: equal depths keep order
    return out


def _user(rc: RankContainer) -> dict:
    if rc.options.remap_root:
        return {"uid": 0, "gid": 0}
    who = rc.identity
    user: dict = {"uid": who.uid, "gid": who.gid}
    extra = [g for g in who.groups if g != who.gid]
    if extra:
        user["additionalGids"] = extra
    return user


def _caps(rc: RankContainer) -> dict:
    caps = list(ROOT_CAPS) if rc.options.remap_root or rc.identity.uid == 0 else []
    return {k: list(caps) for k in ("bounding", "effective", "permitted")}


def config(rc: RankContainer) -> dict:
    """The whole config.json of the rank's container."""
    remap = rc.options.remap_root
    linux: dict = {
        "namespaces": [{"type": "mount"}] + ([{"type": "user"}] if remap else []),
        "cgroupsPath": rc.cgroups_path,
        "resources": {"devices": [{"allow": False, "access": "rwm"}]
                      + [{"allow": True, "type": "c", "major": d.major, "minor": d.minor, "access": "rwm"}
                         for d in rc.devices]},
    }
    if remap:
        linux["uidMappings"] = [{"containerID": 0, "hostID": rc.identity.uid, "size": 1}]
        linux["gidMappings"] = [{"containerID": 0, "hostID": rc.identity.gid, "size": 1}]
    else:
        linux["devices"] = [{"path": d.path, "type": "c", "major": d.major, "minor": d.minor, "fileMode": 0o666,
                             "uid": 0, "gid": 0} for d in rc.devices]
    return {
        "ociVersion": OCI_VERSION,
        "process": {
            "terminal": False,
            "user": _user(rc),
            "args": process_args(rc.command, rc.image, rc.options.entrypoint),
            "env": process_env(rc.image.env, rc.env, rc.options.env, rc.path_prefix,
                               DRIVER_LIB_DIR if any(b.destination.startswith(DRIVER_DIR + "/") for b in rc.binds) else ""),
            "cwd": rc.options.workdir or rc.workdir,
            "capabilities": _caps(rc),
            "noNewPrivileges": True,
        },
        "root": {"path": rc.rootfs, "readonly": not rc.options.writable},
        "mounts": mounts(rc),
        "linux": linux,
    }


def passwd_with(image_text: str | None, user: str, uid: int, gid: int, home: str, shell: str = "/bin/sh") -> str:
    """The image's /etc/passwd with the owner's line (an image line of the same name or uid goes)."""
    keep = [line for line in (image_text or "").splitlines()
            if line and line.split(":", 1)[0] != user and (line.split(":") + [""] * 3)[2] != str(uid)]
    return "\n".join([*keep, f"{user}:x:{uid}:{gid}::{home}:{shell}"]) + "\n"


def group_with(image_text: str | None, user: str, groups: Sequence[tuple[str, int]]) -> str:
    """The image's /etc/group with the owner's groups (`groups`: name, gid; an image line of the same
    name or gid goes), the owner a member of each."""
    names = {n for n, _ in groups}
    gids = {str(g) for _, g in groups}
    keep = [line for line in (image_text or "").splitlines()
            if line and line.split(":", 1)[0] not in names and (line.split(":") + [""] * 3)[2] not in gids]
    return "\n".join([*keep, *(f"{name}:x:{gid}:{user}" for name, gid in groups)]) + "\n"
