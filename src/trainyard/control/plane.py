"""The control plane as one object: data dir, store, configuration, backend and loop, wired.

`ControlPlane` is what `yard up` runs and what end-to-end tests start in-process. On first start
it stores a configuration (the one given, or a default built from the backend's nodes: for the
local backend NVML's GPUs or 4 emulated ones, for Slurm its nodes; one `default` team, the
example's three classes) and creates the admin token in
`DATA_DIR/admin.token` (mode 0600; the store keeps its hash only).

Data dir layout:
    trainyard.db            the SQLite store (unless --db points at PostgreSQL)
    admin.token             the first admin token
    server.json             where the running server listens (the CLI's default YARD_URL)
    jobs/<id>/              one directory per job: logs/rank-<r>.log, checkpoints/, metrics/, script.sh
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Callable

from sqlalchemy import select

from trainyard.backends import registry
from trainyard.backends.base import Backend, NodeInfo
from trainyard.control.loop import ControlLoop, LoopParams
from trainyard.defaults import DEFAULT_PORT, default_data_dir  # noqa: F401 (re-exported)
from trainyard.services import auth, config
from trainyard.services.auth import Principal
from trainyard.store.db import Store, open_store, sqlite_url
from trainyard.store.models import ConfigVersionRow

class ControlPlane:
    def __init__(self, data_dir: str | Path, *, db_url: str | None = None, config_text: str | None = None,
                 nodes: int | None = None, gpus_per_node: int | None = None, backend: Backend | None = None,
                 loop_params: LoopParams | None = None, api_url: str | None = None, backend_kind: str = "local",
                 slurm_partition: str | None = None, policy: str | None = None,
                 clock: Callable[[], float] = time.time):
        """`policy`: `yard up --policy`, stored as a new configuration version when the one in
        force names another (`config.set_policy`; `policy_change` says what it did). `clock`: the
        loop's time (a `clock.FakeClock` with the fake backend, in tests of the loop's logic)."""
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.store: Store = open_store(db_url or sqlite_url(self.data_dir))
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
        with self.lock, self.store.session.begin() as s:
            have = s.scalars(select(ConfigVersionRow.version)).first() is not None
            if config_text is not None:
                text, why = config.given_text(config_text, policy)  # with --policy's scheduler.policy
                config.apply(s, text, Principal("yard-up", "admin"), why)
            elif not have or nodes is not None:
                found = kind.discover(self.data_dir, options)
                topology = {n.name: {k: v for k, v in (("block", n.block), ("rack", n.rack)) if v} for n in found}
                text = config.default_config_text([(n.name, n.gpus, n.gpu_model, n.gpu_mem_mib) for n in found],
                                                  topology=topology)
                config.apply(s, text, Principal("yard-up", "admin"), "default configuration of this machine")
            self.policy_change = None if policy is None else config.set_policy(
                s, policy, Principal("yard-up", "admin"), f"yard up --policy {policy}")
            self.admin_token = auth.ensure_admin_token(s, self.data_dir / "admin.token")
            cfg = self.configs.current(s)
        inventory = [NodeInfo(n.name, n.gpus, n.gpu_model, n.gpu_mem_mib)
                     for n in cfg.nodes]
        self.backend: Backend = backend or kind.create(self.data_dir, inventory, options)
        self.loop = ControlLoop(self.store, self.backend, self.data_dir, self.configs, self.lock,
                                params=loop_params, api_url=api_url, clock=clock)

    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        """Stop the loop and close; running jobs keep running and are re-attached on the next start."""
        self.loop.stop()
        self.backend.close()
        self.store.close()

    def write_server_file(self, url: str) -> None:
        self.api_url = self.loop.api_url = url
        # Atomically: the CLI and tests poll for this file and must never read half of it.
        tmp = self.data_dir / f"server.json.tmp.{os.getpid()}"
        tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}))
        os.replace(tmp, self.data_dir / "server.json")

    def remove_server_file(self) -> None:
        try:
            (self.data_dir / "server.json").unlink()
        except FileNotFoundError:
            pass
