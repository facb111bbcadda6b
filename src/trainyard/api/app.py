"""The FastAPI application: routers, and one mapping from service errors to HTTP statuses.

Errors answer `{"detail": message, "field": name-or-null}`; request validation (pydantic) keeps
FastAPI's 422 shape, whose `loc` names the field.
"""

from __future__ import annotations

import errno
from contextlib import asynccontextmanager
from typing import AsyncIterator

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from trainyard.api.admission import Admission, Counts
from trainyard.api.routers import accounting, checkpoints, cluster, dataset_nodes, datasets, estimates, goodput, images, jobs, misc, nodes, ports, reservations, storage, teams, terminal, tokens, ui
from trainyard.api.routers import pilot as pilot_routes
from trainyard.api.routers import login as login_routes
from trainyard.api.routers import whatif as whatif_routes
from trainyard.api.routers import ui_config
from trainyard.disk import free_bytes
from trainyard.services.errors import ServiceError
from trainyard.services.login_codes import LoginCodes
from trainyard.services.metrics import PlaneCollector
from trainyard.services.plane_facade import API_THREADS, REQUESTS_PER_THREAD, Plane
from trainyard.spec.models import ConfigError


# Log streams in flight at once before the API answers 503 (api/admission.py); ordinary requests
# are bounded by the plane (Plane.api_max_requests), which sizes its store pool for them.
MAX_STREAMS = 256


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # The worker threads that run the (synchronous) handlers: as many as the plane sized its
    # store pool for (Plane.api_threads), instead of AnyIO's default of 40.
    anyio.to_thread.current_default_thread_limiter().total_tokens = app.state.plane.api_threads
    yield


def _disk_full(cp: Plane | None) -> JSONResponse:
    where = cp.data_dir if cp is not None else "the data dir"
    try:
        free = f"{free_bytes(where) / 2**20:.0f} MiB free"
    except (OSError, TypeError):
        free = "free space unknown"
    return JSONResponse({"detail": f"the data disk is full ({where}: {free}); nothing was stored", "field": None},
                        status_code=507)


def _store_trouble(cp: Plane | None, message: str, e: Exception) -> JSONResponse:
    """A store that cannot write: 507 when its disk is full, 503 with Retry-After when its one
    write lock is held too long; anything else is a server error as before."""
    low = message.lower()
    if "disk is full" in low or "no space" in low:
        return _disk_full(cp)
    if "database is locked" in low:
        return JSONResponse({"detail": "the store is busy (its write lock is held); retry", "field": None},
                            status_code=503, headers={"Retry-After": "1"})
    raise e


def create_app(cp: Plane) -> FastAPI:
    app = FastAPI(title="trainyard", version="0.1.0", lifespan=_lifespan,
                  description="Self-hosted manager for GPU training clusters shared by several teams.")
    most = cp.api_max_requests if cp is not None else REQUESTS_PER_THREAD * API_THREADS  # None: the spec only
    app.state.admission = Counts(max_requests=most, max_streams=MAX_STREAMS)
    app.add_middleware(Admission, counts=app.state.admission)
    app.state.plane = cp
    app.state.metrics = CollectorRegistry(auto_describe=False)  # what GET /metrics exposes
    app.state.metrics.register(PlaneCollector(lambda: cp))
    app.state.login_codes = LoginCodes()  # `yard login --code` (services/login_codes.py)
    app.state.login_socket = None  # its path, when `yard up` listens on one (control/lifecycle/login_socket.py)

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, e: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": e.message, "field": e.field}, status_code=e.status)

    @app.exception_handler(OperationalError)
    async def _store_error(_: Request, e: OperationalError) -> JSONResponse:
        return _store_trouble(cp, str(e.orig) if e.orig is not None else str(e), e)

    @app.exception_handler(PoolTimeout)
    async def _pool_timeout(_: Request, e: PoolTimeout) -> JSONResponse:
        # Should not happen with the pool sized for every admitted request; if it does, a busy answer.
        return JSONResponse({"detail": "the control plane is busy (no store connection free); retry", "field": None},
                            status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(OSError)
    async def _os_error(_: Request, e: OSError) -> JSONResponse:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return _disk_full(cp)
        raise e

    @app.exception_handler(ConfigError)
    async def _config_error(_: Request, e: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(e), "field": e.field}, status_code=400)

    for r in (jobs.router, nodes.router, teams.router, cluster.router, misc.router, tokens.router, accounting.router, goodput.router,
              estimates.router, reservations.router, storage.router, ui.router, login_routes.router, images.router, terminal.router,
              ports.router, pilot_routes.router, whatif_routes.router, ui_config.router, dataset_nodes.router, datasets.router,
              checkpoints.router):
        app.include_router(r)

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        """The web dashboard (api/routers/ui.py)."""
        return RedirectResponse("/ui/", status_code=307)

    return app
