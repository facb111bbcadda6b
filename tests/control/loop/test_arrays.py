"""`--array` on a real plane: every task runs with its own index, the `%N` throttle is never
exceeded, `--output` names tasks with %A/%a, an array's id stands for the whole array in a
dependency, and a bad array is refused writing nothing."""

from __future__ import annotations

from tests.plane import Plane, job_dir, script, wait_until


def tasks(p: Plane, array_id: int) -> list[dict]:
    r = p.admin.get("/api/v1/jobs", params={"array": array_id})
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


def test_every_task_runs_with_its_index_and_the_throttle_holds(plane: Plane):
    body = "import os, time\nprint('index', os.environ['SLURM_ARRAY_TASK_ID'], os.environ['TRAINYARD_ARRAY_JOB_ID'])\n" \
           "time.sleep(0.6)"
    head = plane.submit(command=script(body), team="vision", array="0-15:3%2", output="sweep-%A_%a.log")
    aid = head["id"]
    assert (head["array_job_id"], head["array_task_id"]) == (aid, 0)
    ts = tasks(plane, aid)
    assert [t["array_task_id"] for t in ts] == [0, 3, 6, 9, 12, 15] and {t["array_job_id"] for t in ts} == {aid}
    most = 0

    def all_done() -> bool:
        nonlocal most
        now = tasks(plane, aid)
        most = max(most, sum(t["state"] == "RUNNING" for t in now))
        return all(t["state"] == "COMPLETED" for t in now)

    wait_until(all_done, timeout=60)
    assert most == 2  # 8 free GPUs, but never more than two at once
    starts = sorted((t["start_time"], t["end_time"]) for t in tasks(plane, aid))
    for start, _ in starts:  # no instant with three tasks running, from the store's own times
        assert sum(1 for s, e in starts if s <= start < e) <= 2, starts
    for t in tasks(plane, aid):
        log = (job_dir(plane.cp.data_dir, t["id"]) / "logs" / "rank-0.log").read_text()
        assert f"index {t['array_task_id']} {aid}" in log
        link = plane.cp.data_dir / f"sweep-{aid}_{t['array_task_id']}.log"
        assert link.is_symlink() and f"index {t['array_task_id']}" in link.read_text()


def test_a_throttled_task_waits_with_its_reason(plane: Plane):
    gate = plane.cp.data_dir / "gate"
    wait = script(f"import os, time\nwhile not os.path.exists({str(gate)!r}): time.sleep(0.05)")
    aid = plane.submit(command=wait, team="vision", array="0-2%1")["id"]
    wait_until(lambda: [t["state"] for t in tasks(plane, aid)] == ["RUNNING", "PENDING", "PENDING"])
    wait_until(lambda: {t["reason"] for t in tasks(plane, aid)[1:]} == {"JobArrayTaskLimit"})
    gate.touch()
    wait_until(lambda: all(t["state"] == "COMPLETED" for t in tasks(plane, aid)), timeout=30)


def test_an_arrays_id_in_a_dependency_means_the_whole_array(plane: Plane):
    aid = plane.submit(command=script("import os, time\ntime.sleep(0.3 * int(os.environ['SLURM_ARRAY_TASK_ID']))"),
                       team="vision", array="0-3")["id"]
    after = plane.submit(command=script("pass"), team="nlp", dependency=f"afterok:{aid}")
    done = plane.wait(after["id"], "COMPLETED", timeout=60)
    assert done["start_time"] >= max(t["end_time"] for t in tasks(plane, aid))  # after the last task, not task 0
    bad = plane.submit(command=script("import os\nraise SystemExit(int(os.environ['SLURM_ARRAY_TASK_ID']) == 1)"),
                       team="vision", array="0-2", **{"class": "batch"})["id"]
    needs = plane.submit(command=script("pass"), team="nlp", dependency=f"afterok:{bad}")
    assert plane.wait(needs["id"], "CANCELLED", timeout=60)["reason"] == "DependencyNeverSatisfied"
    assert sorted(t["state"] for t in tasks(plane, bad)) == ["COMPLETED", "COMPLETED", "FAILED"]


def test_a_bad_array_is_refused_and_writes_nothing(plane: Plane):
    for array in ("5-1", "0-5000", "0-9%0", "x", ""):
        r = plane.admin.post("/api/v1/jobs", json=dict(command=["true"], team="vision", array=array,
                                                         workdir=str(plane.cp.data_dir)))
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "array", (array, r.text)
    r = plane.admin.post("/api/v1/jobs", json=dict(command=["true"], team="vision", array="0-3", gpus=99,
                                                     workdir=str(plane.cp.data_dir)))
    assert r.status_code == 400  # a task the configuration refuses: no task stored
    assert plane.admin.get("/api/v1/jobs").json()["jobs"] == []
    assert plane.admin.get("/api/v1/jobs", params={"array": 0}).status_code == 422
