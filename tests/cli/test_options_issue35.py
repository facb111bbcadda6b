"""Issue 35 point 4, options and habits, on a real `yard up` (local backend) with real `yard`
processes: each option honoured (the job runs and prints what it saw) or refused with the reason
and its #SBATCH line (exit 2, nothing stored). The parsing alone: test_sbatch_issue35.py."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.cli.yard_process import job_id_of, stored, yard_process
from tests.plane import TWO_TEAMS

ENV_PROBE = ('echo "GPN=${SLURM_GPUS_PER_NODE:-unset} GPUS=${SLURM_GPUS:-unset} GPT=${SLURM_GPUS_PER_TASK:-unset} '
             'CPT=${SLURM_CPUS_PER_TASK:-unset} MPC=${SLURM_MEM_PER_CPU:-unset} MPN=${SLURM_MEM_PER_NODE:-unset} '
             'NTPN=${SLURM_NTASKS_PER_NODE:-unset} HINT=${SLURM_HINT:-unset} CVD=${CUDA_VISIBLE_DEVICES:-unset}"')


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-options-issue35")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    # GPU models written in capitals (the docs' examples are lowercase); the pool has site aliases;
    # the interactive class's max run time is 8h
    text = TWO_TEAMS.read_text().replace("gpu_model: emulated", "gpu_model: A100")
    text = text.replace("  nodes:\n", "  pools:\n    - {name: default, aliases: [train, gpu]}\n  nodes:\n", 1)
    config = tmp_path_factory.mktemp("issue35-cfg") / "cluster.yaml"
    config.write_text(text)
    yield from yard_process(tmp_path_factory, "issue35", config_file=config)


def finished(yard, jid: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = json.loads(yard("show", str(jid), "--json").stdout)
        if j["state"] in ("COMPLETED", "FAILED", "CANCELLED", "OUT_OF_MEMORY"):
            return j
        assert time.monotonic() < deadline, j
        time.sleep(0.2)


def seen(yard, jid: int, rank: int = 0) -> dict[str, str]:
    log = yard("logs", str(jid), "--rank", str(rank)).stdout
    line = next(x for x in log.splitlines() if x.startswith("GPN="))
    return dict(w.split("=", 1) for w in line.split())


def script(tmp_path, *lines: str, body: str = ENV_PROBE):
    p = tmp_path / "job.sh"
    p.write_text("#!/bin/bash\n" + "".join(f"#SBATCH {x}\n" for x in lines) + body + "\n")
    return p


def test_gres_mem_per_cpu_and_wrap_on_the_command_line(yard, tmp_path):
    """--gres=gpu:a100:2 (a lowercase model of the config's A100), --mem-per-cpu with -c, and --wrap:
    the job runs on 2 GPUs with the variables sbatch sets, its output in slurm-<id>.out here."""
    p = yard("submit", "-A", "nlp", "--gres=gpu:a100:2", "--mem-per-cpu=256M", "-c", "2", f"--wrap={ENV_PROBE}",
             cwd=tmp_path)
    j = finished(yard, job_id_of(p))
    assert j["state"] == "COMPLETED", j
    assert (j["gpu_model"], j["gpus_per_node"], j["name"]) == ("A100", 2, "wrap")
    assert j["mem_mib"] == 256 * 2 * 2  # per CPU x 2 CPUs per task x 2 tasks (one per GPU) on the node
    env = seen(yard, j["id"])
    assert (env["GPN"], env["GPUS"], env["CPT"], env["MPC"]) == ("2", "2", "2", "256")
    assert len(env["CVD"].split(",")) == 2
    out = tmp_path / f"slurm-{j['id']}.out"  # sbatch's default, in the submit directory
    assert out.exists() and "GPN=2" in out.read_text()
    assert "per CPU (--mem-per-cpu), 1024M per node" in yard("show", str(j["id"])).stdout


def test_gres_none_and_lowercase_gpus_model(yard, tmp_path):
    j = finished(yard, job_id_of(yard("submit", "-A", "nlp", "--gres=none", "--gpus=a100:1", "--", "true")))
    assert (j["state"], j["gpu_model"], j["gpus"]) == ("COMPLETED", "A100", 1)


def test_a_site_template_runs_and_its_options_are_recorded(yard, tmp_path):
    s = script(tmp_path, "--hint=nomultithread", "--distribution=block", "--tmp=10G", "--get-user-env",
               "--threads-per-core=1", "--wckey=abl", "--gres-flags=enforce-binding", "-p train", "-N 1",
               "--gpus-per-node=a100:1")
    j = finished(yard, job_id_of(yard("submit", "-A", "nlp", str(s), cwd=tmp_path)))
    assert (j["state"], j["pool"]) == ("COMPLETED", "default"), j  # -p train: the pool's alias
    assert seen(yard, j["id"])["HINT"] == "nomultithread"
    shown = yard("show", str(j["id"])).stdout
    assert ("Hint=nomultithread Distribution=block GresFlags=enforce-binding MinTmpDiskNode=10240M GetUserEnv=1 "
            "ThreadsPerCore=1 WCKey=abl") in shown


def test_an_unknown_pool_is_refused_with_its_line_and_the_known_names(yard, tmp_path):
    before = len(stored(yard))
    p = yard("submit", "-A", "nlp", str(script(tmp_path, "-N 1", "-p nowhere")), ok=False, cwd=tmp_path)
    assert p.returncode == 2
    assert re.search(r"job\.sh:3: .*unknown pool 'nowhere'; pools are \['default'\] \(aliases \['gpu', 'train'\]\)",
                     p.stderr), p.stderr
    p = yard("submit", "-A", "nlp", "-p", "nowhere", "--", "true", ok=False)
    assert p.returncode == 2 and "unknown pool 'nowhere'" in p.stderr and "job.sh" not in p.stderr
    assert len(stored(yard)) == before


def test_prefixes_on_the_command_line(yard):
    j = json.loads(yard("submit", "-A", "nlp", "--tim=10", "--job-n=pfx", "-H", "--json", "--", "true").stdout)
    assert (j["time_limit_s"], j["name"]) == (600, "pfx")
    yard("cancel", str(j["id"]))
    p = yard("submit", "--mem-per=1G", "--", "true", ok=False)
    assert p.returncode == 2 and "--mem-per is ambiguous: it could be --mem-per-cpu, --mem-per-gpu" in p.stderr


def test_time_limits_over_the_class_are_said_in_slurms_format(yard, tmp_path):
    p = yard("submit", "-A", "nlp", "-q", "interactive", "-t", "3-00:00:00", "--", "true", ok=False)
    assert p.returncode == 2
    assert "-t 3-00:00:00 is over class 'interactive''s limit of 08:00:00" in p.stderr, p.stderr
    p = yard("submit", "-A", "nlp", str(script(tmp_path, "-q interactive", "--time=600")), ok=False, cwd=tmp_path)
    assert p.returncode == 2 and "job.sh:3: " in p.stderr and "-t 600 is over" in p.stderr, p.stderr


def test_gpus_per_task(yard):
    p = yard("submit", "-A", "nlp", "-n", "2", "--gpus-per-task=2", "--", "bash", "-c", ENV_PROBE)
    j = finished(yard, job_id_of(p))
    assert (j["state"], j["gpus"], j["tasks_per_node"]) == ("COMPLETED", 4, 2), j
    for rank in (0, 1):
        env = seen(yard, j["id"], rank)
        assert (env["GPT"], env["GPN"], env["NTPN"]) == ("2", "4", "2")
        assert len(env["CVD"].split(",")) == 2


def test_exclusive_one_node_gets_every_gpu_it_is_charged_for(yard, tmp_path):
    j = finished(yard, job_id_of(yard("submit", "-A", "nlp", "--exclusive", str(script(tmp_path, "-N 1")),
                                      cwd=tmp_path)))
    assert j["state"] == "COMPLETED" and sum(len(p["gpus"]) for p in j["placement"]) == 4, j
    env = seen(yard, j["id"])
    assert env["GPN"] == "4" and len(env["CVD"].split(",")) == 4
    j = finished(yard, job_id_of(yard("submit", "-A", "nlp", "--exclusive", "-N", "1", "--", "bash", "-c",
                                      ENV_PROBE)))
    assert j["state"] == "COMPLETED"
    assert [seen(yard, j["id"], r)["GPN"] for r in range(4)] == ["4"] * 4  # a rank per GPU, as without -n
    j = finished(yard, job_id_of(yard("submit", "-A", "nlp", "--exclusive", "-N", "1", "-n", "2", "--", "bash", "-c",
                                      ENV_PROBE)))
    assert j["state"] == "COMPLETED", j  # 2 tasks share the node's 4 GPUs, though -N 1 alone asks for 1
    assert [len(seen(yard, j["id"], r)["CVD"].split(",")) for r in range(2)] == [2, 2]


def test_queue_me_users_jobs_and_time(yard):
    a = job_id_of(yard("submit", "-A", "nlp", "-H", "--", "true"))
    b = job_id_of(yard("submit", "-A", "nlp", "-H", "--", "true"))
    out = yard("queue", "-j", f"{a},{b}", "-O", "id,state,time", "-h").stdout.split("\n")
    assert [x.split() for x in out if x] == [[str(a), "PENDING", "0:00"], [str(b), "PENDING", "0:00"]]
    me = json.loads(yard("queue", "--me", "--json").stdout)
    assert {a, b} <= {j["id"] for j in me}
    assert yard("queue", "-u", "nobody-here", "-h").stdout.strip() == ""
    yard("cancel", str(a), str(b))
    assert str(a) in yard("queue", "-j", str(a), "-h").stdout  # -j: in any state, as squeue -j


def test_show_states_unclipped_and_version(yard):
    assert re.fullmatch(r"trainyard \d+\.\d+\.\d+\n", yard("--version").stdout)
    j = finished(yard, job_id_of(yard("submit", "-A", "nlp", "--mem=64M", "-c", "1", "--", "true")))
    shown = yard("show", str(j["id"]), env_extra={"COLUMNS": "60"}).stdout
    assert "64M per node (--mem)" in shown and "1 per task (-c)" in shown
    assert re.search(r"^1\s+COMPLETED\s", shown, re.M), shown


def test_share_fairshare_is_sshares(yard):
    rep = json.loads(yard("share", "--json").stdout)
    for t in rep["teams"]:
        assert 0.0 <= t["fairshare"] <= 1.0
        assert t["fairshare"] == pytest.approx(2 ** (-t["norm_usage"] / t["norm_shares"]))
    assert "USAGEFACTOR" in yard("share").stdout


def test_the_default_output_never_refuses_a_script(yard, tmp_path):
    """A regular file named as sbatch's default would be (left by another cluster) is not a reason to
    refuse the job: its link is skipped at launch, the log stays in the job dir."""
    (tmp_path / "slurm-1.out").write_text("from another cluster\n")
    j = finished(yard, job_id_of(yard("submit", "-A", "nlp", str(script(tmp_path, "-N 1")), cwd=tmp_path)))
    assert j["state"] == "COMPLETED" and j["output"] == "slurm-%j.out"
    assert (tmp_path / "slurm-1.out").read_text() == "from another cluster\n"
