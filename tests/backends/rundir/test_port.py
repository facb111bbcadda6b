"""`rundir/port.py`'s relay (the Slurm backend's `open_port`) run here directly, without srun: the
same few lines of python3 the job's step runs, with the same pipes, against a real TCP server.
(`connect_in_rank`, the local backend's way, is tested with a real rank in
tests/backends/local/test_port.py.)"""

from __future__ import annotations

import hashlib
import os
import socket
import threading

import pytest

from trainyard.backends.rundir.port import PortError, relay_argv, start_relay

PYTHON3 = "/usr/bin/python3"


def server(handle) -> socket.socket:
    srv = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = srv.accept()
        with conn:
            handle(conn)
    threading.Thread(target=run, daemon=True).start()
    return srv


def read_all(fd: int) -> bytes:
    out = b""
    while chunk := os.read(fd, 65536):
        out += chunk
    return out


def test_bytes_both_ways_and_the_end_of_input_as_a_half_close() -> None:
    sent = os.urandom(1 << 20)

    def handle(conn: socket.socket) -> None:
        conn.sendall(b"hello:")
        h = hashlib.sha256()
        while data := conn.recv(65536):
            h.update(data)
        conn.sendall(h.hexdigest().encode())

    srv = server(handle)
    t = start_relay(relay_argv(PYTHON3, srv.getsockname()[1]), {"PATH": "/usr/bin:/bin"})
    try:
        assert t.pid is not None and t.read_fd != t.write_fd
        view = memoryview(sent)
        while view:
            view = view[os.write(t.write_fd, view):]
        os.close(t.write_fd)  # the relay shuts the socket's write half: the server reads its end
        assert read_all(t.read_fd) == b"hello:" + hashlib.sha256(sent).hexdigest().encode()
        assert os.waitpid(t.pid, 0)[1] == 0
    finally:
        os.close(t.read_fd)
        srv.close()


def test_nothing_listening_is_refused_with_the_relays_words() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(PortError, match=f"nothing listens on port {port}") as e:
        start_relay(relay_argv(PYTHON3, port), {"PATH": "/usr/bin:/bin"})
    assert e.value.refused


def test_a_relay_that_ends_without_a_word_is_an_error() -> None:
    with pytest.raises(PortError, match="ended before it connected") as e:
        start_relay(["/bin/true"], {})
    assert not e.value.refused
