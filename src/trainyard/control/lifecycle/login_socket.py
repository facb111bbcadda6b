"""The plane's login socket: a Unix socket on the plane's host where the kernel says who calls.

`yard login` on the plane's host connects here; the plane reads the caller's uid with
`SO_PEERCRED` (the kernel's word, which no request can change) and answers with a member token
for exactly that account (`services/login.py` maps uid → user, team, role). One JSON line each
way:

    → {"op": "login", "team": "vision"}          team: optional, to choose among several
    ← {"ok": true, "token": "ty_…", "user": "alice", "team": "vision", "role": "member", "account": "alice"}
    ← {"ok": false, "error": "account 'eve' maps to no team: …", "field": "team", "status": 403}

A request that names a `user` other than the caller's is refused, never honoured.

Where: `/run/trainyard/plane-<PORT>.sock` by default (`default_path`), or `yard up --login-socket
PATH`. The socket is 0666 (anyone on the host may ask who they are); its directory must be root's
(or the plane's) and writable by nobody else, so nobody can put another socket in its place; a
stale socket of a dead plane is replaced, a live one is refused. Each connection gets READ_TIMEOUT_S
and MAX_REQUEST bytes, on a thread of its own, at most MAX_CLIENTS at once: a caller that never
writes holds one thread for a few seconds, never the loop or the API.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
import threading
from pathlib import Path
from typing import Any, Callable

from trainyard.services import login
from trainyard.services.errors import Forbidden, ServiceError

log = logging.getLogger("trainyard.login")

RUN_DIR = Path("/run/trainyard")
MAX_REQUEST = 4096
READ_TIMEOUT_S = 5.0
MAX_CLIENTS = 16

Answer = Callable[[int, dict[str, Any]], dict[str, Any]]  # (peer uid, request) -> response


class LoginSocketError(Exception):
    """The socket cannot be set up where asked (a message for `yard up` to print)."""


def default_path(port: int) -> Path:
    return RUN_DIR / f"plane-{port}.sock"


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end, as the kernel recorded it at connect."""
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return uid


def _check_dir(d: Path, create: bool) -> None:
    if create and not d.exists():  # plane's own: /run/trainyard
        d.mkdir(mode=0o755, parents=False)  # plane's own: /run/trainyard
        os.chmod(d, 0o755)  # plane's own: /run/trainyard, past the umask
    st = os.lstat(d)  # plane's own: the socket's directory, checked before use
    if not stat.S_ISDIR(st.st_mode):
        raise LoginSocketError(f"{d} is not a directory")
    if st.st_uid not in (0, os.geteuid()) or st.st_mode & 0o022:
        raise LoginSocketError(f"{d} must be owned by root or this plane's account and writable by no one else "
                               f"(it is uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): another account could "
                               "put its own socket there")


def _clear_stale(path: Path) -> None:
    try:
        st = os.lstat(path)  # plane's own: the socket's path
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise LoginSocketError(f"{path} exists and is not a socket; remove it or choose another --login-socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # plane's own: its socket path; nobody answers there (a dead plane's)
        return
    finally:
        probe.close()
    raise LoginSocketError(f"another control plane answers at {path}; stop it or choose another --login-socket")


class LoginSocket:
    """Listens at `path` and answers each connection with `answer(peer uid, request)`."""

    def __init__(self, path: Path, answer: Answer):
        self.path, self._answer = Path(path), answer
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._thread: threading.Thread | None = None

    def start(self, create_dir: bool = False) -> "LoginSocket":
        _check_dir(self.path.parent, create_dir)
        _clear_stale(self.path)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(str(self.path))
            os.chmod(self.path, 0o666)  # plane's own: the socket it just made; anyone may ask who they are
            s.listen(64)
        except OSError as e:
            s.close()
            raise LoginSocketError(f"cannot listen at {self.path}: {e.strerror or e}") from e
        s.settimeout(0.5)  # to see the stop flag
        self._sock = s
        self._thread = threading.Thread(target=self._serve, name="login-socket", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
            try:
                if stat.S_ISSOCK(os.lstat(self.path).st_mode):  # plane's own: its socket
                    self.path.unlink()  # plane's own: its socket
            except FileNotFoundError:
                pass

    def _serve(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                continue
            if not self._slots.acquire(blocking=False):
                _send(conn, {"ok": False, "error": "the control plane is busy; try again", "status": 503})
                conn.close()
                continue
            threading.Thread(target=self._one, args=(conn,), name="login-client", daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(READ_TIMEOUT_S)
            uid = peer_uid(conn)
            try:
                req = _read_request(conn)
                out = {"ok": True, **self._answer(uid, req)}
            except ServiceError as e:
                out = {"ok": False, "error": e.message, "field": e.field, "status": e.status}
            except Exception:  # noqa: BLE001 - a caller must get an answer; the plane goes on
                log.exception("login socket: answering uid %s failed", uid)
                out = {"ok": False, "error": "the control plane failed to answer (see its log)", "status": 500}
            _send(conn, out)
        except OSError:
            pass  # the caller went away or never wrote
        finally:
            conn.close()
            self._slots.release()


def _read_request(conn: socket.socket) -> dict[str, Any]:
    buf = b""
    while b"\n" not in buf:
        try:
            chunk = conn.recv(MAX_REQUEST + 1 - len(buf))
        except socket.timeout:
            raise ServiceError(f"no complete request line within {READ_TIMEOUT_S:g} s") from None
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_REQUEST:
            raise ServiceError(f"request longer than {MAX_REQUEST} bytes")
    line = buf.split(b"\n", 1)[0]
    try:
        req = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ServiceError("the request must be one line of JSON, e.g. {\"op\": \"login\"}") from None
    if not isinstance(req, dict):
        raise ServiceError("the request must be a JSON object")
    if req.get("op", "login") != "login":
        raise ServiceError(f"unknown op {str(req.get('op'))[:40]!r}; the only op is \"login\"", field="op")
    for field, most in (("team", 100), ("user", 200)):
        v = req.get(field)
        if v is not None and (not isinstance(v, str) or not v or len(v) > most or "\x00" in v):
            raise ServiceError(f"{field} must be a name of at most {most} characters", field=field)
    return req


def _send(conn: socket.socket, out: dict[str, Any]) -> None:
    try:
        conn.sendall(json.dumps(out).encode() + b"\n")
    except OSError:
        pass


def plane_answer(cp: Any) -> Answer:
    """The answer of a running control plane (`control/lifecycle/plane.py`'s ControlPlane): the caller's
    identity from the current configuration, and a new member token for it."""

    def answer(uid: int, req: dict[str, Any]) -> dict[str, Any]:
        with cp.lock, cp.store.session.begin() as s:
            spec = cp.configs.current(s).spec
            who = login.login_identity(spec, uid, team=req.get("team"))
            if req.get("user") is not None and req["user"] != who.user:
                raise Forbidden(f"this socket issues tokens only for the calling account: you are {who.user!r}, "
                                f"not {req['user']!r}", field="user")
            token = login.issue(s, who.user, who.role, who.team, "login:socket")
        return {"token": token, **who.view()}

    return answer
