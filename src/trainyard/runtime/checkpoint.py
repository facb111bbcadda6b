"""Checkpoints: sharded, optionally asynchronous, committed atomically, validated on load.

Layout (`contracts.py` is the contract; the control loop reads only the marker):

    <checkpoint dir>/
      step-1000/
        .metadata          torch.distributed.checkpoint (DCP) metadata, written by rank 0
        __0_0.distcp       model and optimizer shards, one file per rank (DCP)
        __1_0.distcp
        rank-0.pt          rank 0's own state: RNG states, LR schedule, data position, metrics…
        rank-1.pt
        COMMITTED          the commit marker: a JSON manifest, written last, by rank 0
      step-2000/ …
      step-1500.damaged/   a checkpoint that failed validation, set aside (never resumed from)

A `step-<N>/` counts only once `COMMITTED` exists. Rank 0 writes it after every rank's files
are durable (DCP's save returns on rank 0 only after all ranks' writes, each fsync'ed, are
gathered), through a temporary name and `rename`, so a crash at any instant leaves either no
marker or a complete checkpoint. The marker lists every file of the directory with its size.

Model and optimizer go through DCP with `get_state_dict`/`set_state_dict`, so DDP, FSDP2 and a
plain module all save shards under the same fully-qualified names and a checkpoint loads on
another world size (DCP reshards). Everything else (the generators, the LR schedule, the
sampler, the metrics counters, user objects) is small per-rank Python state: one `torch.save`
file per rank, written before the DCP save starts.

Asynchronous save (`save(step)`, the default): the training loop blocks only while the state is
copied to CPU memory ("staging") and the per-rank file is written; DCP writes the shards from a
background thread over its own gloo process group (`Context.checkpoint_group`), and rank 0
commits when they are done. One save is in flight at a time; the next save, `wait()`, and a
synchronous save (preemption) wait for it first. Failures surface at the next `poll()`/`wait()`.

On load, rank 0 validates the committed checkpoints newest first (manifest sizes, DCP metadata,
every shard at least as long as the metadata says) and every rank takes the first one that
validates *and* loads; a damaged one is renamed `step-<N>.damaged` with a warning, and the
previous one is used. Files are read with pickle (DCP's own metadata is pickle too): a checkpoint
directory is trusted like the training code that wrote it.

Retention (rank 0, after each commit): keep the newest `keep_last` and every step that is a
multiple of `keep_every`; others are deleted marker first, so a half-deleted checkpoint is never
mistaken for a complete one. Directories of interrupted saves older than the newest commit go too.
Under the plane's lifecycle rules (`TRAINYARD_CHECKPOINT_RETENTION=plane`, issue 41) no committed
step is deleted here: the plane archives and deletes them (control/lifecycle/checkpoint_tiers.py).

The manifest carries `metrics`: the finite numbers of the last step logged before the save
(`CheckpointManager.metrics`, which `runtime/run.py` keeps), so that `keep_best` can rank steps.

Errors (one hierarchy):

    CheckpointError
    ├── CheckpointSaveError      a save failed (full disk, I/O error); earlier checkpoints intact
    └── NoValidCheckpointError   committed checkpoints exist, but none validates and loads
"""

from __future__ import annotations

import errno
import functools
import json
import os
import shutil
import sys
import threading
import time
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from trainyard.contracts import CHECKPOINT_MARKER, PLANE_RETENTION, JobVar, committed_steps
from trainyard.runtime import rng

# DCP warns on every save/load without a process group even when asked for exactly that.
warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")

FORMAT = 1
RANK_FILE = "rank-{rank}.pt"
DCP_METADATA = ".metadata"
DAMAGED_SUFFIX = ".damaged"
# DCP reports failures as CheckpointException, a BaseException (not an Exception): catch both.
_FAILURES = (Exception, CheckpointException)


class CheckpointError(RuntimeError):
    """Base of the checkpoint errors (see the module docstring)."""


class CheckpointSaveError(CheckpointError):
    """A save failed; the checkpoints committed before it are intact."""


class NoValidCheckpointError(CheckpointError):
    """Committed checkpoints exist, but none validates and loads; resuming from scratch would lose them."""


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _warn(msg: str) -> None:
    """A RuntimeWarning attributed to the first caller outside this package (the training script)."""
    level = 2  # stacklevel 2 = the caller of _warn
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame = frame.f_back
        level += 1
    warnings.warn(msg, RuntimeWarning, stacklevel=level)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _root_oserror(exc: BaseException) -> OSError | None:
    """The OSError at the bottom of an exception (DCP wraps per-rank failures)."""
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return e
        failures = getattr(e, "failures", None)
        if isinstance(failures, dict):
            for f in failures.values():
                stack.append(f[0] if isinstance(f, tuple) else getattr(f, "exc_value", f))
        stack.append(getattr(e, "exc_value", None))
        stack.append(e.__cause__ if isinstance(e, BaseException) else None)
        stack.append(e.__context__ if isinstance(e, BaseException) else None)
    return None


def _describe_save_failure(path: Path, exc: BaseException, previous: int | None) -> str:
    root = _root_oserror(exc)
    if root is not None and root.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            du = shutil.disk_usage(path.parent)
            space = f"; {du.free / 2**20:.1f} MiB free of {du.total / 2**20:.1f} MiB"
        except OSError:
            space = ""
        cause = f"the disk is full ({os.strerror(root.errno)}{space})"
    elif root is not None:
        cause = f"{os.strerror(root.errno) if root.errno else root} ({type(root).__name__}: {root})"
    else:
        cause = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    kept = (f"the previous checkpoint step-{previous} is intact" if previous is not None
            else "no earlier checkpoint exists")
    return f"checkpoint {path} could not be written: {cause}. The incomplete directory was removed; {kept}."


@dataclass
class _Pending:
    """An asynchronous save in flight."""

    step: int
    path: Path
    future: Future
    started: float
    done: threading.Event
    committed_before: int | None = None  # the last committed step when this save began
    metrics: dict[str, float] | None = None  # the manifest's, as they were when the save began
    error: BaseException | None = None
    committed: bool = False


class CheckpointManager:
    """Saves and restores a training job's whole state under `directory/step-<N>/`.

    Args:
        directory: the checkpoint directory (`TRAINYARD_CHECKPOINT_DIR`).
        model: the module (plain, DDP or FSDP2); saved through DCP.
        optimizer: its optimizer, or None.
        scheduler: LR scheduler (anything with state_dict/load_state_dict), or None.
        sampler: the data position (`ResumableSampler` or any state_dict/load_state_dict object).
        extra: more named state_dict/load_state_dict objects (the metrics counters, …).
        keep_last: committed checkpoints to keep (newest first); at least 1.
        keep_every: also keep every step that is a multiple of this; None: no such exceptions.
        async_save: default mode of `save()`.
        reuse_staging: keep the CPU staging copy between async saves (host memory the size of this
            rank's model and optimizer state, pinned on GPUs) so that a save only copies into it;
            False allocates it at each save and frees it after (slower staging, less memory).
        group: process group for DCP saves (a gloo group; `Context.checkpoint_group`).
        control_group: process group for barriers and agreements (`Context.control_group`).
        seed: base for re-seeding the generators when a run resumes on another world size.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Any = None,
        sampler: Any = None,
        extra: dict[str, Any] | None = None,
        keep_last: int = 3,
        keep_every: int | None = None,
        async_save: bool = True,
        reuse_staging: bool = True,
        group: Any = None,
        control_group: Any = None,
        seed: int = 0,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last={keep_last} must be >= 1")
        if keep_every is not None and keep_every < 1:
            raise ValueError(f"keep_every={keep_every} must be >= 1 or None")
        self.directory = Path(directory)
        self.model = model
        self.optimizer = optimizer
        self.stateful: dict[str, Any] = {}
        if scheduler is not None:
            self.stateful["scheduler"] = scheduler
        if sampler is not None:
            self.stateful["sampler"] = sampler
        for name, obj in (extra or {}).items():
            if name in self.stateful:
                raise ValueError(f"extra state name {name!r} is taken")
            self.stateful[name] = obj
        self.keep_last = keep_last
        self.keep_every = keep_every
        # the plane's rules keep the committed steps (issue 41): none is deleted here
        self.plane_retention = os.environ.get(JobVar.CHECKPOINT_RETENTION) == PLANE_RETENTION
        self.metrics: dict[str, float] = {}  # written into each manifest (runtime/run.py keeps them)
        self.async_save = async_save
        self.reuse_staging = reuse_staging
        self._stager: DefaultStager | None = None
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        if self.distributed and (group is None or control_group is None):
            raise ValueError("in a distributed job pass group= and control_group= (gloo groups; "
                             "trainyard.runtime.init() makes them: Context.checkpoint_group/control_group)")
        self.group = group
        self.control_group = control_group
        self.seed = seed
        self.last_saved_step: int | None = None  # committed, or in flight
        self.last_committed_step: int | None = None
        self.last_committed_time: float | None = None
        self.last_blocking_s: float | None = None  # how long the last save() blocked the caller
        self.last_commit_s: float | None = None  # how long the last save took to commit, start to marker
        self.on_commit: list[Any] = []  # callbacks(step, path, seconds) after each commit (rank 0)
        self._pending: _Pending | None = None
        self._last_async: _Pending | None = None  # settled; named if another rank reports it failed
        found = committed_steps(self.directory)
        if found:
            self.last_committed_step = found[-1][0]

    # -- collectives (no-ops in a single process) --------------------------------------------------

    def _barrier(self) -> None:
        if self.distributed:
            dist.barrier(group=self.control_group)

    def _all_ok(self, ok: bool) -> bool:
        if not self.distributed:
            return ok
        t = torch.tensor([0 if ok else 1], dtype=torch.int32)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.control_group)
        return t.item() == 0

    def _broadcast(self, obj: Any) -> Any:
        if not self.distributed:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.control_group)
        return box[0]

    # -- what goes in ----------------------------------------------------------------------------

    def _dcp_state(self) -> dict[str, Any]:
        if self.model is None:
            return {}
        if self.optimizer is None:
            return {"model": get_model_state_dict(self.model)}
        msd, osd = get_state_dict(self.model, self.optimizer)
        return {"model": msd, "optim": osd}

    def _rank_state(self, step: int) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            "rng": rng.capture(),
            "state": {name: obj.state_dict() for name, obj in self.stateful.items()},
        }

    # -- save --------------------------------------------------------------------------------------

    def step_path(self, step: int) -> Path:
        return self.directory / f"step-{step}"

    def save(self, step: int, *, blocking: bool | None = None) -> None:
        """Checkpoint the state after `step` steps. Collective: every rank calls it at the same step.

        Returns once the state is staged (async) or committed (blocking). Saving a step already
        saved is a no-op.

        Raises:
            CheckpointSaveError: this save failed (blocking, or the per-rank files of an async
                one), or the previous async save failed.
        """
        blocking = (not self.async_save) if blocking is None else blocking
        t0 = time.perf_counter()
        # One save in flight at a time. If the previous one failed, every rank raises here (the
        # agreement is a collective), not just the ranks that noticed.
        previous: CheckpointSaveError | None = None
        try:
            self.wait()
        except CheckpointSaveError as e:
            previous = e
        if not self._all_ok(previous is None):
            raise previous or self.failed_elsewhere()
        if step == self.last_saved_step:
            self.last_blocking_s = time.perf_counter() - t0
            return
        path = self.step_path(step)
        # Rank 0 clears what an interrupted attempt may have left at this step, marker first.
        if self.rank == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            if path.exists():
                self._remove(path)
        self._barrier()
        try:
            path.mkdir(parents=True, exist_ok=True)
            self._write_rank_file(path, step)
            ok, err = True, None
        except _FAILURES as e:  # torch.save turns ENOSPC into a RuntimeError; the cause is kept
            ok, err = False, e
        if not self._all_ok(ok):
            self._discard(path)
            raise CheckpointSaveError(_describe_save_failure(
                path, err or RuntimeError("another rank failed to write its state"), self.last_committed_step)) from err

        state = self._dcp_state()
        if blocking:
            try:
                self._dcp_save(state, path)
            except _FAILURES as e:  # noqa: BLE001 - DCP raises on every rank alike
                self._discard(path)
                raise CheckpointSaveError(_describe_save_failure(path, e, self.last_committed_step)) from e
            self._commit(step, path, t0, dict(self.metrics))
            self.last_saved_step = step
            self.last_blocking_s = time.perf_counter() - t0
            return

        writer = dcp.FileSystemWriter(str(path), sync_files=True)
        if self.reuse_staging and self._stager is None:
            # Staging copies the tensors to CPU memory before the loop goes on (the training step
            # mutates them in place). A stager that lives across saves keeps its buffers, so later
            # saves copy into memory that is already allocated (and pinned on GPUs).
            self._stager = DefaultStager(StagingOptions(
                use_pinned_memory=torch.cuda.is_available(), use_shared_memory=False,
                use_async_staging=False, use_non_blocking_copy=False))
        try:
            res = dcp.async_save(state, storage_writer=writer, process_group=self.group,
                                 no_dist=not self.distributed, async_stager=self._stager)
        except _FAILURES as e:  # staging failed (out of host memory…)
            self._discard(path)
            raise CheckpointSaveError(_describe_save_failure(path, e, self.last_committed_step)) from e
        fut: Future[Any] = res.upload_completion if isinstance(res, AsyncSaveResponse) else res
        pending = _Pending(step=step, path=path, future=fut, started=t0, done=threading.Event(),
                           committed_before=self.last_committed_step, metrics=dict(self.metrics))
        self._pending = pending
        self.last_saved_step = step
        fut.add_done_callback(functools.partial(self._finish_async, pending))
        self.last_blocking_s = time.perf_counter() - t0

    def _write_rank_file(self, path: Path, step: int) -> None:
        target = path / RANK_FILE.format(rank=self.rank)
        with open(target, "wb") as fh:
            torch.save(self._rank_state(step), fh)
            fh.flush()
            os.fsync(fh.fileno())

    def _dcp_save(self, state: dict[str, Any], path: Path) -> None:
        dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path), sync_files=True),
                 process_group=self.group, no_dist=not self.distributed)

    def _finish_async(self, p: _Pending, fut: Future) -> None:
        """In DCP's writer thread: commit (rank 0) or record the failure."""
        try:
            exc = fut.exception()
            if exc is not None:
                p.error = exc
                if self.rank == 0:
                    self._remove(p.path)
                return
            self._commit(p.step, p.path, p.started, p.metrics)
            p.committed = True
        except BaseException as e:  # noqa: BLE001 - recorded, raised in the training thread
            p.error = e
        finally:
            p.done.set()

    def _commit(self, step: int, path: Path, t0: float, metrics: dict[str, float] | None = None) -> None:
        """Rank 0: write the marker (manifest) atomically, then apply retention."""
        if self.rank == 0:
            files = {e.name: e.stat().st_size for e in os.scandir(path)
                     if e.is_file() and not e.name.startswith(CHECKPOINT_MARKER)}
            now = time.time()
            manifest = {
                "format": FORMAT,
                "step": step,
                "world_size": self.world_size,
                "time": now,
                "save_seconds": round(time.perf_counter() - t0, 3),
                "files": files,
                "metrics": metrics or {},
            }
            _fsync_dir(path)
            tmp = path / (CHECKPOINT_MARKER + ".tmp")
            try:
                with open(tmp, "w") as fh:
                    json.dump(manifest, fh)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path / CHECKPOINT_MARKER)
                _fsync_dir(path)
            except OSError as e:
                self._remove(path)
                raise CheckpointSaveError(_describe_save_failure(path, e, self.last_committed_step)) from e
            self.last_committed_step, self.last_committed_time = step, now
            self.last_commit_s = time.perf_counter() - t0
            self._retain()
            for cb in list(self.on_commit):
                try:
                    cb(step, path, time.perf_counter() - t0)
                except Exception as e:  # noqa: BLE001 - a reporting hook must not fail a checkpoint
                    print(f"trainyard.runtime: on_commit hook failed: {e!r}", flush=True)
        else:
            self.last_committed_step, self.last_committed_time = step, time.time()
            self.last_commit_s = time.perf_counter() - t0

    def poll(self) -> int | None:
        """Non-blocking: the step of an async save that has just committed, else None.

        Raises:
            CheckpointSaveError: the async save in flight failed.
        """
        p = self._pending
        if p is None or not p.done.is_set():
            return None
        return self._settle(p)

    @property
    def in_flight(self) -> bool:
        p = self._pending
        return p is not None and not p.done.is_set()

    @property
    def failed(self) -> bool:
        """The async save in flight has failed (not yet raised)."""
        p = self._pending
        return p is not None and p.done.is_set() and p.error is not None

    def wait(self) -> int | None:
        """Block until the async save in flight (if any) is committed; return its step.

        Raises:
            CheckpointSaveError: it failed.
        """
        p = self._pending
        if p is None:
            return None
        p.done.wait()
        return self._settle(p)

    def failed_elsewhere(self) -> CheckpointSaveError:
        """The error for a rank whose part of the last async save went through while another
        rank's did not: the step never committed, so this rank forgets it too, and its log names
        the checkpoint that was lost, as the failing rank's does."""
        p = self._pending or self._last_async
        if p is None:
            return CheckpointSaveError("a checkpoint failed on another rank")
        self._pending = None
        self.last_committed_step = self.last_saved_step = p.committed_before
        return CheckpointSaveError(_describe_save_failure(
            p.path, RuntimeError("another rank failed to write its part"), p.committed_before))

    def _settle(self, p: _Pending) -> int | None:
        self._pending = None
        self._last_async = p
        if p.error is not None:
            self.last_saved_step = self.last_committed_step
            if isinstance(p.error, CheckpointSaveError):
                raise p.error
            raise CheckpointSaveError(_describe_save_failure(p.path, p.error, self.last_committed_step)) from p.error
        return p.step

    def close(self) -> None:
        """Wait for the save in flight (errors are raised) and free the staging memory."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None

    # -- retention -------------------------------------------------------------------------------

    def _keep(self, steps: list[int]) -> set[int]:
        if self.plane_retention:
            return set(steps)
        keep = set(sorted(steps)[-self.keep_last:])
        if self.keep_every:
            keep |= {s for s in steps if s % self.keep_every == 0}
        return keep

    def _retain(self) -> None:
        committed = committed_steps(self.directory)
        if not committed:
            return
        keep = self._keep([s for s, _ in committed])
        newest = committed[-1][0]
        for s, path in committed:
            if s not in keep:
                self._remove(path)
        # Interrupted saves older than the newest commit will never be completed.
        for entry in os.scandir(self.directory):
            name = entry.name
            if entry.is_dir() and name.startswith("step-") and name[5:].isdigit():
                s = int(name[5:])
                if s < newest and not os.path.exists(os.path.join(entry.path, CHECKPOINT_MARKER)):
                    self._remove(Path(entry.path))

    @staticmethod
    def _remove(path: Path) -> None:
        """Delete a checkpoint directory, marker first (never a half-deleted 'complete' one)."""
        try:
            (path / CHECKPOINT_MARKER).unlink(missing_ok=True)
        except OSError:
            pass
        shutil.rmtree(path, ignore_errors=True)

    def _discard(self, path: Path) -> None:
        """After a failed save: rank 0 removes the incomplete directory once everyone is done."""
        try:
            self._barrier()
        finally:
            if self.rank == 0:
                self._remove(path)

    # -- load ------------------------------------------------------------------------------------

    def validate(self, path: str | Path) -> str | None:
        """Why the committed checkpoint at `path` cannot be used, or None if it looks complete.

        Checks the manifest (every file present with its recorded size), the DCP metadata, and
        that every shard is at least as long as the metadata says. Does not read tensor data.
        """
        path = Path(path)
        try:
            manifest = json.loads((path / CHECKPOINT_MARKER).read_text())
        except (OSError, ValueError) as e:
            return f"commit marker unreadable ({e})"
        if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
            return "commit marker is not a trainyard manifest"
        for name, size in manifest["files"].items():
            try:
                actual = os.path.getsize(path / name)
            except OSError:
                return f"{name} is missing"
            if actual != size:
                return f"{name} has {actual} bytes, the manifest says {size}"
        if self.model is not None:
            try:
                md = dcp.FileSystemReader(str(path)).read_metadata()
            except Exception as e:  # noqa: BLE001 - any unreadable metadata is damage
                return f"DCP metadata unreadable ({type(e).__name__}: {e})"
            need: dict[str, int] = {}
            for info in (md.storage_data or {}).values():
                rel = getattr(info, "relative_path", None)
                if rel is not None:
                    need[rel] = max(need.get(rel, 0), int(info.offset) + int(info.length))
            for rel, end in need.items():
                try:
                    actual = os.path.getsize(path / rel)
                except OSError:
                    return f"shard {rel} is missing"
                if actual < end:
                    return f"shard {rel} is truncated ({actual} bytes, needs {end})"
        for r in range(int(manifest.get("world_size", 1))):
            if not (path / RANK_FILE.format(rank=r)).exists():
                return f"{RANK_FILE.format(rank=r)} is missing"
        return None

    def _set_aside(self, step: int, path: Path, reason: str) -> None:
        """Rank 0: rename a damaged checkpoint out of the `step-<N>` namespace, with a warning."""
        _warn(f"checkpoint step-{step} is damaged ({reason}); it is set aside as "
              f"{path.name}{DAMAGED_SUFFIX} and an earlier checkpoint is used")
        target = path.with_name(path.name + DAMAGED_SUFFIX)
        try:
            if target.exists():
                shutil.rmtree(target, ignore_errors=True)
            os.replace(path, target)
        except OSError:
            self._remove(path)

    def load_latest(self) -> int | None:
        """Restore the newest complete checkpoint; return its step, or None when there is none.

        Collective. Damaged checkpoints are skipped with a warning (and set aside); interrupted
        saves (no marker) newer than the one used are reported with a warning.

        Raises:
            NoValidCheckpointError: committed checkpoints exist, none validates and loads.
        """
        self.wait()
        tried: set[int] = set()
        had_any = False
        while True:
            choice = None
            if self.rank == 0:
                committed = committed_steps(self.directory)
                had_any = had_any or bool(committed)
                for step, path in reversed(committed):
                    if step in tried:
                        continue
                    reason = self.validate(path)
                    if reason is None:
                        choice = (step, str(path), self._manifest_world_size(path))
                        break
                    tried.add(step)
                    self._set_aside(step, path, reason)
                if choice is not None:
                    self._warn_interrupted(choice[0])
                elif not had_any:
                    self._warn_interrupted(-1)
            choice, had_any = self._broadcast((choice, had_any))
            if choice is None:
                if had_any:
                    raise NoValidCheckpointError(
                        f"no checkpoint under {self.directory} could be loaded (damaged ones were renamed "
                        f"*{DAMAGED_SUFFIX}); refusing to start from scratch over them")
                return None
            step, path_s, saved_world = choice
            path = Path(path_s)
            error = self._try_load(step, path, saved_world)
            if error is None:
                self.last_saved_step = self.last_committed_step = step
                self.last_committed_time = os.path.getmtime(path / CHECKPOINT_MARKER)
                return step
            tried.add(step)
            if self.rank == 0:
                self._set_aside(step, path, error)
            self._barrier()

    def _manifest_world_size(self, path: Path) -> int:
        return int(json.loads((path / CHECKPOINT_MARKER).read_text()).get("world_size", 1))

    def _warn_interrupted(self, chosen: int) -> None:
        for entry in os.scandir(self.directory) if self.directory.exists() else []:
            name = entry.name
            if entry.is_dir() and name.startswith("step-") and name[5:].isdigit() and int(name[5:]) > chosen:
                if not os.path.exists(os.path.join(entry.path, CHECKPOINT_MARKER)):
                    _warn(f"checkpoint {name} has no commit marker (an interrupted save); ignored")

    def _try_load(self, step: int, path: Path, saved_world: int) -> str | None:
        """Collective load of one checkpoint; the reason it failed (same on every rank), or None."""
        same_world = saved_world == self.world_size
        rank_file = path / RANK_FILE.format(rank=self.rank if same_world else 0)
        reason = None
        try:
            rank_state = torch.load(rank_file, map_location="cpu", weights_only=False)
        except Exception as e:  # noqa: BLE001 - a damaged file of any kind
            rank_state, reason = None, f"{rank_file.name} unreadable ({type(e).__name__}: {e})"
        if not self._all_ok(reason is None):
            return reason or "another rank could not read its state file"

        state = self._dcp_state()
        try:
            if state:
                dcp.load(state, checkpoint_id=str(path), process_group=self.group, no_dist=not self.distributed)
        except _FAILURES as e:  # noqa: BLE001 - DCP raises on every rank alike
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
            reason = f"shards unreadable ({type(e).__name__}: {first_line})"
        if not self._all_ok(reason is None):
            return reason or "another rank could not read its shards"

        # Everything read: apply. From here on a failure is a bug or a mismatch, not damage.
        if self.model is not None and "model" in state:  # (state holds a model's only where there is one)
            if self.optimizer is not None and "optim" in state:
                set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                               optim_state_dict=state["optim"])
            else:
                set_model_state_dict(self.model, state["model"])
        assert rank_state is not None
        for name, obj in self.stateful.items():
            saved = rank_state["state"].get(name)
            if saved is None:
                _warn(f"checkpoint step-{step} has no state for {name!r}; it starts fresh")
                continue
            obj.load_state_dict(saved)
        if same_world:
            rng.restore(rank_state["rng"])
        else:
            if self.rank == 0:
                _warn(f"checkpoint step-{step} was written by {saved_world} ranks, this run has {self.world_size}: "
                      "model, optimizer and data position are restored exactly; random generators are re-seeded "
                      "per rank (dropout masks differ from an uninterrupted run)")
            from trainyard.runtime.startup import seed_everything
            seed_everything(rng.derived_seed(self.seed, self.rank, step))
        return None
