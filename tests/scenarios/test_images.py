"""Issue 37's acceptance, end to end through a real `yard up` (as root) on the local backend's two
emulated nodes, with Debian's `docker-registry` on loopback, images built by the tests
(tests/image_builds.py: mmdebstrap + umoci, one with Python and the pinned CPU PyTorch and
trainyard itself), pulled by skopeo into each node's cache and run by runc as real non-root owners
(tests/accounts.py).

1. A recipe job in the PyTorch image, preempted by an interactive job on its node, checkpoints on
   the notice inside its container, resumes on the other node after the image was pulled there,
   and its losses are those of an uninterrupted run in the same image, bit for bit.
2. Two teams' jobs run at once from two images with different Python packages: each sees its own
   package only, and neither can read the other's image in the cache, nor the plane's files.
3. A tag pushed again with other contents between two attempts: the second attempt runs the digest
   the first one pinned.
4. Bad input: an image no registry has, a registry that does not answer, a registry the team may
   not use, malformed mounts: a clear error each (at submit where it can be known then, a cause of
   its own at launch where not), and the caches consistent after.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import image_builds, image_tools
from tests.accounts import ROOT_ONLY, Accounts, accounts, shared_dir
from tests.backends.helpers import processes_with
from tests.image_registry import Registry
from tests.recipes.helpers import TINY_PRETRAIN
from tests.yard_cluster import YardCluster, losses

pytestmark = [ROOT_ONLY, pytest.mark.slow, pytest.mark.images, pytest.mark.xdist_group("images-scenarios")]

STEPS = 200  # the tiny model trains ~70 steps/s here: long enough to be caught mid-run
EVERY = 20
SETS = [*TINY_PRETRAIN, f"steps={STEPS}", f"checkpoint_every={EVERY}", "watchdog_s=120"]
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")


def _config(acc: Accounts, registry: str) -> str:
    return textwrap.dedent(f"""\
        cluster:
          name: images
          nodes:
            - {{name: node-0, gpus: 4, gpu_model: a100, gpu_mem_gb: 16}}
            - {{name: node-1, gpus: 4, gpu_model: a100, gpu_mem_gb: 16}}
        teams:
          - name: vision
            group: {acc.group("vision")}
            quotas:
              default: {{nominal: 8}}
          - name: speech
            group: {acc.group("speech")}
            quotas:
              default: {{nominal: 8}}
        classes:
          - {{name: training, priority: 100, preemptible: true}}
          - {{name: interactive, priority: 1000}}
        default_class: training
        users:
          vera: {acc.user("vera")}
          sam: {acc.user("sam")}
        images:
          allowed_registries: ["{registry}"]
          teams:
            speech: {{allowed_registries: ["{registry}"]}}
        """)


@dataclass
class World:
    yc: YardCluster
    acc: Accounts
    registry: Registry
    work: dict[str, Path]  # each token user's working directory (its account's own)
    tokens: dict[str, str]

    def submit(self, user: str, body: dict[str, Any]) -> int:
        body = {"workdir": str(self.work[user]), **body}
        r = self.yc.http.post("/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {self.tokens[user]}"})
        assert r.status_code in (200, 201), r.text
        return int(r.json()["id"])

    def post(self, user: str, body: dict[str, Any]) -> Any:
        body = {"workdir": str(self.work[user]), **body}
        return self.yc.http.post("/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {self.tokens[user]}"})

    def ended(self, job: int, timeout: float = 300) -> dict[str, Any]:
        return self.yc.wait(job, lambda j: j["state"] in ENDED, timeout=timeout)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    why = image_tools.unavailable()
    if why:
        pytest.skip(why)
    registry = Registry(tmp_path_factory.mktemp("registry"))
    registry.start()
    try:
        with accounts({"vera": ["vision"], "sam": ["speech"]}, ["vision", "speech"]) as acc, \
                shared_dir("tyimages") as d:
            work = {}
            for user in ("vera", "sam"):
                pw = pwd.getpwnam(acc.user(user))
                w = d / user
                w.mkdir(mode=0o700)
                os.chown(w, pw.pw_uid, pw.pw_gid)
                work[user] = w
            config = d / "images.yaml"
            config.write_text(_config(acc, registry.address))
            yc = YardCluster(d / "cluster", "local", config_file=config)
            try:
                tokens = {}
                for user, team in (("vera", "vision"), ("sam", "speech")):
                    r = yc.http.post("/api/v1/tokens", json={"user": user, "role": "member", "team": team})
                    assert r.status_code == 201, r.text
                    tokens[user] = r.json()["token"]
                yield World(yc, acc, registry, work, tokens)
            finally:
                yc.stop()
    finally:
        registry.stop()


def _recipe(image: str, *shape: str) -> dict[str, Any]:
    args = [x for s in SETS for x in ("--set", s)]
    # two ranks: the interactive job's four GPUs of node-0 need the victim's two
    return {"name": "llama-img", "team": "vision", "gpus_per_node": 2, "nodes": 1,
            "command": ["python3", "-m", "trainyard.recipes", "llama-pretrain", *args],
            "container": {"image": image}, "env": {"OMP_NUM_THREADS": "1"}}


def _events(w: World, job: int) -> list[dict[str, Any]]:
    return w.yc.http.get("/api/v1/events", params={"job": job, "limit": 500}).json()["events"]


def test_a_recipe_in_its_image_is_preempted_and_resumes_on_the_other_node_bit_for_bit(world: World):
    w = world
    torch_image = image_builds.torch()
    torch_image.push(w.registry.address, "vision/torch:1")
    digest = torch_image.digest()
    image = f"{w.registry.address}/vision/torch:1"
    # the reference: the same recipe in the same image, uninterrupted
    ref_job = w.submit("vera", {**_recipe(image), "nodelist": "node-0"})
    j = w.ended(ref_job, timeout=600)
    assert j["state"] == "COMPLETED", (j["state"], j["reason"])
    assert j["image_digest"] == digest
    reference = losses(w.yc.job_dir(ref_job))
    assert sorted(reference) == list(range(1, STEPS + 1))
    owner_uid = pwd.getpwnam(w.acc.user("vera")).pw_uid
    assert all(p.stat().st_uid == owner_uid for p in (w.yc.job_dir(ref_job) / "checkpoints").glob("step-*"))

    # the victim, placed on node-0 (its image there already) while a blocker holds node-1; an
    # interactive job then needs node-0 itself, and node-1 is free again for the victim's resume
    blocker = w.submit("vera", {"name": "blocker", "team": "vision", "gpus_per_node": 4, "nodes": 1,
                                "nodelist": "node-1", "command": ["/bin/sleep", "600"]})
    w.yc.wait(blocker, "RUNNING", timeout=120)
    job = w.submit("vera", _recipe(image))
    w.yc.wait_committed(job, EVERY, timeout=300)
    assert {p["node"] for p in w.yc.job(job)["placement"]} == {"node-0"}
    w.yc.yard("cancel", str(blocker))
    # The victim trains its remaining steps in seconds; the notice takes a few loop passes. So, as
    # the Slurm scenario does, its ranks are frozen (SIGSTOP: in the container, host pids) until the
    # plane has sent the notice; they take it at their next step boundary, as a busy job would.
    frozen = processes_with(TRAINYARD_JOB_ID=job, TRAINYARD_ATTEMPT=1)
    assert frozen, "no process of the victim found"
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        urgent = w.submit("vera", {"name": "urgent", "team": "vision", "class": "interactive", "gpus_per_node": 4,
                                   "nodes": 1, "nodelist": "node-0", "command": ["/bin/sleep", "20"]})
        deadline = time.monotonic() + 30
        while not any("SIGUSR1" in e.get("message", "") for e in _events(w, job)):
            assert time.monotonic() < deadline, _events(w, job)
            time.sleep(0.1)
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    j = w.ended(job, timeout=600)
    assert j["state"] == "COMPLETED", (j["state"], j["reason"])
    assert j["attempts"][0]["state"] == "PREEMPTED" and len(j["attempts"]) >= 2, j["attempts"]
    second = j["attempts"][1]
    assert {p["node"] for p in second["placement"]} == {"node-1"}, second
    assert all(a["image_digest"] == digest for a in j["attempts"]), j["attempts"]
    assert losses(w.yc.job_dir(job)) == reference  # bit for bit
    log = (w.yc.job_dir(job) / "logs" / "rank-0.log").read_text()
    assert EVERY <= int(log.split("resumed from step ")[1].split()[0]) < STEPS, log[-2000:]
    kinds = [(e["kind"], e.get("message", "")) for e in _events(w, job)]
    assert any(k == "job.image_ready" and "node-1" in m for k, m in kinds), kinds
    w.ended(urgent)


def test_two_teams_images_hold_their_own_packages_and_nothing_else(world: World):
    w = world
    base = image_builds.python()
    image_builds.team_package(base, "vision_pkg").push(w.registry.address, "vision/env:1")
    image_builds.team_package(base, "speech_pkg").push(w.registry.address, "speech/env:1")
    data_dir = w.yc.data_dir
    probe = textwrap.dedent(f"""\
        import importlib, os, sys
        def can(p):
            try:
                os.listdir(p) if os.path.isdir(p) else open(p, "rb").read(1)
                return "yes"
            except OSError as e:
                return type(e).__name__
        for pkg in ("vision_pkg", "speech_pkg"):
            try:
                importlib.import_module(pkg); print(pkg, "yes")
            except ImportError:
                print(pkg, "no")
        print("cache", can("{data_dir}/images"))
        print("token", can("{data_dir}/admin.token"))
        print("uid", os.getuid())
        import time; time.sleep(3)
        """)
    jobs = {}
    for user, team in (("vera", "vision"), ("sam", "speech")):
        jobs[user] = w.submit(user, {"name": f"{team}-env", "team": team, "gpus_per_node": 1, "nodes": 1,
                                     "command": ["python3", "-c", probe],
                                     "container": {"image": f"{w.registry.address}/{team}/env:1"}})
    # both at once: each started before the other ended
    runs = {u: w.ended(j) for u, j in jobs.items()}
    for user, mine, theirs in (("vera", "vision_pkg", "speech_pkg"), ("sam", "speech_pkg", "vision_pkg")):
        j = runs[user]
        assert j["state"] == "COMPLETED", (j["state"], j["reason"])
        out = (w.yc.job_dir(jobs[user]) / "logs" / "rank-0.log").read_text()
        assert f"{mine} yes" in out and f"{theirs} no" in out, out
        assert "cache yes" not in out and "token yes" not in out, out
        assert f"uid {pwd.getpwnam(w.acc.user(user)).pw_uid}" in out, out
    a, b = runs["vera"], runs["sam"]
    assert a["start_time"] < b["end_time"] and b["start_time"] < a["end_time"], "the two ran one after the other"
    # from the host, as the owners: the nodes' caches are closed to them
    for user in ("vera", "sam"):
        r = subprocess.run(["runuser", "-u", w.acc.user(user), "--", "ls", str(data_dir / "images")],
                           capture_output=True, text=True)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (r.stdout, r.stderr)


def test_a_tag_pushed_again_between_attempts_changes_nothing(world: World):
    w = world
    tiny = image_builds.tiny()
    one = image_builds.variant(tiny, "marker-one", {"marker": "one\n"})
    two = image_builds.variant(tiny, "marker-two", {"marker": "two\n"})
    one.push(w.registry.address, "vision/moving:latest")
    first = one.digest()
    job = w.submit("vera", {"name": "moving", "team": "vision", "gpus_per_node": 1, "nodes": 1,
                            "command": ["/bin/sh", "-c", 'cat /marker; [ "$TRAINYARD_ATTEMPT" = 1 ] && sleep 600; exit 0'],
                            "container": {"image": f"{w.registry.address}/vision/moving"}})
    w.yc.wait(job, lambda j: j["state"] == "RUNNING", timeout=120)
    two.push(w.registry.address, "vision/moving:latest")
    assert two.digest() != first
    w.yc.yard("requeue", str(job))
    j = w.ended(job, timeout=180)
    assert j["state"] == "COMPLETED", (j["state"], j["reason"])
    assert j["image_digest"] == first and [a["image_digest"] for a in j["attempts"]] == [first, first]
    log = (w.yc.job_dir(job) / "logs" / "rank-0.log").read_text()
    assert log.count("one") == 2 and "two" not in log, log
    show = w.yc.yard("show", str(job)).stdout
    assert first in show, show


def test_bad_images_get_clear_errors_and_leave_the_caches_consistent(world: World):
    w = world
    base = {"team": "vision", "gpus_per_node": 1, "nodes": 1, "command": ["/bin/true"]}
    # a registry the team may not use: refused at submit, naming the rule; nothing stored
    r = w.post("vera", {**base, "name": "elsewhere", "container": {"image": "ghcr.io/someone/img:1"}})
    assert r.status_code in (403, 422) and "allowed_registries" in r.text, r.text
    # malformed mounts: refused at submit, naming the option
    r = w.post("vera", {**base, "name": "mounts", "container": {"image": f"{w.registry.address}/vision/env:1",
                                                                 "mounts": "data:/data"}})
    assert r.status_code == 422 and "container.mounts" in r.text and "absolute path" in r.text, r.text
    # an image the registry does not have: the attempt fails with a cause of its own (the user's)
    job = w.submit("vera", {**base, "name": "unknown", "container": {"image": f"{w.registry.address}/vision/nope:1"}})
    j = w.ended(job)
    assert j["state"] == "FAILED" and j["reason"].startswith("ImagePullError"), (j["state"], j["reason"])
    assert "vision/nope" in j["reason"]
    # a registry that does not answer (allowed, but down): back in the queue, the registry's fault
    cfg_registry = w.registry.address
    w.registry.stop()
    try:
        job = w.submit("vera", {**base, "name": "down", "container": {"image": f"{cfg_registry}/vision/env:2"}})
        j = w.yc.wait(job, lambda j: j["reason"].startswith("ImagePullError") and j["state"] in ("REQUEUED", "PENDING"),
                      timeout=120)
        assert j["attempts"][0]["state"] == "REQUEUED", j["attempts"]
        w.yc.yard("cancel", str(job))
    finally:
        w.registry.start()
    # the caches: only whole images, no temporary leftovers
    ls = w.yc.yard("image", "ls").stdout
    assert "nope" not in ls
    for node in ("node-0", "node-1"):
        root = w.yc.data_dir / "images" / node
        staging = root / "tmp"  # where pulls and unpacks happen before their rename into place
        assert not staging.exists() or list(staging.iterdir()) == [], list(staging.iterdir())


def test_a_batch_script_runs_in_its_image_and_its_srun_steps_too(world: World):
    """`#SBATCH --container-image` as a pyxis site writes it: the script runs in the image, and a
    `srun` line that repeats the job's image (in enroot's form) starts its tasks there; one that
    asks for another image is refused, naming it."""
    w = world
    image_builds.team_package(image_builds.python(), "vision_pkg").push(w.registry.address, "vision/env:1")
    enroot = w.registry.address + "#vision/env:1"
    script = textwrap.dedent(f"""\
        #!/bin/sh
        #SBATCH --container-image={w.registry.address}/vision/env:1
        python3 -c 'import vision_pkg; print("script in image")'
        srun -n 2 --container-image={enroot} python3 -c 'import os, vision_pkg; print("task", os.environ["SLURM_PROCID"], "in image")'
        srun -n 1 --container-image=ubuntu:24.04 true || echo "other image refused"
        """)
    job = w.submit("vera", {"name": "batch-img", "team": "vision", "gpus_per_node": 2, "nodes": 1, "ntasks": 2,
                            "script": script, "container": {"image": f"{w.registry.address}/vision/env:1"}})
    j = w.ended(job)
    log = (w.yc.job_dir(job) / "logs" / "rank-0.log").read_text()
    assert j["state"] == "COMPLETED", (j["state"], j["reason"], log[-2000:])
    assert "script in image" in log and "task 0 in image" in log and "task 1 in image" in log, log
    assert "the job's image is" in log and "other image refused" in log, log


def test_an_admin_prestages_an_image_and_a_job_there_pulls_nothing(world: World):
    w = world
    staged = image_builds.variant(image_builds.tiny(), "staged", {"staged": "yes\n"})
    staged.push(w.registry.address, "vision/staged:1")
    image = f"{w.registry.address}/vision/staged:1"
    out = w.yc.yard("image", "pull", image, "--nodes", "node-1").stdout
    assert "node-1" in out, out
    ls1, ls0 = (w.yc.yard("image", "ls", "--node", n).stdout for n in ("node-1", "node-0"))
    assert "vision/staged" in ls1 and staged.digest()[:19] in ls1, ls1
    assert "vision/staged" not in ls0, ls0
    blobs = w.registry.requests("/vision/staged/blobs/")
    job = w.submit("vera", {"name": "staged", "team": "vision", "gpus_per_node": 1, "nodes": 1, "nodelist": "node-1",
                            "command": ["/bin/cat", "/staged"], "container": {"image": image}})
    assert w.ended(job)["state"] == "COMPLETED"
    assert w.registry.requests("/vision/staged/blobs/") == blobs  # pre-staged: no layer fetched again
    assert "yes" in (w.yc.job_dir(job) / "logs" / "rank-0.log").read_text()
    # removed from node-1's cache; nothing in use keeps it
    w.yc.yard("image", "rm", image, "--node", "node-1")
    assert "vision/staged" not in w.yc.yard("image", "ls", "--node", "node-1").stdout
