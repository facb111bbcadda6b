"""Issue 39's ledger acceptance: a mixed workload on one real `yard up` (local backend, two emulated
4-GPU nodes, real rank processes), and once everything has ended, where every GPU-second went.

The workload, submitted at once (all but the recipe in classes that are not preemptible, so that
`yard chaos preempt`'s urgent job can take only the recipe's GPU):
- a recipe job (`--recipe llama-pretrain`, a tiny model, checkpoints every 4 steps) preempted by
  `yard chaos preempt` once it has committed a checkpoint, requeued and resumed to the end;
- a bare job (`-- python -c …`) that computes for two seconds;
- an idle job that sleeps holding 2 GPUs in a class with `idle: {after: 5s, action: requeue,
  max_requeues: 1}`: requeued (reason Idle), then, idle again, cancelled;
- an OOM job;
- a runtime script whose loader sleeps (`for batch in run.data(sleepy)`, tests/runtime/phases_script.py);
- a runtime script whose checkpoints are synchronous (`async_checkpoint=False`).

What it checks: every job's buckets (`GET /api/v1/jobs/{id}/goodput`, `yard acct`'s `ledger` and
its bucket fields) add up to its allocated GPU-seconds within 1 s; `yard report goodput`'s team
totals are the sums of their jobs'; the idle job's idle GPU-seconds are in `yard acct` and
`yard report` (those of its cancelled attempt: its requeued one lost all its work, which is its
recompute); the preempted recipe's recompute is its lost work; the sleepy loader's `data_wait`
and the synchronous saves' `checkpoint_stall` are the seconds the jobs themselves measured.
About 45 s on this 2-core machine when quiet, 80 s under load 9 (the recipe and the two runtime scripts
import torch).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.recipes.helpers import TINY_PRETRAIN
from tests.yard_cluster import YardCluster
from trainyard.contracts import LEDGER_BUCKETS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("goodput-ledger")]

CONFIG = """\
cluster:
  name: ledger
  nodes:
    - {name: node, count: 2, gpus: 4, gpu_model: emulated, gpu_mem_gb: 16, block: b0, rack: r0}
teams:
  - {name: vision, cohort: lab, quotas: {default: {nominal: 4, borrowing_limit: 4}}}
  - {name: nlp, cohort: lab, quotas: {default: {nominal: 4, borrowing_limit: 4}}}
classes:
  - {name: interactive, priority: 300, preemptible: false, max_wait: 15m, max_run_time: 8h, grace_period: 0}
  - {name: training, priority: 200, preemptible: true, max_wait: 24h, min_run_time: 0, grace_period: 5}
  - {name: steady, priority: 200, preemptible: false, max_wait: 24h, grace_period: 2}
  - {name: idler, priority: 200, preemptible: false, max_wait: 24h, grace_period: 2,
     idle: {after: 5s, warning: 1s, action: requeue, max_requeues: 1}}
default_class: training
# Sampled twice a second: the short attempts here (seconds) get several readings each; an ended
# attempt's readings are written before its ledger is split whatever the flush period.
telemetry: {interval: 0.5s, flush: 15s}
"""
SCRIPT = Path(__file__).resolve().parents[1] / "runtime" / "phases_script.py"
DATA_SLEEP, DATA_STEPS = 0.2, 12
CKPT_STEPS = 12
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
BARE = "import time; print('busy', flush=True); t = time.time()\nwhile time.time() - t < 2: pass"
OOM = "import sys; print('torch.OutOfMemoryError: CUDA out of memory'); sys.exit(1)"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("ledger")
    (work / "ledger.yaml").write_text(CONFIG)
    c = YardCluster(work, "local", config_file=work / "ledger.yaml")
    t_begin = time.monotonic()
    try:
        t0 = time.time() - 5
        sets = [x for s in [*TINY_PRETRAIN, "steps=1500", "checkpoint_every=20"] for x in ("--set", s)]
        jobs = {
            "recipe": c.submit("--recipe", "llama-pretrain", "-G", "1", "-A", "vision", "-J", "recipe", *sets),
            "bare": c.submit("-G", "1", "-A", "vision", "-q", "steady", "-J", "bare", "--", sys.executable, "-c", BARE),
            "idle": c.submit("-G", "2", "-A", "nlp", "-q", "idler", "-J", "idle", "--", "sleep", "600"),
            "oom": c.submit("-G", "1", "-A", "nlp", "-q", "steady", "-J", "oom", "--", sys.executable, "-c", OOM),
            "data": c.submit("-G", "1", "-A", "nlp", "-q", "steady", "-J", "data", "--", sys.executable, str(SCRIPT),
                             "--out", str(work / "data"), "--steps", str(DATA_STEPS), "--data-sleep", str(DATA_SLEEP)),
            "ckpt": c.submit("-G", "1", "-A", "vision", "-q", "steady", "-J", "ckpt", "--", sys.executable,
                             str(SCRIPT), "--out", str(work / "ckpt"), "--steps", str(CKPT_STEPS),
                             "--checkpoint-every", "3", "--step-sleep", "0.05"),
        }
        for d in ("data", "ckpt"):
            (work / d).mkdir()
        # the others end first: `yard chaos preempt` sizes its urgent job to the GPUs free when it is
        # asked, and a job ending meanwhile would free what it needs instead of the recipe's
        for name in ("bare", "idle", "oom", "data", "ckpt"):
            c.wait(jobs[name], lambda x: x["state"] in TERMINAL, timeout=300)
        c.wait_committed(jobs["recipe"], 20, timeout=180)
        c.yard("chaos", "preempt", "--job", str(jobs["recipe"]), "--seconds", "2")
        for j in jobs.values():
            c.wait(j, lambda x: x["state"] in TERMINAL, timeout=300)
        everything = c.http.get("/api/v1/jobs", params={"state": "all"}).json()["jobs"]
        for j in everything:  # chaos's urgent job too
            c.wait(j["id"], lambda x: x["state"] in TERMINAL, timeout=120)
        t1 = time.time() + 5
        period = ("-S", f"@{t0}", "-E", f"@{t1}")
        ids = [j["id"] for j in everything]
        yield {
            "c": c, "jobs": jobs, "work": work, "period": period,
            "shown": {i: c.job(i) for i in ids},
            "goodput": {i: c.http.get(f"/api/v1/jobs/{i}/goodput").json() for i in ids},
            "acct": {j["id"]: j for j in json.loads(c.yard("acct", *period, "--json").stdout)["jobs"]},
            "report": json.loads(c.yard("report", *period, "--json").stdout),
            "report_goodput": json.loads(c.yard("report", "goodput", *period, "--by", "team,cluster",
                                                "--json").stdout),
            "elapsed": time.monotonic() - t_begin,
        }
    finally:
        c.stop()


def test_the_workload_ran_as_planned(world):
    shown, jobs = world["shown"], world["jobs"]
    print(f"workload ran in {world['elapsed']:.0f} s")
    recipe = shown[jobs["recipe"]]
    assert recipe["state"] == "COMPLETED" and [a["cause"] for a in recipe["attempts"]][:1] == ["preempted"]
    assert len(recipe["attempts"]) == 2
    idle = shown[jobs["idle"]]
    assert idle["state"] == "CANCELLED" and idle["reason"] == "Idle" and len(idle["attempts"]) == 2
    assert shown[jobs["oom"]]["state"] == "OUT_OF_MEMORY"
    for name in ("bare", "data", "ckpt"):
        assert shown[jobs[name]]["state"] == "COMPLETED", (name, shown[jobs[name]]["reason"])


def test_every_jobs_buckets_add_up_to_its_allocated_gpu_seconds(world):
    for jid, g in world["goodput"].items():
        tries = world["shown"][jid]["attempts"]
        assert len(g["attempts"]) == len(tries), jid
        allocated = 0.0
        for a, t in zip(g["attempts"], tries):
            gpus = sum(len(p["gpus"]) for p in t["placement"])
            alloc = gpus * (t["ended_at"] - t["started_at"])
            allocated += alloc
            assert not a["live"] and set(a["buckets"]) == set(LEDGER_BUCKETS)
            assert all(v >= 0 for v in a["buckets"].values()), (jid, a)
            assert abs(math.fsum(a["buckets"].values()) - alloc) <= 1.0, (jid, a, alloc)
        assert abs(math.fsum(g["buckets"].values()) - allocated) <= 1.0, (jid, g)
        # yard acct: the same buckets (GPU-hours), adding up to its GPU-hours
        acct = world["acct"][jid]
        assert abs(3600 * math.fsum(acct["ledger"].values()) - 3600 * acct["gpu_hours"]) <= 1.0, acct
        assert abs(3600 * acct["gpu_hours"] - allocated) <= 1.0
        for b in LEDGER_BUCKETS:
            assert 3600 * acct["ledger"][b] == pytest.approx(g["buckets"][b], abs=0.01), (jid, b)


def test_yard_acct_fields_print_the_buckets(world):
    c, fields = world["c"], "jobid,gpuhours,startup,compute,datawait,ckptstall,commwait,recompute,idle,teardown"
    out = c.yard("acct", *world["period"], "-P", "-n", "-o", fields).stdout.splitlines()
    rows = {int(r.split("|")[0]): r.split("|") for r in out if r.split("|")[0].isdigit()}
    assert set(world["acct"]) <= set(rows)
    for jid, cells in rows.items():
        ledger = world["acct"][jid]["ledger"]
        assert [float(x) for x in cells[2:10]] == pytest.approx([ledger[b] for b in LEDGER_BUCKETS], abs=6e-5)
        # printed to 4 digits of a GPU-hour: the eight add up to the GPU-hours within their rounding
        assert sum(float(x) for x in cells[2:10]) == pytest.approx(float(cells[1]), abs=5e-4)


def test_report_goodput_team_totals_are_the_sums_of_their_jobs(world):
    teams = {r["key"]: r for r in world["report_goodput"]["sections"]["team"]}
    by_team: dict[str, dict[str, float]] = {}
    for jid, g in world["goodput"].items():
        t = by_team.setdefault(world["shown"][jid]["team"], dict.fromkeys(LEDGER_BUCKETS, 0.0))
        for b in LEDGER_BUCKETS:
            t[b] += g["buckets"][b]
    assert set(teams) == set(by_team) == {"vision", "nlp"}
    for team, buckets in by_team.items():
        for b in LEDGER_BUCKETS:
            assert teams[team]["buckets"][b] == pytest.approx(buckets[b], abs=1e-3), (team, b)
    (cluster,) = world["report_goodput"]["sections"]["cluster"]
    assert cluster["allocated_gpu_s"] == pytest.approx(sum(t["allocated_gpu_s"] for t in teams.values()))


def test_the_idle_jobs_idle_gpu_seconds_are_in_acct_and_report(world):
    jid = world["jobs"]["idle"]
    g, tries = world["goodput"][jid], world["shown"][jid]["attempts"]
    # the attempt the idle policy cancelled: idle on both GPUs from its first sample past `after` (5 s);
    # the one it requeued lost all its work (a bare job, no checkpoint: control/rules/lost_work.py),
    # so its idle seconds are its recompute, as the ledger's rule says recompute is the lost work
    assert g["attempts"][1]["buckets"]["idle"] >= 2 * 4.0, json.dumps(g, indent=1)
    assert g["attempts"][0]["buckets"]["recompute"] == pytest.approx(tries[0]["lost_gpu_s"], abs=1e-6)
    idle_s = g["buckets"]["idle"]
    assert 3600 * world["acct"][jid]["ledger"]["idle"] == pytest.approx(idle_s, abs=0.01)
    nlp_jobs = [i for i in world["goodput"] if world["shown"][i]["team"] == "nlp"]
    reported = 3600 * sum(t["buckets"]["idle"] for t in world["report"]["teams"] if t["team"] == "nlp")
    assert reported == pytest.approx(sum(world["goodput"][i]["buckets"]["idle"] for i in nlp_jobs), abs=0.5)
    assert reported >= idle_s - 0.5


def test_the_preempted_recipes_recompute_is_its_lost_work(world):
    jid = world["jobs"]["recipe"]
    for a, t in zip(world["goodput"][jid]["attempts"], world["shown"][jid]["attempts"]):
        assert a["buckets"]["recompute"] == pytest.approx(t["lost_gpu_s"], abs=1e-6)
    first = world["goodput"][jid]["attempts"][0]["buckets"]
    assert first["compute"] > 0 and first["startup"] > 0


def test_a_sleepy_loader_is_data_wait(world):
    b = world["goodput"][world["jobs"]["data"]]["buckets"]
    # every next() of the loader sleeps DATA_SLEEP (the first before the steps began: startup)
    assert (DATA_STEPS - 1) * DATA_SLEEP <= b["data_wait"] <= DATA_STEPS * DATA_SLEEP + 1.0, b
    assert b["checkpoint_stall"] < 0.01 and b["idle"] == 0


def test_synchronous_checkpoints_are_checkpoint_stall(world):
    b = world["goodput"][world["jobs"]["ckpt"]]["buckets"]
    saves = json.loads((world["work"] / "ckpt" / "saves-rank0.json").read_text())  # [[step, seconds], …]
    assert [s for s, _ in saves] == [3, 6, 9, 12]
    waited = sum(sec for _, sec in saves)
    assert waited <= b["checkpoint_stall"] <= waited + 0.5, (b, saves)
    assert b["data_wait"] < 0.05  # next() of a loader that does not sleep
