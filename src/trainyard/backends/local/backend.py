"""Local backend: every rank is a real process on this machine; nodes may be emulated.

One machine plays one or more nodes, so the whole control plane (placement across nodes, multi-
node rendezvous, preemption, requeue, re-attach) runs for real without a cluster.

Processes. Each rank is `rank_runner.py` (see there) in its own session and process group, with
the command as its child. The command and everything it starts live in the attempt's *cell*
(`backends.contain`: a cgroup v2 or v1 subtree, or the runner's descendants in subreaper mode),
which it enters between fork and exec, so a command that starts its own session or daemon
(torchrun's workers, `setsid`, `nohup … &`) does not escape: `signal` reaches every process of
the cell (frozen while signalled, so a fork cannot slip past; the SIGUSR1 notice goes to the
processes that handle it, see `contain.ops.notice`), a rank is over only when its cell is empty
(the runner kills what the command left behind), and `release` removes the cell only once it is
empty. The chosen mode is `containment` / `containment_line` (said by `yard up` and shown in
`yard nodes`). Limits (`LaunchSpec.limits`) are the cell's: memory and pids per node, CPU bandwidth and
the GPU devices per rank; emulated GPUs are character devices `<data_dir>/dev/nvidia<minor>`
(TRAINYARD_GPU_DEVICES names a rank's own). A limit the mode cannot enforce fails the launch
(but the pids limit, every job's default: without a pids controller it is not enforced, and the
containment line says so). Each attempt and node also gets a private /tmp and /dev/shm
(`contain.private_tmp`: a tmpfs in the ranks' mount namespaces, else a TMPDIR of its own).

Images. A rank of a job with `LaunchSpec.container` runs in its image with root runc, inside the
same cell, limits, private /tmp and logs (`local.container`: the node's cache and the bundle;
`contain.oci_spec`: config.json; the rank runner's container mode). `prepare_image`,
`image_entries` and `remove_image` are the node's `images.cache.NodeCache` (under
`<data_dir>/images/<node>`); a launch whose node lacks the image fails naming both.

Datasets. `stage_dataset`, `dataset_entries` and `remove_dataset` are the node's
`staging.cache.NodeDatasetCache` (under `<data_dir>/datasets/<node>`: emulated nodes have caches of
their own, as real ones would); each rank gets `LaunchSpec.dataset_paths` of its own node in its
environment, a container binds them read-only, and `release` unpins the attempt's entries.

Identity. With `LaunchSpec.owner` the runner (which stays the plane's user, root) starts the
command as that account: setgroups(owner.groups), setgid, setuid, and HOME/USER/LOGNAME/SHELL of
the account in the environment; the rank logs are chowned to the owner before the command writes
them. Without an owner the ranks run as the plane's own user.

Run state on disk, so a control plane killed with -9 loses nothing:

    <job_dir>/logs/rank-<r>.log               appended across attempts, a marker line per attempt
    <job_dir>/run/attempt-<a>/attempt.json    written before any rank starts: ranks and placement,
                                              owner, the cell (`cell`, `contain`: absolute paths)
    <job_dir>/run/attempt-<a>/rank-<r>.json   written by the runner: pid, start time, pgid
    <job_dir>/run/attempt-<a>/rank-<r>.exit   written by the runner (or by the backend that reaped
                                              a runner killed by a signal): exit code or signal
    <job_dir>/run/attempt-<a>/rank-<r>.lost   written by `kill_node` for a rank alive when its node
                                              died: the rank is `lost`, whatever else is recorded
    <data_dir>/tmp/j<job>.a<attempt>.<node>/  the attempt's private tmp on that node (tmpfs mode;
                                              removed at release, swept by a restarted plane)
    <data_dir>/nodes/<name>.json              emulated node state {state: up|hung|dead, since, slow?};
                                              read on every inventory/poll/launch, absent means up

A new `LocalBackend` scans `<data_dir>/jobs/*/run/attempt-*` and reports those attempts from the
files alone (cells included: they are found by their recorded paths), and kills and removes any
cell of its data dir that no run dir records; a pid counts as the rank only if its /proc start time matches the record (pids get
recycled). A runner that is gone without an exit file is `lost`; a finished attempt's leftover
processes are killed by the next poll. `release` deletes `run/attempt-<a>/` and keeps the logs.

A batch script (`LaunchSpec.batch`) is one rank, the script, on the first node with the
allocation's environment and our `srun`/`scontrol` first on its PATH (`local.batch`,
`local.srun`); its tasks are srun's children, in the script's cell. Fault injection on another
node of a batch job does not reach those tasks (attempt.json places only the script).

Launch waits until every runner has recorded that its command was executed, so it can honour
"every rank or none": a command that is not found (127) or not executable (126) is recorded in the
rank log, every started rank is killed and `BackendError` is raised.

Node faults (emulation only): `kill_node` SIGKILLs every rank group placed on the node and marks
it dead; `hang_node` SIGSTOPs them and marks it hung; `revive_node` SIGCONTs and marks it up. A
node that is not up is `healthy=False` in the inventory, refuses launches and fails `check_node`.
`slow_node` records a slowdown factor F in the node's state and divides the CPU quota of every rank
on it (running, and launched there later) by F (`contain.cpu_quota`; not in the subreaper mode);
the node stays up and healthy, and `revive_node` restores the ranks' own quota.
They act on the run state on disk, so any process on the same data dir can inject them.

Environment: never this process's own (the plane's secrets, PGPASSWORD or YARD_DB_URL, stay
its own): the ranks start from `login_env`'s allow-list (a default PATH, HOME/USER/LOGNAME/SHELL of
the account they run as, the host's LANG/TZ and SLURM_CONF), then `LaunchSpec.env` (what
the submitter exported: with `--export=ALL`, the default, its PATH too), then every part of
`contracts.rank_env` (the contract, TRAINYARD_*, torchelastic's and the emulated Slurm job
variables; every emulated node's MASTER_ADDR is this machine's `master_addr`).
`CUDA_DEVICE_ORDER=PCI_BUS_ID` is set unless the spec sets it, so CUDA_VISIBLE_DEVICES indices
mean what NVML/nvidia-smi call them. Emulated node i's GPU j is physical GPU offset(i) + j when
the nodes are slices of real GPUs (see `gpu_offsets`), and plain j otherwise.
"""

from __future__ import annotations

import logging
import os
import signal as _signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from trainyard.backends.rundir import procfs
from trainyard import jobfs
from trainyard.backends import registry
from trainyard.backends import contain
from trainyard.backends.local import batch
from trainyard.backends.local.check_cell import check_cell as _check_cell
from trainyard.backends.local import container
from trainyard.backends.rundir import job_tools
from trainyard.backends.rundir import terminal
from trainyard.backends.rundir import port as rank_port
from trainyard.backends.base import AttemptState, BackendError, GpuReading, LaunchSpec, NodeInfo, RankState, Terminal, Tunnel
from trainyard.images.types import CachedImage, EntryInfo, RegistryAccess
from trainyard.staging.cache import NodeCaches
from trainyard.staging.types import DatasetEntry, DatasetRef, SourceAccess, StagedDataset
from trainyard.spec.image_ref import parse_image
from trainyard.backends.launch_check import check_launch
from trainyard.backends.contain import cpu_quota
from trainyard.backends.contain import ops as contain_ops
from trainyard.backends.contain import usage as contain_usage
from trainyard.backends.local import gpu_use
from trainyard.backends.local.gpu_agent import NodeAgent, ProcTree, holders
from trainyard.backends.contain import private_tmp
from trainyard.backends.contain.devices import Device, gpu_devices
from trainyard.backends.environment import fingerprint
from trainyard.backends.rundir.attempt_dir import open_attempt
from trainyard.backends.rundir.exit_watch import ExitWatch, WatchesExits
from trainyard.backends.local.login_env import account_env, login_env
from trainyard.contracts import NOTICE_SIGNAL, EnvPart, Gang, JobDir, JobVar, RankPlacement, rank_env
from trainyard.ports import free_port

RUNNER = Path(__file__).parents[1] / "rundir" / "rank_runner.py"
log = logging.getLogger("trainyard.backend")
EMULATED_MODEL = "emulated"
DATASETS_DIR = "datasets"  # <data_dir>/datasets/<node>: each emulated node's dataset cache (`staging.cache`)


@dataclass
class _Attempt:
    job_id: int
    attempt: int
    run_dir: Path
    world_size: int
    procs: dict[int, subprocess.Popen] = field(default_factory=dict)  # runners we started, not yet reaped
    nodes: dict[int, str] = field(default_factory=dict)  # rank -> node it was placed on
    cell: dict | None = None  # the containment record (attempt.json "cell"); None: process groups only


class LocalBackend(WatchesExits):
    """Runs ranks as local processes; see the module docstring for the layout and guarantees.

    Thread-safe (one lock); meant to be owned by one control-plane process at a time.
    """

    name = "local"
    launch_waits = False  # the processes start here, at once

    def __init__(
        self,
        data_dir: str | Path,
        nodes: list[NodeInfo],
        master_addr: str = "127.0.0.1",
        *,
        gpu_offsets: Mapping[str, int] | None = None,
        launch_timeout_s: float = 30.0,
        containment: str | None = None,
        private_tmp_mode: str | None = None,
        job_python: str | None = None,
        image_cache_cap: int | None = None,
        image_caches: Callable[[str], container.NodeImages] | None = None,
    ) -> None:
        """`gpu_offsets`: physical index of each node's GPU 0. Default: nodes that are slices of
        real GPUs (gpu_model != "emulated", as `detect_local_nodes` makes them) are laid out
        contiguously in list order; emulated ones use their node-local indices.
        `containment`: auto | cgroup2 | cgroup1 | subreaper (None: $TRAINYARD_CONTAINMENT, else
        auto; see `backends.contain`). `private_tmp_mode`: auto | tmpfs | dir (None: $TRAINYARD_PRIVATE_TMP,
        else auto; see `backends.contain.private_tmp`). `job_python`: the interpreter a batch
        script's `srun`/`scontrol`/`squeue`/`sinfo` run with, as the job's owner (None: the first
        python3 of the host, `backends.rundir.job_tools.default_python`). `image_cache_cap`: each
        node's image cache's size cap in bytes (None: none); `image_caches`: node -> its cache
        (default: `images.cache.NodeCache` under `<data_dir>/images/<node>`).

        Raises:
            BackendError: the containment asked for by name cannot work here (the message says why).
        """
        names = [n.name for n in nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate node names: {names}")
        self._data_dir = Path(data_dir)
        self._nodes = {n.name: n for n in nodes}
        self._node_list = list(nodes)
        self._offsets = dict(gpu_offsets) if gpu_offsets is not None else _default_offsets(nodes)
        self._master_addr = master_addr
        self._launch_timeout_s = launch_timeout_s
        self.job_python = job_tools.resolve(job_python)
        self._lock = threading.RLock()
        self._image_cap = image_cache_cap
        self._image_factory = image_caches
        self._image_caches: dict[str, container.NodeImages] = {}
        self._dataset_caches = NodeCaches(self._data_dir / DATASETS_DIR)
        self._attempts: dict[tuple[int, int], _Attempt] = {}
        self._exit_watch: ExitWatch | None = None
        self._stuck: dict[tuple[int, int], _Attempt] = {}  # released, but processes would not die yet
        # terminals opened in each attempt's ranks (open_terminal): (session leader, its start time)
        self._terminals: dict[tuple[int, int], list[tuple[int, int]]] = {}
        try:
            self._contain = contain.choose(containment, str(self._data_dir))
            self._tmp = private_tmp.choose(private_tmp_mode, str(self._data_dir))
        except contain.ContainmentError as e:
            raise BackendError(str(e)) from e
        self._devices, devices_note = gpu_devices(
            str(self._data_dir), [(n.name, n.gpus, n.gpu_model == EMULATED_MODEL) for n in nodes], self._offsets)
        self.containment = self._contain.mode
        # Two lines (yard up prints them): how processes are contained, and whether /tmp is private.
        self.containment_line = (self._contain.line() + (f"; {devices_note}" if devices_note else "")
                                 + "\n" + self._tmp.line())
        # A fallback is a warning (an operator should know the jobs are less contained than they could be).
        (log.warning if self._contain.fallback or devices_note or self._tmp.why else log.info)(
            "%s", self.containment_line)
        self.gpu_agent = NodeAgent(nodes, self._offsets)  # the nodes' GPU readings (gpu_readings)
        self._discover()
        # Cells on disk that no run dir re-attaches (the plane died between making them and
        # recording them, or a run dir was deleted by hand): nothing of them may run on.
        keys = self._keys_on_disk()
        swept = self._contain.driver.sweep(keys)
        swept_tmp = self._tmp.sweep(keys)
        if swept_tmp:
            log.warning("private tmp: unmounted and removed that of %d unrecorded attempt(s): %s", len(swept_tmp),
                        ", ".join(swept_tmp))
        if swept:
            log.warning("containment: killed and removed %d unrecorded attempt cell(s): %s", len(swept), ", ".join(swept))

    # -- interface ------------------------------------------------------------------------------

    def inventory(self) -> list[NodeInfo]:
        """The configured nodes; one that is dead or hung (see `kill_node`) is `healthy=False`."""
        out = []
        for n in self._node_list:
            state = self._node_state(n.name)
            out.append(n if state == "up" else replace(n, healthy=False, state=state))
        return out

    def launch(self, spec: LaunchSpec) -> None:
        """Start every rank of `spec`, or none.

        Raises:
            BackendError: the spec does not fit this backend (unknown node, GPU index out of range,
                ranks not 0..n-1, attempt already known), a node is dead or hung, workdir missing, job dir not creatable,
                command not found / not executable, or a runner did not come up in time.
        """
        with self._lock:
            self._validate(spec)
            images = self._launch_images(spec)
            jd = JobDir(spec.job_dir)
            try:
                tree, run_dir = open_attempt(spec.job_dir, spec.attempt)
                if tree.is_dir(run_dir) and not _rank_records(tree, run_dir):
                    # An owner died before any rank of it had recorded itself: end what it may
                    # have started, then start afresh.
                    old = (jobfs.read_record(run_dir / "attempt.json") or {}).get("cell")
                    if old:
                        contain_ops.kill(old, [], timeout_s=5)
                        contain_ops.remove(old)
                    self._tmp.release(contain.attempt_key(spec.job_id, spec.attempt))
                    tree.remove_tree(run_dir)
                tree.make_dir(run_dir, None, exist_ok=False)  # live state of this attempt there: never mix two runs
            except OSError as e:
                raise BackendError(f"job {spec.job_id}: cannot create {e.filename}: {e.strerror}") from e
            nodes = {0: _first_node(spec)} if spec.batch else {r.rank: r.node for r in spec.ranks}
            att = _Attempt(spec.job_id, spec.attempt, run_dir, len(nodes), nodes=nodes)
            try:
                cell = self._prepare_cell(spec, run_dir, images)
            except BackendError:
                tree.remove_tree(run_dir)
                raise
            att.cell = {k: v for k, v in cell.items() if k != "ranks"}
            try:
                jobfs.write_record(run_dir / "attempt.json", _attempt_record(spec, cell))
                self._quota_plans(cell["ranks"])  # a slowed node's ranks are slow from their first instruction
                self._start_ranks(spec, att, jd, cell["ranks"], images)
                self._await_runners(att)
                self._quota_plans(cell["ranks"])  # a `slow_node`/`revive_node` of another process meanwhile
                self._tmp.detach(contain.attempt_key(spec.job_id, spec.attempt))  # the ranks hold it now
                # A fault injected by another process while we were starting: it may not have
                # seen our ranks yet, so honour "every rank or none" ourselves.
                for node in sorted({r.node for r in spec.ranks}):
                    if (state := self._node_state(node)) != "up":
                        raise BackendError(f"job {spec.job_id} attempt {spec.attempt}: {node} went {state} during launch")
            except BaseException as e:
                self._abort(att)
                if isinstance(e, BackendError):
                    raise
                if isinstance(e, OSError):
                    raise BackendError(f"job {spec.job_id} attempt {spec.attempt}: launch failed: {e}") from e
                raise
            self._attempts[(spec.job_id, spec.attempt)] = att

    def signal(self, job_id: int, attempt: int, sig: int, *, batch_shell: bool = False) -> None:
        """Send `sig` to every process of the attempt (its cell: every session and daemon its
        ranks started); ranks (or attempts) already gone are skipped. `batch_shell` (--signal=B:)
        changes nothing here: the notice reaches a batch script's shell already. The preemption notice
        (SIGUSR1) goes to the processes that handle it, or to a rank's command where none does
        (`contain.ops.notice`: a launcher that does not handle it must not die of it). An attempt
        recorded without a cell (by an older plane) gets it by process group."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                return
            recs = [rec for r in range(att.world_size) if (rec := jobfs.read_record(att.run_dir / f"rank-{r}.json"))]
            if att.cell is not None and sig == NOTICE_SIGNAL:
                plans = (jobfs.read_record(att.run_dir / "attempt.json") or {}).get("contain") or {}
                ranks = []
                for r in range(att.world_size):
                    rec = jobfs.read_record(att.run_dir / f"rank-{r}.json")
                    live = rec is not None and procfs.is_alive(rec["pid"], rec["start_time"])
                    ranks.append((plans.get(str(r)) or {}, rec["pid"] if live else None,
                                  rec.get("child_pid") if rec else None))
                contain_ops.notice(att.cell, ranks, sig)
                return
            if att.cell is not None:
                contain_ops.signal(att.cell, _runner_pids(recs), sig)
                if sig in (_signal.SIGKILL, _signal.SIGCONT):
                    # A runner stopped with its rank (`hang_rank`, a hung node) must go on to reap
                    # the command and record how it ended.
                    for rec in recs:
                        if _group_is_ours(rec):
                            _killpg(rec["pgid"], _signal.SIGCONT)
                return
            for rec in recs:
                if _group_is_ours(rec):
                    _killpg(rec["pgid"], sig)

    def poll(self) -> list[AttemptState]:
        """Facts about every known attempt. A rank that was alive when its node died (`kill_node`,
        by this or another process) is `lost`, whatever exit record it left; a rank whose
        processes are stopped (a hung node, `hang_rank`) is `running` and `stopped`."""
        with self._lock:
            self._retry_stuck()
            dead = {n for n in self._nodes if self._node_state(n) == "dead"}
            out = []
            for _, a in sorted(self._attempts.items()):
                st = AttemptState(a.job_id, a.attempt, [self._rank_state(a, r, dead) for r in range(a.world_size)])
                if st.done and a.cell is not None and a.cell.get("mode") != "subreaper":
                    # Every runner is gone (each drains its rank before it exits, but one killed
                    # with its node cannot): whatever is left in the cell dies now.
                    contain_ops.signal(a.cell, [], _signal.SIGKILL)
                out.append(st)
            return out

    def check_node(self, name: str) -> tuple[bool, str]:
        """Health check before a drained node returns to service: (passed, reason).

        For the emulation: the node is marked up, and a trivial process can be started and reaped
        "on" it within `launch_timeout_s`.
        """
        if name not in self._nodes:
            return False, f"unknown node {name!r}"
        state = self._node_state(name)
        if state != "up":
            return False, f"{name} is {state}"
        env = {**login_env(), JobVar.NODE: name}  # nothing of the plane's own environment
        try:
            done = subprocess.run(
                ["true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=env, start_new_session=True, timeout=self._launch_timeout_s,
            )
        except subprocess.TimeoutExpired:
            return False, f"{name}: a trivial process did not finish in {self._launch_timeout_s}s"
        except OSError as e:
            return False, f"{name}: cannot start a process: {e}"
        if done.returncode != 0:
            return False, f"{name}: `true` exited with {done.returncode}"
        return True, f"{name} is up and runs processes"

    def release(self, job_id: int, attempt: int) -> None:
        """SIGKILL whatever is left of the attempt, wait until it is gone, delete its run state."""
        with self._lock:
            att = self._attempts.pop((job_id, attempt), None)
            if att is not None:
                self._abort(att)
            terminal.end_sessions(self._terminals.pop((job_id, attempt), []))
        self._dataset_caches.unpin(job_id, attempt)  # evictable again

    # -- images (`backends.local.container`) -----------------------------------------------------

    def _images(self, node: str) -> container.NodeImages:
        self._known_node(node)
        with self._lock:
            if node not in self._image_caches:
                self._image_caches[node] = (self._image_factory(node) if self._image_factory is not None
                                            else container.node_cache(self._data_dir, node, self._image_cap))
            return self._image_caches[node]

    def prepare_image(self, node: str, ref: str, access: RegistryAccess) -> CachedImage:
        """Pull and unpack `ref` (pinned) into `node`'s cache unless it is there (no lock held:
        it may take minutes). Raises `images.types.ImagePullError`; BackendError for an unknown node."""
        try:
            parsed = parse_image(ref)
        except ValueError as e:
            raise BackendError(f"image {ref!r}: {e}") from e
        cache = self._images(node)
        if self._image_cap is None and access.cache_max_bytes is not None:
            cache.cap_bytes = access.cache_max_bytes  # the configuration's, unless the backend was given one
        return cache.ensure(parsed, access)

    def image_entries(self, node: str) -> list[EntryInfo]:
        return self._images(node).entries()

    def remove_image(self, node: str, digest: str) -> bool:
        return self._images(node).remove(digest)

    # -- datasets (`staging.cache`) ------------------------------------------------------------------

    # One cache per emulated node, `<data_dir>/datasets/<node>` (`staging.cache.NodeCaches`).

    def stage_dataset(self, node: str, ref: DatasetRef, access: SourceAccess,
                      job: tuple[int, int] | None = None) -> StagedDataset:
        """`ref` in `node`'s cache (copied unless there; no lock of the backend held: it may take
        minutes), pinned for `job` until its release. Raises `staging.types.DataStagingError`."""
        self._known_node(node)
        return self._dataset_caches.stage(node, ref, access, job)

    def dataset_entries(self, node: str) -> list[DatasetEntry]:
        self._known_node(node)
        return self._dataset_caches.entries(node)

    def remove_dataset(self, node: str, checksum: str) -> bool:
        self._known_node(node)
        return self._dataset_caches.remove(node, checksum)

    def close(self) -> None:
        """Forget everything without touching the ranks: the next owner re-attaches from disk.

        Runners still running stay children of this process; Python's subprocess module reaps
        them later, and a re-attaching backend treats a zombie as exited.
        """
        with self._lock:
            # The cells of attempts that are over (nothing runs in them) go now: a plane stopped
            # between an attempt's end and its release would otherwise leave empty cgroups behind
            # (the next owner's release finds them gone, which is fine). rmdir fails on a cgroup
            # that still has a process, so nothing running is touched.
            # So does their private /tmp: nothing of the attempt is left to use it (what was left there
            # is the job's to lose, as at release).
            for att in self._attempts.values():
                recs = [rec for r in range(att.world_size) if (rec := jobfs.read_record(att.run_dir / f"rank-{r}.json"))]
                if not _runner_pids(recs):  # every runner has recorded its end
                    if att.cell is not None:
                        contain_ops.remove(att.cell, retry_s=0)
                    self._tmp.release(contain.attempt_key(att.job_id, att.attempt))
            if self._exit_watch is not None:
                self._exit_watch.stop()
                self._exit_watch = None
            self._attempts.clear()
            self._contain.driver.close()  # only removes our base directories when they are empty

    # -- fault injection (emulation only; not part of the Backend interface) ---------------------

    def kill_node(self, name: str) -> None:
        """The node dies: mark it `dead` (until `revive_node`), SIGKILL every rank group on it.

        Every attempt placed there counts, also ones another process owns. A rank still alive at
        this moment gets a `rank-<r>.lost` record, so every owner reports it lost (not killed by
        a signal, not exited), now and after a restart. Returns once the groups are gone.

        Raises:
            BackendError: unknown node.
        """
        with self._lock:
            self._known_node(name)
            self._set_node_state(name, "dead")  # first: a launch racing us sees it and aborts
            killed = []
            for run_dir, r in self._ranks_on(name):
                if jobfs.record_exists(run_dir / f"rank-{r}.exit") or jobfs.record_exists(run_dir / f"rank-{r}.lost"):
                    continue  # it ended before the node died
                try:
                    jobfs.write_record(run_dir / f"rank-{r}.lost", {"node": name, "reason": "node dead", "at": _now()})
                except OSError:
                    continue  # the attempt was released meanwhile
                killed.append((run_dir, r))
            self._signal_ranks(killed, _signal.SIGKILL)
            recs = [rec for run_dir, r in killed if (rec := jobfs.read_record(run_dir / f"rank-{r}.json"))]
            deadline = time.monotonic() + 5
            while recs and time.monotonic() < deadline:
                recs = [rec for rec in recs if _group_is_ours(rec) and _group_has_live_member(rec)]
                if recs:
                    time.sleep(0.01)

    def hang_node(self, name: str) -> None:
        """The node freezes: mark it `hung`, SIGSTOP every rank group on it (they stay `running`,
        with `stopped=True`). Returns once the groups' leaders are stopped.

        Raises:
            BackendError: unknown node.
        """
        with self._lock:
            self._known_node(name)
            self._set_node_state(name, "hung")
            self._stop_ranks(self._ranks_on(name))

    def revive_node(self, name: str) -> None:
        """The node is repaired: SIGCONT the stopped rank groups still on it, mark it `up`.

        Ranks lost with a dead node stay lost; the node itself passes `check_node` again.

        Raises:
            BackendError: unknown node.
        """
        with self._lock:
            self._known_node(name)
            self._signal_ranks(self._ranks_on(name), _signal.SIGCONT)
            slowed = self._node_slow(name) is not None
            self._set_node_state(name, "up")
            if slowed:
                self._quota_ranks(name, None)

    def slow_node(self, name: str, factor: float) -> None:
        """The node runs `factor` times slower (2.0: half speed) until `revive_node`: every rank on
        it, running now or launched there later (also by a restarted plane: the factor is in the
        node's state file), gets its CPU quota divided by `factor` (`contain.cpu_quota`). The node
        stays `up` and healthy: being slow is what the straggler and speed checks must find.

        Raises:
            BackendError: unknown node, a factor not in (1, 100], or a containment without CPU
                quotas (the subreaper mode, no cpu hierarchy or controller).
        """
        with self._lock:
            self._known_node(name)
            try:
                cpu_quota.check_factor(factor)
            except ValueError as e:
                raise BackendError(f"factor: {e}") from None
            if why := cpu_quota.why_not(self._contain.driver):
                raise BackendError(f"node {name}: cannot slow its ranks: {why} (slow-node needs a CPU quota: "
                                   "TRAINYARD_CONTAINMENT=cgroup1, or cgroup2 with the cpu controller)")
            state, before = self._node_state(name), self._node_slow(name)
            self._set_node_state(name, state, slow=factor)
            try:
                self._quota_ranks(name, factor)
            except BackendError:
                self._set_node_state(name, state, slow=before)  # not recorded as slowed when it is not
                raise

    def _quota_ranks(self, node: str, factor: float | None) -> None:
        """Every rank placed on `node` (any owner's attempt) gets the quota of `factor` (None: its own)."""
        for run_dir in self._run_dirs():
            meta = jobfs.read_record(run_dir / "attempt.json") or {}
            plans = meta.get("contain") or {}
            for r in meta.get("ranks", []):
                if r.get("node") == node and not jobfs.record_exists(run_dir / f"rank-{r['rank']}.exit"):
                    self._quota_plan(plans.get(str(r["rank"])), factor)

    def _quota_plans(self, plans: Mapping[str, dict]) -> None:
        """Each rank of a launch gets its node's slowdown, or its own quota when the node is not slowed."""
        for plan in plans.values():
            if plan.get("node") is not None:
                self._quota_plan(plan, self._node_slow(str(plan["node"])))

    @staticmethod
    def _quota_plan(plan: dict | None, factor: float | None) -> None:
        if plan is None:
            return
        try:
            cpu_quota.apply(plan, factor)
        except contain.ContainmentError as e:
            raise BackendError(str(e)) from e

    def kill_rank(self, job_id: int, attempt: int, rank: int, sig: int = _signal.SIGKILL) -> None:
        """Send `sig` to one rank's process group (SIGCONT resumes a `hang_rank`); gone is fine.

        Raises:
            BackendError: no such attempt or rank here (run state on disk, any owner).
        """
        with self._lock:
            self._signal_ranks([(self._rank_run_dir(job_id, attempt, rank), rank)], sig)

    def hang_rank(self, job_id: int, attempt: int, rank: int) -> None:
        """SIGSTOP one rank's process group: it keeps `running`, with `stopped=True`. Returns
        once it is stopped.

        Raises:
            BackendError: no such attempt or rank here (run state on disk, any owner).
        """
        with self._lock:
            self._stop_ranks([(self._rank_run_dir(job_id, attempt, rank), rank)])

    # -- node state -----------------------------------------------------------------------------

    def open_terminal(self, job_id: int, attempt: int, rank: int, argv: list[str], *, rows: int = 24,
                      cols: int = 80, term: str = terminal.DEFAULT_TERM, session: bool = False) -> Terminal:
        """`argv` (empty: the owner's shell) in `rank`'s place on a new pty: its cgroups, its mount
        namespace (private /tmp, its container), its environment, as the owner (`rundir/attach.py`,
        which checks again that the rank's process is the recorded one). The attempt's release
        ends what is left of it.

        Raises:
            BackendError: no such attempt or rank here, its node is down, the rank is not running,
                or no pty / process could be made.
        """
        where = f"job {job_id} attempt {attempt} rank {rank}"
        with self._lock:
            att = self._running_rank(job_id, attempt, rank)
            rec = jobfs.read_record(att.run_dir / f"rank-{rank}.json") or {}
            child = procfs.read_stat(int(rec.get("child_pid") or 0)) if rec.get("child_pid") else None
            if child is None or child.exited or child.ppid != rec.get("pid") or \
                    child.start_time < int(rec.get("start_time", 0)) or \
                    rec.get("child_start_time") not in (None, child.start_time):
                raise BackendError(f"{where}: the rank's process is gone (it has ended)")
            try:
                t = terminal.spawn(terminal.attach_argv(att.run_dir, rank, list(argv)), terminal.attach_env(term),
                                   rows, cols)
            except OSError as e:
                raise BackendError(f"{where}: cannot open a terminal: {e}") from e
            leader = procfs.read_stat(t.pid)
            if leader is not None:
                self._terminals.setdefault((job_id, attempt), []).append((t.pid, leader.start_time))
            return t

    def _running_rank(self, job_id: int, attempt: int, rank: int) -> _Attempt:
        """The attempt of a rank that runs now, on a node that is up, not stopped: what a terminal
        or a forwarded port may enter. Call with the lock held.

        Raises:
            BackendError: no such attempt or rank here, its node is down, it ended or is stopped.
        """
        where = f"job {job_id} attempt {attempt} rank {rank}"
        att = self._attempts.get((job_id, attempt))
        if att is None or not 0 <= rank < att.world_size:
            raise BackendError(f"{where}: no such running rank on the {self.name} backend")
        node = att.nodes.get(rank)
        if node is not None and (state := self._node_state(node)) != "up":
            raise BackendError(f"{where}: its node {node} is {state}")
        st = self._rank_state(att, rank)
        if not st.running:
            raise BackendError(f"{where}: the rank is not running (it has ended)")
        if st.stopped:
            raise BackendError(f"{where}: the rank is stopped (its node or the rank hangs)")
        return att

    def open_port(self, job_id: int, attempt: int, rank: int, port: int) -> Tunnel:
        """A TCP connection to `port` on the loopback of `rank`'s network, made as the owner from the
        rank's place (`rundir/attach.py --connect`, through `rundir/port.py`: the rank's process
        checked again, its cgroups, its namespaces, the owner's identity); the plane gets the
        connected socket. The helper is checked for and started outside the backend's lock.

        Raises:
            BackendError: no such attempt or rank here, its node is down, the rank is not running or
                is stopped, nothing listens on `port` there, or the helper could not be started.
        """
        where = f"job {job_id} rank {rank}"
        with self._lock:
            run_dir = self._running_rank(job_id, attempt, rank).run_dir
        try:
            fd = rank_port.connect_in_rank(run_dir, rank, port)
        except rank_port.PortError as e:
            raise rank_port.backend_error(e, job_id, rank, port) from None
        except OSError as e:
            raise BackendError(f"{where}: cannot start the connection's helper: {e}") from e
        return Tunnel(fd, fd)

    def cpu_seconds(self, job_id: int, attempt: int) -> float | None:
        """CPU seconds of the attempt's cell (`contain.usage`: the cgroup's own counter, or /proc
        in the subreaper mode); None for an attempt this backend does not run, or one recorded
        without a cell (process groups only: nothing counts what their sessions left)."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None or att.cell is None:
                return None
            runners: list[int] = []
            if att.cell.get("mode") == "subreaper":
                runners = _runner_pids([rec for r in range(att.world_size)
                                        if (rec := jobfs.read_record(att.run_dir / f"rank-{r}.json"))])
            return contain_usage.cpu_seconds(att.cell, runners)

    def gpu_readings(self) -> list[GpuReading]:
        """Every node's GPUs now, by the node agent (`local.gpu_agent`: NVML where it answers for
        a node's real GPUs, else emulated from the holding ranks' CPU activity)."""
        with self._lock:
            atts = [(a.job_id, a.attempt, a.run_dir, a.cell) for a in self._attempts.values()]
        tree = ProcTree()  # one scan of /proc for every attempt's ranks (the subreaper mode's)
        return self.gpu_agent.read([h for a in atts for h in holders(*a, tree=tree)])

    def gpu_percent(self, job_id: int, attempt: int) -> float | None:
        """The busiest of the attempt's GPUs by NVML (`local.gpu_use`), when its nodes are slices
        of this machine's real GPUs; None for emulated GPUs, an attempt without GPUs, or no NVML."""
        with self._lock:
            att = self._attempts.get((job_id, attempt))
            if att is None:
                return None
            meta = jobfs.read_record(att.run_dir / "attempt.json") or {}
            found: set[int] = set()
            for r in meta.get("allocation") or meta.get("ranks") or []:
                n = self._nodes.get(str(r.get("node")))
                if n is None or n.gpu_model == EMULATED_MODEL:
                    return None
                found.update(self._offsets.get(n.name, 0) + int(g) for g in r.get("gpus") or [])
        return gpu_use.busiest(sorted(found)) if found else None

    def check_cell(self, node: str) -> AbstractContextManager[list[str]]:
        """Where a health check of `node` runs (`local.check_cell`): the cgroup directories its
        process joins, with the CPU quota a rank there gets (slowed by `slow_node`); [] without
        cgroups. Not part of `Backend`: the plane uses it where a backend has it.

        Raises:
            BackendError: unknown node (and, entering it, `ContainmentError`: no cell could be made).
        """
        self._known_node(node)
        return _check_cell(self._contain.driver, node, self._node_slow(node))

    def node_environment(self, node: str) -> dict[str, str]:
        """What a bare job's interpreter (`job_python`) sees on `node` (backends/environment.py).
        The emulated nodes share this machine, so they answer alike unless one was given an
        environment of its own (`set_node_environment`, emulation only)."""
        self._known_node(node)
        own = jobfs.read_record(self._node_env_path(node))
        if isinstance(own, dict):
            return {str(k): str(v) for k, v in own.items()}
        return fingerprint(self.job_python)

    def set_node_environment(self, name: str, env: dict[str, str] | None) -> None:
        """Emulation: make `name` report `env` as its fingerprint (None: this machine's again).
        Kept beside the node's state file, so a plane in another process sees it."""
        self._known_node(name)
        path = self._node_env_path(name)
        if env is None:
            path.unlink(missing_ok=True)  # plane's own: the emulated node's state dir
        else:
            path.parent.mkdir(parents=True, exist_ok=True)  # plane's own: the emulated node's state dir
            jobfs.write_record(path, dict(env))

    def _node_env_path(self, name: str) -> Path:
        return self._data_dir / "nodes" / f"{name}.environment.json"

    def _node_path(self, name: str) -> Path:
        return self._data_dir / "nodes" / f"{name}.json"

    def _node_state(self, name: str) -> str:
        """Read on every use: another process (`yard chaos`) may have changed it."""
        rec = jobfs.read_record(self._node_path(name))
        return str(rec.get("state", "up")) if rec else "up"

    def _node_slow(self, name: str) -> float | None:
        """The node's slowdown factor (`slow_node`), None when it runs at full speed."""
        rec = jobfs.read_record(self._node_path(name))
        slow = rec.get("slow") if rec else None
        return float(slow) if isinstance(slow, (int, float)) and slow > 1 else None

    def _set_node_state(self, name: str, state: str, slow: float | None = None) -> None:
        """`slow`: the node's slowdown factor; a node that goes hung or dead keeps its own (only
        `revive_node`, which sets `up`, ends it)."""
        path = self._node_path(name)
        if slow is None and state != "up":
            slow = self._node_slow(name)
        try:
            jobfs.plane_dir(path.parent)
            jobfs.write_record(path, {"state": state, "since": _now(), "by_pid": os.getpid(),
                                      **({"slow": slow} if slow is not None else {})})
        except OSError as e:
            raise BackendError(f"node {name}: cannot record state {state!r}: {e}") from e

    def _known_node(self, name: str) -> None:
        if name not in self._nodes:
            raise BackendError(f"unknown node {name!r} (known: {sorted(self._nodes)})")

    def _run_dirs(self) -> list[Path]:
        """Every attempt's run dir: ours, and any on disk (owned by another process)."""
        dirs = {a.run_dir for a in self._attempts.values()} | set(JobDir.attempt_runs(self._data_dir))
        return sorted(dirs)

    def _ranks_on(self, node: str) -> list[tuple[Path, int]]:
        out = []
        for run_dir in self._run_dirs():
            meta = jobfs.read_record(run_dir / "attempt.json") or {}
            out += [(run_dir, int(r["rank"])) for r in meta.get("ranks", []) if r.get("node") == node]
        return out

    def _rank_run_dir(self, job_id: int, attempt: int, rank: int) -> Path:
        att = self._attempts.get((job_id, attempt))
        if att is not None and 0 <= rank < att.world_size:
            return att.run_dir
        for run_dir in self._run_dirs():
            meta = jobfs.read_record(run_dir / "attempt.json") or {}
            if (meta.get("job_id"), meta.get("attempt")) == (job_id, attempt) and 0 <= rank < meta.get("world_size", 0):
                return run_dir
        raise BackendError(f"job {job_id} attempt {attempt}: no rank {rank} here")

    def _stop_ranks(self, ranks: list[tuple[Path, int]]) -> None:
        """SIGSTOP the ranks and wait (briefly) until /proc shows them stopped: delivery is async."""
        self._signal_ranks(ranks, _signal.SIGSTOP)
        recs = [rec for run_dir, r in ranks if (rec := jobfs.read_record(run_dir / f"rank-{r}.json"))]
        deadline = time.monotonic() + 2
        while recs and time.monotonic() < deadline:
            recs = [rec for rec in recs if not _all_stopped(rec)]
            if recs:
                time.sleep(0.005)

    @staticmethod
    def _signal_ranks(ranks: list[tuple[Path, int]], sig: int) -> None:
        """Fault injection: `sig` to every process of each rank's cell, then to its runner's group
        (a node that dies takes the runner with it). Cell first: in subreaper mode the runner must
        outlive its descendants, or they would be re-parented out of reach."""
        for run_dir, r in ranks:
            rec = jobfs.read_record(run_dir / f"rank-{r}.json")
            if rec is None or not _group_is_ours(rec):
                continue
            plan = ((jobfs.read_record(run_dir / "attempt.json") or {}).get("contain") or {}).get(str(r))
            if plan and sig == _signal.SIGKILL:
                # Stop the runner first: it must neither record the command's end (the node died,
                # nobody was left to watch) nor die before its descendants (subreaper mode).
                _killpg(rec["pgid"], _signal.SIGSTOP)
                contain_ops.kill(plan, [rec["pid"]], timeout_s=5)
            elif plan:
                contain_ops.signal(plan, [rec["pid"]], sig)
            _killpg(rec["pgid"], sig)

    # -- launch ---------------------------------------------------------------------------------

    def _validate(self, spec: LaunchSpec) -> None:
        where = f"job {spec.job_id} attempt {spec.attempt}"
        check_launch(spec, where, self._nodes, self._node_state, (spec.job_id, spec.attempt) in self._attempts)
        if (problem := jobfs.cannot_enter(spec.owner, spec.workdir)) is not None:  # asked as the owner
            raise BackendError(f"{where}: {problem}")

    def _launch_images(self, spec: LaunchSpec) -> dict[str, CachedImage]:
        """node -> the attempt's image in that node's cache ({} for a bare job).

        Raises:
            BackendError: a node's cache lacks it (the loop pulls before it launches), or runc is missing.
        """
        if spec.container is None:
            return {}
        container.find_runc()
        nodes = {_first_node(spec)} if spec.batch else {r.node for r in spec.ranks}
        out = {}
        for node in sorted(nodes):
            image = self._images(node).get(spec.container.digest)
            if image is None:
                raise container.missing(spec, node)
            out[node] = image
        return out

    def _prepare_cell(self, spec: LaunchSpec, run_dir: Path, images: Mapping[str, CachedImage]) -> dict:
        """Make the attempt's cell with its limits (memory and pids per node, CPU and devices per
        rank) and its private /tmp per node (each rank's plan gets its node's, as `tmp`), and
        each rank's container plan when the job has an image (`local.container`)."""
        lim = spec.limits
        gpus_on: dict[str, int] = {}
        for r in spec.ranks:
            gpus_on[r.node] = gpus_on.get(r.node, 0) + len(r.gpus)
        node_mem = {n: lim.mem_mib if lim.mem_mib is not None else
                    (lim.mem_per_gpu_mib * max(1, g) if lim.mem_per_gpu_mib is not None else None)
                    for n, g in gpus_on.items()}
        every = tuple(sorted({(d.major, d.minor) for devs in self._devices.values() for d in devs}))
        if spec.container is not None:
            # The container's own devices cgroup, below the rank's, allows exactly the rank's GPUs
            # (`contain.oci_spec`); v1 lets a child allow only what its parent allows whole, and
            # runc's defaults include `c *:* m`, which a rank cgroup denying other GPUs refuses.
            every = ()
        if spec.batch:
            own = {r.rank: [(d.major, d.minor) for d in self._rank_devices(r)] for r in spec.ranks}
            needs = batch.batch_needs(spec, own, node_mem, every)
        else:
            needs = contain.Needs(
            contain.attempt_key(spec.job_id, spec.attempt),
                tuple(contain.RankNeeds(r.rank, r.node, tuple((d.major, d.minor) for d in self._rank_devices(r)),
                                        lim.cpus_per_task) for r in spec.ranks),
                node_mem, every, lim.pids_max)
        try:
            cell = self._contain.driver.prepare(needs)
        except contain.ContainmentError as e:
            raise BackendError(f"job {spec.job_id} attempt {spec.attempt}: {e}") from e
        owner = (spec.owner.uid, spec.owner.gid) if spec.owner is not None else None
        try:
            tmp = self._tmp.prepare(needs.key, {r.node: needs.node_mem_mib.get(r.node) for r in needs.ranks},
                                    str(run_dir), owner, [spec.workdir, spec.job_dir, spec.checkpoint_dir],
                                    names=[n.name for n in self._node_list])
        except contain.ContainmentError as e:
            contain_ops.remove(cell)
            raise BackendError(f"job {spec.job_id} attempt {spec.attempt}: {e}") from e
        for rn in needs.ranks:
            cell["ranks"][str(rn.rank)]["tmp"] = tmp[rn.node]
            cell["ranks"][str(rn.rank)]["node"] = rn.node  # whose slowdown it takes (`slow_node`)
        if images:
            try:
                runc = container.find_runc()
                for rn in needs.ranks:
                    cell["ranks"][str(rn.rank)]["container"] = container.rank_plan(
                        self._data_dir, spec, run_dir, rn.rank, images[rn.node], runc)
            except (OSError, BackendError) as e:
                contain_ops.remove(cell)
                self._tmp.release(needs.key)
                raise BackendError(f"job {spec.job_id} attempt {spec.attempt}: cannot make the container's "
                                   f"bundle: {e}") from e
        return cell

    def _rank_devices(self, r: RankPlacement) -> list[Device]:
        devs = self._devices.get(r.node) or []
        return [devs[g] for g in r.gpus if g < len(devs)]

    def _start_ranks(self, spec: LaunchSpec, att: _Attempt, jd: JobDir, plans: Mapping[str, dict],
                     images: Mapping[str, CachedImage]) -> None:
        port = free_port(self._master_addr)  # rank 0 binds it moments later (the usual torchrun race)
        ranks = sorted(spec.ranks, key=lambda r: r.rank)
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        # this machine's numbering of the emulated nodes' GPUs (node1's GPU 0 is the machine's 4, say)
        gang = Gang(tuple(replace(r, gpus=tuple(self._offsets.get(r.node, 0) + g for g in r.gpus)) for r in ranks))
        info = spec.job if spec.job.submit_host else replace(spec.job, submit_host=socket.gethostname())
        # An allow-list, never the plane's own environment (backends/local/login_env.py): its secrets stay its own.
        inherited = login_env(*((spec.owner.uid, spec.owner.user) if spec.owner is not None else ()))
        if spec.batch:  # the script once, on the first node, with the allocation's environment
            first = _first_node(spec)
            on_first = [r for r in ranks if r.node == first]
            devices: dict[str, list[str]] = {r.node: [] for r in ranks}
            for r in ranks:
                devices[r.node] += [d.path for d in self._rank_devices(r)]
            batch.prepare(att.run_dir, spec, gang, self._master_addr, port, devices, socket.gethostname(),
                                self.job_python, self._node_list)
            path = spec.env.get("PATH", inherited.get("PATH", ""))
            env = {**inherited, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **spec.env,
                   **batch.batch_env(gang, replace(spec, job=info), att.run_dir, self._master_addr, port, path),
                   **spec.dataset_paths.get(first, {})}
            gpus_of_first = tuple(g for r in on_first for g in r.gpus)
            devices_of_first = [d.path for r in on_first for d in self._rank_devices(r)]
            starts = [(RankPlacement(0, first, gpus_of_first), env, devices_of_first)]
            prefix = str(batch.bin_dir(att.run_dir))
        else:
            starts, prefix = [], ""
            for rl in ranks:
                env = {**inherited, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", **spec.env}
                env.update(rank_env(gang, rl.rank, job_id=spec.job_id, attempt=spec.attempt,
                                    checkpoint_dir=spec.checkpoint_dir, master_addr=self._master_addr,
                                    master_port=port, workdir=spec.workdir, info=info, parts=EnvPart.ALL))
                env.update(spec.dataset_paths.get(rl.node, {}))  # the copies on its own node
                starts.append((rl, env, [d.path for d in self._rank_devices(rl)]))
        for rl, env, devices_of_rank in starts:
            if spec.owner is not None:  # the account's own, over anything the submitter exported
                env.update(account_env(spec.owner.uid, spec.owner.user))
            env.update(_limits_env(spec, devices_of_rank))
            plan = plans.get(str(rl.rank)) or {}
            if plan.get("container"):  # the image's environment first, then these (`contain.oci_spec`)
                own = self._rank_devices(rl) if not spec.batch else \
                    [d for r in spec.ranks if r.node == rl.node for d in self._rank_devices(r)]
                container.write_bundle(plan["container"], spec, images[rl.node], env, plan.get("tmp") or {}, own,
                                       prefix, datasets=sorted(spec.dataset_paths.get(rl.node, {}).values()))
            gpus = ",".join(map(str, rl.gpus)) or "none"
            paths = [jd.rank_log(rl.rank)] + ([jd.rank_err(rl.rank)] if spec.stderr_apart else [])
            with ExitStack() as files:  # the owner's files in the plane's logs/: through no link, no FIFO
                logs = [files.enter_context(jobfs.Tree(jd.root).open_append(p)) for p in paths]
                for log in logs:
                    if spec.owner is not None:  # the job writes its own log (as the owner) through it
                        made_here = os.fstat(log.fileno()).st_gid == os.getegid()  # else: the job dir's (team's) group
                        os.fchown(log.fileno(), spec.owner.uid, spec.owner.gid if made_here else -1)
                    log.write(f"=== trainyard: attempt {spec.attempt} started {now} on {rl.node} gpus {gpus} ===\n"
                              .encode())
                    log.flush()
                att.procs[rl.rank] = subprocess.Popen(
                    [sys.executable, "-I", "-S", str(RUNNER), str(att.run_dir), str(rl.rank), "--", *spec.command],
                    cwd="/",  # the runner enters the workdir as the owner (attempt.json's "workdir")
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=logs[0],
                    stderr=logs[1] if spec.stderr_apart else subprocess.STDOUT,  # -e/--error: apart
                    start_new_session=True,
                )

    def _await_runners(self, att: _Attempt) -> None:
        """Wait until every runner has executed its command (or reported why it could not)."""
        deadline = time.monotonic() + self._launch_timeout_s
        waiting = set(att.procs)
        where = f"job {att.job_id} attempt {att.attempt}"
        while waiting:
            for r in sorted(waiting):
                rec = jobfs.read_record(att.run_dir / f"rank-{r}.json")
                if rec is None and att.procs[r].poll() is not None:
                    rec = jobfs.read_record(att.run_dir / f"rank-{r}.json")  # it may have written, then exited
                    if rec is None:
                        raise BackendError(
                            f"{where}: rank {r}: runner exited ({att.procs[r].returncode}) before starting the command"
                        )
                if rec is not None:
                    if rec.get("error"):
                        raise BackendError(f"{where}: rank {r}: {rec['error']}")
                    waiting.discard(r)
            if waiting:
                if time.monotonic() > deadline:
                    raise BackendError(f"{where}: ranks {sorted(waiting)} did not start in {self._launch_timeout_s}s")
                time.sleep(0.005)

    def _abort(self, att: _Attempt) -> None:
        """SIGKILL every process of the attempt (its cell first, then the runners' groups), reap
        our runners, wait for the rest; once the cell is empty remove it and the run state. A
        cell that will not empty (a process in uninterruptible sleep) keeps its run state and is
        retried on every poll."""
        recs = [jobfs.read_record(att.run_dir / f"rank-{r}.json") for r in range(att.world_size)]
        left: set[int] = set()
        if att.cell is not None:
            left = contain_ops.kill(att.cell, _runner_pids([rec for rec in recs if rec]), timeout_s=10)
        for r, rec in enumerate(recs):
            proc = att.procs.get(r)
            if proc is not None and proc.poll() is None:
                _killpg(proc.pid, _signal.SIGKILL)  # our child, so its pid cannot have been recycled
            elif rec is not None and _group_is_ours(rec):
                _killpg(rec["pgid"], _signal.SIGKILL)
        for proc in att.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        att.procs.clear()
        # runc's state and the cgroups it made, of a container whose runner could not delete it
        container.delete_all((jobfs.read_record(att.run_dir / "attempt.json") or {}).get("contain") or {})
        deadline = time.monotonic() + 5
        live = [rec for rec in recs if rec is not None]
        while live and time.monotonic() < deadline:
            live = [rec for rec in live if _group_is_ours(rec) and _group_has_live_member(rec)]
            if live:
                time.sleep(0.01)
        if att.cell is not None:
            left = contain_ops.kill(att.cell, [], timeout_s=1) if left else left
            busy = contain_ops.remove(att.cell) if not left else ["(populated)"]
            if left or busy:
                log.error("job %s attempt %s: its cell is not empty (pids %s) or not removable (%s); retrying",
                          att.job_id, att.attempt, sorted(left), ", ".join(busy))
                self._stuck[(att.job_id, att.attempt)] = att
                return
        self._remove_run_dir(att)

    def _keys_on_disk(self) -> set[str]:
        """The cell key of every attempt with a run dir, also one being launched right now by
        another process on this data dir (its run dir is made before its cell)."""
        keys = set()
        for run_dir in JobDir.attempt_runs(self._data_dir):
            meta = jobfs.read_record(run_dir / "attempt.json") or {}
            try:  # the job dir is named <id> or <id>-<key>
                job = int(meta.get("job_id") or run_dir.parent.parent.name.split("-", 1)[0])
                keys.add(contain.attempt_key(job, int(meta.get("attempt") or run_dir.name.split("-", 1)[1])))
            except ValueError:
                continue
        return keys | {contain.attempt_key(j, a) for j, a in self._attempts}

    def _retry_stuck(self) -> None:
        for key, att in list(self._stuck.items()):
            assert att.cell is not None
            if not contain_ops.kill(att.cell, [], timeout_s=0.2) and not contain_ops.remove(att.cell):
                del self._stuck[key]
                self._remove_run_dir(att)
                log.info("job %s attempt %s: its cell is empty and removed at last", *key)

    def _remove_run_dir(self, att: _Attempt) -> None:
        """The attempt is over and its cell empty: its private /tmp and run state go."""
        left = self._tmp.release(contain.attempt_key(att.job_id, att.attempt))
        if left:
            log.error("job %s attempt %s: private tmp not removed: %s", att.job_id, att.attempt, ", ".join(left))
        runs = jobfs.Tree(att.run_dir.parent)  # the plane's `run/`: what a rank left inside is never followed
        runs.remove_tree(att.run_dir.name)
        self._contain.driver.close()  # our base cgroup directories, once no attempt is left there
        jobfs.Tree(att.run_dir.parents[1]).rmdir("run")  # `run/` itself, once no attempt is left in it

    # -- facts ----------------------------------------------------------------------------------

    def _rank_state(self, att: _Attempt, r: int, dead_nodes: frozenset[str] | set[str] = frozenset()) -> RankState:
        state_path, exit_path = att.run_dir / f"rank-{r}.json", att.run_dir / f"rank-{r}.exit"
        rec = jobfs.read_record(state_path)
        pid = rec["pid"] if rec else None
        proc = att.procs.get(r)
        # Its node died under it: lost, whatever the runner or a watcher managed to record. A rank
        # on a dead node with no exit record but no `.lost` yet is one `kill_node` is getting to.
        if jobfs.record_exists(att.run_dir / f"rank-{r}.lost") or (att.nodes.get(r) in dead_nodes
                                                                   and not jobfs.record_exists(exit_path)):
            if proc is not None and proc.poll() is not None:
                del att.procs[r]  # reaped; no exit record is written for it
            return RankState(r, pid, running=False, exit_code=None, signal=None, lost=True)
        if proc is not None:
            rc = proc.poll()
            if rc is None:
                ex = jobfs.read_record(exit_path)
                if ex is None:
                    return RankState(r, proc.pid, running=True, exit_code=None, signal=None, stopped=_stopped(rec))
                try:  # the runner has recorded the exit and is leaving: reap it now
                    proc.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    return _exited(r, proc.pid, ex)
            del att.procs[r]
            rc = proc.returncode
            if rc is not None and rc < 0 and jobfs.read_record(exit_path) is None:
                # The runner itself was killed (SIGKILL of the group): we watched it happen, so
                # record the fact for whoever polls after us instead of leaving it "lost".
                jobfs.write_record(exit_path, {"exit_code": None, "signal": -rc, "observed_by": "backend"})
        ex = jobfs.read_record(exit_path)
        if ex is not None:
            return _exited(r, pid, ex)
        if rec is None:
            return RankState(r, None, running=False, exit_code=None, signal=None, lost=True)
        if procfs.is_alive(rec["pid"], rec["start_time"]):
            return RankState(r, pid, running=True, exit_code=None, signal=None, stopped=_stopped(rec))
        ex = jobfs.read_record(exit_path)  # it may have finished between the two reads
        if ex is not None:
            return _exited(r, pid, ex)
        return RankState(r, pid, running=False, exit_code=None, signal=None, lost=True)

    def _discover(self) -> None:
        """Re-attach to attempts left by an earlier owner: their run state is all on disk."""
        for run_dir in JobDir.attempt_runs(self._data_dir):
            meta = jobfs.read_record(run_dir / "attempt.json")
            ranks = _rank_records(jobfs.Tree(run_dir.parents[1]), run_dir)
            try:
                job_id = int(meta["job_id"]) if meta else int(run_dir.parent.parent.name)
                attempt = int(meta["attempt"]) if meta else int(run_dir.name.split("-", 1)[1])
            except (KeyError, ValueError):
                continue
            if meta is None and not ranks:
                continue  # the owner died before anything was started
            world = int(meta["world_size"]) if meta else max(ranks) + 1
            nodes = {int(r["rank"]): str(r["node"]) for r in meta.get("ranks", [])} if meta else {}
            cell = meta.get("cell") if meta else None
            self._attempts[(job_id, attempt)] = _Attempt(job_id, attempt, run_dir, world, nodes=nodes, cell=cell)


# -- helpers ------------------------------------------------------------------------------------


def _rank_records(tree: jobfs.Tree, run_dir: Path) -> list[int]:
    """The ranks with a `rank-<r>.json` in `run_dir` (listed through no link)."""
    names = (n.removeprefix("rank-").removesuffix(".json") for n, _ in tree.list_dir(run_dir)
             if n.startswith("rank-") and n.endswith(".json"))
    return sorted(int(r) for r in names if r.isascii() and r.isdigit())


def detect_local_nodes(nodes: int = 1, gpus_per_node: int | None = None) -> list[NodeInfo]:
    """Nodes named node0, node1, ...: slices of this machine's GPUs (NVML), else emulated ones.

    With real GPUs, `gpus_per_node` defaults to an even split and must fit the machine; emulated
    nodes get 4 GPUs each by default ("emulated", 16384 MiB), so the scheduler sees a plausible
    cluster on a laptop.

    Raises:
        ValueError: `nodes` < 1, or the requested split does not fit the real GPUs.
    """
    if nodes < 1:
        raise ValueError(f"nodes must be >= 1, got {nodes}")
    gpus = _nvml_gpus()
    if not gpus:
        per = 4 if gpus_per_node is None else gpus_per_node
        return [NodeInfo(f"node{i}", per, EMULATED_MODEL, 16384) for i in range(nodes)]
    per = len(gpus) // nodes if gpus_per_node is None else gpus_per_node
    if per < 1 or per * nodes > len(gpus):
        raise ValueError(f"{nodes} nodes x {per} GPUs do not fit this machine's {len(gpus)} GPUs")
    out = []
    for i in range(nodes):
        mine = gpus[i * per : (i + 1) * per]
        out.append(NodeInfo(f"node{i}", per, mine[0][0], min(m for _, m in mine)))
    return out


def _create(data_dir: Path, nodes: list[NodeInfo], options: registry.Options) -> LocalBackend:
    return LocalBackend(data_dir, nodes, containment=options.get("containment"),
                        private_tmp_mode=options.get("private_tmp"),
                        job_python=options.get("job_python"))


def _discover_nodes(data_dir: Path, options: registry.Options) -> list[NodeInfo]:
    return detect_local_nodes(int(options.get("nodes") or 1), options.get("gpus_per_node"))


registry.register(registry.BackendKind(
    "local", "processes on this machine, which may play several nodes", _create, _discover_nodes,
    options=frozenset({"nodes", "gpus_per_node", "containment", "private_tmp", "job_python"}),
    node_options=frozenset({"nodes"})))


def _nvml_gpus() -> list[tuple[str, int]]:
    """(model, memory MiB) of each GPU NVML sees, in NVML index order; [] when NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver, no GPU: all mean "emulate"
        return []
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else name
            out.append((name, int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20))
        return out
    except Exception:
        return []
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _default_offsets(nodes: list[NodeInfo]) -> dict[str, int]:
    offsets, nxt = {}, 0
    for n in nodes:
        if n.gpu_model == EMULATED_MODEL:
            offsets[n.name] = 0
        else:
            offsets[n.name] = nxt
            nxt += n.gpus
    return offsets


def _limits_env(spec: LaunchSpec, devices: list[str]) -> dict[str, str]:
    """Slurm's variables for the limits asked (as sbatch sets them) and the rank's GPU device files."""
    out = {}
    if spec.limits.cpus_per_task is not None:
        out["SLURM_CPUS_PER_TASK"] = str(spec.limits.cpus_per_task)
    if spec.limits.mem_mib is not None:
        out["SLURM_MEM_PER_NODE"] = str(spec.limits.mem_mib)
    if spec.limits.mem_per_gpu_mib is not None:
        out["SLURM_MEM_PER_GPU"] = str(spec.limits.mem_per_gpu_mib)
    if devices:
        out[JobVar.GPU_DEVICES] = ",".join(devices)
    return out


def _first_node(spec: LaunchSpec) -> str:
    """Where a batch script runs: the node of rank 0 (Slurm's first node of the allocation)."""
    return min(spec.ranks, key=lambda r: r.rank).node


def _attempt_record(spec: LaunchSpec, cell: dict) -> dict:
    if spec.batch:  # one rank, the script, holding the first node's GPUs (`local.batch`)
        first = _first_node(spec)
        ranks = [{"rank": 0, "node": first, "gpus": [g for r in spec.ranks if r.node == first for g in r.gpus]}]
    else:
        ranks = [{"rank": r.rank, "node": r.node, "gpus": list(r.gpus)} for r in spec.ranks]
    return {
        "job_id": spec.job_id,
        "attempt": spec.attempt,
        "world_size": len(ranks),
        "ranks": ranks,
        "batch": spec.batch,
        "allocation": [{"rank": r.rank, "node": r.node, "gpus": list(r.gpus)} for r in spec.ranks],
        "command": list(spec.command),
        "workdir": spec.workdir,
        "started_at": datetime.now(timezone.utc).isoformat(),
        "cell": {k: v for k, v in cell.items() if k != "ranks"},  # see backends.contain
        "contain": cell["ranks"],  # each rank's plan: the cgroups its command joins (rank_runner.py)
        "owner": None if spec.owner is None else {
            "user": spec.owner.user, "uid": spec.owner.uid, "gid": spec.owner.gid,
            "groups": list(spec.owner.groups) or [spec.owner.gid]},
    }


def _exited(rank: int, pid: int | None, ex: dict) -> RankState:
    pids = ex.get("pids_max")
    return RankState(rank, pid, running=False, exit_code=ex.get("exit_code"), signal=ex.get("signal"),
                     oom_killed=bool(ex.get("oom_killed")), pids_max_hit=bool(ex.get("pids_max_hit")),
                     pids_max=pids if isinstance(pids, int) else None)


def _runner_pids(recs: list[dict]) -> list[int]:
    """The runners of these records that are still the very processes recorded (not recycled)."""
    return [rec["pid"] for rec in recs if procfs.is_alive(rec["pid"], rec["start_time"])]


def _stopped(rec: dict | None) -> bool:
    """Is the rank's command (or, once it is gone, its runner) stopped (/proc state T)?"""
    if rec is None:
        return False
    for pid in (rec.get("child_pid"), rec["pid"]):
        st = procfs.read_stat(pid) if pid else None
        if st is not None and st.pgrp == rec["pgid"] and not st.exited:
            return st.state in ("T", "t")
    return False


def _all_stopped(rec: dict) -> bool:
    """Are the runner and its command both stopped, or gone?"""
    for pid in (rec.get("child_pid"), rec["pid"]):
        st = procfs.read_stat(pid) if pid else None
        if st is not None and st.pgrp == rec["pgid"] and not st.exited and st.state not in ("T", "t"):
            return False
    return True


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _group_is_ours(rec: dict) -> bool:
    """Is the process group recorded in `rec` still the rank's group (not a recycled id)?

    The leader alive (or a zombie) with the recorded start time: yes. The leader pid taken by
    another process: no (Linux does not reuse a pid while its group has members, so ours is empty).
    The leader gone: yes if members of the group remain (the command outlived its runner).
    """
    st = procfs.read_stat(rec["pid"])
    if st is not None:
        return st.start_time == rec["start_time"]
    return bool(procfs.group_members(rec["pgid"], rec["start_time"]))


def _group_has_live_member(rec: dict) -> bool:
    return procfs.is_alive(rec["pid"], rec["start_time"]) or bool(
        procfs.group_members(rec["pgid"], rec["start_time"])
    )


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
