"""Bad arguments and bad input: one line on stderr, exit code 2, nothing written to --out.

The first test runs the real command in a subprocess; the others call the Typer app in-process
(same code, a second less each)."""

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app

YARD = [sys.executable, "-m", "trainyard.cli.main"]
HEADER = "timestamp,duration,num_gpus,gpu_time,cluster\n"


def yard_subprocess(*args):
    return subprocess.run([*YARD, *map(str, args)], capture_output=True, text=True, timeout=60)


def yard(*args):
    return _Result(CliRunner().invoke(app, [str(a) for a in args]))


class _Result:
    def __init__(self, r):
        self.returncode, self.stdout, self.stderr = r.exit_code, r.stdout, r.stderr


@pytest.fixture
def trace(tmp_path) -> Path:
    p = tmp_path / "trace.csv"
    p.write_text(HEADER + "2017-10-20 01:00:00,100.0,1,100.0,aaa\n"
                 "2017-10-21 01:00:00,100.0,2,200.0,bbb\n"
                 "2017-10-21 02:00:00,1h,1,100.0,aaa\n")
    (tmp_path / "philly_vc_nodes_heliosartifact.csv").write_text("vc,node num\naaa,2\nbbb,2\n")
    return p


def test_bad_trace_row(tmp_path, trace):
    out = tmp_path / "out"
    r = yard_subprocess("sim", "--trace", trace, "--format", "philly", "--from", "2017-10-20", "--to", "2017-10-22",
             "--warmup-days", "1", "--cluster", "4x8", "--policies", "fifo", "--out", out)
    assert r.returncode == 2, r.stderr
    assert f"{trace}:4" in r.stderr and "duration" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == []


def test_missing_trace_file(tmp_path):
    out = tmp_path / "out"
    r = yard("sim", "--trace", tmp_path / "nope.csv", "--out", out)
    assert r.returncode == 2 and "nope.csv" in r.stderr and not out.exists()


@pytest.mark.parametrize("args, words", [
    (["--cluster", "80by8"], ["--cluster", "80by8"]),
    (["--policies", "fifo,nosuch"], ["--policies", "nosuch"]),
    (["--from", "2017-02-30"], ["--from"]),
    (["--estimates", "guess"], ["--estimates"]),
    (["--node-mtbf", "soon"], ["--node-mtbf"]),
    (["--format", "csv"], ["--format"]),
])
def test_bad_arguments(tmp_path, args, words):
    out = tmp_path / "out"
    trace = tmp_path / "t.csv"
    trace.write_text(HEADER + "2017-10-20 01:00:00,100.0,1,100.0,aaa\n")
    (tmp_path / "philly_vc_nodes_heliosartifact.csv").write_text("vc,node num\naaa,2\n")
    base = {"--trace": trace, "--from": "2017-10-20", "--to": "2017-10-22", "--warmup-days": "1",
            "--cluster": "2x8", "--policies": "fifo", "--out": out}
    for k, v in zip(args[::2], args[1::2]):
        base[k] = v
    r = yard("sim", *[x for kv in base.items() for x in kv])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1
    for w in words:
        assert w in r.stderr
    assert not out.exists()


def test_plan_and_bench_bad_arguments(trace):
    r = yard("plan", "capacity", "--trace", trace, "--target-p99-wait", "2 hours")
    assert r.returncode == 2 and "--target-p99-wait" in r.stderr
    r = yard("bench", "sched", "--policy", "nosuch", "--json")
    assert r.returncode == 2 and "--policy" in r.stderr and "nosuch" in r.stderr
    r = yard("bench", "sched", "--nodes", "0")
    assert r.returncode == 2 and "--nodes" in r.stderr


def test_bad_config_names_file_line_and_field(tmp_path):
    from trainyard.spec.models import EXAMPLE_CONFIG

    cfg = tmp_path / "cluster.yaml"
    cfg.write_text(EXAMPLE_CONFIG.read_text().replace("    max_wait: 24h\n", "    max_wait: tomorrow\n"))
    line = cfg.read_text().splitlines().index("    max_wait: tomorrow") + 1
    out = tmp_path / "out"
    r = yard("sim", "--format", "synthetic", "--jobs", "20", "--cluster", "2x8", "--policies", "fifo",
             "--config", cfg, "--out", out)
    assert r.returncode == 2
    assert f"{cfg}:{line}" in r.stderr and "max_wait" in r.stderr
    assert not out.exists()


def test_config_without_a_class_the_workload_uses(tmp_path):
    from trainyard.spec.models import EXAMPLE_CONFIG

    cfg = tmp_path / "cluster.yaml"
    text = EXAMPLE_CONFIG.read_text()
    start = text.index("  # Deferrable batch work")
    cfg.write_text(text[:start] + text[text.index("default_class"):])
    out = tmp_path / "out"
    r = yard("sim", "--format", "synthetic", "--jobs", "20", "--cluster", "2x8", "--policies", "fifo",
             "--config", cfg, "--out", out)
    assert r.returncode == 2 and "'batch'" in r.stderr and not out.exists()


@pytest.mark.parametrize("url", ["ftp://example.org", "127.0.0.1:8080", "http://"])
def test_a_yard_url_that_is_not_http_is_bad_input(monkeypatch, tmp_path, url):
    """The client commands refuse a malformed YARD_URL with exit 2, naming it, before any request."""
    monkeypatch.setenv("YARD_URL", url)
    monkeypatch.setenv("YARD_TOKEN", "t")
    monkeypatch.setenv("YARD_DATA_DIR", str(tmp_path))
    r = yard("submit", "--", "true")
    assert r.returncode == 2
    assert "YARD_URL" in r.stderr and "not an http" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_unreachable_server_is_exit_1_with_the_url(monkeypatch, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    monkeypatch.setenv("YARD_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("YARD_TOKEN", "t")
    r = yard("queue")
    assert r.returncode == 1
    assert f"cannot reach the trainyard server at http://127.0.0.1:{port}" in r.stderr
