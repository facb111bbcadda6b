"""Issue 35 point 1 on a real `yard up` (local backend, real processes): an interactive job beyond
its team's nominal quota, within its borrowing limit, preempts another team's lower-priority
borrowing batch job (engine step 5f) and runs within the victim's grace plus 10 s; the victim
saves on the notice, is requeued, and resumes from its checkpoint once the interactive job ends.

2 nodes x 4 GPUs; vision (nominal 4) fills them with two 4-GPU batch jobs, borrowing 4 from
speech (nominal 2) and audio (nominal 2); carol's team speech asks for 4 GPUs as interactive.
"""

from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.yard_cluster import YardCluster

GRACE = 5  # the batch class's grace period (s)

CONFIG = textwrap.dedent(f"""\
    cluster:
      name: test
      nodes:
        - {{name: node, count: 2, gpus: 4, gpu_model: emulated, gpu_mem_gb: 16, block: b0, rack: r0}}
    teams:
      - {{name: vision, cohort: lab, quotas: {{default: {{nominal: 4, borrowing_limit: 4}}}}}}
      - {{name: speech, cohort: lab, quotas: {{default: {{nominal: 2, borrowing_limit: 4}}}}}}
      - {{name: audio, cohort: lab, quotas: {{default: {{nominal: 2}}}}}}
    classes:
      - {{name: interactive, priority: 300, preemptible: false, max_wait: 15m, max_run_time: 8h, grace_period: 0}}
      - {{name: batch, priority: 100, preemptible: true, max_wait: 3d, max_run_time: 4h, min_run_time: 0,
         grace_period: {GRACE}}}
    default_class: batch
    """)

# A job that counts steps, saves its step on the preemption notice (SIGUSR1) and exits 75
# ("checkpointed; requeue me"); a later attempt reads it back, notes it, and ends. `short`: runs
# 3 s and ends. Each of a job's 4 ranks runs it; rank 0 keeps the log and the checkpoint.
TASK = textwrap.dedent("""\
    import os, pathlib, signal, sys, time
    out, name, kind = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    ck = pathlib.Path(os.environ["TRAINYARD_CHECKPOINT_DIR"])
    attempt = os.environ["TRAINYARD_ATTEMPT"]
    saved = ck / "step"
    step = int(saved.read_text()) if saved.exists() else 0
    first = os.environ.get("RANK", "0") == "0"  # one line per attempt: rank 0's
    if first:
        with open(out / f"{name}.log", "a") as f:
            f.write(f"attempt {attempt} from {step}\\n")
    if kind == "short":
        time.sleep(3)
        sys.exit(0)
    if step:
        sys.exit(0)  # resumed from its checkpoint: done
    def notice(*_):
        if first:
            saved.write_text(str(step))
        sys.exit(75)
    signal.signal(signal.SIGUSR1, notice)
    if first:
        (out / f"{name}.up").touch()
    while True:
        step += 1
        time.sleep(0.05)
    """)


@pytest.fixture(scope="module")
def yc(tmp_path_factory):
    work = tmp_path_factory.mktemp("borrow")
    config = work / "cluster.yaml"
    config.write_text(CONFIG)
    c = YardCluster(work / "cluster", "local", config_file=config)
    yield c
    c.stop()


def _wait_file(path: Path, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.05)


def test_an_interactive_job_beyond_its_nominal_preempts_a_lower_priority_borrower(yc, tmp_path):
    task = tmp_path / "task.py"
    task.write_text(TASK)
    tmp_path.chmod(0o777)

    def submit(team: str, qos: str, name: str, kind: str) -> int:
        return yc.submit("-G", "4", "-A", team, "-q", qos, "-J", name, "-D", str(tmp_path), "--",
                         sys.executable, str(task), str(tmp_path), name, kind)

    batch = [submit("vision", "batch", f"v{k}", "long") for k in range(2)]
    for k, j in enumerate(batch):
        yc.wait(j, "RUNNING", timeout=60)
        _wait_file(tmp_path / f"v{k}.up")
    t0 = time.monotonic()
    ask = submit("speech", "interactive", "carol", "short")
    yc.wait(ask, lambda j: j["state"] in ("RUNNING", "COMPLETED"), timeout=GRACE + 10)
    waited = time.monotonic() - t0
    assert waited <= GRACE + 10, waited

    jobs = {j: yc.job(j) for j in batch}
    victims = [j for j, d in jobs.items() if d["attempts"] and d["attempts"][0]["state"] == "PREEMPTED"
               or d["state"] in ("REQUEUED", "PENDING")]
    assert len(victims) == 1, {j: (d["state"], d["attempts"]) for j, d in jobs.items()}
    victim = victims[0]
    events = yc.http.get("/api/v1/events", params={"job": victim, "limit": 100}).json()["events"]
    pre = [e for e in events if e["kind"] == "job.preempting"]
    assert pre and pre[0]["data"] == {"reason": "borrow", "for_job": ask}, pre

    # The interactive job ends; the victim comes back (it borrows again) and resumes from the
    # step it saved on the notice.
    assert yc.wait(ask, "COMPLETED", timeout=60)["state"] == "COMPLETED"
    done = yc.wait(victim, "COMPLETED", timeout=60)
    assert [a["state"] for a in done["attempts"]] == ["PREEMPTED", "COMPLETED"], done["attempts"]
    name = done["name"]
    lines = (tmp_path / f"{name}.log").read_text().splitlines()
    assert len(lines) == 2 and lines[0] == "attempt 1 from 0" and lines[1].startswith("attempt 2 from "), lines
    assert int(lines[1].split()[-1]) > 0, lines  # resumed from its checkpoint, not from scratch
    other = next(j for j in batch if j != victim)
    assert yc.job(other)["state"] == "RUNNING" and len(yc.job(other)["attempts"]) == 1  # never touched
    yc.yard("cancel", str(other))
