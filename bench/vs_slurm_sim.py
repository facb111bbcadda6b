"""The workload of `bench/vs_slurm.py` replayed through the simulator, in under a second.

    .venv/bin/python bench/vs_slurm_sim.py [--seeds 1,2,3] [--max-wait-training 10m] [--worst 5]

Why: the real side-by-side run takes ~14 minutes on this machine, too slow to try an engine
change against. This replays the same jobs (`vs_slurm.workload`, same seed) on the cluster, teams
and classes of the very config the real run gives `yard up` (`vs_slurm.yard_config`, read by
`load_config(...).to_sched()` as `yard sim --config` reads it), with what the plane tells the
engine there: every job's 20-minute time limit as its estimate,
a checkpoint every 5 steps (one step a second) and on the notice. The simulator's costs are set
to what the real run measures: a restart takes ~1 s, the job leaves ~1 s after its notice,
cycles run every second. Seed 1 at stop 31: training wait mean 76.5 s, p99 333.7 s (the real
plane's run the same day: 74.6 s, 318.6 s), batch mean 207.2 s (207.8 s), mean JCT 159.2 s
(157.5 s). It is a proxy to rank changes by, not the benchmark: the figures of record are the
real run's (bench/README.md, "Side by side with real Slurm").

Per seed: wait mean and p99 per class, mean JCT, preemptions, quota violations, and the
`--worst` training jobs by wait (id, team, GPUs, wait, preemptions).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "bench")]

import vs_slurm  # noqa: E402
from _yard import percentile  # noqa: E402
from trainyard.spec.parsing import parse_duration  # noqa: E402
from trainyard.sched.engine import EngineParams, TrainyardPolicy  # noqa: E402
from trainyard.sched.types import JobRequest  # noqa: E402
from trainyard.spec.models import load_config  # noqa: E402
from trainyard.sim.result import SimResult  # noqa: E402
from trainyard.sim.simulator import SimParams, simulate  # noqa: E402
from trainyard.sim.workload import SimJob, Workload  # noqa: E402

TIME_LIMIT_S = vs_slurm.TIME_LIMIT_MIN * 60.0  # the plane passes a job's time limit as its estimate
CHECKPOINT_S = 5.0  # vs_slurm_job.py saves every 5 one-second steps
# What the real run measures (bench/README.md part 11): restart and notice about a second each.
SIM = SimParams(restart_overhead_s=1.0, stop_delay_s=1.0, notice_save_s=0.1, tick_s=1.0,
                default_checkpoint_interval_s=CHECKPOINT_S)


def build(seed: int, jobs: int = 60, span: float = 300.0, max_wait_training_s: float | None = None) -> Workload:
    """vs_slurm's workload on the cluster, teams and classes of its yard config; `max_wait_training_s`
    overrides the training class's max wait (None: the config's)."""
    with tempfile.TemporaryDirectory() as tmp:
        nodes, teams, classes = load_config(vs_slurm.yard_config(Path(tmp) / "cluster.yaml")).to_sched()
    if max_wait_training_s is not None:
        classes["training"] = replace(classes["training"], max_wait_s=max_wait_training_s)
    sim_jobs = [SimJob(JobRequest(j.index, j.team, j.job_class, j.arrive_s, gpus=j.gpus, gpus_per_node=j.gpus,
                                  est_runtime_s=TIME_LIMIT_S, checkpoint_interval_s=CHECKPOINT_S), float(j.steps))
                for j in vs_slurm.workload(jobs, span, seed)]
    return Workload(nodes, teams, classes, sim_jobs, name=f"vs_slurm seed {seed}")


def summary(res: SimResult, worst: int) -> dict:
    out: dict = {}
    for cls in vs_slurm.CLASSES:
        waits = [r.wait_s for r in res.jobs if r.job_class == cls]
        if waits:
            out[cls] = {"wait_mean_s": round(statistics.fmean(waits), 1), "wait_p99_s": round(percentile(waits, 0.99), 1)}
    out["jct_mean_s"] = round(statistics.fmean(r.end - r.submit for r in res.jobs if r.end is not None), 1)
    out["preemptions"] = sum(r.preemptions for r in res.jobs)
    out["quota_violations"] = res.quota_violations
    tail = sorted((r for r in res.jobs if r.job_class == "training"), key=lambda r: -r.wait_s)[:worst]
    out["worst_training"] = [[r.id, r.team, r.gpus, round(r.wait_s), r.preemptions] for r in tail]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3", help="workload seeds (vs_slurm.py runs seed 1)")
    ap.add_argument("--max-wait-training", default=None, help="override the training class's max wait (vs_slurm's config: 24h)")
    ap.add_argument("--worst", type=int, default=5)
    a = ap.parse_args()
    mw = None if a.max_wait_training is None else parse_duration(a.max_wait_training)
    for seed in (int(s) for s in a.seeds.split(",")):
        res = simulate(build(seed, max_wait_training_s=mw), TrainyardPolicy(EngineParams()), SIM)
        print(seed, json.dumps(summary(res, a.worst)), flush=True)


if __name__ == "__main__":
    main()
