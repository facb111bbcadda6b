"""The control plane assembled from its settings: `build_plane(PlaneSettings(...))`.

Everything a start does before the plane runs is here, in this order, so that `ControlPlane`
takes only the parts it runs with (`control/lifecycle/plane.py`'s `PlaneParts`):

1. the data dir (made; `jobs_dir` linked in: `plane_files.use_jobs_dir`, raises `JobsDirError`);
2. the store, twice: the API's pool, sized for every request the API admits, and the loop's own
   (a WAL deleted under a stopped plane is recovered first: `control/lifecycle/store_audit.py`);
3. the backend's kind by name (`backends/registry.py`), its options (`BackendKind.take`) and
   `check` — before anything is stored, so a backend that cannot run here leaves no trace;
4. the configuration: the text given (with `policy`, `run_as`, `allow_root_jobs` in it; never a
   silent revert of live changes unless `config_wins`), else a default from the backend's nodes
   when none is stored or the options describe other nodes, else only the identity flags;
5. the admin token (`DATA_DIR/admin.token`, 0600), the store's identity and audit;
6. the backend, created on the *configured* nodes; a kind that runs the in-job tools
   (`job_python` among its options) gets the interpreter once every job account can run it
   (`job_tools.check` raises `JobToolsError` otherwise).

A test that brings its own backend (the fake one on a fake clock) passes it as `backend`: step 3's
check and step 6 are skipped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from trainyard.backends import registry
from trainyard.backends.rundir import job_tools
from trainyard.backends.base import Backend, NodeInfo
from trainyard.control.lifecycle import plane_files, store_audit
from trainyard.control.loop.orchestrator import LoopParams
from trainyard.control.lifecycle.plane import ControlPlane, PlaneParts
from trainyard.services import auth, config, config_file, owners
from trainyard.services.auth import Principal
from trainyard.services.plane_facade import API_THREADS, REQUESTS_PER_THREAD
from trainyard.store import identity
from trainyard.store.db import open_store, sqlite_url
from trainyard.store.models import ConfigVersionRow, JobRow

LOOP_POOL = 6  # the loop's own store connections: its pass, the health checks and their workers
YARD_UP = Principal("yard-up", "admin")  # the author of what a start stores


@dataclass(frozen=True)
class PlaneSettings:
    """What `yard up`'s flags (or a test) say about the plane to build.

    `policy`: `yard up --policy`, stored as a new configuration version when the one in force
    names another (`config.set_policy`; the plane's `policy_change` says what it did).
    `run_as`, `allow_root_jobs`: stored as `policy` is (`config.set_identity`). `jobs_dir`: job
    dirs on another file system. `config_name`, `config_wins`: the `--config` file's name, and
    `--config-wins` (store it even when it would revert live changes: `config_file.check`).
    `backend_kind`, `backend_options`: a kind of `backends/registry.py` and its own settings by
    name (`nodes`, `gpus_per_node`, `partition`, `job_python`…; those it does not take are
    dropped: `yard up` refuses them first, naming the flag). `backend`: one already made (tests).
    `clock`: the loop's time (a `clock.FakeClock` with the fake backend). `api_threads`: the API's
    worker threads; the API admits REQUESTS_PER_THREAD requests per thread at once and its store
    pool is sized for all of them (on PostgreSQL: 84 connections with the defaults and LOOP_POOL
    for the loop, so that it never waits behind API traffic; keep `max_connections` above that).
    """

    data_dir: str | Path
    db_url: str | None = None
    config_text: str | None = None
    config_name: str = "the file"
    config_wins: bool = False
    policy: str | None = None
    run_as: str | None = None
    allow_root_jobs: bool | None = None
    jobs_dir: str | Path | None = None
    backend_kind: str = "local"
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    backend: Backend | None = None
    loop_params: LoopParams | None = None
    api_url: str | None = None
    clock: Callable[[], float] = time.time
    api_threads: int = API_THREADS


def build_plane(settings: PlaneSettings) -> ControlPlane:
    """The plane, ready to `start()` (see the module docstring for what is done, in order)."""
    return ControlPlane(open_parts(settings))


def open_parts(settings: PlaneSettings) -> PlaneParts:
    data_dir = Path(settings.data_dir).resolve()  # plane's own: the operator's --data-dir
    data_dir.mkdir(parents=True, exist_ok=True)  # plane's own: the operator's --data-dir
    if settings.jobs_dir is not None:
        plane_files.use_jobs_dir(data_dir, Path(settings.jobs_dir))
    url = settings.db_url or sqlite_url(data_dir)
    wal = store_audit.recover_missing_wal(url)  # before opening: a deleted WAL leaves a stale index
    # A request admitted holds one store session from its first query until its response is
    # sent, whether or not a thread works on it, and a caller's lookup takes one more for a
    # moment: size the pool for every admitted request, not only the threads (with 2 per
    # thread, 200 clients exhausted it while the server stopped and requests got 500).
    threads = settings.api_threads
    store = open_store(url, pool_size=REQUESTS_PER_THREAD * threads + threads + 4)
    loop_store = open_store(url, pool_size=LOOP_POOL, migrated=True)
    kind = registry.get(settings.backend_kind)
    options = kind.take(settings.backend_options)
    if settings.backend is None:
        kind.check(options)
    configs = config.ConfigCache()
    with store.session.begin() as s:
        policy_change = _store_configuration(s, settings, kind, options, data_dir)
        admin_token = auth.ensure_admin_token(s, data_dir / "admin.token")
        cfg = configs.current(s)
        # Work on disk the store does not know (a restored store, a lost WAL, another store's
        # data dir): reported, never reused (control/lifecycle/store_audit.py); `yard up` prints it.
        store_id = identity.ensure_instance_id(s)
        audit = store_audit.audit(s, data_dir, store_id, wal)
        store_audit.report(s, audit, settings.clock())
        store_audit.write_seen(data_dir, store_id, s.scalar(select(func.max(JobRow.id))) or 0)
    plane_files.protect(data_dir)
    backend = settings.backend or _create_backend(kind, data_dir, cfg, options)
    return PlaneParts(data_dir=data_dir, store=store, loop_store=loop_store, configs=configs, backend=backend,
                      admin_token=admin_token, audit=audit, policy_change=policy_change,
                      notes=owners.notes(cfg.spec), loop_params=settings.loop_params, api_url=settings.api_url,
                      clock=settings.clock, api_threads=threads)


def _store_configuration(s: Session, settings: PlaneSettings, kind: registry.BackendKind,
                         options: Mapping[str, Any], data_dir: Path) -> tuple[int, bool] | None:
    """Step 4: a version for what was given or discovered; returns `config.set_policy`'s answer."""
    # --run-as/--allow-root-jobs go into the text given (or made) here, one version for all.
    ident: dict[str, object] = {k: v for k, v in (("allow_root_jobs", settings.allow_root_jobs),
                                                  ("run_as", settings.run_as)) if v is not None}
    flags = "yard up " + " ".join(f"--run-as {v}" if k == "run_as" else "--allow-root-jobs"
                                  for k, v in ident.items() if v)
    have = s.scalars(select(ConfigVersionRow.version)).first() is not None
    if settings.config_text is not None:
        text, why = config.given_text(settings.config_text, settings.policy)  # with --policy's scheduler.policy
        text, why = config.with_identity(text, why, ident, flags)
        if not settings.config_wins:
            config_file.check(s, text, settings.config_name)  # never a silent revert of live changes
        config.apply(s, text, YARD_UP, why)
    elif not have or any(k in options for k in kind.node_options):
        found = kind.discover(data_dir, options)
        topology = {n.name: {k: v for k, v in (("block", n.block), ("rack", n.rack)) if v} for n in found}
        text = config.default_config_text([(n.name, n.gpus, n.gpu_model, n.gpu_mem_mib) for n in found],
                                          topology=topology)
        text, why = config.with_identity(text, "default configuration of this machine", ident, flags)
        config.apply(s, text, YARD_UP, why)
    elif ident:
        config.set_identity(s, YARD_UP, flags, run_as=settings.run_as, allow_root_jobs=settings.allow_root_jobs)
    if settings.policy is None:
        return None
    return config.set_policy(s, settings.policy, YARD_UP, f"yard up --policy {settings.policy}")


def _create_backend(kind: registry.BackendKind, data_dir: Path, cfg: config.ConfigVersion,
                    options: Mapping[str, Any]) -> Backend:
    """Step 6: the backend on the configured nodes (GPU memory and topology as configured)."""
    inventory = [NodeInfo(n.name, n.gpus, n.gpu_model, n.gpu_mem_mib) for n in cfg.nodes]
    if "job_python" in kind.options:  # can job owners run the in-job tools?
        chosen = options.get("job_python") or cfg.spec.job_python
        job_tools.check(job_tools.resolve(chosen), job_tools.accounts_to_probe(cfg.spec.run_as, cfg.spec.users.values()),
                        configured=chosen is not None)
        options = {**options, "job_python": chosen}
    return kind.create(data_dir, inventory, options)
