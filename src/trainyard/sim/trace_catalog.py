"""The public trace files `yard sim` replays, and fetching them onto a fresh machine.

A fresh clone has no traces (a machine that carries a copy names it in `TRAINYARD_TRACES`:
`sim/local_traces.py`). `yard trace fetch philly|pollux` downloads each file of a trace from its public
source, pinned to one commit, and keeps it only if its size and SHA-256 are the ones written here
(taken from that commit's blobs). Files land in `<data dir>/traces/<trace>/`, where
`yard sim --trace philly` (or `--trace pollux:3`) finds them.

A download goes to `<file>.part` beside its target and is renamed only once verified, so an
interrupted or corrupted fetch leaves nothing that `yard sim` could read; a file already there
with the right checksum is not fetched again. `--mirror URL` replaces the source's address (a
copy of the same files on another web server; the tests serve one on loopback).
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# petuum/adaptdl, branch osdi21-artifact: Pollux's artifact (OSDI'21), Apache-2.0. Its Philly data
# derives from msr-fiddle/philly-traces (CC BY 4.0; cite Jeon et al., ATC'19).
ADAPTDL_COMMIT = "c793c7089bd307462686339d29707925c461f9a9"
ADAPTDL_RAW = f"https://raw.githubusercontent.com/petuum/adaptdl/{ADAPTDL_COMMIT}/"
# S-Lab-System-Group/HeliosArtifact (MIT): the node count of each Philly virtual cluster, which
# `yard sim --format philly` turns into the teams' quotas.
HELIOS_COMMIT = "bdaae109c21f8038a2331e6a23a582d5ae78ab5b"
HELIOS_RAW = f"https://raw.githubusercontent.com/S-Lab-System-Group/HeliosArtifact/{HELIOS_COMMIT}/"
CHUNK = 1 << 20
TIMEOUT_S = 60.0


class FetchError(Exception):
    """A file could not be fetched or did not verify; nothing of it is left behind."""


@dataclass(frozen=True)
class TraceFile:
    """One file of a trace: its path at the source (relative to the trace's address) and checksum."""

    name: str  # its name in <data dir>/traces/<trace>/
    source_path: str
    size: int
    sha256: str
    source: str = ""  # the address source_path is relative to, where not the trace's


@dataclass(frozen=True)
class Trace:
    name: str
    source: str  # the address the files' source paths are relative to
    about: str
    files: tuple[TraceFile, ...]
    default_file: str  # what `--trace <name>` means

    def file(self, name: str) -> TraceFile | None:
        return next((f for f in self.files if f.name == name), None)


_POLLUX_WORKLOADS = (
    (4770, "0bff9c3a36b52c7025484b666d788001b1478cc4d84be409ca04b28f58f9d162"),
    (4855, "83bec266667ec209a202c10975ab321e52eb4989e5ba420d18003ed03cf15c4e"),
    (4691, "d76d5d1e3f9143b5453083de5c7a4c6576e884b41e86434a624b08f2c4277dc0"),
    (4760, "22c400f59637ba0fc2c9be3b491f67e0765d1bf33d0a57d76101d770e4443f21"),
    (4664, "4761ea418f2cb618f79e1dcfc003d24de2810ec8d0af2ecf8895690d088c3930"),
    (4821, "d6517c4d57c72e4f362f9e99f285e4f7fee0348913287033f11f02f5cb88f074"),
    (4757, "fd29e99deef2c9edb758b431f3a04f896251a0ff6fb443567fb27580239462d5"),
    (4847, "13618461b7dd45974f77dbf8354aa2a5bf5e6e04b15dbc783b174e111816774d"),
)
_POLLUX_RESULTS = (
    ("pollux", 39286, "9cab4a59d26b7f8966adfeab8b91e91c9f580f2deaacafbc3dcc84975da22cf4"),
    ("tiresias", 39417, "e8ae3e3dd7b66849edbf9103b33ba947c956a5af2d2e129bb35cd351a6892467"),
    ("optimus", 39569, "730c9b90bc34246e79d52e42d2cd5443ab08993d2c126f372e5d094df2171630"),
)

CATALOG: dict[str, Trace] = {
    "philly": Trace(
        name="philly",
        source=ADAPTDL_RAW,
        about="Philly (Microsoft, 2017): 82,247 jobs with submit time, run time, GPUs and virtual "
              "cluster, as Pollux's simulator reads them, and Helios' node count per virtual cluster",
        files=(TraceFile("philly.csv", "simulator/traces/philly.csv", 3_444_496,
                         "ebffb3dd1589bdf4e7bcd74496201c5ded1d557d498ee14f560463f37ec353da"),
               TraceFile("philly_vc_nodes_heliosartifact.csv", "framework/QSSF Service/data/philly_vc.csv", 120,
                         "a6873abd7d94a09c646961ad7a0f011faf4069dcdf0c1f7717521613fd6156f7", source=HELIOS_RAW)),
        default_file="philly.csv",
    ),
    "pollux": Trace(
        name="pollux",
        source=ADAPTDL_RAW,
        about="Pollux's eight 160-job workloads (OSDI'21) and its published results for Pollux, "
              "Tiresias and Optimus",
        files=tuple(TraceFile(f"workload-{i}.csv", f"simulator/workloads/workload-{i}.csv", size, digest)
                    for i, (size, digest) in enumerate(_POLLUX_WORKLOADS, start=1))
        + tuple(TraceFile(f"{p}-1.0_summary.json", f"simulator/results-jobload/{p}-1.0/summary.json", size, digest)
                for p, size, digest in _POLLUX_RESULTS),
        default_file="workload-1.csv",
    ),
}


def traces_dir(data_dir: Path) -> Path:
    return Path(data_dir) / "traces"


def local_path(data_dir: Path, trace: str, file: str) -> Path:
    return traces_dir(data_dir) / trace / file


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def is_fetched(data_dir: Path, trace: str, tf: TraceFile) -> bool:
    """The file is there with its size and checksum (a partial or altered copy is not)."""
    p = local_path(data_dir, trace, tf.name)
    try:
        return p.stat().st_size == tf.size and sha256_of(p) == tf.sha256
    except OSError:
        return False


def _url(base: str, tf: TraceFile) -> str:
    return base.rstrip("/") + "/" + urllib.parse.quote(tf.source_path)


def fetch_file(url: str, tf: TraceFile, dest: Path, timeout_s: float = TIMEOUT_S) -> None:
    """Download url into dest, verified against tf; on any failure raise FetchError, dest untouched."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    size = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp, open(part, "wb") as out:
            while True:
                block = resp.read(CHUNK)
                if not block:
                    break
                size += len(block)
                if size > tf.size:
                    raise FetchError(f"{url}: more than the {tf.size:,} bytes expected; nothing kept")
                h.update(block)
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if size != tf.size:
            raise FetchError(f"{url}: got {size:,} bytes, expected {tf.size:,}; nothing kept")
        if h.hexdigest() != tf.sha256:
            raise FetchError(f"{url}: SHA-256 {h.hexdigest()} is not the expected {tf.sha256}; nothing kept")
        os.replace(part, dest)
    except urllib.error.HTTPError as e:
        raise FetchError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise FetchError(f"{url}: {e.reason}") from None
    except (OSError, ValueError) as e:  # a socket time-out, a reset, a full disk, a bad URL
        raise FetchError(f"{url}: {e}") from None
    finally:
        part.unlink(missing_ok=True)


def fetch(trace: str, data_dir: Path, mirror: str | None = None, force: bool = False,
          say: Callable[[str], None] = lambda _msg: None) -> list[Path]:
    """Fetch every file of `trace` into the data dir; returns their paths. Raises KeyError for an
    unknown trace and FetchError for a file that cannot be had (the files verified before it stay)."""
    t = CATALOG[trace]
    paths = []
    for tf in t.files:
        dest = local_path(data_dir, trace, tf.name)
        if not force and is_fetched(data_dir, trace, tf):
            say(f"{dest}: already there, checksum verified")
        else:
            url = _url(mirror or tf.source or t.source, tf)
            fetch_file(url, tf, dest)
            say(f"{dest}: {tf.size:,} bytes from {url}, checksum verified")
        paths.append(dest)
    return paths


def resolve(spec: str, data_dir: Path) -> Path | None:
    """`philly`, `pollux`, `pollux:3` or `pollux:workload-3.csv` → the fetched file's path; None when
    spec names no trace of the catalog. Raises FileNotFoundError (with what to run) when it names
    one that is not fetched."""
    name, _, part = spec.partition(":")
    t = CATALOG.get(name)
    if t is None:
        return None
    file = t.default_file
    if part:
        candidates = [part, f"workload-{part}.csv", f"{part}.csv"]
        match = next((c for c in candidates if t.file(c) is not None), None)
        if match is None:
            raise FileNotFoundError(f"trace {name!r} has no file {part!r}; it has {', '.join(f.name for f in t.files)}")
        file = match
    path = local_path(data_dir, name, file)
    if not path.is_file():
        raise FileNotFoundError(f"trace {spec!r} is not fetched into {traces_dir(data_dir)}; "
                                f"run `yard trace fetch {name}` first")
    return path
