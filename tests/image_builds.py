"""Test images, built once and kept across test runs (issue 37): real Debian root file systems made
with `mmdebstrap` from deb.debian.org, turned into OCI image layouts with `umoci`.

Each image is an OCI layout directory under `<repo>/.cache/test-images/NAME-KEY/` with one tag
(NAME), where KEY hashes the recipe (and the parent image's key, and for `torch` the project's
source): a changed recipe builds anew, an unchanged one is found at once. A flock per image makes
parallel xdist workers build it once; a build goes to a temporary directory renamed into place, so
a killed build leaves nothing a later run would take as done. Builds are not byte-reproducible
across days (the mirror moves): tests key on the digests of what they built, never compare
digests between builds.

- `tiny()`: busybox-static alone (about 1 MB gzip): /bin/sh and coreutils-like applets.
- `python()`: Debian minbase with python3 and python3-venv (one layer).
- `torch()`: `python()`'s layer, then /opt/venv (CPU torch pinned as the project's, numpy, and what a
  recipe run imports: transformers, pyyaml, pydantic, tensorboard; from /opt/wheels and the local
  indexes, offline) in a layer of its own, then the project (`pip install --no-deps` of this
  checkout into the venv) in a third: the base layer is the very blob of `python()`; the venv is
  world-readable (a job runs as its owner).
- `variant(base, name, files)`: `base` plus one layer of the given files (two teams' images).

`BuiltImage.push(registry, repository_tag)` copies one to a registry (tests/image_registry.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "test-images"
MIRROR = "http://deb.debian.org/debian"
SUITE = "bookworm"
RECIPE_VERSION = "2"  # bump to rebuild every image
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TORCH_PINS = ("torch==2.13.0+cpu", "numpy==2.4.6", "transformers==5.18.0", "pyyaml", "pydantic>=2.6,<3",
              "tensorboard")
WHEEL_DIRS = ("/opt/wheels", "/opt/pypi/files", "/opt/pypi-more/files")
# mmdebstrap: leave out documentation, manuals and translations (smaller layers, same programs)
_DPKG_EXCLUDES = ("path-exclude=/usr/share/doc/*", "path-exclude=/usr/share/man/*",
                  "path-exclude=/usr/share/locale/*", "path-exclude=/usr/share/info/*")


@dataclass(frozen=True)
class BuiltImage:
    """An image in an OCI layout: `ref` is skopeo's and umoci's `oci:` name of it."""

    name: str
    layout: Path
    key: str

    @property
    def tag(self) -> str:
        return self.name

    @property
    def ref(self) -> str:
        return f"oci:{self.layout}:{self.tag}"

    @property
    def umoci_ref(self) -> str:
        return f"{self.layout}:{self.tag}"

    def manifest(self) -> dict:
        """The image's manifest, read from its layout."""
        index = json.loads((self.layout / "index.json").read_text())
        desc = next(m for m in index["manifests"]
                    if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == self.tag)
        return json.loads(_blob(self.layout, desc["digest"]).read_text())

    def digest(self) -> str:
        """The manifest's digest: what a registry gives for the tag this image is pushed under."""
        index = json.loads((self.layout / "index.json").read_text())
        return next(m["digest"] for m in index["manifests"]
                    if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == self.tag)

    def compressed_bytes(self) -> int:
        """The image's layers as pushed (compressed), in bytes."""
        return sum(layer["size"] for layer in self.manifest()["layers"])

    def layer_digests(self) -> list[str]:
        return [layer["digest"] for layer in self.manifest()["layers"]]

    def push(self, registry: str, repository_tag: str) -> str:
        """Copy to `registry` (host:port, plain HTTP) as `repository_tag`; returns `registry/repository_tag`."""
        from tests.image_registry import push_layout
        return push_layout(self.ref, f"{registry}/{repository_tag}")


def _blob(layout: Path, digest: str) -> Path:
    algo, hexa = digest.split(":", 1)
    return layout / "blobs" / algo / hexa


def run(cmd: list[str], *, timeout: float = 900, cwd: Path | None = None) -> str:
    """Run a build step with a plain environment; its stderr's tail in the error when it fails."""
    env = {"PATH": PATH, "LANG": "C.UTF-8", "HOME": "/root", "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])}… exited {done.returncode}: {done.stderr[-3000:]}")
    return done.stdout


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps([RECIPE_VERSION, *parts], sort_keys=True, default=str).encode()).hexdigest()[:16]


def _cached(name: str, key: str, build) -> BuiltImage:
    """The image NAME-KEY from the cache, or built by `build(layout_dir)` once (flock, temp + rename)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    final = CACHE / f"{name}-{key}"
    image = BuiltImage(name, final, key)
    if (final / "index.json").exists():
        _prune(name, keep=final)
        return image
    with open(CACHE / f"{name}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / "index.json").exists():
            return image
        work = Path(tempfile.mkdtemp(prefix=f".build-{name}-", dir=CACHE))
        try:
            build(work)
            os.rename(work / "layout", final)
        finally:
            _remove_tree(work)
    _prune(name, keep=final)
    return image


def _prune(name: str, keep: Path) -> None:
    """Older builds of `name` (another key: the recipe or, for `torch`, the source changed), each
    removed once no other process holds its lock: the cache keeps one build per name."""
    for old in CACHE.glob(f"{name}-*"):
        suffix = old.name[len(name) + 1:]
        if old == keep or not old.is_dir() or len(suffix) != 16 or not all(c in "0123456789abcdef" for c in suffix):
            continue  # another image whose name starts with ours (torch-env), or not a build
        with open(CACHE / f"{old.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue
            _remove_tree(old)
        (CACHE / f"{old.name}.lock").unlink(missing_ok=True)


def _remove_tree(path: Path) -> None:
    if path.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def _new_layout(layout: Path, tag: str) -> None:
    run(["umoci", "init", "--layout", str(layout)])
    run(["umoci", "new", "--image", f"{layout}:{tag}"])


def _finish(layout: Path, tag: str, env_path: str = PATH, cmd: str = "/bin/sh") -> None:
    run(["umoci", "config", "--image", f"{layout}:{tag}", f"--config.env=PATH={env_path}",
         f"--config.cmd={cmd}", "--os", "linux", "--architecture", "amd64"])
    run(["umoci", "gc", "--layout", str(layout)])


def _link_or_copy(src: str, dst: str) -> object:
    """Blobs are content-addressed and never written again: a hard link, not a copy (a torch
    image's 400 MB would be copied at every source change); the rest (index.json, which umoci
    rewrites) a copy."""
    if f"{os.sep}blobs{os.sep}" in src:
        try:
            os.link(src, dst)
            return dst
        except OSError:
            pass
    return shutil.copy2(src, dst)


def _copy_layout(base: BuiltImage, layout: Path, tag: str) -> None:
    """`base`'s layout copied to `layout`, its image tagged `tag` (the blobs are the same bytes)."""
    shutil.copytree(base.layout, layout, symlinks=True, copy_function=_link_or_copy)
    if tag != base.tag:
        run(["umoci", "tag", "--image", f"{layout}:{base.tag}", tag])
        run(["umoci", "rm", "--image", f"{layout}:{base.tag}"])


def _add_layer(layout: Path, tag: str, tree: Path) -> None:
    """One layer holding `tree`'s contents at the image's root (owners as numbers), made with GNU
    tar and added verbatim: umoci 0.4.7's `insert` wrote truncated tar streams for large trees and
    for a target of "/" here (found by layers.py's checks: "unexpected end of data")."""
    archive = tree.parent / f"{tree.name}.layer.tar"
    entries = sorted(os.listdir(tree))
    run(["tar", "--numeric-owner", "--format=pax", "-C", str(tree), "-cf", str(archive), "--", *entries], timeout=1800)
    try:
        run(["umoci", "raw", "add-layer", "--image", f"{layout}:{tag}", str(archive)], timeout=1800)
    finally:
        archive.unlink()


def _mmdebstrap(rootfs: Path, variant: str, packages: str) -> None:
    cmd = ["mmdebstrap", f"--variant={variant}", f"--include={packages}", "--mode=root", "--format=directory",
           "--quiet"]
    cmd += [f"--dpkgopt={o}" for o in _DPKG_EXCLUDES]
    run(cmd + [SUITE, str(rootfs), MIRROR])


# -- the images --------------------------------------------------------------------------------------

def tiny() -> BuiltImage:
    def build(work: Path) -> None:
        rootfs = work / "rootfs"
        _mmdebstrap(rootfs, "extract", "busybox-static")
        for d in ("bin", "sbin", "usr/bin", "usr/sbin", "tmp", "proc", "sys", "dev", "etc", "root"):
            (rootfs / d).mkdir(parents=True, exist_ok=True)
        os.chmod(rootfs / "tmp", 0o1777)
        busybox = rootfs / "bin" / "busybox"
        for applet in run([str(busybox), "--list-full"]).split():
            link = rootfs / applet
            if not link.exists() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to("/bin/busybox")
        (rootfs / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n")
        (rootfs / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        for leftover in ("var/lib/dpkg", "var/cache", "var/log"):
            _remove_tree(rootfs / leftover)
        layout = work / "layout"
        _new_layout(layout, "tiny")
        _add_layer(layout, "tiny", rootfs)
        _finish(layout, "tiny")
    return _cached("tiny", _key("tiny", SUITE, "busybox-static"), build)


def python() -> BuiltImage:
    packages = "python3,python3-venv"

    def build(work: Path) -> None:
        rootfs = work / "rootfs"
        _mmdebstrap(rootfs, "minbase", packages)
        layout = work / "layout"
        _new_layout(layout, "python")
        _add_layer(layout, "python", rootfs)
        _finish(layout, "python", cmd="/usr/bin/python3")
    return _cached("python", _key("python", SUITE, packages, _DPKG_EXCLUDES), build)


def torch_env() -> BuiltImage:
    """`python()` + /opt/venv (no project): the slow part of `torch()`, cached on its own."""
    base = python()

    def build(work: Path) -> None:
        bundle = work / "bundle"
        run(["umoci", "unpack", "--image", base.umoci_ref, str(bundle)])
        rootfs = bundle / "rootfs"
        binds = " ".join(f"mkdir -p {rootfs}/mnt/w{i} && mount --bind {d} {rootfs}/mnt/w{i} &&"
                         for i, d in enumerate(WHEEL_DIRS))
        links = " ".join(f"--find-links /mnt/w{i}" for i in range(len(WHEEL_DIRS)))
        inner = (f"python3 -m venv /opt/venv && /opt/venv/bin/pip install -q --no-cache-dir --no-index "
                 f"--disable-pip-version-check {links} {' '.join(repr(p) for p in TORCH_PINS)}")
        script = (f"set -e; mount --make-rprivate / && {binds} mount -t proc proc {rootfs}/proc && "
                  f"chroot {rootfs} /usr/bin/env -i PATH={PATH} HOME=/root LANG=C.UTF-8 sh -c \"{inner}\"")
        run(["unshare", "--mount", "sh", "-c", script], timeout=1800)
        run(["chmod", "-R", "a+rX", str(rootfs / "opt" / "venv")])
        layout = work / "layout"
        _copy_layout(base, layout, "torch-env")
        venv_tree = work / "venv-tree"
        (venv_tree / "opt").mkdir(parents=True)
        os.rename(rootfs / "opt" / "venv", venv_tree / "opt" / "venv")
        _add_layer(layout, "torch-env", venv_tree)
        _finish(layout, "torch-env", env_path=f"/opt/venv/bin:{PATH}", cmd="/opt/venv/bin/python")
    return _cached("torch-env", _key("torch-env", base.key, TORCH_PINS), build)


def _source_hash() -> str:
    h = hashlib.sha256()
    for path in sorted([REPO / "pyproject.toml", *(REPO / "src").rglob("*")]):
        if path.is_file() and "__pycache__" not in path.parts and ".egg-info" not in str(path):
            h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def torch() -> BuiltImage:
    """`torch_env()` + this checkout installed into /opt/venv (`pip install --no-deps`), a layer of its own."""
    base = torch_env()

    def build(work: Path) -> None:
        site = "opt/venv/lib/python3.11/site-packages"
        target = work / "project"
        src = work / "src"
        shutil.copytree(REPO, src, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".cache", "__pycache__", "build", "*.egg-info", "tests", "bench", "docs", ".*"))
        host_python = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv").exists() else "/work/main/.venv/bin/python"
        run([host_python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-compile",
             "--no-index", "--target", str(target / site), str(src)])
        scripts = target / site / "bin"
        (target / "opt/venv/bin").mkdir(parents=True)
        for script in scripts.iterdir():
            body = script.read_text().split("\n", 1)[1]
            dest = target / "opt/venv/bin" / script.name
            dest.write_text("#!/opt/venv/bin/python3\n" + body)
            dest.chmod(0o755)
        shutil.rmtree(scripts)
        run(["chmod", "-R", "a+rX", str(target)])
        layout = work / "layout"
        _copy_layout(base, layout, "torch")
        _add_layer(layout, "torch", target)
        _finish(layout, "torch", env_path=f"/opt/venv/bin:{PATH}", cmd="/opt/venv/bin/python")
    return _cached("torch", _key("torch", base.key, _source_hash()), build)


def variant(base: BuiltImage, name: str, files: dict[str, str], remove: tuple[str, ...] = (),
            opaque: dict[str, dict[str, str]] | None = None) -> BuiltImage:
    """`base` with one more layer holding `files` (absolute path in the image → text, mode 0644,
    root's): e.g. two teams' images that differ in one Python package. `remove`: paths deleted by
    a layer of whiteouts (`.wh.NAME`) after it; `opaque`: directories replaced whole (path → its new
    files), a layer each (`.wh..wh..opq`)."""
    def tree_of(root: Path, content: dict[str, str]) -> Path:
        for path, text in content.items():
            dest = root / path.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
        root.mkdir(parents=True, exist_ok=True)
        run(["chmod", "-R", "u=rwX,go=rX", str(root)])
        return root

    def build(work: Path) -> None:
        layout = work / "layout"
        _copy_layout(base, layout, name)
        if files:
            _add_layer(layout, name, tree_of(work / "tree", files))
        if remove:
            _add_layer(layout, name, tree_of(work / "removed", {
                str(Path(p).parent / f".wh.{Path(p).name}"): "" for p in remove}))
        for i, (directory, content) in enumerate(sorted((opaque or {}).items())):
            _add_layer(layout, name, tree_of(work / f"opaque{i}", {
                f"{directory}/.wh..wh..opq": "", **{f"{directory}/{k}": v for k, v in content.items()}}))
        run(["umoci", "gc", "--layout", str(layout)])
    return _cached(name, _key("variant", base.key, name, files, remove, opaque), build)


def team_package(base: BuiltImage, package: str) -> BuiltImage:
    """`base` + a tiny Python package `package` in the system site-packages (`import PACKAGE` works)."""
    site = "/usr/lib/python3/dist-packages"
    return variant(base, f"{base.name}-{package.replace('_', '-')}",
                   {f"{site}/{package}/__init__.py": f"NAME = {package!r}\n"})
