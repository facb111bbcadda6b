"""Simulation reports: `report.json`, `report.md` and PNG plots, written side by side per policy.

    write_report(out_dir, results, workload, meta)

- `report.json`: `{"policies": {NAME: metrics(result)}, "breakdown": {NAME: per team and class},
  "meta": {...}}`; the metric names and definitions are those of `trainyard.sim.result` (also
  docs/simulator.md), the breakdown's those of `trainyard.sim.breakdown`.
- `report.md`: one row per policy (the 14 headline metrics), the workload's notes (how quotas and
  everything else the trace does not say were derived) and the metric definitions.
- `utilization.png`: allocated GPUs / cluster GPUs over time, per policy (hourly time-weighted
  means of the step series, so a 50-day run stays light).
- `wait_cdf.png`: CDF of each measured job's total wait, per policy, log-x (zero waits drawn at 1 s).
- `team_share.png`: each team's allocated GPUs over time (hourly means) against its nominal quota
  (dashed), one panel for `trainyard` and one for a baseline (`kueue` if present, else the first
  other); at most 12 teams, the largest by nominal quota then by use, the rest summed as `other`.

`format_table` / `markdown_table` render the same table for the terminal and for markdown.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from trainyard.sim import result as result_mod
from trainyard.sim.breakdown import breakdown
from trainyard.sim.result import SimResult, metrics
from trainyard.sim.workload import Workload

COLUMNS = (
    "jobs", "utilization", "goodput", "avg_jct_s", "p50_jct_s", "p99_jct_s", "avg_wait_s", "p99_wait_s",
    "avg_bounded_slowdown", "makespan_s", "preemptions", "lost_gpu_hours", "lost_gpu_hours_if_ignored", "jain_fairness",
    "quota_violations",
)
# With a start estimator (`yard sim --start-estimator`): the error of the first estimated start of
# the jobs that waited (sim/estimates.py), after the columns above.
EST_COLUMNS = ("est_waited", "est_p50_abs_err_s", "est_p90_abs_err_s", "est_late_share")
DEFINITIONS_POINTER = "docs/simulator.md; src/trainyard/sim/result.py (module docstring)"
MAX_TEAMS = 12
BIN_S = 3600.0


def _human_s(s: float) -> str:
    if s < 60:
        return f"{s:.0f}s"
    if round(s / 60, 1) < 60:
        return f"{s / 60:.1f}m"
    if round(s / 3600, 2) < 24:
        return f"{s / 3600:.2f}h"
    return f"{s / 86400:.2f}d"


def format_value(name: str, value: Any, *, with_seconds: bool = True) -> str:
    """A metric as shown in tables: durations as `12345 s (3.43h)`, ratios with 3 decimals."""
    if value is None:
        return "-"
    if name.endswith("_s"):
        return f"{value:.0f} s ({_human_s(value)})" if with_seconds else _human_s(value)
    if name in ("utilization", "goodput", "jain_fairness", "est_late_share"):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.2f}" if not value.is_integer() or name.startswith("lost_gpu_hours") else f"{value:.0f}"
    return str(value)


def all_metrics(results: dict[str, SimResult]) -> dict[str, dict[str, float | int]]:
    return {name: metrics(res) for name, res in results.items()}


def columns_of(ms: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    """The columns shown: `COLUMNS`, and `EST_COLUMNS` where a run measured its estimates."""
    return COLUMNS + (EST_COLUMNS if any(EST_COLUMNS[0] in m for m in ms.values()) else ())


def markdown_table(results: dict[str, SimResult] | dict[str, dict[str, Any]]) -> str:
    """A markdown table, one row per policy; takes results or already computed metrics."""
    ms = {k: (metrics(v) if isinstance(v, SimResult) else v) for k, v in results.items()}
    cols = columns_of(ms)
    lines = ["| policy | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for name, m in ms.items():
        lines.append(f"| {name} | " + " | ".join(format_value(c, m.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def format_table(results: dict[str, SimResult] | dict[str, dict[str, Any]], title: str | None = None):
    """The same figures as a `rich.table.Table` for the terminal: one row per metric, one column
    per policy (14 metric columns do not fit a terminal; 6 policies do), durations human-readable."""
    from rich.table import Table

    ms = {k: (metrics(v) if isinstance(v, SimResult) else v) for k, v in results.items()}
    table = Table(title=title)
    table.add_column("metric", style="bold", no_wrap=True)
    for name in ms:
        table.add_column(name, justify="right", no_wrap=True)
    for c in columns_of(ms):
        table.add_row(c, *(format_value(c, m.get(c), with_seconds=False) for m in ms.values()))
    return table


def _definitions() -> str:
    doc = result_mod.__doc__ or ""
    i = doc.find("Definitions")
    return doc[i:].strip() if i >= 0 else doc.strip()


# -- plots ----------------------------------------------------------------------------------------


def hourly_means(series: list[tuple[float, int]], start: float, end: float, bin_s: float = BIN_S):
    """Time-weighted mean of a step series (value holds from each point to the next) per bin.

    Returns (bin start times, means) as numpy arrays; the value before the first point is 0.
    """
    import numpy as np

    if end <= start:
        end = start + bin_s
    n_bins = max(1, math.ceil((end - start) / bin_s))
    edges = start + bin_s * np.arange(n_bins + 1)
    if not series:
        return edges[:-1], np.zeros(n_bins)
    pts = sorted(series, key=lambda p: p[0])
    t = np.array([p[0] for p in pts], dtype=float)
    v = np.array([p[1] for p in pts], dtype=float)
    cum = np.concatenate(([0.0], np.cumsum(v[:-1] * np.diff(t))))  # integral from t[0] to t[k]

    def integral(x):
        k = np.searchsorted(t, x, side="right") - 1
        kk = np.clip(k, 0, len(t) - 1)
        val = cum[kk] + v[kk] * (x - t[kk])
        return np.where(k < 0, 0.0, val)

    f = integral(edges)
    widths = np.diff(edges)
    return edges[:-1], np.diff(f) / widths


def _span(res: SimResult) -> tuple[float, float]:
    times = [p[0] for p in res.util_series] + [res.end_time, res.measure_to]
    return 0.0, max([x for x in times if x is not None] + [BIN_S])


def _plot_utilization(path: Path, results: dict[str, SimResult], workload: Workload) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4))
    for name, res in results.items():
        start, end = _span(res)
        x, y = hourly_means(res.util_series, start, end)
        ax.step(x / 86400, y / max(1, res.total_gpus), where="post", label=name, linewidth=1)
    ax.axvspan(0, workload.measure_from / 86400, color="grey", alpha=0.12, label="warm-up")
    if workload.measure_to is not None:
        ax.axvline(workload.measure_to / 86400, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel(f"days since {workload.origin:%Y-%m-%d %H:%M}" if workload.origin else "days")
    ax.set_ylabel("allocated GPUs / total (hourly mean)")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"GPU utilization — {workload.name}")
    ax.legend(loc="lower right", fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_wait_cdf(path: Path, results: dict[str, SimResult], workload: Workload) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, res in results.items():
        w = np.sort(np.array([max(1.0, r.wait_s) for r in res.jobs if r.measured], dtype=float))
        if len(w) == 0:
            continue
        ax.step(w, np.arange(1, len(w) + 1) / len(w), where="post", label=name, linewidth=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("total wait per job, s (log; waits under 1 s drawn at 1 s)")
    ax.set_ylabel("fraction of measured jobs")
    ax.set_ylim(0, 1.01)
    for s, lbl in ((60, "1m"), (3600, "1h"), (86400, "1d")):
        ax.axvline(s, color="grey", linewidth=0.5, linestyle=":")
        ax.text(s, 0.02, lbl, fontsize=7, color="grey")
    ax.set_title(f"Wait-time CDF — {workload.name}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _share_policies(results: dict[str, SimResult]) -> list[str]:
    names = list(results)
    chosen = [n for n in names if n == "trainyard"]
    others = [n for n in names if n != "trainyard"]
    if others:
        chosen.append("kueue" if "kueue" in others else others[0])
    return chosen


def _plot_team_share(path: Path, results: dict[str, SimResult], workload: Workload) -> None:
    import matplotlib.pyplot as plt
    import numpy as np

    panels = _share_policies(results)
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.6 * max(1, len(panels))), squeeze=False, sharex=True)
    cmap = plt.get_cmap("tab10" if len(workload.teams) <= 10 else "tab20")
    for ax, name in zip(axes[:, 0], panels):
        res = results[name]
        nominal = dict(res.nominal) or {t: tm.quota("default").nominal for t, tm in workload.teams.items()}
        teams = sorted(set(nominal) | set(res.team_series))
        used = {t: sum(v for _, v in res.team_series.get(t, [])) for t in teams}
        teams.sort(key=lambda t: (-nominal.get(t, 0), -used[t], t))
        shown, rest = teams, []
        if len(teams) > MAX_TEAMS:
            shown, rest = teams[:MAX_TEAMS - 1], teams[MAX_TEAMS - 1:]
        start, end = _span(res)
        for k, team in enumerate(shown):
            color = cmap(k % cmap.N)
            x, y = hourly_means(res.team_series.get(team, []), start, end)
            ax.step(x / 86400, y, where="post", color=color, linewidth=1, label=team)
            ax.axhline(nominal.get(team, 0), color=color, linestyle="--", linewidth=0.8)
        if rest:
            ys = [hourly_means(res.team_series.get(t, []), start, end) for t in rest]
            x = ys[0][0]
            y = np.sum([yy for _, yy in ys], axis=0)
            ax.step(x / 86400, y, where="post", color="black", linewidth=1, label=f"other ({len(rest)})")
            ax.axhline(sum(nominal.get(t, 0) for t in rest), color="black", linestyle="--", linewidth=0.8)
        ax.axvspan(0, workload.measure_from / 86400, color="grey", alpha=0.12)
        ax.set_ylabel("GPUs (hourly mean)")
        ax.set_title(f"{name}: each team's GPUs (solid) against its nominal quota (dashed)", fontsize=10)
        ax.legend(loc="upper right", fontsize=7, ncol=3)
    axes[-1, 0].set_xlabel(f"days since {workload.origin:%Y-%m-%d %H:%M}" if workload.origin else "days")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# -- the report -----------------------------------------------------------------------------------


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return str(x)


def write_report(out_dir: str | Path, results: dict[str, SimResult], workload: Workload, meta: dict) -> dict:
    """Write report.json, report.md and the three PNGs (with matplotlib: trainyard[sim]) into `out_dir`.

    Returns the JSON document written.
    """
    try:
        import matplotlib
    except ImportError:  # `pip install trainyard` has no plotting; trainyard[sim] does
        plots = False
    else:
        matplotlib.use("Agg")
        plots = True
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ms = all_metrics(results)
    doc = {
        "policies": ms,
        "breakdown": {name: breakdown(res, workload) for name, res in results.items()},  # sim/breakdown.py
        "meta": _jsonable({
            **meta,
            "workload": workload.name,
            "total_gpus": workload.total_gpus,
            "nodes": len(workload.nodes),
            "jobs_loaded": len(workload.jobs),
            "measure_from_s": workload.measure_from,
            "measure_to_s": workload.measure_to,
            "origin": workload.origin.isoformat() if workload.origin else None,
            "nominal_quotas": {t: {p: q.nominal for p, q in tm.quotas.items()} for t, tm in workload.teams.items()},
            "notes": list(workload.notes),
            "definitions": DEFINITIONS_POINTER,
        }),
    }
    (out / "report.json").write_text(json.dumps(doc, indent=2) + "\n")

    args = " ".join(f"{k}={v}" for k, v in meta.items() if k != "command")
    md = [f"# Simulation report — {workload.name}", ""]
    if "command" in meta:
        md += ["```", str(meta["command"]), "```", ""]
    elif args:
        md += [f"Arguments: {args}", ""]
    md += [f"{workload.total_gpus} GPUs on {len(workload.nodes)} nodes; {len(workload.jobs)} jobs loaded, "
           f"{sum(1 for j in workload.jobs if workload.measured(j.req.submit_time))} measured.", "",
           "## Results", "", markdown_table(ms), "",
           *(["![utilization](utilization.png)", "", "![wait CDF](wait_cdf.png)", "",
              "![team share](team_share.png)", ""] if plots else
             ["(No plots: matplotlib is not installed; `pip install 'trainyard[sim]'` draws them.)", ""]),
           "## Workload notes", ""]
    md += [f"- {n}" for n in workload.notes] or ["- (none)"]
    md += ["", "## Metric definitions", "", _definitions(), ""]
    (out / "report.md").write_text("\n".join(md))

    if plots:
        _plot_utilization(out / "utilization.png", results, workload)
        _plot_wait_cdf(out / "wait_cdf.png", results, workload)
        _plot_team_share(out / "team_share.png", results, workload)
    return doc
