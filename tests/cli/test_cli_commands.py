"""The commands end to end on small inputs (they need the simulator and the policies)."""

import json

from typer.testing import CliRunner

from trainyard.cli.main import app


def run(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def test_sim_synthetic_writes_report(tmp_path):
    out = tmp_path / "rep"
    def args(policies):
        return ["sim", "--format", "synthetic", "--jobs", "40", "--cluster", "2x8", "--policies", policies,
                "--estimates", "oracle", "--seed", "2", "--out", out]

    r = run(*args("fifo,trainyard"))
    assert r.exit_code == 0, r.stderr + r.stdout
    doc = json.loads((out / "report.json").read_text())
    assert list(doc["policies"]) == ["fifo", "trainyard"]
    assert doc["meta"]["estimates"] == "oracle" and doc["meta"]["seed"] == 2
    assert {p.name for p in out.iterdir()} == {"report.json", "report.md", "utilization.png", "wait_cdf.png",
                                                "team_share.png"}
    assert "trainyard" in r.stdout
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]  # no temporary folder left behind


def test_install_refreshes_existing_out(tmp_path):
    from trainyard.cli.sim import _install

    out, tmp = tmp_path / "out", tmp_path / ".out.tmp"
    out.mkdir()
    (out / "report.json").write_text("old")
    (out / "mine.txt").write_text("kept")
    tmp.mkdir()
    (tmp / "report.json").write_text("new")
    _install(tmp, out)
    assert (out / "report.json").read_text() == "new" and (out / "mine.txt").read_text() == "kept"
    assert not tmp.exists()


def test_plan_capacity_synthetic_json():
    r = run("plan", "capacity", "--format", "synthetic", "--jobs", "30", "--target-p99-wait", "1d",
            "--gpus-per-node", "8", "--max-nodes", "16", "--json")
    assert r.exit_code == 0, r.stderr + r.stdout
    doc = json.loads(r.stdout)
    assert doc["nodes"] is not None and 1 <= doc["nodes"] <= 16
    ok = {p["nodes"]: p["ok"] for p in doc["probes"]}
    assert ok[doc["nodes"]] and not ok.get(doc["nodes"] - 1, False)


def test_bench_sched_json():
    r = run("bench", "sched", "--nodes", "40", "--pending", "100", "--running", "200", "--cycles", "3",
            "--policy", "fifo", "--json")
    assert r.exit_code == 0, r.stderr + r.stdout
    doc = json.loads(r.stdout)
    assert {"median_ms", "p95_ms", "cycles", "nodes", "pending", "running"} <= set(doc)
    assert doc["running"] == 200 and doc["pending"] == 100 and doc["median_ms"] >= 0
