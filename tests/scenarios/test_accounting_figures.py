"""Issue 18's acceptance: the figures agree with each other, on a scripted workload run by a real
`yard up` (local backend, two emulated 4-GPU nodes, three teams).

The workload: stand-in training jobs (`trainyard.demo.work`: steps, checkpoints, preemption by
checkpoint) of three teams; one has a rank killed (a crash, retried), one is preempted by an
urgent job (`yard chaos preempt`), one runs out of memory, one loses its node (`yard chaos
kill-node`, retried elsewhere), others just complete. Once everything has ended, each equality
has a test:
- the GPU-hours of `yard acct` summed per team = `yard report`'s = the Prometheus counter
  (`trainyard_gpu_seconds_total` / 3600) = what the attempts' start and end times and GPUs give;
- the lost GPU-hours (per team and per cause) of `yard acct` = `yard report`'s = Prometheus's
  `trainyard_lost_gpu_seconds_total` = the attempts' `lost_gpu_s` (the loop's lost-work
  accounting, control/rules/lost_work.py);
- the waits of `yard acct --attempts` = the sum of Prometheus's wait histogram per team and class;
- `yard report`'s jobs by outcome and its OOM rate match the jobs' states.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from typing import Any, Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.plane import YardServer
from tests.yard_cluster import YardCluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("acct-figures")]

CONFIG = """\
cluster:
  name: figures
  nodes:
    - {name: node, count: 2, gpus: 4, gpu_model: emulated, gpu_mem_gb: 16, block: b0, rack: r0}
teams:
  - {name: vision, cohort: lab, quotas: {default: {nominal: 3, borrowing_limit: 4}}}
  - {name: nlp, cohort: lab, quotas: {default: {nominal: 3, borrowing_limit: 4}}}
  - {name: speech, cohort: lab, quotas: {default: {nominal: 2, borrowing_limit: 4}}}
classes:
  - {name: interactive, priority: 300, preemptible: false, max_wait: 15m, max_run_time: 8h, grace_period: 0}
  - {name: training, priority: 200, preemptible: true, max_wait: 24h, min_run_time: 0, grace_period: 3}
default_class: training
"""
WORK = ("--", sys.executable, "-m", "trainyard.demo.work", "--steps", "40", "--step-time", "0.15",
        "--ckpt-every", "5")
OOM = ("--", sys.executable, "-c", "import sys; print('torch.OutOfMemoryError: CUDA out of memory'); sys.exit(1)")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("figures")
    (work / "figures.yaml").write_text(CONFIG)
    import tests.yard_cluster as yc

    saved = yc.TWO_TEAMS
    yc.TWO_TEAMS = work / "figures.yaml"  # YardCluster's local config
    try:
        c = YardCluster(work, "local")
    finally:
        yc.TWO_TEAMS = saved
    assert isinstance(c.server, YardServer)
    try:
        t0 = time.time() - 5
        jobs: dict[str, int] = {}
        jobs["crash"] = c.submit("-G", "2", "-A", "vision", "-J", "crash", *WORK)
        jobs["preempted"] = c.submit("-G", "2", "-A", "nlp", "-J", "preempted", *WORK)
        jobs["oom"] = c.submit("-G", "1", "-A", "nlp", "-J", "oom", *OOM)
        jobs["plain"] = c.submit("-G", "1", "-A", "speech", "-J", "plain", "--", sys.executable, "-c",
                                 "import time; time.sleep(1)")
        c.wait_committed(jobs["crash"], 5)
        c.yard("chaos", "kill-rank", "--job", str(jobs["crash"]), "--rank", "1")
        c.wait_committed(jobs["preempted"], 5)
        c.yard("chaos", "preempt", "--job", str(jobs["preempted"]), "--seconds", "2")
        for j in jobs.values():
            c.wait(j, lambda x: x["state"] in TERMINAL, timeout=240)
        # a lost node, alone on the cluster so that only its job is hit
        jobs["node"] = c.submit("-G", "2", "-A", "speech", "-J", "node", *WORK)
        c.wait_committed(jobs["node"], 5)
        node = c.job(jobs["node"])["placement"][0]["node"]
        c.yard("chaos", "kill-node", "--job", str(jobs["node"]))
        try:
            c.wait(jobs["node"], lambda x: x["state"] in TERMINAL, timeout=240)
        finally:
            c.yard("chaos", "revive-node", "--node", node)
        everything = c.http.get("/api/v1/jobs", params={"state": "all"}).json()["jobs"]
        for j in everything:  # chaos's urgent job too
            c.wait(j["id"], lambda x: x["state"] in TERMINAL, timeout=120)
        t1 = time.time() + 5
        period = ("-S", f"@{t0}", "-E", f"@{t1}")
        acct = json.loads(c.yard("acct", *period, "--json").stdout)["jobs"]
        acct_cut = json.loads(c.yard("acct", *period, "--truncate", "--json").stdout)["jobs"]
        tries = json.loads(c.yard("acct", *period, "--attempts", "--json").stdout)["attempts"]
        report = json.loads(c.yard("report", *period, "--json").stdout)
        metrics = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for fam in text_string_to_metric_families(c.http.get("/metrics").text) for s in fam.samples}
        shown = {j["id"]: json.loads(c.yard("show", str(j["id"]), "--json").stdout) for j in everything}
        share = c.yard("share")
        prio = c.yard("prio")
        yield {"c": c, "jobs": jobs, "acct": acct, "acct_cut": acct_cut, "tries": tries, "report": report,
               "metrics": metrics, "shown": shown, "share": share, "prio": prio}
    finally:
        c.stop()


TEAMS = ("vision", "nlp", "speech")


def per_team(records: list[dict], key: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for r in records:
        out[r["team"]] += r[key]
    return out


def metric_per_team(m: dict, name: str, scale: float = 1.0) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (n, labels), v in m.items():
        if n == name:
            out[dict(labels)["team"]] += v / scale
    return out


def from_attempts(shown: dict[int, dict]) -> tuple[dict[str, float], dict[str, float], dict[tuple[str, str], float]]:
    """GPU-hours and lost GPU-hours per team, and lost per (team, cause), from the attempts' own rows."""
    gpu_h, lost_h, by_cause = defaultdict(float), defaultdict(float), defaultdict(float)
    for j in shown.values():
        for a in j["attempts"]:
            gpus = sum(len(p["gpus"]) for p in a["placement"])
            gpu_h[j["team"]] += gpus * (a["ended_at"] - a["started_at"]) / 3600
            lost_h[j["team"]] += a["lost_gpu_s"] / 3600
            if a["lost_gpu_s"]:
                by_cause[(j["team"], a["cause"])] += a["lost_gpu_s"] / 3600
    return gpu_h, lost_h, by_cause


def approx_equal(a: dict, b: dict) -> None:
    keys = {k for k in set(a) | set(b) if abs(a.get(k, 0.0)) > 1e-12 or abs(b.get(k, 0.0)) > 1e-12}
    for k in keys:
        assert a.get(k, 0.0) == pytest.approx(b.get(k, 0.0), rel=1e-6, abs=1e-9), (k, a.get(k), b.get(k))


def test_the_workload_had_each_incident(world):
    causes = {a["cause"] for j in world["shown"].values() for a in j["attempts"]}
    assert {"crash", "preempted", "oom", "node_lost", "completed"} <= causes, causes
    assert world["shown"][world["jobs"]["oom"]]["state"] == "OUT_OF_MEMORY"


def test_gpu_hours_agree_acct_report_prometheus_attempts(world):
    acct = per_team(world["acct"], "gpu_hours")
    approx_equal(acct, per_team(world["acct_cut"], "gpu_hours"))  # the period holds everything
    approx_equal(acct, {t["team"]: t["gpu_hours"] for t in world["report"]["teams"]})
    approx_equal(acct, metric_per_team(world["metrics"], "trainyard_gpu_seconds_total", 3600))
    gpu_h, _, _ = from_attempts(world["shown"])
    approx_equal(acct, gpu_h)
    assert set(acct) == set(TEAMS)
    assert world["report"]["cluster"]["gpu_hours"] == pytest.approx(sum(acct.values()))
    approx_equal(per_team(world["tries"], "gpu_hours"), acct)


def test_lost_gpu_hours_agree_with_the_lost_work_accounting(world):
    acct = per_team(world["acct"], "lost_gpu_hours")
    assert sum(acct.values()) > 0
    approx_equal(acct, {t["team"]: t["lost_gpu_hours"] for t in world["report"]["teams"]})
    approx_equal(acct, metric_per_team(world["metrics"], "trainyard_lost_gpu_seconds_total", 3600))
    _, lost_h, by_cause = from_attempts(world["shown"])
    approx_equal(acct, lost_h)
    acct_cause = defaultdict(float)
    for j in world["acct"]:
        for cause, h in j["lost_by_cause"].items():
            acct_cause[(j["team"], cause)] += h
    report_cause = {(t["team"], c): h for t in world["report"]["teams"] for c, h in t["lost_by_cause"].items()}
    prom_cause = {(dict(lb)["team"], dict(lb)["cause"]): v / 3600 for (n, lb), v in world["metrics"].items()
                  if n == "trainyard_lost_gpu_seconds_total"}
    approx_equal(acct_cause, by_cause)
    approx_equal(acct_cause, report_cause)
    approx_equal(acct_cause, prom_cause)
    for team, useful in per_team(world["acct"], "useful_gpu_hours").items():
        assert useful == pytest.approx(per_team(world["acct"], "gpu_hours")[team] - acct[team])


def test_waits_agree_with_the_prometheus_histogram(world):
    acct: dict[tuple[str, str], float] = defaultdict(float)
    count: dict[tuple[str, str], int] = defaultdict(int)
    for a in world["tries"]:
        acct[(a["team"], a["class"])] += a["wait_s"]
        count[(a["team"], a["class"])] += 1
    prom = {(dict(lb)["team"], dict(lb)["class"]): v for (n, lb), v in world["metrics"].items()
            if n == "trainyard_queue_wait_seconds_sum"}
    prom_n = {(dict(lb)["team"], dict(lb)["class"]): v for (n, lb), v in world["metrics"].items()
              if n == "trainyard_queue_wait_seconds_count"}
    approx_equal(acct, prom)
    assert dict(count) == {k: int(v) for k, v in prom_n.items()}
    jobs = {j["id"]: j for j in world["acct"]}
    for jid, j in jobs.items():
        assert sum(a["wait_s"] for a in world["tries"] if a["job_id"] == jid) == pytest.approx(j["wait_s"])


def test_outcomes_and_the_oom_rate(world):
    c = world["report"]["cluster"]
    states: dict[str, int] = defaultdict(int)
    for j in world["shown"].values():
        states[j["state"]] += 1
    assert c["jobs_by_state"] == dict(states)
    assert c["oom_rate"] == pytest.approx(states["OUT_OF_MEMORY"] / sum(states.values()))
    nlp = next(t for t in world["report"]["teams"] if t["team"] == "nlp")
    assert nlp["preemptions_suffered"] >= 1 and nlp["preemptions_caused"] >= 1  # chaos's urgent job is nlp's
    assert c["attempts_ended"] == sum(len(j["attempts"]) for j in world["shown"].values())


def test_share_and_prio_answer(world):
    assert "FAIRSHARE" in world["share"].stdout and "speech" in world["share"].stdout
    assert "RANK" in world["prio"].stdout
