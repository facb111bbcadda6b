"""/ui/config: the dashboard's configuration page, and its what-if form.

The page shows what `GET /api/v1/cluster/config`, `/versions`, `/diff` and
`GET /api/v1/cluster/pilot/status` answer (`services/dashboard_config.py`) to anyone who may read
the cluster. The what-if form (admins only: a viewer or a member sees the page without it, and a
post of theirs is answered 403, as the API answers) posts to `/ui/config/what-if`, which calls
`services/whatif.py` as `POST /api/v1/cluster/config/what-if` does: the same validation, the same
error (the field named, 400 or 422) shown on the page above the form with the text as posted,
nothing stored. Promote and roll back a pilot's trial stay in the CLI and the API.

A plain form POST like the login's: the session cookie is SameSite=Strict and a post whose
`Origin` is another site is refused (`ui.same_origin`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from trainyard.api import pages
from trainyard.api.deps import MAX_ID, cluster_reader, plane, session
from trainyard.api.routers.ui import caller, error_page, page, same_origin
from trainyard.services import dashboard_config, whatif
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, NotFound, ServiceError
from trainyard.services.plane_facade import Plane
from trainyard.sim.side_by_side import what_if_rows

router = APIRouter(prefix="/ui", include_in_schema=False)

MAX_TEXT, MAX_SINCE = 1_000_000, 100  # as the API's `text` and `since` (api/routers/whatif.py)
MAX_FORM_BYTES = 3 * MAX_TEXT + 4096  # the text form-encoded (a character may take %XX) and `since`


@router.get("/config")
@page
def config_page(request: Request, diff: str | None = None, cp: Plane = Depends(plane),
                s: Session = Depends(session)) -> Response:
    """`diff`: a version to compare with the one in force."""
    who = cluster_reader(caller(request, s))
    return _render(cp, s, who, _version(diff), None, None)


@router.post("/config/what-if")
async def config_what_if(request: Request, cp: Plane = Depends(plane)) -> Response:
    if not same_origin(request):
        return error_page(403, "a what-if posted from another site is refused")
    body = await _body(request)
    if body is None:
        return error_page(413, f"the what-if form is larger than {MAX_FORM_BYTES} bytes")
    text, since = _form(body)
    return await run_in_threadpool(_what_if_page, request=request, cp=cp, text=text, since=since)


async def _body(request: Request) -> bytes | None:
    """The form's body, or None past MAX_FORM_BYTES (read no further: a sender may lie in or
    leave out its Content-Length)."""
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            return None
        parts.append(chunk)
    return b"".join(parts)


@page
def _what_if_page(*, request: Request, cp: Plane, text: str, since: str | None) -> Response:
    """The replays run outside any session of ours (`whatif.what_if` reads the store briefly)."""
    with cp.store.session() as s:
        who = cluster_reader(caller(request, s))
    try:
        result: dict[str, Any] | ServiceError = _checked_what_if(cp, who, text, since)
    except Forbidden:
        raise
    except ServiceError as e:
        result = e
    with cp.store.session() as s:
        return _render(cp, s, who, None, result, (text, since or ""))


def _checked_what_if(cp: Plane, who: Principal, text: str, since: str | None) -> dict[str, Any]:
    if not who.is_admin:  # before the text is read: a viewer learns nothing from the errors
        raise Forbidden("only an admin can change the cluster configuration")
    if len(text) > MAX_TEXT or "\x00" in text:
        raise ServiceError(f"the configuration must be at most {MAX_TEXT} characters, with no NUL", field="text")
    if since is not None and len(since) > MAX_SINCE:
        raise ServiceError(f"since must be at most {MAX_SINCE} characters (now-14days, 2026-11-01T08:00 …)",
                           field="since")
    return whatif.what_if(cp, who, text, since)


def _render(cp: Plane, s: Session, who: Principal, diff_from: int | None,
            result: dict[str, Any] | ServiceError | None, posted: tuple[str, str] | None) -> Response:
    """The page; with a what-if's `result` (its figures, or the error it raised) and the form as posted."""
    data = dashboard_config.page(s, cp.configs.current(s), cp.clock(), cp.data_dir, diff_from)
    error = result if isinstance(result, ServiceError) else None
    doc = result if isinstance(result, dict) else None
    text, since = posted or (data["current"]["text"], whatif.DEFAULT_SINCE)
    return pages.render("config.html", status=error.status if error else 200, who=who, **data, error=error,
                        result=doc, rows=what_if_rows(doc) if doc else [], text=text, since=since)


def _form(body: bytes) -> tuple[str, str | None]:
    """(the proposed text, `since` or None for the default) from the form's body. A browser sends
    a textarea's lines ended by CR LF: the text is read with LF, as a file would be."""
    form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=10)
    text = (form.get("text") or [""])[0].replace("\r\n", "\n")
    since = (form.get("since") or [""])[0].strip()
    return text, since or None


def _version(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit() and len(value) <= 20) or not 1 <= int(value) <= MAX_ID:
        raise NotFound(f"no configuration version {value[:50]!r}: versions are whole numbers from 1")
    return int(value)
