"""`ControlPlane` set-up: the default configuration, the admin token, and the stop escalation."""

from __future__ import annotations

import stat
import time

import yaml

from tests.plane import Plane, script


def test_without_a_config_one_node_of_emulated_gpus_and_a_default_team(tmp_path):
    p = Plane(tmp_path / "d", config=None, start=False)
    try:
        cfg = yaml.safe_load(p.admin.get("/api/v1/cluster/config").json()["text"])
        nodes = cfg["cluster"]["nodes"]
        assert len(nodes) == 1 and nodes[0]["gpus"] == 4 and nodes[0]["gpu_model"] == "emulated"
        assert [t["name"] for t in cfg["teams"]] == ["default"]
        assert cfg["teams"][0]["quotas"]["default"]["nominal"] == 4
        assert [c["name"] for c in cfg["classes"]] == ["interactive", "training", "batch"]
        assert cfg["default_class"] == "training"
        token_file = p.cp.data_dir / "admin.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        # Only the hash is stored: the token's text is nowhere in the database file.
        token = token_file.read_text().strip()
        db = (p.cp.data_dir / "trainyard.db").read_bytes() + (p.cp.data_dir / "trainyard.db-wal").read_bytes()
        assert token.encode() not in db
    finally:
        p.cp.stop()


def test_emulated_two_node_cluster_and_a_restart_keeps_the_token(tmp_path):
    p = Plane(tmp_path / "d", config=None, start=False, nodes=2, gpus_per_node=4)
    token = p.admin_token
    assert [n["gpus"] for n in p.admin.get("/api/v1/nodes").json()["nodes"]] == [4, 4]
    p.cp.stop()
    again = Plane(tmp_path / "d", config=None, start=False)
    try:
        assert again.admin_token == token
        assert len(again.admin.get("/api/v1/nodes").json()["nodes"]) == 2  # the stored configuration stays
    finally:
        again.cp.stop()


STUBBORN = """
import signal, time, os, pathlib
ck = pathlib.Path(os.environ['TRAINYARD_CHECKPOINT_DIR'])
def note(sig, _):
    (ck / f'got-{sig}').write_text(str(time.time()))
signal.signal(signal.SIGUSR1, note)
signal.signal(signal.SIGTERM, note)
while True:
    time.sleep(0.05)
"""


def test_a_job_that_ignores_the_notice_gets_sigterm_after_grace_then_sigkill(tmp_path):
    p = Plane(tmp_path / "d", kill_wait_s=1.0)
    try:
        j = p.submit(command=script(STUBBORN), team="vision", **{"class": "batch"})  # grace period 2 s
        p.wait(j["id"], "RUNNING")
        time.sleep(0.3)
        t0 = time.time()
        assert p.admin.post(f"/api/v1/jobs/{j['id']}/requeue").status_code == 200
        done = p.wait(j["id"], lambda j: j["attempts"][0]["state"] == "REQUEUED", timeout=20)
        ck = p.cp.data_dir / "jobs" / str(j["id"]) / "checkpoints"
        usr1 = float((ck / "got-10").read_text())
        term = float((ck / "got-15").read_text())
        assert usr1 - t0 < 1.0
        assert 2.0 <= term - t0 < 3.5  # SIGTERM when the class's grace period is over
        first = done["attempts"][0]
        assert first["signal"] == 9 and first["ended_at"] - term >= 1.0  # SIGKILL after the kill wait
    finally:
        p.stop()
