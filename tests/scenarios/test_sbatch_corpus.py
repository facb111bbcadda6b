"""A corpus of batch scripts as users publish them (tests/fixtures/sbatch_corpus/) runs unchanged
through a real `yard up`, on the local backend and on the real Slurm test cluster, with the same
observable results on both: every script's end state and exit code, the `RESULT key=value` lines it
prints (from the batch shell and from the tasks its `srun` starts) and the files it writes.

The user here is a team member (a member token of team vision, as `root`) with a virtualenv on
PATH, submitting from the corpus directory (`yard submit job.sbatch`, as `sbatch job.sbatch`), so
`python`, `torchrun` and `accelerate` come from the submitter's PATH through `--export=ALL`. Both
clusters name their nodes after this machine: its host name (which resolves) and that name with
`-2`: the head node of a rendezvous must resolve (docs/control-plane.md), Slurm reads
`NodeName=localhost` as the host itself, and both backends put an allocation's nodes in Slurm's
order (by name), where the host name comes first; the second node's name nobody resolves. Every script is submitted at once and the
cluster runs them as it fits them, so one test per backend checks them all and reports every
mismatch together.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.plane import YARD
from tests.yard_cluster import YardCluster
from trainyard.contracts import compress_hostlist
from trainyard.ports import free_port
from tests.scenarios.host_nodes import HEAD, NODES

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "sbatch_corpus"


CONFIG = textwrap.dedent(f"""\
    cluster:
      name: corpus
      nodes:
        - {{name: {NODES[0]}, gpus: 4, gpu_model: a100, features: [ib, nvme], gpu_mem_gb: 16, block: b0, rack: r0}}
        - {{name: {NODES[1]}, gpus: 4, gpu_model: a100, features: [nvme], gpu_mem_gb: 16, block: b0, rack: r0}}
    teams:
      - name: vision
        cohort: lab
        quotas:
          default: {{nominal: 8, borrowing_limit: 0}}
      - name: nlp
        cohort: lab
        quotas:
          default: {{nominal: 0, borrowing_limit: 8}}
    classes:
      - {{name: training, priority: 200, preemptible: true, max_wait: 24h, min_run_time: 0, grace_period: 10}}
    default_class: training
    """)
PATIENCE_S = 900  # 15 scripts of which 7 start torch, Lightning or accelerate, on two cores


@dataclass
class Expect:
    """What a script must show on every backend."""

    results: list[str] = field(default_factory=list)  # its RESULT lines, in any order
    state: str = "COMPLETED"
    exit_code: int = 0
    files: Callable[[Path, dict], list[str]] | None = None  # (corpus dir, job) → what is wrong


def _array_files(work: Path, job: dict) -> list[str]:
    a = job["id"]
    lrs = ["0.1", "0.03", "0.01", "0.003"]
    wrong = []
    for t, lr in enumerate(lrs):
        out, value = work / f"sweep_{a}_{t}.out", work / f"lr_{a}_{t}.txt"
        want = f"task {t} of 4 (0-3 step 1) lr {lr}"
        if not out.exists() or want not in out.read_text():
            wrong.append(f"{out.name}: want {want!r}, got {out.read_text() if out.exists() else 'no file'!r}")
        if not value.exists() or value.read_text().strip() != lr:
            wrong.append(f"{value.name}: want {lr}, got {value.read_text() if value.exists() else 'no file'!r}")
    return wrong


def _checkpoint_file(work: Path, job: dict) -> list[str]:
    """ckpt_$SLURM_JOB_ID.txt, written by the USR1 handler."""
    found = [f.read_text() for f in work.glob("ckpt_*.txt")]
    ok = len(found) == 1 and found[0].startswith("step ")
    return [] if ok else [f"want one ckpt_<id>.txt with 'step N', got {found}"]


def _named_output(work: Path, job: dict) -> list[str]:
    """--output=named-%x-%j.out: the job's name and id in the file's name."""
    found = {f.name: f.read_text() for f in work.glob("named-*.out")}
    ok = len(found) == 1 and re.fullmatch(r"named-named-output-\d+\.out", next(iter(found))) and \
        "hello from named-output" in next(iter(found.values()))
    return [] if ok else [f"want named-named-output-<id>.out saying hello, got {found}"]


EXPECT: dict[str, Expect] = {
    "01_torchrun_multinode": Expect([f"head={NODES[0]} nnodes=2"] + [f"rank{r}=world4:sum10:node{r // 2}" for r in range(4)]),
    "02_srun_procid": Expect([f"task{r}=local{r % 2}:node{r // 2}:of4" for r in range(4)]),
    "03_lightning_multinode": Expect([f"lightning{r}=world2:node{r}:local0" for r in range(2)]),
    "04_accelerate_multinode": Expect([f"accelerate{r}=of4:local{r % 2}" for r in range(4)]),
    "05_array_sweep": Expect(files=_array_files),
    "06_pipeline_stage1": Expect(["prepared=10"]),
    "07_pipeline_stage2": Expect(["sum=55"]),
    "08_signal_checkpoint": Expect(["checkpointed=yes"], files=_checkpoint_file),
    "09_export_none": Expect(["mark=unset job_id_set=yes"]),
    "10_export_list": Expect(["mark=from-the-submitter mode=eval other=unset"]),
    "11_exclude": Expect([f"excluded_node_avoided=yes node={NODES[0]}"]),
    "12_gpu_model": Expect(["gpus_on_node=2"]),
    "13_constraint": Expect([f"node={NODES[0]}"]),
    "14_cpus_mem": Expect(["cpus_per_task=2 mem_per_node=1024", "workers=2"]),
    "15_output_pattern": Expect(files=_named_output),
    "16_exit_code": Expect(["before=yes"], state="FAILED", exit_code=3),
    "17_srun_subsets": Expect(["single=1", "pernode0=2", "pernode1=2"]),
    "18_environment": Expect([
        "name=env-probe nnodes=2 num_nodes=2",
        "ntasks=4 nprocs=4 tasks_per_node=2(x2) ntasks_per_node=2",
        f"nodelist={compress_hostlist(list(NODES))} same_nodelist=yes",
        "gpus_on_node=2 account=vision",
        "jobid_alias=yes submit_dir_is_here=yes",
        "restart_count=0 nodeid=0 procid=0",
    ]),
}
AFTER = {"07_pipeline_stage2": "06_pipeline_stage1"}  # submitted with --dependency=afterok:<that job>
DONE = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def test_the_corpus_is_whole() -> None:
    """Every script has its expectation (and the other way round), and there are at least 15."""
    assert sorted(p.stem for p in CORPUS.glob("*.sbatch")) == sorted(EXPECT)
    assert len(EXPECT) >= 15


@pytest.fixture(params=["local", pytest.param("slurm", marks=pytest.mark.slurm)])
def yc(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[YardCluster]:
    if request.param == "slurm" and HEAD is None:
        pytest.skip(f"the host name {socket.gethostname()!r} does not resolve: Slurm's head node needs a "
                    "name that does (Slurm takes NodeName=localhost for the host itself)")
    config = tmp_path / "corpus.yaml"
    config.write_text(CONFIG)
    c = YardCluster(tmp_path / "cluster", request.param, config_file=config, slurm_nodes=NODES,
                    slurm_options={"features": {NODES[0]: "ib,nvme", NODES[1]: "nvme"}, "gpu_type": "a100"})
    yield c
    c.stop()


def _user_env(yc: YardCluster) -> dict[str, str]:
    """A vision member's shell: its token, a virtualenv first on PATH, two variables of its own."""
    r = yc.http.post("/api/v1/tokens", json={"user": "root", "role": "member", "team": "vision"})
    assert r.status_code == 201, r.text
    env = yc.env()
    env.update(YARD_TOKEN=r.json()["token"], PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
               CORPUS_MARK="from-the-submitter", CORPUS_OTHER="also-from-the-submitter")
    return env


def _submit(env: dict[str, str], work: Path, script: str, *args: str) -> int:
    run_env = dict(env, RDZV_PORT=str(free_port("127.0.0.1")))  # each rendezvous its own port
    r = subprocess.run([YARD, "submit", *args, f"{script}.sbatch"], cwd=work, env=run_env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"yard submit {script}: rc {r.returncode}\n{r.stdout}\n{r.stderr}"
    return int(re.search(r"Submitted (?:batch )?job (\d+)", r.stdout).group(1))


def _results(log: str) -> list[str]:
    """The RESULT words in a log. Ranks share the log, and a print's text and its newline are two
    writes, so under load one rank's line can run into another's ("RESULT aRESULT b"): as on Slurm."""
    return sorted(part.strip() for line in log.splitlines() if "RESULT " in line
                  for part in line.split("RESULT ")[1:])


def test_every_script_runs_unchanged_with_the_same_results(yc: YardCluster, tmp_path: Path) -> None:
    work = tmp_path / "corpus"
    shutil.copytree(CORPUS, work)
    for script in work.glob("*.sbatch"):  # the one name a script cannot know: the second node's
        script.write_text(script.read_text().replace("@SECOND@", NODES[1]))
    os.chmod(work, 0o755)
    env = _user_env(yc)
    ids: dict[str, int] = {}
    for name in sorted(EXPECT):
        after = AFTER.get(name)
        ids[name] = _submit(env, work, name, *([f"--dependency=afterok:{ids[after]}"] if after else []))
    jobs = _wait_all(yc, ids)
    wrong: list[str] = []
    for name, want in sorted(EXPECT.items()):
        job = jobs[name]
        log = yc.yard("logs", str(ids[name]), check=False).stdout
        got = (job["state"], job.get("exit_code") or 0)
        if got != (want.state, want.exit_code):
            wrong.append(f"{name}: {got}, want {(want.state, want.exit_code)} ({job['reason']})")
        if _results(log) != sorted(want.results):
            wrong.append(f"{name}: RESULT lines {_results(log)}, want {sorted(want.results)}")
        if want.files:
            wrong += [f"{name}: {w}" for w in want.files(work, job)]
        if any(w.startswith(name) for w in wrong):
            wrong.append(f"{name}'s log ends:\n{log[-1500:]}")
    if "05_array_sweep" in jobs:
        wrong += _throttle_held(yc, ids["05_array_sweep"], most=2)
    assert not wrong, f"{yc.backend}: " + "\n".join(wrong)


def _wait_all(yc: YardCluster, ids: dict[str, int]) -> dict[str, dict]:
    """Each script's job once all have ended (an array: its first task, with its tasks ended)."""
    deadline = time.monotonic() + PATIENCE_S
    while True:
        jobs = {name: yc.job(i) for name, i in ids.items()}
        tasks = yc.http.get("/api/v1/jobs", params={"array": str(ids["05_array_sweep"])}).json()["jobs"]
        left = [f"{n} {j['state']}" for n, j in jobs.items() if j["state"] not in DONE]
        left += [f"array task {t['array_task_id']} {t['state']}" for t in tasks if t["state"] not in DONE]
        if not left:
            return jobs
        assert time.monotonic() < deadline, f"{yc.backend}: not ended after {PATIENCE_S}s: {left}"
        time.sleep(1)


def _throttle_held(yc: YardCluster, array_id: int, most: int) -> list[str]:
    """`--array=0-3%2`: never more than two tasks running at once (from each task's start and end)."""
    tasks = yc.http.get("/api/v1/jobs", params={"array": str(array_id)}).json()["jobs"]
    spans = sorted((t["start_time"], t["end_time"]) for t in tasks if t.get("start_time"))
    if len(spans) != 4:
        return [f"array: want 4 tasks that ran, got {len(spans)}"]
    worst = max(sum(1 for s, e in spans if s <= t0 < e) for t0, _ in spans)
    return [] if worst <= most else [f"array: {worst} tasks ran at once, want at most {most}"]
