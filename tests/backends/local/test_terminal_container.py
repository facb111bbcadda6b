"""`LocalBackend.open_terminal` into a rank that runs in an image (issue 38 on issue 37's containers):
the command sees the image as `/`, the rank's own writes, the image's environment; as the owner,
or as uid 0 of the container's user namespace (the owner outside) with `--container-remap-root`.
Real runc and a hand-made `CachedImage`, as tests/backends/local/test_container.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.accounts import Accounts, accounts, shared_dir
from tests.backends.container_image import NEEDS_RUNC, essential_rootfs
from tests.backends.helpers import NODES, marked_processes, wait_until
from tests.backends.local.test_container import HandCache, _image, cspec, owner
from tests.backends.terminal_io import Screen
from trainyard.backends import LocalBackend

pytestmark = [NEEDS_RUNC, pytest.mark.xdist_group("containers")]

RANK_CMD = ["sh", "-c", "echo written-by-the-rank > /var/tmp/ctr-mark; exec sleep 300"]
SHOW = ("id -u; id -un; cat /etc/debian_version; echo \"$IMAGE_ONLY rank=$RANK\"; "
        "i=0; while [ ! -f /var/tmp/ctr-mark ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; "
        "cat /var/tmp/ctr-mark; echo END")


@pytest.fixture(scope="module")
def users() -> Iterator[Accounts]:
    with accounts({"alice": ["teama"]}, ["teama"]) as made:
        yield made


@pytest.fixture
def place() -> Iterator[Path]:
    with shared_dir("tytermc-") as d:
        yield d


@pytest.fixture
def backend(place: Path) -> Iterator[LocalBackend]:
    data = place / "data"
    data.mkdir(mode=0o711)
    image = _image(place)
    be = LocalBackend(data, NODES, image_caches=lambda node: HandCache(image))
    yield be
    for a in be.poll():
        be.release(a.job_id, a.attempt)
    assert wait_until(lambda: marked_processes(data) == [], 10, "nothing of the jobs left")


def _show(be: LocalBackend, job: int) -> list[str]:
    screen = Screen(be.open_terminal(job, 1, 0, ["sh", "-c", SHOW]))
    try:
        status = screen.finish()
    finally:
        screen.close()
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, screen.seen
    return screen.seen.split("\n")


def test_a_command_in_a_container_rank_sees_the_image_as_root_as_the_owner(backend, place, users):
    who = owner(users)
    backend.launch(cspec(backend, place, 1, RANK_CMD, who))
    out = _show(backend, 1)
    image_version = (essential_rootfs() / "etc" / "debian_version").read_text().strip()
    assert out[:6] == [str(who.uid), who.user, image_version, "from-image rank=0", "written-by-the-rank", "END"], out
    assert not Path("/var/tmp/ctr-mark").exists()  # the rank's write is in its container, not on the host


def test_with_remap_root_the_command_is_root_inside_and_the_owner_outside(backend, place, users):
    who = owner(users)
    backend.launch(cspec(backend, place, 2, RANK_CMD, who, remap_root=True))
    screen = Screen(backend.open_terminal(2, 1, 0, ["sh", "-c", "id -u; cat /var/tmp/ctr-mark; exec sleep 30"]))
    try:
        screen.expect(r"written-by-the-rank")
        assert screen.seen.split("\n")[0] == "0", screen.seen
        uid = wait_until(lambda: _uid_of_sleep(screen.t.pid), 5, "the shell's exec")
        assert uid == who.uid  # uid 0 inside is the owner on the host, never root
    finally:
        os.kill(screen.t.pid, 9)
        screen.finish()
        screen.close()


def _uid_of_sleep(pid: int) -> int | None:
    status = Path(f"/proc/{pid}/status").read_text()
    if "sleep" not in Path(f"/proc/{pid}/comm").read_text():
        return None
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])
