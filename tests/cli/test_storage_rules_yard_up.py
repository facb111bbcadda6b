"""Issue 41's retention acceptance on a real `yard up` and real `yard` processes: jobs of two teams
with logs and checkpoints, lifecycle rules applied with `yard cluster apply` that delete some;
`yard storage --refresh` and a walk of the disk agree to the byte before and after (apparent sizes,
hard links once: `du -sbx`); one audit event per deletion (`yard audit`); a running job's files
are never touched; a malformed rule is refused by `yard cluster apply` with exit 2 naming the
field, and no configuration version is written."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.plane import TWO_TEAMS, YARD, YardServer, identity_config_text, job_dir
from tests.services.test_retention_rules import apparent
from trainyard.contracts import JobDir

pytestmark = pytest.mark.slow

BASE = TWO_TEAMS.read_text() + "retention: {interval: 0.5s}\nstorage: {interval: 1h}\n"
# vision: a finished job's whole dir goes 1 s after its end; nlp: its logs do, its dir a day after
RULES = (BASE.replace("  - name: vision\n", "  - name: vision\n    storage: {lifecycle: {job_dirs: 1s}}\n", 1)
         .replace("  - name: nlp\n", "  - name: nlp\n    storage: {lifecycle: {logs: 1s, job_dirs: 1d}}\n", 1))
WRITE = ('echo "rank $TRAINYARD_JOB_ID says hello"; head -c {n} /dev/urandom > "$TRAINYARD_CHECKPOINT_DIR/w.pt"; '
         'mkdir -p "$TRAINYARD_CHECKPOINT_DIR/step-1" && echo 1 > "$TRAINYARD_CHECKPOINT_DIR/step-1/COMMITTED"')


def disk(data_dir: Path, teams: dict[int, str]) -> dict[str, int]:
    """Apparent bytes per team, by a walk of `jobs/` (what `du -sb jobs/<dir>` prints, added up)."""
    out: dict[str, int] = {}
    for d in (data_dir / "jobs").iterdir():
        parsed = JobDir.parse_name(d.name)
        assert parsed is not None and parsed[0] in teams, d
        out[teams[parsed[0]]] = out.get(teams[parsed[0]], 0) + apparent(d)
    return out


def test_rules_delete_what_they_say_and_yard_storage_agrees_with_the_disk(tmp_path):
    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(BASE)
    server = YardServer(tmp_path / "yard", config_file=cfg)
    server.data_dir.mkdir()
    server.start()
    env = {**os.environ, "YARD_URL": server.url, "YARD_TOKEN": server.token}

    def yard(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
        p = subprocess.run([YARD, *args], capture_output=True, text=True, env=env, cwd=server.data_dir, timeout=60)
        if ok:
            assert p.returncode == 0, f"yard {' '.join(args)} → {p.returncode}\n{p.stdout}\n{p.stderr}"
        return p

    def submit(team: str, script: str) -> int:
        return int(yard("submit", "-A", team, "--", "sh", "-c", script).stdout.split()[-1])

    def state(jid: int) -> str:
        return json.loads(yard("show", str(jid), "--json").stdout)["state"]

    def storage() -> dict:
        return json.loads(yard("storage", "--refresh", "--json").stdout)

    def fast(rep: dict) -> dict[str, int]:
        return {t["team"]: t["tiers"]["fast"]["apparent_bytes"] for t in rep["teams"] if t["tiers"]["fast"]["apparent_bytes"]}

    try:
        vision_done = submit("vision", WRITE.format(n=300_000))
        nlp_done = submit("nlp", WRITE.format(n=200_000))
        nlp_running = submit("nlp", WRITE.format(n=100_000) + "; sleep 300")
        teams = {vision_done: "vision", nlp_done: "nlp", nlp_running: "nlp"}
        deadline = time.monotonic() + 60
        while (state(vision_done), state(nlp_done)) != ("COMPLETED", "COMPLETED") or state(nlp_running) != "RUNNING" \
                or not (job_dir(server.data_dir, nlp_running) / "checkpoints" / "step-1" / "COMMITTED").exists():
            assert time.monotonic() < deadline, yard("queue", "-t", "all").stdout
            time.sleep(0.3)
        settled, deadline = {}, time.monotonic() + 30
        while settled != (settled := disk(server.data_dir, teams)):  # end notes written, run state released
            assert time.monotonic() < deadline
            time.sleep(1.0)
        running_dir = job_dir(server.data_dir, nlp_running)
        running_files = {p: p.read_bytes() for p in running_dir.rglob("*") if p.is_file() and "run" not in p.parts}

        before = storage()
        assert fast(before) == disk(server.data_dir, teams)  # to the byte
        vision = next(t for t in before["teams"] if t["team"] == "vision")
        assert vision["tiers"]["fast"]["kinds"]["checkpoints"] >= 300_000
        assert before["next"] == []  # no rule yet

        # a malformed rule: exit 2 naming the field, no version written
        versions = json.loads(yard("cluster", "history", "--json").stdout)
        bad = tmp_path / "bad.yaml"
        bad.write_text(identity_config_text(cfg).replace(
            "  - name: nlp\n", "  - name: nlp\n    storage: {lifecycle: {checkpoints: {keep_last: 0}}}\n", 1))
        p = yard("cluster", "apply", str(bad), ok=False)
        assert p.returncode == 2 and "teams.1.storage.lifecycle.checkpoints.keep_last" in p.stderr, p.stderr
        bad.write_text(identity_config_text(cfg).replace("retention: {", "retention: {job_dirs: 3 parsecs, "))
        p = yard("cluster", "apply", str(bad), ok=False)
        assert p.returncode == 2 and "retention.job_dirs" in p.stderr and "3 parsecs" in p.stderr, p.stderr
        assert json.loads(yard("cluster", "history", "--json").stdout) == versions

        rules = tmp_path / "rules.yaml"
        assert BASE in identity_config_text(cfg)
        rules.write_text(identity_config_text(cfg).replace(BASE, RULES))
        yard("cluster", "apply", str(rules), "-m", "lifecycle rules")
        vision_dir, nlp_dir = job_dir(server.data_dir, vision_done), job_dir(server.data_dir, nlp_done)
        deadline = time.monotonic() + 60
        while vision_dir.exists() or (nlp_dir / "logs").exists():
            assert time.monotonic() < deadline, (server.data_dir / "up.log").read_text()[-3000:]
            time.sleep(0.3)

        after = storage()
        assert fast(after) == disk(server.data_dir, teams)  # to the byte, after the rules ran
        assert "vision" not in fast(after) and nlp_dir.is_dir() and (nlp_dir / "checkpoints" / "w.pt").is_file()
        events = [json.loads(line) for line in yard("audit", "--kind", "retention.deleted").stdout.splitlines()]
        got = {(e["job_id"], e["data"]["what"], e["data"]["rule"]) for e in events}
        assert got == {(vision_done, "job_dir", "teams.vision.storage.lifecycle.job_dirs"),
                       (nlp_done, "logs", "teams.nlp.storage.lifecycle.logs")}, events
        by_job = {e["job_id"]: e["data"]["bytes"] for e in events}
        assert by_job[vision_done] == fast(before)["vision"]  # the only vision dir: all its bytes
        assert fast(after)["nlp"] == fast(before)["nlp"] - by_job[nlp_done]  # exactly its logs went

        # the running job: untouched, still running, listed in no deletion
        assert state(nlp_running) == "RUNNING"
        assert all(p.read_bytes() == data for p, data in running_files.items())
        assert not any(n["job_id"] == nlp_running for n in after["next"])
        [nxt] = after["next"]  # what goes next: the finished nlp job's dir, a day after its end
        end = json.loads(yard("show", str(nlp_done), "--json").stdout)["end_time"]
        assert (nxt["job_id"], nxt["what"], nxt["at"], nxt["rule"]) == (
            nlp_done, "job_dir", end + 86400, "teams.nlp.storage.lifecycle.job_dirs")
        assert nxt["bytes"] == apparent(nlp_dir)
        shown = yard("storage").stdout
        assert "per tier and kind" in shown and "what the rules delete next" in shown, shown
        assert any(line.split()[1:4] == [str(nlp_done), "nlp", "job_dir"] for line in shown.splitlines()), shown
    finally:
        for j in json.loads(yard("queue", "--json").stdout):
            subprocess.run([YARD, "cancel", str(j["id"])], env=env, capture_output=True)
        server.terminate()
