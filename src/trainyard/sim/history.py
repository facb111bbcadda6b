"""The cluster's own history as a trace (`yard sim --format trainyard`), and its loader.

A trainyard trace is JSON lines, one job a line, written by `yard trace export` (from the store:
`trainyard.services.whatif.history_records`) and replayed by `yard sim --format trainyard
--config CLUSTER.yaml` and by `yard cluster apply FILE --what-if`. Both replays build their
`Workload` here (`workload_from`), from the same records, so the what-if's figures for the
configuration in force are exactly those of `yard sim` on the exported trace.

One line (`RECORD_FIELDS`; times in seconds, `submit_time` a Unix time):

    {"id": 17, "name": "train", "user": "alice", "team": "vision", "class": "training",
     "pool": "default", "submit_time": 1733500000.0, "gpus": 4, "gpus_per_node": null,
     "nodes_min": 1, "nodes_max": 1, "gpu_mem_mib": null, "time_limit_s": 7200.0,
     "checkpoint_interval_s": 1800.0, "run_time_s": 5400.0, "run_time_known": true,
     "attempts": 2, "preemptions": 1, "lost_gpu_s": 240.0, "state": "COMPLETED"}

- `submit_time`: when the scheduler could first start it (its eligible time, `--begin`, where it
  had one; else its submission), as the live engine reads it.
- `gpus`: its GPUs at its smallest size; with `gpus_per_node`, a gang of `nodes_min..nodes_max`.
- `time_limit_s`: its wall-time limit, the estimate the live engine is told; the replay's
  `est_runtime_s` (`--estimates user` reads it as is: it is what the user wrote).
- `run_time_s`: the true run time the job needed at its largest size (`true_run_s`): the
  GPU-seconds its attempts held less the work they lost (`lost_gpu_s`: work since a checkpoint
  thrown away at a preemption or failure, restart overheads), divided by its largest GPU count.
  For a job killed at its time limit, cancelled or failed, it is what it used: the replay gives
  it the same GPU time (the simulator enforces no limit, so the replay cannot know more). For a
  job still running when the trace was taken, what it has used so far, `run_time_known: false`:
  a lower bound.
- `attempts`, `preemptions`, `state`: what happened on the cluster, for study; the replay does
  not read them (it makes its own decisions).

Jobs that never started (pending when the trace was taken, or cancelled while waiting) are not
in the trace: their run time is unknown. Dependencies, node constraints and reservations are not
carried (the replay starts a job when the policy would, from its submit time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from trainyard.sched.types import JobRequest
from trainyard.sim.workload import SimJob, Workload
from trainyard.spec.models import ConfigError, ConfigSpec

FORMAT = "trainyard"

# field -> (types it may have, whether null is allowed)
RECORD_FIELDS: dict[str, tuple[tuple[type, ...], bool]] = {
    "id": ((int,), False), "name": ((str,), False), "user": ((str,), False), "team": ((str,), False),
    "class": ((str,), False), "pool": ((str,), False), "submit_time": ((int, float), False),
    "gpus": ((int,), False), "gpus_per_node": ((int,), True), "nodes_min": ((int,), False),
    "nodes_max": ((int,), False), "gpu_mem_mib": ((int,), True), "time_limit_s": ((int, float), True),
    "checkpoint_interval_s": ((int, float), True), "run_time_s": ((int, float), False),
    "run_time_known": ((bool,), False), "attempts": ((int,), False), "preemptions": ((int,), False),
    "lost_gpu_s": ((int, float), False), "state": ((str,), False),
}


def true_run_s(attempts: Iterable[tuple[float, float, int]], lost_gpu_s: float, max_gpus: int) -> float:
    """The useful run time at the job's largest size: `attempts` are (start, end, GPUs held), the
    GPU-seconds they held less `lost_gpu_s`, over `max_gpus` (the simulator's work model: at g of
    G GPUs a job runs g/G as fast, so its useful GPU-seconds do not depend on its size)."""
    held = sum(max(0.0, end - start) * gpus for start, end, gpus in attempts)
    return max(0.0, held - lost_gpu_s) / max(1, max_gpus)


def check_record(rec: Any, where: str) -> dict[str, Any]:
    """`rec` as a record, every field present and of its type; ConfigError naming the field and
    `where` (file:line) otherwise."""
    if not isinstance(rec, dict):
        raise ConfigError(f"{where}: expected a JSON object, one job a line")
    for name, (types, nullable) in RECORD_FIELDS.items():
        if name not in rec:
            raise ConfigError(f"{where}: missing field {name!r}", field=name)
        v = rec[name]
        if v is None and nullable:
            continue
        ok = isinstance(v, bool) if bool in types else isinstance(v, types) and not isinstance(v, bool)
        if not ok or (isinstance(v, float) and not math.isfinite(v)):
            raise ConfigError(f"{where}: field {name!r} is {v!r}, expected {' or '.join(t.__name__ for t in types)}",
                              field=name)
    for name in ("gpus", "nodes_min", "nodes_max"):
        if rec[name] < 1:
            raise ConfigError(f"{where}: field {name!r} is {rec[name]}, must be at least 1", field=name)
    if rec["nodes_max"] < rec["nodes_min"]:
        raise ConfigError(f"{where}: nodes_max {rec['nodes_max']} is below nodes_min {rec['nodes_min']}",
                          field="nodes_max")
    if rec["gpus_per_node"] is not None and rec["gpus_per_node"] < 1:
        raise ConfigError(f"{where}: field 'gpus_per_node' must be at least 1", field="gpus_per_node")
    if rec["run_time_s"] < 0:
        raise ConfigError(f"{where}: field 'run_time_s' cannot be negative", field="run_time_s")
    return rec


def read_history(path: Path) -> list[dict[str, Any]]:
    """The records of a trainyard trace file, each checked (`check_record`); blank lines skipped.

    Raises:
        ConfigError: the file cannot be read, a line is not JSON, or a record is bad (file:line).
    """
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    out: list[dict[str, Any]] = []
    seen: set[int] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{where}: not JSON ({e.msg})") from None
        check_record(rec, where)
        if rec["id"] in seen:
            raise ConfigError(f"{where}: job id {rec['id']} appears twice", field="id")
        seen.add(rec["id"])
        out.append(rec)
    return out


def write_history(records: Iterable[Mapping[str, Any]]) -> str:
    """The trace's text: one record a line, its fields in `RECORD_FIELDS`' order."""
    return "".join(json.dumps({k: r[k] for k in RECORD_FIELDS}) + "\n" for r in records)


def request_of(rec: Mapping[str, Any], origin: float) -> JobRequest:
    """The engine's request for one record, its submit time counted from `origin`."""
    gpn = rec["gpus_per_node"]
    return JobRequest(
        id=rec["id"], team=rec["team"], job_class=rec["class"], submit_time=rec["submit_time"] - origin,
        gpus=rec["gpus"] if gpn is None else gpn * rec["nodes_min"], gpus_per_node=gpn, min_nodes=rec["nodes_min"],
        max_nodes=rec["nodes_max"], gpu_mem_mib=rec["gpu_mem_mib"],
        est_runtime_s=None if rec["time_limit_s"] is None else float(rec["time_limit_s"]),
        checkpoint_interval_s=rec["checkpoint_interval_s"], pool=rec["pool"])


def workload_from(records: Iterable[Mapping[str, Any]], spec: ConfigSpec, name: str = "trainyard history") -> Workload:
    """The workload a configuration replays: its nodes, teams and classes, and the recorded jobs.

    Time 0 is the first recorded submission. A job of a team or class the configuration does not
    have is left out, and the notes say how many and why (a proposal that removes a team has no
    one to charge its jobs to). Every job is measured (the history has no warm-up)."""
    nodes, teams, classes = spec.to_sched()
    recs = sorted(records, key=lambda r: (r["submit_time"], r["id"]))
    origin = float(recs[0]["submit_time"]) if recs else 0.0
    jobs: list[SimJob] = []
    left_out: dict[str, int] = {}
    for r in recs:
        why = (f"team {r['team']!r}" if r["team"] not in teams else
               f"class {r['class']!r}" if r["class"] not in classes else None)
        if why is not None:
            left_out[why] = left_out.get(why, 0) + 1
            continue
        jobs.append(SimJob(request_of(r, origin), float(r["run_time_s"])))
    notes = [f"{len(jobs)} jobs of the cluster's own history (run times: attempts' GPU time less lost work)"]
    notes += [f"{n} jobs left out: the configuration has no {why}" for why, n in sorted(left_out.items())]
    # Measured up to the last submission (just past it, so that job counts): the window that
    # utilization is taken over, as a trace's own window is.
    last = jobs[-1].req.submit_time if jobs else 0.0
    return Workload(nodes=nodes, teams=teams, classes=classes, jobs=jobs, name=name, notes=notes,
                    measure_to=math.nextafter(last, math.inf),
                    origin=datetime.fromtimestamp(origin, timezone.utc) if recs else None)


# The simulator's parameters of a replay of the history: `yard sim`'s defaults (its `--seed 1`, no
# node failures), so that the what-if and `yard sim --format trainyard` replay alike.
REPLAY_SEED = 1


def replay(records: Iterable[Mapping[str, Any]], spec: ConfigSpec, name: str = "trainyard history") -> dict[str, Any]:
    """The history replayed through `spec`'s nodes, teams, classes and scheduler (the policy and
    its parameters, as the control loop builds it): `metrics` (`sim.result.metrics`), per `teams`
    and `classes` (`sim.breakdown`), and the workload's `notes`."""
    from trainyard.sim.breakdown import breakdown
    from trainyard.sim.result import metrics
    from trainyard.sim.simulator import SimParams, simulate

    w = workload_from(records, spec, name)
    res = simulate(w, spec.scheduler.build(), SimParams(seed=REPLAY_SEED))
    return {"policy": spec.scheduler.policy, "metrics": metrics(res), **breakdown(res, w), "notes": w.notes}
