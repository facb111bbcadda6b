"""Issue 41's acceptance line as a user runs it: a recipe trains on a catalogue dataset.

A real `yard up` (local backend, two emulated nodes), a jsonl corpus in a real SeaweedFS S3 server on
loopback (tests/staging/seaweed.py), the dataset added with `yard dataset add corpus --version v1
--source s3://…` (the plane reads it through the configuration's object store and pins its
checksum), then `yard submit --recipe llama-pretrain -N 2 --gpus-per-node 1 --dataset corpus:v1
--set 'data.path=$TRAINYARD_DATASET_CORPUS'`: a two-node recipe job, one rank per node, each rank
reading its own node's copy (recipes/data_sources.local_path).

- the first job stages the corpus on both nodes and trains on it (its token cache records the
  variable, not a node's path; its recipe.yaml keeps the variable);
- a second job on the same nodes stages nothing (the figures: staging time per node, the cached start);
- a run requeued after a checkpoint resumes on the cached copies with the same token cache, and
  its losses are the uninterrupted run's, step for step;
- a node whose cache was emptied stages it again, the other finds it;
- the object replaced in the store (the pinned checksum no longer matches) fails the attempt with
  cause DataStagingError, and no node's cache holds anything half-written.

The jobs run as the plane's own account (root): a recipe needs torch, and this machine's interpreter
is under a directory no other account may enter; a non-root owner reading a staged dataset is
tests/scenarios/test_datasets_yard_up.py's. About a minute (the server's start and five tiny trainings).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.plane import TWO_TEAMS
from tests.recipes.helpers import TINY_PRETRAIN
from tests.yard_cluster import YardCluster, losses

pytest.importorskip("trainyard.staging.source")
seaweed_module = pytest.importorskip("tests.staging.seaweed")
seaweed = seaweed_module.seaweed
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("dataset-recipe-yard-up")]

CORPUS = "".join(json.dumps({"text": f"document {i}: " + "the quick brown fox jumps over the lazy dog " * 2}) + "\n"
                 for i in range(400)).encode()
STEPS = 30
SETS = [*TINY_PRETRAIN, f"steps={STEPS}", "checkpoint_every=5", "data.path=$TRAINYARD_DATASET_CORPUS"]


@pytest.fixture(scope="module")
def world(seaweed, tmp_path_factory) -> Iterator[dict[str, Any]]:  # noqa: F811
    work = tmp_path_factory.mktemp("recipedata")
    url = seaweed.put("corpora/corpus.jsonl", CORPUS)
    creds = work / "s3.cred"
    creds.write_text(f"{seaweed.key}\n{seaweed.secret}\n")
    creds.chmod(0o600)
    config = work / "c.yaml"
    config.write_text(TWO_TEAMS.read_text() + f"""
storage:
  object_stores:
    - {{url: "s3://{seaweed.bucket}", endpoint_url: "{seaweed.endpoint_url}", credentials_file: "{creds}"}}
""")
    c = YardCluster(work, "local", config_file=config)
    try:
        c.yard("dataset", "add", "corpus", "--version", "v1", "--source", url, "-A", "vision")
        yield {"c": c, "s3": seaweed, "url": url}
    finally:
        c.stop()


def _submit(c: YardCluster) -> int:
    return c.submit("--recipe", "llama-pretrain", "-N", "2", "--gpus-per-node", "1", "-A", "vision",
                    "--dataset", "corpus:v1", "--env", "OMP_NUM_THREADS=1",
                    *[x for s in SETS for x in ("--set", s)])


def _events(c: YardCluster, job: int, kind: str) -> list[dict[str, Any]]:
    events = c.http.get("/api/v1/events", params={"job": job, "limit": 1000}).json()["events"]
    return [e for e in events if e["kind"] == kind]


def _staged(c: YardCluster, job: int, label: str) -> dict[str, bool]:
    [e] = _events(c, job, "job.data_staged")
    nodes = e["data"]["nodes"]
    per_node = {n: v["corpus:v1"] for n, v in nodes.items()}
    print(f"FIGURE {label} (job {job}): staged in {e['data']['seconds']:.3f}s; "
          + "; ".join(f"{n}: {'copied' if v['copied'] else 'cached'} {json.dumps(v, sort_keys=True)}"
                      for n, v in sorted(per_node.items())))
    return {n: bool(v["copied"]) for n, v in per_node.items()}


def _first_step_after_submit(c: YardCluster, job: int) -> float:
    """Seconds from the job's submission to its first step's metrics line (rank 0's clock)."""
    first = json.loads((c.job_dir(job) / "metrics" / "metrics.jsonl").read_text().splitlines()[0])
    return float(first["time"]) - float(c.job(job)["submit_time"])


def _cache(c: YardCluster, node: str) -> Path:
    return c.data_dir / "datasets" / node


def _entries(c: YardCluster) -> dict[str, list[str]]:
    return {n: sorted(p.name for p in _cache(c, n).iterdir() if p.name not in ("key", "lock", "locks", "pins"))
            for n in c.nodes if _cache(c, n).is_dir()}


def _remove(entry: Path) -> None:
    for top, _, _ in os.walk(entry):  # entries are read-only to everyone, the plane included
        os.chmod(top, 0o755)
    shutil.rmtree(entry)


def _trained(c: YardCluster, job: int) -> None:
    jd = c.job_dir(job)
    logs = sorted((jd / "logs").glob("rank-*.log"))
    assert len(logs) == 2, logs
    recipe = (jd / "checkpoints" / "recipe.yaml").read_text()
    assert "$TRAINYARD_DATASET_CORPUS" in recipe, recipe  # the run's record: the variable, not a node's copy
    [meta] = list((jd / "checkpoints" / "tokens").glob("*.json"))
    assert json.loads(meta.read_text())["data"] == "$TRAINYARD_DATASET_CORPUS"
    assert (jd / "checkpoints" / f"step-{STEPS}" / "COMMITTED").is_file()


def test_a_two_node_recipe_trains_on_the_dataset_staged_once_per_node(world):
    c: YardCluster = world["c"]
    first = _submit(c)
    c.wait(first, "COMPLETED", timeout=240)
    assert _staged(c, first, "first job, cold") == {"node-0": True, "node-1": True}
    _trained(c, first)
    world["reference"] = losses(c.job_dir(first))
    assert sorted(world["reference"]) == list(range(1, STEPS + 1))
    second = _submit(c)
    c.wait(second, "COMPLETED", timeout=240)
    assert _staged(c, second, "second job, cached") == {"node-0": False, "node-1": False}
    _trained(c, second)
    print(f"FIGURE submit to first step: {_first_step_after_submit(c, first):.2f}s staging on both nodes, "
          f"{_first_step_after_submit(c, second):.2f}s cached (a 46 kB corpus: the ranks' start dominates)")
    keys = {json.loads(next((c.job_dir(j) / "checkpoints" / "tokens").glob("*.json")).read_text())["key"]
            for j in (first, second)}
    assert len(keys) == 1  # the token cache's key is the data's bytes, whichever node's copy was read


def test_a_requeued_run_resumes_exactly_on_the_cached_copies(world):
    """Requeued after a checkpoint, the run's second attempt stages nothing (both nodes have the
    corpus), keeps its token cache (one key: the recipe's variable, not a node's path) and trains
    the very steps an uninterrupted run trains."""
    c: YardCluster = world["c"]
    job = _submit(c)
    c.wait_committed(job, 10, timeout=240)
    c.yard("requeue", str(job))
    j = c.wait(job, "COMPLETED", timeout=240)
    assert [a["state"] for a in j["attempts"]] == ["REQUEUED", "COMPLETED"], j["attempts"]
    staged = _events(c, job, "job.data_staged")
    assert len(staged) == 2 and all(not v["corpus:v1"]["copied"] for e in staged for v in e["data"]["nodes"].values())
    _trained(c, job)
    got, want = losses(c.job_dir(job)), world["reference"]
    assert sorted(got) == sorted(want)
    assert all(abs(got[s] - want[s]) < 1e-5 for s in want), [(s, got[s], want[s]) for s in want if got[s] != want[s]]


def test_an_emptied_node_stages_again(world):
    c: YardCluster = world["c"]
    [entry] = _entries(c)["node-1"]
    _remove(_cache(c, "node-1") / entry)
    job = _submit(c)
    c.wait(job, "COMPLETED", timeout=240)
    assert _staged(c, job, "node-1 emptied") == {"node-0": False, "node-1": True}


def test_a_replaced_object_fails_the_attempt_and_leaves_no_half_copy(world):
    c: YardCluster = world["c"]
    s3 = world["s3"]
    for node, names in _entries(c).items():  # both nodes must copy it again
        for name in names:
            _remove(_cache(c, node) / name)
    s3.put("corpora/corpus.jsonl", CORPUS.replace(b"lazy", b"busy"))  # same size, other bytes
    job = _submit(c)
    j = c.wait(job, lambda j: j["state"] in ("FAILED", "COMPLETED", "CANCELLED"), timeout=240)
    assert j["state"] == "FAILED" and "DataStagingError" in (j["reason"] or ""), j
    [failed] = _events(c, job, "job.failed")
    print(f"FIGURE replaced object: {failed['message']}")
    assert failed["data"]["kind"] == "checksum_mismatch" or "checksum" in failed["message"].lower(), failed
    assert all(not names for names in _entries(c).values()), _entries(c)  # no entry, no .tmp. copy
    leftovers = [p for n in c.nodes if _cache(c, n).is_dir() for p in _cache(c, n).rglob(".tmp.*")]
    assert leftovers == []
    assert not (c.job_dir(job) / "checkpoints" / "tokens").exists()  # no rank read anything
