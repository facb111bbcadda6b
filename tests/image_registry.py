"""A real OCI registry for the tests: Debian's `docker-registry` (the CNCF distribution registry) on
127.0.0.1 and a free port, its storage under the test's temporary directory (issue 37).

- `image_registry` (session fixture): an open registry, as a `Registry` (host:port in `.address`).
- `auth_registry` (session fixture): one that wants a login (htpasswd, bcrypt): `.username`,
  `.password`. The bcrypt hash comes from the C library's crypt(3) (Python's `crypt` module;
  Debian's libxcrypt does bcrypt); where it cannot, the fixture skips saying so.
- `Registry.stop()` / `.start()`: take it down and bring it back (same port, same storage) for
  tests of an unreachable registry; `.requests(fragment)` counts the access-log lines naming a
  path (a blob fetched twice shows twice).
- `push_layout(src, dest)`: copy an image (`oci:LAYOUT:TAG`) to `host:port/repository:tag`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import image_tools

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Registry:
    def __init__(self, workdir: Path, htpasswd: Path | None = None) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = workdir / "access.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.username: str | None = None  # set on a registry with a login
        self.password: str | None = None
        auth = (f"auth:\n  htpasswd:\n    realm: trainyard-tests\n    path: {htpasswd}\n" if htpasswd else "")
        (workdir / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {workdir / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.address}\n  secret: trainyard-tests-{self.port}\n" + auth)

    def start(self) -> None:
        if self.proc is not None:
            return
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(["docker-registry", "serve", str(self.workdir / "config.yml")],
                                         stdout=log, stderr=log, env={"PATH": PATH, "HOME": str(self.workdir)},
                                         start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://{self.address}/v2/", timeout=1).close()
                return
            except urllib.error.HTTPError as e:  # 401 from a registry with a login: it is up
                if e.code == 401:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"docker-registry did not answer on {self.address}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def requests(self, fragment: str) -> int:
        """Access-log lines of GET requests whose path holds `fragment`."""
        return sum(1 for line in self.log.read_text(errors="replace").splitlines()
                   if "GET " in line and fragment in line)


def push_layout(src: str, dest: str, creds: tuple[str, str] | None = None) -> str:
    """`skopeo copy SRC docker://DEST` over plain HTTP; returns DEST."""
    cmd = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false"]
    if creds:
        cmd += ["--dest-creds", f"{creds[0]}:{creds[1]}"]
    done = subprocess.run(cmd + [src, f"docker://{dest}"], capture_output=True, text=True, timeout=600,
                          env={"PATH": PATH, "HOME": "/nonexistent", "LANG": "C"})
    if done.returncode != 0:
        raise RuntimeError(f"skopeo copy {src} {dest}: {done.stderr.strip()[-2000:]}")
    return dest


def _bcrypt(password: str) -> str | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            import crypt
        except ImportError:
            return None
        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    return hashed if hashed and hashed.startswith("$2") else None


@pytest.fixture(scope="session")
def image_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    why = image_tools.unavailable()
    if why:
        pytest.skip(why)
    registry = Registry(tmp_path_factory.mktemp("registry"))
    registry.start()
    yield registry
    registry.stop()


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    hashed = _bcrypt("s3cret-pass")
    if hashed is None:
        pytest.skip("no bcrypt here (Python's crypt module or libxcrypt's bcrypt) for the registry's htpasswd")
    workdir = tmp_path_factory.mktemp("auth-registry")
    (workdir / "htpasswd").write_text(f"alice:{hashed}\n")
    os.chmod(workdir / "htpasswd", 0o600)
    registry = Registry(workdir, htpasswd=workdir / "htpasswd")
    registry.username, registry.password = "alice", "s3cret-pass"
    registry.start()
    yield registry
    registry.stop()
