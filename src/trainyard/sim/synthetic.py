"""A generator of synthetic multi-team workloads with the three job classes.

`generate(jobs=400, cluster="8x8", seed=1, teams=3)` draws, deterministically from `seed`:

- **Cluster** `NxG` of 80 GB GPUs; topology: racks of 2 nodes and blocks of 2 racks up to 16
  nodes (as the example config), racks of 8 and blocks of 4 racks beyond.
- **Teams** `team-a`, `team-b`, … in one cohort `lab`, no borrowing or lending limits, with
  unequal nominal quotas in the ratio teams : teams−1 : … : 1 of the cluster's GPUs
  (largest-remainder rounding, so they sum to the cluster). Each job's team is drawn half in
  proportion to quota, half uniformly, so the small teams ask for more than their share and
  borrow, and the big ones must reclaim.
- **Classes** of the example config, in the proportions 25% `interactive`, 25% `training`,
  50% `batch`:
  - interactive: 1–2 GPUs, 5–60 min (log-uniform), submitted on weekdays 09:00–18:00; one in three
    asks for 20 GB per GPU (shares a GPU); no checkpoints (not preemptible anyway);
  - training: 1, 2, 4 or 8 GPUs on one node, or a 2-node gang of `gpus_per_node=G`
    (`min_nodes=max_nodes=2`), or an elastic job of 1–2 such nodes; 1 h – 24 h (log-uniform);
    checkpoint every 30 min; submitted at any hour;
  - batch: 1 GPU, 10 min – 2 h (log-uniform), submitted in bursts of ~20 jobs within a few minutes,
    bursts starting 18:00–23:00; one in four asks for 40 GB per GPU; checkpoint every 15 min.
- **Arrivals** of each class are a Poisson process whose rate follows the class's hours (drawn as
  i.i.d. times from that rate profile, which is the Poisson process conditioned on its count).
  The time span is sized so the offered load (GPU-seconds asked / cluster GPU-seconds) is 90%;
  `days` fixes the span instead (the resulting load is in the notes).
- **Warm-up**: the first 10% of the span is not measured.
- **Ids**: 0, 1, … in submission order (ints, as in the store); each job keeps the label `s<i>`
  (zero-padded to 5 digits), its id when ids were strings, from which its estimate is seeded.

Time 0 is a Monday at 00:00 (2024-01-01), so "working hours" and "evening" mean something.
"""

from __future__ import annotations

import math
import random
from datetime import datetime

from trainyard.sched.cluster import gb_to_mib
from trainyard.sched.types import JobRequest, Quota, Team
from trainyard.sim.philly import largest_remainder, make_nodes, parse_cluster_shape
from trainyard.sim.workload import SimJob, Workload
from trainyard.spec.models import EXAMPLE_CONFIG, ConfigError, load_config

ORIGIN = datetime(2024, 1, 1)  # a Monday
GPU_MEM_GB = 80.0
COHORT = "lab"
POOL = "default"
TARGET_LOAD = 0.9
WARMUP_FRACTION = 0.1
MIX = (("interactive", 0.25), ("training", 0.25), ("batch", 0.50))
BATCH_BURST = 20
_H = 3600.0
_DAY = 86400.0


def _log_uniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def _working_hours(t: float) -> bool:
    day = int(t // _DAY)
    hour = (t % _DAY) / _H
    return day % 7 < 5 and 9.0 <= hour < 18.0


def _times_in(rng: random.Random, n: int, span: float, ok) -> list[float]:
    """n i.i.d. times in [0, span) with density ∝ the indicator `ok` (uniform when it is too rare)."""
    out = []
    for _ in range(n):
        for _try in range(200):
            t = rng.uniform(0.0, span)
            if ok(t):
                break
        else:
            t = rng.uniform(0.0, span)
        out.append(t)
    return out


def _team_names(n: int) -> list[str]:
    names = []
    for i in range(n):
        s, k = "", i
        while True:
            s = chr(ord("a") + k % 26) + s
            k = k // 26 - 1
            if k < 0:
                break
        names.append(f"team-{s}")
    return names


def generate(*, jobs: int = 400, cluster: str = "8x8", seed: int = 1, teams: int = 3,
             days: float | None = None) -> Workload:
    """A synthetic workload (see the module notes). Same arguments → the same workload.

    Raises:
        ConfigError: a bad cluster shape, or a non-positive job count, team count or span.
    """
    n_nodes, gpn = parse_cluster_shape(cluster)
    if jobs < 1:
        raise ConfigError("the number of jobs must be at least 1", field="jobs")
    if teams < 1:
        raise ConfigError("the number of teams must be at least 1", field="teams")
    if days is not None and days <= 0:
        raise ConfigError("the span in days must be positive", field="days")
    rng = random.Random(f"synthetic:{seed}")
    total = n_nodes * gpn
    big = n_nodes > 16
    nodes = make_nodes(n_nodes, gpn, gb_to_mib(GPU_MEM_GB), rack_nodes=8 if big else 2, block_racks=4 if big else 2)

    names = _team_names(teams)
    weights = {nm: float(teams - i) for i, nm in enumerate(names)}
    nominal = largest_remainder(weights, total)
    team_objs = {nm: Team(nm, COHORT, {POOL: Quota(nominal[nm], None, None)}) for nm in names}
    wsum = sum(weights.values())
    team_p = [0.5 * weights[nm] / wsum + 0.5 / teams for nm in names]
    _, _, classes = load_config(EXAMPLE_CONFIG).to_sched()

    # 1. Shapes and run times (no times yet).
    drafts: list[tuple[str, dict, float]] = []  # (class, JobRequest kwargs, duration)
    counts = {c: int(jobs * p) for c, p in MIX}
    counts["batch"] += jobs - sum(counts.values())
    single_sizes = [s for s in (1, 2, 4, 8) if s <= gpn] or [gpn]
    for cls, _p in MIX:
        for _ in range(counts[cls]):
            kw: dict = {"team": rng.choices(names, team_p)[0]}
            if cls == "interactive":
                kw["gpus"] = rng.choice((1, 1, 2)) if gpn >= 2 else 1
                if rng.random() < 1 / 3:
                    kw["gpu_mem_mib"] = gb_to_mib(20.0)
                dur = _log_uniform(rng, 5 * 60, 60 * 60)
            elif cls == "training":
                kw["checkpoint_interval_s"] = 1800.0
                u = rng.random()
                if u < 0.15 and n_nodes >= 2:
                    kw.update(gpus=2 * gpn, gpus_per_node=gpn, min_nodes=2, max_nodes=2)
                elif u < 0.25 and n_nodes >= 2:
                    kw.update(gpus=gpn, gpus_per_node=gpn, min_nodes=1, max_nodes=2)
                else:
                    kw["gpus"] = rng.choice(single_sizes)
                dur = _log_uniform(rng, 1 * _H, 24 * _H)
            else:
                kw["checkpoint_interval_s"] = 900.0
                if rng.random() < 0.25:
                    kw["gpu_mem_mib"] = gb_to_mib(40.0)
                dur = _log_uniform(rng, 10 * 60, 2 * _H)
            drafts.append((cls, kw, round(dur)))

    def max_gpus(kw: dict) -> int:
        return kw["gpus_per_node"] * kw["max_nodes"] if "gpus_per_node" in kw else kw.get("gpus", 1)

    work = sum(d * max_gpus(kw) for _, kw, d in drafts)
    span = days * _DAY if days is not None else max(_H, work / (total * TARGET_LOAD))

    # 2. Submission times: a Poisson process per class following its hours.
    by_cls = {c: [d for d in drafts if d[0] == c] for c, _ in MIX}
    timed: list[tuple[float, int, str, dict, float]] = []
    for (cls, kw, dur), t in zip(by_cls["interactive"], _times_in(rng, len(by_cls["interactive"]), span, _working_hours)):
        timed.append((t, len(timed), cls, kw, dur))
    for (cls, kw, dur), t in zip(by_cls["training"], _times_in(rng, len(by_cls["training"]), span, lambda t: True)):
        timed.append((t, len(timed), cls, kw, dur))
    batch = by_cls["batch"]
    n_bursts = max(1, math.ceil(len(batch) / BATCH_BURST))
    evening = lambda t: 18.0 <= (t % _DAY) / _H < 23.0  # noqa: E731
    starts = _times_in(rng, n_bursts, span, evening)
    for i, (cls, kw, dur) in enumerate(batch):
        t = min(span - 1e-3, starts[i % n_bursts] + rng.expovariate(1 / 60.0))
        timed.append((t, len(timed), cls, kw, dur))
    timed.sort(key=lambda x: (round(x[0], 3), x[1]))

    out = []
    for i, (t, _, cls, kw, dur) in enumerate(timed):
        req = JobRequest(id=i, job_class=cls, submit_time=round(t, 3), pool=POOL, **kw)
        out.append(SimJob(req, float(dur), label=f"s{i:05d}"))  # the label seeds its estimate
    load = work / (total * span)
    notes = [
        f"Synthetic workload, seed {seed}: {len(out)} jobs ({', '.join(f'{c} {counts[c]}' for c, _ in MIX)}) "
        f"over {span / _DAY:.2f} days on {n_nodes}x{gpn} ({total} GPUs of {GPU_MEM_GB:g} GB); "
        f"offered load {load:.0%}.",
        f"Teams {', '.join(f'{nm}={nominal[nm]}' for nm in names)} (nominal GPUs) in cohort '{COHORT}', "
        "no borrowing or lending limits; demand drawn half by quota, half uniformly.",
        f"Warm-up: the first {WARMUP_FRACTION:.0%} of the span is not measured. See trainyard.sim.synthetic.",
    ]
    return Workload(nodes=nodes, teams=team_objs, classes=dict(classes), jobs=out,
                    measure_from=WARMUP_FRACTION * span, measure_to=span, origin=ORIGIN,
                    name=f"synthetic seed {seed}, {len(out)} jobs on {n_nodes}x{gpn}", notes=notes)
