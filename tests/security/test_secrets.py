"""Issue 34, point 2: the plane's secrets never reach a job, and the store's URL never reaches a
command line.

- A job of a real account on a root plane prints its whole environment (`/usr/bin/env`): none of
  the plane's variables is there but the allow-list (backends/local/login_env.py), whatever the plane
  holds (PGPASSWORD, YARD_DB_URL, DATABASE_URL, AWS_SECRET_ACCESS_KEY, …); what the submitter
  exported is. The Slurm backend's `job-env.json` likewise (`slurm_env.job_env`, written for real).
- An operator's check command gets the plane's environment less its credentials.
- `yard up`: `--db` with a password is refused (exit 2, saying where to put it, nothing written,
  nothing started); `--db-file` must be the plane's own regular 0600 file, not a link or a FIFO;
  `YARD_DB_URL` and `--db-file` open the real PostgreSQL, and the URL is on no command line (with
  `--wait-ready` too) nor in a job's environment.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.accounts import ROOT_ONLY, Accounts, accounts, shared_dir
from tests.plane import TWO_TEAMS, YARD, YARD_UP_IDENTITY, Plane, YardServer, job_dir
from trainyard.backends.slurm import env as slurm_env
from trainyard.backends.base import LaunchSpec, Owner
from trainyard.backends.local.login_env import DEFAULT_PATH, PASSED_ON
from trainyard.contracts import Gang, RankPlacement, rank_env
from trainyard.control.health.checks import run_check
from trainyard.spec.models import CheckSpec

PG_DSN = os.environ.get("TRAINYARD_TEST_PG", "host=127.0.0.1 port=5432 user=postgres dbname=test")
TOKEN = uuid.uuid4().hex[:10]
# What an operator's shell (or systemd unit) may hold when it starts the plane.
PLANE_SECRETS = {
    "PGPASSWORD": f"pg-{TOKEN}", "PGPASSFILE": f"/root/.pgpass-{TOKEN}",
    "YARD_DB_URL": f"sqlite:////nonexistent/{TOKEN}.db", "DATABASE_URL": f"postgresql://plane:db-{TOKEN}@db/x",
    "AWS_SECRET_ACCESS_KEY": f"aws-{TOKEN}", "HF_TOKEN": f"hf-{TOKEN}", "YARD_TOKEN": f"ty_{TOKEN}",
    "SOME_PLANE_SETTING": f"plane-{TOKEN}",
}
LOGIN = {"PATH", "HOME", "USER", "LOGNAME", "SHELL"}
# Names trainyard sets for every rank itself (whatever the plane's environment has under them).
SET_BY_TRAINYARD = set(rank_env(Gang((RankPlacement(0, "n", (0,)),)), 0, job_id=1, attempt=1, checkpoint_dir="c",
                                master_addr="a", master_port=1)) | {"CUDA_DEVICE_ORDER", "TMPDIR"}


def env_lines(text: str) -> dict[str, str]:
    """`env`'s output (after the plane's start marker) as a dict."""
    out = {}
    for line in text.splitlines():
        k, eq, v = line.partition("=")
        if eq and not line.startswith("==="):
            out[k] = v
    return out


# -- a job of a real account on a root plane --------------------------------------------------------


@pytest.fixture(scope="module")
def acc() -> Iterator[Accounts]:
    with accounts({"alice": ["vis"]}, ["vis"]) as a:
        yield a


@pytest.fixture(scope="module")
def plane(acc: Accounts) -> Iterator[Plane]:
    with shared_dir("ty-secrets-") as d:
        cfg = d / "cluster.yaml"
        text = TWO_TEAMS.read_text().replace("  - name: vision\n", f"  - name: vision\n    group: {acc.group('vis')}\n")
        cfg.write_text(text + f"users:\n  alice: {acc.user('alice')}\n")
        p = Plane(d / "yard", config=cfg, run_as=None, allow_root_jobs=None)
        try:
            yield p
        finally:
            p.stop()


@ROOT_ONLY
@pytest.mark.parametrize("exported", [
    {},  # what an API client that sends no env gets, and `--export=NONE` (SLURM_EXPORT_ENV aside)
    {"MY_VAR": "mine", "PATH": "/opt/venv/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},  # `--export=ALL`
], ids=["nothing-exported", "shell-exported"])
def test_a_job_sees_none_of_the_planes_environment_but_the_allow_list(plane, acc, monkeypatch, exported):
    for k, v in PLANE_SECRETS.items():
        monkeypatch.setenv(k, v)  # the plane runs in this process: this is its environment
    alice = plane.as_user("alice", "member", "vision")
    j = plane.submit(alice, command=["/usr/bin/env"], env=exported)["id"]
    done = plane.wait(j, ("COMPLETED", "FAILED"), timeout=60)
    log = (job_dir(plane.cp.data_dir, j) / "logs" / "rank-0.log").read_text()
    assert done["state"] == "COMPLETED", log
    env = env_lines(log)
    for secret in PLANE_SECRETS.values():
        assert secret not in log
    # By name: of the plane's variables only the allow-list's and what the submitter sent.
    shared = {k for k in set(env) & set(os.environ) - SET_BY_TRAINYARD if not k.startswith(("TRAINYARD_", "SLURM_"))}
    assert shared <= LOGIN | set(PASSED_ON) | set(exported), sorted(shared)
    pw = pwd.getpwnam(acc.user("alice"))
    assert (env["USER"], env["LOGNAME"], env["HOME"], env["SHELL"]) == (pw.pw_name, pw.pw_name, pw.pw_dir, pw.pw_shell)
    assert env["PATH"] == exported.get("PATH", DEFAULT_PATH)
    assert env.get("MY_VAR") == exported.get("MY_VAR")
    assert env["TRAINYARD_JOB_ID"] == str(j) and env["RANK"] == "0" and env["TRAINYARD_TOKEN"].startswith("ty_")


def test_the_slurm_backends_job_env_file_holds_the_jobs_variables_only(tmp_path, monkeypatch):
    for k, v in PLANE_SECRETS.items():
        monkeypatch.setenv(k, v)
    spec = LaunchSpec(job_id=7, attempt=2, command=["true"], workdir=str(tmp_path), job_dir=str(tmp_path / "j"),
                      ranks=[RankPlacement(0, "n1", (0,))], env={"MY_VAR": "mine", "TRAINYARD_TOKEN": "ty_job"},
                      checkpoint_dir=str(tmp_path / "ck"),
                      owner=Owner("nobody", os.geteuid(), os.getegid()))
    want = {"MY_VAR": "mine", "TRAINYARD_TOKEN": "ty_job", "TRAINYARD_JOB_ID": "7", "TRAINYARD_ATTEMPT": "2",
            "TRAINYARD_CHECKPOINT_DIR": str(tmp_path / "ck")}
    assert slurm_env.job_env(spec) == want
    slurm_env.write_job_env(tmp_path, spec)
    written = (tmp_path / slurm_env.JOB_ENV_FILE).read_text()
    assert json.loads(written) == want and not any(v in written for v in PLANE_SECRETS.values())


def test_an_operators_check_command_gets_the_planes_environment_less_its_credentials(tmp_path, monkeypatch):
    for k, v in PLANE_SECRETS.items():
        monkeypatch.setenv(k, v)
    show = " ".join(f"{k}=${{{k}:-unset}}" for k in PLANE_SECRETS)
    spec = CheckSpec(name="env", command=["/bin/sh", "-c", f'echo "{show}"'])
    got = dict(kv.split("=", 1) for kv in run_check(spec, "node-0", tmp_path).message.split())
    secret = ("PGPASSWORD", "PGPASSFILE", "YARD_DB_URL", "DATABASE_URL", "YARD_TOKEN")
    assert {k: got[k] for k in secret} == dict.fromkeys(secret, "unset")
    assert got["SOME_PLANE_SETTING"] == PLANE_SECRETS["SOME_PLANE_SETTING"]  # the operator's own environment


# -- yard up: where the store's URL comes from ------------------------------------------------------


def yard_up(data: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([YARD, "up", "--data-dir", str(data), "--port", "0", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("url", [
    "postgresql://trainyard:s3cret-pw@127.0.0.1:5432/test",
    "postgresql+psycopg://trainyard:s3cret-pw@db.example/trainyard?sslmode=require",
    "postgresql://trainyard@127.0.0.1/test?password=s3cret-pw",
])
@pytest.mark.parametrize("wait_ready", [False, True])
def test_a_password_in_db_is_refused_saying_where_to_put_it(tmp_path, url, wait_ready):
    data = tmp_path / "d"
    p = yard_up(data, "--db", url, *(["--wait-ready"] if wait_ready else []))
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert p.stderr.startswith("error: --db: the URL holds a password"), p.stderr
    assert "--db-file" in p.stderr and "YARD_DB_URL" in p.stderr and "s3cret-pw" not in p.stderr + p.stdout
    assert not data.exists()  # nothing written, no plane started


def _db_file(tmp_path: Path, text: str, mode: int = 0o600, name: str = "db-url") -> Path:
    f = tmp_path / name
    f.write_text(text)
    f.chmod(mode)
    return f


def test_a_db_file_open_to_others_a_link_a_fifo_or_two_urls_is_refused(tmp_path):
    data = tmp_path / "d"
    url = "postgresql://trainyard:s3cret-pw@127.0.0.1/test\n"
    cases = []
    f = _db_file(tmp_path, url, 0o644)
    cases.append((f, f"mode 0644 lets its group or others at it; chmod 600 {f}"))
    link = tmp_path / "link"
    link.symlink_to(_db_file(tmp_path, url, name="target"))
    cases.append((link, "is a symbolic link; give the file itself"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    cases.append((fifo, "not a regular file"))
    two = tmp_path / "two"
    two.write_text("# the store\n" + url + url)
    two.chmod(0o600)
    cases.append((two, "expected one URL (one line), found 2"))
    cases.append((tmp_path / "missing", "cannot open: No such file or directory"))
    for path, why in cases:
        t0 = time.monotonic()
        p = yard_up(data, "--db-file", str(path), timeout=30)
        assert p.returncode == 2 and p.stderr.strip() == f"error: --db-file {path}: {why}", p.stderr
        assert time.monotonic() - t0 < 20 and "s3cret-pw" not in p.stderr
    p = yard_up(data, "--db-file", str(_db_file(tmp_path, url, name="good")), "--db", "sqlite:////tmp/x.db")
    assert p.returncode == 2 and "--db and --db-file: give one of them" in p.stderr
    bad = _db_file(tmp_path, "mysql://u:s3cret-pw@h/db", name="mysql")
    p = yard_up(data, "--db-file", str(bad))
    assert p.returncode == 2 and "expected a postgresql:// or sqlite:/// URL, got 'mysql://u:***@h/db'" in p.stderr
    assert not data.exists()


@ROOT_ONLY
def test_a_db_file_of_another_account_is_refused(tmp_path, acc):
    f = _db_file(tmp_path, "postgresql://postgres@127.0.0.1/test")
    os.chown(f, acc.uid("alice"), -1)  # she would choose the plane's store
    p = yard_up(tmp_path / "d", "--db-file", str(f))
    assert p.returncode == 2 and f"belongs to uid {acc.uid('alice')}, not to the account the plane runs as" in p.stderr


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database (tests/store/test_store.py's), dropped afterwards."""
    psycopg = pytest.importorskip("psycopg")
    from psycopg import sql
    try:
        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL is not reachable with {PG_DSN!r} (set TRAINYARD_TEST_PG): {str(e).strip()}")
    name = f"trainyard_test_{uuid.uuid4().hex[:12]}"
    info = admin.info
    admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"postgresql://{info.user}@{info.host}:{info.port}/{name}"
    finally:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        admin.close()


def jobs_in(url: str) -> list[tuple[int, str]]:
    import psycopg

    with psycopg.connect(url) as c:
        return [tuple(r) for r in c.execute("SELECT id, state FROM jobs ORDER BY id")]


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_yard_db_url_opens_postgresql_and_reaches_no_command_line_and_no_job(tmp_path, pg_url):
    data = tmp_path / "d"
    data.mkdir()
    env = {**os.environ, "YARD_DB_URL": pg_url, "PGPASSWORD": f"pg-{TOKEN}"}  # trust auth: libpq never sends it
    server = YardServer(data, env=env)
    try:
        c = server.start()
        assert pg_url not in cmdline(server.proc.pid) and "postgresql" not in cmdline(server.proc.pid)
        r = c.post("/api/v1/jobs", json={"command": ["/usr/bin/env"], "workdir": str(data), "team": "vision"})
        assert r.status_code == 201, r.text
        jid = r.json()["id"]
        deadline = time.monotonic() + 60
        while (j := c.get(f"/api/v1/jobs/{jid}").json())["state"] not in ("COMPLETED", "FAILED"):
            assert time.monotonic() < deadline, j
            time.sleep(0.1)
        log = c.get(f"/api/v1/jobs/{jid}/logs").text
        assert j["state"] == "COMPLETED", log
        assert pg_url not in log and f"pg-{TOKEN}" not in log and "YARD_DB_URL" not in log
        assert jobs_in(pg_url) == [(jid, "COMPLETED")]  # the store is that database
        assert not (data / "trainyard.db").exists()
    finally:
        server.terminate()


def test_db_file_with_wait_ready_opens_postgresql_and_the_background_plane_has_no_url_in_argv(tmp_path, pg_url):
    data = tmp_path / "d"
    f = _db_file(tmp_path, f"# trainyard's store\n{pg_url}\n")
    env = {k: v for k, v in os.environ.items() if k != "YARD_DB_URL"}
    p = subprocess.run([YARD, "up", "--wait-ready", "--data-dir", str(data), "--port", "0", "--db-file", str(f),
                        "--config", str(TWO_TEAMS), *YARD_UP_IDENTITY, "--tick", "0.2"],
                       capture_output=True, text=True, timeout=180, env=env)
    assert p.returncode == 0, (p.stdout, p.stderr)
    meta = json.loads((data / "server.json").read_text())
    pid = meta["pid"]
    try:
        argv = cmdline(pid)
        assert f"--db-file {f}" in argv and "postgresql" not in argv
        token = (data / "admin.token").read_text().strip()
        r = httpx.get(meta["url"] + "/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 200 and jobs_in(pg_url) == []  # the tables are PostgreSQL's, migrated
        assert not (data / "trainyard.db").exists()
    finally:
        os.kill(pid, 15)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
