"""The control plane as one object: data dir, store, configuration, backend and loop, wired.

`ControlPlane` is what `yard up` runs and what end-to-end tests start in-process. On first start
it stores a configuration (the one given, or a default built from the backend's nodes: for the
local backend NVML's GPUs or 4 emulated ones, for Slurm its nodes; one `default` team, the
example's three classes) and creates the admin token in
`DATA_DIR/admin.token` (mode 0600; the store keeps its hash only).

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
from pathlib import Path
from typing import Callable

from sqlalchemy import func, select

from trainyard.backends.rundir import job_tools
from trainyard.backends import registry
from trainyard.backends.base import Backend, NodeInfo
from trainyard.control.lifecycle import plane_files, store_audit
from trainyard.control.lifecycle import notify
from trainyard.control.lifecycle.liveness import Liveness
from trainyard.control.lifecycle.notify import Notifier
from trainyard.control.loop.orchestrator import ControlLoop, LoopParams
from trainyard.control.lifecycle.retention import Retention
from trainyard.control.lifecycle.storage import StorageMeter
from trainyard.control.lifecycle.supervise import Supervised
from trainyard.defaults import DEFAULT_PORT, default_data_dir  # noqa: F401 (re-exported)
from trainyard.services import auth, config, config_file, notices, owners
from trainyard.services.auth import Principal
from trainyard.services.events import record
from trainyard.store import identity
from trainyard.store.db import Store, open_store, sqlite_url
from trainyard.store.models import ConfigVersionRow, JobRow

API_THREADS = 16  # the API's worker threads: more only contend for the interpreter on a few cores
REQUESTS_PER_THREAD = 4  # requests in flight per worker thread before the API answers 503
LOOP_POOL = 6  # the loop's own store connections: its pass, the health checks and their workers

log = logging.getLogger("trainyard.plane")

class ControlPlane:
    def __init__(self, data_dir: str | Path, *, db_url: str | None = None, config_text: str | None = None,
                 nodes: int | None = None, gpus_per_node: int | None = None, backend: Backend | None = None,
                 loop_params: LoopParams | None = None, api_url: str | None = None, backend_kind: str = "local",
                 slurm_partition: str | None = None, policy: str | None = None,
                 clock: Callable[[], float] = time.time, api_threads: int = API_THREADS,
                 run_as: str | None = None, allow_root_jobs: bool | None = None,
                 jobs_dir: str | Path | None = None, config_name: str = "the file", config_wins: bool = False,
                 job_python: str | None = None):
        """`policy`: `yard up --policy`, stored as a new configuration version when the one in
        force names another (`config.set_policy`; `policy_change` says what it did). `clock`: the
        loop's time (a `clock.FakeClock` with the fake backend, in tests of the loop's logic).
        `api_threads`: the API's worker threads (api/app.py sets them); the API admits
        REQUESTS_PER_THREAD requests per thread at once and its pool of store connections is sized
        for all of them (on PostgreSQL: 84 connections with the defaults, and 6 for the loop's own
        pool, so that it never waits behind API traffic; keep `max_connections` above that).
        `run_as`, `allow_root_jobs`: `yard up --run-as/--allow-root-jobs`, stored as `policy` is
        (`config.set_identity`). `notes`: what the plane says at start about who jobs run as.
        `jobs_dir`: `yard up --jobs-dir`, job dirs on another file system (`plane_files.use_jobs_dir`;
        raises `plane_files.JobsDirError`). `config_name`, `config_wins`: the `--config` file's name,
        and `--config-wins` (store it even when it would revert live changes: `config_file.check`).
        `job_python`: `yard up --job-python`, over the configuration's; a backend that runs the in-job
        tools (the local one) gets it after `job_tools.check` found every job account can run it
        (raises `job_tools.JobToolsError` otherwise)."""
        self.data_dir = Path(data_dir).resolve()  # plane's own: the operator's --data-dir
        self.data_dir.mkdir(parents=True, exist_ok=True)  # plane's own: the operator's --data-dir
        if jobs_dir is not None:
            plane_files.use_jobs_dir(self.data_dir, Path(jobs_dir))
        self.api_threads = api_threads
        url = db_url or sqlite_url(self.data_dir)
        wal = store_audit.recover_missing_wal(url)  # before opening: a deleted WAL leaves a stale index
        # A request admitted holds one store session from its first query until its response is
        # sent, whether or not a thread works on it, and a caller's lookup takes one more for a
        # moment: size the pool for every admitted request, not only the threads (with 2 per
        # thread, 200 clients exhausted it while the server stopped and requests got 500).
        self.api_max_requests = REQUESTS_PER_THREAD * api_threads  # then 503 (api/admission.py)
        self.store: Store = open_store(url, pool_size=self.api_max_requests + api_threads + 4)
        self.loop_store: Store = open_store(url, pool_size=LOOP_POOL, migrated=True)
        self.lock = threading.RLock()
        self.configs = config.ConfigCache()
        self.api_url = api_url
        self.clock = clock  # the time the API stamps user actions with, and the loop judges by
        # The backend by name (backends.registry): checked before anything is stored, asked for nodes
        # only when no configuration is stored yet, created on the configured nodes.
        kind = registry.get(backend_kind)
        options = {k: v for k, v in (("nodes", nodes), ("gpus_per_node", gpus_per_node), ("partition", slurm_partition))
                   if v is not None and k in kind.options}
        if backend is None:
            kind.check(options)
        # --run-as/--allow-root-jobs go into the text given (or made) here, one version for all.
        ident = {k: v for k, v in (("allow_root_jobs", allow_root_jobs), ("run_as", run_as)) if v is not None}
        flags = "yard up " + " ".join(f"--run-as {v}" if k == "run_as" else "--allow-root-jobs"
                                      for k, v in ident.items() if v)
        yard_up = Principal("yard-up", "admin")
        with self.lock, self.store.session.begin() as s:
            have = s.scalars(select(ConfigVersionRow.version)).first() is not None
            if config_text is not None:
                text, why = config.given_text(config_text, policy)  # with --policy's scheduler.policy
                text, why = config.with_identity(text, why, ident, flags)
                if not config_wins:
                    config_file.check(s, text, config_name)  # never a silent revert of live changes
                config.apply(s, text, yard_up, why)
            elif not have or nodes is not None:
                found = kind.discover(self.data_dir, options)
                topology = {n.name: {k: v for k, v in (("block", n.block), ("rack", n.rack)) if v} for n in found}
                text = config.default_config_text([(n.name, n.gpus, n.gpu_model, n.gpu_mem_mib) for n in found],
                                                  topology=topology)
                text, why = config.with_identity(text, "default configuration of this machine", ident, flags)
                config.apply(s, text, yard_up, why)
            elif ident:
                config.set_identity(s, yard_up, flags, **ident)
            self.policy_change = None if policy is None else config.set_policy(
                s, policy, yard_up, f"yard up --policy {policy}")
            self.admin_token = auth.ensure_admin_token(s, self.data_dir / "admin.token")
            cfg = self.configs.current(s)
            # Work on disk the store does not know (a restored store, a lost WAL, another store's
            # data dir): reported, never reused (control/lifecycle/store_audit.py); `yard up` prints it.
            store_id = identity.ensure_instance_id(s)
            self.audit = store_audit.audit(s, self.data_dir, store_id, wal)
            store_audit.report(s, self.audit, clock())
            store_audit.write_seen(self.data_dir, store_id, s.scalar(select(func.max(JobRow.id))) or 0)
        plane_files.protect(self.data_dir)
        self.notes = owners.notes(cfg.spec)
        inventory = [NodeInfo(n.name, n.gpus, n.gpu_model, n.gpu_mem_mib)
                     for n in cfg.nodes]
        if backend is None and "job_python" in kind.options:  # can job owners run the in-job tools?
            chosen = job_python or cfg.spec.job_python
            job_tools.check(job_tools.resolve(chosen), job_tools.accounts_to_probe(cfg.spec.run_as, cfg.spec.users.values()),
                            configured=chosen is not None)
            options["job_python"] = chosen
        self.backend: Backend = backend or kind.create(self.data_dir, inventory, options)
        # job dirs' bytes per team against their quotas, and the disk reserve, beside the loop
        self.storage = StorageMeter(self.loop_store, self.configs, self.lock, self.data_dir, clock=clock,
                                    wake=lambda: self.loop.wake())
        self.loop = ControlLoop(self.loop_store, self.backend, self.data_dir, self.configs, self.lock,
                                params=loop_params, api_url=api_url, clock=clock, holds=self.storage.holds)
        self.liveness = Liveness(self.store, self.data_dir, self.loop, threads=lambda: self.threads)
        # finished jobs past the configured retention, purged in batches beside the loop
        self.retention = Retention(self.loop_store, self.configs, self.lock, self.data_dir, clock=clock)
        # --mail-type's webhook: notes handed over after each commit, sent by a thread of its own
        self.notifier = Notifier(self._notify_settings, self._class_limit, self._cluster_name, clock=clock)
        self._detach = [notices.attach(st.session, self.notifier.put) for st in (self.store, self.loop_store)]

    def start(self) -> None:
        for note in self.notes:  # in the plane's log too, not only on `yard up`'s terminal
            log.info("identity: %s", note)
        with self.loop_store.session() as s:
            running = notify.running_notes(s, self.clock())
        self.notifier.start(running)
        self.storage.start(self._thread_died)  # first: the loop's first pass holds what was over
        self.loop.start(on_thread_death=self._thread_died)
        self.retention.start(self._thread_died)

    def stop(self) -> None:
        """Stop the loop and close; running jobs keep running and are re-attached on the next start."""
        self.liveness.shutting_down = True
        self.loop.stop()
        self.retention.stop()
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
        return [*self.loop.threads, *(t for t in (self.retention.thread, self.storage.thread) if t is not None)]

    def _thread_died(self, name: str, error: BaseException) -> None:
        """A supervised thread died and is being restarted: an event says so (the metrics count it)."""
        with self.lock, self.loop_store.session.begin() as s:
            record(s, "plane", "thread.restarted", f"thread {name} died ({type(error).__name__}: {error}); restarted",
                   data={"thread": name, "error": f"{type(error).__name__}: {error}"})

    def write_server_file(self, url: str) -> None:
        self.api_url = self.loop.api_url = url
        # Atomically (the CLI and tests poll for this file and must never read half of it), 0600.
        plane_files.write_private(self.data_dir / "server.json", json.dumps({"url": url, "pid": os.getpid()}))

    def remove_server_file(self) -> None:
        try:
            (self.data_dir / "server.json").unlink()  # plane's own: its data dir
        except FileNotFoundError:
            pass
