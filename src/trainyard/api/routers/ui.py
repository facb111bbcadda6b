"""/ui: the web dashboard, server-rendered (Jinja2 templates, inline SVG charts, a little JS of ours).

Pages: `/ui/login` (a token form), `/ui/` (cluster map, queue, running jobs, allocation and wait
over time, recent events), `/ui/jobs/{id}` (details, attempts, loss curve, events, logs),
`/ui/usage` (GPU-hours per team against quota, busy %, waits per class, lost work by cause);
`/ui/config` (versions, the pilot, the what-if form) is `ui_config.py`'s.

Login: the token is checked like any API request (`auth.authenticate`) and kept in an HttpOnly,
SameSite=Strict cookie scoped to /ui (Secure under HTTPS): page scripts never see it, other sites
cannot send it. Job tokens are refused: they belong to a job, not a person. A POST whose
`Origin` is another site is refused (login CSRF). Each page authenticates the cookie anew, so a
revoked token logs out at its next page (a revocation clears the auth cache: services/tokens.py).

What a page shows is what the API would show the same token: the data come from
`services/dashboard*.py`, which call the API's service functions with the caller (a viewer sees
the map and the queue but no logs; a member reads only their team's logs). Templates autoescape
everything (job names are user input) and the Content-Security-Policy allows only our own script
and stylesheet. These routes stay out of the OpenAPI schema.
"""

from __future__ import annotations

import functools
import time
from importlib import resources
from typing import Any, Callable
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from trainyard.api import pages
from trainyard.api.deps import MAX_ID, authenticate_token, cluster_reader, plane, session
from trainyard.services import auth, dashboard, dashboard_history, usage_history, usage_report
from trainyard.services.accounting import Window
from trainyard.services.auth import Principal
from trainyard.services.errors import NotFound, ServiceError, Unauthorized
from trainyard.services.plane_facade import Plane

router = APIRouter(prefix="/ui", include_in_schema=False)

COOKIE = "yard_session"
STATIC = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8"}
MAX_FORM_BYTES = 16 * 1024
REFRESH_S = 5


def error_page(status: int, message: str) -> HTMLResponse:
    return pages.render("error.html", status=status, status_code=status, message=message)


class LoginNeeded(Exception):
    """No session cookie, or one whose token the store no longer accepts."""


# --- the session ----------------------------------------------------------------------------------

def caller(request: Request, s: Session) -> Principal:
    """The person behind the session cookie (or an `Authorization: Bearer` header, for scripts)."""
    token = request.cookies.get(COOKIE)
    if not token:
        scheme, _, value = (request.headers.get("authorization") or "").partition(" ")
        token = value.strip() if scheme.lower() == "bearer" else None
    if not token:
        raise LoginNeeded
    try:
        return auth.authenticate(s, token)
    except Unauthorized:
        raise LoginNeeded from None


def _login_url(request: Request) -> str:
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return "/ui/login" + ("" if here in ("/ui/", "/ui") else f"?next={quote(here, safe='')}")


def page(fn: Callable[..., Response]) -> Callable[..., Response]:
    """A page handler: a missing or stale session goes to the login page, a service error becomes
    an error page with the service's status (never a 5xx for bad input)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kw: Any) -> Response:
        request: Request = kw["request"]
        try:
            return fn(*args, **kw)
        except LoginNeeded:
            r = RedirectResponse(_login_url(request), status_code=303, headers=pages.HEADERS)
            r.delete_cookie(COOKIE, path="/ui")
            return r
        except ServiceError as e:
            return error_page(e.status, e.message)
    return wrapper


def _safe_next(value: str | None) -> str:
    """Only a path inside the dashboard: never another site (`//evil`, `https://…`)."""
    if not value or not value.startswith("/ui/") or value.startswith("//") or "\\" in value or \
            any(ord(ch) < 32 for ch in value):
        return "/ui/"
    return value


def same_origin(request: Request) -> bool:
    """A browser's POST says where its page came from; refuse another site's (login CSRF)."""
    origin = request.headers.get("origin")
    if origin is None:  # not a browser form (curl, a script): nothing to protect
        return True
    try:
        o = urlsplit(origin)
    except ValueError:
        return False
    hosts = {request.headers.get("host", ""), request.headers.get("x-forwarded-host", "")} - {""}
    return o.scheme in ("http", "https") and o.netloc in hosts


# --- routes ---------------------------------------------------------------------------------------

@router.get("/login")
def login_form(request: Request, next: str | None = None) -> HTMLResponse:  # noqa: A002 (the query name)
    return pages.render("login.html", next=_safe_next(next), error=None)


@router.post("/login")
async def login(request: Request, cp: Plane = Depends(plane)) -> Response:
    if not same_origin(request):
        return error_page(403, "a login form posted from another site is refused")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return error_page(413, f"the login form is larger than {MAX_FORM_BYTES} bytes")
    token, target = _login_form(body)
    refused = await _refused(cp, token, target)
    return refused if refused is not None else _logged_in(request, token, target)


def _login_form(body: bytes) -> tuple[str, str]:
    """(the token pasted, where to go next) from the login form's body."""
    form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=10)
    return (form.get("token") or [""])[0].strip(), _safe_next((form.get("next") or [""])[0])


async def _refused(cp: Plane, token: str, target: str) -> Response | None:
    """The login page again, saying why, unless `token` is a person's valid token."""
    if not token or len(token) > 1000 or "\x00" in token:
        return pages.render("login.html", status=400 if not token else 401, next=target,
                            error="paste a token (yard token create …, or the data dir's admin.token)" if not token
                            else "unknown or revoked token")
    try:
        who = await run_in_threadpool(authenticate_token, cp, token)  # the store is synchronous
    except Unauthorized as e:
        return pages.render("login.html", status=401, next=target, error=e.message)
    if who.role == "job":
        return pages.render("login.html", status=403, next=target,
                            error="a job token belongs to its job; log in with a person's token")
    return None


def _logged_in(request: Request, token: str, target: str) -> Response:
    """On to `target`, the token kept in the session cookie (HttpOnly, SameSite=Strict, /ui only)."""
    r = RedirectResponse(target, status_code=303, headers=pages.HEADERS)
    r.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/ui",
                 secure=request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https")
    return r


@router.post("/logout")
def logout(request: Request) -> Response:
    if not same_origin(request):
        return error_page(403, "a logout posted from another site is refused")
    r = RedirectResponse("/ui/login", status_code=303, headers=pages.HEADERS)
    r.delete_cookie(COOKIE, path="/ui")
    return r


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC:
        return Response("not found", status_code=404, media_type="text/plain")
    body = resources.files("trainyard.api").joinpath("static", name).read_bytes()  # plane's own: the package
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "no-cache",
                                                           "X-Content-Type-Options": "nosniff"})


@router.get("/")
@page
def overview(request: Request, window: str = "1h", refresh: str | None = None, cp: Plane = Depends(plane),
             s: Session = Depends(session)) -> Response:
    """`window`: the span of the charts; `refresh`: seconds between updates (0: none; a wall screen
    may want 60)."""
    who = cluster_reader(caller(request, s))  # cluster-wide reads: the API's rule
    span, every, now = _window(window), _refresh(refresh), time.time()
    view = dashboard.overview(s, cp.configs.current(s), who, now, span)
    charts = pages.history_charts(view.pop("history"), now)
    return pages.render("overview.html", **view, charts=charts, window=window, windows=list(dashboard_history.WINDOWS),
                        refresh=every, refresh_arg="" if refresh is None else f"&refresh={every}")


@router.get("/usage")
@page
def usage(request: Request, period: str = "7d", cp: Plane = Depends(plane),
          s: Session = Depends(session)) -> Response:
    """Where the GPU-hours went over `period` (24h, 7d, 30d, 90d): `yard report`'s figures, plotted,
    with the same role rules (a viewer sees teams' totals, a member their own team's users)."""
    who = cluster_reader(caller(request, s))
    if period not in usage_history.PERIODS:
        raise ServiceError(f"unknown period {period[:50]!r}; periods are {list(usage_history.PERIODS)}",
                           field="period")
    cfg = cp.configs.current(s)
    now = cp.clock()
    win = Window(now - usage_history.PERIODS[period], now)
    rep = usage_report.report(s, cfg, who, win, now, data_dir=cp.data_dir).model_dump(by_alias=True)
    hist = usage_history.usage_history(s, cfg, win, now)
    return pages.render("usage.html", who=who, now=now, rep=rep, charts=pages.usage_charts(hist, rep),
                        period=period, periods=list(usage_history.PERIODS))


@router.get("/jobs/{job_id}")
@page
def job(request: Request, job_id: str, rank: str = "0", cp: Plane = Depends(plane),
        s: Session = Depends(session)) -> Response:
    who = caller(request, s)
    if not _whole(job_id) or not 1 <= int(job_id) <= MAX_ID:
        raise NotFound(f"no job {job_id[:50]!r}: job ids are whole numbers from 1")
    if not _whole(rank) or int(rank) > 1_000_000:
        raise ServiceError(f"rank must be a whole number from 0, not {rank[:50]!r}", field="rank")
    data = dashboard.job_page(s, cp.data_dir, int(job_id), who, int(rank), spec=cp.configs.current(s).spec)
    j = data["job"]
    active = j["state"] in ("PENDING", "REQUEUED", "RUNNING", "COMPLETING")
    return pages.render("job.html", who=who, now=time.time(), j=j, attempts=data["attempts"], events=data["events"],
                        loss=data["loss"], chart=pages.loss_chart(data["loss"]), logs=data["logs"],
                        goodput=data["goodput"], ledger=pages.goodput_chart(data["goodput"]),
                        refresh=REFRESH_S if active else 0, gpu_charts=pages.gpu_charts(data["gpus"], time.time()))


def _whole(text: str) -> bool:
    """ASCII digits only: str.isdigit() also takes '²', which int() refuses."""
    return text.isascii() and text.isdigit() and len(text) <= 20


def _window(value: str) -> float:
    """The overview charts' span in seconds, from the window's name (`dashboard_history.WINDOWS`)."""
    if value not in dashboard_history.WINDOWS:
        raise ServiceError(f"unknown window {value[:50]!r}; windows are {list(dashboard_history.WINDOWS)}",
                           field="window")
    return dashboard_history.WINDOWS[value]


def _refresh(value: str | None) -> int:
    if value is None:
        return REFRESH_S
    if not _whole(value) or int(value) > 3600:
        raise ServiceError(f"refresh must be whole seconds from 0 (off) to 3600, not {value[:50]!r}", field="refresh")
    return int(value)
