"""`yard report [SECTION]`: usage over a period, sreport's habits (services/usage_report.py defines
every figure).

    yard report                          yesterday, every section
    yard report teams -S now-30days      per team and pool: GPU-hours, quota, borrowed and lent
    yard report users --csv -S 2026-11-01 -E 2026-12-01

Sections: `cluster`, `pools`, `teams`, `users`, `waits` (queue wait per class), `lost` (lost
GPU-hours by cause, per team), `outcomes` (jobs by final state, per team); `summary` (the
default) prints them all. The teams and users sections end with the goodput ledger's buckets
(GPU-hours; docs/accounting.md, "Goodput ledger").

    yard report goodput [-S -E] [--by cluster|team|user|node|class]

is the ledger alone (`GET /api/v1/report/goodput`): per bucket GPU-hours and the goodput (the
compute share) of each row, by every section or those named in `--by` (comma-separated).

    yard report estimates [-S/--since -E] [--by class|team] [--json]

how good the estimated starts were (`GET /api/v1/report/estimates`, services/estimates_report.py):
per class (or team) the attempts started in the period after being given an estimate, p50/p90 of
|actual start − first estimate|, the share that started late, and p50/p90 for the last estimate.

The period is sreport's: 00:00 yesterday to 00:00 today unless given (`-S` alone runs to now).
`--csv` writes the section as CSV (with `summary`, each section after a `# name` line),
`-P/--parsable2` '|'-separated, `--json` the whole report as the API gives it.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from typing import Any, Callable, Optional

import typer

from trainyard.cli.acct import hms, when
from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.contracts import LEDGER_BUCKETS
from trainyard.spec.parsing import parse_time

SECTIONS = ("summary", "cluster", "pools", "teams", "users", "waits", "lost", "outcomes", "goodput", "estimates")
ESTIMATES_BY = ("class", "team")  # services/estimates_report.BY
GOODPUT_BY = ("cluster", "team", "user", "node", "class")  # services/goodput_report.SECTIONS
LEDGER = LEDGER_BUCKETS
LEDGER_HEADER = ["StartupGPUh", "ComputeGPUh", "DataWaitGPUh", "CkptStallGPUh", "CommWaitGPUh", "RecomputeGPUh",
                 "IdleGPUh", "TeardownGPUh"]


def _h(v: float | None) -> str:
    return "" if v is None else f"{v:.2f}"


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}"


def _rate(v: float | None) -> str:
    return "" if v is None else f"{100 * v:.1f}"


def _totals(r: dict[str, Any]) -> list[str]:
    return [_h(r["gpu_hours"]), _h(r["useful_gpu_hours"]), _h(r["lost_gpu_hours"]), str(r["jobs_ended"]),
            _rate(r["oom_rate"]), str(r["preemptions_suffered"]), str(r["preemptions_caused"])]


TOTALS = ["GPUh", "UsefulGPUh", "LostGPUh", "JobsEnded", "OOM%", "Preempted", "PreemptsCaused"]


def _ledger(buckets: dict[str, float] | None, unit: float = 1.0) -> list[str]:
    """The buckets as GPU-hours cells (`unit`: seconds per unit of the figures given)."""
    return [_h((buckets or {}).get(b, 0.0) / unit) for b in LEDGER]


def goodput_tables(rep: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Each section of the goodput report (GPU-seconds from the API) as (header, rows) of GPU-hours."""
    return {name: ([name.capitalize(), "GPUh", *LEDGER_HEADER, "Goodput%"],
                   [[r["key"], _h(r["allocated_gpu_s"] / 3600), *_ledger(r["buckets"], 3600), _rate(r["goodput"])]
                    for r in rows]) for name, rows in rep["sections"].items()}


def tables(rep: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """Each section as (header, rows) of text cells."""
    c = rep["cluster"]
    lost_rows = [["(cluster)", "", cause, _h(h)] for cause, h in sorted(c["lost_by_cause"].items())]
    lost_rows += [[t["team"], t["pool"], cause, _h(h)] for t in rep["teams"] for cause, h in
                  sorted(t["lost_by_cause"].items())]
    return {
        "cluster": (["Cluster", "GPUs", "CapacityGPUh", "Busy%", *TOTALS],
                    [[c["cluster"], str(c["gpus"]), _h(c["capacity_gpu_hours"]), _pct(c["busy_pct"]), *_totals(c)]]),
        "pools": (["Pool", "GPUs", "CapacityGPUh", "Busy%", *TOTALS],
                  [[p["pool"], str(p["gpus"]), _h(p["capacity_gpu_hours"]), _pct(p["busy_pct"]), *_totals(p)]
                   for p in rep["pools"]]),
        "teams": (["Team", "Pool", "Nominal", "NominalGPUh", "PoolShare%", "Quota%", "BorrowedGPUh", "LentGPUh",
                   *TOTALS, *LEDGER_HEADER],
                  [[t["team"], t["pool"], str(t["nominal_gpus"]), _h(t["nominal_gpu_hours"]),
                    _pct(t["share_of_pool_pct"]), _pct(t["quota_used_pct"]), _h(t["borrowed_gpu_hours"]),
                    _h(t["lent_gpu_hours"]), *_totals(t), *_ledger(t.get("buckets"))] for t in rep["teams"]]),
        "users": (["Team", "User", *TOTALS, *LEDGER_HEADER],
                  [[u["team"], u["user"], *_totals(u), *_ledger(u.get("buckets"))] for u in rep["users"]]),
        "waits": (["Class", "Attempts", "Mean", "P50", "P90", "P99", "Max"],
                  [[w["class"], str(w["attempts"]), *(hms(w[k]) for k in ("mean_s", "p50_s", "p90_s", "p99_s",
                                                                             "max_s"))] for w in rep["waits"]]),
        "lost": (["Team", "Pool", "Cause", "LostGPUh"], lost_rows),
        "outcomes": (["Team", "Pool", "State", "Jobs"],
                     [[t["team"], t["pool"], st, str(n)] for t in rep["teams"]
                      for st, n in sorted(t["jobs_by_state"].items())]),
    }


def estimates_table(rep: dict[str, Any]) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The estimates report as one table: per class (or team), the errors as [DD-]HH:MM:SS."""
    return {"estimates": ([rep["by"].capitalize(), "Starts", "P50Err", "P90Err", "Late%", "MeanErr", "P50LastErr",
                           "P90LastErr"],
                          [[r["key"], str(r["starts"]), hms(r["p50_abs_error_s"]), hms(r["p90_abs_error_s"]),
                            _rate(r["late_share"]), ("-" if r["mean_error_s"] < 0 else "") + hms(abs(r["mean_error_s"])),
                            hms(r["p50_abs_last_error_s"]), hms(r["p90_abs_last_error_s"])] for r in rep["rows"]])}


def _aligned(header: list[str], rows: list[list[str]], write: Callable[[str], Any], noheader: bool) -> None:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]
    lines = [] if noheader else [header, ["-" * w for w in widths]]
    for r in lines + rows:
        write("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
              + "\n")


def report(
    section: str = typer.Argument("summary", help=f"one of {', '.join(SECTIONS)}"),
    start: Optional[str] = typer.Option(None, "-S", "--start", "--since", help="period start (default 00:00 yesterday): "
                                        "now-30days, 2026-11-01, 11/01 …"),
    end: Optional[str] = typer.Option(None, "-E", "--end", help="period end (default 00:00 today; now with -S)"),
    as_csv: bool = typer.Option(False, "--csv", help="CSV"),
    parsable2: bool = typer.Option(False, "-P", "--parsable2", help="'|'-separated"),
    noheader: bool = typer.Option(False, "-n", "--noheader", help="no header lines"),
    as_json: bool = typer.Option(False, "--json", help="the whole report as JSON"),
    by: Optional[str] = typer.Option(None, "--by", help="goodput: cluster,team,user,node,class (default all); "
                                     "estimates: class or team (default class)"),
) -> None:
    """Usage over a period (sreport): GPU-hours per cluster, pool, team and user, quota, busy %, waits, losses."""
    if section not in SECTIONS:
        fail(f"SECTION: {section!r} is not one of {', '.join(SECTIONS)}")
    now = time.time()
    s = e = None
    try:
        if start is not None:
            s = parse_time(start, now)
    except ValueError as err:
        fail(f"--start: {err}")
    try:
        if end is not None:
            e = parse_time(end, now)
    except ValueError as err:
        fail(f"--end: {err}")
    if s is None:
        s = parse_time("yesterday", now)
    if e is None:
        e = now if start is not None else parse_time("today", now)
    if e < s:
        fail(f"--end ({when(e)}) is before --start ({when(s)})")
    if by is not None and section not in ("goodput", "estimates"):
        fail("--by: only with the goodput and estimates sections (yard report goodput --by team)")
    if section == "estimates" and by is not None and by not in ESTIMATES_BY:
        fail(f"--by: {by[:40]!r} is not one of {', '.join(ESTIMATES_BY)}")
    bad = [x for x in (by or "").split(",") if x.strip() and x.strip() not in GOODPUT_BY]
    if bad and section == "goodput":
        fail(f"--by: {bad[0].strip()[:40]!r} is not one of {', '.join(GOODPUT_BY)}")
    period = {"start": f"@{s!r}", "end": f"@{e!r}"}
    if section == "estimates":
        rep = Client().get("/api/v1/report/estimates", params={**period, "by": by or "class"})
        parts, names = estimates_table(rep), ["estimates"]
    elif section == "goodput":
        rep = Client().get("/api/v1/report/goodput", params={**period, **({"by": by} if by else {})})
        parts, names = goodput_tables(rep), list(rep["sections"])
    else:
        rep = Client().get("/api/v1/report", params=period)
        parts = tables(rep)
        names = [x for x in SECTIONS[1:-2]] if section == "summary" else [section]
    if as_json:
        typer.echo(json.dumps(rep, indent=2))
        return
    out = sys.stdout
    if as_csv or parsable2:
        w = csv.writer(out, delimiter="|" if parsable2 and not as_csv else ",", lineterminator="\n")
        for i, name in enumerate(names):
            header, rows = parts[name]
            if len(names) > 1:
                out.write(("\n" if i else "") + f"# {name}\n")
            if not noheader:
                w.writerow(header)
            w.writerows(rows)
        return
    if not noheader and section == "goodput":
        out.write(f"Goodput ledger from {when(rep['start'])} to {when(rep['end'])} (GPU-hours)\n")
    elif not noheader and section == "estimates":
        out.write(f"Estimated starts against actual ones, attempts started from {when(rep['start'])} to "
                  f"{when(rep['end'])} (errors: actual - first estimate; late: over {rep['late_after_s']:.0f} s)\n")
    elif not noheader:
        out.write(f"Usage of {rep['cluster']['cluster']} from {when(rep['start'])} to {when(rep['end'])} "
                  f"(GPU-hours; configuration version {rep['config_version']})\n")
    for name in names:
        header, rows = parts[name]
        if not noheader:
            out.write(f"\n{name}" + (f" (users shown: {rep['users_shown']})" if name in ("users", "user") else "") + "\n")
        _aligned(header, rows, out.write, noheader)
