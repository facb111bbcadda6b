"""`ControlPlane` set-up: the default configuration and the admin token. (The stop escalation, notice →
SIGTERM → SIGKILL, is tested to the fake second in tests/control/loop/test_loop_logic.py.)"""

from __future__ import annotations

import stat

import yaml

from tests.plane import Plane


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
    p = Plane(tmp_path / "d", config=None, start=False, backend_options={"nodes": 2, "gpus_per_node": 4})
    token = p.admin_token
    assert [n["gpus"] for n in p.admin.get("/api/v1/nodes").json()["nodes"]] == [4, 4]
    p.cp.stop()
    again = Plane(tmp_path / "d", config=None, start=False)
    try:
        assert again.admin_token == token
        assert len(again.admin.get("/api/v1/nodes").json()["nodes"]) == 2  # the stored configuration stays
    finally:
        again.cp.stop()
