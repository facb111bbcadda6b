"""Lifecycle rules in the configuration (spec/lifecycle.py): the cluster's `storage.lifecycle`, a
team's `teams[].storage.lifecycle` and a class's `classes[].lifecycle`, merged field by field (team,
class, cluster); every malformed rule refused naming its field: `parse_config` raises, the API
answers 400 and stores no version, `yard up --config` exits 2 and writes nothing (`yard cluster
apply` is tests/cli/test_storage_rules_yard_up.py's)."""

from __future__ import annotations

import subprocess

import pytest

from tests.plane import TWO_TEAMS, YARD, Plane
from trainyard.services.retention import JOB_DIR, LOGS, horizons, rules_for
from trainyard.spec.models import ConfigError, parse_config

BASE = TWO_TEAMS.read_text()


def cluster(lifecycle: str, extra: str = "") -> str:
    return BASE + f"storage: {{{extra}lifecycle: {lifecycle}}}\n"


def team(lifecycle: str) -> str:  # vision is teams.0
    return BASE.replace("  - name: vision\n", f"  - name: vision\n    storage: {{lifecycle: {lifecycle}}}\n", 1)


def klass(lifecycle: str) -> str:  # training is classes.1
    return BASE.replace("  - {name: training, ", f"  - {{name: training, lifecycle: {lifecycle}, ", 1)


MALFORMED = [
    (cluster("{checkpoints: {keep_last: 0}}"), "storage.lifecycle.checkpoints.keep_last", "greater than or equal to 1"),
    (cluster("{checkpoints: {keep_best: {metric: ''}}}"), "storage.lifecycle.checkpoints.keep_best.metric",
     "at least 1 character"),
    (cluster("{checkpoints: {keep_best: {metric: 'a b'}}}"), "storage.lifecycle.checkpoints.keep_best.metric",
     "pattern"),
    (cluster("{checkpoints: {keep_best: {metric: loss, mode: avg}}}"), "storage.lifecycle.checkpoints.keep_best.mode",
     "'min' or 'max'"),
    (cluster("{checkpoints: {keep_best: {metric: loss, count: 0}}}"), "storage.lifecycle.checkpoints.keep_best.count",
     "greater than or equal to 1"),
    (cluster("{checkpoints: {keep_every: 0}}"), "storage.lifecycle.checkpoints.keep_every", "greater than or equal"),
    (cluster("{checkpoints: {keep_lats: 2}}"), "storage.lifecycle.checkpoints.keep_lats", "Extra inputs"),
    (cluster("{keep: 2}"), "storage.lifecycle.keep", "Extra inputs"),
    (cluster("{checkpoints: {keep_for: 3 parsecs}}"), "storage.lifecycle.checkpoints.keep_for", "'3 parsecs'"),
    (cluster("{logs: 3 parsecs}"), "storage.lifecycle.logs", "'3 parsecs'"),
    (cluster("{job_dirs: -1}"), "storage.lifecycle.job_dirs", "negative"),
    (cluster("5"), "storage.lifecycle", "dictionary"),
    (cluster("{}", "archive: {url: 's3://nowhere/ckpt'}, "), "storage.archive.url", "under no storage.object_stores"),
    (cluster("{}", "archive: {url: 'relative/path'}, "), "storage.archive.url", "pattern"),
    (team("{checkpoints: {keep_last: 0}}"), "teams.0.storage.lifecycle.checkpoints.keep_last", "greater than"),
    (team("{logs: 3 parsecs}"), "teams.0.storage.lifecycle.logs", "'3 parsecs'"),
    (klass("{checkpoints: {keep_best: {metric: ''}}}"), "classes.1.lifecycle.checkpoints.keep_best.metric",
     "at least 1 character"),
    (klass("{job_dirs: forever}"), "classes.1.lifecycle.job_dirs", "'forever'"),
]


@pytest.mark.parametrize("text, field, words", MALFORMED)
def test_a_malformed_rule_is_refused_naming_the_field(text, field, words):
    with pytest.raises(ConfigError) as e:
        parse_config(text)
    assert e.value.field == field, str(e.value)
    assert words in str(e.value) and e.value.line is not None, str(e.value)


def test_rules_merge_field_by_field_team_then_class_then_cluster():
    text = (BASE.replace("  - name: vision\n", "  - name: vision\n    storage: {lifecycle: {logs: 1h, "
                         "checkpoints: {keep_last: 5}}}\n", 1)
            .replace("  - {name: batch, ", "  - {name: batch, lifecycle: {logs: 2h, job_dirs: 3h, "
                     "checkpoints: {keep_every: 10}}, ", 1)
            + "storage: {lifecycle: {logs: 1d, job_dirs: 7d, checkpoints: {keep_last: 2, keep_for: 30d}}}\n"
            + "retention: {job_dirs: 30d}\n")
    spec = parse_config(text)
    vb = spec.lifecycle_for("vision", "batch")
    assert (vb.logs, vb.job_dirs) == (3600, 3 * 3600)  # the team's logs, the class's job_dirs
    assert (vb.checkpoints.keep_last, vb.checkpoints.keep_every, vb.checkpoints.keep_for) == (5, 10, 30 * 86400)
    nt = spec.lifecycle_for("nlp", "training")
    assert (nt.logs, nt.job_dirs, nt.checkpoints.keep_last, nt.checkpoints.keep_every) == (86400, 7 * 86400, 2, None)
    # the rules retention applies, each with the field that says so
    r = rules_for(spec, "vision", "batch")
    assert (r[LOGS].keep_s, r[LOGS].source) == (3600, "teams.vision.storage.lifecycle.logs")
    assert (r[JOB_DIR].keep_s, r[JOB_DIR].source) == (3 * 3600, "classes.batch.lifecycle.job_dirs")
    assert rules_for(spec, "nlp", "training")[JOB_DIR].source == "storage.lifecycle.job_dirs"
    assert horizons(spec) == (3600, 30 * 86400)


def test_retention_job_dirs_is_the_fallback_and_no_rule_keeps_for_ever():
    spec = parse_config(BASE + "retention: {job_dirs: 2h}\n")
    r = rules_for(spec, "nlp", "training")
    assert LOGS not in r and (r[JOB_DIR].keep_s, r[JOB_DIR].source) == (7200, "retention.job_dirs")
    bare = parse_config(BASE)
    assert rules_for(bare, "nlp", "training") == {} and horizons(bare) is None


def test_the_api_answers_400_naming_the_field_and_stores_no_version(tmp_path):
    p = Plane(tmp_path / "yard", start=False)
    try:
        before = p.admin.get("/api/v1/cluster/config/versions").json()["versions"]
        for text, field, _ in (MALFORMED[0], MALFORMED[12], MALFORMED[16]):
            r = p.admin.post("/api/v1/cluster/config", json={"text": text})
            assert r.status_code == 400 and r.json()["field"] == field, r.text
        assert p.admin.get("/api/v1/cluster/config/versions").json()["versions"] == before
    finally:
        p.cp.stop()


def test_yard_up_refuses_a_malformed_rule_with_exit_2_and_writes_nothing(tmp_path):
    config = tmp_path / "cluster.yaml"
    config.write_text(team("{checkpoints: {keep_last: 0}}"))
    data = tmp_path / "d"
    p = subprocess.run([YARD, "up", "--data-dir", str(data), "--port", "0", "--login-socket", "none",
                        "--config", str(config)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr
    assert "teams.0.storage.lifecycle.checkpoints.keep_last" in p.stderr and f"{config}:" in p.stderr, p.stderr
    assert not data.exists()
