"""The API's job listing (`list_job_dicts`, read as plain rows) shows exactly what `job_dict` shows."""

import pytest

from tests.plane import TEST_IDENTITY, TWO_TEAMS, with_test_users
from trainyard.control.lifecycle.plane_builder import PlaneSettings, build_plane
from trainyard.services import jobs
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden, ServiceError
from trainyard.store.models import REQUEST_FIELDS

ADMIN = Principal("admin", "admin")


@pytest.fixture
def cp(tmp_path):
    cp = build_plane(PlaneSettings(tmp_path / "yard", config_text=with_test_users(TWO_TEAMS.read_text()), **TEST_IDENTITY))
    with cp.store.session.begin() as s:
        cfg = cp.configs.current(s)
        wd = str(cp.data_dir)
        subs = [dict(command=["sleep", "1"], team="vision"),
                dict(command=["python", "-c", "print(1)"], team="nlp", gpus=2, gpu_mem_gb=8, time="2h",
                     env={"A": "b"}, output="out-%j.log", hold=True, name="n" * 30, **{"class": "batch"}),
                dict(script="#!/bin/bash\necho hi\n", team="vision", nodes=2, gpus_per_node=4,
                     checkpoint_interval="10m"),
                dict(command=["true"], team="nlp", nodes="1-2", tasks_per_node=1)]
        rows = [jobs.submit(s, jobs.JobSubmit(workdir=wd, **b), ADMIN, cfg, cp.data_dir) for b in subs]
        r = rows[0]
        r.state, r.start_time, r.attempt, r.last_checkpoint = "RUNNING", 5.0, 1, 6.0
        r.placement, r.progress = [{"node": "node0", "gpus": [0], "mem_mib": 0}], {"step": 3}
        r = rows[3]
        r.state, r.end_time, r.exit_code, r.signal = "FAILED", 9.0, 1, 9
    yield cp
    cp.stop()


@pytest.mark.parametrize("by", [ADMIN, Principal("v", "member", "vision"), Principal("n", "member", "nlp"),
                                Principal("w", "viewer"), Principal("o", "operator")], ids=lambda p: p.role + (p.team or ""))
def test_listing_is_job_dict(cp, by):
    filters = [{}, {"states": ["PENDING", "RUNNING"]}, {"team": "nlp"}, {"user": "admin", "limit": 2},
               {"job_class": "batch"}, {"states": ["COMPLETED"]}]
    with cp.store.session() as s:
        for f in filters:
            want = [jobs.job_dict(j, by) for j in jobs.list_jobs(s, by, **f)]
            got = jobs.list_job_dicts(s, by, **f)
            assert got == want, f
            assert [list(d) for d in got] == [list(d) for d in want], f  # same keys, same order

# Fields the engine takes as they are and that have no key of their own above are shown under their
# column's name, after the others (`services.jobs`, derived from store.models' `engine()` marks).
ENGINE_EXTRAS = [c for c in REQUEST_FIELDS if c not in ("team", "job_class", "pool", "nodes_min", "nodes_max",
                                                        "gpus_per_node", "gpu_mem_mib", "time_limit_s",
                                                        "checkpoint_interval_s")]


def test_listing_shape_and_privacy(cp):
    with cp.store.session() as s:
        mine = jobs.list_job_dicts(s, Principal("n", "member", "nlp"), job_class="batch")
        other = jobs.list_job_dicts(s, Principal("v", "member", "vision"), job_class="batch")
        with pytest.raises(Forbidden):
            jobs.list_job_dicts(s, Principal("job-1", "job", "vision", job_id=1))
    [j] = mine
    assert list(j) == ["id", "name", "user", "team", "class", "pool", "state", "reason", "held", "nodes_min",
                       "nodes_max", "gpus_per_node", "gpus", "tasks_per_node", "gpu_mem_gb", "mem_mib",
                           "mem_per_gpu_mib", "cpus_per_task", "pids_max", "time_limit_s",
                       "checkpoint_interval_s", "submit_time", "begin_time", "eligible_time", "start_time", "end_time",
                       "est_start", "attempt", "placement", "exit_code", "signal", "last_checkpoint", "progress", "retries",
                       "retry_after", "lost_gpu_s", "avoid_nodes", "dependency", "array_job_id", "array_task_id",
                       "constraint", "gpu_model", "nodelist_asked", "exclude_nodes", "exclusive", "ntasks", "command", "workdir", "env", "output", "error", "open_mode", "mail_type",
                       "mail_user", "container", "image_digest", "interactive", "datasets"] + ENGINE_EXTRAS
    assert (j["class"], j["state"], j["reason"], j["held"], j["gpus"], j["gpu_mem_gb"], j["time_limit_s"]) == \
        ("batch", "PENDING", "JobHeldUser", True, 2, 8.0, 7200.0)
    assert (j["command"], j["env"], j["output"]) == (["python", "-c", "print(1)"], {"A": "b"}, "out-%j.log")
    [o] = other
    assert (o["command"], o["workdir"], o["env"], o["output"]) == (None, None, None, "out-%j.log")
    assert o["mail_user"] is None  # another team's address is not shown, as its command is not


@pytest.mark.parametrize("who", [ADMIN, Principal("n", "member", "nlp"), Principal("v", "viewer")])
def test_listing_some_fields_is_the_full_listing_cut_to_them(cp, who):
    """`fields` reads only those columns: the same values as the full listing, privacy included."""
    cuts = [["id", "state", "reason"], ["command", "env", "gpu_mem_gb", "team"], ["placement", "id", "placement"],
            ["workdir"], list(jobs._KEYS)]
    with cp.store.session() as s:
        full = jobs.list_job_dicts(s, who)
        for keys in cuts:
            got = jobs.list_job_dicts(s, who, fields=keys)
            assert got == [{k: d[k] for k in keys} for d in full], keys
            assert [list(d) for d in got] == [list(dict.fromkeys(keys))] * len(full), keys


def test_states_are_read_as_squeue_reads_them():
    assert jobs.parse_states("pd,R ,cd") == ["PENDING", "RUNNING", "COMPLETED"]  # codes and names, any case
    assert jobs.parse_states("running,R") == ["RUNNING"]
    assert jobs.parse_states("all") is None and jobs.parse_states("PD,all") is None  # every state
    assert jobs.parse_states("") is None and jobs.parse_states(None) is None
    with pytest.raises(ServiceError) as e:
        jobs.parse_states("PD,XX")
    assert e.value.field == "state" and "'XX'" in e.value.message and "codes PD, RQ, CF, R" in e.value.message
