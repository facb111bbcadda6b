"""The little HTTP the CLI speaks, on the standard library's `http.client`.

Why not httpx (which the tests and benchmarks use): importing it and building its client (an SSL
context even for plain HTTP) cost the CLI ~0.1 s of its ~0.3 s start-up, on every `yard queue`.
The CLI needs one request at a time, JSON in and out, and one streamed response (`yard logs -f`).

The interface is the slice of httpx's `Client` the CLI uses (`request`, `stream`, and responses
with `status_code`, `headers`, `text`, `json()`, `read()`, `iter_text()`), so that tests can put an
httpx-compatible client (FastAPI's `TestClient`) in its place.
"""

from __future__ import annotations

import codecs
import http.client
import json as jsonlib
from contextlib import contextmanager
from typing import Any, Iterator, Mapping
from urllib.parse import urlencode, urlsplit


class TransportError(Exception):
    """The server could not be reached, or the connection broke before a whole response came."""


def _query_value(v: Any) -> str:
    # as httpx encodes them: the server's boolean query parameters read "true"/"false"
    if v is True or v is False:
        return "true" if v else "false"
    return "" if v is None else str(v)


class Response:
    def __init__(self, raw: http.client.HTTPResponse, content: bytes | None = None):
        self._raw = raw
        self.status_code = raw.status
        self.headers = {k.lower(): v for k, v in raw.getheaders()}
        self.content = content

    def read(self) -> bytes:
        if self.content is None:
            self.content = self._raw.read()
        return self.content

    @property
    def text(self) -> str:
        return self.read().decode("utf-8", "replace")

    def json(self) -> Any:
        return jsonlib.loads(self.read())

    def iter_text(self, chunk: int = 65536) -> Iterator[str]:
        decode = codecs.getincrementaldecoder("utf-8")("replace").decode
        while True:
            data = self._raw.read1(chunk)
            if not data:
                tail = decode(b"", final=True)
                if tail:
                    yield tail
                return
            text = decode(data)
            if text:
                yield text


class HttpClient:
    """One connection per request (a CLI command makes a handful; nothing to keep alive)."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None, timeout: float | None = 30.0):
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self._https, self._host, self._port = u.scheme == "https", u.hostname, u.port
        self._prefix = u.path.rstrip("/")
        self.headers = dict(headers or {})
        self.timeout = timeout

    def _open(self, method: str, path: str, params: Mapping[str, Any] | None, json: Any,
              timeout: float | None) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        target = self._prefix + path
        if params:
            target += "?" + urlencode([(k, _query_value(v)) for k, v in params.items()])
        headers = {"Accept": "application/json", **self.headers}
        body = None
        if json is not None:
            body = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            headers["Content-Type"] = "application/json"
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = kind(self._host, self._port, timeout=timeout)
        try:
            conn.request(method, target, body=body, headers=headers)
            return conn, conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise TransportError(f"{type(e).__name__}: {e}") from e

    def request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None, json: Any = None,
                timeout: float | None = None) -> Response:
        conn, raw = self._open(method, path, params, json, self.timeout if timeout is None else timeout)
        try:
            return Response(raw, raw.read())
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(f"{type(e).__name__}: {e}") from e
        finally:
            conn.close()

    @contextmanager
    def stream(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
               timeout: float | None = None) -> Iterator[Response]:
        conn, raw = self._open(method, path, params, None, timeout)
        try:
            yield Response(raw)
        except (OSError, http.client.HTTPException) as e:
            raise TransportError(f"{type(e).__name__}: {e}") from e
        finally:
            conn.close()
