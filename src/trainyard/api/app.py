"""The FastAPI application: routers, and one mapping from service errors to HTTP statuses.

Errors answer `{"detail": message, "field": name-or-null}`; request validation (pydantic) keeps
FastAPI's 422 shape, whose `loc` names the field.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse
from prometheus_client import CollectorRegistry

from trainyard.api.routers import cluster, jobs, misc, nodes, teams, ui
from trainyard.control.plane import ControlPlane
from trainyard.services.errors import ServiceError
from trainyard.services.metrics import PlaneCollector
from trainyard.spec import ConfigError


def create_app(cp: ControlPlane) -> FastAPI:
    app = FastAPI(title="trainyard", version="0.1.0",
                  description="Self-hosted manager for GPU training clusters shared by several teams.")
    app.state.plane = cp
    app.state.metrics = CollectorRegistry(auto_describe=False)  # what GET /metrics exposes
    app.state.metrics.register(PlaneCollector(lambda: cp))

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, e: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": e.message, "field": e.field}, status_code=e.status)

    @app.exception_handler(ConfigError)
    async def _config_error(_: Request, e: ConfigError) -> JSONResponse:
        return JSONResponse({"detail": str(e), "field": e.field}, status_code=400)

    for r in (jobs.router, nodes.router, teams.router, cluster.router, misc.router, ui.router):
        app.include_router(r)

    @app.get("/", include_in_schema=False)
    def home() -> RedirectResponse:
        """The web dashboard (api/routers/ui.py)."""
        return RedirectResponse("/ui/", status_code=307)

    return app
