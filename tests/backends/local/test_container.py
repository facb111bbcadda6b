"""Ranks in an image on the local backend: real runc, real accounts, real cgroups (issue 37).

The image is a `CachedImage` made by hand whose one layer is a Debian root file system
(tests/backends/container_image.py) until the node cache hands them out in tests; everything
else is the real thing: `LocalBackend.launch`, the rank runner, the overlay, runc.
"""

from __future__ import annotations

import os
import pwd
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from tests.accounts import Accounts, accounts, shared_dir
from tests.backends.container_image import NEEDS_RUNC, essential_rootfs
from tests.backends.helpers import NODES, make_spec, marked_processes, wait_done, wait_until
from trainyard.backends import BackendError, LocalBackend
from trainyard.backends.base import ContainerLaunch, Limits, LaunchSpec, Owner
from trainyard.images.types import CachedImage, EntryInfo, ImageConfig
from trainyard.spec.container import ContainerOptions
from trainyard.spec.container_mounts import Mount

pytestmark = [NEEDS_RUNC, pytest.mark.xdist_group("containers")]

DIGEST = "sha256:" + "e" * 64
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class HandCache:
    """One node's cache holding one image (what `the images part's `NodeCache.get`` returns)."""

    image: CachedImage

    def get(self, digest: str) -> CachedImage | None:
        return self.image if digest == self.image.digest else None

    def ensure(self, ref: object, access: object) -> CachedImage:
        return self.image

    def entries(self) -> list[EntryInfo]:
        return []

    def remove(self, digest: str) -> bool:
        return False


@pytest.fixture(scope="module")
def users() -> Iterator[Accounts]:
    with accounts({"alice": ["teama"], "bob": ["teamb"]}, ["teama", "teamb"]) as made:
        yield made


@pytest.fixture
def place() -> Iterator[Path]:
    with shared_dir("tyctr-") as d:
        yield d


def _image(place: Path, layers: tuple[str, ...] | None = None) -> CachedImage:
    lock = place / "image.lock"
    lock.touch()
    return CachedImage(DIGEST, "127.0.0.1:5000/test/essential", layers or (str(essential_rootfs()),),
                       ImageConfig(env=(f"PATH={PATH}", "IMAGE_ONLY=from-image", "LANG=C.UTF-8"),
                                   entrypoint=("/usr/bin/env", "ENTRY=1")),
                       str(lock), 0)


@pytest.fixture
def backend(place: Path) -> Iterator[LocalBackend]:
    data = place / "data"
    data.mkdir(mode=0o711)
    image = _image(place)
    be = LocalBackend(data, NODES, image_caches=lambda node: HandCache(image))
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    assert marked_processes(data) == []


TEAM = {"alice": "teama", "bob": "teamb"}


def owner(users: Accounts, role: str = "alice") -> Owner:
    pw = pwd.getpwnam(users.user(role))
    return Owner(pw.pw_name, pw.pw_uid, pw.pw_gid, (pw.pw_gid, users.gid(TEAM[role])))


def workdir(place: Path, who: Owner) -> Path:
    d = place / f"work-{who.user}"
    d.mkdir(mode=0o700, exist_ok=True)
    os.chown(d, who.uid, who.gid)
    return d


def cspec(be: LocalBackend, place: Path, job: int, command: list[str], who: Owner, **opts: object) -> LaunchSpec:
    data = place / "data"
    spec = make_spec(data, job, command, workdir=workdir(place, who))
    options = ContainerOptions(image="127.0.0.1:5000/test/essential", **opts)  # type: ignore[arg-type]
    return replace(spec, owner=who, container=ContainerLaunch(options, f"127.0.0.1:5000/test/essential@{DIGEST}", DIGEST))


def log(place: Path, job: int, rank: int = 0) -> str:
    return (place / "data" / "jobs" / str(job) / "logs" / f"rank-{rank}.log").read_text()


def test_the_rank_runs_in_the_image_as_its_owner(backend, place, users):
    who = owner(users)
    spec = cspec(backend, place, 1, ["sh", "-c", 'id -u; id -un; id -gn; echo "$IMAGE_ONLY $RANK $PWD"; '
                                     'cat /etc/debian_version; exit 3'], who)
    backend.launch(spec)
    state = wait_done(backend, 1)
    out = log(place, 1)
    assert state.ranks[0].exit_code == 3, out
    lines = out.splitlines()
    assert lines[1:4] == [str(who.uid), who.user, who.user], out
    assert lines[4] == f"from-image 0 {spec.workdir}"
    assert lines[5].startswith("12.")


def test_the_job_sees_its_dirs_and_not_the_cache_nor_another_teams_files(backend, place, users):
    who, other = owner(users), owner(users, "bob")
    secret = workdir(place, other) / "secret"
    secret.write_text("bob's")
    spec = cspec(backend, place, 2, ["sh", "-c", f'echo hi > out; ls {spec_dir(place, 2)} >/dev/null && echo jobdir; '
                                     f'ls {essential_rootfs()} 2>/dev/null || echo nocache; '
                                     f'cat {secret} 2>/dev/null || echo nosecret; ls /tmp'], who)
    backend.launch(spec)
    state = wait_done(backend, 2)
    out = log(place, 2)
    assert state.ranks[0].exit_code == 0, out
    assert (Path(spec.workdir) / "out").read_text() == "hi\n"
    assert "jobdir" in out and "nocache" in out and "nosecret" in out, out


def spec_dir(place: Path, job: int) -> Path:
    return place / "data" / "jobs" / str(job)


def test_writes_to_root_land_in_the_attempts_upper_dir_and_readonly_refuses_them(backend, place, users):
    who = owner(users)
    layer = essential_rootfs()
    backend.launch(cspec(backend, place, 3, ["sh", "-c", "echo x > /opt/written && ls -l /opt/written"], who,
                         writable=True))
    state = wait_done(backend, 3)
    assert state.ranks[0].exit_code != 0  # /opt is root's: the owner cannot write there, in the image or not
    backend.launch(cspec(backend, place, 4, ["sh", "-c", "echo x > /var/tmp/written && cat /var/tmp/written"], who))
    state = wait_done(backend, 4)
    assert state.ranks[0].exit_code == 0, log(place, 4)
    assert not (layer / "var" / "tmp" / "written").exists()  # the node's cache is untouched
    upper = spec_dir(place, 4) / "run" / "attempt-1" / "ctr-0" / "rw" / "upper" / "var" / "tmp" / "written"
    assert upper.read_text() == "x\n" and upper.stat().st_uid == who.uid
    backend.launch(cspec(backend, place, 5, ["sh", "-c", "echo x > /var/tmp/written"], who, writable=False))
    state = wait_done(backend, 5)
    assert state.ranks[0].exit_code != 0 and "Read-only file system" in log(place, 5)


def test_exit_codes_and_signals_are_the_jobs_own(backend, place, users):
    who = owner(users)
    # a launcher that does not catch the notice, and a worker that does (torchrun and its trainer)
    catcher = ("sleep 60 & echo $! > launcher.pid; trap 'echo got-usr1' USR1; i=0; "
               "while [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done")
    spec6 = cspec(backend, place, 6, ["sh", "-c", catcher], who)
    backend.launch(spec6)
    backend.launch(cspec(backend, place, 7, ["sleep", "60"], who))
    backend.launch(cspec(backend, place, 21, ["sleep", "60"], who))
    time.sleep(0.3)
    backend.signal(6, 1, signal.SIGUSR1)  # the preemption notice: to the processes that catch it
    backend.signal(7, 1, signal.SIGUSR1)  # none does: to the command, as for a bare rank
    wait_until(lambda: "got-usr1" in log(place, 6), 5, "the notice")
    time.sleep(0.3)
    assert log(place, 6).count("got-usr1") == 1
    sleeper = int((Path(spec6.workdir) / "launcher.pid").read_text())
    assert os.path.exists(f"/proc/{sleeper}")  # the one that does not catch it lives on (a host pid)
    assert wait_done(backend, 7).ranks[0].signal == signal.SIGUSR1
    backend.signal(21, 1, signal.SIGTERM)
    state = wait_done(backend, 21)
    assert state.ranks[0].signal == signal.SIGTERM and state.ranks[0].exit_code is None
    backend.signal(6, 1, signal.SIGKILL)
    assert wait_done(backend, 6).ranks[0].signal == signal.SIGKILL
    assert not os.path.exists(f"/proc/{sleeper}")  # the runner drained the container with its rank


def test_the_memory_limit_oom_kills_inside_the_container(backend, place, users):
    who = owner(users)
    spec = replace(cspec(backend, place, 8, ["dd", "if=/dev/zero", "of=/dev/null", "bs=400M", "count=1"], who),
                   limits=Limits(mem_mib=128))
    backend.launch(spec)
    state = wait_done(backend, 8, timeout=30)
    assert state.ranks[0].signal == signal.SIGKILL and state.ranks[0].oom_killed, log(place, 8)


def test_a_mount_the_owner_cannot_read_is_refused_and_a_swapped_link_is_not_followed(backend, place, users):
    who, other = owner(users), owner(users, "bob")
    theirs = workdir(place, other)
    with pytest.raises(BackendError, match=rf"cannot mount {theirs} as {who.user}: Permission denied"):
        backend.launch(cspec(backend, place, 9, ["true"], who, mounts=(Mount(str(theirs), "/data"),)))
    link = workdir(place, who) / "data"
    link.symlink_to("/root")  # was a directory at submission; swapped for a link to root's home
    with pytest.raises(BackendError, match=rf"cannot mount {link} as {who.user}: Permission denied"):
        backend.launch(cspec(backend, place, 10, ["true"], who, mounts=(Mount(str(link), "/data"),)))
    mine = workdir(place, who) / "mine"
    mine.mkdir()
    (mine / "f").write_text("ok\n")
    os.chown(mine, who.uid, who.gid)
    backend.launch(cspec(backend, place, 11, ["sh", "-c", "cat /data/f; touch /data/g"], who,
                         mounts=(Mount(str(mine), "/data", read_only=True),)))
    state = wait_done(backend, 11)
    assert state.ranks[0].exit_code != 0 and log(place, 11).splitlines()[1] == "ok"
    assert not (mine / "g").exists()


def _cgroup_leftovers(name: str) -> list[str]:
    out = []
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        out += [os.path.join(root, d) for d in dirs if name in d]
    return out


def test_nothing_is_left_after_release_and_a_second_rank_starts_fast(backend, place, users):
    who = owner(users)
    t0 = time.monotonic()
    backend.launch(cspec(backend, place, 12, ["true"], who))
    first = time.monotonic() - t0
    wait_done(backend, 12)
    times = []
    for job in (13, 14, 15):
        t0 = time.monotonic()
        backend.launch(cspec(backend, place, job, ["true"], who))
        times.append(time.monotonic() - t0)
        wait_done(backend, job)
    bare = []
    for job in (16, 17, 18):
        spec = replace(make_spec(place / "data", job, ["true"], workdir=workdir(place, who)), owner=who)
        t0 = time.monotonic()
        backend.launch(spec)
        bare.append(time.monotonic() - t0)
        wait_done(backend, job)
    print(f"\nlaunch to running, 1 rank: container first {first:.3f}s, warm {min(times):.3f}-{max(times):.3f}s; "
          f"bare {min(bare):.3f}-{max(bare):.3f}s")
    assert max(times) < 0.5
    for job in range(12, 19):  # the container's own cgroups, and runc's state, go with the attempt
        backend.release(job, 1)
    assert _cgroup_leftovers("j12.a1") == [] and _cgroup_leftovers("trainyard-") == []
    assert not spec_dir(place, 12).joinpath("run", "attempt-1").exists()


def test_an_image_missing_from_the_node_fails_the_launch_naming_both(place, users):
    data = place / "data"
    data.mkdir(mode=0o711)
    image = _image(place)
    be = LocalBackend(data, NODES, image_caches=lambda node: HandCache(image) if node == "node0" else
                      HandCache(replace(image, digest="sha256:" + "f" * 64)))
    spec = cspec(be, place, 20, ["true"], owner(users))
    spec = replace(spec, ranks=[replace(spec.ranks[0], node="node1")])
    with pytest.raises(BackendError, match=r"image 127.0.0.1:5000/test/essential@sha256:e+ is not in the cache of node node1"):
        be.launch(spec)
    assert not spec_dir(place, 20).joinpath("run", "attempt-1").exists()


def test_remap_root_is_root_inside_and_the_owner_outside(backend, place, users):
    who = owner(users)
    backend.launch(cspec(backend, place, 22, ["sh", "-c", "id -u; touch made-inside"], who, remap_root=True))
    state = wait_done(backend, 22)
    out = log(place, 22)
    assert state.ranks[0].exit_code == 0, out
    assert out.splitlines()[1] == "0"
    assert (Path(workdir(place, who)) / "made-inside").stat().st_uid == who.uid  # root inside is the owner


def test_the_entrypoint_runs_first_and_the_rank_gets_only_its_own_gpus(backend, place, users):
    who = owner(users)
    spec = cspec(backend, place, 23, ["sh", "-c", 'echo "$ENTRY"; ls /dev | grep nvidia; echo "$TRAINYARD_GPU_DEVICES"; '
                                      "cat /dev/nvidia1 2>&1 | tail -1"], who, entrypoint=True)
    backend.launch(replace(spec, ranks=[replace(spec.ranks[0], gpus=(1,))]))
    state = wait_done(backend, 23)
    lines = log(place, 23).splitlines()
    assert state.ranks[0].exit_code == 0, lines
    assert lines[1:4] == ["1", "nvidia1", "/dev/nvidia1"], lines
    assert "No such device or address" in lines[4]  # its own: past the cgroup, no driver behind it


def test_a_batch_script_runs_in_the_image_and_its_srun_starts_tasks_there(backend, place, users):
    who = owner(users)
    script = ["sh", "-c", "cat /etc/debian_version; srun -n 2 sh -c 'echo task $SLURM_PROCID $(id -un)'"]

    def batch(job: int, **opts: object) -> LaunchSpec:
        spec = cspec(backend, place, job, script, who, **opts)
        return replace(spec, batch=True, ranks=[spec.ranks[0], replace(spec.ranks[0], rank=1, gpus=(1,))])

    backend.launch(batch(30))  # an image without python3: srun says so
    state = wait_done(backend, 30, timeout=30)
    assert state.ranks[0].exit_code == 126 and "need a python3 in the job's image" in log(place, 30)
    # the same image with a python3 in it (the host's, bound read-only: Debian's, as the image's libc)
    lib = "/usr/lib/x86_64-linux-gnu/libexpat.so.1"
    python = (Mount("/usr/bin/python3.11", "/usr/bin/python3", read_only=True),
              Mount("/usr/lib/python3.11", "/usr/lib/python3.11", read_only=True), Mount(lib, lib, read_only=True))
    logs = spec_dir(place, 31) / "logs"  # the task's log, the owner's (control/jobfiles/ownership.py makes it so)
    logs.mkdir(parents=True)
    (logs / "rank-1.log").touch()
    os.chown(logs / "rank-1.log", who.uid, who.gid)
    backend.launch(batch(31, mounts=python))
    state = wait_done(backend, 31, timeout=30)
    out = log(place, 31)
    assert state.ranks[0].exit_code == 0, out
    assert f"task 0 {who.user}" in out, out
    assert f"task 1 {who.user}" in (logs / "rank-1.log").read_text()


def test_a_real_gpus_driver_libraries_are_found_by_the_names_the_linker_asks_for(tmp_path):
    """The node's libcuda and NVML (`container.driver_binds`), read-only under /usr/local/nvidia:
    each versioned file and its .so.1 name; the development link and other libraries are not."""
    from trainyard.backends.local.container import driver_binds

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libcuda.so.550.54.15").write_bytes(b"\x7fELF")
    (lib / "libcuda.so.1").symlink_to("libcuda.so.550.54.15")
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    (lib / "libnvidia-ml.so.1").write_bytes(b"\x7fELF")
    (lib / "libssl.so.3").write_bytes(b"\x7fELF")
    binds = {b.destination: (b.source, b.read_only) for b in driver_binds([str(lib)], tools=())}
    assert binds == {"/usr/local/nvidia/lib64/libcuda.so.1": (str(lib / "libcuda.so.550.54.15"), True),
                     "/usr/local/nvidia/lib64/libcuda.so.550.54.15": (str(lib / "libcuda.so.550.54.15"), True),
                     "/usr/local/nvidia/lib64/libnvidia-ml.so.1": (str(lib / "libnvidia-ml.so.1"), True)}
    assert driver_binds([str(tmp_path / "absent")], tools=()) == []
