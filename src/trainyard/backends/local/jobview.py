"""This job as Slurm's in-job tools show it (`scontrol show job`, `squeue`, `sinfo`), from the
attempt's `batch.json` (written by `local/batch.py`, readable by the job's owner).

Why from the file: a job's token (TRAINYARD_TOKEN) reads its own job only, and a tool inside a
job must answer even when the plane is restarting; the file has the allocation, the owner, the
time limit, the start and the cluster's nodes. What only the plane knows of other jobs is not
shown (as a Slurm site with `PrivateData=jobs` shows a user only their own jobs).

Standard library only, run with -I -S from the attempt's own copy of the tools (`job_tools.py`).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone

BATCH_FILE = "batch.json"


class ViewError(Exception):
    """The job's record cannot be read; the message says why."""


def load(run_dir: str) -> dict:
    """The attempt's batch.json.

    Raises:
        ViewError: it cannot be read or is not JSON.
    """
    try:
        with open(os.path.join(run_dir, BATCH_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ViewError(f"cannot read this job's record ({run_dir}/{BATCH_FILE}): {e}") from None


def job_nodes(batch: dict) -> list[str]:
    return list(dict.fromkeys(s["node"] for s in batch.get("slots") or []))


def duration(seconds: float | None) -> str:
    """Slurm's [days-]hours:minutes:seconds (squeue's TIME drops leading zero fields: 0:05)."""
    if seconds is None:
        return "UNLIMITED"
    s = int(max(0, seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def short_duration(seconds: float) -> str:
    """squeue's TIME: minutes:seconds, hours and days only when there are some (0:05, 1:02:03)."""
    s = int(max(0, seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def elapsed(batch: dict, now: float | None = None) -> float:
    start = batch.get("start_epoch")
    return max(0.0, (now or time.time()) - float(start)) if start else 0.0


def _iso(epoch: float | None) -> str:
    if not epoch:
        return "Unknown"
    return datetime.fromtimestamp(float(epoch), timezone.utc).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def fields(batch: dict, now: float | None = None) -> dict[str, str]:
    """`scontrol show job`'s keys for this job, in Slurm's order and formats."""
    info = batch.get("info") or {}
    nodes = job_nodes(batch)
    hostlist = batch.get("nodelist") or ",".join(nodes)
    limit = batch.get("time_limit_s")
    start = batch.get("start_epoch")
    gpus = sum(len(v) for v in (batch.get("node_gpus") or {}).values())
    cpt = info.get("cpus_per_task") or 1
    ntasks = len(batch.get("slots") or [])
    out = {
        "JobId": str(batch.get("job_id", "")), "JobName": info.get("name") or "",
        "UserId": f"{batch.get('user', '')}({batch.get('uid', '')})",
        "GroupId": f"{batch.get('group', '')}({batch.get('gid', '')})",
        "Priority": "0", "Account": info.get("team") or "", "QOS": info.get("job_class") or "",
        "JobState": "RUNNING", "Reason": "None", "Restarts": str(max(0, int(batch.get("attempt", 1)) - 1)),
        "RunTime": duration(elapsed(batch, now)), "TimeLimit": duration(limit) if limit else "UNLIMITED",
        "StartTime": _iso(start), "EndTime": _iso(float(start) + float(limit)) if start and limit else "Unknown",
        "Partition": info.get("pool") or "", "BatchHost": nodes[0] if nodes else "",
        "NodeList": hostlist, "NumNodes": str(len(nodes)), "NumCPUs": str(ntasks * cpt),
        "NumTasks": str(ntasks), "CPUs/Task": str(cpt),
        "TRES": f"cpu={ntasks * cpt},node={len(nodes)}" + (f",gres/gpu={gpus}" if gpus else ""),
        "MinMemoryNode": f"{batch['mem_mib']}M" if batch.get("mem_mib") else "0",
        "Command": batch.get("command") or "", "WorkDir": batch.get("workdir") or "",
        "StdErr": batch.get("stderr") or "", "StdIn": "/dev/null", "StdOut": batch.get("stdout") or "",
        "ClusterName": info.get("cluster") or "",
    }
    return out


def show_job(batch: dict, now: float | None = None) -> str:
    """`scontrol show job`'s layout: key=value pairs, a few to a line, lines indented by 3."""
    f = fields(batch, now)
    rows = [["JobId", "JobName"], ["UserId", "GroupId"], ["Priority", "Account", "QOS"],
            ["JobState", "Reason", "Restarts"], ["RunTime", "TimeLimit"], ["StartTime", "EndTime"],
            ["Partition"], ["BatchHost"], ["NodeList"], ["NumNodes", "NumCPUs", "NumTasks", "CPUs/Task"],
            ["TRES"], ["MinMemoryNode"], ["Command"], ["WorkDir"], ["StdErr"], ["StdIn"], ["StdOut"],
            ["ClusterName"]]
    lines = [" ".join(f"{k}={f[k]}" for k in row) for row in rows]
    return lines[0] + "\n" + "".join(f"   {line}\n" for line in lines[1:]) + "\n"
