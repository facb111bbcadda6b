"""Fetching public traces (`sim/trace_catalog.py`): a real HTTP server on loopback plays the source.

The mirror holds the files at their source paths. Pollux's files there are the real ones (from
$TRAINYARD_TRACES, byte for byte the pinned commit's), so the catalog's checksums are checked
against real data; the Philly file is only served wrong (its full source is not on this machine).
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest

from trainyard.sim import trace_catalog as tc
from trainyard.sim.local_traces import MISSING, POLLUX, local_trace

SHARED = local_trace(POLLUX) or Path("/nonexistent")
needs_shared = pytest.mark.skipif(local_trace(POLLUX) is None, reason=MISSING)


@pytest.fixture
def mirror(tmp_path):
    """(root folder, base URL) of a web server on loopback; what is put under root is served."""
    root = tmp_path / "mirror"
    root.mkdir()
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def put_pollux(root: Path) -> None:
    """Lay out Pollux's files as the source has them."""
    for tf in tc.CATALOG["pollux"].files:
        if tf.name.startswith("workload-"):
            src = SHARED / "pollux_workloads" / tf.name
        else:
            src = SHARED / "pollux_results_jobload" / tf.name
        dest = root / tf.source_path
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)


@needs_shared
def test_pollux_fetches_and_verifies_against_the_real_files(mirror, tmp_path):
    root, url = mirror
    put_pollux(root)
    said: list[str] = []
    paths = tc.fetch("pollux", tmp_path / "data", mirror=url, say=said.append)
    assert [p.name for p in paths] == [f.name for f in tc.CATALOG["pollux"].files]
    for p in paths:
        assert p.parent == tmp_path / "data" / "traces" / "pollux"
    assert (paths[0]).read_bytes() == (SHARED / "pollux_workloads" / "workload-1.csv").read_bytes()
    assert all("checksum verified" in s and "from http://" in s for s in said)
    assert not list((tmp_path / "data").rglob("*.part"))
    # A second fetch reads nothing from the server: every file verifies where it is.
    shutil.rmtree(root / "simulator")
    said.clear()
    tc.fetch("pollux", tmp_path / "data", mirror=url, say=said.append)
    assert all("already there" in s for s in said)


@needs_shared
def test_an_altered_copy_is_fetched_again(mirror, tmp_path):
    root, url = mirror
    put_pollux(root)
    data = tmp_path / "data"
    tc.fetch("pollux", data, mirror=url)
    target = tc.local_path(data, "pollux", "workload-3.csv")
    target.write_text("name,time\n")
    assert not tc.is_fetched(data, "pollux", tc.CATALOG["pollux"].file("workload-3.csv"))
    tc.fetch("pollux", data, mirror=url)
    assert target.read_bytes() == (SHARED / "pollux_workloads" / "workload-3.csv").read_bytes()


def test_a_file_that_does_not_verify_is_not_kept(mirror, tmp_path):
    root, url = mirror
    bad = root / "simulator/traces/philly.csv"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"x" * tc.CATALOG["philly"].files[0].size)  # the right size, the wrong bytes
    with pytest.raises(tc.FetchError, match="SHA-256 .* is not the expected .*nothing kept"):
        tc.fetch("philly", tmp_path / "data", mirror=url)
    assert list((tmp_path / "data").rglob("*")) in ([], [tmp_path / "data/traces", tmp_path / "data/traces/philly"])
    assert not tc.local_path(tmp_path / "data", "philly", "philly.csv").exists()


def test_a_short_or_long_file_is_refused_by_its_size(mirror, tmp_path):
    root, url = mirror
    bad = root / "simulator/traces/philly.csv"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"timestamp,duration\n")
    with pytest.raises(tc.FetchError, match="got 19 bytes, expected 3,444,496"):
        tc.fetch("philly", tmp_path / "data", mirror=url)
    bad.write_bytes(b"y" * (tc.CATALOG["philly"].files[0].size + 10))
    with pytest.raises(tc.FetchError, match="more than the 3,444,496 bytes"):
        tc.fetch("philly", tmp_path / "data", mirror=url)
    assert not list((tmp_path / "data").rglob("*.csv*"))


def test_a_missing_file_and_a_dead_server_name_the_address(mirror, tmp_path):
    _, url = mirror
    with pytest.raises(tc.FetchError, match=r"simulator/traces/philly.csv: HTTP 404"):
        tc.fetch("philly", tmp_path / "data", mirror=url)
    with pytest.raises(tc.FetchError, match="127.0.0.1:9/simulator/traces/philly.csv"):
        tc.fetch("philly", tmp_path / "data", mirror="http://127.0.0.1:9/")


def test_philly_fetches_its_table_from_its_own_source_and_stops_at_a_bad_file(mirror, tmp_path):
    """The VC table comes from HeliosArtifact (a path with a space); it is real here, the job log is
    served wrong: the table is kept, verified, and the log is not."""
    root, url = mirror
    shared_table = SHARED.parent / "philly" / "philly_vc_nodes_heliosartifact.csv"
    if not shared_table.is_file():
        pytest.skip(MISSING)
    table = root / "framework/QSSF Service/data/philly_vc.csv"
    table.parent.mkdir(parents=True)
    shutil.copyfile(shared_table, table)
    log = root / "simulator/traces/philly.csv"
    log.parent.mkdir(parents=True)
    log.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n")
    files = {f.name: f for f in tc.CATALOG["philly"].files}
    assert files["philly_vc_nodes_heliosartifact.csv"].source == tc.HELIOS_RAW
    with pytest.raises(tc.FetchError, match="philly.csv: got 45 bytes"):
        tc.fetch("philly", tmp_path / "data", mirror=url)
    tc.fetch_file(url + "framework/QSSF%20Service/data/philly_vc.csv", files["philly_vc_nodes_heliosartifact.csv"],
                  tmp_path / "data/traces/philly/philly_vc_nodes_heliosartifact.csv")
    assert tc.is_fetched(tmp_path / "data", "philly", files["philly_vc_nodes_heliosartifact.csv"])
    assert not tc.local_path(tmp_path / "data", "philly", "philly.csv").exists()


def test_resolve_names_and_what_to_run(tmp_path):
    assert tc.resolve("some/file.csv", tmp_path) is None
    with pytest.raises(FileNotFoundError, match="run `yard trace fetch philly` first"):
        tc.resolve("philly", tmp_path)
    with pytest.raises(FileNotFoundError, match="has no file '9'"):
        tc.resolve("pollux:9", tmp_path)
    p = tc.local_path(tmp_path, "pollux", "workload-3.csv")
    p.parent.mkdir(parents=True)
    p.write_text("x")
    assert tc.resolve("pollux:3", tmp_path) == p
    assert tc.resolve("pollux:workload-3.csv", tmp_path) == p
    with pytest.raises(FileNotFoundError, match="pollux"):
        tc.resolve("pollux", tmp_path)  # workload-1 is the default, not fetched


def test_the_catalog_is_pinned_and_complete():
    for t in tc.CATALOG.values():
        assert tc.ADAPTDL_COMMIT in t.source and t.file(t.default_file) is not None
        for f in t.files:
            assert len(f.sha256) == 64 and int(f.sha256, 16) >= 0 and f.size > 0
