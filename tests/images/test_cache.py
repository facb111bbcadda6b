"""`images/cache.py`'s NodeCache with a real registry, skopeo and overlay mount: pulled once, layers
shared, pinned digests, one pull for two processes, errors that leave nothing behind, LRU under a
cap that spares what is in use."""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from tests import image_builds
from tests.images.conftest import ACCESS, ref_at
from tests.mounts import tmpfs
from trainyard.images import registry
from trainyard.images.cache import NodeCache
from trainyard.images.types import DISK_FULL, NOT_FOUND, UNREACHABLE, ImagePullError
from trainyard.spec.image_ref import ImageRef

REPO = Path(__file__).resolve().parents[2]


def pinned(reg, name: str) -> ImageRef:
    ref = ref_at(reg, name)
    return ref.pinned(registry.resolve_digest(ref, ACCESS))


def leftovers(root: Path) -> dict[str, list[str]]:
    """What the cache holds on disk, besides its empty directories and its lock file."""
    return {d: sorted(os.listdir(root / d)) for d in ("layers", "images", "tmp")} | {
        "blobs": sorted(os.listdir(root / "oci" / "blobs" / "sha256")) if (root / "oci" / "blobs" / "sha256").exists() else []}


def test_ensure_pulls_once_then_needs_no_registry(image_registry, tmp_path):
    image_builds.tiny().push(image_registry.address, "cache/tiny:v1")
    ref = pinned(image_registry, "cache/tiny:v1")
    cache = NodeCache(tmp_path / "cache", "node-a")
    image = cache.ensure(ref, ACCESS)
    assert image.digest == ref.digest and image.name == f"{image_registry.address}/cache/tiny"
    assert len(image.layers) == 1 and Path(image.layers[0], "bin", "busybox").is_file()
    assert os.readlink(Path(image.layers[0], "bin", "sh")) == "/bin/busybox"
    assert image.config.cmd == ("/bin/sh",) and any(e.startswith("PATH=") for e in image.config.env)
    for d in ("", "oci", "layers", "images", "tmp"):
        info = os.lstat(tmp_path / "cache" / d)
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == 0, d
    first_used = cache.entries()[0].last_used
    image_registry.stop()
    try:
        time.sleep(0.05)
        again = NodeCache(tmp_path / "cache", "node-a").ensure(ref, ACCESS)
    finally:
        image_registry.start()
    assert again == image
    [entry] = cache.entries()
    assert entry.last_used > first_used and not entry.in_use and entry.node == "node-a"
    assert cache.get(ref.digest) == image and cache.get("sha256:" + "1" * 64) is None


def test_layers_are_shared_between_images(image_registry, tmp_path):
    """python, then an image built on it (python's layer + a package's): the base layer is fetched
    and unpacked once. (The shared blob is the cache's business whatever the layers above it hold:
    a one-package layer shows it as a 365 MB virtualenv would, without pulling and unpacking that.)"""
    py = image_builds.python()
    derived = image_builds.team_package(py, "vision_pkg")
    py.push(image_registry.address, "cache/python:v1")
    derived.push(image_registry.address, "cache/derived:v1")
    cache = NodeCache(tmp_path / "cache", "n")
    base_hex = py.layer_digests()[0].split(":")[1]
    fetched_before = image_registry.requests(base_hex)
    a = cache.ensure(pinned(image_registry, "cache/python:v1"), ACCESS)
    b = cache.ensure(pinned(image_registry, "cache/derived:v1"), ACCESS)
    assert b.layers[0] == a.layers[0] and len(b.layers) == 2
    assert image_registry.requests(base_hex) - fetched_before == 1
    assert sorted(os.listdir(tmp_path / "cache" / "layers")) == sorted(d.split(":")[1] for d in derived.layer_digests())
    pkg = Path(b.layers[1], "usr/lib/python3/dist-packages/vision_pkg")
    assert stat.S_IMODE(os.stat(pkg).st_mode) & 0o005 == 0o005  # unpacked world-readable: the job runs as its owner
    assert (pkg / "__init__.py").is_file()
    assert cache.usage() < a.size_bytes + b.size_bytes


def test_the_torch_image_is_python_s_layer_a_readable_venv_and_the_project():
    """What the scenarios rely on in `image_builds.torch()`, read from its layout: its base layer is
    the very blob of python() (so a node that has python pulls it once), the venv is world-readable
    (a job runs as its owner) and the project is installed in a layer of its own."""
    py, torch = image_builds.python(), image_builds.torch()
    layers = torch.layer_digests()
    assert len(layers) == 3 and layers[0] == py.layer_digests()[0]
    venv = _member(torch, layers[1], "opt/venv")
    assert venv.isdir() and stat.S_IMODE(venv.mode) & 0o005 == 0o005, oct(venv.mode)
    assert _member(torch, layers[2], "opt/venv/lib/python3.11/site-packages/trainyard/recipes/__main__.py").isfile()


def _member(image: image_builds.BuiltImage, digest: str, name: str) -> tarfile.TarInfo:
    """The header of `name` in one of `image`'s layers, read as a stream up to it (a directory comes
    before its contents: the venv's is among the first of its 365 MB layer)."""
    algo, hexa = digest.split(":", 1)
    with tarfile.open(image.layout / "blobs" / algo / hexa, mode="r|gz") as tar:
        for member in tar:
            if member.name.lstrip("./").rstrip("/") == name:
                return member
    raise AssertionError(f"{name} is not in layer {digest}")


def test_a_pinned_digest_survives_a_moved_tag(image_registry, tmp_path):
    tiny = image_builds.tiny()
    other = image_builds.variant(tiny, "tiny-moved", {"/etc/marker": "second contents\n"})
    tiny.push(image_registry.address, "cache/pin:v1")
    first = pinned(image_registry, "cache/pin:v1")
    other.push(image_registry.address, "cache/pin:v1")
    assert pinned(image_registry, "cache/pin:v1").digest != first.digest
    image = NodeCache(tmp_path / "c", "n").ensure(first, ACCESS)
    assert image.digest == first.digest and len(image.layers) == 1
    assert not any(Path(layer, "etc", "marker").exists() for layer in image.layers)


CHILD = """
import sys, json
from trainyard.images.cache import NodeCache
from trainyard.images.types import RegistryAccess
from trainyard.spec.image_ref import parse_image
img = NodeCache(sys.argv[1], "n").ensure(parse_image(sys.argv[2]), RegistryAccess())
print(json.dumps(img.layers))
"""


def child(root: Path, ref: ImageRef) -> subprocess.Popen[str]:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(root), ref.canonical()], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_two_processes_ensuring_one_image_pull_it_once(image_registry, tmp_path):
    py = image_builds.python()
    py.push(image_registry.address, "cache/twice:v1")
    ref = pinned(image_registry, "cache/twice:v1")
    hexa = py.layer_digests()[0].split(":")[1]
    before = image_registry.requests(hexa)
    procs = [child(tmp_path / "c", ref) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]
    assert image_registry.requests(hexa) - before == 1


def test_a_kill_mid_unpack_leaves_nothing_taken_as_done(image_registry, tmp_path):
    py = image_builds.python()
    py.push(image_registry.address, "cache/killed:v1")
    ref = pinned(image_registry, "cache/killed:v1")
    root = tmp_path / "c"
    proc = child(root, ref)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        tmp = root / "tmp"
        if tmp.is_dir() and any(len(os.listdir(tmp / d)) > 3 for d in os.listdir(tmp)):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the unpack finished before the test could kill it"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert os.listdir(root / "layers") == [] and os.listdir(root / "images") == []
    cache = NodeCache(root, "n")
    assert cache.get(ref.digest) is None
    image = cache.ensure(ref, ACCESS)
    assert Path(image.layers[0], "usr", "bin", "python3").exists()
    assert os.listdir(root / "tmp") == []


def test_an_unknown_image_and_a_registry_down_leave_nothing(image_registry, tmp_path):
    cache = NodeCache(tmp_path / "c", "n")
    missing = ref_at(image_registry, "cache/missing:v1").pinned("sha256:" + "2" * 64)
    with pytest.raises(ImagePullError) as e:
        cache.ensure(missing, ACCESS)
    assert e.value.kind == NOT_FOUND
    image_builds.tiny().push(image_registry.address, "cache/later:v1")
    ref = pinned(image_registry, "cache/later:v1")
    image_registry.stop()
    try:
        with pytest.raises(ImagePullError) as e:
            cache.ensure(ref, ACCESS)
    finally:
        image_registry.start()
    assert e.value.kind == UNREACHABLE and e.value.registry_fault
    assert leftovers(tmp_path / "c") == {"layers": [], "images": [], "tmp": [], "blobs": []}


@pytest.mark.parametrize("size_mib", [5, 100])  # the pull fails; the pull fits, the unpack does not
def test_a_full_disk_is_disk_full_and_leaves_nothing(image_registry, tmp_path, size_mib):
    py = image_builds.python()
    py.push(image_registry.address, "cache/big:v1")
    ref = pinned(image_registry, "cache/big:v1")
    with tmpfs(tmp_path / "small", size_mib) as small:
        cache = NodeCache(small / "c", "n")
        with pytest.raises(ImagePullError) as e:
            cache.ensure(ref, ACCESS)
        assert e.value.kind == DISK_FULL and e.value.registry_fault, str(e.value)
        assert "\n" not in str(e.value)
        assert leftovers(small / "c") == {"layers": [], "images": [], "tmp": [], "blobs": []}


def test_an_image_over_the_cap_alone_is_disk_full(image_registry, tmp_path):
    image_builds.tiny().push(image_registry.address, "cache/capped:v1")
    ref = pinned(image_registry, "cache/capped:v1")
    cache = NodeCache(tmp_path / "c", "n", cap_bytes=1_500_000)  # the blob fits, the unpacked tree does not
    with pytest.raises(ImagePullError) as e:
        cache.ensure(ref, ACCESS)
    assert e.value.kind == DISK_FULL and "cap" in str(e.value)
    assert leftovers(tmp_path / "c") == {"layers": [], "images": [], "tmp": [], "blobs": []}


def _three(reg) -> list[ImageRef]:
    tiny = image_builds.tiny()
    refs = []
    for name in ("lru-a", "lru-b", "lru-c"):
        big = os.urandom(600_000).hex()  # 1.2 MB that compresses to about half
        image_builds.variant(tiny, name, {f"/data/{name}.txt": big}).push(reg.address, f"cache/{name}:v1")
        refs.append(pinned(reg, f"cache/{name}:v1"))
    return refs


def test_lru_over_the_cap_spares_the_recent_and_the_in_use(image_registry, tmp_path):
    a, b, c = _three(image_registry)
    probe = NodeCache(tmp_path / "probe", "n")
    for ref in (a, b):
        probe.ensure(ref, ACCESS)
    two = probe.usage()
    cache = NodeCache(tmp_path / "c", "n", cap_bytes=two + 500_000)  # room for two of the three
    ia = cache.ensure(a, ACCESS)
    cache.ensure(b, ACCESS)
    time.sleep(0.05)
    cache.ensure(a, ACCESS)  # a used last: b is the least recently used
    cache.ensure(c, ACCESS)
    assert {e.digest for e in cache.entries()} == {a.digest, c.digest}
    assert cache.usage() <= two + 500_000
    b_top = b.digest  # its own layer went with it; the shared base stayed
    assert Path(ia.layers[0]).is_dir() and cache.get(b_top) is None
    assert len(os.listdir(tmp_path / "c" / "layers")) == 3

    # a in use (a runner's shared flock): ensuring b now evicts c, never a
    with open(ia.lock_path) as held:
        fcntl.flock(held, fcntl.LOCK_SH)
        assert [e.in_use for e in cache.entries() if e.digest == a.digest] == [True]
        time.sleep(0.05)
        cache.ensure(c, ACCESS)
        cache.ensure(b, ACCESS)
        assert {e.digest for e in cache.entries()} == {a.digest, b.digest}
        assert cache.remove(a.digest) is False
    assert cache.remove(a.digest) is True and cache.remove(a.digest) is False
    assert cache.get(a.digest) is None and not Path(ia.layers[1]).exists() and Path(ia.layers[0]).is_dir()


def tree(root: Path) -> dict[str, tuple]:
    """Every path under `root`: type, mode, owner, and content digest or link target (devices
    and sockets left out: the cache skips them, the runtime makes /dev)."""
    import hashlib
    found = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(top, name)
            st = os.lstat(p)
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                continue
            extra: object = None
            if stat.S_ISLNK(st.st_mode):
                extra = os.readlink(p)
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    extra = hashlib.file_digest(f, "sha256").hexdigest()
            found[os.path.relpath(p, root)] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid,
                                               st.st_gid, extra)
    return found


def test_the_overlay_of_the_layers_is_umocis_rootfs(image_registry, tmp_path):
    """python + a layer of files + whiteouts (a file, a directory) + an opaque directory: the
    read-only overlay of the cache's layers holds the same tree as `umoci unpack`."""
    edited = image_builds.variant(
        image_builds.python(), "python-edited", {"/opt/added/one.txt": "1\n", "/etc/motd": "replaced\n"},
        remove=("/etc/debian_version", "/usr/lib/python3.11/json"),
        opaque={"/usr/lib/python3.11/email": {"only.txt": "alone\n"}})
    edited.push(image_registry.address, "cache/edited:v1")
    image = NodeCache(tmp_path / "c", "n").ensure(pinned(image_registry, "cache/edited:v1"), ACCESS)
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", edited.umoci_ref, str(bundle)], check=True, capture_output=True)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    lower = ":".join(reversed(image.layers))
    done = subprocess.run(["mount", "-t", "overlay", "overlay", "-o", f"ro,lowerdir={lower}", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"no overlay mount here: {done.stderr.strip()}")
    try:
        ours, theirs = tree(mnt), tree(bundle / "rootfs")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    assert "etc/debian_version" not in ours and "usr/lib/python3.11/json" not in ours
    assert [p for p in ours if p.startswith("usr/lib/python3.11/email/")] == ["usr/lib/python3.11/email/only.txt"]
    assert ours.keys() == theirs.keys(), (sorted(ours.keys() - theirs.keys())[:10], sorted(theirs.keys() - ours.keys())[:10])
    differ = [p for p in ours if ours[p] != theirs[p]]
    assert differ == [], [(p, ours[p], theirs[p]) for p in differ[:10]]
