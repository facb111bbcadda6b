"""A rank in its image on the local backend (`LaunchSpec.container`): the node's cache, the bundle.

The image on a node is a `CachedImage` of that node's cache (`images.cache.NodeCache` under
`<data_dir>/images/<node>/`); the loop has had the node pull it before the launch, so a launch
that finds it missing fails (`missing`), naming the node and the image.

Per rank, in the attempt's run dir (the plane's; see `backends/rundir/container_start.py` for
how the runner uses it):

    ctr-<r>/              the bundle, root's, 0711 (with --container-remap-root runc's init runs
                          as the owner and must pass through it)
    ctr-<r>/config.json   0600: it holds the rank's environment, the job's token with it
                          (`backends.contain.oci_spec.config`)
    ctr-<r>/rootfs/       the overlay's mount point; rw/ (0700) its upper and work dirs
    ctr-<r>/mnt/          staging points of the binds the owner controls, made by the runner
    ctr-<r>/passwd, group the image's files with the owner's lines, bound read-only
    ctr-<r>/state/        runc's --root; runc.log its log
    ctr-<r>/targets.json  with --container-remap-root: the mount points the runner makes (0600)

The plan (`rank_plan`) goes into attempt.json before any rank starts; `write_bundle` writes the
rest once the rank's environment is known. `delete_all` is the backend's `runc delete --force` of
an attempt's containers when it aborts or releases one whose runner could not (a runner killed
with its node): runc's state and the cgroups it made outside the rank's go with it.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from trainyard import jobfs
from trainyard.backends.base import BackendError, LaunchSpec, Owner
from trainyard.backends.contain import oci_spec
from trainyard.backends.contain.common import attempt_key, base_name
from trainyard.backends.contain.devices import Device
from trainyard.images.types import CachedImage, EntryInfo, RegistryAccess
from trainyard.spec.image_ref import ImageRef

IMAGE_FILE_MAX = 1 << 20  # an image's /etc/passwd or /etc/group read at most (an image is untrusted)
NVIDIA_EXTRA = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class NodeImages(Protocol):
    """One node's image cache, as the backend uses it (`images.cache.NodeCache`)."""

    cap_bytes: int | None

    def get(self, digest: str) -> CachedImage | None: ...

    def ensure(self, ref: ImageRef, access: RegistryAccess) -> CachedImage: ...

    def entries(self) -> list[EntryInfo]: ...

    def remove(self, digest: str) -> bool: ...


def node_cache(data_dir: Path, node: str, cap_bytes: int | None) -> NodeImages:
    """`images.cache.NodeCache` of `node` (imported when first needed: a bare job never loads it)."""
    from trainyard.images.cache import NodeCache

    top = data_dir / "images"  # every node's cache: root's alone (a job sees its image through its container)
    top.mkdir(mode=0o700, exist_ok=True)  # plane's own: the data dir's images/
    os.chmod(top, 0o700)  # plane's own: made by an older plane with the default mode
    return NodeCache(top / node, node, cap_bytes)


def find_runc() -> str:
    """The runc the runners execute (root's: found on the standard PATH, not the caller's).

    Raises:
        BackendError: runc is not installed.
    """
    found = shutil.which("runc", path=SAFE_PATH)
    if found is None:
        raise BackendError("runc is not installed on this node (scripts/images-setup.sh installs it)")
    return found


def missing(spec: LaunchSpec, node: str) -> BackendError:
    assert spec.container is not None
    return BackendError(f"job {spec.job_id} attempt {spec.attempt}: image {spec.container.ref} is not in the cache "
                        f"of node {node} (it is pulled before the launch; pull it with `yard image pull`)")


def container_id(data_dir: Path, spec: LaunchSpec, rank: int) -> str:
    """The container's name, also its cgroup's below the rank's (unique on the machine: runc
    makes the same name under the plane's own cgroup in the hierarchies the rank has none of)."""
    return f"trainyard-{base_name(str(data_dir))}-{attempt_key(spec.job_id, spec.attempt)}-r{rank}"


def _under(path: str, top: str) -> bool:
    return os.path.normpath(path) == os.path.normpath(top) or os.path.normpath(path).startswith(
        os.path.normpath(top).rstrip("/") + "/")


def owner_sources(spec: LaunchSpec) -> list[tuple[str, oci_spec.Bind]]:
    """(host path opened as the owner, its bind with the staging point still empty): the workdir,
    the checkpoint dir when it is elsewhere, the home with --container-mount-home, the job's
    --container-mounts."""
    assert spec.container is not None
    opts = spec.container.options
    out = [(spec.workdir, oci_spec.Bind("", spec.workdir))]
    ckpt = spec.checkpoint_dir
    if ckpt and not _under(ckpt, spec.job_dir) and not _under(ckpt, spec.workdir) and os.path.isdir(ckpt):
        out.append((ckpt, oci_spec.Bind("", ckpt)))
    if opts.mount_home:
        home = _home(spec.owner)
        out.append((home, oci_spec.Bind("", home)))
    out += [(m.src, oci_spec.Bind("", m.dst, m.read_only, m.flags)) for m in opts.mounts]
    return out


def _home(owner: Owner | None) -> str:
    try:
        return pwd.getpwuid(owner.uid if owner is not None else os.geteuid()).pw_dir
    except KeyError:
        return "/"


def rank_plan(data_dir: Path, spec: LaunchSpec, run_dir: Path, rank: int, image: CachedImage, runc: str) -> dict:
    """The rank's `container` plan for attempt.json (see the module docstring), its directories made."""
    bundle = run_dir / f"ctr-{rank}"
    tree = jobfs.Tree(run_dir)
    tree.make_dir(bundle.name, 0o711, exist_ok=False)
    for sub, mode in (("rootfs", 0o755), ("rw", 0o700), ("rw/upper", 0o755), ("rw/work", 0o700), ("mnt", 0o711),
                      ("state", 0o700)):
        tree.make_dir(f"{bundle.name}/{sub}", mode)
    binds = [{"src": src, "stage": str(bundle / "mnt" / str(i))} for i, (src, _) in enumerate(owner_sources(spec))]
    return {"bundle": str(bundle), "id": container_id(data_dir, spec, rank), "runc": runc,
            "state": str(bundle / "state"), "log": str(bundle / "runc.log"), "layers": list(image.layers),
            "lock": image.lock_path, "image": f"{image.name}@{image.digest}", "binds": binds}


def _image_file(layers: Sequence[str], rel: str) -> str | None:
    """An image's small text file as its overlay shows it (the top layer that has it), read
    through no link; None when absent, whited out, not a regular file or too big."""
    for layer in reversed(layers):
        tree = jobfs.Tree(layer)
        st = tree.lstat(rel)
        if st is None:
            continue
        return tree.read_text(rel, IMAGE_FILE_MAX)  # a whiteout or a link: None (refused)
    return None


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"g{gid}"


def gpu_devices(devices: Sequence[Device]) -> list[oci_spec.GpuDevice]:
    """The rank's device files as the container sees them: a real one at its own path (with the
    driver's control files), an emulated one (`<data_dir>/dev/nvidiaN`) at /dev/nvidia<minor>."""
    out = [oci_spec.GpuDevice(d.path, d.path if d.path.startswith("/dev/") else f"/dev/nvidia{d.minor}",
                              d.major, d.minor) for d in devices]
    if any(d.path.startswith("/dev/") for d in devices):
        for path in NVIDIA_EXTRA:
            try:
                st = os.stat(path)
            except OSError:
                continue
            out.append(oci_spec.GpuDevice(path, path, os.major(st.st_rdev), os.minor(st.st_rdev)))
    return out


# The driver's user-space parts a CUDA program loads (what nvidia-container-cli injects), looked for
# in the node's library directories; and its tools.
DRIVER_LIBRARIES = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "libnvidia-nvvm.so",
                    "libcudadebugger.so", "libnvidia-gpucomp.so")
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib")
DRIVER_TOOLS = ("/usr/bin/nvidia-smi",)


def driver_binds(lib_dirs: Sequence[str] = LIBRARY_DIRS, tools: Sequence[str] = DRIVER_TOOLS) -> list[oci_spec.Bind]:
    """The node's GPU driver files, read-only, at `oci_spec.DRIVER_LIB_DIR` and `DRIVER_BIN_DIR`:
    each `libX.so.<version>` and its `libX.so.1` name (as the dynamic linker asks for them), found
    in the system's own library directories (root's, not an owner's); [] on a node without them."""
    out: list[oci_spec.Bind] = []
    seen: set[str] = set()
    for d in lib_dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            base = next((lib for lib in DRIVER_LIBRARIES if name.startswith(lib + ".")), None)
            if base is None or name in seen:
                continue
            real = os.path.realpath(os.path.join(d, name))
            if not os.path.isfile(real):
                continue
            seen.add(name)
            out.append(oci_spec.Bind(real, f"{oci_spec.DRIVER_LIB_DIR}/{name}", True))
    for tool in tools:
        if os.path.isfile(tool):
            out.append(oci_spec.Bind(os.path.realpath(tool), f"{oci_spec.DRIVER_BIN_DIR}/{os.path.basename(tool)}", True))
    return out


def write_bundle(plan: dict, spec: LaunchSpec, image: CachedImage, env: Mapping[str, str], tmp: dict,
                 devices: Sequence[Device], path_prefix: str = "", *, datasets: Sequence[str] = ()) -> None:
    """config.json, passwd and group of the rank's bundle (0600, 0644, 0644; root's). `datasets`:
    the staged copies on the rank's node (the plane's cache, `staging.cache`), bound read-only at the
    same path, so that `$TRAINYARD_DATASET_<NAME>` names them inside too.

    Raises:
        OSError: a file cannot be written.
    """
    assert spec.container is not None
    bundle = Path(plan["bundle"])
    tree = jobfs.Tree(bundle)
    owner = spec.owner
    uid, gid = (owner.uid, owner.gid) if owner is not None else (os.geteuid(), os.getegid())
    groups = tuple(owner.groups) if owner is not None else ()
    passwd = group = None
    if not spec.container.options.remap_root:
        user = owner.user if owner is not None else pwd.getpwuid(uid).pw_name
        tree.write_bytes("passwd", oci_spec.passwd_with(_image_file(image.layers, "etc/passwd"), user, uid, gid,
                                                         _home(owner)).encode(), 0o644)
        names = [(_group_name(g), g) for g in dict.fromkeys((gid, *groups))]
        tree.write_bytes("group", oci_spec.group_with(_image_file(image.layers, "etc/group"), user, names).encode(),
                         0o644)
        passwd, group = str(bundle / "passwd"), str(bundle / "group")
    gpus = gpu_devices(devices)
    env = dict(env)
    if devices:
        env["TRAINYARD_GPU_DEVICES"] = ",".join(d.path for d in gpus[: len(devices)])
    binds = [oci_spec.Bind(spec.job_dir, spec.job_dir)]
    driver = driver_binds() if any(d.path.startswith("/dev/") for d in devices) else []  # a real GPU's driver
    binds += driver
    for b, (_, proto) in zip(plan["binds"], owner_sources(spec)):
        binds.append(oci_spec.Bind(b["stage"], proto.destination, proto.read_only, proto.flags))
    binds += [oci_spec.Bind(p, p, read_only=True) for p in datasets]
    tmp_dir, shm = (os.path.join(tmp["root"], "tmp"), os.path.join(tmp["root"], "shm")) if tmp.get("mode") == "tmpfs" \
        else (tmp.get("path") or "", None)
    rc = oci_spec.RankContainer(
        command=spec.command, env=env, image=image.config, options=spec.container.options,
        identity=oci_spec.Identity(uid, gid, groups), workdir=spec.workdir, rootfs=str(bundle / "rootfs"),
        cgroups_path=plan["id"], tmp=tmp_dir, shm=shm, binds=tuple(binds), devices=tuple(gpus), passwd=passwd,
        group=group, path_prefix=path_prefix,
        host_files=tuple(f for f in oci_spec.HOST_FILES if os.path.isfile(f)))
    config = oci_spec.config(rc)
    tree.write_bytes("config.json", json.dumps(config, indent=1).encode(), 0o600)
    if spec.container.options.remap_root:  # runc's init cannot make them: the runner does
        kinds = {b.destination: os.path.isdir(src) for src, b in owner_sources(spec)} | {b.destination: False for b in driver} \
            | {p: os.path.isdir(p) for p in datasets}
        targets = remap_targets(config["mounts"], kinds)
        tree.write_bytes("targets.json", json.dumps({"tmp": tmp_dir, "targets": targets}).encode(), 0o600)


def remap_targets(mounts: Sequence[dict], kinds: Mapping[str, bool]) -> list[list]:
    """[where, path, is_dir] of every bind's mount point outside /dev and /proc and /sys (see
    `container_start.make_targets`): below /tmp in the private /tmp, else in the image."""
    out: list[list] = []
    for m in mounts:
        dest = m["destination"]
        if m["type"] != "bind" or dest == "/tmp" or dest.split("/")[1] in ("dev", "proc", "sys"):
            continue
        is_dir = kinds.get(dest, dest not in (*oci_spec.HOST_FILES, "/etc/passwd", "/etc/group"))
        out.append(["tmp", dest[len("/tmp/"):], is_dir] if dest.startswith("/tmp/") else ["root", dest, is_dir])
    return out


def delete_all(plans: Mapping[str, dict]) -> None:
    """`runc delete --force` of every container of an attempt whose runc state is still there."""
    for plan in plans.values():
        ctr = plan.get("container")
        if not ctr or not os.path.isdir(os.path.join(ctr["state"], ctr["id"])):
            continue
        try:
            subprocess.run([ctr["runc"], "--root", ctr["state"], "delete", "--force", ctr["id"]],
                           env={"PATH": SAFE_PATH, "LANG": "C"}, stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
