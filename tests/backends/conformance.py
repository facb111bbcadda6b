"""The backend conformance suite: what every backend must do, written once.

`Conformance` holds the test bodies; a backend's module subclasses it as `TestConformance` and
gives a `harness` fixture (a `Harness`), nothing else:

    tests/backends/test_conformance_local.py   LocalBackend, real processes on emulated nodes
    tests/backends/test_conformance_slurm.py   SlurmBackend on the real 2-node test cluster
    tests/backends/test_conformance_fake.py    FakeBackend, scripted ranks on a FakeClock

A new backend (Kubernetes, Ray) adds one such module. The rank program is the fake backend's
language (`trainyard.backends.fake`): real backends run it as `tests/backends/rank_program.py`, a
standard-library script, the fake interprets the same tokens.

What is checked: a 2-node gang launches and every rank is reported; the environment each rank
sees (contracts.rank_env; on Slurm the SLURM_* values are Slurm's own, so the checks are of
consistency: SLURM_PROCID == RANK, the nodelist expands to the placement's nodes, ...); signals
(SIGUSR1 reaches every rank, SIGTERM, SIGKILL ends ranks with signal 9); exit codes; frozen
ranks (SIGSTOP) are running and stopped, not lost; a gang in an image (pulled on both nodes first)
runs there with the same contract (skipped, with the reason, where a backend runs no images: Slurm
without pyxis); every rank or none on a command that cannot run; re-attach by a new backend on the same data dir after
close(); release ends what is left and forgets the attempt; a rank's end is news to `watch(wake)`;
a terminal in a running rank (`open_terminal`) runs on its node and passes its exit status on, and
one in a rank that is not there is refused; a port in a running rank (`open_port`) carries bytes
both ways, and nothing listening, or no such rank, is refused clearly.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from tests import image_builds, image_tools
from tests.backends.helpers import MARK, marked_processes
from tests.backends.terminal_io import Screen
from tests.image_registry import Registry
from trainyard.backends.base import AttemptState, Backend, BackendError, ContainerLaunch, LaunchSpec, NothingListens
from trainyard.contracts import RankPlacement
from trainyard.backends.fake import FakeBackend, FakeCluster
from trainyard.clock import FakeClock
from trainyard.contracts import JobDir, JobInfo, expand_hostlist
from trainyard.images.types import UNSUPPORTED, ImagePullError, RegistryAccess
from trainyard.spec.container import ContainerOptions
from trainyard.spec.container_mounts import Mount

RANK_PROGRAM = Path(__file__).with_name("rank_program.py")


class Harness:
    """What a backend gives the suite. Subclasses say how a rank program is run, how time passes,
    how a rank's environment is read and what is left behind."""

    nodes: tuple[str, str]
    emulates_slurm = True  # False where SLURM_* are a real Slurm's (then only their consistency is checked)
    patience = 1.0  # factor on every timeout
    news = True  # watch(wake) is called when a rank ends (the fake backend's passes follow its clock instead)
    terminal_rank_env = True  # open_terminal's command has the rank's own environment (Slurm's srun: the step's)

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.out = data_dir / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.backend = self.make()

    # -- per backend -------------------------------------------------------------------------

    def make(self) -> Backend:
        raise NotImplementedError

    def command(self, *tokens: str) -> list[str]:
        raise NotImplementedError

    def env(self, job_id: int, attempt: int, rank: int) -> dict[str, str]:
        raise NotImplementedError

    def pause(self, seconds: float) -> None:
        """Let `seconds` pass."""
        raise NotImplementedError

    def ready(self, job_id: int, attempt: int, world: int) -> None:
        """Until every rank can take signals (its handlers are installed)."""

    def leftovers(self) -> list[str]:
        """Anything of this harness's jobs still running."""
        raise NotImplementedError

    def freeze(self, job_id: int, attempt: int, world: int) -> None:
        """Stop every rank (SIGSTOP), as a hung node or an operator would: emulation-only on the
        local and fake backends (`hang_rank`), Slurm's own `scancel --signal=STOP` there."""
        for r in range(world):
            self.backend.hang_rank(job_id, attempt, r)  # type: ignore[attr-defined]

    def thaw(self, job_id: int, attempt: int, world: int) -> None:
        for r in range(world):
            self.backend.kill_rank(job_id, attempt, r, signal.SIGCONT)  # type: ignore[attr-defined]

    # -- shared ------------------------------------------------------------------------------

    def gang(self) -> list[tuple[int, str, tuple[int, ...]]]:
        a, b = self.nodes
        return [(0, a, (0,)), (1, a, (1,)), (2, b, (0,)), (3, b, (1,))]

    def spec(self, job_id: int, command: list[str], ranks: list[tuple[int, str, tuple[int, ...]]] | None = None,
             attempt: int = 1) -> LaunchSpec:
        jd = JobDir.of(self.data_dir, job_id)
        return LaunchSpec(job_id=job_id, attempt=attempt, command=command, workdir=str(self.data_dir),
                          job_dir=str(jd.root), ranks=[RankPlacement(r, n, g) for r, n, g in (ranks or self.gang())],
                          env={MARK: str(self.data_dir), "CONFORMANCE_OUT": str(self.out)},
                          checkpoint_dir=str(jd.checkpoints), job=JobInfo(name=f"conformance-{job_id}", team="vision"))

    def container(self) -> tuple[ContainerLaunch, list[str]]:
        """An image on both nodes (pulled there) and the rank program's command inside it; skips
        where this backend runs no images (the reason said)."""
        why = image_tools.unavailable()
        if why:
            pytest.skip(why)
        (self.data_dir / "registry").mkdir(exist_ok=True)
        registry = Registry(self.data_dir / "registry")
        registry.start()
        self._registry = registry
        built = image_builds.python()
        built.push(registry.address, "conformance/python:1")
        digest = built.digest()
        ref = f"{registry.address}/conformance/python:1@{digest}"
        for node in self.nodes:
            try:
                self.backend.prepare_image(node, ref, RegistryAccess())
            except ImagePullError as e:
                if e.kind == UNSUPPORTED:
                    pytest.skip(str(e))
                raise
        here = str(RANK_PROGRAM.parent)
        opts = ContainerOptions(f"{registry.address}/conformance/python:1", mounts=(Mount(here, here, True),))
        return ContainerLaunch(opts, ref, digest), ["python3", str(RANK_PROGRAM)]

    def reopen(self) -> Backend:
        """The plane restarts: this backend is closed, a new one on the same data dir takes over."""
        self.backend.close()
        self.backend = self.make()
        return self.backend

    def wait(self, pred: Callable[[], object], timeout: float, what: str) -> object:
        deadline = time.monotonic() + timeout * self.patience
        while True:
            value = pred()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{type(self).__name__}: timed out after {timeout * self.patience:.0f}s waiting "
                                     f"for {what}")
            self.pause(0.05)

    def attempt(self, job_id: int, attempt: int = 1) -> AttemptState | None:
        return next((a for a in self.backend.poll() if (a.job_id, a.attempt) == (job_id, attempt)), None)

    def wait_done(self, job_id: int, attempt: int = 1, timeout: float = 20) -> AttemptState:
        def done() -> AttemptState | None:
            a = self.attempt(job_id, attempt)
            return a if a is not None and a.done else None

        return self.wait(done, timeout, f"job {job_id} attempt {attempt} to end")  # type: ignore[return-value]

    def wait_running(self, job_id: int, attempt: int = 1, timeout: float = 20) -> AttemptState:
        def running() -> AttemptState | None:
            a = self.attempt(job_id, attempt)
            return a if a is not None and all(r.running for r in a.ranks) else None

        return self.wait(running, timeout, f"every rank of job {job_id} attempt {attempt} running")  # type: ignore[return-value]

    def cleanup(self) -> None:
        """Release whatever a test left; nothing of it may keep running."""
        if getattr(self, "_registry", None) is not None:
            self._registry.stop()
        for a in self.backend.poll():
            self.backend.release(a.job_id, a.attempt)
        self.wait(lambda: not self.leftovers(), 30, f"nothing left running (left: {self.leftovers()})")
        self.backend.close()


class ProcessHarness(Harness):
    """A backend that runs real processes: the rank program is a real script, time is real."""

    def command(self, *tokens: str) -> list[str]:
        return [sys.executable, str(RANK_PROGRAM), *tokens]

    def env(self, job_id: int, attempt: int, rank: int) -> dict[str, str]:
        path = self.out / f"env-{job_id}-{attempt}-{rank}.json"
        self.wait(path.exists, 20, f"{path.name}")
        return json.loads(path.read_text())

    def pause(self, seconds: float) -> None:
        time.sleep(seconds)

    def ready(self, job_id: int, attempt: int, world: int) -> None:
        files = [self.out / f"ready-{job_id}-{attempt}-{r}" for r in range(world)]
        self.wait(lambda: all(f.exists() for f in files), 30, f"ranks ready ({[f.name for f in files if not f.exists()]} missing)")

    def leftovers(self) -> list[str]:
        return [f"pid {p}" for p in marked_processes(self.data_dir)]


class FakeHarness(Harness):
    """The fake backend: time is a FakeClock that `pause` advances; env is what the fake recorded."""

    nodes = ("node0", "node1")
    news = False

    def __init__(self, data_dir: Path, nodes: list) -> None:  # noqa: ANN001
        self.clock = FakeClock()
        self.node_infos = nodes
        super().__init__(data_dir)

    def make(self) -> Backend:
        return FakeBackend(self.data_dir, self.node_infos, clock=self.clock)

    def command(self, *tokens: str) -> list[str]:
        return ["yard-fake", *tokens]

    def env(self, job_id: int, attempt: int, rank: int) -> dict[str, str]:
        assert isinstance(self.backend, FakeBackend)
        return self.backend.rank_env(job_id, attempt, rank)

    def wait(self, pred: Callable[[], object], timeout: float, what: str) -> object:
        """As the real ones, in fake time: the clock moves 0.05 s between looks, no wall time passes."""
        for _ in range(int(timeout * self.patience / 0.05) + 1):
            value = pred()
            if value:
                return value
            self.pause(0.05)
        raise AssertionError(f"FakeHarness: timed out after {timeout}s (fake) waiting for {what}")

    def pause(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def leftovers(self) -> list[str]:
        cluster = FakeCluster.at(self.data_dir)
        with cluster.lock:
            return [f"job {k[0]} attempt {k[1]} rank {r.rank}" for k, a in cluster.attempts.items()
                    for r in a.ranks if r.ended is None]

    def container(self) -> tuple[ContainerLaunch, list[str]]:
        digest = "sha256:" + "c0" * 32
        ref = f"127.0.0.1:5000/conformance/python:1@{digest}"
        for node in self.nodes:
            self.backend.prepare_image(node, ref, RegistryAccess())
        return ContainerLaunch(ContainerOptions("127.0.0.1:5000/conformance/python:1"), ref, digest), ["yard-fake"]

    def cleanup(self) -> None:
        super().cleanup()
        FakeCluster.forget(self.data_dir)


class Conformance:
    """The test bodies (see the module docstring). Subclasses provide the `harness` fixture."""

    def test_a_gang_in_its_image_runs_there_with_the_same_contract(self, harness: Harness) -> None:
        c, program = harness.container()
        spec = replace(harness.spec(70, [*program, "run=0.3"]), container=c)
        harness.backend.launch(spec)
        st = harness.wait_done(70, timeout=60)
        assert [(r.rank, r.exit_code) for r in sorted(st.ranks, key=lambda r: r.rank)] == [(r, 0) for r in range(4)]
        for r in range(4):
            env = harness.env(70, 1, r)
            assert (env["RANK"], env["WORLD_SIZE"], env["TRAINYARD_JOB_ID"]) == (str(r), "4", "70")
            if "_ROOT_DEV" in env:  # a real process: its `/` is the image's, not the host's
                assert env["_ROOT_DEV"] != str(os.stat("/").st_dev), env["_ROOT_DEV"]
        harness.backend.release(70, 1)
        assert harness.leftovers() == []

    def test_a_two_node_gang_starts_every_rank_and_reports_each_exit(self, harness: Harness) -> None:
        h = harness
        h.backend.launch(h.spec(1, h.command("run=0.3")))
        st = h.wait_done(1)
        assert [(r.rank, r.running, r.exit_code, r.signal, r.lost) for r in st.ranks] == [
            (r, False, 0, None, False) for r in range(4)]
        with pytest.raises(BackendError, match="already launched"):
            h.backend.launch(h.spec(1, h.command()))

    def test_every_rank_sees_one_consistent_job_environment(self, harness: Harness) -> None:
        h = harness
        spec = h.spec(2, h.command("run=0"))
        h.backend.launch(spec)
        h.wait_done(2)
        es = [h.env(2, 1, r) for r in range(4)]
        placed = [n for _, n, _ in h.gang()]
        for r, e in enumerate(es):
            assert e["RANK"] == e["SLURM_PROCID"] == e["ROLE_RANK"] == str(r)
            assert e["WORLD_SIZE"] == e["SLURM_NTASKS"] == e["ROLE_WORLD_SIZE"] == "4"
            assert e["LOCAL_RANK"] == e["SLURM_LOCALID"] == str(r % 2) and e["LOCAL_WORLD_SIZE"] == "2"
            assert e["GROUP_RANK"] == e["SLURM_NODEID"] == str(r // 2)
            assert e["TRAINYARD_NODE"] == e["SLURMD_NODENAME"] == placed[r]
            assert expand_hostlist(e["SLURM_JOB_NODELIST"]) == list(h.nodes) and e["SLURM_NNODES"] == "2"
            assert e["SLURM_TASKS_PER_NODE"] == "2(x2)"
            assert (e["TRAINYARD_JOB_ID"], e["TRAINYARD_ATTEMPT"], e["TORCHELASTIC_RUN_ID"]) == ("2", "1", "2")
            assert e["TRAINYARD_CHECKPOINT_DIR"] == spec.checkpoint_dir
            assert e[MARK] == str(h.data_dir)  # the job's own environment is passed on
            assert len(e["CUDA_VISIBLE_DEVICES"].split(",")) == 1
            if h.emulates_slurm:
                assert e["SLURM_JOB_ID"] == "2" and e["SLURM_JOB_NAME"] == "conformance-2"
        for key in ("MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
            assert len({e[key] for e in es}) == 1, key
        assert 0 < int(es[0]["MASTER_PORT"]) < 65536
        for node in h.nodes:  # two ranks of a node, two different GPUs
            assert len({e["CUDA_VISIBLE_DEVICES"] for e in es if e["TRAINYARD_NODE"] == node}) == 2

    def test_sigusr1_reaches_every_rank_which_checkpoints_and_exits_75(self, harness: Harness) -> None:
        h = harness
        h.backend.launch(h.spec(3, h.command("usr1=0.2")))
        h.ready(3, 1, 4)
        h.backend.signal(3, 1, signal.SIGUSR1)
        st = h.wait_done(3)
        assert [(r.exit_code, r.signal) for r in st.ranks] == [(75, None)] * 4
        h.backend.signal(3, 1, signal.SIGTERM)  # every rank gone: not an error
        h.backend.signal(404, 1, signal.SIGTERM)  # no such attempt: not an error either

    def test_sigterm_ends_ranks_that_take_it_and_sigkill_ends_the_rest_with_signal_9(self, harness: Harness) -> None:
        h = harness
        two = [(0, h.nodes[0], (0,)), (1, h.nodes[1], (0,))]
        h.backend.launch(h.spec(4, h.command("rank1:term=ignore"), ranks=two))
        h.ready(4, 1, 2)
        h.backend.signal(4, 1, signal.SIGTERM)
        h.wait(lambda: not h.attempt(4).ranks[0].running, 20, "rank 0 to end on SIGTERM")
        h.pause(0.5)
        st = h.attempt(4)
        assert (st.ranks[0].exit_code, st.ranks[0].signal) == (None, signal.SIGTERM)
        assert st.ranks[1].running  # it ignores SIGTERM
        h.backend.signal(4, 1, signal.SIGKILL)
        st = h.wait_done(4)
        assert [(r.exit_code, r.signal, r.lost) for r in st.ranks] == [
            (None, signal.SIGTERM, False), (None, signal.SIGKILL, False)]

    def test_exit_codes_are_reported_rank_by_rank(self, harness: Harness) -> None:
        h = harness
        h.backend.launch(h.spec(5, h.command("run=0.2", "rank1:exit=3", "rank2:exit=75")))
        st = h.wait_done(5)
        assert [(r.exit_code, r.signal) for r in st.ranks] == [(0, None), (3, None), (75, None), (0, None)]

    def test_a_rank_that_ends_is_news_to_the_watcher_before_any_poll(self, harness: Harness) -> None:
        """`watch(wake)`: the loop runs a pass when a rank ends, not at its next tick."""
        h = harness
        woken = threading.Event()
        h.backend.watch(woken.set)
        gate = h.data_dir / "go-12"
        h.backend.launch(h.spec(12, h.command(f"until={gate}", "exit=0")))
        h.wait_running(12)
        h.pause(0.5)
        woken.clear()  # nothing has ended yet
        gate.touch()
        if h.news:
            h.wait(woken.is_set, 10, "wake() after the ranks' exits, with no poll between")
        else:
            h.pause(2)
            assert not woken.is_set()
        assert [r.exit_code for r in h.wait_done(12).ranks] == [0, 0, 0, 0]

    def test_a_command_that_cannot_run_starts_no_rank_at_all(self, harness: Harness) -> None:
        h = harness
        with pytest.raises(BackendError, match="cannot execute"):
            h.backend.launch(h.spec(6, ["no-such-command-trainyard"]))
        assert h.attempt(6) is None
        h.wait(lambda: not h.leftovers(), 30, "nothing left running")
        h.backend.launch(h.spec(6, h.command("run=0")))  # nothing stale blocks a corrected launch
        assert [r.exit_code for r in h.wait_done(6).ranks] == [0, 0, 0, 0]

    def test_a_new_backend_on_the_same_data_dir_reattaches_and_sees_the_exit(self, harness: Harness) -> None:
        h = harness
        gate = h.data_dir / "go-7"
        h.backend.launch(h.spec(7, h.command(f"until={gate}", "exit=7")))
        h.wait_running(7)
        before = h.attempt(7)
        after = h.reopen()  # the plane restarts; the ranks keep running
        st = next(a for a in after.poll() if (a.job_id, a.attempt) == (7, 1))
        assert all(r.running for r in st.ranks) and [r.pid for r in st.ranks] == [r.pid for r in before.ranks]
        gate.touch()
        st = h.wait_done(7)
        assert [(r.exit_code, r.signal, r.lost) for r in st.ranks] == [(7, None, False)] * 4

    def test_frozen_ranks_are_running_and_stopped_and_carry_on_when_continued(self, harness: Harness) -> None:
        h = harness
        gate = h.data_dir / "go-9"
        h.backend.launch(h.spec(9, h.command(f"until={gate}", "exit=4")))
        h.ready(9, 1, 4)
        h.wait_running(9)
        h.freeze(9, 1, 4)

        def all_stopped() -> AttemptState | None:
            a = h.attempt(9)
            return a if a is not None and all(r.running and r.stopped for r in a.ranks) else None

        h.wait(all_stopped, 20, "every rank running and stopped")
        gate.touch()
        h.pause(0.5)
        assert all(r.running for r in h.attempt(9).ranks)  # frozen: none of them can leave
        h.thaw(9, 1, 4)
        st = h.wait_done(9)
        assert [(r.exit_code, r.signal, r.lost, r.stopped) for r in st.ranks] == [(4, None, False, False)] * 4

    def test_release_ends_what_is_left_and_forgets_the_attempt(self, harness: Harness) -> None:
        h = harness
        h.backend.launch(h.spec(8, h.command()))  # runs until killed
        h.wait_running(8)
        h.backend.release(8, 1)
        assert h.attempt(8) is None
        h.backend.signal(8, 1, signal.SIGKILL)  # released: nothing to signal, not an error
        h.wait(lambda: not h.leftovers(), 30, "nothing left running after release")
        assert all((a.job_id, a.attempt) != (8, 1) for a in h.reopen().poll())

    def test_a_terminal_in_a_running_rank_runs_on_its_node_and_passes_its_exit_on(self, harness: Harness) -> None:
        h = harness
        h.backend.launch(h.spec(9, h.command()))  # runs until killed
        h.wait_running(9)
        placed = h.gang()[3][1]
        screen = Screen(h.backend.open_terminal(9, 1, 3, ["sh", "-c", 'echo "node=$SLURMD_NODENAME rank=$RANK"; exit 3']))
        try:
            status = screen.finish(timeout=30 * h.patience)
        finally:
            screen.close()
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 3, screen.seen
        assert f"node={placed} " in screen.seen, screen.seen
        if h.terminal_rank_env:
            assert f"node={placed} rank=3" in screen.seen, screen.seen
        with pytest.raises(BackendError, match="job 9 attempt 1 rank 4"):
            h.backend.open_terminal(9, 1, 4, [])
        h.backend.release(9, 1)
        with pytest.raises(BackendError, match="job 9 attempt 1 rank 0"):
            h.backend.open_terminal(9, 1, 0, [])
        h.wait(lambda: not h.leftovers(), 30, "nothing left running after release")

    def test_a_port_in_a_running_rank_carries_bytes_both_ways_and_refuses_clearly(self, harness: Harness) -> None:
        """`open_port`: a connection to the loopback as the rank sees it (the test's own listener,
        since the ranks share this machine's network), bytes both ways, the job side's end an end
        of file; nothing listening is NothingListens; an unknown or released rank, BackendError."""
        h = harness
        h.backend.launch(h.spec(10, h.command()))  # runs until killed
        h.wait_running(10)
        with socket.create_server(("127.0.0.1", 0)) as server:
            port = server.getsockname()[1]
            server.settimeout(30 * h.patience)
            tunnel = h.backend.open_port(10, 1, 2, port)
            try:
                conn, _ = server.accept()
                with conn:
                    os.write(tunnel.write_fd, b"ping")
                    assert conn.recv(4) == b"ping"
                    conn.sendall(b"pong")
                    got = b""
                    while len(got) < 4:
                        got += os.read(tunnel.read_fd, 4 - len(got))
                    assert got == b"pong"
                assert os.read(tunnel.read_fd, 1) == b""  # the job side closed
            finally:
                for fd in {tunnel.read_fd, tunnel.write_fd}:
                    os.close(fd)
                if tunnel.pid is not None:
                    try:
                        os.killpg(tunnel.pid, signal.SIGKILL)
                    except OSError:
                        pass
                    os.waitpid(tunnel.pid, 0)
        with pytest.raises(NothingListens, match="nothing listens on port"):
            h.backend.open_port(10, 1, 0, port)  # the listener is closed
        with pytest.raises(BackendError, match="rank 4"):
            h.backend.open_port(10, 1, 4, port)
        h.backend.release(10, 1)
        with pytest.raises(BackendError, match="rank 0"):
            h.backend.open_port(10, 1, 0, port)
        h.wait(lambda: not h.leftovers(), 30, "nothing left running after release")
