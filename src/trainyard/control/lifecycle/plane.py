"""The control plane as one object: data dir, store, configuration, backend and loop, wired.

`ControlPlane` is what `yard up` runs and what end-to-end tests start in-process, assembled by
`build_plane(PlaneSettings(...))` (control/lifecycle/plane_builder.py). On first start that stores a
configuration (the one given, or a default built from the backend's nodes: for the local backend
NVML's GPUs or 4 emulated ones, for Slurm its nodes; one `default` team, the example's three
classes) and creates the admin token in `DATA_DIR/admin.token` (mode 0600; the store keeps its
hash only). The plane itself wires the loop and its neighbours to those parts, and is what the
API's services see through `services.plane_facade.Plane`.

Data dir layout (modes: `control/lifecycle/plane_files.py`, `control/jobfiles/ownership.py`):
    trainyard.db            the SQLite store (unless --db points at PostgreSQL), 0600
    admin.token             the first admin token, 0600
    server.json             where the running server listens (the CLI's default YARD_URL), 0600
    store-seen.json         the store's id and newest job id, as last seen (control/lifecycle/store_audit.py)
    jobs/<id>-<key>/        one directory per job (contracts.JobDir): logs/rank-<r>.log, checkpoints/,
                            metrics/, script.sh; `jobs/<id>/` for jobs stored before directory keys;
                            its owner's and team's only (0750). `jobs/` may link to (or be a mount
                            of) another file system: `--jobs-dir`, control/lifecycle/plane_files.py
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy.orm import Session

from trainyard.backends.base import Backend, BackendError, NothingListens, Terminal, Tunnel
from trainyard.control.lifecycle import plane_files, store_audit
from trainyard.control.reports import priority as engine_order
from trainyard.control.lifecycle import notify
from trainyard.control.lifecycle.dataset_admin import DatasetAdmin
from trainyard.control.lifecycle.image_admin import ImageAdmin
from trainyard.control.lifecycle.liveness import Liveness
from trainyard.control.lifecycle.notify import Notifier
from trainyard.control.loop.orchestrator import ControlLoop, LoopParams
from trainyard.control.lifecycle.checkpoint_tiers import CheckpointTiers
from trainyard.control.lifecycle.retention import Retention
from trainyard.control.lifecycle.storage import StorageMeter
from trainyard.control.lifecycle.supervise import Supervised
from trainyard.control.lifecycle.telemetry import Telemetry
from trainyard.images.types import EntryInfo
from trainyard.services import dataset_nodes, datasets, images, notices
from trainyard.services.config import ConfigCache, ConfigVersion
from trainyard.services.errors import BadGateway, Conflict, NotFound
from trainyard.services.events import record
from trainyard.services.plane_facade import API_THREADS, REQUESTS_PER_THREAD
from trainyard.services.priority_report import PriorityReport, ShareReport
from trainyard.services.sessions import Sessions
from trainyard.staging.types import DatasetEntry, DatasetRef
from trainyard.spec.models import ConfigSpec
from trainyard.store.db import Store
from trainyard.states import JobState
from trainyard.store.models import JobRow

log = logging.getLogger("trainyard.plane")

LAUNCH_WAIT_S = 10.0  # how long a terminal waits for an attempt the store runs and the backend not yet


@dataclass(frozen=True)
class PlaneParts:
    """What `control/lifecycle/plane_builder.py` opened, stored and checked for a plane, and how it runs.

    `store` serves the API (its pool sized for `api_threads`), `loop_store` the loop and its
    neighbours; `admin_token`, `audit` (work on disk the store does not know), `policy_change`
    (`config.set_policy`'s answer to `--policy`) and `notes` (who jobs run as) are what the start
    found, for `yard up` to say. `clock`: the time the API stamps user actions with, and the loop
    judges by."""

    data_dir: Path
    store: Store
    loop_store: Store
    configs: ConfigCache
    backend: Backend
    admin_token: str | None  # None: made on an earlier start
    audit: list[store_audit.Finding]
    policy_change: tuple[int, bool] | None
    notes: list[str]
    loop_params: LoopParams | None = None
    api_url: str | None = None
    clock: Callable[[], float] = time.time
    api_threads: int = API_THREADS


class ControlPlane:
    """The running plane; it implements `services.plane_facade.Plane`, what the API's services use."""

    def __init__(self, parts: PlaneParts):
        self.data_dir, self.store, self.loop_store = parts.data_dir, parts.store, parts.loop_store
        self.configs, self.backend, self.clock = parts.configs, parts.backend, parts.clock
        self.admin_token, self.audit, self.policy_change = parts.admin_token, parts.audit, parts.policy_change
        self.notes, self.api_url, self.api_threads = parts.notes, parts.api_url, parts.api_threads
        self.api_max_requests = REQUESTS_PER_THREAD * parts.api_threads  # then 503 (api/admission.py)
        self.lock = threading.RLock()
        clock = parts.clock
        # job dirs' bytes per team against their quotas, and the disk reserve, beside the loop
        self.storage = StorageMeter(self.loop_store, self.configs, self.lock, self.data_dir, clock=clock,
                                    wake=lambda: self.loop.wake())
        # terminals and forwarded ports attached to each job (services/sessions.py), which the
        # loop's interactive step reads
        self.sessions = Sessions(clock)
        self.loop = ControlLoop(self.loop_store, self.backend, self.data_dir, self.configs, self.lock,
                                params=parts.loop_params, api_url=parts.api_url, clock=clock,
                                holds=self.storage.holds, sessions=self.sessions)
        self.liveness = Liveness(self.store, self.data_dir, self.loop, threads=lambda: self.threads)
        # finished jobs past the configured retention, purged in batches beside the loop
        self.retention = Retention(self.loop_store, self.configs, self.lock, self.data_dir, clock=clock)
        # checkpoints kept where the lifecycle rules say: archived, verified, deleted (issue 41)
        self.checkpoint_tiers = CheckpointTiers(self.loop_store, self.configs, self.lock, self.data_dir, clock=clock)
        # every node's GPUs sampled and kept per job (issue 39, `telemetry:`)
        self.telemetry = Telemetry(self.loop_store, self.configs, self.lock, self.backend, self.data_dir, clock=clock)
        self.loop.ctx.flush_telemetry = self.telemetry.flush_attempt  # an ended attempt's last readings, then its ledger
        # --mail-type's webhook: notes handed over after each commit, sent by a thread of its own
        self.notifier = Notifier(self._notify_settings, self._class_limit, self._cluster_name, clock=clock)
        self._detach = [notices.attach(st.session, self.notifier.put) for st in (self.store, self.loop_store)]
        # `yard image pull|ls|rm` (control/lifecycle/image_admin.py), outside the lock
        self.images = ImageAdmin(self.backend, lambda: images.registry_access(self._current_spec()))
        # `yard dataset stage` (control/lifecycle/dataset_admin.py), outside the lock while the nodes copy
        self.datasets = DatasetAdmin(self.backend, lambda: datasets.source_access(self._current_spec()),
                                     self._record_datasets)

    def start(self) -> None:
        for note in self.notes:  # in the plane's log too, not only on `yard up`'s terminal
            log.info("identity: %s", note)
        with self.loop_store.session() as s:
            running = notify.running_notes(s, self.clock())
        self.notifier.start(running)
        self.storage.start(self._thread_died)  # first: the loop's first pass holds what was over
        self.loop.start(on_thread_death=self._thread_died)
        self.retention.start(self._thread_died)
        self.checkpoint_tiers.start(self._thread_died)
        self.telemetry.start(self._thread_died)

    def stop(self) -> None:
        """Stop the loop and close; running jobs keep running and are re-attached on the next start."""
        self.liveness.shutting_down = True
        self.loop.stop()
        self.retention.stop()
        self.checkpoint_tiers.stop()
        self.telemetry.stop()
        self.storage.stop()
        self.notifier.stop()
        for detach in self._detach:
            detach()
        self.backend.close()
        self.store.close()
        self.loop_store.close()

    def _current_spec(self):  # noqa: ANN202 - a ConfigSpec
        with self.loop_store.session() as s:
            return self.configs.current(s).spec

    def _notify_settings(self):  # noqa: ANN202 - NotifySpec | None
        return self._current_spec().notify

    def _class_limit(self, name: str) -> float | None:
        return next((c.max_run_time for c in self._current_spec().classes if c.name == name), None)

    def _cluster_name(self) -> str:
        return self._current_spec().cluster.name

    @property
    def threads(self) -> list[Supervised]:
        """Every supervised background thread of the plane: what /healthz and the metrics watch."""
        return [*self.loop.threads, *(t for t in (self.retention.thread, self.storage.thread, self.telemetry.thread,
                                                         self.checkpoint_tiers.thread) if t is not None)]

    def _thread_died(self, name: str, error: BaseException) -> None:
        """A supervised thread died and is being restarted: an event says so (the metrics count it)."""
        with self.lock, self.loop_store.session.begin() as s:
            record(s, "plane", "thread.restarted", f"thread {name} died ({type(error).__name__}: {error}); restarted",
                   data={"thread": name, "error": f"{type(error).__name__}: {error}"})

    # -- what the API's services ask of the plane (services/plane_facade.py) ------------------------

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """The plane's lock, then one store transaction, committed on a clean exit."""
        with self.lock, self.store.session.begin() as s:
            yield s

    def wake(self) -> None:
        self.loop.wake()

    @property
    def containment(self) -> str:
        return str(getattr(self.backend, "containment", self.backend.name))

    @property
    def shutting_down(self) -> bool:
        return self.liveness.shutting_down

    def job_disk(self, name: str) -> dict[str, Any] | None:
        return self.storage.job(name)

    def storage_report(self, spec: ConfigSpec, jobs: int = 0) -> dict[str, Any]:
        return self.storage.report(spec, jobs)

    def storage_dirs(self) -> list[dict[str, Any]]:
        return [{"job_id": d.job_id, "team": d.team, "bytes": d.bytes, "apparent_bytes": d.apparent,
                 "kinds": dict(d.kinds)} for d in self.storage.dirs()]

    def storage_refresh(self) -> None:
        self.storage.refresh()

    def health(self) -> tuple[bool, dict[str, Any]]:
        rep = self.liveness.report()
        return rep.ok, rep.to_dict()

    def ready(self) -> tuple[bool, str]:
        c = self.liveness.ready()
        return c.ok, c.detail

    def share(self, s: Session, cfg: ConfigVersion, now: float) -> ShareReport:
        return engine_order.share(s, cfg, now)

    def priority(self, s: Session, cfg: ConfigVersion, now: float, job_ids: tuple[int, ...] = ()) -> PriorityReport:
        return engine_order.priority(s, cfg, now, job_ids)

    def pull_image(self, image: str, nodes: list[str]) -> dict[str, Any]:
        return self.images.pull(image, nodes)

    def image_entries(self, nodes: list[str]) -> list[EntryInfo]:
        return self.images.entries(nodes)

    def remove_image(self, target: str, nodes: list[str]) -> list[dict[str, Any]]:
        return self.images.remove(target, nodes)

    def stage_dataset(self, ref: DatasetRef, nodes: list[str]) -> dict[str, Any]:
        return self.datasets.stage(ref, nodes)

    def _record_datasets(self, found: dict[str, list[DatasetEntry]]) -> None:
        with self.transaction() as s:
            for node, entries in found.items():
                dataset_nodes.record_entries(s, node, entries, self.clock())

    def open_terminal(self, job_id: int, rank: int, argv: list[str], rows: int, cols: int, *,
                      session: bool = False) -> Terminal:
        """`argv` in rank `rank` of the job's current attempt, on a new pseudo-terminal (the
        backend's `open_terminal`); a rank the backend does not run is a Conflict, not a crash
        (see `_in_launched`)."""
        return self._in_launched(job_id, lambda attempt: self.backend.open_terminal(
            job_id, attempt, rank, argv, rows=rows, cols=cols, session=session))

    def open_port(self, job_id: int, rank: int, port: int) -> Tunnel:
        """A connection to `port` in rank `rank` of the job's current attempt (the backend's
        `open_port`); a rank the backend does not run is a Conflict (see `_in_launched`), nothing
        listening on the port there a BadGateway (field "port": the job's server, not the job, is
        missing)."""
        try:
            return self._in_launched(job_id, lambda attempt: self.backend.open_port(job_id, attempt, rank, port))
        except NothingListens as e:
            raise BadGateway(str(e), field="port") from None

    def _in_launched(self, job_id: int, do: Callable[[int], Any]) -> Any:
        """`do(attempt)` for the job's current attempt; its BackendError a Conflict.

        The store says RUNNING from the commit that starts an attempt, and the loop launches it
        after that commit (on Slurm: sbatch, then the ranks start, seconds): an attempt the
        backend does not know yet, of a job still RUNNING, is waited for (up to `LAUNCH_WAIT_S`),
        so `yard alloc` opening its session, or `yard port-forward` its first connection, the
        moment the job is RUNNING gets it rather than a 409."""
        deadline = time.monotonic() + LAUNCH_WAIT_S
        while True:
            with self.store.session() as s:
                row = s.get(JobRow, job_id)
                if row is None:
                    raise NotFound(f"no job {job_id}")
                attempt, running = row.attempt, row.state == JobState.RUNNING
            try:
                return do(attempt)
            except NothingListens:
                raise
            except BackendError as e:
                launching = running and not any(a.job_id == job_id and a.attempt == attempt
                                                for a in self.backend.poll())
                if not launching or time.monotonic() > deadline:
                    raise Conflict(str(e)) from None
            time.sleep(0.05)

    def write_server_file(self, url: str) -> None:
        self.api_url = self.loop.api_url = url
        # Atomically (the CLI and tests poll for this file and must never read half of it), 0600.
        plane_files.write_private(self.data_dir / "server.json", json.dumps({"url": url, "pid": os.getpid()}))

    def remove_server_file(self) -> None:
        try:
            (self.data_dir / "server.json").unlink()  # plane's own: its data dir
        except FileNotFoundError:
            pass
