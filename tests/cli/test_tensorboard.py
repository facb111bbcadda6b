"""`yard tensorboard JOB` serves the job's runtime metrics: a real TensorBoard answers with the
loss the job logged; a job with no events, or no such job, is refused clearly."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from tests.plane import YARD
from tests.recipes.helpers import TINY_PRETRAIN
from tests.yard_cluster import YardCluster
from trainyard.ports import free_port

# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("cli-tensorboard")]


@pytest.fixture(scope="module")
def yc(tmp_path_factory):
    c = YardCluster(tmp_path_factory.mktemp("tb"), "local")
    yield c
    c.stop()


def test_tensorboard_shows_the_loss_of_a_finished_job(yc):
    args = ["--recipe", "llama-pretrain", "-G", "1", "-A", "vision"]
    for s in [*TINY_PRETRAIN, "steps=6"]:
        args += ["--set", s]
    job = yc.submit(*args)
    assert yc.wait(job, lambda j: j["state"] in ("COMPLETED", "FAILED"), timeout=120)["state"] == "COMPLETED"
    printed = yc.yard("tensorboard", str(job), "--print").stdout
    assert f"{yc.job_dir(job)}/metrics/tensorboard" in printed
    port = free_port()
    proc = subprocess.Popen([YARD, "tensorboard", str(job), "--port", str(port)], env=yc.env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        tags = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read()
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=2)
                if r.status_code == 200 and r.json():
                    tags = r.json()
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.3)
        assert tags, "TensorBoard did not answer"
        run, = tags.values()
        assert "loss" in run, run
        r = httpx.get(f"http://127.0.0.1:{port}/data/plugin/scalars/scalars",
                      params={"run": next(iter(tags)), "tag": "loss"}, timeout=5)
        assert [p[1] for p in r.json()] == list(range(1, 7))  # (wall time, step, value) for steps 1..6
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_job_without_events_or_a_missing_job_is_refused(yc):
    job = yc.submit("-G", "1", "-A", "vision", "--", sys.executable, "-c", "print('no runtime here')")
    yc.wait(job, "COMPLETED", timeout=60)
    r = yc.yard("tensorboard", str(job), check=False)
    assert r.returncode == 2 and "no TensorBoard events" in r.stderr
    r = yc.yard("tensorboard", "987654", check=False)
    assert r.returncode != 0 and "987654" in (r.stderr + r.stdout)
