"""Disk per team as a person meets it: `yard up --jobs-dir`, `yard storage`, the disk line of
`yard show` and the StorageQuota reason in `yard queue`. Real `yard up` and `yard` processes."""

from __future__ import annotations

import json
import os
import subprocess
import time

from tests.plane import TWO_TEAMS, YARD, YardServer

NLP_1MIB = TWO_TEAMS.read_text().replace("  - name: nlp\n", "  - name: nlp\n    storage: {quota_gb: 0.001}\n", 1) \
    + "storage: {interval: 0.2s}\n"


def test_jobs_dir_is_refused_with_exit_2_when_jobs_already_holds_job_dirs(tmp_path):
    data = tmp_path / "d"
    (data / "jobs" / "3-0123456789ab").mkdir(parents=True)
    p = subprocess.run([YARD, "up", "--data-dir", str(data), "--port", "0", "--config", str(TWO_TEAMS),
                        "--jobs-dir", str(tmp_path / "scratch")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "--jobs-dir:" in p.stderr and "holds job dirs" in p.stderr and f"mv {data / 'jobs'}/*" in p.stderr
    assert (data / "jobs" / "3-0123456789ab").is_dir()


def test_yard_storage_show_and_queue_say_what_each_team_holds_and_why_a_job_waits(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(NLP_1MIB)
    scratch = tmp_path / "scratch"
    server = YardServer(tmp_path / "yard", config_file=cfg, args=("--jobs-dir", str(scratch)))
    server.data_dir.mkdir()
    server.start()
    env = {**os.environ, "YARD_URL": server.url, "YARD_TOKEN": server.token}

    def yard(*args: str) -> str:
        p = subprocess.run([YARD, *args], capture_output=True, text=True, env=env, cwd=server.data_dir, timeout=60)
        assert p.returncode == 0, f"yard {' '.join(args)} → {p.returncode}\n{p.stdout}\n{p.stderr}"
        return p.stdout

    try:
        assert os.readlink(server.data_dir / "jobs") == str(scratch)
        first = int(yard("submit", "-A", "nlp", "--", "sh", "-c",
                         'head -c 3000000 /dev/zero > "$TRAINYARD_CHECKPOINT_DIR/c"').split()[-1])
        deadline = time.monotonic() + 60
        while not next(t for t in json.loads(yard("storage", "--json"))["teams"] if t["team"] == "nlp")["over"]:
            assert time.monotonic() < deadline, yard("storage")
            time.sleep(0.2)
        second = int(yard("submit", "-A", "nlp", "--", "true").split()[-1])
        deadline = time.monotonic() + 30
        while "StorageQuota" not in yard("queue"):
            assert time.monotonic() < deadline, yard("queue")
            time.sleep(0.2)
        out = yard("storage", "-j", "5")
        nlp = next(line for line in out.splitlines() if line.startswith("nlp"))
        assert "2.9M" in nlp and "1.0M" in nlp and "OVER" in nlp, out
        assert str(server.data_dir) in out and "reserve" in out
        assert any(line.split()[:2] == [str(first), "nlp"] for line in out.splitlines()), out
        shown = yard("show", str(first))
        assert "disk: 2.9M (its job dir" in " ".join(shown.split()), shown
        assert json.loads(yard("show", str(second), "--json"))["reason"] == "StorageQuota"
    finally:
        for j in json.loads(yard("queue", "--json")):
            subprocess.run([YARD, "cancel", str(j["id"])], env=env, capture_output=True)
        server.terminate()
