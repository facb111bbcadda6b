"""The small parts: job environment, init(), metrics.jsonl, progress reports, preemption flag, watchdog."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from trainyard.contracts import PREEMPT_SIGNALS, REQUEUE_EXIT, WATCHDOG_EXIT, JobDir
from trainyard.runtime import (
    JobEnv,
    JobEnvError,
    MetricsLogger,
    PreemptionHandler,
    ProgressReporter,
    init,
    read_metrics,
)


def test_env_defaults_are_a_single_process_run():
    e = JobEnv.from_environ({})
    assert (e.rank, e.world_size, e.local_rank, e.local_world_size, e.distributed) == (0, 1, 0, 1, False)
    assert e.checkpoint_dir == Path("checkpoints") and e.metrics_dir == Path("metrics")
    assert e.api is None and e.job_id is None and e.watchdog_s is None and e.attempt == 0


def test_env_of_the_control_plane():
    e = JobEnv.from_environ({
        "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500", "TRAINYARD_JOB_ID": "12", "TRAINYARD_ATTEMPT": "2",
        "TRAINYARD_CHECKPOINT_DIR": "/data/jobs/12/checkpoints", "TRAINYARD_API": "http://yard:8080/",
        "TRAINYARD_TOKEN": "t", "TRAINYARD_WATCHDOG_S": "300"})
    assert (e.rank, e.local_rank, e.world_size, e.local_world_size, e.master_port) == (3, 1, 4, 2, 29500)
    assert e.distributed and e.job_id == "12" and e.attempt == 2 and e.api == "http://yard:8080"
    assert e.metrics_dir == Path("/data/jobs/12/metrics")  # the job directory's metrics/
    assert e.watchdog_s == 300.0


def test_env_finds_the_job_dir_for_the_phase_file_as_it_finds_the_metrics():
    plane = JobEnv.from_environ({"TRAINYARD_JOB_ID": "12", "TRAINYARD_ATTEMPT": "2",
                                 "TRAINYARD_CHECKPOINT_DIR": "/data/jobs/12-ab/checkpoints",
                                 "TRAINYARD_METRICS_DIR": "/elsewhere/metrics"})
    assert plane.job_dir == Path("/data/jobs/12-ab")
    # where the plane reads it, whatever metrics dir the script chose
    assert plane.phases_file(1) == JobDir("/data/jobs/12-ab").phases_file(2, 1)
    assert plane.phases_file(1, "/mine") == Path("/data/jobs/12-ab/metrics/phases/attempt-2-rank-1.json")
    torchrun = JobEnv.from_environ({"TRAINYARD_CHECKPOINT_DIR": "/runs/a/checkpoints"})  # no plane
    assert torchrun.job_dir is None
    assert torchrun.phases_file(0) == Path("/runs/a/metrics/phases/attempt-0-rank-0.json")
    assert torchrun.phases_file(3, "/mine") == Path("/mine/phases/attempt-0-rank-3.json")


@pytest.mark.parametrize("env,msg", [
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK=2 must be < WORLD_SIZE=2"),
    ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be >= 1"),
    ({"LOCAL_RANK": "4", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_RANK=4"),
    ({"TRAINYARD_WATCHDOG_S": "-1"}, "TRAINYARD_WATCHDOG_S"),
])
def test_env_errors_name_the_variable(env, msg):
    with pytest.raises(JobEnvError, match=msg):
        JobEnv.from_environ(env)


def test_init_single_process_seeds_and_needs_no_rendezvous():
    ctx = init(seed=11, env=JobEnv())
    a = torch.rand(3)
    init(seed=11, env=JobEnv())
    assert torch.equal(a, torch.rand(3))
    assert ctx.device.type == "cpu" and ctx.backend is None and not ctx.distributed
    assert ctx.control_group is None and ctx.checkpoint_group is None


def test_metrics_lines_throughput_events_and_resume(tmp_path):
    m = MetricsLogger(tmp_path, attempt=1, tensorboard=None)  # tensorboard not installed: just skipped
    m.start_clock()
    for step in (1, 2, 3):
        time.sleep(0.01)
        m.log_step(step, samples=8, tokens=800, loss=torch.tensor(1.0 / step), lr=0.1)
    m.log_step(4, samples=8, loss=float("nan"))
    m.close()
    m2 = MetricsLogger(tmp_path, attempt=2)
    m2.load_state_dict(m.state_dict())
    m2.resumed(2)
    m2.log_step(3, samples=8, loss=0.25)
    m2.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 1 and lines[0]["loss"] == 1.0 and lines[0]["tokens"] == 800
    assert 0 < lines[0]["samples_per_s"] < 8 / 0.01 * 1.01 and lines[0]["step_time_s"] >= 0.01
    assert lines[3]["loss"] == "nan"
    assert lines[4] == {**lines[4], "event": "resume", "step": 2, "attempt": 2, "discarded_steps": 2}
    final = read_metrics(tmp_path)
    assert sorted(final) == [1, 2, 3, 4] and final[3]["loss"] == 0.25 and final[3]["attempt"] == 2
    assert final[3]["samples"] == 40  # counters continue from the checkpoint


def test_metrics_only_rank_0_writes(tmp_path):
    m = MetricsLogger(tmp_path / "m", rank=1)
    m.log_step(1, samples=4, loss=1.0)
    assert not (tmp_path / "m").exists() and m.samples == 4


def test_tensorboard_required_but_missing_fails_at_once(tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            MetricsLogger(tmp_path, tensorboard=True)
    else:
        pytest.skip("tensorboard is installed")


class _Recorder(BaseHTTPRequestHandler):
    posts: list = []
    status = 204
    delay_s = 0.0  # a slow control plane: a reporter that waited for it would take this long per post

    def do_POST(self):  # noqa: N802
        time.sleep(type(self).delay_s)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).posts.append((self.path, self.headers.get("Authorization"), body))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *a):
        pass


def test_progress_posts_latest_and_events_never_blocks(capsys):
    _Recorder.posts, _Recorder.status, _Recorder.delay_s = [], 204, 2.0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p = ProgressReporter(f"http://127.0.0.1:{server.server_port}", "5", "secret", attempt=3, interval_s=60)
        t0 = time.perf_counter()
        for step in range(1, 200):
            p.report(step, metrics={"loss": 1.0})
        p.report(200, event="checkpoint", last_checkpoint_step=200, last_checkpoint_time=1.5)
        # far below one slow post (2 s): the training loop never waits for the plane, however loaded
        assert time.perf_counter() - t0 < 1.5
        p.close()
    finally:
        server.shutdown()
    events = [(b["event"], b["step"]) for _, _, b in _Recorder.posts]
    assert ("checkpoint", 200) in events and len(events) <= 3  # step reports are rate-limited
    path, auth, body = _Recorder.posts[-1]
    assert path == "/api/v1/jobs/5/progress" and auth == "Bearer secret"
    assert body["attempt"] == 3 and body["last_checkpoint_step"] == 200


def test_progress_failures_warn_once_and_go_on(capsys):
    _Recorder.posts, _Recorder.status, _Recorder.delay_s = [], 404, 0.0  # the endpoint does not exist yet on the server
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        p = ProgressReporter(f"http://127.0.0.1:{server.server_port}", "5", None, interval_s=0)
        for step in range(3):
            p.report(step, event="checkpoint")
            time.sleep(0.1)
        p.close()
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert err.count("progress report to") == 1 and "404" in err and p.failed >= 2
    off = ProgressReporter(None, None)
    off.report(1)  # disabled: a no-op
    assert not off.enabled


def test_preemption_flag_single_process():
    h = PreemptionHandler().install()
    try:
        assert not h.should_stop()
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.05)
        assert h.local and h.should_stop() and h.received == signal.SIGUSR1
    finally:
        h.uninstall()
    assert signal.getsignal(signal.SIGUSR1) is not h._on_signal
    assert PREEMPT_SIGNALS == (signal.SIGUSR1, signal.SIGTERM)


SIGTERM_JOB = """
import os, signal, sys, time, torch
import trainyard.runtime as yr
ctx = yr.init(seed=0)
model = torch.nn.Linear(2, 1)
run = yr.Run(ctx, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
for step in run.steps(1000):
    if step == 3:
        os.kill(os.getpid(), signal.SIGTERM)
    if step == {second} and {second}:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
print("finished", flush=True)
"""


@pytest.mark.parametrize("second", [0, 3], ids=["sigterm-checkpoints-exit-75", "second-sigterm-kills"])
def test_sigterm_checkpoints_and_exits_75_second_one_kills(tmp_path, second):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update(TRAINYARD_CHECKPOINT_DIR=str(tmp_path / "ckpt"), TRAINYARD_METRICS_DIR=str(tmp_path / "m"))
    p = subprocess.run([sys.executable, "-c", SIGTERM_JOB.format(second=second)], env=env, capture_output=True,
                       text=True, timeout=60)
    if second:
        assert p.returncode == -signal.SIGTERM
        assert not (tmp_path / "ckpt").exists()
    else:
        assert p.returncode == REQUEUE_EXIT, p.stderr
        assert "preemption (SIGTERM): checkpointed step 3" in p.stderr
        assert (tmp_path / "ckpt" / "step-3" / "COMMITTED").exists()


WATCHDOG_JOB = """
import time
from trainyard.runtime import Watchdog
wd = Watchdog(0.5, first_timeout_s=0.5).start()
for step in range(1, 6):
    time.sleep(0.1)
    wd.beat(step)
with wd.allow(1.5, "a long evaluation"):
    time.sleep(1.0)  # longer than the step timeout: allowed
wd.beat(6)
print("survived", flush=True)
time.sleep(10)
"""


def test_watchdog_allowance_then_fires_with_its_own_code():
    p = subprocess.run([sys.executable, "-c", WATCHDOG_JOB], capture_output=True, text=True, timeout=30)
    assert p.returncode == WATCHDOG_EXIT
    assert "survived" in p.stdout
    assert "a training step did not complete in time" in p.stderr and "last completed step: 6" in p.stderr
    assert WATCHDOG_EXIT not in (0, 1, REQUEUE_EXIT)
