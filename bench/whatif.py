"""Benchmark: the what-if over 30 days of 500 jobs a day (15,000 jobs) of the cluster's own history
(issue 40: "30 days of 500 jobs a day replay in ≤ 10 s").

    .venv/bin/python bench/whatif.py [--days 30] [--per-day 500] [--nodes 10] [--seed 0] [--json]

Seeding (not timed): a SQLite store (`open_store`, migrated as `yard up` does) gets `--days` ×
`--per-day` finished jobs of three teams of one cohort on `--nodes` × 8 GPUs (team-a half of the
demand and of the GPUs, team-b and team-c a quarter each), submitted at random over each day, 1/2/4/8 GPUs
(40/30/20/10%), true run times log-uniform 10 min – 4 h, classes training 50% / batch 40% /
interactive 10%, time limits the next of 1/2/4/8 h above twice the run time; a tenth have two
attempts (the first preempted, 15 minutes of it lost). On 10 nodes (80 GPUs) the replay's
utilization is 0.82 with p99 waits of an hour or two; on 12 nodes 0.68 and minutes; on 16 nodes
0.51 and no wait.

Timed, each once, with `time.perf_counter` in this process (and, for the read and the two
replays here, the process's CPU time, `time.process_time`, which other work on the machine does
not inflate the way it inflates wall time):
- read: `services.whatif.history_records` (the store's jobs and attempts → the trace);
- replay in force: `sim.history.replay` through the configuration (of 80 GPUs: team-a 40, team-b
  and team-c 20 each);
- replay proposal: through team-a's quota halved (20), the half split between team-b and team-c (30);
- both side by side: `services.whatif.replay_both`, the proposal's replay in a spawned child
  process while this one replays the configuration in force (checked to give the same figures);
- the what-if: read + both side by side (what `POST /api/v1/cluster/config/what-if` does after
  its validation, which is the same as apply's and takes milliseconds); and read + both one
  after the other, for comparison.

Target: the what-if ≤ 10 s. Prints a summary, or one JSON line with `--json`; reports, does not
fail on a missed target.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from pathlib import Path

from _yard import conditions

from trainyard.services.accounting import Window
from trainyard.services.whatif import history_records, replay_both
from trainyard.sim.history import replay
from trainyard.spec.models import parse_config
from trainyard.store.db import open_store, sqlite_url
from trainyard.store.models import AttemptRow, JobRow

CONFIG = """\
cluster:
  name: bench
  nodes:
    - {name: node, count: NODES, gpus: 8, gpu_model: emulated, gpu_mem_gb: 80, block: b0, rack: r0}
teams:
  - {name: team-a, cohort: lab, quotas: {default: {nominal: A}}}
  - {name: team-b, cohort: lab, quotas: {default: {nominal: B}}}
  - {name: team-c, cohort: lab, quotas: {default: {nominal: B}}}
classes:
  - {name: interactive, priority: 300, preemptible: false, max_wait: 15m, max_run_time: 8h, grace_period: 0}
  - {name: training, priority: 200, preemptible: true, max_wait: 24h, min_run_time: 10m, grace_period: 2m,
     checkpoint_on_notice: true}
  - {name: batch, priority: 100, preemptible: true, max_wait: 3d, min_run_time: 0, grace_period: 1m}
default_class: training
"""
_H, _DAY = 3600.0, 86400.0


def seed_store(url: str, days: int, per_day: int, seed: int, origin: float) -> None:
    rng = random.Random(f"bench-whatif:{seed}")
    store = open_store(url)
    jobs, attempts = [], []
    for i in range(days * per_day):
        submit = origin + (i // per_day) * _DAY + rng.uniform(0, _DAY)
        team = rng.choices(("team-a", "team-b", "team-c"), (0.5, 0.25, 0.25))[0]
        cls = rng.choices(("training", "batch", "interactive"), (0.5, 0.4, 0.1))[0]
        gpus = rng.choices((1, 2, 4, 8), (0.4, 0.3, 0.2, 0.1))[0]
        run = math.exp(rng.uniform(math.log(600), math.log(4 * _H)))
        limit = next((h * _H for h in (1, 2, 4, 8) if h * _H >= 2 * run), 8 * _H)
        start = submit + rng.uniform(0, 600)
        two = rng.random() < 0.1
        lost = 900.0 * gpus if two else 0.0
        spans = [(start, start + 1800.0 + 900.0), (start + 3600.0, start + 3600.0 + run - 1800.0)] if two and run > 1800 \
            else [(start, start + run)]
        if len(spans) == 1:
            lost = 0.0
        jobs.append({"id": i + 1, "name": f"{cls}-{i}", "user": "u", "team": team, "job_class": cls, "pool": "default",
                     "state": "COMPLETED", "command": ["true"], "workdir": "/tmp", "gpus": gpus, "time_limit_s": limit,
                     "checkpoint_interval_s": 900.0, "submit_time": submit, "queued_since": submit,
                     "start_time": spans[-1][0], "end_time": spans[-1][1], "lost_gpu_s": lost, "env": {}})
        for k, (a, b) in enumerate(spans):
            last = k == len(spans) - 1
            attempts.append({"job_id": i + 1, "attempt": k, "placement": [], "started_at": a, "ended_at": b,
                             "state": "COMPLETED" if last else "PREEMPTED", "cause": "completed" if last else "preempted",
                             "gpus": gpus, "lost_gpu_s": 0.0 if last else lost})
    with store.session() as s:
        s.execute(JobRow.__table__.insert(), jobs)
        s.execute(AttemptRow.__table__.insert(), attempts)
        s.commit()
    store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--per-day", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=10, help="nodes of 8 GPUs (10: utilization 0.82)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    now = time.time()
    origin = now - (args.days + 1) * _DAY
    gpus = 8 * args.nodes
    config = CONFIG.replace("NODES", str(args.nodes))
    in_force = config.replace("nominal: A", f"nominal: {gpus // 2}").replace("nominal: B", f"nominal: {gpus // 4}")
    proposal = config.replace("nominal: A", f"nominal: {gpus // 4}").replace("nominal: B", f"nominal: {gpus * 3 // 8}")
    with tempfile.TemporaryDirectory() as tmp:
        url = sqlite_url(Path(tmp))
        seed_store(url, args.days, args.per_day, args.seed, origin)
        store = open_store(url, migrated=True)
        t0, c0 = time.perf_counter(), time.process_time()
        with store.session() as s:
            records = history_records(s, Window(origin, now), now)
        t1, c1 = time.perf_counter(), time.process_time()
        before = replay(records, parse_config(in_force))
        t2, c2 = time.perf_counter(), time.process_time()
        after = replay(records, parse_config(proposal))
        t3, c3 = time.perf_counter(), time.process_time()
        both = replay_both(records, (in_force, "in force"), (proposal, "proposal"))
        t4 = time.perf_counter()
        store.close()
    assert [x["metrics"] | {"sim_wall_s": 0} for x in both] == [x["metrics"] | {"sim_wall_s": 0} for x in (before, after)]
    out = {
        "jobs": len(records), "gpus": gpus, "read_s": round(t1 - t0, 2), "replay_in_force_s": round(t2 - t1, 2),
        "replay_proposal_s": round(t3 - t2, 2), "both_side_by_side_s": round(t4 - t3, 2),
        "what_if_s": round(t1 - t0 + t4 - t3, 2), "sequential_what_if_s": round(t3 - t0, 2),
        "cpu_s": {"read": round(c1 - c0, 2), "replay_in_force": round(c2 - c1, 2), "replay_proposal": round(c3 - c2, 2)},
        "cycles": [before["metrics"]["cycles"], after["metrics"]["cycles"]],
        "utilization": before["metrics"]["utilization"],
        "p99_wait_s": {t: [before["teams"][t]["p99_wait_s"], after["teams"][t]["p99_wait_s"]] for t in before["teams"]},
        "target_met": t1 - t0 + t4 - t3 <= 10.0, **conditions(),
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
