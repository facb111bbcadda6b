"""Shared helpers for backend tests: specs, waiting, and finding processes a test left behind."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from trainyard.backends import AttemptState, LaunchSpec, LocalBackend, NodeInfo
from trainyard.contracts import RankPlacement
from trainyard.backends.rundir.procfs import read_stat

NODES = [NodeInfo("node0", 4, "emulated", 16384), NodeInfo("node1", 4, "emulated", 16384)]
MARK = "TRAINYARD_TEST_MARK"  # set in every test job's env, so leftovers can be found by environ


def make_spec(
    data_dir: Path,
    job_id: int,
    command: list[str],
    ranks: Sequence[tuple[int, str, tuple[int, ...]]] = ((0, "node0", (0,)),),
    attempt: int = 1,
    env: dict[str, str] | None = None,
    workdir: Path | None = None,
) -> LaunchSpec:
    job_dir = data_dir / "jobs" / str(job_id)
    return LaunchSpec(
        job_id=job_id,
        attempt=attempt,
        command=command,
        workdir=str(workdir or data_dir),
        job_dir=str(job_dir),
        ranks=[RankPlacement(r, n, g) for r, n, g in ranks],
        env={MARK: str(data_dir), **(env or {})},
        checkpoint_dir=str(job_dir / "ckpt"),
    )


def wait_until(pred: Callable[[], object], timeout: float = 10.0, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def attempt_state(be: LocalBackend, job_id: int, attempt: int = 1) -> AttemptState | None:
    return next((a for a in be.poll() if (a.job_id, a.attempt) == (job_id, attempt)), None)


def wait_done(be: LocalBackend, job_id: int, attempt: int = 1, timeout: float = 10.0) -> AttemptState:
    def done() -> AttemptState | None:
        a = attempt_state(be, job_id, attempt)
        return a if a is not None and a.done else None

    return wait_until(done, timeout, f"job {job_id} attempt {attempt} to end")  # type: ignore[return-value]


def live(pid: int) -> bool:
    """A process that exists and has not finished (a zombie waiting for its reaper does not count)."""
    st = read_stat(pid)
    return st is not None and not st.exited


def processes_with(**env: object) -> list[int]:
    """Live processes whose environment has every NAME=VALUE of `env` (a container's processes are
    host pids too): what a job started, found however it detached."""
    needles = [b"\0" + f"{k}={v}\0".encode() for k, v in env.items()]
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                found = b"\0" + f.read()
        except OSError:
            continue
        if all(n in found for n in needles) and live(int(name)):
            out.append(int(name))
    return out


def marked_processes(data_dir: Path) -> list[int]:
    """Live processes whose environment carries this test's mark: anything a job left behind."""
    return processes_with(**{MARK: data_dir})


@contextmanager
def local_backend(data: Path, containment: str) -> Iterator[LocalBackend]:
    """A local backend on NODES with its data dir `data` (made here) and `containment`; on the way
    out every attempt left is released and nothing of the jobs may be left running. A containment
    this machine cannot give is a skip, saying why."""
    import pytest

    from trainyard.backends import BackendError

    data.mkdir(mode=0o711)
    try:
        be = LocalBackend(data, NODES, containment=containment)
    except BackendError as e:
        pytest.skip(f"{containment} containment not here: {e}")
    try:
        yield be
        for a in be.poll():
            be.release(a.job_id, a.attempt)
        assert wait_until(lambda: marked_processes(data) == [], 10, "nothing of the jobs left")
    finally:
        be.close()
