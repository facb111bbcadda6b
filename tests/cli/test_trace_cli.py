"""`yard trace fetch|list` and `yard sim --trace <name>`, run as a user runs them (a subprocess,
its own data dir, a web server on loopback holding the source's files)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.sim.test_trace_catalog import mirror, needs_shared, put_pollux  # noqa: F401  (mirror is a fixture)
from trainyard.cli.common import load_workload

YARD = [sys.executable, "-m", "trainyard.cli.main"]


def yard(data_dir, *args, timeout=120):
    env = {**os.environ, "YARD_DATA_DIR": str(data_dir)}
    return subprocess.run([*YARD, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


@needs_shared
def test_fetch_then_simulate_by_name(mirror, tmp_path, monkeypatch):  # noqa: F811
    root, url = mirror
    put_pollux(root)
    data = tmp_path / "data"
    before = yard(data, "trace", "list")
    assert before.returncode == 0 and "pollux: " in before.stdout and "0 of 11 files verified" in before.stdout
    missing = yard(data, "sim", "--format", "pollux", "--trace", "pollux:2", "--policies", "fifo",
                   "--out", tmp_path / "out")
    assert missing.returncode == 2 and "run `yard trace fetch pollux` first" in missing.stderr
    assert not (tmp_path / "out").exists()
    got = yard(data, "trace", "fetch", "pollux", "--mirror", url)
    assert got.returncode == 0, got.stderr
    assert got.stdout.count("checksum verified") == 11
    assert "11 of 11 files verified" in yard(data, "trace", "list").stdout
    # What `yard sim --trace pollux:2` loads (in-process: a whole simulation is not the point here).
    monkeypatch.setenv("YARD_DATA_DIR", str(data))
    w = load_workload("pollux", Path("pollux:2"), date_from=None, date_to=None, warmup_days=0, cluster=None,
                      seed=1, jobs=0)
    assert len(w.jobs) == 160 and w.total_gpus == 64


def test_bad_names_and_failed_downloads(mirror, tmp_path):  # noqa: F811
    root, url = mirror
    data = tmp_path / "data"
    bad = yard(data, "trace", "fetch", "alibaba")
    assert bad.returncode == 2 and "unknown trace 'alibaba'; known: philly, pollux" in bad.stderr
    bad = yard(data, "trace", "fetch", "philly", "--mirror", "ftp://x")
    assert bad.returncode == 2 and "--mirror" in bad.stderr
    served_wrong = root / "simulator/traces/philly.csv"
    served_wrong.parent.mkdir(parents=True)
    served_wrong.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n")
    failed = yard(data, "trace", "fetch", "philly", "--mirror", url)
    assert failed.returncode == 1 and "expected 3,444,496; nothing kept" in failed.stderr
    assert not list(data.rglob("*.csv*"))
    nothing = yard(data, "sim", "--trace", "nosuch.csv", "--out", tmp_path / "out")
    assert nothing.returncode == 2 and "no such file: nosuch.csv (nor a trace name" in nothing.stderr
