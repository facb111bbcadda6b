"""sbatch's placement options honoured (issue 17 item 3): -C/--constraint, GPU models
(--gpus=TYPE:N, --gres=gpu:TYPE:N), -w/--nodelist, -x/--exclude, --exclusive and -n/--ntasks.
Real `yard` processes against a real `yard up` whose nodes have models and features: each job
lands only where it asked, and each bad request is exit 2, one line naming the option, nothing
stored."""

from __future__ import annotations

import json
import time

import pytest

from tests.cli.yard_process import job_id_of, stored, yard_process
from tests.plane import TWO_TEAMS

NODES = """\
    - {name: node-0, gpus: 2, gpu_model: a100, gpu_mem_gb: 16, block: b0, rack: r0, features: [ib]}
    - {name: node-1, gpus: 2, gpu_model: a100, gpu_mem_gb: 16, block: b0, rack: r0}
    - {name: node-2, gpus: 2, gpu_model: h100, gpu_mem_gb: 16, block: b0, rack: r0, features: [ib, nvme]}
"""


# One worker for this module's tests under `make test`'s --dist loadgroup: its module-scoped
# yard up starts once, not once per worker (about 4 s of CPU each).
pytestmark = pytest.mark.xdist_group("cli-placement-options")


@pytest.fixture(scope="module")
def yard(tmp_path_factory):
    text = TWO_TEAMS.read_text()
    old = next(line for line in text.splitlines() if "{name: node, count: 2" in line)
    config = tmp_path_factory.mktemp("placement-cfg") / "cluster.yaml"
    config.write_text(text.replace(old + "\n", NODES))
    yield from yard_process(tmp_path_factory, "placement", config_file=config)


def nodes_of(yard, jid: int, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        j = json.loads(yard("show", str(jid), "--json").stdout)
        if j["placement"]:
            return j
        assert time.monotonic() < deadline, j
        time.sleep(0.2)


def run_on(yard, *args: str) -> tuple[dict, set[str]]:
    p = yard("submit", "-A", "nlp", "--export=NONE", *args, "--", "sleep", "30")
    assert "warning" not in p.stderr, p.stderr
    j = nodes_of(yard, job_id_of(p))
    yard("cancel", str(j["id"]))
    return j, {part["node"] for part in j["placement"]}


@pytest.mark.parametrize("args, allowed", [
    (("-C", "nvme"), {"node-2"}),
    (("--constraint=ib", "-G", "2"), {"node-0", "node-2"}),
    (("-C", "(nvme|ib)&ib"), {"node-0", "node-2"}),
    (("--gpus=h100:1",), {"node-2"}),
    (("--gpus-per-node=a100:2",), {"node-0", "node-1"}),
    (("-x", "node-[0-1]"), {"node-2"}),
    (("-w", "node-1"), {"node-1"}),
])
def test_a_job_lands_only_where_its_options_allow(yard, args, allowed):
    j, got = run_on(yard, *args)
    assert got and got <= allowed, (args, j["placement"])


def test_gres_with_a_model_in_a_batch_script(yard, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH -A nlp\n#SBATCH --gres=gpu:h100:2\n#SBATCH -C ib\nsleep 30\n")
    p = yard("submit", "--export=NONE", str(script), cwd=tmp_path)
    assert "warning" not in p.stderr, p.stderr
    j = nodes_of(yard, job_id_of(p))
    yard("cancel", str(j["id"]))
    assert [x["node"] for x in j["placement"]] == ["node-2"] and j["gpu_model"] == "h100" and j["constraint"] == "ib"


def test_exclusive_jobs_share_no_node_and_hold_every_gpu(yard):
    a = job_id_of(yard("submit", "-A", "nlp", "--export=NONE", "--exclusive", "-G", "1", "--", "sleep", "30"))
    b = job_id_of(yard("submit", "-A", "nlp", "--export=NONE", "-G", "1", "--", "sleep", "30"))
    ja, jb = nodes_of(yard, a), nodes_of(yard, b)
    for jid in (a, b):
        yard("cancel", str(jid))
    assert len(ja["placement"]) == 1 and len(ja["placement"][0]["gpus"]) == 2 and ja["exclusive"] is True
    assert ja["placement"][0]["node"] != jb["placement"][0]["node"]


def test_ntasks_over_nodes_is_tasks_per_node(yard):
    p = yard("submit", "-A", "nlp", "--export=NONE", "-N", "2", "-n", "4", "--gpus-per-node=2", "-H", "--", "true")
    j = json.loads(yard("show", str(job_id_of(p)), "--json").stdout)
    yard("cancel", str(j["id"]))
    assert (j["tasks_per_node"], j["nodes_min"], j["ntasks"]) == (2, 2, 4)


@pytest.mark.parametrize("args, says", [
    (("--gpus=v100:1",), "--gpus/--gres: no node of pool 'default' has GPU model 'v100'"),
    (("-C", "infiniband"), "-C/--constraint: no node of pool 'default' has feature 'infiniband'"),
    (("-C", "ib&"), "-C/--constraint:"),
    (("-C", "a|b&c"), "mixes & and |"),
    (("-C", "[ib*2]"), "brackets"),
    (("-w", "node-9"), "--nodelist: no node 'node-9'"),
    (("-x", "node-[1-"), "--exclude: "),
    (("-x", "nope"), "--exclude: no node 'nope'"),
    (("-C", "nvme", "-N", "2"), "allow this job"),
    (("-N", "2", "-n", "3"), "-n/--ntasks: 3 tasks do not divide evenly over 2 nodes"),
    (("-N", "1", "-n", "2", "--ntasks-per-node=1"), "-n/--ntasks=2 conflicts with --ntasks-per-node=1"),
    (("--exclusive", "--gpu-mem", "4"), "--exclusive:"),
])
def test_bad_placement_requests_are_refused_naming_the_option(yard, args, says):
    before = [j["id"] for j in stored(yard)]  # ids: other tests' jobs may change state meanwhile
    p = yard("submit", "-A", "nlp", "--export=NONE", *args, "--", "true", ok=False)
    assert p.returncode == 2 and says in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert [j["id"] for j in stored(yard)] == before


@pytest.mark.parametrize("line, says", [
    ("-C ib|", "job.sbatch:3: -C:"),
    ("--nodelist=node-[0", "job.sbatch:3: --nodelist:"),
    ("--gres=gpu:v100:1", "no node of pool 'default' has GPU model 'v100'"),
])
def test_bad_sbatch_lines_are_refused_naming_the_line(yard, tmp_path, line, says):
    before = stored(yard)
    script = tmp_path / "job.sbatch"
    script.write_text(f"#!/bin/bash\n#SBATCH -A nlp\n#SBATCH {line}\ntrue\n")
    p = yard("submit", "--export=NONE", str(script), ok=False, cwd=tmp_path)
    assert p.returncode == 2 and says in p.stderr, p.stderr
    assert stored(yard) == before
