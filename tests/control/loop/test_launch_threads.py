"""Launches off the loop's thread (control/loop/launch_threads.py), on the fake backend and a fake clock: a
backend whose launch waits on another system (Slurm) must not hold up the pass, and an attempt
still being launched is neither taken for one that never launched nor sent signals the backend
could not deliver."""

from __future__ import annotations

from types import SimpleNamespace

import signal
import threading
import time

import pytest

from tests.fake_plane import WORK, FakePlane
from trainyard.backends.base import BackendError
from trainyard.control.loop.launch_threads import Launches, for_backend


class GatedLaunches:
    """The fake backend's launch made slow: each waits until the test opens the gate."""

    def __init__(self, fp: FakePlane) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.fail_with: str | None = None
        real = fp.backend.launch

        def slow_launch(spec):  # noqa: ANN001, ANN202
            self.entered.set()
            assert self.gate.wait(30), "the test never opened the gate"
            if self.fail_with:
                raise BackendError(self.fail_with)
            return real(spec)

        fp.backend.launch = slow_launch
        fp.backend.launch_waits = True  # as Slurm's
        fp.cp.loop.scheduler.launches = for_backend(fp.cp.loop.ctx)


@pytest.fixture
def fp(tmp_path):
    p = FakePlane(tmp_path / "yard")
    yield p
    p.stop()


def _settled(fp: FakePlane, job_id: int) -> None:
    """Until the background launch of `job_id` has returned (real time: it runs on a thread)."""
    deadline = time.monotonic() + 30
    while any(k[0] == job_id for k in fp.cp.loop.scheduler.launches.in_flight()):
        assert time.monotonic() < deadline, "the launch did not return"
        time.sleep(0.01)


def test_a_pass_does_not_wait_for_a_slow_launch_and_the_attempt_is_not_taken_for_never_launched(fp):
    g = GatedLaunches(fp)
    j = fp.submit(command=WORK, team="vision", **{"class": "batch"})
    t = time.monotonic()
    fp.step()  # commits the start, hands the launch to a thread
    assert time.monotonic() - t < 5 and g.entered.wait(5)
    fp.run(20)  # twenty passes while the backend has not started a rank
    job = fp.job(j["id"])
    assert (job["state"], job["attempt"]) == ("RUNNING", 1), job
    assert not [e for e in fp.events(j["id"]) if e["kind"] == "job.requeued"]
    g.gate.set()
    _settled(fp, j["id"])
    done = fp.wait(j["id"], "COMPLETED")
    assert len(done["attempts"]) == 1


def test_a_cancel_during_the_launch_is_signalled_once_the_backend_knows_the_attempt(fp):
    g = GatedLaunches(fp)
    j = fp.submit(command=WORK, team="vision", **{"class": "batch"})
    fp.step()
    assert g.entered.wait(5)
    assert fp.admin.post(f"/api/v1/jobs/{j['id']}/cancel").status_code == 200
    fp.run(5)
    assert [s for s in fp.backend.signals if s.job_id == j["id"]] == []  # nowhere to send it yet
    g.gate.set()
    _settled(fp, j["id"])
    done = fp.wait(j["id"], "CANCELLED", timeout=60)
    assert [s.sig for s in fp.backend.signals if s.job_id == j["id"]][0] == signal.SIGTERM
    assert done["attempts"][0]["state"] == "CANCELLED"


def test_a_background_launch_the_backend_refuses_fails_the_job_as_the_users_error(fp):
    g = GatedLaunches(fp)
    g.fail_with = "no such program: train.py"
    j = fp.submit(command=WORK, team="vision", **{"class": "batch"})
    fp.step()
    assert g.entered.wait(5)
    g.gate.set()
    _settled(fp, j["id"])
    done = fp.wait(j["id"], "FAILED")
    assert "cannot launch: no such program: train.py" in done["reason"], done
    assert len(done["attempts"]) == 1


def test_launches_inline_when_the_backend_does_not_wait():
    """The local and fake backends: the launch has happened when `start` returns."""
    seen = []
    inline = Launches(lambda spec, now: seen.append((spec, now)), background=False)
    spec = SimpleNamespace(job_id=1, attempt=1, container=None, datasets=(), may_fetch=False)
    inline.start(spec, 1.0)  # type: ignore[arg-type]
    assert seen == [(spec, 1.0)] and inline.in_flight() == frozenset()


def test_a_launch_with_an_image_goes_to_a_thread_even_where_the_backend_does_not_wait():
    """Its nodes pull first, for minutes maybe: never on the loop's thread."""
    started, release = threading.Event(), threading.Event()

    def launch(spec, now):
        started.set()
        release.wait(10)

    inline = Launches(launch, background=False)
    spec = SimpleNamespace(job_id=2, attempt=1, container=object(), datasets=(), may_fetch=False)
    inline.start(spec, 1.0)  # type: ignore[arg-type]
    assert started.wait(10) and inline.in_flight() == frozenset({(2, 1)})
    release.set()
    inline.close(wait=True)
    assert inline.in_flight() == frozenset()


@pytest.mark.parametrize("what", ["datasets", "may_fetch"])
def test_a_launch_that_stages_data_or_fetches_a_checkpoint_goes_to_a_thread(what):
    """Its nodes copy datasets, or a step comes back from the archive, first: never on the loop's thread."""
    started, release = threading.Event(), threading.Event()

    def launch(spec, now):
        started.set()
        release.wait(10)

    inline = Launches(launch, background=False)
    fields = {"datasets": (), "may_fetch": False} | ({"datasets": (object(),)} if what == "datasets" else {"may_fetch": True})
    spec = SimpleNamespace(job_id=3, attempt=2, container=None, **fields)
    inline.start(spec, 1.0)  # type: ignore[arg-type]
    assert started.wait(10) and inline.in_flight() == frozenset({(3, 2)})
    release.set()
    inline.close(wait=True)
