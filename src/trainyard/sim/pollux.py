"""Loader for the Pollux (OSDI'21) simulator workloads as a `Workload` (`yard sim --format pollux`).

A workload file (`workload-N.csv`, $TRAINYARD_TRACES/pollux-sia-workloads/pollux_workloads) has the
columns `name,time,application,num_replicas,batch_size`: 160 jobs submitted over 8 hours, each an
application trained with the replica count and total batch size Tiresias ran it with in Pollux's
evaluation ("+TunedJobs"). The world is Pollux's, so that the published figures are the yardstick
(Pollux 2,751 s, Tiresias 4,038 s, Optimus 5,682 s mean JCT over the eight workloads):

- **Cluster**: 16 nodes of 4 GPUs (Pollux's simulator default; `cluster` may change it), racks
  of 8 nodes, one block; 16 GB per GPU (not used: the jobs ask for whole GPUs).
- **One team** (`pollux`) whose nominal quota is the whole cluster, no cohort: the workloads
  have no teams, so every rule between teams is idle and only what a policy does inside one
  team's own quota shows (issue 20 part 3: least-attained-service within a team, which this
  team turns on, `las`, as a team whose work is all alike would). Every job is of class
  `training` (the example config's classes).
- **Jobs**: `gpus = num_replicas` (anywhere, packed on the fewest nodes); run time from
  `sim.pollux_runtimes` (the configuration alone on a compact placement) plus the 30 s Pollux
  charges for an allocation; a restart costs the same 30 s (`Workload.restart_overhead_s`), and
  a checkpoint is taken every 30 minutes besides the one on a preemption notice. Ids are the
  1-based data row; each job keeps its `name` as label. All jobs are measured.

Raises `ConfigError` naming the file, the 1-based line and the column for a malformed row (wrong
number of values, a time that is not a non-negative integer, an unknown application, a replica
count or batch size that is not a positive integer, a configuration without a run time in the
table, more replicas than the cluster has GPUs) or a header without the needed columns.
"""

from __future__ import annotations

import csv
from pathlib import Path

from trainyard.sched.cluster import gb_to_mib
from trainyard.sched.types import ALL_CLASSES, JobRequest, Quota, Team
from trainyard.sim.philly import make_nodes, parse_cluster_shape
from trainyard.sim.pollux_runtimes import RUN_S
from trainyard.sim.workload import SimJob, Workload
from trainyard.spec.models import EXAMPLE_CONFIG, ConfigError, load_config

REQUIRED = ("name", "time", "application", "num_replicas", "batch_size")
DEFAULT_CLUSTER = "16x4"
TEAM = "pollux"
JOB_CLASS = "training"
ALLOCATION_S = 30.0  # what Pollux's simulator charges each (re)allocation
CHECKPOINT_INTERVAL_S = 1800.0
GPU_MEM_MIB = gb_to_mib(16.0)
APPLICATIONS = sorted({a for a, _, _ in RUN_S})


def _err(path: Path, line: int, field: str, msg: str) -> ConfigError:
    return ConfigError(msg, file=str(path), line=line, field=field)


def _positive_int(path: Path, line: int, field: str, value: str, allow_zero: bool = False) -> int:
    try:
        v = int(value)
    except ValueError:
        raise _err(path, line, field, f"{field} {value!r} is not an integer") from None
    if v < 0 or (v == 0 and not allow_zero):
        raise _err(path, line, field, f"{field} must be {'non-negative' if allow_zero else 'positive'}, got {v}")
    return v


def load_pollux(path: str | Path, cluster: str | None = None, las: bool = True) -> Workload:
    """One Pollux workload file as a `Workload` (see the module docstring).

    Raises:
        ConfigError: the file cannot be read, or a header or row is malformed (file, line and
            column named), or `cluster` is not NxG.
    """
    path = Path(path)
    n_nodes, gpn = parse_cluster_shape(cluster or DEFAULT_CLUSTER)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror or e}", file=str(path)) from None
    rows = list(csv.reader(text.splitlines()))
    if not rows:
        raise _err(path, 1, "header", f"empty file; expected the columns {', '.join(REQUIRED)}")
    header = [h.strip() for h in rows[0]]
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise _err(path, 1, missing[0], f"header lacks column(s) {', '.join(missing)}; got {', '.join(header)}")
    col = {c: header.index(c) for c in REQUIRED}
    total = n_nodes * gpn
    jobs: list[SimJob] = []
    for k, row in enumerate(rows[1:], start=1):
        line = k + 1
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != len(header):
            raise _err(path, line, "row", f"{len(row)} values, expected {len(header)} ({', '.join(header)})")
        val = {c: row[i].strip() for c, i in col.items()}
        t = _positive_int(path, line, "time", val["time"], allow_zero=True)
        app = val["application"]
        if app not in APPLICATIONS:
            raise _err(path, line, "application", f"unknown application {app!r}; known: {', '.join(APPLICATIONS)}")
        n = _positive_int(path, line, "num_replicas", val["num_replicas"])
        b = _positive_int(path, line, "batch_size", val["batch_size"])
        run = RUN_S.get((app, n, b))
        if run is None:
            known = ", ".join(f"{r}x{bs}" for a, r, bs in sorted(RUN_S) if a == app)
            raise _err(path, line, "num_replicas",
                       f"no run time for {app} at {n} replicas and batch size {b}; known (replicas x batch): {known}")
        if n > total:
            raise _err(path, line, "num_replicas", f"{n} replicas, more than the cluster's {total} GPUs")
        req = JobRequest(k, TEAM, JOB_CLASS, float(t), gpus=n, checkpoint_interval_s=CHECKPOINT_INTERVAL_S)
        jobs.append(SimJob(req, run + ALLOCATION_S, label=val["name"] or f"row{k}"))
    if not jobs:
        raise _err(path, 2, "row", "no jobs")
    jobs.sort(key=lambda j: (j.req.submit_time, j.req.id))
    _, _, classes = load_config(EXAMPLE_CONFIG).to_sched()
    teams = {TEAM: Team(TEAM, None, {"default": Quota(total)}, frozenset({ALL_CLASSES}) if las else frozenset())}
    notes = [
        f"Pollux workload {path.name}: {len(jobs)} jobs; one team '{TEAM}' with the whole cluster "
        f"({total} GPUs) as its nominal quota; every job of class '{JOB_CLASS}'.",
        "Run times: each configuration alone on a compact placement, from Pollux's throughput and "
        f"efficiency traces (sim/pollux_runtimes.py), plus {ALLOCATION_S:.0f} s per allocation; a "
        f"restart costs {ALLOCATION_S:.0f} s.",
        "Published mean JCT over the 8 workloads (64 GPUs): Pollux 2,751 s, Tiresias 4,038 s, Optimus 5,682 s.",
    ]
    last = jobs[-1].req.submit_time
    return Workload(make_nodes(n_nodes, gpn, GPU_MEM_MIB, rack_nodes=8, block_racks=max(1, -(-n_nodes // 8))),
                    teams, classes, jobs, measure_from=0.0, measure_to=last + 1.0, name=f"pollux {path.stem}",
                    notes=notes, restart_overhead_s=ALLOCATION_S)
