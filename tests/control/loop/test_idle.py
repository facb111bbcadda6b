"""The idle step (control/loop/idle.py) on the fake backend and a fake clock (tests/fake_plane.py):
an interactive allocation of a class with `idle_timeout` is warned once per idle stretch at
`idle_timeout - idle_warning` (its terminals, the owner's webhook, an event) and stopped at
`idle_timeout` (TIMEOUT, IdleTimeout); input, CPU or GPU use start a new stretch; a class without
`idle_timeout` and a batch job never end so.

This is issue 38's form of a class's idle policy (spec/idle.py: `idle_timeout: X` is `idle: {after:
X, action: cancel}` for allocations only); the general policy, every action: test_idle_actions.py.
The allocations are marked in the store (`jobs.interactive`) as the submit of `yard alloc` does;
their use is scripted (`FakeBackend.set_usage`). The same on real processes and `yard up`:
tests/cli/test_alloc_idle_yard_up.py; the CPU readings themselves:
tests/backends/local/test_cpu_seconds.py.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.fake_plane import FakePlane, fake, webhook_plane
from tests.plane import TWO_TEAMS
from trainyard.control.loop.idle import sample_every
from trainyard.store.models import JobRow

TIMEOUT, WARNING = 120, 30  # idle_timeout 2m, idle_warning 30s: fewer passes of the fake clock
FOREVER = fake()  # a rank that runs until it is stopped


@pytest.fixture
def fp(tmp_path):
    text = TWO_TEAMS.read_text().replace("max_run_time: 8h, grace_period: 0}",
                                         "max_run_time: 8h, grace_period: 0, idle_timeout: 2m}")
    assert "idle_timeout" in text
    text += "interactive: {idle_warning: 30s, idle_cpu_percent: 5}\nnotify: {webhook: 'http://127.0.0.1:9/hook'}\n"
    p = webhook_plane(tmp_path, text)
    yield p
    p.stop()


def allocation(fp: FakePlane, job_class: str = "interactive", interactive: dict | None = None,
               attach: bool = True) -> dict:
    """A running job of `job_class`, marked as an allocation (None: left a batch job), with a
    forwarded port attached (no terminal to warn; it keeps the connection grace away) unless not
    `attach`."""
    j = fp.submit(command=FOREVER, team="vision", **{"class": job_class})
    if interactive is not None:
        with fp.cp.store.session.begin() as s:
            s.get(JobRow, j["id"]).interactive = interactive
    running = fp.wait(j["id"], "RUNNING")
    if attach:
        fp.cp.sessions.attach(j["id"], None)
    return running


def kinds(fp: FakePlane, job_id: int) -> list[str]:
    return [e["kind"] for e in fp.events(job_id) if e["kind"].startswith("job.idle")]


def test_an_idle_allocation_is_warned_once_then_ends_with_idle_timeout(fp):
    j = allocation(fp, interactive={"kind": "alloc"}, attach=False)
    told: list[str] = []
    fp.cp.sessions.attach(j["id"], told.append)  # a terminal: attaching counts as input
    since = fp.clock()
    fp.until(lambda: told, within=TIMEOUT)
    assert TIMEOUT - WARNING <= fp.clock() - since <= TIMEOUT - WARNING + 1
    assert "IdleTimeout" in told[0] and "input" in told[0] and f"job {j['id']}" in told[0]
    assert kinds(fp, j["id"]) == ["job.idle_warning"]
    fp.run(WARNING - 2)
    assert len(told) == 1 and fp.job(j["id"])["state"] == "RUNNING"  # once per stretch
    ended = fp.wait(j["id"], "TIMEOUT", timeout=30)
    assert ended["reason"] == "IdleTimeout"
    stopped = next(e for e in fp.events(j["id"]) if e["kind"] == "job.idle")
    assert TIMEOUT <= stopped["time"] - since <= TIMEOUT + 1
    assert [s.sig for s in fp.backend.signals if s.job_id == j["id"]] == [signal.SIGTERM]  # no checkpoint notice
    assert kinds(fp, j["id"]) == ["job.idle_warning", "job.idle"]
    # the owner heard, though the job asked for no mail
    deadline = time.monotonic() + 10
    while not [b for b in fp.posted if b["event"] == "IDLE_WARNING"] and time.monotonic() < deadline:
        time.sleep(0.02)
    warned = [b for b in fp.posted if b["event"] == "IDLE_WARNING"]
    assert len(warned) == 1 and warned[0]["job_id"] == j["id"] and warned[0]["mail_type"] is None
    assert warned[0]["idle_ends_at"] == pytest.approx(since + TIMEOUT, abs=1)
    assert "Idle, ends at" in warned[0]["message"]


def test_input_after_the_warning_starts_a_new_stretch_with_a_new_warning(fp):
    j = allocation(fp, interactive={"kind": "alloc"}, attach=False)
    told: list[str] = []
    att = fp.cp.sessions.attach(j["id"], told.append)
    fp.until(lambda: told, within=TIMEOUT)
    fp.run(WARNING // 2)
    att.touch()  # a keystroke, halfway between the warning and the end
    typed = fp.clock()
    fp.run(TIMEOUT - WARNING - 2)
    assert fp.job(j["id"])["state"] == "RUNNING" and len(told) == 1
    fp.until(lambda: len(told) == 2, within=10)
    assert TIMEOUT - WARNING <= fp.clock() - typed <= TIMEOUT - WARNING + 1
    fp.wait(j["id"], "TIMEOUT", timeout=WARNING + 5)
    assert kinds(fp, j["id"]) == ["job.idle_warning", "job.idle_warning", "job.idle"]


def test_cpu_above_the_threshold_keeps_it_and_below_does_not(fp):
    j = allocation(fp, interactive={"kind": "srun"})
    fp.backend.set_usage(j["id"], 1, cpu_percent=50)  # a build in the allocation's shell
    fp.run(3 * TIMEOUT)
    assert fp.job(j["id"])["state"] == "RUNNING" and kinds(fp, j["id"]) == []
    fp.backend.set_usage(j["id"], 1, cpu_percent=4)  # under idle_cpu_percent (5): idle
    quiet = fp.clock()
    ended = fp.wait(j["id"], "TIMEOUT", timeout=TIMEOUT + 30)
    assert ended["reason"] == "IdleTimeout"
    stopped = next(e for e in fp.events(j["id"]) if e["kind"] == "job.idle")
    # busy until the first sample that saw it quiet
    assert TIMEOUT <= stopped["time"] - quiet <= TIMEOUT + sample_every(TIMEOUT) + 1


def test_cpu_after_the_warning_resets_the_stretch(fp):
    j = allocation(fp, interactive={"kind": "alloc"})
    fp.until(lambda: kinds(fp, j["id"]) == ["job.idle_warning"], within=TIMEOUT)
    fp.backend.set_usage(j["id"], 1, cpu_percent=100)
    fp.run(20)
    fp.backend.set_usage(j["id"], 1, cpu_percent=0)
    fp.run(TIMEOUT - WARNING - 10)
    assert fp.job(j["id"])["state"] == "RUNNING"
    fp.wait(j["id"], "TIMEOUT", timeout=WARNING + 30)
    assert kinds(fp, j["id"]) == ["job.idle_warning", "job.idle_warning", "job.idle"]


def test_a_busy_gpu_keeps_it_where_nvml_reads_one(fp):
    j = allocation(fp, interactive={"kind": "notebook"})
    fp.backend.set_usage(j["id"], 1, gpu_percent=90)  # a kernel running, the CPU idle
    fp.run(2 * TIMEOUT)
    assert fp.job(j["id"])["state"] == "RUNNING" and kinds(fp, j["id"]) == []
    fp.backend.set_usage(j["id"], 1, gpu_percent=0)
    fp.wait(j["id"], "TIMEOUT", timeout=TIMEOUT + 30)


def test_a_class_without_idle_timeout_and_a_batch_job_never_end_idle(fp):
    in_training = allocation(fp, job_class="training", interactive={"kind": "alloc"})
    batch = allocation(fp, job_class="interactive", interactive=None)
    fp.run(3 * TIMEOUT)
    for j in (in_training, batch):
        assert fp.job(j["id"])["state"] == "RUNNING" and kinds(fp, j["id"]) == []


def test_cpu_is_read_every_few_seconds_not_every_pass(fp):
    """A pass a second, a sample every SAMPLE_S per job: the backend is not asked each pass."""
    allocation(fp, interactive={"kind": "alloc"})
    asked: list[float] = []
    real = fp.backend.cpu_seconds

    def counting(job_id: int, attempt: int) -> float | None:
        asked.append(fp.clock())
        return real(job_id, attempt)
    fp.backend.cpu_seconds = counting
    fp.run(60)
    assert 60 / sample_every(TIMEOUT) - 1 <= len(asked) <= 60 / sample_every(TIMEOUT) + 1, asked
