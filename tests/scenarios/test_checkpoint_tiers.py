"""Checkpoint tiers on a real `yard up` (local backend, the `llama-pretrain` recipe on 2 ranks), with
a path archive and with a SeaweedFS S3 archive (issue 41, Deliver 3; acceptance):

- a job with 10 checkpoints (every 20 steps of 200) under keep-last-2 + every 5th (`keep_every: 100`)
  archived: the fast tier ends with the 2 newest (180, 200), the archive with step 100 (200 is fast);
  the rest is deleted, one audit event per deletion;
- a resume after `kill -9` of one rank, while the rules run, continues bit for bit (losses equal an
  uninterrupted run's, every step) and loses nothing it needs;
- a resume after the fast tier's copies were deleted fetches the newest archived step back
  (CONFIGURING, CheckpointFetch; an event with what and how long) and continues bit for bit.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

import pytest

from tests.plane import TWO_TEAMS
from tests.recipes.helpers import TINY_PRETRAIN
from tests.services.test_retention_rules import apparent
from tests.staging.seaweed import seaweed_server
from tests.yard_cluster import YardCluster, losses

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("checkpoint_tiers")]

STEPS, EVERY = 200, 20
# blocking periodic saves: at exact multiples of 20 (asynchronous ones start early, by the cadence)
SETS = [*TINY_PRETRAIN, f"steps={STEPS}", f"checkpoint_every={EVERY}", "async_checkpoint=false", "watchdog_s=10"]
RULES = "{keep_last: 2, keep_every: 100}"


def ruled(tiers: dict[int, list[str]], on_disk: list[int]) -> bool:
    """What keep-last-2 + keep_every 100 leave: the 2 newest fast (and nothing else on disk), the
    older multiples of 100 in the archive only. (A resumed attempt's preemption checkpoint
    falls between the 20s.)"""
    steps = sorted(tiers)
    fast, older = steps[-2:], steps[:-2]
    return (all(tiers[s] == ["fast"] for s in fast) and on_disk == fast
            and all(tiers[s] == ["archive"] and s % 100 == 0 for s in older))


def config(tmp: Path, archive: str, stores: str = "") -> Path:
    p = tmp / "tiers.yaml"
    p.write_text(TWO_TEAMS.read_text() + f"""
storage:
{stores}  archive: {{url: "{archive}", interval: 1s}}
  lifecycle:
    checkpoints: {RULES}
""")
    return p


class Cluster(YardCluster):
    archive_files: Callable[[], dict[str, int]]  # every file of the archive tier (path) or object (s3): its bytes

    def submit(self, *args: str) -> int:
        if not args:
            args = ("--recipe", "llama-pretrain", "-G", "2", "-A", "vision", *(x for s in SETS for x in ("--set", s)))
        return super().submit(*args)

    def tiers(self, job: int) -> dict[int, list[str]]:
        r = self.http.get(f"/api/v1/jobs/{job}/checkpoints")
        assert r.status_code == 200, r.text
        return {c["step"]: sorted(c["tiers"]) for c in r.json()["checkpoints"]}

    def settle(self, job: int, want: dict[int, list[str]] | None = None, timeout: float = 60.0) -> dict[int, list[str]]:
        """Until the listing is `want` (default: what the rules leave, `ruled`); the listing."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.tiers(job)
            if (got == want) if want is not None else ruled(got, self.on_disk(job)):
                return got
            assert time.monotonic() < deadline, f"tiers {got} (on disk {self.on_disk(job)}), want {want or 'the rules'}"
            time.sleep(0.2)

    def on_disk(self, job: int) -> list[int]:
        return sorted(int(p.name[5:]) for p in (self.job_dir(job) / "checkpoints").glob("step-*"))

    def events(self, job: int, kind: str) -> list[dict]:
        return [e for e in self.http.get(f"/api/v1/jobs/{job}/events").json()["events"] if e["kind"] == kind]


@pytest.fixture(scope="module", params=["path", "s3"])
def cluster(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"tiers-{request.param}")
    if request.param == "path":
        c = Cluster(tmp, "local", config_file=config(tmp, str(tmp / "archive")))
        c.archive_files = lambda: {str(f.relative_to(tmp / "archive")): f.stat().st_size
                                   for f in (tmp / "archive").rglob("*") if f.is_file()}
        try:
            yield c
        finally:
            c.stop()
        return
    with seaweed_server(tmp / "seaweed") as s3:
        cred = tmp / "s3.cred"
        cred.write_text(f"{s3.key}\n{s3.secret}\n")
        cred.chmod(0o600)
        stores = (f"  object_stores:\n    - {{url: \"s3://{s3.bucket}\", endpoint_url: \"{s3.endpoint_url}\", "
                  f"credentials_file: {cred}}}\n")
        c = Cluster(tmp, "local", config_file=config(tmp, s3.url("ckpt"), stores))
        fs = s3._filesystem()
        c.archive_files = lambda: {k: int(v["size"]) for k, v in fs.find(f"{s3.bucket}/ckpt", detail=True).items()
                                   if v.get("type") != "directory"}
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture(scope="module")
def reference(cluster) -> dict[int, float]:
    job = cluster.submit()
    j = cluster.wait(job, lambda j: j["state"] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"), timeout=300)
    assert j["state"] == "COMPLETED", j
    ref = losses(cluster.job_dir(job))
    assert sorted(ref) == list(range(1, STEPS + 1))
    assert cluster.settle(job) == {100: ["archive"], 180: ["fast"], 200: ["fast"]}
    deleted = cluster.events(job, "checkpoint.deleted")
    assert sorted(e["data"]["step"] for e in deleted) == [20, 40, 60, 80, 120, 140, 160]  # one event each
    assert all(e["data"]["tier"] == "fast" and e["data"]["bytes"] > 0 and e["data"]["rule"] for e in deleted)
    listing = json.loads(cluster.yard("checkpoints", str(job), "--json").stdout)["checkpoints"]
    assert all("loss" in c["metrics"] for c in listing)  # the manifest's metrics, for keep_best
    return ref


def same(cluster: Cluster, job: int, reference: dict[int, float]) -> None:
    got = losses(cluster.job_dir(job))
    assert sorted(got) == sorted(reference)
    diff = {s: (got[s], reference[s]) for s in reference if got[s] != reference[s]}
    assert not diff, f"losses differ at steps {sorted(diff)[:5]}"


def test_a_resume_after_kill_9_of_a_rank_continues_bit_for_bit_while_the_rules_run(cluster, reference):
    job = cluster.submit()
    cluster.wait_committed(job, 60, timeout=300)
    out = cluster.yard("chaos", "kill-rank", "--job", str(job), "--rank", "1").stdout
    assert "killed rank 1" in out
    j = cluster.wait(job, lambda j: j["state"] in ("COMPLETED", "FAILED", "CANCELLED"), timeout=300)
    assert j["state"] == "COMPLETED" and len(j["attempts"]) >= 2, (j["state"], j["reason"], j["attempts"])
    same(cluster, job, reference)
    kept = cluster.settle(job)
    assert max(kept) == STEPS


def test_a_resume_after_the_fast_tier_was_deleted_fetches_from_the_archive(cluster, reference):
    job = cluster.submit()
    cluster.wait_committed(job, 120, timeout=300)
    for node in cluster.nodes:  # nothing new starts: the requeued job waits while its fast tier goes
        assert cluster.http.post(f"/api/v1/nodes/{node}/drain", json={"reason": "test"}).status_code == 200
    assert cluster.http.post(f"/api/v1/jobs/{job}/requeue").status_code == 200
    j = cluster.wait(job, lambda j: j["state"] in ("REQUEUED", "PENDING", "COMPLETED"), timeout=120)
    assert j["state"] != "COMPLETED", "the job finished before the requeue landed"
    kept = cluster.settle(job)
    archived = [s for s in kept if kept[s] == ["archive"]]
    assert archived, f"nothing archived yet: {kept}"
    for p in (cluster.job_dir(job) / "checkpoints").glob("step-*"):  # the fast tier's copies are lost
        shutil.rmtree(p)
    cluster.settle(job, {s: ["archive"] for s in archived})
    for node in cluster.nodes:
        assert cluster.http.post(f"/api/v1/nodes/{node}/resume").status_code == 200
    j = cluster.wait(job, lambda j: j["state"] in ("COMPLETED", "FAILED", "CANCELLED"), timeout=300)
    assert j["state"] == "COMPLETED", (j["state"], j["reason"], j["attempts"])
    fetched = cluster.events(job, "checkpoint.fetched")
    assert [e["data"]["step"] for e in fetched] == [max(archived)] and fetched[0]["data"]["seconds"] >= 0
    same(cluster, job, reference)  # steps 101.. run again from the archived step, bit for bit



def test_yard_storage_and_the_disk_agree_to_the_byte_after_the_rules_ran(cluster, reference):
    """Last of the module: every job has ended and the rules have run. `yard storage --refresh`
    gives the fast tier what a walk of the job dirs gives (`du -sbx` summed), and the archive tier
    what the archive holds (its files, or its objects, byte for byte); the vision team's jobs are
    all there is."""
    listing = cluster.http.get("/api/v1/jobs", params={"limit": 1000}).json()
    ids = [j["id"] for j in (listing["jobs"] if isinstance(listing, dict) else listing)]
    assert ids and all(cluster.job(i)["state"] == "COMPLETED" for i in ids)
    for i in ids:  # the rules have settled for every job
        cluster.settle(i)
    rep = json.loads(cluster.yard("storage", "--refresh", "--json").stdout)
    [vision] = [t for t in rep["teams"] if t["team"] == "vision"]
    jobs = cluster.job_dir(ids[0]).parent
    assert vision["tiers"]["fast"]["apparent_bytes"] == sum(apparent(d) for d in jobs.iterdir() if d.is_dir())
    archived = cluster.archive_files()
    assert archived and vision["tiers"]["archive"]["bytes"] == sum(archived.values()), (vision["tiers"], archived)
