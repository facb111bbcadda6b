"""A class's idle policy on a real `yard up` (local backend, real rank processes, a real webhook
receiver), as a person types it:

- a job that sleeps holding 2 GPUs under `idle: {after: 3s, warning: 1s, action: requeue}` is
  warned, then requeued with reason Idle (the IDLE_WARNING and IDLE messages on the webhook, the
  events with `idle_since`, its first attempt REQUEUED Idle in `yard acct --attempts`), starts
  again, and, idle again, is cancelled (CANCELLED, Idle: one idle requeue in a row is the default
  `max_requeues`); a job of the same class that keeps a CPU busy gets neither;
- `yard cluster apply` of a configuration with a malformed `idle:` exits 2 naming the field and
  writes no version;
- (slow) the acceptance's `idle: {after: 1m, action: requeue}`, exactly.

The step's logic to the fake second: tests/control/loop/test_idle_actions.py.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.cli.test_mail_webhook import Receiver
from tests.cli.yard_process import job_id_of, yard_process
from tests.plane import TWO_TEAMS

pytestmark = pytest.mark.xdist_group("cli-idle-yard-up")
BATCH = "  - {name: batch, priority: 100, preemptible: true, max_wait: 3d, min_run_time: 0, grace_period: 2}"
POLICY = "idle: {after: 3s, warning: 1s, action: requeue}"
SLOW_CLASS = ("  - {name: idle1m, priority: 100, preemptible: true, max_wait: 3d, min_run_time: 0, grace_period: 2, "
              "idle: {after: 1m, action: requeue}}\n")
BUSY = [sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 600: pass"]


@pytest.fixture(scope="module")
def hook():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def yard(tmp_path_factory, hook):
    text = TWO_TEAMS.read_text()
    assert BATCH in text
    cfg = tmp_path_factory.mktemp("idle-config") / "idle.yaml"
    cfg.write_text(text.replace(BATCH, BATCH[:-1] + f", {POLICY}}}\n" + SLOW_CLASS.rstrip("\n"))
                   + f"notify: {{webhook: '{hook.url}', timeout_s: 2}}\n")
    yield from yard_process(tmp_path_factory, "idle", config_file=cfg)


def show(yard, jid: int) -> dict:
    return json.loads(yard("show", str(jid), "--json").stdout)


def wait_for(yard, jid: int, pred, timeout: float, what: str) -> dict:
    deadline = time.monotonic() + timeout
    while not pred(j := show(yard, jid)):
        assert time.monotonic() < deadline, f"{what}: {j['state']} {j['reason']} attempt {j['attempt']}"
        time.sleep(0.2)
    return j


def idle_events(yard, jid: int) -> list[dict]:
    return [e for e in json.loads(yard("events", str(jid), "--json").stdout) if e["kind"].startswith("job.idle")]


def submit(yard, cls: str, *command: str) -> int:
    return job_id_of(yard("submit", "-A", "vision", "-q", cls, "--gpus", "2", "--", *command))


def test_a_sleeping_job_is_warned_requeued_with_reason_idle_then_cancelled_and_a_busy_one_is_not(yard, hook):
    busy = submit(yard, "batch", *BUSY)
    sleeper = submit(yard, "batch", "sleep", "600")
    started = wait_for(yard, sleeper, lambda j: j["state"] == "RUNNING", 30, "start")["start_time"]
    wait_for(yard, sleeper, lambda j: j["attempt"] == 2, 30, "requeued and started again")
    warning, idle = idle_events(yard, sleeper)[:2]
    assert warning["kind"] == "job.idle_warning" and idle["kind"] == "job.idle", (warning, idle)
    assert idle["data"]["done"] == "requeue" and idle["data"]["idle_since"] >= started
    assert 0.5 <= idle["time"] - warning["time"] <= 2, (warning, idle)  # 1 s apart, each at the first pass due
    ended = wait_for(yard, sleeper, lambda j: j["state"] == "CANCELLED", 30, "idle again: cancelled")
    assert ended["reason"] == "Idle"
    acct = yard("acct", "--attempts", "-j", str(sleeper), "-o", "attempt,state,cause,reason", "-P", "-n").stdout
    assert acct.strip().splitlines() == ["1|REQUEUED|idle|Idle", "2|CANCELLED|cancelled|Idle"], acct
    bodies = hook.wait_events(sleeper, 4, timeout=20)
    assert [b["event"] for b in bodies] == ["IDLE_WARNING", "IDLE", "IDLE_WARNING", "IDLE"], bodies
    assert [b["idle_action"] for b in bodies] == ["requeue", "requeue", "cancel", "cancel"], bodies
    assert "requeued (Idle)" in bodies[1]["message"] and bodies[1]["idle_since"] >= started
    # the busy job of the same class, running all along, was never idle
    b = show(yard, busy)
    assert (b["state"], b["attempt"]) == ("RUNNING", 1) and idle_events(yard, busy) == [], b
    assert hook.of(busy) == []
    yard("cancel", str(busy))


def test_cluster_apply_with_a_malformed_idle_policy_exits_2_and_writes_nothing(yard, tmp_path):
    before = json.loads(yard("cluster", "history", "--json").stdout)
    current = json.loads(yard("cluster", "get", "--json").stdout)["text"]
    assert POLICY in current
    bad = tmp_path / "bad.yaml"
    bad.write_text(current.replace(POLICY, "idle: {after: 3s, action: evict}"))
    p = yard("cluster", "apply", str(bad), ok=False)
    assert p.returncode == 2, p.stderr
    assert "classes.2.idle.action" in p.stderr and "'notify', 'requeue' or 'cancel'" in p.stderr, p.stderr
    bad.write_text(current.replace(POLICY, "idle: {after: 3s, exempt_teams: [infra]}"))
    p = yard("cluster", "apply", str(bad), ok=False)
    assert p.returncode == 2 and "idle.exempt_teams: no team 'infra'" in p.stderr, p.stderr
    assert json.loads(yard("cluster", "history", "--json").stdout) == before


@pytest.mark.slow
def test_the_acceptance_a_job_sleeping_on_2_gpus_under_after_1m_is_notified_then_requeued(yard, hook):
    jid = submit(yard, "idle1m", "sleep", "600")
    started = wait_for(yard, jid, lambda j: j["state"] == "RUNNING", 30, "start")["start_time"]
    j = wait_for(yard, jid, lambda j: j["attempt"] == 2 or j["state"] != "RUNNING", 90, "requeued")
    events = idle_events(yard, jid)
    assert [e["kind"] for e in events] == ["job.idle_warning", "job.idle"], events
    assert 60 <= events[1]["time"] - started <= 63 and 30 <= events[0]["time"] - started <= 33, events
    assert [b["event"] for b in hook.wait_events(jid, 2)][:2] == ["IDLE_WARNING", "IDLE"]
    acct = yard("acct", "--attempts", "-j", str(jid), "-o", "attempt,state,reason", "-P", "-n").stdout
    assert acct.strip().splitlines()[0] == "1|REQUEUED|Idle", (acct, j)
    yard("cancel", str(jid))
