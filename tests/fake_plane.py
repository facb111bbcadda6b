"""A control plane on the fake backend and a fake clock, for tests of the control loop's own logic.

Everything is real but the ranks and the time: the store, the API (the same FastAPI app, through
TestClient), the loop's steps. No loop thread runs: a test moves time with `run(seconds)` or
`until(predicate)`, which advance the `FakeClock` a tick at a time and make one loop pass per
tick, so a 60 s grace period or a 30 s hung-rank timeout costs a few milliseconds and happens at
the same fake second on every run, however loaded the machine. Ranks are `yard-fake` programs
(`backends/fake.py`); the loop's parameters are the production defaults (`LoopParams()`).

The real-process counterparts of these behaviours (signals reaching process groups, a killed
node's processes, a runtime that checkpoints on the notice) are tested on the local backend and
real Slurm (tests/backends/test_conformance_local.py, tests/scenarios).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from fastapi.testclient import TestClient

from tests.plane import TEST_IDENTITY, TWO_TEAMS, Plane, job_predicate, with_test_users
from trainyard.api.app import create_app
from trainyard.backends.base import NodeInfo
from trainyard.backends.fake import FakeBackend, FakeCluster
from trainyard.clock import FakeClock
from trainyard.control.loop.orchestrator import LoopParams
from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane
from trainyard.spec.models import parse_config


def fake(*args: str) -> list[str]:
    """A rank command in the fake backend's language: fake("run=5", "exit=3")."""
    return ["yard-fake", *args]


# Trains a step a second, checkpoints every 5 steps, and on the notice checkpoints and exits 75
# within a second; it finishes after 30 s of training in one attempt.
WORK = fake("run=30", "step=1", "ckpt=5", "usr1=1", "term=1")


class FakePlane(Plane):
    """`Plane`'s API (submit, job, token, as_user…) on the fake backend; time moves only when told."""

    def __init__(self, data_dir: Path, *, config: Path = TWO_TEAMS, tick_s: float = 1.0,
                 params: LoopParams | None = None):
        text = with_test_users(config.read_text())
        self.clock = FakeClock(start=time.time())  # submissions are stamped by the real clock
        self.tick_s = tick_s
        nodes = [NodeInfo(n.name, n.gpus, n.gpu_model, n.gpu_mem_mib) for n in parse_config(text).cluster.expand()]
        data_dir.mkdir(parents=True, exist_ok=True)
        self.backend = FakeBackend(data_dir, nodes, clock=self.clock)
        self.cp = build_plane(PlaneSettings(data_dir, config_text=text, backend=self.backend, clock=self.clock,
                                            loop_params=params or LoopParams(), **TEST_IDENTITY))
        self.app = create_app(self.cp)
        self.http = TestClient(self.app)
        self.admin_token = (self.cp.data_dir / "admin.token").read_text().strip()
        self.admin = self.client(self.admin_token)

    # -- time --------------------------------------------------------------------------------------

    def step(self) -> None:
        """One loop pass at the current fake time."""
        self.cp.loop.step()

    def run(self, seconds: float) -> None:
        """Let `seconds` of fake time pass, one loop pass per tick."""
        end = self.clock() + seconds
        while self.clock() < end - 1e-9:
            self.clock.advance(min(self.tick_s, end - self.clock()))
            self.step()

    def until(self, pred: Callable[[], Any], within: float = 600.0) -> float:
        """Pass fake time until `pred()` holds; returns the fake seconds it took.

        Raises:
            AssertionError: it did not hold within `within` fake seconds.
        """
        t0 = self.clock()
        self.step()
        while not pred():
            if self.clock() - t0 > within:
                raise AssertionError(f"not reached within {within:.0f} fake seconds")
            self.clock.advance(self.tick_s)
            self.step()
        return self.clock() - t0

    def wait(self, job_id: int, pred: Callable[[dict[str, Any]], bool] | str | tuple[str, ...],
             timeout: float = 600.0) -> dict[str, Any]:
        """`Plane.wait` in fake time: `timeout` is fake seconds."""
        pred = job_predicate(pred)
        found: list[dict[str, Any]] = []

        def holds() -> bool:
            found[:] = [self.job(job_id)]
            return pred(found[0])

        try:
            self.until(holds, timeout)
        except AssertionError:
            raise AssertionError(f"job {job_id} still {found[0]['state']} ({found[0]['reason']}) "
                                 f"after {timeout:.0f} fake seconds") from None
        return found[0]

    def events(self, job_id: int | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": 1000}
        if job_id is not None:
            params["job"] = job_id
        return self.admin.get("/api/v1/events", params=params).json()["events"]

    def stop(self) -> None:
        """Cancel what still runs, let it end, stop the plane, forget the fake cluster."""
        try:
            for j in self.admin.get("/api/v1/jobs", params={"active": "true"}).json()["jobs"]:
                self.admin.post(f"/api/v1/jobs/{j['id']}/cancel")
            self.until(lambda: not self.admin.get("/api/v1/jobs", params={"state": "CONFIGURING,RUNNING,COMPLETING"}).json()["jobs"],
                       within=120)
        finally:
            self.cp.stop()
            FakeCluster.forget(self.cp.data_dir)
        stats = self.cp.loop.stats
        assert stats.errors == 0, f"the control loop failed {stats.errors} times; last: {stats.last_error}"


def webhook_plane(base: Path, config_text: str) -> FakePlane:
    """A fake plane on `config_text` (which names a webhook) whose notifier's POSTs are kept, decoded,
    in `.posted` instead of sent: what the idle steps' warnings and notes said."""
    import json

    cfg = base / "webhook-plane.yaml"
    cfg.write_text(config_text)
    p = FakePlane(base / "yard", config=cfg)
    p.posted = []  # type: ignore[attr-defined]
    p.cp.notifier.post = lambda _cfg, data: p.posted.append(json.loads(data))  # type: ignore[attr-defined]
    p.cp.notifier.start()
    return p
