"""Benchmark (issue 20 part 11): one contended workload through real Slurm's own scheduler and
through trainyard, on the same emulated nodes, side by side.

    .venv/bin/python bench/vs_slurm.py [--jobs 72] [--span 300] [--seed 1]
        [--systems slurm,trainyard,trainyard-slurm] [--json] [--keep DIR]    # ~13 min on 2 cores

The workload (`workload()`, deterministic from `--seed`): three teams with nominal shares 4/2/2
of 2 nodes x 4 GPUs, b and c submitting more than their share; three classes: interactive (1 GPU,
10-30 steps, never preempted), training (1-4 GPUs, 30-90 steps) and batch (1-2 GPUs, 20-90
steps), both preemptible (about 5,200 GPU-seconds for 60 jobs: 11 minutes of the 8 GPUs); `--jobs` jobs arriving at random over `--span` seconds. Every job is
`bench/vs_slurm_job.py`: one-second steps, a checkpoint every 5 steps and on a notice, resume from
the newest; each attempt logs its start and end, so both systems are measured by the same clock.

Systems (`--systems`):
- `slurm`: the real Slurm test cluster (`tests/slurm_cluster.py`: Debian's slurmctld/slurmd,
  slurmdbd on the local MariaDB) as a site would run this: `sched/backfill`,
  `priority/multifactor` (fair share by account: Fairshare=4/2/2, QOS and age factors),
  `preempt/qos` with `PreemptMode=REQUEUE` (interactive preempts training and batch, training
  preempts batch; GraceTime 10 s), one account per team, one QOS per class; `sbatch --requeue`.
- `trainyard`: `yard up` on the local backend with the same nodes, teams (nominal 4/2/2, one
  cohort) and classes (grace 10 s), jobs submitted over HTTP.
- `trainyard-slurm`: `yard up --backend slurm` driving a plain Slurm test cluster (trainyard
  decides and places, Slurm runs).
The systems run at once (each its own cluster, the jobs sleep between steps), so they share the
machine's conditions and the whole run takes one system's time; `--sequential` for one by one.

Figures per system: makespan, utilization (GPU-seconds inside attempts / capacity x makespan),
goodput (steps done / the same), wait and JCT per class (mean, p99), preemptions, lost steps
(steps run twice), the requeue gap (a preempted job's end to its next start), and each team's
share of the GPUs while it had a job waiting against its nominal share, and (`quota_owed`) the
share its quota let it hold at those instants against what it held of that. For both trainyard
systems also how long the notice took (decision event → the job's end; the job leaves within
50 ms of the signal) and how long recording a job's end took (the job's end → the plane's): the
local backend's figures are the baseline of the Slurm backend's; and how long a start took
(the plane's launch to the job's first line: sbatch, slurmctld, the ranks on the Slurm backend).
Jobs run as whoever runs the benchmark (root here: the Slurm daemons need it). With `--keep DIR`, each system's `jobs.json`
holds every job's submit time and attempts, from which any figure can be recomputed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _yard import YardServer, calibrate_ms, percentile  # noqa: E402

JOB = ROOT / "bench" / "vs_slurm_job.py"
NODES, GPUS_PER_NODE = 2, 4
TEAMS = {"a": 4, "b": 2, "c": 2}  # nominal GPUs
DEMAND = {"a": 0.3, "b": 0.35, "c": 0.35}  # share of the jobs each team submits
CLASSES = {  # name: (share of jobs, GPU choices, step range, preemptible)
    "interactive": (0.2, (1,), (10, 30), False),
    "training": (0.45, (1, 1, 2, 4), (30, 90), True),
    "batch": (0.35, (1, 2), (20, 90), True),
}
GRACE_S = 10
TIME_LIMIT_MIN = 20  # every job's time limit, on both systems (trainyard's engine takes it as the estimate)


@dataclass
class Job:
    index: int
    team: str
    job_class: str
    gpus: int
    steps: int
    arrive_s: float
    submit: float = 0.0  # wall clock when it was submitted
    ref: str = ""  # the system's id for it
    attempts: list[dict[str, Any]] = field(default_factory=list)


def workload(n: int, span: float, seed: int) -> list[Job]:
    rng = random.Random(seed)
    teams, tw = list(DEMAND), list(DEMAND.values())
    classes, cw = list(CLASSES), [c[0] for c in CLASSES.values()]
    arrivals = sorted(rng.uniform(0, span) for _ in range(n))
    out = []
    for i, t in enumerate(arrivals):
        cls = rng.choices(classes, cw)[0]
        _, gpus, (lo, hi), _ = CLASSES[cls]
        out.append(Job(i, rng.choices(teams, tw)[0], cls, rng.choice(gpus), rng.randint(lo, hi), round(t, 2)))
    return out


def read_attempts(state: Path) -> list[dict[str, Any]]:
    """The attempts a job logged: start, end, why it ended, steps it ran."""
    out: list[dict[str, Any]] = []
    try:
        lines = state.with_name(state.name + ".log").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if parts[:1] == ["start"]:
            out.append({"start": float(parts[1]), "from_step": int(parts[2])})
        elif parts[:1] == ["end"] and out and "end" not in out[-1]:
            out[-1].update(end=float(parts[1]), step=int(parts[2]), why=parts[3], ran=int(parts[4].split("=")[1]))
    return out


def done(j: Job, state_dir: Path) -> bool:
    j.attempts = read_attempts(state_dir / f"job-{j.index}")
    return bool(j.attempts) and j.attempts[-1].get("why") == "done"


def drive(jobs: list[Job], state_dir: Path, submit: Callable[[Job], str], timeout_s: float) -> float:
    """Submit each job at its arrival time, then wait for every one to be done. Returns t0."""
    t0 = time.time()
    pending = list(jobs)
    while pending:
        j = pending[0]
        wait = t0 + j.arrive_s - time.time()
        if wait > 0:
            time.sleep(min(wait, 0.5))
            continue
        pending.pop(0)
        j.submit = time.time()
        j.ref = submit(j)
    deadline = t0 + timeout_s
    while not all(done(j, state_dir) for j in jobs):
        if time.time() > deadline:
            left = [j.index for j in jobs if not done(j, state_dir)]
            raise RuntimeError(f"{len(left)} jobs not done after {timeout_s:.0f} s: {left[:10]}")
        time.sleep(1.0)
    return t0


def command(j: Job, state_dir: Path) -> list[str]:
    return [sys.executable, str(JOB), "--steps", str(j.steps), "--state", str(state_dir / f"job-{j.index}")]


# -- metrics ----------------------------------------------------------------------------------------

def metrics(jobs: list[Job]) -> dict[str, Any]:
    capacity = NODES * GPUS_PER_NODE
    start = min(j.submit for j in jobs)
    end = max(j.attempts[-1]["end"] for j in jobs)
    makespan = end - start
    busy = sum((a["end"] - a["start"]) * j.gpus for j in jobs for a in j.attempts)
    useful = sum(j.steps * j.gpus for j in jobs)  # one second per step
    per_class: dict[str, dict[str, float]] = {}
    waits_all, gaps = [], []
    for cls in CLASSES:
        js = [j for j in jobs if j.job_class == cls]
        if not js:
            continue
        waits = [_wait(j) for j in js]
        jct = [j.attempts[-1]["end"] - j.submit for j in js]
        waits_all += waits
        per_class[cls] = {"jobs": len(js), "wait_mean_s": round(statistics.fmean(waits), 1),
                          "wait_p99_s": round(percentile(waits, 0.99), 1),
                          "jct_mean_s": round(statistics.fmean(jct), 1)}
    for j in jobs:
        gaps += [b["start"] - a["end"] for a, b in zip(j.attempts, j.attempts[1:])]
    all_jct = [j.attempts[-1]["end"] - j.submit for j in jobs]
    return {"jobs": len(jobs), "makespan_s": round(makespan, 1), "utilization": round(busy / (capacity * makespan), 3),
            "goodput": round(useful / (capacity * makespan), 3), "jct_mean_s": round(statistics.fmean(all_jct), 1),
            "wait_mean_s": round(statistics.fmean(waits_all), 1), "classes": per_class,
            "preemptions": sum(len(j.attempts) - 1 for j in jobs),
            "lost_steps": sum(sum(a["ran"] for a in j.attempts) - j.steps for j in jobs),
            "requeue_gap_mean_s": round(statistics.fmean(gaps), 1) if gaps else None,
            "requeue_gap_max_s": round(max(gaps), 1) if gaps else None,
            # The training tail, job by job (index, team, GPUs, wait): whose wait makes the p99.
            "worst_training": [[j.index, j.team, j.gpus, round(_wait(j), 1)] for j in sorted(
                (j for j in jobs if j.job_class == "training"), key=_wait, reverse=True)[:3]],
            "team_share_when_waiting": team_shares(jobs, start, end),
            "team_quota_owed": quota_owed(jobs, start, end)}


def _wait(j: Job) -> float:
    a = j.attempts
    return (a[0]["start"] - j.submit) + sum(y["start"] - x["end"] for x, y in zip(a, a[1:]))


def instants(jobs: list[Job], start: float, end: float, dt: float = 1.0) -> Iterator[tuple[dict[str, int], dict[str, list[int]]]]:
    """Every `dt` from `start` to `end`: the GPUs each team held, and the sizes of each team's jobs
    that waited then (submitted, not done, not inside an attempt)."""
    t = start
    while t < end:
        held = {team: 0 for team in TEAMS}
        waiting: dict[str, list[int]] = {}
        for j in jobs:
            if j.submit > t or j.attempts[-1]["end"] <= t:
                continue
            if any(a["start"] <= t < a["end"] for a in j.attempts):
                held[j.team] += j.gpus
            else:
                waiting.setdefault(j.team, []).append(j.gpus)
        yield held, waiting
        t += dt


def team_shares(jobs: list[Job], start: float, end: float, dt: float = 1.0) -> dict[str, dict[str, float]]:
    """Per team, its mean share of the GPUs over the instants when the cluster was contended (some
    job waited) and the team had a job waiting, against its nominal share."""
    capacity = NODES * GPUS_PER_NODE
    acc: dict[str, list[float]] = {t: [] for t in TEAMS}
    for held, waiting in instants(jobs, start, end, dt):
        for team in waiting:
            acc[team].append(held[team] / capacity)
    return {team: {"nominal": round(TEAMS[team] / capacity, 3),
                   "share": round(statistics.fmean(v), 3) if v else None, "seconds": round(len(v) * dt)}
            for team, v in acc.items()}


def within_quota(held: int, nominal: int, waiting: list[int]) -> int:
    """The most GPUs a team could hold inside its nominal quota: what it holds (up to the quota)
    plus the largest sum of its waiting jobs' sizes that fits in the rest (jobs run whole)."""
    room = max(0, nominal - held)
    sums = {0}
    for g in waiting:
        sums |= {s + g for s in sums if s + g <= room}
    return min(held, nominal) + max(sums)


def quota_owed(jobs: list[Job], start: float, end: float, dt: float = 1.0) -> dict[str, dict[str, Any]]:
    """Per team, over the contended instants when it had a job waiting: the share of the GPUs its
    nominal quota let it hold (what it held plus the waiting jobs that fit in the rest of its
    quota), the share it held of that, the mean gap and how long it was owed GPUs.

    A team whose waiting job is larger than the rest of its quota must borrow to run it (Kueue's
    semantics): no quota keeper owes it those GPUs, yet `team_shares` (the plain share while
    waiting) counts them against the scheduler; here they are not."""
    capacity = NODES * GPUS_PER_NODE
    gaps: dict[str, list[tuple[float, float]]] = {t: [] for t in TEAMS}  # (entitled, held in quota)
    for held, waiting in instants(jobs, start, end, dt):
        for team, sizes in waiting.items():
            gaps[team].append((within_quota(held[team], TEAMS[team], sizes) / capacity,
                               min(held[team], TEAMS[team]) / capacity))
    out: dict[str, dict[str, Any]] = {}
    for team, pairs in gaps.items():
        if not pairs:
            out[team] = {"entitled": None, "held_in_quota": None, "gap": None, "owed_s": 0}
            continue
        diff = [e - h for e, h in pairs]
        out[team] = {"entitled": round(statistics.fmean(e for e, _ in pairs), 3),
                     "held_in_quota": round(statistics.fmean(h for _, h in pairs), 3),
                     "gap": round(statistics.fmean(diff), 3), "owed_s": round(sum(dt for g in diff if g > 0))}
    return out


# -- real Slurm ---------------------------------------------------------------------------------------

SLURM_CONF = """
PriorityType=priority/multifactor
PriorityDecayHalfLife=00:05:00
PriorityCalcPeriod=1
PriorityWeightFairshare=10000
PriorityWeightQOS=20000
PriorityWeightAge=1000
PriorityMaxAge=00:10:00
PriorityFavorSmall=NO
PreemptType=preempt/qos
PreemptMode=REQUEUE
JobRequeue=1
AccountingStorageEnforce=associations,limits,qos
"""


def run_slurm(jobs: list[Job], work: Path, timeout_s: float) -> dict[str, Any]:
    from tests.slurm_cluster import SlurmCluster, accounting_available

    why = accounting_available()
    if why:
        raise SystemExit(f"slurm: {why}")
    state_dir = work / "state"
    state_dir.mkdir(parents=True)
    with SlurmCluster(work / "slurm", gpus_per_node=GPUS_PER_NODE, accounting=True, extra_conf=SLURM_CONF,
                      kill_wait=GRACE_S + 5) as c:
        def sacctmgr(*args: str) -> None:
            c.run("sacctmgr", "-i", *args)

        sacctmgr("add", "qos", "batch", "Priority=100", f"GraceTime={GRACE_S}")
        sacctmgr("add", "qos", "training", "Priority=500", "Preempt=batch", f"GraceTime={GRACE_S}")
        sacctmgr("add", "qos", "interactive", "Priority=1000", "Preempt=training,batch")
        user = os.environ.get("USER") or "root"
        for team, share in TEAMS.items():
            sacctmgr("add", "account", team, "Cluster=trainyard", f"Fairshare={share}")
            c.add_association(user, team)
        sacctmgr("modify", "user", "where", f"name={user}", "set", "QOS=interactive,training,batch",
                 "DefaultQOS=batch")
        c.run("scontrol", "reconfigure")
        time.sleep(2)

        def submit(j: Job) -> str:
            cmd = " ".join(command(j, state_dir))
            out = c.run("sbatch", "--parsable", f"--account={j.team}", f"--qos={j.job_class}",
                        f"--gres=gpu:{j.gpus}", "-N1", "-n1", f"--time=00:{TIME_LIMIT_MIN:02d}:00", "--requeue",
                        "--open-mode=append", f"--output={state_dir}/job-{j.index}.out",
                        f"--job-name=vs-{j.index}", f"--wrap=exec {cmd}")
            return out.stdout.strip().split(";")[0]

        drive(jobs, state_dir, submit, timeout_s)
    return metrics(jobs)


# -- trainyard -------------------------------------------------------------------------------------------

def yard_config(path: Path) -> Path:
    # The test Slurm cluster's node names (n1, n2), for the local backend too: the same cluster.
    nodes = "\n".join(f"    - {{name: n{i + 1}, gpus: {GPUS_PER_NODE}, gpu_model: gpu, gpu_mem_gb: 16, block: b0, rack: r0}}"
                      for i in range(NODES))
    teams = "\n".join(f"  - {{name: {t}, cohort: lab, quotas: {{default: {{nominal: {n}}}}}}}" for t, n in TEAMS.items())
    path.write_text(f"""cluster:
  name: vs
  nodes:
{nodes}
teams:
{teams}
classes:
  - {{name: interactive, priority: 300, preemptible: false, max_wait: 15m, max_run_time: 1h, grace_period: 0}}
  - {{name: training, priority: 200, preemptible: true, max_wait: 24h, min_run_time: 0, grace_period: {GRACE_S}}}
  - {{name: batch, priority: 100, preemptible: true, max_wait: 3d, min_run_time: 0, grace_period: {GRACE_S}}}
default_class: batch
""")
    return path


def run_trainyard(jobs: list[Job], work: Path, timeout_s: float, backend: str = "local") -> dict[str, Any]:
    state_dir = work / "state"
    state_dir.mkdir(parents=True)
    extra: list[str] = []
    env: dict[str, str] = {}
    cluster = None
    if backend == "slurm":
        from tests.slurm_cluster import SlurmCluster

        cluster = SlurmCluster(work / "slurm", gpus_per_node=GPUS_PER_NODE, kill_wait=GRACE_S + 5).start()
        env, extra = cluster.env(), ["--backend", "slurm"]
    srv = YardServer(config=yard_config(work / "cluster.yaml"), data_dir=work / "yard", extra=extra, env=env)
    try:
        srv.start()
        with srv.client() as http:
            def submit(j: Job) -> str:
                r = http.post("/api/v1/jobs", json={
                    "name": f"vs-{j.index}", "team": j.team, "class": j.job_class,
                    "nodes": 1, "gpus_per_node": j.gpus, "tasks_per_node": 1,  # as sbatch -N1 -n1 --gres=gpu:G
                    "command": command(j, state_dir), "time": f"{TIME_LIMIT_MIN}m", "workdir": str(state_dir)})
                r.raise_for_status()
                return str(r.json()["id"])

            drive(jobs, state_dir, submit, timeout_s)
            time.sleep(3)  # let the plane record the last ends
            out = metrics(jobs)
            out.update(plane_latencies(http, jobs))  # the local backend's are the baseline
    finally:
        srv.stop()
        if cluster is not None:
            cluster.stop()
    return out


def plane_latencies(http, jobs: list[Job]) -> dict[str, Any]:
    """How long the notice took (the preemption event to the job's end), how long recording an
    attempt's end took (the job's end to the plane's `ended_at`) and how long a start took (the
    plane's `started_at`, when it launched the attempt, to the job's own first line)."""
    notice, record, start = [], [], []
    for j in jobs:
        body = http.get(f"/api/v1/jobs/{j.ref}").json()
        events = http.get(f"/api/v1/jobs/{j.ref}/events").json()["events"]
        decided = [e["time"] for e in events if e["kind"] == "job.preempting"]
        for a, rec in zip(j.attempts, body.get("attempts", [])):
            if rec.get("ended_at") is not None:
                record.append(rec["ended_at"] - a["end"])
            if rec.get("started_at") is not None:
                start.append(a["start"] - rec["started_at"])
        ends = [a["end"] for a in j.attempts if a["why"] in ("notice", "term")]
        for t_dec, t_end in zip(decided, ends):
            notice.append(t_end - t_dec)

    def summary(xs: list[float]) -> dict[str, float] | None:
        return {"mean_s": round(statistics.fmean(xs), 2), "p95_s": round(percentile(xs, 0.95), 2),
                "max_s": round(max(xs), 2), "n": len(xs)} if xs else None

    return {"notice_latency": summary(notice), "end_record_latency": summary(record),
            "start_latency": summary(start)}


SYSTEMS = {"slurm": run_slurm, "trainyard": run_trainyard,
           "trainyard-slurm": lambda jobs, work, t: run_trainyard(jobs, work, t, backend="slurm")}


def ratios(res: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The acceptance lines of issue 20, where the systems they compare were run."""
    out: dict[str, Any] = {}
    ty, sl, tys = res.get("trainyard"), res.get("slurm"), res.get("trainyard-slurm")
    if ty and sl:
        out["jct_trainyard_over_slurm"] = round(ty["jct_mean_s"] / sl["jct_mean_s"], 3)
        for cls in ("interactive", "training"):
            a, b = ty["classes"].get(cls), sl["classes"].get(cls)
            if a and b:
                out[f"{cls}_p99_wait_trainyard_over_slurm"] = round(a["wait_p99_s"] / b["wait_p99_s"], 3) \
                    if b["wait_p99_s"] else None
    if ty and tys:
        out["makespan_slurm_backend_over_local"] = round(tys["makespan_s"] / ty["makespan_s"], 3)
    # Each team's share against what its quota let it hold while it waited (`quota_owed`): the
    # largest gap of any team, per system (the line asks for 0.05 at most).
    for name, r in res.items():
        gaps = [t["gap"] for t in r.get("team_quota_owed", {}).values() if t.get("gap") is not None]
        if gaps:
            out[f"team_quota_gap_max_{name}"] = max(gaps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--span", type=float, default=300.0, help="seconds over which the jobs arrive")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--systems", default="slurm,trainyard,trainyard-slurm")
    ap.add_argument("--timeout", type=float, default=900.0, help="per system, seconds")
    ap.add_argument("--keep", type=Path, default=None, help="keep the work dirs here")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--sequential", action="store_true", help="one system after the other (default: at once)")
    a = ap.parse_args()
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        ap.error(f"--systems: unknown {', '.join(bad)} (known: {', '.join(SYSTEMS)})")
    base = a.keep or Path(tempfile.mkdtemp(prefix="vs-slurm-"))
    cond = {"date": time.strftime("%Y-%m-%d %H:%M"), "load1": round(os.getloadavg()[0], 2),
            "calibration_1m_loop_ms": calibrate_ms()}
    res: dict[str, dict[str, Any]] = {}
    errors: dict[str, str] = {}
    t0 = time.time()

    def one(name: str) -> None:
        jobs = workload(a.jobs, a.span, a.seed)
        work = base / name
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        ts = time.time()
        try:
            res[name] = SYSTEMS[name](jobs, work, a.timeout)
        except Exception as e:  # noqa: BLE001 - reported with the others' figures
            errors[name] = f"{type(e).__name__}: {e}"
            return
        res[name]["wall_s"] = round(time.time() - ts, 1)
        # Every job's submit time and attempts, to recompute any figure from a kept run (--keep).
        (work / "jobs.json").write_text(json.dumps([{
            "index": j.index, "team": j.team, "class": j.job_class, "gpus": j.gpus, "steps": j.steps,
            "submit": j.submit, "attempts": j.attempts} for j in jobs]))
        if not a.json:
            print(name, json.dumps(res[name]), flush=True)

    try:
        if a.sequential:
            for name in systems:
                one(name)
        else:  # side by side: the same machine conditions for every system, and a third of the time
            threads = [threading.Thread(target=one, args=(name,)) for name in systems]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        if a.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    out = {"bench": "vs_slurm", "jobs": a.jobs, "span_s": a.span, "seed": a.seed, "conditions": cond,
           "wall_s": round(time.time() - t0, 1), "systems": res, "errors": errors, "ratios": ratios(res)}
    print(json.dumps(out) if a.json else json.dumps(out["ratios"], indent=1))


if __name__ == "__main__":
    main()
