"""Admission control: past a bound of requests in flight the API answers 503 with `Retry-After`
at once, instead of letting every request wait until clients time out.

Why: the API runs handlers on a bounded pool of worker threads (`ControlPlane.api_threads`) with
a store pool sized to match, so work beyond that waits in the event loop. A burst of hundreds of
clients made every request wait 30 s and fail; a busy answer within a millisecond lets clients
back off and come back (the CLI retries on its own: cli/client.py). Streaming requests (`logs
-f`) hold no thread while they wait, and are bounded separately. `/healthz`, `/readyz` and
`/metrics` are never refused: they are how an operator sees the overload.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]

NEVER_REFUSED = frozenset({"/healthz", "/readyz", "/metrics"})
RETRY_AFTER_S = 1


def is_stream(scope: Scope) -> bool:
    """A `GET …/logs?follow=true`: it lasts as long as the job, holding no thread while it waits."""
    if not scope["path"].endswith("/logs"):
        return False
    follow = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("follow", [""])[-1]
    return follow.lower() in ("1", "true", "yes", "on")


@dataclass
class Counts:
    """The bounds and what is in flight now (one event loop: no lock needed); on `app.state`."""

    max_requests: int
    max_streams: int
    requests: int = 0
    streams: int = 0
    refused: int = 0  # since start (the metrics show it)


class Admission:
    """ASGI middleware: at most `counts.max_requests` ordinary requests and `max_streams` streams."""

    def __init__(self, app: ASGIApp, *, counts: Counts):
        self.app, self.c = app, counts

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http" or scope["path"] in NEVER_REFUSED:
            await self.app(scope, receive, send)
            return
        stream, c = is_stream(scope), self.c
        if (c.streams >= c.max_streams) if stream else (c.requests >= c.max_requests):
            c.refused += 1
            what = f"{c.streams} log streams" if stream else f"{c.requests} requests"
            await _busy(send, f"the control plane is busy ({what} in flight); retry after {RETRY_AFTER_S} s")
            return
        if stream:
            c.streams += 1
        else:
            c.requests += 1
        try:
            await self.app(scope, receive, send)
        finally:
            if stream:
                c.streams -= 1
            else:
                c.requests -= 1


async def _busy(send: Callable[[dict], Awaitable[None]], message: str) -> None:
    body = json.dumps({"detail": message, "field": None}).encode()
    await send({"type": "http.response.start", "status": 503,
                "headers": [(b"content-type", b"application/json"), (b"retry-after", str(RETRY_AFTER_S).encode()),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
