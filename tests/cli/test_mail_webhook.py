"""`--mail-type`/`--mail-user` against a real `yard up` (local backend) and a real HTTP receiver:
the cluster configuration's `notify:` webhook gets one JSON POST per event the job asked for, in
order, and a slow or failing receiver never holds the control loop up (control/lifecycle/notify.py)."""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.plane import TWO_TEAMS, identity_config_text
from tests.yard_cluster import YardCluster

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("mail-webhook")]

QUICK = [sys.executable, "-c", "print('hi', flush=True)"]
FAILS = [sys.executable, "-c", "import sys; sys.exit(3)"]
SLEEPS = [sys.executable, "-c", "import time; time.sleep(60)"]


class Receiver:
    """An HTTP server that keeps every JSON body POSTed to it; a job named `slow` is answered
    after `slow_s` (longer than the webhook's time-out), one named `refused` with a 500."""

    def __init__(self, slow_s: float = 3.0):
        self.bodies: list[dict] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body["_headers"] = {k.lower(): v for k, v in self.headers.items()}
                with outer.lock:
                    outer.bodies.append(body)
                if body["name"] == "slow":
                    time.sleep(slow_s)
                self.send_response(500 if body["name"] == "refused" else 204)
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, job: int) -> list[dict]:
        with self.lock:
            return [b for b in self.bodies if b["job_id"] == job]

    def wait_events(self, job: int, n: int, timeout: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout
        while len(got := self.of(job)) < n:
            assert time.monotonic() < deadline, f"job {job}: {[b['event'] for b in got]} after {timeout}s"
            time.sleep(0.05)
        return got

    def stop(self):
        self.server.shutdown()


@pytest.fixture(scope="module")
def hook():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def yc(hook, tmp_path_factory):
    base = tmp_path_factory.mktemp("mail")
    cfg = base / "notify.yaml"
    cfg.write_text(TWO_TEAMS.read_text() + f"notify:\n  webhook: {hook.url}\n  timeout_s: 1\n  retries: 1\n"
                   "  headers: {X-Token: s3cret}\n")
    c = YardCluster(base, "local", config_file=cfg)
    yield c
    c.stop()


def events(bodies: list[dict]) -> list[str]:
    return [b["event"] for b in bodies]


def test_begin_and_end_are_posted_in_order_with_the_jobs_facts(yc, hook):
    job = yc.submit("-A", "vision", "-J", "hello", "--mail-type=BEGIN,END", "--", *QUICK)
    yc.wait(job, "COMPLETED")
    got = hook.wait_events(job, 2)
    assert events(got) == ["BEGIN", "END"]
    begin, end = got
    for b in got:
        assert b["job_id"] == job and b["name"] == "hello" and b["team"] == "vision" and b["user"]
        assert b["mail_user"] == b["user"]  # Slurm's default: the submitting user
        assert b["mail_type"] == "BEGIN,END" and b["cluster"] == "test" and b["_headers"]["x-token"] == "s3cret"
        assert isinstance(b["time"], float) and b["time_utc"].endswith("Z")
    assert begin["state"] == "RUNNING" and begin["attempt"] == 1 and begin["exit_code"] is None
    assert begin["message"].startswith(f"Slurm Job_id={job} Name=hello Began, Queued time ")
    assert end["state"] == "COMPLETED" and end["exit_code"] == 0 and end["seq"] > begin["seq"]
    assert "Ended, Run time" in end["message"] and end["message"].endswith("COMPLETED, ExitCode 0")


def test_fail_and_end_on_a_failed_job_and_a_mail_user(yc, hook):
    failing = yc.submit("-A", "nlp", "--mail-type=fail", "--mail-user=ops@example.org", "--", *FAILS)
    ends_only = yc.submit("-A", "nlp", "--mail-type=END", "--", *FAILS)
    quiet = yc.submit("-A", "nlp", "--mail-type=FAIL", "--", *QUICK)  # completed: FAIL is not sent
    for j in (failing, ends_only, quiet):
        yc.wait(j, lambda x: x["state"] in ("FAILED", "COMPLETED"))
    (f,) = hook.wait_events(failing, 1)
    assert f["event"] == "FAIL" and f["state"] == "FAILED" and f["exit_code"] == 3
    assert f["mail_user"] == "ops@example.org" and "Failed, Run time" in f["message"]
    (e,) = hook.wait_events(ends_only, 1)
    assert e["event"] == "END" and e["state"] == "FAILED"
    time.sleep(1)
    assert hook.of(quiet) == []


def test_all_from_sbatch_lines_and_requeue_of_a_finished_job(yc, hook, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -J scripted\n#SBATCH --mail-type=ALL --mail-user=me\necho done\n")
    job = yc.submit("-A", "vision", "-D", str(tmp_path), str(script))
    yc.wait(job, "COMPLETED")
    hook.wait_events(job, 2)
    yc.yard("requeue", str(job))
    yc.wait(job, lambda j: j["state"] == "COMPLETED" and j["attempt"] == 2)
    got = hook.wait_events(job, 5)
    assert events(got) == ["BEGIN", "END", "REQUEUE", "BEGIN", "END"], events(got)
    assert got[3]["attempt"] == 2 and all(b["mail_user"] == "me" and b["name"] == "scripted" for b in got)


def test_time_limit_shares_then_the_limit_then_fail(yc, hook):
    job = yc.submit("-A", "vision", "-t", "0:04", "--mail-type=TIME_LIMIT_50,TIME_LIMIT,FAIL", "--", *SLEEPS)
    yc.wait(job, "TIMEOUT", timeout=60)
    got = hook.wait_events(job, 3)
    assert events(got) == ["TIME_LIMIT_50", "TIME_LIMIT", "FAIL"], events(got)
    half, limit, fail = got
    assert half["state"] == "RUNNING" and "Reached 50% of time limit" in half["message"]
    assert 1.5 <= half["time"] - half["start_time"] <= 3.5
    assert "Reached time limit" in limit["message"] and fail["state"] == "TIMEOUT"


def test_a_slow_or_failing_receiver_never_holds_up_the_loop(yc, hook):
    slow = yc.submit("-A", "nlp", "-J", "slow", "--mail-type=BEGIN,END", "--", *QUICK)
    refused = yc.submit("-A", "nlp", "-J", "refused", "--mail-type=BEGIN", "--", *QUICK)
    t0 = time.monotonic()
    plain = yc.submit("-A", "nlp", "--", *QUICK)  # asks for nothing: starts and ends at once
    yc.wait(plain, "COMPLETED", timeout=30)
    for j in (slow, refused):
        yc.wait(j, "COMPLETED", timeout=30)
    assert time.monotonic() - t0 < 8  # while the slow receiver holds each POST 3 s, twice each
    # each tried twice (timeout 1 s, retries 1), in order: the slow job's BEGINs before its ENDs
    assert events(hook.wait_events(slow, 4)) == ["BEGIN", "BEGIN", "END", "END"]
    assert events(hook.wait_events(refused, 2)) == ["BEGIN", "BEGIN"]
    metrics = ""
    deadline = time.monotonic() + 30
    while 'trainyard_notifications_total{result="failed"} 3.0' not in metrics:
        assert time.monotonic() < deadline, metrics[-2000:]
        time.sleep(0.2)
        metrics = yc.http.get("/metrics").text
    assert 'trainyard_notifications_total{result="retried"} 3.0' in metrics


def test_bad_mail_options_exit_2_naming_them_and_store_nothing(yc, tmp_path):
    before = len(yc.http.get("/api/v1/jobs", params={"state": "all"}).json()["jobs"])
    r = yc.yard("submit", "-A", "vision", "--mail-type=BEGIN,BEGN", "--", "true", check=False)
    assert r.returncode == 2 and "--mail-type: unknown mail type 'BEGN'" in r.stderr and "TIME_LIMIT_80" in r.stderr
    script = tmp_path / "bad.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --mail-type=sometimes\ntrue\n")
    r = yc.yard("submit", "-A", "vision", str(script), check=False)
    assert r.returncode == 2 and f"{script}:2: --mail-type: unknown mail type 'sometimes'" in r.stderr
    r = yc.yard("submit", "-A", "vision", "--mail-user=", "--mail-type=END", "--", "true", check=False)
    assert r.returncode == 2 and "--mail-user" in r.stderr
    api = yc.http.post("/api/v1/jobs", json={"command": ["true"], "team": "vision", "mail_type": "END,NEVER"})
    assert 400 <= api.status_code < 500 and "NEVER" in api.text
    assert len(yc.http.get("/api/v1/jobs", params={"state": "all"}).json()["jobs"]) == before


def test_without_a_webhook_a_mail_request_is_warned_not_refused(yc, tmp_path):
    plain = tmp_path / "plain.yaml"
    plain.write_text(identity_config_text(TWO_TEAMS))  # the same, who jobs run as included, without notify:
    yc.yard("cluster", "apply", str(plain), "-m", "no webhook")
    r = yc.yard("submit", "-A", "vision", "--mail-type=END", "--", *QUICK)
    assert "warning: --mail-type END: this cluster has no webhook configured" in r.stderr
    job = int(r.stdout.split("Submitted job")[1].split()[0])
    assert yc.wait(job, "COMPLETED")["mail_type"] == "END"
    r = yc.yard("submit", "-A", "vision", "--", *QUICK)
    assert "warning" not in r.stderr
