"""A recorded day of a synthetic 3-team workload, as the store would hold it (the what-if tests).

`day_workload()` draws one day of jobs of three teams of one cohort (`tests/fixtures/three_teams.yaml`):
`team-a` asks for about half the GPU time, `team-b` and `team-c` a quarter each, all together a
little more than the 16 GPUs give while the day is busy (08:00–20:00), 1–4 GPUs each, 20 to 90
minutes, `training` (checkpoints every 15 min) or `batch`. `recorded_day()` replays it through the
configuration in force with the simulator and returns what the control loop would have written:
each job with its attempts (start, end, GPUs, cause) and the work it lost.

Why the simulator and not the plane's loop on the fake backend for a simulated day: the rows are
the same kinds (jobs, attempts, lost work), the simulator runs the same engine, and it makes the
day in a fraction of a second where the loop would take thousands of passes; the what-if reads
only those rows. `write_day()` writes them through the store's models into a real store, and
`yard_up_with_a_recorded_day()` is a real `yard up` whose store holds the day.
"""

from __future__ import annotations

import math
import random
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from sqlalchemy.orm import Session

from trainyard.sched.types import JobRequest
from trainyard.sim.simulator import SimParams, simulate
from trainyard.sim.workload import SimJob, Workload
from trainyard.spec.models import ConfigSpec, load_config
from trainyard.store.db import open_store, sqlite_url
from trainyard.store.models import AttemptRow, JobRow

if TYPE_CHECKING:
    from tests.yard_cluster import YardCluster

THREE_TEAMS = Path(__file__).parents[1] / "fixtures" / "three_teams.yaml"
DAY_ORIGIN_AGO_S = 2 * 86400.0  # the tests write the day from two days ago (all of it ended before now)
SHARES = (("team-a", 0.5), ("team-b", 0.25), ("team-c", 0.25))
_H = 3600.0


@dataclass
class RecordedJob:
    req: JobRequest
    run_s: float
    attempts: list[tuple[float, float, int, str]] = field(default_factory=list)  # start, end, GPUs, cause
    lost_gpu_s: float = 0.0


def day_workload(spec: ConfigSpec, seed: int = 1, jobs: int = 100) -> Workload:
    rng = random.Random(f"recorded-day:{seed}")
    nodes, teams, classes = spec.to_sched()
    out: list[SimJob] = []
    for i in range(jobs):
        t = rng.uniform(8 * _H, 20 * _H)
        team = rng.choices([n for n, _ in SHARES], [s for _, s in SHARES])[0]
        cls = "training" if rng.random() < 0.5 else "batch"
        gpus = rng.choice((1, 1, 2, 2, 4))
        run = math.exp(rng.uniform(math.log(20 * 60), math.log(90 * 60)))
        limit = 2 * _H if run < 1.5 * _H else 4 * _H
        out.append(SimJob(JobRequest(i + 1, team, cls, t, gpus=gpus, est_runtime_s=limit,
                                     checkpoint_interval_s=900.0), run))
    out.sort(key=lambda j: (j.req.submit_time, j.req.id))
    return Workload(nodes=nodes, teams=teams, classes=classes, jobs=out, name="recorded day")


def recorded_day(config: Path = THREE_TEAMS, seed: int = 1, jobs: int = 100) -> list[RecordedJob]:
    """The day as the configuration in force ran it (see the module notes)."""
    spec = load_config(config)
    w = day_workload(spec, seed, jobs)
    by_id = {j.req.id: RecordedJob(j.req, j.duration_s) for j in w.jobs}
    res = simulate(w, spec.scheduler.build(), SimParams(seed=1),
                   on_attempt=lambda job, start, end: by_id[job].attempts.append((start, end, by_id[job].req.gpus, "")))
    for rec in res.jobs:
        rj = by_id[rec.id]
        rj.lost_gpu_s = rec.lost_gpu_s
        rj.attempts = [(a, b, g, "preempted" if k < len(rj.attempts) - 1 else "completed")
                       for k, (a, b, g, _) in enumerate(rj.attempts)]
    return list(by_id.values())


def write_day(s: Session, day: list[RecordedJob], origin: float) -> None:
    """The day's jobs and attempts as rows, times from `origin` (Unix seconds), ids as drawn."""
    for rj in day:
        r = rj.req
        ends = [b for _, b, _, _ in rj.attempts]
        s.add(JobRow(id=r.id, name=f"{r.job_class}-{r.id}", user="alice", team=r.team, job_class=r.job_class,
                     pool="default", state="COMPLETED", command=["true"], workdir="/tmp", gpus=r.gpus,
                     time_limit_s=r.est_runtime_s, checkpoint_interval_s=r.checkpoint_interval_s,
                     submit_time=origin + r.submit_time, queued_since=origin + r.submit_time,
                     attempt=max(0, len(rj.attempts) - 1),
                     start_time=origin + rj.attempts[-1][0] if rj.attempts else None,
                     end_time=origin + ends[-1] if ends else None, exit_code=0, lost_gpu_s=rj.lost_gpu_s))
    s.flush()  # the jobs before their attempts (foreign keys)
    for rj in day:
        for k, (a, b, g, cause) in enumerate(rj.attempts):
            s.add(AttemptRow(job_id=rj.req.id, attempt=k, placement=[], started_at=origin + a, ended_at=origin + b,
                             state="COMPLETED" if cause == "completed" else "PREEMPTED", cause=cause, gpus=g,
                             exit_code=0 if cause == "completed" else None))


def half_quota(text: str) -> str:
    """`text` (tests/fixtures/three_teams.yaml's) with team-a's nominal quota halved, the half
    split between team-b and team-c (halved alone, the 4 GPUs would be no one's: a cohort lends
    only its members' nominal quotas, and every team's waits rise)."""
    a, b = text.split("name: team-b", 1)
    return a.replace("{nominal: 8}", "{nominal: 4}") + "name: team-b" + b.replace("{nominal: 4}", "{nominal: 6}")


@contextmanager
def yard_up_with_a_recorded_day(path: Path) -> Iterator[YardCluster]:
    """A real `yard up` (local backend, three_teams.yaml) whose store holds the recorded day,
    written while the plane is down, then the plane started again."""
    from tests.yard_cluster import YardCluster

    c = YardCluster(path, "local", config_file=THREE_TEAMS)
    try:
        c.server.terminate()
        store = open_store(sqlite_url(c.data_dir))
        with store.session() as s:
            write_day(s, recorded_day(), time.time() - DAY_ORIGIN_AGO_S)
            s.commit()
        store.close()
        c.restart()
        yield c
    finally:
        c.stop()
