"""Node health checks (control/health/): NHC-style exit codes, the disk check, and the loop
taking a node whose check goes CRITICAL out of service — its job resumes on the other node — and
back once its checks pass again. Faults injected on emulated nodes: an ECC error reported by an
executable check, and a full checkpoint disk (a real 4 MiB tmpfs)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.plane import TWO_TEAMS, Plane, job_dir, node_info, wait_until
from trainyard.control.health import CRITICAL, OK, WARN, run_check
from trainyard.spec.models import CheckSpec, ConfigError, parse_config

WORK = [sys.executable, "-m", "trainyard.demo.work", "--steps", "40", "--step-time", "0.1", "--ckpt-every", "5"]
ECC_CHECK = [sys.executable, "-c",
             "import os, sys; p = os.path.join(os.environ['TRAINYARD_DATA_DIR'], 'ecc-' + os.environ['TRAINYARD_NODE']);"
             "e = os.path.exists(p); print(open(p).read().strip() if e else 'no ECC errors'); sys.exit(2 if e else 0)"]


def script(tmp_path: Path, code: int, text: str = "", sleep: float = 0) -> list[str]:
    return [sys.executable, "-c", f"import sys, time; time.sleep({sleep}); print({text!r}); sys.exit({code})"]


@pytest.mark.parametrize("code,status", [(0, OK), (1, WARN), (2, CRITICAL), (7, CRITICAL)])
def test_exit_codes_are_nhcs(tmp_path, code, status):
    r = run_check(CheckSpec(name="c", command=script(tmp_path, code, "the message")), "node-0", tmp_path)
    assert r.status == status and (r.message == "the message")


def test_a_check_that_hangs_or_cannot_run_is_critical(tmp_path):
    r = run_check(CheckSpec(name="slow", command=script(tmp_path, 0, sleep=5), timeout=0.5), "node-0", tmp_path)
    assert r.status == CRITICAL and "timed out" in r.message
    r = run_check(CheckSpec(name="gone", command=["/nonexistent/check"]), "node-0", tmp_path)
    assert r.status == CRITICAL and "cannot run" in r.message


def test_disk_thresholds_and_templates(tmp_path):
    (tmp_path / "disks" / "node-0").mkdir(parents=True)
    crit = CheckSpec(name="d", kind="disk", paths=["{data_dir}/disks/{node}"], warn_free_gb=1e9, critical_free_gb=1e9)
    warn = CheckSpec(name="d", kind="disk", paths=["{data_dir}/disks/{node}"], warn_free_gb=1e9, critical_free_gb=0)
    ok = CheckSpec(name="d", kind="disk", paths=["{data_dir}/disks/{node}"], warn_free_gb=0, critical_free_gb=0)
    assert run_check(crit, "node-0", tmp_path).status == CRITICAL
    assert run_check(warn, "node-0", tmp_path).status == WARN
    assert run_check(ok, "node-0", tmp_path).status == OK
    assert run_check(crit, "node-1", tmp_path).status == OK  # a path not there yet is no finding


def test_bad_check_config_names_the_field():
    base = yaml.safe_load(TWO_TEAMS.read_text())
    base["health"] = {"checks": [{"name": "x", "kind": "command"}]}
    with pytest.raises(ConfigError, match="command"):
        parse_config(yaml.safe_dump(base))
    base["health"] = {"checks": [{"name": "x", "kind": "smart"}]}
    with pytest.raises(ConfigError, match="kind"):
        parse_config(yaml.safe_dump(base))
    base["health"] = {"checks": [{"name": "x", "kind": "disk", "when": "sometimes"}]}
    with pytest.raises(ConfigError, match="health.checks.0.when"):
        parse_config(yaml.safe_dump(base))
    base["health"] = {"before_work_max_age": "0s", "checks": []}
    with pytest.raises(ConfigError, match="health.before_work_max_age.*greater than 0"):
        parse_config(yaml.safe_dump(base))
    base["health"] = {"checks": [{"name": "x", "kind": "disk"}, {"name": "x", "kind": "nvml"}]}
    with pytest.raises(ConfigError, match="check names must be unique; 'x'"):
        parse_config(yaml.safe_dump(base))
    assert parse_config(yaml.safe_dump({**base, "health": {}})).health.before_work_max_age == 300


def plane_with(tmp_path: Path, checks: list[dict], remediation: dict | None = None) -> Plane:
    doc = yaml.safe_load(TWO_TEAMS.read_text())
    doc["health"] = {"interval": "0.3s", "checks": checks, **({"remediation": remediation} if remediation else {})}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return Plane(tmp_path / "yard", config=path)


def move_off_and_back(p: Plane, inject, clear, reason_word: str) -> None:  # noqa: ANN001
    j = p.submit(command=WORK, gpus=2, team="vision")
    first = p.wait(j["id"], "RUNNING")
    node = first["placement"][0]["node"]
    other = "node-1" if node == "node-0" else "node-0"
    ck = job_dir(p.cp.data_dir, j["id"]) / "checkpoints"
    wait_until(lambda: (ck / "step-5" / "COMMITTED").exists())
    inject(node)
    wait_until(lambda: node_info(p, node)["state"] == "down")
    assert reason_word in node_info(p, node)["reason"], node_info(p, node)
    again = p.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=30)
    assert {q["node"] for q in again["placement"]} == {other}
    log = (job_dir(p.cp.data_dir, j["id"]) / "logs" / "rank-0.log").read_text()
    assert "attempt 2 starts at step 0" not in log  # resumed from its checkpoint
    clear(node)
    wait_until(lambda: node_info(p, node)["state"] == "up")
    kinds = [e["kind"] for e in p.admin.get("/api/v1/events", params={"limit": 1000}).json()["events"]]
    assert "node.check_critical" in kinds and "node.down" in kinds and "node.up" in kinds
    assert p.wait(j["id"], "COMPLETED", timeout=60)["attempts"][0]["cause"] == "node_lost"


def test_an_ecc_error_drains_the_node_its_job_resumes_elsewhere_and_the_node_returns(tmp_path):
    p = plane_with(tmp_path, [{"name": "ecc", "command": ECC_CHECK, "timeout": "10s"}])
    try:
        data = p.cp.data_dir
        move_off_and_back(p, lambda n: (data / f"ecc-{n}").write_text("GPU 2: 3 uncorrectable ECC errors"),
                          lambda n: (data / f"ecc-{n}").unlink(), "ECC")
    finally:
        p.stop()


@pytest.fixture
def tiny_disks(tmp_path):
    mounts = []
    base = tmp_path / "yard" / "disks"
    for n in ("node-0", "node-1"):
        d = base / n
        d.mkdir(parents=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)], capture_output=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
        mounts.append(d)
    yield base
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_full_checkpoint_disk_drains_the_node_until_space_is_back(tmp_path, tiny_disks):
    p = plane_with(tmp_path, [{"name": "ckpt-disk", "kind": "disk", "paths": ["{data_dir}/disks/{node}"],
                               "warn_free_gb": 0.003, "critical_free_gb": 0.001}])
    fill = f"ballast-{uuid.uuid4().hex[:6]}"
    try:
        move_off_and_back(p, lambda n: (tiny_disks / n / fill).write_bytes(b"\0" * (int(3.5 * 2**20))),
                          lambda n: (tiny_disks / n / fill).unlink(), "GB free")
    finally:
        p.stop()


WARN_CHECK = [sys.executable, "-c",
              "import os, sys; p = os.path.join(os.environ['TRAINYARD_DATA_DIR'], 'warn-' + os.environ['TRAINYARD_NODE']);"
              "e = os.path.exists(p); print('fan slow' if e else 'fine'); sys.exit(1 if e else 0)"]
REBOOT = [sys.executable, "-c",  # the emulated reboot clears the node's ECC error
          "import os; p = os.path.join(os.environ['TRAINYARD_DATA_DIR'], 'ecc-' + os.environ['TRAINYARD_NODE']);"
          "os.path.exists(p) and os.remove(p); print('rebooted', os.environ['TRAINYARD_NODE'])"]
NOTHING = [sys.executable, "-c", "print('tried')"]


def kinds_for(p: Plane, node: str) -> list[str]:
    evs = p.admin.get("/api/v1/events", params={"limit": 2000}).json()["events"]
    return [e["kind"] for e in evs if e.get("node") == node]


def test_a_warning_makes_the_node_suspect_no_new_work_lands_there_then_it_returns(tmp_path):
    p = plane_with(tmp_path, [{"name": "fans", "command": WARN_CHECK}])
    try:
        (p.cp.data_dir / "warn-node-0").write_text("")
        wait_until(lambda: node_info(p, "node-0")["state"] == "suspect")
        assert "fan slow" in node_info(p, "node-0")["reason"]
        j = p.submit(command=WORK, gpus=2, team="vision")
        assert {q["node"] for q in p.wait(j["id"], "RUNNING")["placement"]} == {"node-1"}
        (p.cp.data_dir / "warn-node-0").unlink()
        wait_until(lambda: node_info(p, "node-0")["state"] == "up")
        assert kinds_for(p, "node-0")[-3:] == ["node.suspect", "node.check_ok", "node.up"]
    finally:
        p.stop()


def test_remediation_repairs_a_node_its_check_took_down(tmp_path):
    p = plane_with(tmp_path, [{"name": "ecc", "command": ECC_CHECK}],
                   {"actions": [{"name": "reboot", "command": REBOOT, "timeout": "20s"}], "cooldown": "1s",
                    "max_attempts": 2})
    try:
        j = p.submit(command=WORK, gpus=2, team="vision")
        node = p.wait(j["id"], "RUNNING")["placement"][0]["node"]
        (p.cp.data_dir / f"ecc-{node}").write_text("GPU 0: 1 uncorrectable ECC error")
        p.wait(j["id"], lambda x: x["state"] == "RUNNING" and x["attempt"] == 2, timeout=30)
        wait_until(lambda: "node.up" in kinds_for(p, node), timeout=30)
        ks = [k for k in kinds_for(p, node) if k.startswith("node.") and not k.startswith("node.check")]
        assert ks == ["node.down", "node.remediating", "node.remediated", "node.up"], ks
        assert node_info(p, node)["state"] == "up"
    finally:
        p.stop()


def test_remediation_that_does_not_help_ends_in_an_alert_and_the_node_stays_down(tmp_path):
    p = plane_with(tmp_path, [{"name": "ecc", "command": ECC_CHECK}],
                   {"actions": [{"name": "reset-gpu", "command": NOTHING}], "cooldown": "0.5s", "max_attempts": 2})
    try:
        (p.cp.data_dir / "ecc-node-1").write_text("GPU 3: 9 uncorrectable ECC errors")
        wait_until(lambda: "node.alert" in kinds_for(p, "node-1"), timeout=40)
        ks = [k for k in kinds_for(p, "node-1") if k in ("node.remediating", "node.remediated", "node.alert")]
        assert ks == ["node.remediating", "node.remediated", "node.remediating", "node.remediated", "node.alert"], ks
        st = node_info(p, "node-1")
        assert st["state"] == "down" and "needs a person" in st["reason"]
    finally:
        p.stop()
