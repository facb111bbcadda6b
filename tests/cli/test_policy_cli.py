"""Policy as configuration through the real CLI: `yard up --policy` (a real `yard up` process) and
`yard sim --config` with a `scheduler:` section (the Typer app in-process, same code)."""

from __future__ import annotations

import json
import subprocess

import yaml
from typer.testing import CliRunner

from tests.plane import TWO_TEAMS, YARD, YardServer
from trainyard.cli.main import app
from trainyard.sched.policy import policy_names
from trainyard.spec.models import EXAMPLE_CONFIG


def test_yard_up_with_an_unknown_policy_exits_2_naming_the_option_and_the_known_ones(tmp_path):
    p = subprocess.run([YARD, "up", "--data-dir", str(tmp_path / "d"), "--port", "0", "--policy", "lottery"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "error: --policy: unknown policy 'lottery'; known: " in p.stderr
    known = p.stderr.split("known: ")[1].strip().split(", ")
    assert sorted(known) == sorted(policy_names())  # (in registration order, which imports decide)
    assert not (tmp_path / "d").exists()  # refused before anything was created


def in_force(c) -> tuple[str, dict]:
    v = c.get("/api/v1/cluster/config").json()
    return (yaml.safe_load(v["text"]).get("scheduler") or {}).get("policy", "trainyard"), v


def test_yard_up_policy_is_stored_as_a_configuration_version(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    server = YardServer(data, config_file=TWO_TEAMS, args=("--policy", "fifo"), identity=False)  # no jobs
    try:
        c = server.start()  # --config FILE --policy fifo: the file, with scheduler.policy set, as one version
        policy, v = in_force(c)
        assert policy == "fifo" and (v["version"], v["author"]) == (1, "yard-up")
        assert v["message"] == "configuration given to yard up, scheduler.policy from yard up --policy fifo"
        assert v["text"] == TWO_TEAMS.read_text() + "scheduler:\n  policy: fifo\n"  # the rest as the file has it
        server.terminate()

        assert in_force(server.start())[1]["version"] == 1  # restarted with the same flags: nothing new
        server.terminate()

        server.args = ()
        c = server.start(config=False)  # no flag: the stored policy stays in force
        assert in_force(c)[0] == "fifo" and in_force(c)[1]["version"] == 1
        server.terminate()

        server.args = ("--policy", "trainyard")
        c = server.start(config=False)
        policy, v = in_force(c)
        assert policy == "trainyard" and v["version"] == 2 and v["message"] == "yard up --policy trainyard"
        diff = c.get("/api/v1/cluster/config/diff", params={"from": 1, "to": 2}).json()["diff"]
        assert "-  policy: fifo\n+  policy: trainyard\n" in diff
        history = [h["message"] for h in c.get("/api/v1/cluster/config/versions").json()["versions"]]
        assert history == ["yard up --policy trainyard",
                           "configuration given to yard up, scheduler.policy from yard up --policy fifo"]
    finally:
        server.terminate()


def test_yard_up_prints_the_policy_in_force(tmp_path):
    """The start line names the policy; `yard up` runs until stopped, so it is stopped once it has said it."""
    proc = subprocess.Popen([YARD, "up", "--data-dir", str(tmp_path / "d"), "--port", "0", "--config", str(TWO_TEAMS),
                             "--policy", "tiresias"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert "policy tiresias, configuration version 1\n" in lines, lines


# -- yard sim --config ----------------------------------------------------------------------------


def sim(tmp_path, name: str, *extra):
    out = tmp_path / name
    r = CliRunner().invoke(app, ["sim", "--format", "synthetic", "--jobs", "60", "--cluster", "2x8", "--seed", "2",
                                 "--out", str(out), *map(str, extra)])
    doc = json.loads((out / "report.json").read_text()) if r.exit_code == 0 else None
    return r, doc


def figures(doc: dict, policy: str) -> dict:
    return {k: v for k, v in doc["policies"][policy].items() if k != "sim_wall_s"}


def test_sim_runs_the_configured_parameters_and_says_so(tmp_path):
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text(EXAMPLE_CONFIG.read_text().replace("    # ordering:  ", "    ordering:  ")
                     .replace("    #   reserve_at: 0.05  ", "      reserve_at: 0     "))
    r, plain = sim(tmp_path, "plain", "--policies", "fifo,trainyard")
    assert r.exit_code == 0, r.stderr
    r, example = sim(tmp_path, "example", "--policies", "fifo,trainyard", "--config", EXAMPLE_CONFIG)
    assert r.exit_code == 0, r.stderr
    r, changed = sim(tmp_path, "tuned", "--policies", "fifo,trainyard", "--config", tuned)
    assert r.exit_code == 0, r.stderr
    # The example's section is the default: the same figures as no section at all.
    assert figures(example, "trainyard") == figures(plain, "trainyard")
    # A parameter that changes decisions changes the report of its policy, and only of its policy.
    assert figures(changed, "trainyard") != figures(plain, "trainyard")
    assert figures(changed, "fifo") == figures(plain, "fifo")
    meta = changed["meta"]
    assert meta["configured_policy"] == "trainyard" and meta["config"] == str(tuned)
    assert meta["params"]["trainyard"]["ordering"]["reserve_at"] == 0
    assert meta["params"]["trainyard"]["backfill"]["max_reservations"] == 4 and meta["params"]["fifo"] == {}
    assert plain["meta"]["params"]["trainyard"]["ordering"]["reserve_at"] == 0.05


def test_sim_says_when_policies_leaves_the_configured_one_out(tmp_path):
    cfg = tmp_path / "slurm.yaml"
    cfg.write_text(EXAMPLE_CONFIG.read_text().replace("  policy: trainyard\n", "  policy: slurm\n"))
    r, doc = sim(tmp_path, "out", "--policies", "fifo", "--config", cfg)
    assert r.exit_code == 0, r.stderr
    assert "--config names policy 'slurm', which --policies leaves out" in r.stderr
    assert list(doc["policies"]) == ["fifo"] and doc["meta"]["configured_policy"] == "slurm"


def test_sim_with_a_bad_section_exits_2_naming_the_field_and_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(EXAMPLE_CONFIG.read_text().replace("    # ordering:  ", "    ordering:  ")
                   .replace("    #   reserve_at: 0.05  ", "      reserve_At: 0     "))
    line = next(i for i, ln in enumerate(cfg.read_text().splitlines(), 1) if "reserve_At" in ln)
    r, _ = sim(tmp_path, "out", "--policies", "trainyard", "--config", cfg)
    assert r.exit_code == 2
    assert f"{cfg}:{line}, field 'scheduler.params.ordering.reserve_At'" in r.stderr
    assert "known: reserve_at" in r.stderr
    assert not (tmp_path / "out").exists()
