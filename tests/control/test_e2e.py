"""End to end with real processes: the control plane, its loop and the local backend together.

What real processes do here: the environment each rank sees, exit codes and signals as the
processes produce them, a cancel that reaches the ranks' children, a job token used from inside a
job, `--output` links. The loop's decisions themselves (retries, stops, preemption, reasons) are
tested on the fake backend with a fake clock (tests/control/loop/test_loop_logic.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.plane import alive, script
from tests.plane import job_dir as dir_of

ENV_DUMP = """
import json, os, sys
keys = ['RANK','LOCAL_RANK','WORLD_SIZE','LOCAL_WORLD_SIZE','MASTER_ADDR','MASTER_PORT','CUDA_VISIBLE_DEVICES',
        'TRAINYARD_JOB_ID','TRAINYARD_ATTEMPT','TRAINYARD_CHECKPOINT_DIR','TRAINYARD_TOKEN','TRAINYARD_NODE']
d = os.environ['TRAINYARD_CHECKPOINT_DIR'] + '/../env-' + os.environ['RANK'] + '.json'
json.dump({k: os.environ.get(k) for k in keys}, open(d, 'w'))
"""


def job_dir(plane, job_id: int) -> Path:
    return dir_of(plane.cp.data_dir, job_id)


def test_two_rank_job_gets_distinct_gpus_and_the_contract_environment(plane):
    j = plane.submit(command=script(ENV_DUMP), gpus=2, team="vision")
    done = plane.wait(j["id"], "COMPLETED")
    envs = [json.loads((job_dir(plane, j["id"]) / f"env-{r}.json").read_text()) for r in (0, 1)]
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert all(e["WORLD_SIZE"] == "2" and e["LOCAL_WORLD_SIZE"] == "2" for e in envs)
    assert {e["LOCAL_RANK"] for e in envs} == {"0", "1"}
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"] == "127.0.0.1"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"] and int(envs[0]["MASTER_PORT"]) > 0
    gpus = [e["CUDA_VISIBLE_DEVICES"] for e in envs]
    assert gpus[0] != gpus[1]
    placed = done["placement"]
    assert len(placed) == 1 and sorted(map(str, placed[0]["gpus"])) == sorted(gpus)
    assert all(e["TRAINYARD_JOB_ID"] == str(j["id"]) and e["TRAINYARD_ATTEMPT"] == "1" for e in envs)
    assert envs[0]["TRAINYARD_CHECKPOINT_DIR"] == str(job_dir(plane, j["id"]) / "checkpoints")
    assert envs[0]["TRAINYARD_TOKEN"].startswith("ty_")  # what it may do: tests/api/test_roles.py


def test_two_node_gang_has_one_rank_per_gpu_across_nodes(plane):
    j = plane.submit(command=script(ENV_DUMP), nodes=2, gpus_per_node=2, team="vision")
    done = plane.wait(j["id"], "COMPLETED")
    assert sorted(p["node"] for p in done["placement"]) == ["node-0", "node-1"]
    envs = [json.loads((job_dir(plane, j["id"]) / f"env-{r}.json").read_text()) for r in range(4)]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert sorted(e["LOCAL_RANK"] for e in envs) == ["0", "0", "1", "1"]
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    by_node: dict[str, set[str]] = {}
    for e in envs:
        by_node.setdefault(e["TRAINYARD_NODE"], set()).add(e["CUDA_VISIBLE_DEVICES"])
    assert all(len(v) == 2 for v in by_node.values())


def test_exit_codes_give_slurm_states(plane):
    ok = plane.submit(command=script("pass"), team="vision")
    bad = plane.submit(command=script("import sys; sys.exit(3)"), team="vision")
    killed = plane.submit(command=script("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"), team="vision")
    oom = plane.submit(command=script("import sys; print('torch.OutOfMemoryError: CUDA out of memory'); sys.exit(1)"),
                       team="vision")
    missing = plane.submit(command=["/no/such/program"], team="vision")
    assert plane.wait(ok["id"], "COMPLETED")["exit_code"] == 0
    f = plane.wait(bad["id"], "FAILED")  # no runtime: told by its exit code, as Slurm does; not retried
    assert f["exit_code"] == 3 and f["reason"] == "NonZeroExitCode 3 on rank 0" and f["retries"] == 0
    assert f["attempts"][0]["cause"] == "exit_code"
    k = plane.wait(killed["id"], "FAILED")
    assert k["signal"] == 11 and k["reason"].startswith("Signal SIGSEGV on rank 0") and len(k["attempts"]) == 1
    o = plane.wait(oom["id"], ("OUT_OF_MEMORY",))
    assert o["reason"].startswith("oom") and o["attempts"][0]["cause"] == "oom" and o["retries"] == 0
    m = plane.wait(missing["id"], ("FAILED",))
    assert m["attempts"][0]["cause"] == "user_error" and "No such file" in m["reason"]


def test_cancel_ends_every_rank_and_their_children(plane):
    body = ("import os, subprocess, time, pathlib\n"
            "p = subprocess.Popen(['sleep', '300'])\n"
            "pathlib.Path(os.environ['TRAINYARD_CHECKPOINT_DIR'], 'pids-' + os.environ['RANK']).write_text("
            "f'{os.getpid()} {p.pid}')\n"
            "time.sleep(300)\n")
    j = plane.submit(command=script(body), nodes=2, gpus_per_node=2, team="vision")
    plane.wait(j["id"], "RUNNING")
    ck = job_dir(plane, j["id"]) / "checkpoints"
    deadline = time.monotonic() + 120
    while len(list(ck.glob("pids-*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(x) for f in ck.glob("pids-*") for x in f.read_text().split()]
    assert len(pids) == 8 and all(alive(p) for p in pids)
    assert plane.admin.post(f"/api/v1/jobs/{j['id']}/cancel").status_code == 200
    c = plane.wait(j["id"], "CANCELLED", timeout=20)
    assert c["end_time"] is not None
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in pids)


def test_runtime_progress_reports_move_the_last_checkpoint(plane):
    body = ("import json, os, time, urllib.request\n"
            "req = urllib.request.Request(f\"http://testserver/api/v1/jobs/{os.environ['TRAINYARD_JOB_ID']}/progress\")\n"
            "open(os.environ['TRAINYARD_CHECKPOINT_DIR'] + '/token', 'w').write(os.environ['TRAINYARD_TOKEN'])\n"
            "time.sleep(30)\n")
    j = plane.submit(command=script(body), team="vision")
    running = plane.wait(j["id"], "RUNNING")
    tok_file = dir_of(plane.cp.data_dir, j["id"]) / "checkpoints" / "token"
    deadline = time.monotonic() + 10
    while not tok_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    job = plane.client(tok_file.read_text())
    t = running["start_time"] + 1.0
    rep = {"attempt": 1, "step": 40, "time": t, "event": "checkpoint", "last_checkpoint_step": 40,
           "last_checkpoint_time": t, "metrics": {"loss": 2.5, "bad": float("nan")}}
    r = job.post(f"/api/v1/jobs/{j['id']}/progress", content=json.dumps(rep).replace("NaN", "null"),
                 headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["accepted"], r.text
    got = plane.job(j["id"])
    assert got["last_checkpoint"] == t and got["progress"]["step"] == 40
    stale = job.post(f"/api/v1/jobs/{j['id']}/progress", json={**rep, "attempt": 7, "metrics": {}})
    assert stale.json()["accepted"] is False
    other = plane.as_user("eve", "member", "vision")
    assert other.post(f"/api/v1/jobs/{j['id']}/progress", json={**rep, "metrics": {}}).status_code == 403
    kinds = [e["kind"] for e in plane.admin.get(f"/api/v1/jobs/{j['id']}/events").json()["events"]]
    assert "job.runtime.checkpoint" in kinds


def test_output_links_stay_inside_the_workdir_and_replace_no_file(plane, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    precious = plane.cp.data_dir / "admin.token"
    before = precious.read_text()
    (work / "mine.log").write_text("keep me")
    outside = tmp_path / "outside"
    outside.mkdir()
    (work / "sneaky").symlink_to(outside)
    refused = plane.admin.post("/api/v1/jobs", json={"command": ["true"], "team": "vision", "workdir": str(work),
                                                     "output": "../escape-%j.log"})
    assert refused.status_code == 422 and "output" in refused.text
    # Refused at submission, before anything is stored or created (services/output_paths.py).
    for out, why in ((str(precious), "exists and is not a link"),  # outside the workdir: wherever the owner may
                     ("mine.log", "exists and is not a link"), ("sneaky/deeper/%j.log", "is a symbolic link")):
        r = plane.admin.post("/api/v1/jobs", json={"command": ["true"], "team": "vision", "workdir": str(work),
                                                   "output": out})
        assert r.status_code == 400 and r.json()["field"] == "output" and why in r.json()["detail"], (out, r.text)
    assert precious.read_text() == before and not precious.is_symlink()
    assert list(outside.iterdir()) == []
    assert (work / "mine.log").read_text() == "keep me"
    # A link swapped in after submission: the launch creates nothing through it, the job still runs.
    late = plane.submit(command=script("print('late')"), team="vision", workdir=str(work), hold=True,
                        output="later/inner/%j.log")
    (work / "later").symlink_to(outside)
    plane.admin.post(f"/api/v1/jobs/{late['id']}/release")
    plane.wait(late["id"], "COMPLETED")
    assert list(outside.iterdir()) == []
    good = plane.submit(command=script("print('hello')"), team="vision", workdir=str(work), output="logs/%x-%j.log")
    plane.wait(good["id"], "COMPLETED")
    linked = work / "logs" / f"{good['name']}-{good['id']}.log"
    assert linked.is_symlink() and "hello" in linked.read_text()


def test_a_job_token_is_revoked_when_its_attempt_ends(plane):
    j = plane.submit(command=script(ENV_DUMP), team="vision")
    plane.wait(j["id"], "COMPLETED")
    env = json.loads((job_dir(plane, j["id"]) / "env-0.json").read_text())
    assert plane.client(env["TRAINYARD_TOKEN"]).get(f"/api/v1/jobs/{j['id']}").status_code == 401
