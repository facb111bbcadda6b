"""The CLI's standard-library HTTP client against a real HTTP server on a real socket."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest

from trainyard.cli.http import HttpClient, TransportError

SEEN: list[dict] = []


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _reply(self, status: int, body: bytes, ctype: str = "application/json", chunks: int = 1) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        step = max(1, len(body) // chunks)
        for i in range(0, len(body), step):
            self.wfile.write(body[i:i + step])
            self.wfile.flush()

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        SEEN.append({"method": "GET", "path": self.path, "auth": self.headers.get("Authorization")})
        path = self.path.removeprefix("/base")
        if path.startswith("/api/stream"):
            # 'é' is two bytes in UTF-8: sent one byte at a time, it is split across reads
            self._reply(200, "héllo wörld\n".encode() * 3, "text/plain", chunks=36)
        elif path.startswith("/api/missing"):
            self._reply(404, json.dumps({"detail": "no job 7"}).encode())
        else:
            self._reply(200, json.dumps({"ok": True}).encode())

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        SEEN.append({"method": "POST", "path": self.path, "ctype": self.headers.get("Content-Type"),
                     "body": json.loads(body)})
        self._reply(201, body)


@pytest.fixture
def url() -> Iterator[str]:
    SEEN.clear()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/base/"
    srv.shutdown()
    srv.server_close()


def test_query_headers_and_json_body_as_the_api_expects(url: str) -> None:
    c = HttpClient(url, headers={"Authorization": "Bearer t0k"})
    r = c.request("GET", "/api/x", params={"active": True, "held": False, "team": "nlp", "n": 3, "none": None})
    assert (r.status_code, r.headers["content-type"], r.json()) == (200, "application/json", {"ok": True})
    assert SEEN[-1] == {"method": "GET", "path": "/base/api/x?active=true&held=false&team=nlp&n=3&none=",
                        "auth": "Bearer t0k"}
    body = {"command": ["echo", "ünïcode"], "env": {"A": "b"}, "gpus": 2}
    r = c.request("POST", "/api/jobs", json=body)
    assert r.status_code == 201 and r.json() == body
    assert SEEN[-1]["ctype"] == "application/json" and SEEN[-1]["body"] == body


def test_error_statuses_come_back_as_responses(url: str) -> None:
    r = HttpClient(url).request("GET", "/api/missing")
    assert r.status_code == 404 and r.json() == {"detail": "no job 7"} and "no job 7" in r.text


def test_streamed_text_survives_characters_split_across_reads(url: str) -> None:
    with HttpClient(url).stream("GET", "/api/stream", params={"follow": True}) as r:
        assert r.status_code == 200
        assert "".join(r.iter_text(chunk=1)) == "héllo wörld\n" * 3


def test_an_unreachable_server_is_a_transport_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket closes
    with pytest.raises(TransportError):
        HttpClient(f"http://127.0.0.1:{port}").request("GET", "/api/x")


@pytest.mark.parametrize("bad", ["ftp://host", "127.0.0.1:8080", "http://"])
def test_a_url_that_is_not_http_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        HttpClient(bad)
