"""The `dcgm` check (control/health/dcgm.py): the parser on documents shaped as `dcgmi diag -j`
writes them (DCGM 3.x "DCGM GPU Diagnostic" with per-GPU results and nulls between tests; DCGM
4.x "DCGM Diagnostic" with entity results, test summaries and DCGM's error severities), and the
whole path — PATH lookup, argv, time-out, exit code, JSON — with a small fake `dcgmi` put first
on PATH: a real process that prints such a document."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
import yaml

from tests.plane import TWO_TEAMS, Plane, node_info, wait_until
from trainyard.control.health import CRITICAL, OK, WARN, run_check
from trainyard.control.health.dcgm import parse_diag
from trainyard.spec.models import DCGM_TIMEOUTS, CheckSpec, ConfigError, parse_config

DEPLOYMENT = ["Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS-related Blocks",
              "Persistence Mode", "Environmental Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom"]


def v3(**failing: tuple[str, list]) -> dict:
    """A DCGM 3.x document: the deployment tests on GPUs 0-3 (one result for all, nulls between
    tests, as dcgmi 3.1 writes them) and per-GPU hardware tests; `failing` sets a test's
    (status, warnings) on GPU 2."""
    tests: list = []
    for name in DEPLOYMENT:
        st, warns = failing.get(name, ("Pass", []))
        tests += [{"name": name, "results": [{"gpu_ids": "0,1,2,3", "status": st, **({"warnings": warns} if warns else {})}]},
                  None]
    hw = []
    for name in ("GPU Memory", "Diagnostic"):
        st, warns = failing.get(name, ("Pass", []))
        hw.append({"name": name, "results": [
            {"gpu_ids": str(g), "status": st if g == 2 else "Pass", **({"warnings": warns} if warns and g == 2 else {})}
            for g in range(4)]})
    return {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Deployment", "tests": tests},
                                                        {"category": "Hardware", "tests": hw}],
                                    "version": "3.3.5"}}


def v4(status: str = "Pass", warnings: list | None = None, test: str = "memory") -> dict:
    """A DCGM 4.x document: a software test, and `test` with one failing entity (GPU 1)."""
    def result(gpu: int, st: str, w: list | None) -> dict:
        r = {"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu, "status": st}
        return {**r, "warnings": w} if w else r
    return {
        "DCGM Diagnostic": {"test_categories": [
            {"category": "Deployment", "tests": [
                {"name": "software", "results": [result(0, "Pass", None), result(1, "Pass", None)],
                 "test_summary": {"status": "Pass"}}]},
            {"category": "Hardware", "tests": [
                {"name": test, "results": [result(0, "Pass", None), result(1, status, warnings)],
                 "test_summary": {"status": status}}]}]},
        "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                           "entities": [{"entity_id": 0, "device_id": "2330"}, {"entity_id": 1, "device_id": "2330"}]}],
        "metadata": {"version": "4.2.3", "Driver Version Detected": "570.124.06"},
    }


def warning(text: str, severity: int, error_id: int = 30) -> dict:
    return {"warning": text, "error_id": error_id, "error_category": 6, "error_severity": severity}


def test_a_clean_3x_run_passes_nulls_and_all():
    status, msg = parse_diag(json.dumps(v3(), indent=4))
    assert status == OK and msg == "dcgm diagnostics passed (11 tests)"


def test_a_3x_failure_names_the_test_and_the_gpu():
    doc = v3(**{"GPU Memory": ("Fail", ["GPU 2: 1 uncorrectable ECC error in the memory test"])})
    status, msg = parse_diag("Successfully ran diagnostic for group.\n" + json.dumps(doc))  # text before the JSON
    assert status == CRITICAL
    assert msg == "GPU Memory failed (GPU 2: GPU 2: 1 uncorrectable ECC error in the memory test)"


def test_a_3x_warning_is_a_warning():
    status, msg = parse_diag(json.dumps(v3(Inforom=("Warn", [{"warning": "inforom checksum mismatch", "error_id": 9}]))))
    assert status == WARN and msg == "Inforom warned (GPU 0,1,2,3: inforom checksum mismatch)"


def test_4x_results_by_entity_and_dcgm_severity():
    ok = parse_diag(json.dumps(v4()))
    assert ok == (OK, "dcgm diagnostics passed (2 tests)")
    isolate = parse_diag(json.dumps(v4("Fail", [warning("GPU 1 memory test found 12 bad pages", 2)])))
    assert isolate == (CRITICAL, "memory failed (GPU 1: GPU 1 memory test found 12 bad pages)")
    # DCGM rates persistence mode off a CONFIG error (5): worth a look, not worth a reboot
    config = parse_diag(json.dumps(v4("Fail", [warning("Persistence mode for GPU 1 is disabled", 5, 29)],
                                      test="software")))
    assert config == (WARN, "software warned (GPU 1: Persistence mode for GPU 1 is disabled)")
    mixed = v4("Fail", [warning("persistence mode off", 5), warning("PCIe replay rate too high", 6)], test="pcie")
    assert parse_diag(json.dumps(mixed))[0] == CRITICAL
    summary_only = v4()
    summary_only["DCGM Diagnostic"]["test_categories"][1]["tests"][0] = {"name": "pcie", "results": [],
                                                                          "test_summary": {"status": "Fail"}}
    assert parse_diag(json.dumps(summary_only)) == (CRITICAL, "pcie failed")


def test_skipped_tests_pass():
    doc = v4("Skip")
    assert parse_diag(json.dumps(doc))[0] == OK


@pytest.mark.parametrize("text,words", [
    ("Error: unable to establish a connection to the specified host: localhost", "gave no result: Error: unable"),
    ("", "gave no result: no output"),
    (json.dumps({"DCGM Diagnostic": {"runtime_error": "The GPU list is empty"}}), "could not run: The GPU list"),
    (json.dumps({"DCGM GPU Diagnostic": {"version": "4.2.3"}}), "ran no tests"),
    (json.dumps({"something": "else"}), "no diagnostic in its JSON"),
])
def test_no_result_is_a_warning(text, words):
    status, msg = parse_diag(text)
    assert status == WARN and words in msg, msg


# -- the executable path, with a fake dcgmi first on PATH ------------------------------------------

def fake_dcgmi(tmp_path: Path, doc: dict | None, code: int = 0, sleep: float = 0, stderr: str = "") -> Path:
    """A `dcgmi` that records its argv, prints `doc` and exits `code`."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    out = json.dumps(doc, indent=4) if doc is not None else ""
    exe = bindir / "dcgmi"
    exe.write_text(f"#!{sys.executable}\n"
                   "import json, sys, time\n"
                   f"open({str(tmp_path / 'argv.json')!r}, 'w').write(json.dumps(sys.argv[1:]))\n"
                   f"time.sleep({sleep})\n"
                   f"sys.stdout.write({out!r})\n"
                   f"sys.stderr.write({stderr!r})\n"
                   f"sys.exit({code})\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return bindir


def test_the_check_runs_dcgmi_diag_at_its_level_and_judges_the_json(tmp_path, monkeypatch):
    doc = v3(Diagnostic=("Fail", [{"warning": "GPU 2 failed the SM stress at 35% of its expected gflops", "error_id": 41}]))
    monkeypatch.setenv("PATH", f"{fake_dcgmi(tmp_path, doc, code=226)}{os.pathsep}{os.environ['PATH']}")
    r = run_check(CheckSpec(name="dcgm", kind="dcgm", level=2), "node-0", tmp_path)
    assert json.loads((tmp_path / "argv.json").read_text()) == ["diag", "-r", "2", "-j"]
    assert r.status == CRITICAL and r.message.startswith("Diagnostic failed (GPU 2: GPU 2 failed the SM stress")
    monkeypatch.setenv("PATH", f"{fake_dcgmi(tmp_path, v4())}{os.pathsep}{os.environ['PATH']}")
    assert run_check(CheckSpec(name="dcgm", kind="dcgm"), "node-0", tmp_path).status == OK
    assert json.loads((tmp_path / "argv.json").read_text()) == ["diag", "-r", "1", "-j"]


def test_dcgmi_without_a_host_engine_and_a_hung_diagnostic(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(fake_dcgmi(tmp_path, None, code=255, stderr="Error: unable to connect to host engine")))
    r = run_check(CheckSpec(name="dcgm", kind="dcgm"), "node-0", tmp_path)
    assert (r.status, r.message) == (WARN, "dcgmi diag -r 1 exited 255: Error: unable to connect to host engine")
    monkeypatch.setenv("PATH", str(fake_dcgmi(tmp_path, v4(), sleep=5)))
    r = run_check(CheckSpec(name="dcgm", kind="dcgm", timeout=0.5), "node-0", tmp_path)
    assert (r.status, r.message) == (CRITICAL, "dcgmi diag -r 1 timed out after 0.5s")


def test_without_dcgmi_the_check_says_so_and_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no dcgmi there
    r = run_check(CheckSpec(name="dcgm", kind="dcgm"), "node-0", tmp_path)
    assert (r.status, r.message) == (OK, "dcgmi not installed (skipped)")


def test_the_level_sets_the_default_timeout_and_bad_levels_name_the_field():
    assert CheckSpec(name="d", kind="dcgm", level=3).timeout == DCGM_TIMEOUTS[3]
    assert CheckSpec(name="d", kind="dcgm", level=3, timeout="10m").timeout == 600
    doc = yaml.safe_load(TWO_TEAMS.read_text())
    doc["health"] = {"checks": [{"name": "d", "kind": "dcgm", "level": 7}]}
    with pytest.raises(ConfigError, match=r"^cluster\.yaml:\d+, field 'health\.checks\.0\.level'"):
        parse_config(yaml.safe_dump(doc), file="cluster.yaml")


def test_a_failing_diagnostic_before_work_keeps_the_job_off_the_node(tmp_path, monkeypatch):
    """Through the control loop, with the diagnostic only in before-work rounds (`when:
    before_work`, the periodic interval an hour): while the fake dcgmi fails (on every node: the
    emulated nodes share this machine), no node takes the job and both go down; once it passes,
    the waiting job gets a node, which was checked again because work waited for it."""
    bad = v3(**{"GPU Memory": ("Fail", ["GPU 2: memory test miscompare"])})
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "dcgmi").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"bad = os.path.exists({str(tmp_path / 'bad')!r})\n"
        f"print(json.dumps({bad!r} if bad else {v3()!r}))\nsys.exit(226 if bad else 0)\n")
    (bindir / "dcgmi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    doc = yaml.safe_load(TWO_TEAMS.read_text())
    doc["health"] = {"interval": "1h", "before_work_max_age": "1s",
                     "checks": [{"name": "dcgm", "kind": "dcgm", "when": "before_work"}]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "bad").write_text("")
    p = Plane(tmp_path / "yard", config=tmp_path / "c.yaml")
    try:
        j = p.submit(command=[sys.executable, "-c", "pass"], gpus=2, team="vision")
        wait_until(lambda: node_info(p, "node-0")["state"] == "down" and node_info(p, "node-1")["state"] == "down")
        assert "GPU Memory failed" in node_info(p, "node-0")["reason"]
        assert p.job(j["id"])["state"] == "PENDING"  # every node failed: the job waits
        (tmp_path / "bad").unlink()
        assert p.wait(j["id"], "COMPLETED", timeout=20)["attempts"][0]["state"] == "COMPLETED"
    finally:
        p.stop()
