"""`yard dataset add|ls|show|grant|checksum` and `--dataset` (also `#SBATCH --dataset`): real `yard`
processes against a real `yard up` whose configuration names a real SeaweedFS S3 server and a
configured dataset; bad input exits 2 naming the option, field or script line, and writes nothing."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.cli.yard_process import stored, yard_process
from tests.plane import TWO_TEAMS, YARD, YARD_UP_IDENTITY
from tests.staging.seaweed import SeaweedS3, seaweed  # noqa: F401  (fixture)

pytestmark = pytest.mark.xdist_group("cli-dataset")
CONFIGURED = "sha256:" + "cd" * 32


def _config_text(sw: SeaweedS3, cred: Path, extra: str = "") -> str:
    return TWO_TEAMS.read_text() + f"""
storage:
  object_stores:
    - {{url: "s3://{sw.bucket}", endpoint_url: "{sw.endpoint_url}", credentials_file: "{cred}"}}
datasets:
  - {{name: vocab, version: "1", source: "s3://{sw.bucket}/vocab.txt", team: vision, checksum: "{CONFIGURED}",
     grants: [nlp]}}
{extra}"""


@pytest.fixture(scope="module")
def files(tmp_path_factory, seaweed: SeaweedS3):  # noqa: F811
    d = tmp_path_factory.mktemp("dataset-cli")
    cred = d / "s3.cred"
    cred.write_text(f"{seaweed.key}\n{seaweed.secret}\n")
    cred.chmod(0o600)
    (d / "cluster.yaml").write_text(_config_text(seaweed, cred))
    data = d / "shards"
    data.mkdir()
    (data / "0.jsonl").write_text('{"text": "a"}\n' * 50)
    (data / "1.jsonl").write_text('{"text": "b"}\n' * 70)
    data.chmod(0o755)
    d.chmod(0o755)
    return {"dir": d, "cred": cred, "config": d / "cluster.yaml", "shards": data,
            "corpus": seaweed.put("corpus.jsonl", b'{"text": "hello"}\n' * 10)}


@pytest.fixture(scope="module")
def yard(tmp_path_factory, files):
    yield from yard_process(tmp_path_factory, "dataset", config_file=files["config"])


@pytest.fixture(scope="module")
def members(yard):
    return {team: yard("token", "create", "--user", user, "--role", "member", "--team", team).stdout.strip()
            for team, user in (("nlp", "carol"), ("vision", "victor"))}


def as_(yard, members, team):
    return lambda *a, **kw: yard(*a, env_extra={"YARD_TOKEN": members[team]}, **kw)


def test_add_ls_show_and_the_checksum_a_person_computes(yard, members, files):
    nlp = as_(yard, members, "nlp")
    out = nlp("dataset", "add", "shards", "--version", "v1", "--source", str(files["shards"]),
              "--description", "two shards").stdout
    assert out.startswith("Added shards:v1 (team nlp): 2 files,"), out
    local = yard("dataset", "checksum", str(files["shards"])).stdout.strip()
    assert local in out
    out = nlp("dataset", "add", "corpus", "--version", "v1", "--source", files["corpus"], "--json").stdout
    assert json.loads(out)["files"] == 1
    listed = {(d["name"], d["version"]): d for d in json.loads(nlp("dataset", "ls", "--json").stdout)}
    assert set(listed) == {("shards", "v1"), ("corpus", "v1"), ("vocab", "1")}
    assert listed[("vocab", "1")]["origin"] == "config" and listed[("shards", "v1")]["checksum"] == local
    table = nlp("dataset", "ls").stdout
    assert "shards" in table and "ORIGIN" in table
    shown = nlp("dataset", "show", "shards:v1").stdout
    assert "Checksum:    " + local in shown and "added by carol" in shown and "two shards" in shown
    vision = as_(yard, members, "vision")
    assert {d["name"] for d in json.loads(vision("dataset", "ls", "--json").stdout)} == {"vocab"}
    p = vision("dataset", "show", "shards", ok=False)
    assert p.returncode == 2 and "no dataset 'shards'" in p.stderr


def test_grant_then_a_job_pins_its_datasets(yard, members, files, tmp_path):
    nlp, vision = as_(yard, members, "nlp"), as_(yard, members, "vision")
    p = vision("submit", "--hold", "--dataset", "shards", "--", "true", ok=False)
    assert p.returncode == 2 and "datasets.0" in p.stderr and "not granted" in p.stderr, p.stderr
    assert "granted to vision" in nlp("dataset", "grant", "shards", "vision").stdout
    jid = vision("submit", "--parsable", "--hold", "--dataset", "shards:v1,vocab", "--", "true").stdout.strip()
    job = json.loads(yard("show", jid, "--json").stdout)
    assert [(d["name"], d["version"]) for d in job["datasets"]] == [("shards", "v1"), ("vocab", "1")]
    assert job["datasets"][0]["reader"] is not None and job["datasets"][1]["reader"] is None
    shown = yard("show", jid).stdout
    assert "dataset: shards:v1 sha256:" in shown and "dataset: vocab:1 " + CONFIGURED in shown, shown
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\n#SBATCH --dataset=corpus\n#SBATCH --dataset shards\ntrue\n")
    jid = nlp("submit", "--parsable", "--hold", str(script)).stdout.strip()
    assert [d["name"] for d in json.loads(yard("show", jid, "--json").stdout)["datasets"]] == ["corpus", "shards"]
    assert "no longer granted" in nlp("dataset", "grant", "shards", "vision", "--revoke").stdout
    p = vision("submit", "--hold", "--dataset", "shards", "--", "true", ok=False)
    assert p.returncode == 2


def test_bad_input_exits_2_naming_it_and_writes_nothing(yard, members, files, tmp_path):
    nlp = as_(yard, members, "nlp")
    jobs_before = len(stored(yard))
    datasets_before = len(json.loads(yard("dataset", "ls", "--json").stdout))
    script = tmp_path / "bad.sh"
    script.write_text("#!/bin/sh\n#SBATCH -N 1\n#SBATCH --dataset=nothing\ntrue\n")
    for args, said in [
        (("dataset", "add", "Bad", "--version", "1", "--source", "/x"), "NAME"),
        (("dataset", "add", "ok", "--version", "1", "--source", "rel/path"), "--source"),
        (("dataset", "add", "ok", "--version", "1", "--source", "/x", "--checksum", "md5:1"), "--checksum"),
        (("dataset", "add", "ok", "--version", "1", "--source", "/nonexistent/data"), "'source'"),
        (("dataset", "add", "ok", "--version", "1", "--source", str(files["shards"]), "--checksum",
          "sha256:" + "0" * 64), "'checksum'"),
        (("dataset", "add", "shards", "--version", "v1", "--source", str(files["shards"])), "exists"),
        (("dataset", "add", "vocab", "--version", "1", "--source", files["corpus"]), "exists"),
        (("dataset", "grant", "shards", "nosuchteam"), "'team'"),
        (("submit", "--hold", "--dataset", "nothing", "--", "true"), "datasets.0"),
        (("submit", "--hold", "--dataset", "shards:v9", "--", "true"), "datasets.0"),
        (("submit", "--hold", "--dataset", "shards", "--dataset", "shards:v1", "--", "true"), "datasets.1"),
        (("submit", "--hold", "--dataset", "Shards", "--", "true"), "--dataset"),
        (("submit", "--hold", "--dataset", "a,,b", "--", "true"), "--dataset"),
        (("submit", "--hold", str(script)), f"{script}:3"),
        (("alloc", "--dataset", "nothing"), "datasets.0"),
        (("alloc", "--dataset", "Bad!"), "--dataset"),
        (("run", "llama-pretrain", "--out", str(tmp_path / "o"), "--dataset", "shards"), "--dataset"),
    ]:
        p = nlp(*args, ok=False)
        assert p.returncode == 2 and said in p.stderr, (args, p.returncode, p.stderr)
    assert len(stored(yard)) == jobs_before
    assert len(json.loads(yard("dataset", "ls", "--json").stdout)) == datasets_before


def test_ls_node_prints_the_caches_or_says_the_plane_has_none(yard):
    p = yard("dataset", "ls", "--node", "all", ok=False)
    if p.returncode == 0:
        assert "NODE" in p.stdout
    else:
        assert p.returncode == 1 and "dataset caches" in p.stderr, p.stderr


def _versions(yard) -> int:
    return len(json.loads(yard("cluster", "history", "--json").stdout))


@pytest.mark.parametrize("entry, field", [
    ('  - {name: Bad, version: "1", source: "/data/x", team: nlp, checksum: "' + CONFIGURED + '"}', "datasets.1.name"),
    ('  - {name: ok, version: "1", source: "/data/x", team: speech, checksum: "' + CONFIGURED + '"}', "datasets.1.team"),
    ('  - {name: ok, version: "1", source: "/data/x", team: nlp, checksum: "sha256:12"}', "datasets.1.checksum"),
    ('  - {name: ok, version: "1", source: "s3://elsewhere/x", team: nlp, checksum: "' + CONFIGURED + '"}',
     "datasets.1.source"),
    ('  - {name: vocab, version: "1", source: "/data/x", team: nlp, checksum: "' + CONFIGURED + '"}', "datasets.1"),
])
def test_a_malformed_datasets_section_is_refused_by_apply_and_by_up(yard, files, tmp_path, seaweed, entry,  # noqa: F811
                                                                    field):
    bad = tmp_path / "bad.yaml"
    bad.write_text(_config_text(seaweed, files["cred"]).rstrip("\n") + "\n" + entry + "\n")
    before = _versions(yard)
    p = yard("cluster", "apply", str(bad), ok=False)
    assert p.returncode == 2 and field in p.stderr, p.stderr
    assert _versions(yard) == before
    data = tmp_path / "fresh"
    data.mkdir()
    p = subprocess.run([YARD, "up", "--data-dir", str(data), "--port", "0", "--login-socket", "none",
                        *YARD_UP_IDENTITY, "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and field in p.stderr, p.stderr
    db = data / "trainyard.db"
    if db.exists():
        with sqlite3.connect(db) as c:
            assert c.execute("SELECT count(*) FROM config_versions").fetchone()[0] == 0
