"""What a job leaves where the plane reads (issue 34): a FIFO, a link to /dev/zero, a gigabyte.
The plane reads a job's `metrics/metrics.jsonl` at the end of every attempt (did the runtime
checkpoint on a notice?), its logs for the API and the dashboard, its checkpoint markers each pass.
A FIFO there used to stop the control loop for ever (and again after a restart), a link to
/dev/zero read without end, one log read took 2 GB. Now every such read goes through `jobfs`:
regular files only, never through a link, never blocking, at most a page."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from tests.accounts import ROOT_ONLY
from tests.security.hostile import yard

pytestmark = [ROOT_ONLY, pytest.mark.slow, pytest.mark.xdist_group("security-files")]

METRICS = '"$(dirname "$TRAINYARD_CHECKPOINT_DIR")/metrics/metrics.jsonl"'
LOG = '"$(dirname "$TRAINYARD_CHECKPOINT_DIR")/logs/rank-0.log"'


@pytest.fixture(scope="module")
def y():
    with yard("ty-sec-files-") as y:
        yield y


def _peak_rss_mib() -> float:
    """This process's peak resident set since the last `_reset_peak` (the plane runs in it)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


@pytest.mark.parametrize("plant", ["mkfifo", "ln -s /dev/zero", "ln -s /etc/shadow"])
def test_a_fifo_or_a_link_in_metrics_never_holds_the_loop(y, plant):
    """The job plants it and fails; its end is recorded at once and the next job (of another
    team) starts and ends as usual."""
    bad = y.submit("alice", ["/bin/sh", "-c", f"rm -f {METRICS}; {plant} {METRICS}; exit 1"],
                   workdir=str(y.home("alice")))
    t0 = time.monotonic()
    job = y.ended(bad, timeout=60)
    held = time.monotonic() - t0
    assert job["state"] == "FAILED", job
    nxt = y.submit("bob", ["/bin/sh", "-c", "echo after"], workdir=str(y.home("bob")))
    assert y.ended(nxt, timeout=60)["state"] == "COMPLETED"
    assert held < 30, f"the loop took {held:.1f} s to record the job's end"


def test_a_huge_log_and_metrics_are_read_a_page_at_a_time(y):
    """A job that leaves a 1 GB log and an 800 MB metrics file: the API answers a page of at most
    8 MiB and the size, the dashboard's job page a bounded tail and a sampled curve; the plane's
    memory grows by far less than the files (it took 2 GB for one log read)."""
    body = (f"truncate -s 1G {LOG}; "
            f"python3 -c 'import json,sys\nf=open(sys.argv[1],\"a\")\n"
            "line=json.dumps({\"step\":0,\"loss\":1.0})\n"
            "[f.write(json.dumps({\"step\":i,\"loss\":1.0/(i+1),\"attempt\":1,\"time\":0.0})+\"\\n\") for i in range(200000)]' "
            f"{METRICS}; truncate -s 800M {METRICS}; echo done")
    j = y.submit("alice", ["/bin/sh", "-c", body], workdir=str(y.home("alice")))
    assert y.ended(j)["state"] == "COMPLETED", y.log(j)[-500:]
    alice = y.plane.as_user("alice", "member", "vision")
    _reset_peak()
    base = _peak_rss_mib()
    r = alice.get(f"/api/v1/jobs/{j}/logs")
    assert r.status_code == 200 and len(r.content) <= 8 << 20
    assert int(r.headers["x-log-size"]) >= 1 << 30 and int(r.headers["x-log-next-offset"]) == len(r.content)
    tail = alice.get(f"/api/v1/jobs/{j}/logs", params={"offset": -1000})
    assert tail.status_code == 200 and len(tail.content) <= 1000
    assert alice.get(f"/api/v1/jobs/{j}/logs", params={"limit": (8 << 20) + 1}).status_code == 422
    ui = TestClient(y.plane.app)
    assert ui.post("/ui/login", data={"token": y.plane.token("alice", "member", "vision")},
                   follow_redirects=False).status_code == 303
    page = ui.get(f"/ui/jobs/{j}")
    assert page.status_code == 200
    grew = _peak_rss_mib() - base
    assert grew < 100, f"the plane's peak memory grew {grew:.0f} MiB reading a 1 GB log and an 800 MB metrics file"
