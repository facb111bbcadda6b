"""`yard checkpoints` as a person meets it, on a real `yard up` with a path archive and rules
(keep-last-2 + every 3rd): the listing (tiers, size, metrics, keep), a keep mark and its undo, the
plane's retention handed to the job (`TRAINYARD_CHECKPOINT_RETENTION=plane`), and bad input (exit 2,
nothing written). Real `yard up` and `yard` processes."""

from __future__ import annotations

import json
import os
import subprocess
import time

from tests.plane import TWO_TEAMS, YARD, YardServer
from trainyard.cli.storage import size

CONFIG = TWO_TEAMS.read_text() + """
storage:
  archive: {url: "ARCHIVE", interval: 1s}
  lifecycle:
    checkpoints: {keep_last: 2, keep_every: 3}
"""
# six committed steps as the runtime lays them out: a file, then the manifest (COMMITTED) last
JOB = r'''
echo "$TRAINYARD_CHECKPOINT_RETENTION" > "$TRAINYARD_CHECKPOINT_DIR/../retention"
for n in 1 2 3 4 5 6; do
  d="$TRAINYARD_CHECKPOINT_DIR/step-$n"; mkdir -p "$d"
  head -c 1000 /dev/zero > "$d/a"
  printf '{"step": %d, "files": {"a": 1000}, "metrics": {"loss": %d.5}}' "$n" "$n" > "$d/COMMITTED"
done
'''


def test_listing_keep_and_bad_input(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(CONFIG.replace("ARCHIVE", str(tmp_path / "archive")))
    server = YardServer(tmp_path / "yard", config_file=cfg)
    server.data_dir.mkdir()
    server.start()
    env = {**os.environ, "YARD_URL": server.url, "YARD_TOKEN": server.token}

    def yard(*args: str, rc: int = 0) -> subprocess.CompletedProcess:
        p = subprocess.run([YARD, *args], capture_output=True, text=True, env=env, cwd=server.data_dir, timeout=60)
        assert p.returncode == rc, f"yard {' '.join(args)} → {p.returncode}\n{p.stdout}\n{p.stderr}"
        return p

    try:
        job = int(yard("submit", "-A", "vision", "--", "sh", "-c", JOB).stdout.split()[-1])
        deadline = time.monotonic() + 60
        while (listing := json.loads(yard("checkpoints", str(job), "--json").stdout)["checkpoints"]) != [] and \
                [(c["step"], c["tiers"]) for c in listing] != [(3, ["archive"]), (5, ["fast"]), (6, ["fast"])] \
                or not listing:
            assert time.monotonic() < deadline, listing
            time.sleep(0.3)
        jd = next((server.data_dir / "jobs").glob(f"{job}-*"))
        assert (jd / "retention").read_text().strip() == "plane"
        assert sorted(p.name for p in (jd / "checkpoints").iterdir()) == ["step-5", "step-6"]
        out = yard("checkpoints", str(job)).stdout
        row = next(line.split() for line in out.splitlines() if line.split()[:1] == ["3"])
        # the archive tier's size is what it holds for the step: the 1000-byte file, SHA256SUMS and the marker
        held = sum(f.stat().st_size for f in (tmp_path / "archive").rglob("*") if f.is_file() and "step-3" in f.parts)
        assert row[1] == "archive" and row[2] == size(held) and held > 1000 and "loss=3.5" in out, out
        assert "kept" in yard("checkpoints", "keep", str(job), "6").stdout
        assert "keep" in next(line for line in yard("checkpoints", str(job)).stdout.splitlines()
                              if line.split()[:1] == ["6"])
        assert "no longer kept" in yard("checkpoints", "keep", str(job), "6", "--undo").stdout
        # bad input: exit 2, a message naming what is wrong, nothing marked
        assert "JOB" in yard("checkpoints", "abc", rc=2).stderr
        assert "STEP" in yard("checkpoints", "keep", str(job), rc=2).stderr
        assert "--undo" in yard("checkpoints", str(job), "--undo", rc=2).stderr
        missing = yard("checkpoints", "keep", str(job), "4", rc=2)
        assert "no committed checkpoint step 4" in missing.stderr + missing.stdout
        assert not json.loads(yard("checkpoints", str(job), "--json").stdout)["checkpoints"][-1]["keep"]
        audit = [e["kind"] for e in json.loads(server_get(server, f"/api/v1/jobs/{job}/events"))["events"]]
        assert audit.count("checkpoint.deleted") == 3 and "checkpoint.kept" in audit and "checkpoint.unkept" in audit
    finally:
        server.terminate()


def server_get(server: YardServer, path: str) -> str:
    import httpx

    return httpx.get(server.url + path, headers={"Authorization": f"Bearer {server.token}"}, timeout=30).text
