"""The Slurm-style CLI against a real `yard up` process: what a person types, what they see."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.cli.yard_process import yard_process


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-cluster-cli")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    yield from yard_process(tmp_path_factory)


def wait_state(yard, job_id: int, states: tuple[str, ...], timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = json.loads(yard("show", str(job_id), "--json").stdout)
        if j["state"] in states:
            return j
        assert time.monotonic() < deadline, j
        time.sleep(0.2)


def job_id_of(p: subprocess.CompletedProcess) -> int:
    assert p.stdout.startswith("Submitted job "), p.stdout
    return int(p.stdout.split()[-1])


def test_submit_command_then_queue_show_logs_events(yard):
    jid = job_id_of(yard("submit", "-A", "vision", "--gpus", "2", "-J", "hello", "--",
                         sys.executable, "-c", "import os; print('rank', os.environ['RANK'])"))
    done = wait_state(yard, jid, ("COMPLETED",))
    assert done["name"] == "hello" and done["gpus"] == 2
    assert "rank 1" in yard("logs", str(jid), "--rank", "1").stdout
    assert "rank 0" in yard("logs", str(jid), "-f").stdout  # follow ends when the job has ended
    q = yard("queue", "--all").stdout
    assert "JOBID" in q and "hello" in q and "COMPLETED" in q
    for states in ("all", "cd,R", "COMPLETED"):  # squeue -t: every state, its codes, its names
        assert [j["id"] for j in json.loads(yard("queue", "-t", states, "--json").stdout) if j["id"] == jid] == [jid]
    assert jid not in [j["id"] for j in json.loads(yard("queue", "-t", "PD,R", "--json").stdout)]
    bad = yard("queue", "-t", "PD,DONE", ok=False)
    assert bad.returncode == 2 and "field 'state'" in bad.stderr and "'DONE'" in bad.stderr
    ev = yard("events", str(jid)).stdout
    assert "job.submitted" in ev and "job.started" in ev and "job.completed" in ev
    shown = yard("show", str(jid)).stdout
    assert "COMPLETED" in shown and "ATTEMPT" in shown


def test_a_pipeline_from_the_shell_with_parsable_and_dependency(yard, tmp_path):
    """JOB=$(sbatch --parsable a.sh); sbatch --dependency=afterok:$JOB b.sh — the same here."""
    first = yard("submit", "--parsable", "-A", "nlp", "--", sys.executable, "-c", "import time; time.sleep(1)")
    jid = int(first.stdout.strip())  # the id alone
    script = tmp_path / "stage2.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH -A nlp\n#SBATCH --dependency=afterok:{jid}\necho stage two\n")
    second = job_id_of(yard("submit", str(script), cwd=tmp_path))
    shown = yard("show", str(second)).stdout
    assert f"dependency: afterok:{jid}" in shown
    done = wait_state(yard, second, ("COMPLETED",))
    assert done["start_time"] >= wait_state(yard, jid, ("COMPLETED",))["end_time"]
    bad = yard("submit", "-d", "afterok:nope", "-A", "nlp", "--", "true", ok=False)
    assert bad.returncode == 2 and "dependency" in bad.stderr and "'nope'" in bad.stderr


def test_begin_is_read_in_the_users_time_zone_and_bad_ones_name_the_option_or_line(yard, tmp_path):
    before = time.time()
    jid = job_id_of(yard("submit", "-A", "nlp", "--begin", "now+1hour", "--", "true"))
    j = json.loads(yard("show", str(jid), "--json").stdout)
    assert j["reason"] == "BeginTime" and before + 3600 <= j["begin_time"] <= time.time() + 3600
    assert "begin_time: " in yard("show", str(jid)).stdout
    yard("cancel", str(jid))
    bad = yard("submit", "-A", "nlp", "--begin", "soon", "--", "true", ok=False)
    assert bad.returncode == 2 and "--begin: cannot read 'soon'" in bad.stderr
    script = tmp_path / "late.sh"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp\n#SBATCH --begin=25:00\ntrue\n")
    bad = yard("submit", str(script), ok=False, cwd=tmp_path)
    assert bad.returncode == 2 and "late.sh:3" in bad.stderr and "not a time of day" in bad.stderr


def test_an_array_is_shown_and_cancelled_as_squeue_and_scancel_do(yard, tmp_path):
    script = tmp_path / "sweep.sh"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp -J sweep\n#SBATCH --array=0-3%2\n"
                      "echo lr index $SLURM_ARRAY_TASK_ID; sleep 60\n")
    aid = int(yard("submit", "--parsable", "-H", str(script), cwd=tmp_path).stdout)
    rows = [line.split()[0] for line in yard("queue", "-A", "nlp").stdout.splitlines()[1:]]
    assert [f"{aid}_{i}" for i in range(4)] == [r for r in rows if r.startswith(f"{aid}_")]  # squeue's ARRAY_TASK
    assert "array_task_id: 2" in yard("show", f"{aid}_2").stdout
    assert f"task 2 of array {aid}" in yard("events", f"{aid}_2").stdout
    assert yard("cancel", f"{aid}_1").stdout.startswith(f"job {aid}_1: CANCELLED")  # one task
    assert yard("release", str(aid)).returncode == 0  # the array's id: every task still waiting
    wait_state(yard, aid, ("RUNNING",))
    deadline = time.monotonic() + 120
    while "lr index 0" not in yard("logs", f"{aid}_0").stdout:  # the task's own index, read by its script
        assert time.monotonic() < deadline
        time.sleep(0.2)
    yard("cancel", str(aid))  # the whole array
    states = {t["array_task_id"]: wait_state(yard, t["id"], ("CANCELLED",))["state"]
              for t in json.loads(yard("queue", "-t", "all", "--json").stdout) if t.get("array_job_id") == aid}
    assert states == {0: "CANCELLED", 1: "CANCELLED", 2: "CANCELLED", 3: "CANCELLED"}
    bad = yard("show", f"{aid}_7", ok=False)
    assert bad.returncode == 2 and f"no task 7 in job array {aid}" in bad.stderr
    bad = yard("submit", "--array", "3-1", "-A", "nlp", "--", "true", ok=False)
    assert bad.returncode == 2 and "field 'array'" in bad.stderr


def test_cancel_of_several_acts_on_each_it_can_as_scancel(yard):
    done = job_id_of(yard("submit", "-A", "nlp", "--", "true"))
    wait_state(yard, done, ("COMPLETED",))
    sleepers = [job_id_of(yard("submit", "-A", "nlp", "-H", "--", "sleep", "60")) for _ in range(2)]
    r = yard("cancel", str(done), str(sleepers[0]), "424242", str(sleepers[1]), ok=False)
    assert r.returncode == 2
    assert f"job {done} is already COMPLETED" in r.stderr and "no job 424242" in r.stderr
    for jid in sleepers:  # the refusals before them did not stop the command
        assert wait_state(yard, jid, ("CANCELLED",))["state"] == "CANCELLED"


def test_batch_script_directives_are_honoured(yard, tmp_path):
    script = tmp_path / "train.sh"
    script.write_text("#!/bin/bash\n#SBATCH -N 2\n#SBATCH --gres=gpu:1\n#SBATCH -J scripted --qos=batch\n"
                      "#SBATCH --account=nlp --time=10:00 --output=out-%j-%t.log\n"
                      "srun bash -c 'echo \"rank $RANK of $WORLD_SIZE\"'\n")  # the script runs once; srun: each task
    jid = job_id_of(yard("submit", str(script), cwd=tmp_path))
    j = wait_state(yard, jid, ("COMPLETED",))
    assert (j["name"], j["class"], j["team"], j["nodes_min"], j["gpus_per_node"], j["time_limit_s"]) == \
        ("scripted", "batch", "nlp", 2, 1, 600.0)
    assert (tmp_path / f"out-{jid}-1.log").read_text().strip().endswith("rank 1 of 2")
    # the command line wins over the script
    jid2 = job_id_of(yard("submit", "-J", "override", "--gpus-per-node", "2", str(script), cwd=tmp_path))
    assert wait_state(yard, jid2, ("COMPLETED",))["gpus_per_node"] == 2


@pytest.mark.parametrize("args, words", [
    (["submit", "--gpus", "0", "--", "true"], "gpus"),
    (["submit", "--gpus", "-2", "--", "true"], "gpus"),
    (["submit", "-A", "vision", "--gpus-per-node", "5", "--", "true"], "gpus_per_node"),
    (["submit", "-A", "nobody", "--", "true"], "team"),
    (["submit", "-A", "vision", "--class", "vip", "--", "true"], "class"),
    (["submit", "-A", "vision", "-N", "2-1", "--", "true"], "nodes"),
    (["submit", "--", "true"], "team"),
    (["submit", "missing.sh"], "missing.sh"),
    (["submit"], "command"),
    (["show", "99999"], "no job 99999"),
    (["cluster", "apply", "/no/such.yaml"], "/no/such.yaml"),
])
def test_bad_input_exits_2_with_a_message_naming_the_field(yard, args, words):
    before = len(json.loads(yard("queue", "--all", "--json").stdout))
    p = yard(*args, ok=False)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ") and words in p.stderr, p.stderr
    assert len(json.loads(yard("queue", "--all", "--json").stdout)) == before


def test_malformed_sbatch_line_exits_2_naming_the_line(yard, tmp_path):
    script = tmp_path / "bad.sh"
    script.write_text("#!/bin/bash\n#SBATCH --nodes\necho hi\n")
    p = yard("submit", str(script), ok=False)
    assert p.returncode == 2 and f"{script}:2:" in p.stderr


def test_cluster_config_apply_history_diff_rollback(yard, tmp_path):
    cur = yard("cluster", "get").stdout
    assert "vision" in cur
    text = "\n".join(line for line in cur.splitlines() if not line.startswith("# version"))
    changed = tmp_path / "c.yaml"
    changed.write_text(text.replace("nominal: 4, borrowing_limit: 4}", "nominal: 4, borrowing_limit: 2}", 1)
                       if "nominal: 4, borrowing_limit: 4}" in text else text.replace("borrowing_limit: 4", "borrowing_limit: 2", 1))
    applied = json.loads(yard("cluster", "apply", str(changed), "-m", "less borrowing", "--json").stdout)
    v = applied["version"]
    hist = json.loads(yard("cluster", "history", "--json").stdout)
    assert hist[0]["version"] == v and hist[0]["message"] == "less borrowing"
    d = yard("cluster", "diff", str(v - 1), str(v)).stdout
    assert "-" in d and "borrowing_limit: 2" in d
    back = json.loads(yard("cluster", "rollback", str(v - 1), "--json").stdout)
    assert back["version"] == v + 1 and back["text"] == json.loads(yard("cluster", "get", "--json",
                                                                         "--version", str(v - 1)).stdout)["text"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: {nodes: []}\nteams: []\n")
    p = yard("cluster", "apply", str(bad), ok=False)
    assert p.returncode == 2 and "field" in p.stderr


def test_tokens_roles_and_nodes(yard):
    tok = yard("token", "create", "--user", "carol", "--role", "member", "--team", "nlp").stdout.strip()
    who = yard("queue", env_extra={"YARD_TOKEN": tok})
    assert who.returncode == 0
    p = yard("drain", "node-0", env_extra={"YARD_TOKEN": tok}, ok=False)
    assert p.returncode == 2 and "operator" in p.stderr
    assert "drain" in yard("drain", "node-1", "--reason", "maintenance").stdout
    nodes = json.loads(yard("nodes", "--json").stdout)
    assert {n["name"]: n["state"] for n in nodes} == {"node-0": "up", "node-1": "drain"}
    assert "node-1" in yard("nodes").stdout
    yard("resume", "node-1")
    teams = json.loads(yard("teams", "--json").stdout)
    assert {t["name"] for t in teams} == {"vision", "nlp"}
    yard("teams", "set", "nlp", "--nominal", "4", "--borrowing-limit", "3")
    assert json.loads(yard("teams", "--json").stdout)[1]["quotas"]["default"]["borrowing_limit"] == 3


def test_token_list_and_revoke_as_an_admin_types_them(yard):
    tok = yard("token", "create", "--user", "dora", "--role", "viewer").stdout.strip()
    yard("queue", env_extra={"YARD_TOKEN": tok})  # a use, for LAST_USED
    listing = yard("token", "list", "--user", "dora").stdout
    assert listing.split("\n")[0].split() == ["ID", "USER", "ROLE", "TEAM", "JOB", "CREATED", "BY", "LAST_USED",
                                             "STATE"]
    assert "dora" in listing and "viewer" in listing and "never" not in listing and tok not in listing
    tid = json.loads(yard("token", "list", "--user", "dora", "--json").stdout)[0]["id"]
    assert f"revoked token {tid} of dora (viewer)" in yard("token", "revoke", str(tid)).stdout
    p = yard("queue", env_extra={"YARD_TOKEN": tok}, ok=False)
    assert p.returncode == 2 and "revoked" in p.stderr
    assert "revoked" in yard("token", "list", "--user", "dora", "--revoked").stdout
    assert yard("token", "revoke", "--user", "dora").stdout.strip() == "nothing to revoke: already revoked"
    for args, words in ((("token", "revoke"), "not both"), (("token", "revoke", "1", "--user", "x"), "not both"),
                        (("token", "revoke", "--user", "nobody"), "holds no token")):
        p = yard(*args, ok=False)
        assert p.returncode == 2 and words in p.stderr, p.stderr
