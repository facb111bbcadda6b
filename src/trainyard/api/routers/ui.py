"""/ui: the web dashboard, server-rendered (Jinja2 templates, inline SVG charts, a little JS of ours).

Pages: `/ui/login` (a token form), `/ui/` (cluster map, queue, running jobs, allocation and wait
over time, recent events), `/ui/jobs/{id}` (details, attempts, loss curve, events, logs).

Login: the token is checked like any API request (`auth.authenticate`) and kept in an HttpOnly,
SameSite=Strict cookie scoped to /ui (Secure under HTTPS): page scripts never see it, other sites
cannot send it. Job tokens are refused: they belong to a job, not a person. A POST whose
`Origin` is another site is refused (login CSRF). Each page authenticates the cookie anew, so a
revoked token logs out within the auth cache's TTL.

What a page shows is what the API would show the same token: the data come from
`services/dashboard*.py`, which call the API's service functions with the caller (a viewer sees
the map and the queue but no logs; a member reads only their team's logs). Templates autoescape
everything (job names are user input) and the Content-Security-Policy allows only our own script
and stylesheet. These routes stay out of the OpenAPI schema.
"""

from __future__ import annotations

import functools
import shlex
import time
from datetime import datetime, timezone
from importlib import resources
from typing import Any, Callable
from urllib.parse import parse_qs, quote, urlsplit

import jinja2
from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup
from sqlalchemy.orm import Session

from trainyard.api import charts
from trainyard.api.deps import MAX_ID, plane, reader, session
from trainyard.control.plane import ControlPlane
from trainyard.services import auth, dashboard, dashboard_history, events
from trainyard.services.auth import Principal
from trainyard.services.errors import NotFound, ServiceError, Unauthorized

router = APIRouter(prefix="/ui", include_in_schema=False)

COOKIE = "yard_session"
STATIC = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8"}
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
MAX_FORM_BYTES = 16 * 1024
REFRESH_S = 5


class LoginNeeded(Exception):
    """No session cookie, or one whose token the store no longer accepts."""


# --- rendering ------------------------------------------------------------------------------------

def _when(t: float | None) -> Markup:
    """A time as <time>: UTC in the HTML, the browser's local time once our script ran."""
    if t is None:
        return Markup("—")
    utc = datetime.fromtimestamp(t, timezone.utc)
    return Markup('<time datetime="{}" data-t="{}">{}</time>').format(
        utc.isoformat(timespec="seconds"), f"{t:.3f}", utc.strftime("%Y-%m-%d %H:%M:%S UTC"))


def _relative(t: float | None, now: float) -> str:
    """'in 4m', '12s ago', or '—'."""
    if t is None:
        return "—"
    d = t - now
    if abs(d) < 1:
        return "now"
    return f"in {charts.fmt_duration(d)}" if d > 0 else f"{charts.fmt_duration(-d)} ago"


def _shape(j: dict[str, Any]) -> str:
    """A job's GPU request: '8 GPUs', '2 nodes × 4 GPUs', '1-2 nodes × 4 GPUs'."""
    if j.get("gpus_per_node") is None or (j["nodes_min"] == j["nodes_max"] == 1):
        return f"{j['gpus']} GPU{'s' if j['gpus'] != 1 else ''}"
    nodes = str(j["nodes_min"]) if j["nodes_min"] == j["nodes_max"] else f"{j['nodes_min']}-{j['nodes_max']}"
    return f"{nodes} nodes × {j['gpus_per_node']} GPUs"


def _placement(p: list[dict[str, Any]] | None) -> str:
    return " ".join(f"{x['node']}[{','.join(map(str, x['gpus']))}]" for x in p or []) or "—"


ENV = jinja2.Environment(loader=jinja2.PackageLoader("trainyard.api", "templates"), autoescape=True,
                         undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
ENV.filters.update(when=_when, shape=_shape, placement=_placement, argv=shlex.join, duration=charts.fmt_duration,
                   number=charts.fmt_number)
ENV.globals.update(relative=_relative)


def render(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
    ctx.setdefault("who", None)
    html = ENV.get_template(name).render(**ctx)
    return HTMLResponse(html, status_code=status, headers=HEADERS)


def _error(status: int, message: str, who: Principal | None = None) -> HTMLResponse:
    return render("error.html", status=status, status_code=status, message=message, who=who)


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
            r = RedirectResponse(_login_url(request), status_code=303, headers=HEADERS)
            r.delete_cookie(COOKIE, path="/ui")
            return r
        except ServiceError as e:
            return _error(e.status, e.message)
    return wrapper


def _safe_next(value: str | None) -> str:
    """Only a path inside the dashboard: never another site (`//evil`, `https://…`)."""
    if not value or not value.startswith("/ui/") or value.startswith("//") or "\\" in value or \
            any(ord(ch) < 32 for ch in value):
        return "/ui/"
    return value


def _same_origin(request: Request) -> bool:
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
    return render("login.html", next=_safe_next(next), error=None)


@router.post("/login")
async def login(request: Request, cp: ControlPlane = Depends(plane)) -> Response:
    if not _same_origin(request):
        return _error(403, "a login form posted from another site is refused")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        return _error(413, f"the login form is larger than {MAX_FORM_BYTES} bytes")
    form = parse_qs(body.decode("utf-8", "replace"), max_num_fields=10)
    token = (form.get("token") or [""])[0].strip()
    target = _safe_next((form.get("next") or [None])[0])
    if not token or len(token) > 1000 or "\x00" in token:
        return render("login.html", status=400 if not token else 401, next=target,
                      error="paste a token (yard token create …, or the data dir's admin.token)" if not token
                      else "unknown or revoked token")
    with cp.store.session() as s:
        try:
            who = auth.authenticate(s, token)
        except Unauthorized as e:
            return render("login.html", status=401, next=target, error=e.message)
    if who.role == "job":
        return render("login.html", status=403, next=target,
                      error="a job token belongs to its job; log in with a person's token")
    r = RedirectResponse(target, status_code=303, headers=HEADERS)
    r.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/ui",
                 secure=request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https")
    return r


@router.post("/logout")
def logout(request: Request) -> Response:
    if not _same_origin(request):
        return _error(403, "a logout posted from another site is refused")
    r = RedirectResponse("/ui/login", status_code=303, headers=HEADERS)
    r.delete_cookie(COOKIE, path="/ui")
    return r


@router.get("/static/{name}")
def static(name: str) -> Response:
    if name not in STATIC:
        return Response("not found", status_code=404, media_type="text/plain")
    body = resources.files("trainyard.api").joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "no-cache",
                                                           "X-Content-Type-Options": "nosniff"})


@router.get("/")
@page
def overview(request: Request, window: str = "1h", refresh: str | None = None, cp: ControlPlane = Depends(plane),
             s: Session = Depends(session)) -> Response:
    """`window`: the span of the charts; `refresh`: seconds between updates (0: none; a wall screen
    may want 60)."""
    who = reader(caller(request, s))  # cluster-wide reads: the API's rule
    if window not in dashboard_history.WINDOWS:
        raise ServiceError(f"unknown window {window[:50]!r}; windows are {list(dashboard_history.WINDOWS)}",
                           field="window")
    every = _refresh(refresh)
    cfg = cp.configs.current(s)
    now = time.time()
    cards = dashboard.cluster_map(s, cfg, who)
    groups = dashboard.queue(s, cfg, who)
    active = dashboard.running(s, who)
    teams = dashboard.team_order(cfg)
    hist = dashboard_history.history(s, cfg, now, dashboard_history.WINDOWS[window])
    return render("overview.html", who=who, now=now, cards=cards, groups=groups, running=active,
                  summary=dashboard.summary(cards, groups, active), config_version=cfg.version,
                  team_class={t: f"t{i % 8}" for i, t in enumerate(teams)}, teams=teams,
                  charts=_history_charts(hist, now), window=window, windows=list(dashboard_history.WINDOWS),
                  events=events.list_events(s, limit=20, newest=True)[::-1], refresh=every,
                  refresh_arg="" if refresh is None else f"&refresh={every}")


@router.get("/jobs/{job_id}")
@page
def job(request: Request, job_id: str, rank: str = "0", cp: ControlPlane = Depends(plane),
        s: Session = Depends(session)) -> Response:
    who = caller(request, s)
    if not job_id.isdigit() or not 1 <= int(job_id) <= MAX_ID:
        raise NotFound(f"no job {job_id[:50]!r}: job ids are whole numbers from 1")
    if not rank.isdigit() or int(rank) > 1_000_000:
        raise ServiceError(f"rank must be a whole number from 0, not {rank[:50]!r}", field="rank")
    data = dashboard.job_page(s, cp.data_dir, int(job_id), who, int(rank))
    j = data["job"]
    loss: dashboard.LossCurve = data["loss"]
    chart = charts.line_chart(
        "loss per step", [charts.Series("loss", list(zip(loss.steps, loss.values)), "s0")], width=760, height=260,
        markers=[(st, f"resumed from the checkpoint of step {st}") for st in loss.resumes],
        empty="no step metrics (the job writes none, or has not logged its first step)")
    chart.data.update(steps=",".join(map(str, loss.steps)), values=",".join(map(repr, loss.values)),
                      total=str(loss.total_steps))
    if not chart.empty:
        left, _, right, _ = chart.box
        chart.data.update(x0=str(loss.steps[0]), x1=str(loss.steps[-1] if loss.steps[-1] > loss.steps[0]
                                                          else loss.steps[0] + 1), left=str(left), right=str(right))
    active = j["state"] in ("PENDING", "REQUEUED", "RUNNING", "COMPLETING")
    return render("job.html", who=who, now=time.time(), j=j, attempts=data["attempts"], events=data["events"],
                  loss=loss, chart=chart, logs=data["logs"], refresh=REFRESH_S if active else 0)


def _refresh(value: str | None) -> int:
    if value is None:
        return REFRESH_S
    if not value.isdigit() or int(value) > 3600:
        raise ServiceError(f"refresh must be whole seconds from 0 (off) to 3600, not {value[:50]!r}", field="refresh")
    return int(value)


def _history_charts(h: dashboard_history.History, now: float) -> list[charts.Chart]:
    xs = [c - now for c in h.centers]
    span = h.end - h.start
    ticks = [-span + i * span / 6 for i in range(7)]
    opts = dict(width=460, height=180, x_range=(-span, 0.0), x_fmt=charts.fmt_ago, x_tick_values=ticks)
    pct = [100.0 * a / h.capacity if h.capacity else 0.0 for a in h.allocated]
    return [
        charts.line_chart(f"GPUs allocated (% of {h.capacity})", [charts.Series("allocated", list(zip(xs, pct)))],
                          y_min=0.0, y_max=100.0, y_fmt=lambda v: f"{v:.0f}%", **opts),
        charts.line_chart("jobs waiting", [charts.Series("waiting", list(zip(xs, h.waiting)), "s1")],
                          y_min=0.0, **opts),
        charts.line_chart("wait of the attempts started",
                          [charts.Series("mean", list(zip(xs, h.wait_mean_s)), "s2", dots=True),
                           charts.Series("max", list(zip(xs, h.wait_max_s)), "s3", dots=True)],
                          y_min=0.0, y_fmt=charts.fmt_duration, empty="no job started in this window", **opts),
    ]
