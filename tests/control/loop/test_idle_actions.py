"""A class's idle policy (spec/idle.py) on the fake backend and a fake clock (tests/fake_plane.py):
the idle step (control/loop/idle.py) and what it does (control/loop/idle_actions.py) for each
action, the warning once per idle stretch, CPU, GPU and input starting a new stretch, exempt teams,
the end of an idle job's requeue cycle (`max_requeues`), and a job the backend cannot measure.

Classes of tests/fixtures/two_teams.yaml, with policies:
    training     idle: {after: 2m, below: 5%, action: requeue, warning: 30s, exempt_teams: [nlp]}
    batch        idle: {after: 2m, action: cancel}        (the warning: a minute, the default)
    interactive  idle: {after: 2m, action: notify, warning: 30s}

The jobs' CPU and GPU use are scripted (`FakeBackend.set_usage`; never scripted: idle). The same
on real processes and `yard up`: tests/cli/test_idle_yard_up.py; issue 38's allocations (the old
`idle_timeout`): tests/control/loop/test_idle.py.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.fake_plane import FakePlane, fake, webhook_plane
from tests.plane import TWO_TEAMS
from trainyard.contracts import NOTICE_SIGNAL
from trainyard.control.loop.idle import sample_every
from trainyard.store.models import AttemptRow, JobRow

AFTER, WARNING = 120, 30
FOREVER = fake()  # runs until stopped; SIGUSR1 kills it
SAVES = fake("usr1=1")  # on the notice: checkpoints and exits 75 a second later
POLICIES = {
    "training": "idle: {after: 2m, below: 5%, action: requeue, warning: 30s, exempt_teams: [nlp]}",
    "batch": "idle: {after: 2m, action: cancel}",
    "interactive": "idle: {after: 2m, action: notify, warning: 30s}",
}


@pytest.fixture
def fp(tmp_path):
    text = TWO_TEAMS.read_text()
    for cls, pol in POLICIES.items():
        line = next(ln for ln in text.splitlines() if ln.startswith(f"  - {{name: {cls},"))
        text = text.replace(line, line[:-1] + f", {pol}}}")
    text += "notify: {webhook: 'http://127.0.0.1:9/hook'}\n"
    p = webhook_plane(tmp_path, text)
    yield p
    p.stop()


def running(fp: FakePlane, job_class: str, command: list[str] = FOREVER, team: str = "vision",
            interactive: dict | None = None) -> dict:
    j = fp.submit(command=command, team=team, **{"class": job_class})
    if interactive is not None:
        with fp.cp.store.session.begin() as s:
            s.get(JobRow, j["id"]).interactive = interactive
    return fp.wait(j["id"], "RUNNING")


def idle_events(fp: FakePlane, job_id: int) -> list[dict]:
    return [e for e in fp.events(job_id) if e["kind"].startswith("job.idle")]


def kinds(fp: FakePlane, job_id: int) -> list[str]:
    return [e["kind"] for e in idle_events(fp, job_id)]


def posted(fp: FakePlane, job_id: int, n: int) -> list[dict]:
    """The first `n` webhook bodies about `job_id` (the notifier's thread sends them)."""
    deadline = time.monotonic() + 10
    while len(got := [b for b in fp.posted if b["job_id"] == job_id]) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return got


def attempts(fp: FakePlane, job_id: int) -> list[AttemptRow]:
    with fp.cp.store.session() as s:
        rows = s.query(AttemptRow).filter_by(job_id=job_id).order_by(AttemptRow.attempt).all()
        s.expunge_all()
        return rows


def test_requeue_warns_then_requeues_with_reason_idle_and_the_next_idle_stretch_cancels(fp):
    j = running(fp, "training", SAVES)
    started = fp.clock()
    fp.until(lambda: kinds(fp, j["id"]) == ["job.idle_warning"], within=AFTER)
    assert AFTER - WARNING <= fp.clock() - started <= AFTER - WARNING + 1
    fp.run(WARNING - 2)
    assert fp.job(j["id"])["state"] == "RUNNING" and kinds(fp, j["id"]) == ["job.idle_warning"]
    fp.until(lambda: fp.job(j["id"])["attempt"] == 2 and fp.job(j["id"])["state"] == "RUNNING", within=30)
    idle = idle_events(fp, j["id"])[1]
    assert idle["kind"] == "job.idle" and AFTER <= idle["time"] - started <= AFTER + 1
    assert idle["data"]["done"] == "requeue" and idle["data"]["idle_since"] == pytest.approx(started, abs=1)
    # as a requeue goes: the checkpoint notice first, the job saved and asked to be requeued
    assert [s.sig for s in fp.backend.signals if s.job_id == j["id"]] == [NOTICE_SIGNAL]
    first = attempts(fp, j["id"])[0]
    assert (first.state, first.reason, first.cause, first.exit_code) == ("REQUEUED", "Idle", "idle", 75)
    requeued = next(e for e in fp.events(j["id"]) if e["kind"] == "job.requeued")
    assert "Idle" in requeued["message"]
    bodies = posted(fp, j["id"], 2)
    assert [b["event"] for b in bodies[:2]] == ["IDLE_WARNING", "IDLE"], bodies
    assert bodies[0]["idle_action"] == "requeue" and "requeued at" in bodies[0]["message"]
    assert bodies[1]["idle_since"] == pytest.approx(started, abs=1) and "requeued (Idle)" in bodies[1]["message"]
    # idle again in its next attempt: one idle requeue in a row is max_requeues (1), so it ends
    ended = fp.wait(j["id"], "CANCELLED", timeout=AFTER + 30)
    assert ended["reason"] == "Idle"
    last = idle_events(fp, j["id"])[-1]
    assert last["data"]["done"] == "cancel" and last["data"]["idle_requeues"] == 1
    assert "max_requeues" in last["message"]
    assert [(a.state, a.reason) for a in attempts(fp, j["id"])] == [("REQUEUED", "Idle"), ("CANCELLED", "Idle")]


def test_a_late_pass_warns_first_and_acts_a_warning_later_never_unannounced(fp):
    # The loop's passes came late (a loaded plane): the first pass after the warning was due finds
    # the job already past `after`. It is warned then, and requeued `warning` later, not at once.
    j = running(fp, "training", SAVES)
    started = fp.clock()
    fp.run(AFTER - WARNING - 10)
    assert kinds(fp, j["id"]) == []
    fp.clock.advance(40)  # no pass for 40 s: now past `after`
    fp.step()
    assert kinds(fp, j["id"]) == ["job.idle_warning"] and fp.job(j["id"])["state"] == "RUNNING"
    warned = idle_events(fp, j["id"])[0]["time"]
    assert idle_events(fp, j["id"])[0]["data"]["action_at"] == pytest.approx(warned + WARNING)  # not a time past
    fp.run(WARNING - 2)
    assert kinds(fp, j["id"]) == ["job.idle_warning"] and fp.job(j["id"])["state"] == "RUNNING"
    fp.until(lambda: "job.idle" in kinds(fp, j["id"]), within=10)
    idle = idle_events(fp, j["id"])[1]
    assert WARNING <= idle["time"] - warned <= WARNING + 1
    assert idle["data"]["idle_since"] == pytest.approx(started, abs=1) and idle["data"]["done"] == "requeue"


def test_an_idle_requeue_throws_away_only_the_work_before_it_went_idle(fp):
    # a job that keeps no checkpoint and dies of the notice: its lost work is counted up to when it
    # went idle (here: its start), not to its end, so its idle stretch stays idle in the ledger
    j = running(fp, "training", FOREVER)
    fp.until(lambda: fp.job(j["id"])["attempt"] == 2, within=AFTER + 60)
    first = attempts(fp, j["id"])[0]
    assert (first.state, first.cause) == ("REQUEUED", "idle")
    assert first.ended_at - first.started_at >= AFTER
    assert first.lost_gpu_s <= 2.0 * max(1, first.gpus), first.lost_gpu_s
    assert first.ledger is not None and first.ledger["idle"] >= (AFTER - 10) * max(1, first.gpus)


def test_cancel_ends_it_cancelled_with_reason_idle_and_no_checkpoint_notice(fp):
    j = running(fp, "batch")
    started = fp.clock()
    fp.until(lambda: kinds(fp, j["id"]) == ["job.idle_warning"], within=AFTER)
    assert AFTER - 60 <= fp.clock() - started <= AFTER - 60 + 1  # the default warning: a minute
    ended = fp.wait(j["id"], "CANCELLED", timeout=90)
    assert ended["reason"] == "Idle"
    assert [s.sig for s in fp.backend.signals if s.job_id == j["id"]] == [signal.SIGTERM]
    assert kinds(fp, j["id"]) == ["job.idle_warning", "job.idle"]
    assert [(a.state, a.reason, a.cause) for a in attempts(fp, j["id"])] == [("CANCELLED", "Idle", "cancelled")]
    assert [b["event"] for b in posted(fp, j["id"], 2)] == ["IDLE_WARNING", "IDLE"]


def test_notify_tells_once_per_stretch_and_a_new_stretch_tells_again(fp):
    j = running(fp, "interactive")  # a batch job of the class: not an allocation
    fp.run(3 * AFTER)
    assert fp.job(j["id"])["state"] == "RUNNING"
    assert kinds(fp, j["id"]) == ["job.idle_warning", "job.idle"]  # once, however long it stays idle
    assert idle_events(fp, j["id"])[1]["data"]["done"] == "notify"
    assert [b["event"] for b in posted(fp, j["id"], 2)] == ["IDLE_WARNING", "IDLE"]
    fp.backend.set_usage(j["id"], 1, cpu_percent=80)
    fp.run(20)
    fp.backend.set_usage(j["id"], 1, cpu_percent=1)  # below 5%: idle again, a new stretch
    fp.run(AFTER + 10)
    assert kinds(fp, j["id"]) == ["job.idle_warning", "job.idle"] * 2 and fp.job(j["id"])["state"] == "RUNNING"


def test_cpu_after_the_warning_starts_a_new_stretch(fp):
    j = running(fp, "training")
    fp.until(lambda: kinds(fp, j["id"]) == ["job.idle_warning"], within=AFTER)
    fp.backend.set_usage(j["id"], 1, cpu_percent=6)  # at or above `below` (5%): busy
    fp.run(20)
    fp.backend.set_usage(j["id"], 1, cpu_percent=0)
    quiet = fp.clock()
    fp.run(AFTER - WARNING - 10)
    assert fp.job(j["id"])["state"] == "RUNNING" and kinds(fp, j["id"]) == ["job.idle_warning"]
    fp.until(lambda: fp.job(j["id"])["attempt"] == 2, within=WARNING + 30)
    acted = idle_events(fp, j["id"])[2]
    assert kinds(fp, j["id"])[:3] == ["job.idle_warning", "job.idle_warning", "job.idle"]
    assert AFTER <= acted["time"] - quiet <= AFTER + sample_every(AFTER) + 1


def test_terminal_input_starts_a_new_stretch_for_any_job(fp):
    j = running(fp, "batch")
    att = fp.cp.sessions.attach(j["id"], None)  # `yard shell` into it: attaching is input
    fp.until(lambda: kinds(fp, j["id"]) == ["job.idle_warning"], within=AFTER)
    fp.run(30)
    att.touch()  # a keystroke
    typed = fp.clock()
    fp.run(AFTER - 60 - 1)
    assert fp.job(j["id"])["state"] == "RUNNING" and kinds(fp, j["id"]) == ["job.idle_warning"]
    fp.wait(j["id"], "CANCELLED", timeout=90)
    acted = idle_events(fp, j["id"])[-1]
    assert kinds(fp, j["id"]) == ["job.idle_warning", "job.idle_warning", "job.idle"]
    assert AFTER <= acted["time"] - typed <= AFTER + 1


def test_a_busy_gpu_keeps_it(fp):
    j = running(fp, "batch")
    fp.backend.set_usage(j["id"], 1, gpu_percent=40)  # a kernel running, the CPU idle
    fp.run(2 * AFTER)
    assert fp.job(j["id"])["state"] == "RUNNING" and kinds(fp, j["id"]) == []
    fp.backend.set_usage(j["id"], 1, gpu_percent=4)
    fp.wait(j["id"], "CANCELLED", timeout=AFTER + 30)


def test_an_exempt_team_s_job_is_never_judged(fp):
    nlp = running(fp, "training", team="nlp")
    vision = running(fp, "training", team="vision")
    fp.run(AFTER + 5)
    assert fp.job(vision["id"])["attempt"] == 2  # the same class, another team: requeued
    fp.run(2 * AFTER)
    assert fp.job(nlp["id"])["state"] == "RUNNING" and fp.job(nlp["id"])["attempt"] == 1
    assert kinds(fp, nlp["id"]) == []


def test_a_job_the_backend_cannot_measure_is_not_judged_but_an_allocation_is_by_its_input(fp):
    fp.backend.cpu_seconds = lambda job_id, attempt: None  # as the Slurm backend: no reading
    batch = running(fp, "batch")
    alloc = running(fp, "batch", interactive={"kind": "alloc"})
    fp.cp.sessions.attach(alloc["id"], None)
    fp.run(AFTER + 5)
    assert fp.job(batch["id"])["state"] == "RUNNING" and kinds(fp, batch["id"]) == []
    # an allocation under cancel ends as issue 38's do: TIMEOUT, IdleTimeout
    ended = fp.wait(alloc["id"], "TIMEOUT", timeout=10)
    assert ended["reason"] == "IdleTimeout" and kinds(fp, alloc["id"]) == ["job.idle_warning", "job.idle"]
    assert idle_events(fp, alloc["id"])[1]["data"]["done"] == "timeout"


def test_an_allocation_under_requeue_ends_with_idle_timeout_not_requeued(fp):
    j = running(fp, "training", interactive={"kind": "srun"})
    fp.cp.sessions.attach(j["id"], None)
    ended = fp.wait(j["id"], "TIMEOUT", timeout=AFTER + 30)
    assert ended["reason"] == "IdleTimeout" and ended["attempt"] == 1
    assert [s.sig for s in fp.backend.signals if s.job_id == j["id"]] == [signal.SIGTERM]
