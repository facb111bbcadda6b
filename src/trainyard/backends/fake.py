"""A backend without processes: scripted ranks whose lives run on a fake clock.

For tests of the control loop's logic (requeue on 75, the notice → TERM → KILL sequence, retries,
hung and lost ranks, lost work), where what matters is what the loop does with the facts, not
how real processes produce them: a grace period of 10 minutes passes with `clock.advance(600)`.
It implements the whole `Backend` protocol and passes the same conformance suite as the real
backends (tests/backends/conformance.py); the real backends keep their own tests with real
processes. Registered as "fake" (`backends.registry`).

Programs. A rank runs a `Program`, given as the command's argv in a small language, so a job row
can carry it like any command::

    ["yard-fake", "run=5", "exit=3"]                exit with code 3 after 5 s
    ["yard-fake", "usr1=2", "step=1", "ckpt=10"]    a step a second (rank 0 writes metrics.jsonl),
                                                    a checkpoint every 10 steps; SIGUSR1: checkpoint
                                                    and exit 75 two seconds later
    ["yard-fake", "term=ignore"]                    runs until SIGKILL (ends with signal 9)
    ["yard-fake", "run=3", "oom"]                   after 3 s: an out-of-memory error in its log, exit 1
    ["yard-fake", "run=3", "oom=kill"]              after 3 s: killed by the kernel's OOM killer (signal 9,
                                                    `oom_killed`, nothing in the log), as over its --mem
    ["yard-fake", "run=60", "rank1:run=2", "rank1:exit=1"]   rank 1 fails after 2 s, the others run on

    run=T       seconds until it exits by itself (default: never)
    exit=N      its exit code then (default 0; 1 with `oom`)
    usr1=D      on SIGUSR1, checkpoint and exit 75 after D seconds (default: SIGUSR1 kills it,
                signal 10, as it does a process that installed no handler); usr1=ignore: carries on
    term=ignore | term=D   ignore SIGTERM, or treat it like the notice (D s, then 75); default: dies (15)
    until=PATH  exit (with `exit`) once PATH exists: a gate a test opens by touching a file
    step=S      one training step every S seconds; rank 0 appends {step, time, attempt,
                step_time_s, loss} to <job dir>/metrics/metrics.jsonl
    ckpt=K      rank 0 commits <checkpoint dir>/step-<N>/COMMITTED every K steps
    log=TEXT    a line written to the rank's log at start (repeatable)
    oom         "torch.OutOfMemoryError: CUDA out of memory" in the log when it exits
    oom=kill    instead of exiting, the kernel's OOM killer kills it (RankState.oom_killed)
    rankN:KEY=VALUE   the same, for rank N only

A command that is not `yard-fake` is looked up in `programs` (argv[0] → Program); otherwise, if
argv[0] is an executable (on PATH or a path), the rank runs `default_program` (exit 0 at once);
otherwise the launch fails for every rank, as a real one does ("cannot execute ...").

On disk it does what a real rank does and the control loop reads: the rank log (a start line
like the local backend's, the `log=` lines, the OOM line), checkpoints `step-N/COMMITTED` whose
mtime is the fake time of the commit (`contracts.newest_checkpoint` compares it with the
attempt's start), metrics records with fake times, and a new attempt resumes from the newest
committed step ("resumed from step N" in its log), as the runtime does. Times are the clock's.

Facts. A rank's life is computed from the clock: on a `FakeClock` as it moves (the cluster
subscribes to it, so after `clock.advance(13)` the steps, checkpoints and exits of those 13 s are
on disk and in `poll()`), on any other clock whenever the backend is asked. Nothing runs in the
background. A frozen rank (`hang_rank`, `hang_node`) makes no
progress and is `stopped`; signals other than SIGKILL wait until it continues, as with SIGSTOP.
A slowed node's ranks (`slow_node`, until `revive_node`) step `factor` times slower.
`kill_node` makes the node's unfinished ranks `lost`. Every signal sent (`signal`, `kill_rank`) is
recorded in `signals` with the fake time, so a test can assert the stop sequence.

Usage. How busy an attempt is (`cpu_seconds`, `gpu_percent`: the idle allocations' facts) is
scripted with `set_usage(job, attempt, cpu_percent=, gpu_percent=)`: CPU seconds count on the
clock at that rate; an attempt never scripted is idle (0 s) with no NVML (None). Per-GPU
telemetry (`gpu_readings`) is scripted with `set_gpu_readings([GpuReading, ...])`: returned as
they are until set again.

Reattach. The state lives in a `FakeCluster`, one per data dir in this process (or passed in):
a new `FakeBackend` on the same data dir sees the attempts an earlier one left, as a restarted
plane's LocalBackend does from disk. `close()` forgets them in that backend only.

Example::

    clock = FakeClock()
    be = FakeBackend(tmp_path, [NodeInfo("node0", 4, "emulated", 16384)], clock=clock)
    be.launch(LaunchSpec(1, 1, ["yard-fake", "usr1=5", "step=1", "ckpt=4"], str(tmp_path),
                         str(tmp_path / "jobs/1"), [RankPlacement(0, "node0", (0,))], {},
                         str(tmp_path / "jobs/1/checkpoints")))
    clock.advance(10)                      # 10 steps, checkpoints at 4 and 8
    be.signal(1, 1, signal.SIGUSR1)
    clock.advance(5)
    be.poll()[0].ranks[0].exit_code        # 75, with step-15 committed at the fake time of exit
    be.signals                             # [SentSignal(at=..., job_id=1, attempt=1, sig=10, rank=None)]
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal as _signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from trainyard.backends import registry
from trainyard.backends.base import AttemptState, BackendError, LaunchSpec, NodeInfo, RankState, Terminal, Tunnel
from trainyard.backends.base import GpuReading, NothingListens
from trainyard.backends.contain import cpu_quota
from trainyard.backends.launch_check import check_launch
from trainyard.backends.rundir import terminal
from trainyard.images.types import NOT_FOUND, CachedImage, EntryInfo, ImageConfig, ImagePullError, RegistryAccess
from trainyard.staging.types import DISK_FULL, DatasetEntry, DatasetRef, DataStagingError, SourceAccess, StagedDataset
from trainyard.contracts import (
    CHECKPOINT_MARKER,
    REQUEUE_EXIT,
    EnvPart,
    Gang,
    JobDir,
    newest_checkpoint,
    rank_env,
)

FAKE_COMMAND = "yard-fake"
OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (fake)"
_KILL, _TERM, _USR1 = int(_signal.SIGKILL), int(_signal.SIGTERM), int(_signal.SIGUSR1)
_STOP, _CONT = int(_signal.SIGSTOP), int(_signal.SIGCONT)


@dataclass(frozen=True)
class Program:
    """What one scripted rank does (see the module docstring for the argv form)."""

    run_s: float | None = None  # exits by itself after this long (None: never)
    exit_code: int = 0
    on_usr1_s: float | None = None  # checkpoint and exit 75 this long after SIGUSR1 (None: SIGUSR1 kills)
    usr1_ignored: bool = False  # `usr1=ignore`: a handler that notes the notice and carries on
    on_term: str | float = "die"  # "die", "ignore", or seconds to checkpoint and exit 75
    until: str | None = None  # exit once this path exists
    step_s: float | None = None
    checkpoint_every: int | None = None
    log: tuple[str, ...] = ()
    oom: bool = False
    oom_kill: bool = False


def parse_program(argv: list[str]) -> tuple[Program, dict[int, Program]]:
    """`yard-fake` argv → (every rank's program, per-rank overrides).

    Raises:
        BackendError: a token it does not know, or a value of the wrong kind (named).
    """
    base: dict[str, object] = {}
    per: dict[int, dict[str, object]] = {}
    for tok in argv[1:]:
        target = base
        key, _, value = tok.partition("=")
        if key.startswith("rank") and ":" in key:
            head, key = key.split(":", 1)
            if not head[4:].isdigit():
                raise BackendError(f"fake program: {tok!r}: expected rankN:KEY=VALUE")
            target = per.setdefault(int(head[4:]), {})
        try:
            if key == "run":
                target["run_s"] = float(value)
            elif key == "exit":
                target["exit_code"] = int(value)
            elif key == "usr1" and value == "ignore":
                target["usr1_ignored"] = True
            elif key == "usr1":
                target["on_usr1_s"] = float(value)
            elif key == "term":
                target["on_term"] = value if value in ("die", "ignore") else float(value)
            elif key == "until":
                target["until"] = value
            elif key == "step":
                target["step_s"] = float(value)
            elif key == "ckpt":
                target["checkpoint_every"] = int(value)
            elif key == "log":
                target["log"] = (*target.get("log", ()), value)  # type: ignore[misc]
            elif key == "oom" and value == "kill":
                target["oom_kill"] = True
            elif key == "oom" and not value:
                target["oom"] = True
                target.setdefault("exit_code", 1)
            else:
                raise BackendError(f"fake program: unknown token {tok!r} (see trainyard.backends.fake)")
        except ValueError:
            raise BackendError(f"fake program: {tok!r}: {value!r} is not a number") from None
    program = Program(**base)  # type: ignore[arg-type]
    return program, {r: replace(program, **o) for r, o in per.items()}  # type: ignore[arg-type]


@dataclass(frozen=True)
class SentSignal:
    """One signal the backend was asked to send, at fake time `at` (`rank` None: every rank)."""

    at: float
    job_id: int
    attempt: int
    sig: int
    rank: int | None = None


@dataclass
class _Rank:
    rank: int
    node: str
    program: Program
    env: dict[str, str]
    pid: int
    seen_at: float  # fake time up to which its life is computed
    active_s: float = 0.0  # seconds it has run unfrozen
    step: int = 0
    stopped: bool = False
    pending: list[int] = field(default_factory=list)  # signals that wait for SIGCONT
    exit_at: float | None = None  # in active seconds
    exit_code: int = 0
    checkpoint_at_exit: bool = False
    ended: tuple[int | None, int | None, bool] | None = None  # (exit code, signal, lost)
    oom_killed: bool = False

    def __post_init__(self) -> None:
        self.exit_at, self.exit_code = self.program.run_s, self.program.exit_code


@dataclass
class _Attempt:
    spec: LaunchSpec
    ranks: list[_Rank]

    @property
    def jd(self) -> JobDir:
        return JobDir(self.spec.job_dir)


@dataclass
class _Usage:
    """An attempt's scripted use (`FakeBackend.set_usage`): CPU seconds counted at `cpu_percent`."""

    at: float  # fake time up to which `cpu_s` is counted
    cpu_s: float = 0.0
    cpu_percent: float = 0.0
    gpu_percent: float | None = None


# what every fake node's jobs see unless a test says otherwise (FakeCluster.environments)
ENVIRONMENT = {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": "none", "nccl": "none", "driver": "none"}


@dataclass
class _FakeDataset:
    """A dataset in a fake node's cache: what was staged, its last use, the attempts pinning it."""

    ref: DatasetRef
    last_used: float
    pins: set[tuple[int, int]] = field(default_factory=set)


class FakeCluster:
    """The state behind one or more FakeBackends: nodes' states, attempts, the clock, the signals."""

    _by_dir: dict[str, FakeCluster] = {}
    _by_dir_lock = threading.Lock()

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.node_states: dict[str, str] = {}
        self.slow: dict[str, float] = {}  # node -> its slowdown factor (`FakeBackend.slow_node`)
        self.attempts: dict[tuple[int, int], _Attempt] = {}
        self.launched: dict[tuple[int, int], _Attempt] = {}  # every attempt ever launched, released too
        self.signals: list[SentSignal] = []
        # images: node -> digest -> (the entry, last use); `pull_errors`: ref or digest -> the
        # error a pull of it raises (a test scripts a registry that fails)
        self.images: dict[str, dict[str, tuple[CachedImage, float]]] = {}
        self.pull_errors: dict[str, ImagePullError] = {}
        self.pulls: list[tuple[str, str]] = []  # (node, ref) of every pull that fetched something
        # set: pulls wait until it is (a pull that takes a while, in fake time or not)
        self.pull_gate: threading.Event | None = None
        # datasets: node -> checksum -> its entry; `stage_errors`: a dataset's label (name:version),
        # checksum or node -> the error a staging of it (there) raises; `stagings`: (node, label) of
        # every staging that copied something; `stage_gate`: stagings wait until it is set
        self.datasets: dict[str, dict[str, _FakeDataset]] = {}
        self.stage_errors: dict[str, DataStagingError] = {}
        self.stagings: list[tuple[str, str]] = []
        self.stage_gate: threading.Event | None = None
        # node -> its environment fingerprint (backends/environment.py); absent: ENVIRONMENT
        self.environments: dict[str, dict[str, str]] = {}
        self._next_pid = 100_000
        # (job, attempt) -> what `cpu_seconds` and `gpu_percent` report (FakeBackend.set_usage)
        self.usage: dict[tuple[int, int], _Usage] = {}
        self.gpu_readings: list[GpuReading] = []  # what `gpu_readings` reports (set_gpu_readings)
        subscribe = getattr(clock, "subscribe", None)
        if subscribe is not None:  # a FakeClock: things happen as time passes, not only when asked
            subscribe(self.tick)

    @classmethod
    def at(cls, data_dir: str | Path, clock: Callable[[], float] | None = None) -> FakeCluster:
        """The cluster of `data_dir` in this process, made on first use (with `clock`, default
        time.time).

        Raises:
            ValueError: it exists with another clock than the `clock` given.
        """
        key = str(Path(data_dir).resolve())
        with cls._by_dir_lock:
            c = cls._by_dir.get(key)
            if c is None:
                c = cls._by_dir[key] = cls(clock or time.time)
            elif clock is not None and c.clock is not clock:
                raise ValueError(f"the fake cluster of {key} runs on another clock ({c.clock!r}, not {clock!r})")
            return c

    @classmethod
    def forget(cls, data_dir: str | Path) -> None:
        """Drop the cluster of `data_dir` (a test's cleanup); its clock no longer moves its ranks."""
        with cls._by_dir_lock:
            c = cls._by_dir.pop(str(Path(data_dir).resolve()), None)
        unsubscribe = getattr(c.clock, "unsubscribe", None) if c is not None else None
        if c is not None and unsubscribe is not None:
            unsubscribe(c.tick)

    def usage_now(self, job_id: int, attempt: int, now: float) -> _Usage:
        """The attempt's scripted use, its CPU seconds counted up to `now` (made on first use)."""
        u = self.usage.setdefault((job_id, attempt), _Usage(at=now))
        u.cpu_s += u.cpu_percent / 100 * max(0.0, now - u.at)
        u.at = max(u.at, now)
        return u

    def pid(self) -> int:
        self._next_pid += 1
        return self._next_pid

    def tick(self, now: float) -> None:
        """The clock moved: every rank lives up to `now` (its steps, checkpoints, exit are written)."""
        with self.lock:
            for att in list(self.attempts.values()):
                for rk in att.ranks:
                    self.advance(att, rk, now)

    # -- the ranks' lives ----------------------------------------------------------------------

    def advance(self, att: _Attempt, rk: _Rank, now: float) -> None:
        """Run `rk` from where it was computed up to fake time `now`: steps, checkpoints, its exit."""
        if rk.ended is not None or rk.stopped or now <= rk.seen_at:
            rk.seen_at = max(rk.seen_at, now)
            return
        p = rk.program
        if p.until is not None and os.path.exists(p.until) and (rk.exit_at is None or rk.exit_at > rk.active_s):
            rk.exit_at = rk.active_s  # the gate is open: it leaves now (noticed at this poll)
        slow = self.slow.get(rk.node, 1.0)  # `slow_node`: an active second takes `slow` seconds
        target = rk.active_s + (now - rk.seen_at) / slow
        while True:
            next_step = (rk.active_s // p.step_s + 1) * p.step_s if p.step_s else math.inf
            if rk.exit_at is not None and rk.exit_at <= target and rk.exit_at < next_step:  # a step due then comes first
                self._to(rk, rk.exit_at, slow)
                self._exit(att, rk)
                return
            if next_step > target:
                break
            self._to(rk, next_step, slow)
            rk.step += 1
            self._stepped(att, rk, p)
        self._to(rk, target, slow)
        rk.seen_at = max(rk.seen_at, now)  # float rounding of the division must not hold it back

    @staticmethod
    def _to(rk: _Rank, active_s: float, slow: float = 1.0) -> None:
        rk.seen_at += max(0.0, active_s - rk.active_s) * slow
        rk.active_s = max(rk.active_s, active_s)

    def _stepped(self, att: _Attempt, rk: _Rank, p: Program) -> None:
        if rk.rank != 0:
            return
        jd = att.jd
        jd.metrics_dir.mkdir(parents=True, exist_ok=True)
        rec = {"step": rk.step, "time": rk.seen_at, "attempt": att.spec.attempt,
               "step_time_s": p.step_s * self.slow.get(rk.node, 1.0) if p.step_s is not None else None,
               "loss": round(10.0 / (1 + rk.step), 6)}
        _append(jd.metrics_file, [json.dumps(rec)])
        if p.checkpoint_every and rk.step % p.checkpoint_every == 0:
            self._commit(att, rk)

    def _commit(self, att: _Attempt, rk: _Rank) -> None:
        """Rank 0 commits step-<N> with the marker's mtime at the fake time of the commit."""
        if rk.rank != 0:
            return
        d = Path(att.spec.checkpoint_dir) / f"step-{rk.step}"
        d.mkdir(parents=True, exist_ok=True)
        marker = d / CHECKPOINT_MARKER
        marker.write_text(json.dumps({"step": rk.step, "attempt": att.spec.attempt}))
        os.utime(marker, (rk.seen_at, rk.seen_at))
        os.utime(d, (rk.seen_at, rk.seen_at))
        _append(att.jd.rank_log(rk.rank), [f"checkpoint committed: step {rk.step}"])

    def _exit(self, att: _Attempt, rk: _Rank) -> None:
        if rk.checkpoint_at_exit:
            self._commit(att, rk)
        if rk.program.oom:
            _append(att.jd.rank_log(rk.rank), [OOM_LINE])
        rk.oom_killed = rk.program.oom_kill
        rk.ended = (None, _KILL, False) if rk.oom_killed else (rk.exit_code, None, False)

    def deliver(self, att: _Attempt, rk: _Rank, sig: int, now: float) -> None:
        self.advance(att, rk, now)
        if rk.ended is not None:
            return
        if sig == _KILL:
            rk.ended = (None, _KILL, False)
        elif sig == _STOP:
            rk.stopped = True
        elif sig == _CONT:
            rk.stopped = False
            pending, rk.pending = rk.pending, []
            for s in pending:
                self.deliver(att, rk, s, now)
        elif rk.stopped:
            rk.pending.append(sig)
        elif sig == _USR1 and rk.program.usr1_ignored:
            pass
        elif sig == _USR1 and rk.program.on_usr1_s is not None:
            self._notice(rk, rk.program.on_usr1_s)
        elif sig == _TERM and rk.program.on_term == "ignore":
            pass
        elif sig == _TERM and not isinstance(rk.program.on_term, str):
            self._notice(rk, float(rk.program.on_term))
        else:
            rk.ended = (None, sig, False)  # the default action of an unhandled signal

    @staticmethod
    def _notice(rk: _Rank, after_s: float) -> None:
        """Checkpoint and exit 75 `after_s` from now; an exit already due earlier stands (a rank
        that finishes before it gets to its checkpoint ends as it would have)."""
        due = rk.active_s + after_s
        if rk.checkpoint_at_exit:
            rk.exit_at = min(rk.exit_at if rk.exit_at is not None else due, due)
        elif rk.exit_at is None or due < rk.exit_at:
            rk.exit_at, rk.exit_code, rk.checkpoint_at_exit = due, REQUEUE_EXIT, True



class FakeBackend:
    """The `Backend` protocol with scripted ranks on a fake clock; see the module docstring.

    Args:
        data_dir: the control plane's data dir (job dirs are written under it as usual).
        nodes: the (configured) nodes.
        clock: the time source (a `trainyard.clock.FakeClock`; default: the cluster's, else time.time).
        cluster: the state to share (default: `FakeCluster.at(data_dir)`).
        programs: argv[0] → Program, for commands that are not `yard-fake ...`.
        default_program: what an executable command that is neither does (default: exit 0 at once).
    """

    name = "fake"
    launch_waits = False  # inline: a test pass stays deterministic (a test may set it)
    containment = "fake"  # no processes: nothing to contain (see backends.contain for the local backend)

    def __init__(self, data_dir: str | Path, nodes: list[NodeInfo], *, clock: Callable[[], float] | None = None,
                 cluster: FakeCluster | None = None, programs: Mapping[str, Program] | None = None,
                 default_program: Program = Program(run_s=0.0)) -> None:
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate node names: {names}")
        self._data_dir = Path(data_dir)
        self._nodes = {n.name: n for n in nodes}
        self._node_list = list(nodes)
        self.cluster = cluster if cluster is not None else FakeCluster.at(data_dir, clock)
        self.clock = self.cluster.clock
        self.programs = dict(programs or {})
        self.default_program = default_program
        with self.cluster.lock:
            self._known: set[tuple[int, int]] = set(self.cluster.attempts)  # re-attach

    @property
    def signals(self) -> list[SentSignal]:
        """Every signal sent so far (by any backend on this cluster), oldest first."""
        with self.cluster.lock:
            return list(self.cluster.signals)

    # -- interface ------------------------------------------------------------------------------

    def inventory(self) -> list[NodeInfo]:
        with self.cluster.lock:
            out = []
            for n in self._node_list:
                state = self._state(n.name)
                out.append(n if state == "up" else replace(n, healthy=False, state=state))
            return out

    def launch(self, spec: LaunchSpec) -> None:
        """Start every rank of `spec` (at the clock's now), or none.

        Raises:
            BackendError: as LocalBackend: a bad placement, a node not up, a missing workdir, an
                attempt already launched, a command that cannot execute; or a bad fake program.
        """
        with self.cluster.lock:
            now = self.clock()
            where = f"job {spec.job_id} attempt {spec.attempt}"
            self._validate(spec, where)
            if spec.container is not None:  # the loop pulls first; this is a guard, as LocalBackend's
                for node in sorted({r.node for r in spec.ranks}):
                    if spec.container.digest not in self.cluster.images.get(node, {}):
                        raise BackendError(f"{where}: image {spec.container.ref} is not in the cache of node {node}")
            program, per_rank = self._program(spec, where)
            jd = JobDir(spec.job_dir)
            try:
                jd.logs.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise BackendError(f"{where}: cannot create {e.filename}: {e.strerror}") from e
            ranks = sorted(spec.ranks, key=lambda r: r.rank)
            gang = Gang(tuple(ranks))
            port = 20000 + (spec.job_id * 7 + spec.attempt) % 40000  # no socket: any stable number
            resumed = newest_checkpoint(spec.checkpoint_dir)
            stamp = datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            out = []
            for r in ranks:
                env = {**spec.env, **rank_env(gang, r.rank, job_id=spec.job_id, attempt=spec.attempt,
                                              checkpoint_dir=spec.checkpoint_dir, master_addr="127.0.0.1",
                                              master_port=port, workdir=spec.workdir, info=spec.job,
                                              parts=EnvPart.ALL), **spec.dataset_paths.get(r.node, {})}
                rk = _Rank(r.rank, r.node, per_rank.get(r.rank, program), env, self.cluster.pid(), seen_at=now)
                rk.step = resumed[0] if resumed else 0
                lines = [f"=== trainyard: attempt {spec.attempt} started {stamp} on {r.node} gpus "
                         f"{','.join(map(str, r.gpus)) or 'none'} ==="]
                if resumed:
                    lines.append(f"resumed from step {resumed[0]}")
                _append(jd.rank_log(r.rank), [*lines, *rk.program.log])
                out.append(rk)
            self.cluster.attempts[(spec.job_id, spec.attempt)] = self.cluster.launched[(spec.job_id, spec.attempt)] = \
                _Attempt(spec, out)
            self._known.add((spec.job_id, spec.attempt))

    def signal(self, job_id: int, attempt: int, sig: int, *, batch_shell: bool = False) -> None:
        """Deliver `sig` to every rank (recorded in `signals`); ranks or attempts gone are skipped."""
        with self.cluster.lock:
            att = self._attempt(job_id, attempt)
            if att is None:
                return
            now = self.clock()
            self.cluster.signals.append(SentSignal(now, job_id, attempt, int(sig)))
            for rk in att.ranks:
                self.cluster.deliver(att, rk, int(sig), now)

    def poll(self) -> list[AttemptState]:
        with self.cluster.lock:
            now = self.clock()
            out = []
            for key in sorted(self._known):
                att = self.cluster.attempts.get(key)
                if att is None:
                    continue
                for rk in att.ranks:
                    self.cluster.advance(att, rk, now)
                out.append(AttemptState(key[0], key[1], [_state(rk) for rk in att.ranks]))
            return out

    def check_node(self, name: str) -> tuple[bool, str]:
        with self.cluster.lock:
            if name not in self._nodes:
                return False, f"unknown node {name!r}"
            state = self._state(name)
            return (True, f"{name} is up") if state == "up" else (False, f"{name} is {state}")

    def release(self, job_id: int, attempt: int) -> None:
        """End whatever is left of the attempt (SIGKILL) and forget it everywhere (logs stay)."""
        with self.cluster.lock:
            self._known.discard((job_id, attempt))
            for entries in self.cluster.datasets.values():
                for entry in entries.values():
                    entry.pins.discard((job_id, attempt))
            att = self.cluster.attempts.pop((job_id, attempt), None)
            if att is not None:
                now = self.clock()
                for rk in att.ranks:
                    self.cluster.advance(att, rk, now)
                    if rk.ended is None:
                        rk.ended = (None, _KILL, False)

    def watch(self, wake: Callable[[], None]) -> None:
        """No news: a test's passes are driven by its fake clock."""

    # -- images: a cache per node, nothing pulled (scripted failures: `cluster.pull_errors`) -------

    def open_terminal(self, job_id: int, attempt: int, rank: int, argv: list[str], *, rows: int = 24,
                      cols: int = 80, term: str = terminal.DEFAULT_TERM, session: bool = False) -> Terminal:
        """Emulation: a real pty running `argv` (empty: `$SHELL` of the rank's environment, else
        /bin/sh) on this machine as the plane's own user, in the rank's workdir (where it exists),
        with the rank's fake environment (its `LaunchSpec.env` under `contracts.rank_env`, PATH
        defaulted, TERM) and nothing else: no cell, no namespace, no owner (the fake ranks are no
        processes). Errors as a real backend's.

        Raises:
            BackendError: no such attempt or rank here, its node is down, or the rank has ended.
        """
        where = f"job {job_id} attempt {attempt} rank {rank}"
        with self.cluster.lock:
            att, rk = self._running_rank(job_id, attempt, rank)
            env = {"PATH": terminal.DEFAULT_PATH, **rk.env, "TERM": term}
            workdir = att.spec.workdir
        command = list(argv) or [env["SHELL"] if os.path.isabs(env.get("SHELL", "")) else "/bin/sh"]
        try:
            return terminal.spawn(terminal.with_ctty(command, cwd=workdir), env, rows, cols)
        except OSError as e:
            raise BackendError(f"{where}: cannot open a terminal: {e}") from e

    def _running_rank(self, job_id: int, attempt: int, rank: int) -> tuple[_Attempt, _Rank]:
        """The attempt and rank (advanced to now) of a rank that runs on a node that is up: what a
        terminal or a forwarded port may enter.

        Raises:
            BackendError: no such attempt or rank here, its node is down, or the rank has ended.
        """
        where = f"job {job_id} attempt {attempt} rank {rank}"
        with self.cluster.lock:
            att = self._attempt(job_id, attempt)
            if att is None or not 0 <= rank < len(att.ranks):
                raise BackendError(f"{where}: no such running rank on the {self.name} backend")
            rk = att.ranks[rank]
            if (state := self._state(rk.node)) != "up":
                raise BackendError(f"{where}: its node {rk.node} is {state}")
            self.cluster.advance(att, rk, self.clock())
            if rk.ended is not None:
                raise BackendError(f"{where}: the rank is not running (it has ended)")
            return att, rk

    def open_port(self, job_id: int, attempt: int, rank: int, port: int) -> Tunnel:
        """Emulation: a plain connection from this process to `port` on this machine's loopback
        (127.0.0.1, then ::1), for a running rank: the fake ranks are no processes, so there is no
        rank's network or owner to connect as. Errors as a real backend's.

        Raises:
            BackendError: no such attempt or rank here, its node is down, the rank has ended, or
                nothing listens on `port`.
        """
        self._running_rank(job_id, attempt, rank)
        for host in ("127.0.0.1", "::1"):
            try:
                sock = socket.create_connection((host, port), timeout=10)
            except OSError:
                continue
            sock.setblocking(True)
            fd = sock.detach()
            return Tunnel(fd, fd)
        raise NothingListens(f"nothing listens on port {port} in job {job_id} rank {rank}")

    def cpu_seconds(self, job_id: int, attempt: int) -> float | None:
        """Scripted (`set_usage`): the CPU seconds the attempt has used at its scripted rate, on the
        clock, while it runs; 0 for one never scripted, None for one not known here."""
        with self.cluster.lock:
            if self._attempt(job_id, attempt) is None:
                return None
            return self.cluster.usage_now(job_id, attempt, self.clock()).cpu_s

    def gpu_percent(self, job_id: int, attempt: int) -> float | None:
        """Scripted (`set_usage`): None (no NVML) unless a test gave the attempt a GPU rate."""
        with self.cluster.lock:
            if self._attempt(job_id, attempt) is None:
                return None
            return self.cluster.usage_now(job_id, attempt, self.clock()).gpu_percent

    def set_usage(self, job_id: int, attempt: int, *, cpu_percent: float | None = None,
                  gpu_percent: float | None | str = "keep") -> None:
        """Emulation: from now on the attempt uses `cpu_percent` of one CPU (None: unchanged) and
        its busiest GPU reads `gpu_percent` (None: NVML cannot read it; "keep": unchanged)."""
        with self.cluster.lock:
            u = self.cluster.usage_now(job_id, attempt, self.clock())
            if cpu_percent is not None:
                u.cpu_percent = cpu_percent
            if gpu_percent != "keep":
                u.gpu_percent = None if gpu_percent is None else float(gpu_percent)

    def gpu_readings(self) -> list[GpuReading]:
        """Scripted (`set_gpu_readings`): [] until a test gives some."""
        with self.cluster.lock:
            return list(self.cluster.gpu_readings)

    def set_gpu_readings(self, readings: list[GpuReading]) -> None:
        """Emulation: what every later `gpu_readings` returns, until set again."""
        with self.cluster.lock:
            self.cluster.gpu_readings = list(readings)

    def node_environment(self, node: str) -> dict[str, str]:
        """The node's scripted fingerprint (`FakeCluster.environments`), else every node's `ENVIRONMENT`."""
        with self.cluster.lock:
            return dict(self.cluster.environments.get(node, ENVIRONMENT))

    def prepare_image(self, node: str, ref: str, access: RegistryAccess) -> CachedImage:
        """`ref` (pinned, `…@sha256:…`) in `node`'s cache: an entry with no layers, at once (or
        once `pull_gate` is set). Raises the `ImagePullError` scripted for the ref or its digest,
        NOT_FOUND for a ref without a digest; BackendError for an unknown node."""
        gate = self.cluster.pull_gate
        if gate is not None:
            gate.wait(60)
        with self.cluster.lock:
            if node not in self._nodes:
                raise BackendError(f"unknown node {node!r}")
            name, _, digest = ref.partition("@")
            err = self.cluster.pull_errors.get(ref) or self.cluster.pull_errors.get(digest)
            if err is not None:
                raise err
            if not digest.startswith("sha256:"):
                raise ImagePullError(NOT_FOUND, ref, "not pinned to a digest")
            cache = self.cluster.images.setdefault(node, {})
            if digest not in cache:
                self.cluster.pulls.append((node, ref))
                image = CachedImage(digest, name, (), ImageConfig(), os.devnull, 0)
            else:
                image = cache[digest][0]
            cache[digest] = (image, self.clock())
            return image

    def image_entries(self, node: str) -> list[EntryInfo]:
        with self.cluster.lock:
            return [EntryInfo(node, img.name, d, img.size_bytes, used, False)
                    for d, (img, used) in sorted(self.cluster.images.get(node, {}).items())]

    def remove_image(self, node: str, digest: str) -> bool:
        with self.cluster.lock:
            return self.cluster.images.get(node, {}).pop(digest, None) is not None

    # -- datasets: a cache per node in memory, nothing copied (scripted failures: `cluster.stage_errors`)

    def stage_dataset(self, node: str, ref: DatasetRef, access: SourceAccess,
                      job: tuple[int, int] | None = None) -> StagedDataset:
        """`ref` in `node`'s cache: an entry at `/fake-datasets/<node>/<hex>`, at once (or once
        `stage_gate` is set); least recently used unpinned entries evicted over
        `access.cache_max_bytes`. Raises the `DataStagingError` scripted for the dataset's label,
        checksum or node; DISK_FULL when it cannot fit; BackendError for an unknown node."""
        gate = self.cluster.stage_gate
        if gate is not None:
            gate.wait(60)
        with self.cluster.lock:
            if node not in self._nodes:
                raise BackendError(f"unknown node {node!r}")
            errs = self.cluster.stage_errors
            err = errs.get(ref.label) or errs.get(ref.checksum) or errs.get(node)
            if err is not None:
                raise err
            cache = self.cluster.datasets.setdefault(node, {})
            copied = ref.checksum not in cache
            if copied:
                cap = access.cache_max_bytes
                for other in sorted(cache.values(), key=lambda e: e.last_used):
                    if cap is None or sum(e.ref.bytes for e in cache.values()) + ref.bytes <= cap:
                        break
                    if not other.pins:
                        del cache[other.ref.checksum]
                if cap is not None and sum(e.ref.bytes for e in cache.values()) + ref.bytes > cap:
                    raise DataStagingError(DISK_FULL, ref.label, f"node {node}'s dataset cache is full")
                cache[ref.checksum] = _FakeDataset(ref, self.clock())
                self.cluster.stagings.append((node, ref.label))
            entry = cache[ref.checksum]
            entry.last_used = self.clock()
            if job is not None:
                entry.pins.add(job)
            return StagedDataset(node, ref.checksum, f"/fake-datasets/{node}/{ref.checksum[7:]}", ref.bytes, copied,
                                 0.0)

    def dataset_entries(self, node: str) -> list[DatasetEntry]:
        with self.cluster.lock:
            return [DatasetEntry(node, e.ref.name, e.ref.version, c, e.ref.bytes, e.last_used, bool(e.pins))
                    for c, e in sorted(self.cluster.datasets.get(node, {}).items())]

    def remove_dataset(self, node: str, checksum: str) -> bool:
        with self.cluster.lock:
            entry = self.cluster.datasets.get(node, {}).get(checksum)
            if entry is None or entry.pins:
                return False
            del self.cluster.datasets[node][checksum]
            return True

    def close(self) -> None:
        """Forget every attempt here; the cluster keeps them for the next backend."""
        with self.cluster.lock:
            self._known.clear()

    # -- inspection (tests) ----------------------------------------------------------------------

    def rank_env(self, job_id: int, attempt: int, rank: int) -> dict[str, str]:
        """The environment rank `rank` was started with (LaunchSpec.env under contracts.rank_env),
        also once the attempt is released.

        Raises:
            BackendError: no such attempt or rank was ever launched on the cluster.
        """
        with self.cluster.lock:
            att = self.cluster.launched.get((job_id, attempt))
            if att is None or not 0 <= rank < len(att.ranks):
                raise BackendError(f"job {job_id} attempt {attempt}: no rank {rank} here")
            return dict(att.ranks[rank].env)

    # -- fault injection (as LocalBackend's) --------------------------------------------------------

    def kill_node(self, name: str) -> None:
        """The node dies: it is `dead` until revived, and its unfinished ranks are `lost`."""
        with self.cluster.lock:
            self._known_node(name)
            now = self.clock()
            self.cluster.node_states[name] = "dead"
            for att, rk in self._ranks_on(name):
                self.cluster.advance(att, rk, now)
                if rk.ended is None:
                    rk.ended = (None, None, True)

    def hang_node(self, name: str) -> None:
        """The node freezes: `hung`, and its ranks stop (running, `stopped`, no progress)."""
        with self.cluster.lock:
            self._known_node(name)
            now = self.clock()
            self.cluster.node_states[name] = "hung"
            for att, rk in self._ranks_on(name):
                self.cluster.deliver(att, rk, _STOP, now)

    def revive_node(self, name: str) -> None:
        """The node is repaired: its stopped ranks continue, it is `up`; lost ranks stay lost."""
        with self.cluster.lock:
            self._known_node(name)
            now = self.clock()
            for att, rk in self._ranks_on(name):
                self.cluster.deliver(att, rk, _CONT, now)  # lived up to now at the old speed first
            self.cluster.node_states[name] = "up"
            self.cluster.slow.pop(name, None)

    def slow_node(self, name: str, factor: float) -> None:
        """The node runs `factor` times slower until `revive_node`: its ranks' steps (running now
        or launched later) take `factor` times as long, in fake time and in their metrics' step
        times. The node stays `up` (as LocalBackend's, where the CPU quota does it).

        Raises:
            BackendError: unknown node, or a factor not in (1, 100].
        """
        with self.cluster.lock:
            self._known_node(name)
            try:
                cpu_quota.check_factor(factor)
            except ValueError as e:
                raise BackendError(f"factor: {e}") from None
            now = self.clock()
            for att, rk in self._ranks_on(name):
                self.cluster.advance(att, rk, now)  # up to now at the old speed
            self.cluster.slow[name] = float(factor)

    def kill_rank(self, job_id: int, attempt: int, rank: int, sig: int = _signal.SIGKILL) -> None:
        """Send `sig` to one rank (SIGCONT resumes a `hang_rank`); recorded in `signals`.

        Raises:
            BackendError: no such attempt or rank.
        """
        with self.cluster.lock:
            att, rk = self._rank(job_id, attempt, rank)
            now = self.clock()
            self.cluster.signals.append(SentSignal(now, job_id, attempt, int(sig), rank))
            self.cluster.deliver(att, rk, int(sig), now)

    def hang_rank(self, job_id: int, attempt: int, rank: int) -> None:
        """Freeze one rank: it keeps `running`, with `stopped=True`.

        Raises:
            BackendError: no such attempt or rank.
        """
        with self.cluster.lock:
            att, rk = self._rank(job_id, attempt, rank)
            self.cluster.deliver(att, rk, _STOP, self.clock())

    # -- helpers ---------------------------------------------------------------------------------

    def _state(self, name: str) -> str:
        return self.cluster.node_states.get(name, "up")

    def _known_node(self, name: str) -> None:
        if name not in self._nodes:
            raise BackendError(f"unknown node {name!r} (known: {sorted(self._nodes)})")

    def _attempt(self, job_id: int, attempt: int) -> _Attempt | None:
        return self.cluster.attempts.get((job_id, attempt)) if (job_id, attempt) in self._known else None

    def _rank(self, job_id: int, attempt: int, rank: int) -> tuple[_Attempt, _Rank]:
        att = self.cluster.attempts.get((job_id, attempt))
        if att is None or not 0 <= rank < len(att.ranks):
            raise BackendError(f"job {job_id} attempt {attempt}: no rank {rank} here")
        return att, att.ranks[rank]

    def _ranks_on(self, node: str) -> list[tuple[_Attempt, _Rank]]:
        return [(a, rk) for _, a in sorted(self.cluster.attempts.items()) for rk in a.ranks if rk.node == node]

    def _validate(self, spec: LaunchSpec, where: str) -> None:
        check_launch(spec, where, self._nodes, self._state, (spec.job_id, spec.attempt) in self.cluster.attempts)
        if not Path(spec.workdir).is_dir():
            raise BackendError(f"{where}: workdir {spec.workdir!r} is not a directory")

    def _program(self, spec: LaunchSpec, where: str) -> tuple[Program, dict[int, Program]]:
        cmd = spec.command
        if cmd[0] == FAKE_COMMAND:
            return parse_program(cmd)
        if cmd[0] in self.programs:
            return self.programs[cmd[0]], {}
        path = cmd[0] if os.sep in cmd[0] else shutil.which(cmd[0])
        if path is None or not os.path.isfile(path) or not os.access(path, os.X_OK):
            why = "No such file or directory" if path is None or not os.path.exists(path) else "Permission denied"
            msg = f"cannot execute {cmd[0]!r}: {why}"
            jd = JobDir(spec.job_dir)
            try:
                jd.logs.mkdir(parents=True, exist_ok=True)
                for r in spec.ranks:
                    _append(jd.rank_log(r.rank), [f"trainyard: {msg}"])
            except OSError:
                pass
            raise BackendError(f"{where}: rank 0: {msg}")
        return self.default_program, {}


def _state(rk: _Rank) -> RankState:
    if rk.ended is None:
        return RankState(rk.rank, rk.pid, running=True, exit_code=None, signal=None, stopped=rk.stopped)
    code, sig, lost = rk.ended
    return RankState(rk.rank, rk.pid, running=False, exit_code=code, signal=sig, lost=lost, oom_killed=rk.oom_killed)


def _append(path: Path, lines: list[str]) -> None:
    if lines:
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))


def _create(data_dir: Path, nodes: list[NodeInfo], options: Mapping[str, object]) -> FakeBackend:
    return FakeBackend(data_dir, nodes)


def _discover_nodes(data_dir: Path, options: Mapping[str, object]) -> list[NodeInfo]:
    per, count = int(str(options.get("gpus_per_node") or 4)), int(str(options.get("nodes") or 1))
    return [NodeInfo(f"node{i}", per, "emulated", 16384) for i in range(count)]


registry.register(registry.BackendKind(
    "fake", "scripted ranks on a clock, no processes (tests of the control loop)", _create, _discover_nodes,
    options=frozenset({"nodes", "gpus_per_node"}), node_options=frozenset({"nodes"})))
