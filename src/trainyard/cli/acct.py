"""`yard acct`: job accounting with sacct's habits (services/accounting.py says what each figure means).

    yard acct -S now-7days -A vision -s CD,F,OOM -o jobid,jobname,state,elapsed,gpuhours%10
    yard acct --attempts -j 42            one line per attempt (sacct --duplicates)
    yard acct -P -n -o team,gpuhours       for scripts: '|'-separated, no header

Columns have fixed widths (`field%N` sets one; a longer value is cut and ends in '+'), so lines
print as the pages arrive: the first comes after one small page, however long the window.
`--parsable2` separates with '|' (`--parsable` also ends each line with one), `--json` writes
one JSON document (`{"start", "end", "jobs" | "attempts"}`), also as the pages arrive.

Times (`-S`, `-E`) are read in your time zone (`spec.parsing.parse_time`: now-7days, today, 08:00,
2026-11-01T08:00, 11/01, 1101 …); the default window is today, 00:00 to now, as sacct's. A time
that cannot be read, an end before the start or an unknown `--format` field is an error naming
the option (exit 2) before anything is asked of the server.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional

import typer

from trainyard.cli.client import Client
from trainyard.cli.common import fail
from trainyard.spec.parsing import parse_time

FIRST_PAGE = 200  # small, so that the first line prints at once
PAGE = 5000


def when(t: float | None) -> str:
    """sacct's time format, local time; `Unknown` for a time not (yet) known."""
    return "Unknown" if t is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))


def hms(seconds: float | None) -> str:
    """sacct's elapsed format: [D-]HH:MM:SS."""
    if seconds is None:
        return ""
    s = max(0, int(round(seconds)))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def _pct(v: float | None) -> str:
    return "" if v is None else f"{v:.1f}%"


def _num(v: float | None, digits: int = 4) -> str:
    return "" if v is None else f"{v:.{digits}f}"


def _mib(v: float | None) -> str:
    return "" if v is None else f"{v:.0f}M"


# the goodput ledger's buckets as fields: (name, header, bucket, what it holds)
LEDGER_FIELDS = (
    ("startup", "StartupGPUh", "startup", "allocation to the first step"),
    ("compute", "ComputeGPUh", "compute", "steps that count"),
    ("datawait", "DataWaitGPUh", "data_wait", "steps waiting for data"),
    ("ckptstall", "CkptStallGPUh", "checkpoint_stall", "the part of saves the loop waited for"),
    ("commwait", "CommWaitGPUh", "comm_wait", "collectives beyond the fastest rank"),
    ("recompute", "RecomputeGPUh", "recompute", "work since the last checkpoint, redone"),
    ("idle", "IdleGPUh", "idle", "allocated, no step, no startup"),
    ("teardown", "TeardownGPUh", "teardown", "from the stop to the end"),
)


def _bucket(bucket: str) -> Callable[[dict[str, Any]], str]:
    return lambda r: _num((r.get("ledger") or {}).get(bucket))


@dataclass(frozen=True)
class Field:
    name: str  # as --format takes it (case-insensitive)
    header: str
    width: int
    show: Callable[[dict[str, Any]], str]
    help: str
    aliases: tuple[str, ...] = ()
    right: bool = False


def _exit(r: dict[str, Any]) -> str:
    return f"{'' if r['exit_code'] is None else r['exit_code']}:{r['signal'] or 0}" \
        if r["exit_code"] is not None or r["signal"] is not None else ""


def _lost_causes(r: dict[str, Any]) -> str:
    return ",".join(f"{k}:{v:.4f}" for k, v in sorted(r.get("lost_by_cause", {}).items()))


def _id(r: dict[str, Any]) -> str:
    if "job_id" in r:
        return str(r["job_id"])
    return str(r["id"]) if r.get("array_job_id") is None else f"{r['array_job_id']}_{r['array_task_id']}"


FIELDS: tuple[Field, ...] = (
    Field("jobid", "JobID", 12, _id, "job id (an array task as ARRAY_TASK)", ("id",)),
    Field("attempt", "Attempt", 7, lambda r: str(r.get("attempt", r.get("attempts", ""))),
          "the attempt's number (with --attempts; else how many)", right=True),
    Field("jobname", "JobName", 14, lambda r: r["name"], "job name", ("name",)),
    Field("user", "User", 10, lambda r: r["user"], "who submitted it"),
    Field("team", "Team", 10, lambda r: r["team"], "team (sacct's Account)", ("account",)),
    Field("class", "Class", 11, lambda r: r["class"], "job class (sacct's QOS)", ("qos",)),
    Field("pool", "Pool", 9, lambda r: r["pool"], "pool (sacct's Partition)", ("partition",)),
    Field("state", "State", 13, lambda r: r["state"], "state (of the job; with --attempts how the attempt ended)"),
    Field("exitcode", "ExitCode", 8, _exit, "exit code:signal of the last attempt", ("exit",)),
    Field("cause", "Cause", 10, lambda r: r["cause"], "why the (last) attempt ended: completed, preempted, "
          "node_lost, hung, oom, crash, user_error, timeout, cancelled, requeued"),
    Field("reason", "Reason", 24, lambda r: r["reason"], "the state's reason"),
    Field("submit", "Submit", 19, lambda r: when(r.get("submit")), "submitted at"),
    Field("eligible", "Eligible", 19, lambda r: when(r.get("eligible")), "free to run from (begin time, "
          "dependency, release)"),
    Field("start", "Start", 19, lambda r: when(r["start"]), "(first attempt) started at"),
    Field("end", "End", 19, lambda r: when(r["end"]), "ended at (Unknown while it runs or waits)"),
    Field("elapsed", "Elapsed", 11, lambda r: hms(r["elapsed_s"]), "run time (of all its attempts)", right=True),
    Field("wait", "Wait", 11, lambda r: hms(r["wait_s"]), "time waiting to (re)start", ("planned", "reserved"),
          right=True),
    Field("timelimit", "Timelimit", 11, lambda r: hms(r.get("time_limit_s")) if r.get("time_limit_s") else
          "UNLIMITED", "time limit", right=True),
    Field("nnodes", "NNodes", 6, lambda r: str(r["nnodes"]), "nodes (of the last attempt)", right=True),
    Field("nodelist", "NodeList", 20, lambda r: ",".join(r["nodelist"]), "nodes (of the last attempt)"),
    Field("gpus", "GPUs", 5, lambda r: str(r["gpus"]), "GPUs allocated (of the last attempt)", ("allocgpus",),
          right=True),
    Field("reqgpus", "ReqGPUs", 7, lambda r: str(r.get("req_gpus", r["gpus"])), "GPUs asked for", right=True),
    Field("gpuhours", "GPUHours", 10, lambda r: _num(r["gpu_hours"]), "GPU-hours allocated", ("gpu_hours",),
          right=True),
    Field("usefulgpuhours", "UsefulGPUh", 10, lambda r: _num(r["useful_gpu_hours"]),
          "GPU-hours not lost (allocated - lost)", right=True),
    Field("lostgpuhours", "LostGPUh", 10, lambda r: _num(r["lost_gpu_hours"]),
          "GPU-hours of work thrown away (since the last checkpoint, when an attempt ended)", right=True),
    Field("lostcauses", "LostBy", 24, _lost_causes, "lost GPU-hours by cause", ("lostby",)),
    *(Field(name, head, max(10, len(head)), _bucket(bucket), f"GPU-hours of the goodput ledger's {bucket} bucket ({what})",
            right=True) for name, head, bucket, what in LEDGER_FIELDS),
    Field("goodput", "Goodput", 7, lambda r: "" if r.get("goodput") is None else f"{100 * r['goodput']:.1f}%",
          "the compute share of the allocated GPU-hours (docs/accounting.md, Goodput ledger)", right=True),
    Field("attempts", "Attempts", 8, lambda r: str(r.get("attempts", 1)), "attempts (starts)", right=True),
    Field("retries", "Retries", 7, lambda r: str(r.get("retries", "")), "automatic retries after failures",
          right=True),
    Field("maxrss", "MaxRSS", 8, lambda r: _mib(r["max_rss_mib"]), "highest RSS the runtime reported (rank 0)",
          right=True),
    Field("peakgpumem", "PeakGPUMem", 10, lambda r: _mib(r["peak_gpu_mem_mib"]),
          "highest GPU memory the runtime reported (rank 0)", right=True),
    # per-GPU telemetry (issue 39; docs/control-plane.md, "GPU telemetry"), from the attempts' gpu_summary
    Field("gpuutil", "GPUUtil", 7, lambda r: _pct(r.get("gpu_util_mean")), "GPU utilization, mean over its GPUs "
          "(telemetry)", right=True),
    Field("gpuutilmax", "GPUUtilMax", 10, lambda r: _pct(r.get("gpu_util_peak")), "the highest utilization a GPU "
          "of it read", right=True),
    Field("gpumem", "GPUMem", 8, lambda r: _mib(r.get("gpu_mem_peak_mib")), "the most memory a GPU of it held "
          "(telemetry)", right=True),
    Field("image", "Image", 40, lambda r: r.get("image") or "", "its image (pyxis's --container-image, "
          "normalised; empty: it ran bare)", ("container",)),
    Field("imagedigest", "ImageDigest", 19, lambda r: r.get("image_digest") or "", "the image digest it ran "
          "(pinned at its first attempt; %71 for the whole digest)", ("digest",)),
)
BY_NAME = {n: f for f in FIELDS for n in (f.name, *f.aliases)}
DEFAULT_FORMAT = "jobid,jobname,team,user,class,state,cause,start,elapsed,gpus,gpuhours,lostgpuhours"
DEFAULT_ATTEMPT_FORMAT = "jobid,attempt,jobname,team,state,cause,start,end,elapsed,wait,gpus,gpuhours,lostgpuhours"


def parse_format(text: str, option: str = "--format") -> list[tuple[Field, int]]:
    """`field[%width],…` (sacct's form, any case) → fields with widths; an unknown one fails naming `option`."""
    out = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        name, _, width = part.partition("%")
        f = BY_NAME.get(name.lower())
        if f is None:
            fail(f"{option}: unknown field {name!r}; fields are {', '.join(x.name for x in FIELDS)} "
                 "(yard acct --helpformat)")
        if width and not (width.isascii() and width.isdigit() and 0 < int(width) <= 1000):
            fail(f"{option}: {part!r}: the width after % must be a whole number from 1 to 1000")
        out.append((f, int(width) if width else f.width))
    if not out:
        fail(f"{option}: name at least one field")
    return out


def _cell(text: str, width: int, right: bool) -> str:
    if len(text) > width:
        return text[:width - 1] + "+"
    return text.rjust(width) if right else text.ljust(width)


def _time_arg(value: str | None, option: str, now: float) -> float | None:
    if value is None:
        return None
    try:
        return parse_time(value, now)
    except ValueError as e:
        fail(f"{option}: {e}")


def acct(
    starttime: Optional[str] = typer.Option(None, "-S", "--starttime", help="window start (default 00:00 today): "
                                            "now-7days, today, 08:00, 2026-11-01T08:00, 11/01 …"),
    endtime: Optional[str] = typer.Option(None, "-E", "--endtime", help="window end (default now)"),
    jobs: Optional[str] = typer.Option(None, "-j", "--jobs", help="only these job ids (comma-separated)"),
    user: Optional[str] = typer.Option(None, "-u", "--user", help="only these users (comma-separated)"),
    team: Optional[str] = typer.Option(None, "-A", "--team", "--account", help="only these teams"),
    state: Optional[str] = typer.Option(None, "-s", "--state", help="only jobs now in these states: CD,F,OOM,CA,…"),
    job_class: Optional[str] = typer.Option(None, "-q", "--class", "--qos", help="only these classes"),
    pool: Optional[str] = typer.Option(None, "-r", "--pool", "--partition", help="only these pools"),
    node: Optional[str] = typer.Option(None, "-N", "--nodelist", help="only jobs that ran on these nodes"),
    fmt: Optional[str] = typer.Option(None, "-o", "--format", help="fields, field%width, comma-separated "
                                      "(--helpformat lists them)"),
    attempts: bool = typer.Option(False, "-D", "--attempts", "--duplicates", help="one line per attempt"),
    truncate: bool = typer.Option(False, "-T", "--truncate", help="count only the time inside the window"),
    parsable: bool = typer.Option(False, "-p", "--parsable", help="'|'-separated, ending in '|'"),
    parsable2: bool = typer.Option(False, "-P", "--parsable2", help="'|'-separated"),
    noheader: bool = typer.Option(False, "-n", "--noheader", help="no header line"),
    as_json: bool = typer.Option(False, "--json", help="one JSON document"),
    helpformat: bool = typer.Option(False, "-e", "--helpformat", help="list the fields and exit"),
) -> None:
    """Job accounting (sacct): finished, running and waiting jobs in a time window, with their GPU-hours."""
    if helpformat:
        for f in FIELDS:
            typer.echo(f"{f.name:<15} {('(' + ', '.join(f.aliases) + ') ') if f.aliases else ''}{f.help}")
        return
    now = time.time()
    fields = parse_format(fmt or (DEFAULT_ATTEMPT_FORMAT if attempts else DEFAULT_FORMAT))
    start = _time_arg(starttime, "--starttime", now)
    end = _time_arg(endtime, "--endtime", now)
    if start is None:
        start = parse_time("today", now)
    if end is None:
        end = now
    if end < start:
        fail(f"--endtime ({when(end)}) is before --starttime ({when(start)})")
    params = {"starttime": f"@{start!r}", "endtime": f"@{end!r}", "jobs": jobs, "user": user, "team": team,
              "state": state, "class": job_class, "pool": pool, "node": node,
              "truncate": "true" if truncate else None}
    params = {k: v for k, v in params.items() if v is not None}
    key = "attempts" if attempts else "jobs"
    pages = _pages(Client(), f"/api/v1/acct/{key}", params, key)
    out = sys.stdout
    if as_json:
        _write_json(out, pages, key, start, end)
        return
    sep = "|" if parsable or parsable2 else None
    if not noheader:
        out.write(_line([f.header for f, _ in fields], fields, sep, parsable))
        if sep is None:
            out.write(" ".join("-" * w for _, w in fields) + "\n")
    for _, records in pages:
        out.write("".join(_line([f.show(r) for f, _ in fields], fields, sep, parsable) for r in records))
        out.flush()


def _line(cells: list[str], fields: list[tuple[Field, int]], sep: str | None, trailing: bool) -> str:
    if sep is not None:
        return sep.join(c.replace("|", "/").replace("\n", " ") for c in cells) + (sep if trailing else "") + "\n"
    return " ".join(_cell(c, w, f.right) for c, (f, w) in zip(cells, fields)).rstrip() + "\n"


def _pages(c: Client, path: str, params: dict[str, Any], key: str) -> Iterator[tuple[dict[str, Any], list[dict]]]:
    """Each page as it comes: (the page, its records); a small first one, then big ones."""
    after, limit = 0, FIRST_PAGE
    while True:
        page = c.get(path, params={**params, "after": after, "limit": limit})
        yield page, page[key]
        if page["next_after"] is None:
            return
        after, limit = page["next_after"], PAGE


def _write_json(out: Any, pages: Iterator[tuple[dict[str, Any], list[dict]]], key: str, start: float,
                end: float) -> None:
    out.write(f'{{"start": {json.dumps(start)}, "end": {json.dumps(end)}, "{key}": [')
    first = True
    for _, records in pages:
        for r in records:
            out.write(("\n  " if first else ",\n  ") + json.dumps(r))
            first = False
        out.flush()
    out.write("\n]}\n" if not first else "]}\n")
