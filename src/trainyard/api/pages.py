"""The dashboard's rendering: Jinja2 templates (`api/templates/`, autoescaped: job names, reasons
and log lines are user input), the filters they use, the security headers of every page, and the
charts' geometry from the data services (`api/charts.py` draws nothing itself: `_chart.html` does).
"""

from __future__ import annotations

import shlex
from datetime import datetime, timezone
from typing import Any

import jinja2
from fastapi.responses import HTMLResponse
from markupsafe import Markup

from trainyard.api import charts
from trainyard.services.dashboard import LossCurve
from trainyard.services.dashboard_history import History
from trainyard.services.usage_history import UsageHistory

# Only our own script and stylesheet run or apply; no page may frame ours.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


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


def loss_chart(loss: LossCurve) -> charts.Chart:
    """The job page's loss per step; the drawn values ride along as data-* attributes (and feed
    the readout under the pointer)."""
    chart = charts.line_chart(
        "loss per step", [charts.Series("loss", list(zip(loss.steps, loss.values)), "s0")], width=760, height=260,
        markers=[(st, f"resumed from the checkpoint of step {st}") for st in loss.resumes],
        empty="no step metrics (the job writes none, or has not logged its first step)")
    chart.data.update(steps=",".join(map(str, loss.steps)), values=",".join(map(repr, loss.values)),
                      total=str(loss.total_steps))
    if not chart.empty:
        left, _, right, _ = chart.box
        last = loss.steps[-1] if loss.steps[-1] > loss.steps[0] else loss.steps[0] + 1
        chart.data.update(x0=str(loss.steps[0]), x1=str(last), left=str(left), right=str(right))
    return chart


def gpu_charts(gpus: dict[str, Any], now: float) -> list[charts.Chart]:
    """The job page's per-GPU telemetry (services/telemetry.py's `series`): utilization and memory per
    GPU over time, x in seconds from now; one line per GPU of each attempt. The drawn values ride
    along as data-* attributes: `series` names the lines, `values` their points (`;` between lines)."""
    lines = gpus.get("gpus") or []
    many = len({g["attempt"] for g in lines}) > 1
    names = [f"{g['node']}/{g['gpu']}" + (f" (attempt {g['attempt']})" if many else "") for g in lines]
    xs = [[p[0] - now for p in g["points"]] for g in lines]
    span = max([-x[0] for x in xs if x] + [60.0])
    opts: dict[str, Any] = dict(width=760, height=220, x_range=(-span, 0.0), x_fmt=charts.fmt_ago,
                                x_tick_values=[-span + i * span / 6 for i in range(7)],
                                empty="no GPU readings yet (the first come a flush period after the start)")
    out = []
    for title, col, kw in (("GPU utilization", 2, dict(y_min=0.0, y_max=100.0, y_fmt=lambda v: f"{v:.0f}%")),
                           ("GPU memory used (MiB)", 4, dict(y_min=0.0))):
        chart = charts.line_chart(title, [charts.Series(n, list(zip(x, (p[col] for p in g["points"]))), f"s{i % 6}")
                                          for i, (n, x, g) in enumerate(zip(names, xs, lines))], **kw, **opts)
        chart.data.update(series="|".join(names),
                          values=";".join(",".join(f"{p[col]:.6g}" for p in g["points"]) for g in lines))
        out.append(chart)
    return out


def history_charts(h: History, now: float) -> list[charts.Chart]:
    """Allocation, jobs waiting and wait of started attempts over the window, x in seconds from now."""
    xs = [c - now for c in h.centers]
    span = h.end - h.start
    ticks = [-span + i * span / 6 for i in range(7)]
    opts: dict[str, Any] = dict(width=400, height=180, x_range=(-span, 0.0), x_fmt=charts.fmt_ago, x_tick_values=ticks)
    pct = [100.0 * a / h.capacity if h.capacity else 0.0 for a in h.allocated]
    return [
        charts.line_chart(f"GPUs allocated (% of {h.capacity})", [charts.Series("allocated", list(zip(xs, pct)))],
                          y_min=0.0, y_max=100.0, y_fmt=lambda v: f"{v:.0f}%", **opts),
        charts.line_chart("jobs waiting", [charts.Series("waiting", list(zip(xs, h.waiting)), "s1")],
                          y_min=0.0, **opts),
        charts.line_chart("wait of the attempts started",
                          [charts.Series("mean", list(zip(xs, h.wait_mean_s)), "s2", dots=True),
                           charts.Series("max", list(zip(xs, h.wait_max_s)), "s3", dots=True)],
                          y_min=0.0, y_fmt=charts.fmt_duration, y_ticks=charts.duration_ticks, empty="no job started in this window", **opts),
    ]


def usage_charts(h: UsageHistory, rep: dict[str, Any]) -> list[charts.Chart]:
    """The Usage page: GPU-hours per team per bucket against nominal quota, busy % per bucket, queue
    wait percentiles per class, lost GPU-hours by cause. The numbers ride along as data-* attributes."""
    xs = [c - h.end for c in h.centers]
    span = h.end - h.start
    opts: dict[str, Any] = dict(width=560, height=220, x_range=(-span, 0.0), x_fmt=charts.fmt_ago,
                x_tick_values=[-span + i * span / 6 for i in range(7)])
    series = []
    for i, (team, values) in enumerate(sorted(h.team_gpu_hours.items())):
        css = f"s{i % 6}"
        series.append(charts.Series(team, list(zip(xs, values)), css))
        if team in h.team_nominal_gpu_hours:
            series.append(charts.Series(f"{team} quota", [(x, h.team_nominal_gpu_hours[team]) for x in xs],
                                        f"{css} quota"))
    per_bucket = charts.fmt_duration(h.bucket_s)
    teams = charts.line_chart(f"GPU-hours per team per {per_bucket} (dashed: nominal quota)", series, y_min=0.0,
                              **opts)
    teams.data.update({f"team-{t}": ",".join(f"{v:.6g}" for v in vals) for t, vals in h.team_gpu_hours.items()})
    busy = charts.line_chart(f"busy % of {h.capacity} GPUs", [charts.Series("busy", list(zip(xs, h.busy_pct)), "s1")],
                             y_min=0.0, y_max=100.0, y_fmt=lambda v: f"{v:.0f}%", **opts)
    busy.data["busy"] = ",".join(f"{v:.6g}" for v in h.busy_pct)
    waits = rep["waits"]
    wait = charts.bar_chart("queue wait p50 / p90 / p99 per class",
                            [(f"{w['class']} p{q}", w[f"p{q}_s"], f"s{k}") for w in waits
                             for k, q in enumerate((50, 90, 99))],
                            width=560, height=220, y_fmt=charts.fmt_duration, y_ticks=charts.duration_ticks,
                            empty="no attempt started in this period")
    wait.data.update({f"wait-{w['class']}": f"{w['p50_s']:.6g},{w['p90_s']:.6g},{w['p99_s']:.6g}" for w in waits})
    lost_by = sorted(rep["cluster"]["lost_by_cause"].items())
    lost = charts.bar_chart("lost GPU-hours by cause", [(c, v, "s3") for c, v in lost_by], width=560, height=220,
                            empty="no work lost in this period")
    lost.data.update({f"lost-{c}": f"{v:.6g}" for c, v in lost_by})
    return [teams, busy, wait, lost, ledger_chart(rep)]


def ledger_chart(rep: dict[str, Any]) -> charts.Chart:
    """The goodput ledger per team (its pools added up), a stacked bar each; the GPU-hours per
    bucket ride along as `data-ledger-<team>` (in contracts.LEDGER_BUCKETS' order)."""
    per: dict[str, dict[str, float]] = {}
    for t in rep["teams"]:
        row = per.setdefault(t["team"], {})
        for b, v in (t.get("buckets") or {}).items():
            row[b] = row.get(b, 0.0) + v
    stacks = sorted((team, row) for team, row in per.items() if any(row.values()))
    c = charts.stacked_bar_chart("where each team's GPU-hours went (goodput ledger)", stacks,
                                 empty="no GPU-hours in this period")
    c.data.update({f"ledger-{team}": ",".join(f"{row.get(b, 0.0):.6g}" for b in charts.LEDGER_CSS)
                   for team, row in stacks})
    return c


def goodput_chart(g: dict[str, Any]) -> charts.Chart:
    """A job's ledger, attempt by attempt in the order they ran (GPU-hours; a running one split now)."""
    stacks = [(f"#{a['attempt']}" + (" (live)" if a["live"] else ""), {b: v / 3600 for b, v in a["buckets"].items()})
              for a in g["attempts"]]
    c = charts.stacked_bar_chart("where its GPU-hours went, per attempt (goodput ledger)", stacks,
                                 empty="no attempt has run")
    c.data.update({f"attempt-{a['attempt']}": ",".join(f"{a['buckets'][b] / 3600:.6g}" for b in charts.LEDGER_CSS)
                   for a in g["attempts"]})
    return c
