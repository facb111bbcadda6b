"""What every route needs: the control plane (as `services.plane_facade.Plane`), a session, the caller
(from the bearer token)."""

from __future__ import annotations

import math
from typing import Annotated, Any, AsyncIterator

from fastapi import Depends, Header, Path, Request
from starlette.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from trainyard.services.auth import Principal, authenticate, cached_principal
from trainyard.services.errors import Forbidden, ServiceError
from trainyard.services.plane_facade import Plane

# The largest id the store compares with: INTEGER columns are 32-bit on PostgreSQL (64-bit on
# SQLite); a larger job id, event id or config version in a request raised an overflow (500)
# instead of answering 404 or 422.
MAX_ID = 2**31 - 1
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id")]


async def plane(request: Request) -> Plane:
    # async: a plain attribute read needs no trip through the thread pool
    return request.app.state.plane


async def session(cp: Plane = Depends(plane)) -> AsyncIterator[Session]:
    """A session for the route. async: opening one touches no database (the connection is taken
    at its first query, on the route's worker thread), and a sync generator would cost two
    thread-pool hops per request, to open and to close it."""
    s = cp.store.session()
    try:
        yield s
    finally:
        s.close()


async def principal(authorization: str | None = Header(None, description="Bearer <token>"),
                    cp: Plane = Depends(plane)) -> Principal:
    """The caller. async, and apart from the route's session: a token checked recently is answered
    from the process's cache without a thread-pool hop (each hop costs more than the check, and a
    sync dependency on the session costs two more, to open and to close it); an unknown one is
    looked up in the store on a worker thread."""
    token = None
    if authorization:
        scheme, _, value = authorization.partition(" ")
        token = value.strip() if scheme.lower() == "bearer" else None
    who = cached_principal(token)
    if who is not None:
        return who
    return await run_in_threadpool(authenticate_token, cp, token)


def authenticate_token(cp: Plane, token: str | None) -> Principal:
    """The caller of `token`, looked up in the store (blocking: call it on a worker thread)."""
    with cp.store.session() as s:
        return authenticate(s, token)


def cluster_reader(by: Principal) -> Principal:
    """`by`, if it may make a cluster-wide read (queue-wide events, nodes, teams, configuration):
    anyone but a job token, which reads its own job only (see `services/auth.py`)."""
    if by.role == "job":
        raise Forbidden("a job token reads only its own job")
    return by


async def reader(by: Principal = Depends(principal)) -> Principal:
    """The caller of a cluster-wide read (`cluster_reader` as a route dependency)."""
    return cluster_reader(by)


def _unstorable(value: Any, path: tuple) -> tuple[tuple, str] | None:
    """The path and the reason of the first value in parsed JSON that cannot be stored or sent back."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, "text must be valid UTF-8 (a lone surrogate escape such as \\ud800 is not)"
        if "\x00" in value:
            return path, "text must not contain NUL (\\u0000)"
    elif isinstance(value, float) and not math.isfinite(value):
        return path, "numbers must be finite (NaN, Infinity and overflowing values are not JSON numbers)"
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if (bad := _unstorable(v, path + (i,))) is not None:
                return bad
    elif isinstance(value, dict):
        for k, v in value.items():
            if (bad := _unstorable(k, path) or _unstorable(v, path + (k,))) is not None:  # a bad key: its dict
                return bad
    return None


async def storable_input(request: Request) -> None:
    """Refuse a query parameter or JSON body value the store cannot take or the API cannot send back:
    text with a lone surrogate or NUL, a NaN or infinite number.

    Python's JSON parser accepts them, but such values cannot be encoded as UTF-8 (SQLite, the
    response) or as JSON: pydantic let some through (a dict key in `env`, `cohort`), which stored
    them and then made every later listing of the queue or of the teams answer 500; others were
    refused with a 422 that itself failed to render (500). PostgreSQL cannot store NUL in text
    nor compare with it (a job name, a token's user, a drain reason, `GET /jobs?team=%00`
    answered 500 there)."""
    for name, value in request.query_params.multi_items():
        if "\x00" in value:
            raise ServiceError(f"{name}: text must not contain NUL (%00)", field=name)
    if not await request.body():
        return
    try:
        data = await request.json()
    except ValueError:
        return  # not JSON: FastAPI answers 422 itself
    bad = _unstorable(data, ())
    if bad is not None:
        path, why = bad
        field = ".".join(str(x) for x in path)
        raise ServiceError(f"{field or 'body'}: {why}", field=field or None)
