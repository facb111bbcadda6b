"""The CLI's HTTP client: finds the server and the token, turns API errors into exit codes.

Where to connect: `YARD_URL` and `YARD_TOKEN`, or else the local data dir's `server.json` (written by
`yard up`); the token, when `YARD_TOKEN` is not set, is the one `yard login` kept for that URL
(`cli/token_file.py`), else the data dir's `admin.token` (the data dir is `YARD_DATA_DIR`, default
`~/.trainyard`).

Exit codes: 2 for anything the server rejects as bad input (4xx), naming the field; 1 when the
server cannot be reached or fails (5xx).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterator, NoReturn

import typer

from trainyard.cli.common import EXIT_BAD_INPUT
from trainyard.cli.http import HttpClient, Response, TransportError
from trainyard.cli.safe_text import clean
from trainyard.contracts import JobDir
from trainyard.defaults import DEFAULT_PORT, default_data_dir

EXIT_UNAVAILABLE = 1


def _die(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {clean(message)}", err=True)  # API errors quote what was sent: other people's text too
    raise typer.Exit(code)


def server_url() -> str:
    if os.environ.get("YARD_URL"):
        return os.environ["YARD_URL"].rstrip("/")
    info = default_data_dir() / "server.json"
    try:
        return json.loads(info.read_text())["url"].rstrip("/")
    except (OSError, ValueError, KeyError):
        return f"http://127.0.0.1:{DEFAULT_PORT}"


def token() -> str | None:
    """`YARD_TOKEN`, else the token `yard login` kept for this plane (`cli/token_file.py`), else the
    data dir's `admin.token` (the plane's own account)."""
    if os.environ.get("YARD_TOKEN"):
        return os.environ["YARD_TOKEN"].strip()
    from trainyard.cli import token_file

    kept = token_file.read(server_url())
    if kept:
        return kept
    path = default_data_dir() / "admin.token"
    try:
        return path.read_text().strip()
    except OSError:
        return None


def error_field(r: Response) -> str | None:
    """The field an API error names (a 400's `field`, a 422's first location), if any."""
    try:
        body = r.json()
    except ValueError:
        return None
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        loc = [str(x) for x in detail[0].get("loc", []) if x not in ("body", "query", "path")]
        return loc[0] if loc else None
    field = body.get("field") if isinstance(body, dict) else None
    return field if isinstance(field, str) else None


def error_message(r: Response) -> str:
    """One line from an API error: the field it names, then the message."""
    try:
        body = r.json()
    except ValueError:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    detail = body.get("detail") if isinstance(body, dict) else body
    if isinstance(detail, list) and detail:  # request validation (422): name the field
        d = detail[0]
        loc = [str(x) for x in d.get("loc", []) if x not in ("body", "query", "path")]
        field = ".".join(loc)
        return f"{'field ' + repr(field) + ': ' if field else ''}{d.get('msg', '')}"
    named = body.get("field") if isinstance(body, dict) else None
    return f"{'field ' + repr(named) + ': ' if named else ''}{detail}"


def _detail(r: Response) -> str | None:
    """A 5xx's own one-line message (`{"detail": "..."}`), if it has one."""
    try:
        body = r.json()
    except ValueError:
        return None
    detail = body.get("detail") if isinstance(body, dict) else None
    return detail.splitlines()[0][:500] if isinstance(detail, str) and detail.strip() else None


BUSY_RETRY_S = 30.0


def _retry_after(r: Any) -> float | None:
    """The pause a 503 asks for (Retry-After in seconds, at most 5), or None: not a busy answer."""
    if r.status_code != 503:
        return None
    try:
        return min(5.0, max(0.1, float(r.headers.get("retry-after", ""))))
    except ValueError:
        return None


class Client:
    def __init__(self, url: str | None = None, tok: str | None = None, timeout: float = 30.0):
        self.url = url or server_url()
        headers = {"Authorization": f"Bearer {tok or token() or ''}"}
        try:
            self.http = HttpClient(self.url, headers=headers, timeout=timeout)
        except ValueError as e:
            _die(f"YARD_URL: {e}", EXIT_BAD_INPUT)

    def request(self, method: str, path: str, where: dict[str, str] | None = None, **kw: Any) -> Any:
        """One API call, its JSON or text (`response` has the details). `where`: field → where the
        user gave it (`script.sh:4`, an #SBATCH line), put before a refusal that names the field."""
        r = self.response(method, path, where=where, **kw)
        ctype = r.headers.get("content-type", "")
        return r.json() if ctype.startswith("application/json") else r.text

    def page(self, path: str, **kw: Any) -> Any:
        """A GET whose raw response is wanted (bytes and headers: a page of a log)."""
        return self.response("GET", path, **kw)

    def response(self, method: str, path: str, where: dict[str, str] | None = None, **kw: Any) -> Any:
        """One API call's response; a 503 with Retry-After (the plane is busy: api/admission.py) is
        retried after the pause it asks for, for up to BUSY_RETRY_S in all, as a person would; an
        error ends the command (exit 2 for the caller's mistake, 1 when the server failed)."""
        waited = 0.0
        while True:
            try:
                r = self.http.request(method, path, **kw)
            except TransportError as e:
                _die(f"cannot reach the trainyard server at {self.url} ({type(e).__name__}); "
                     "is `yard up` running? (set YARD_URL)", EXIT_UNAVAILABLE)
            pause = _retry_after(r)
            if pause is None or waited + pause > BUSY_RETRY_S:
                break
            time.sleep(pause)
            waited += pause
        if r.status_code >= 500:
            said = _detail(r)  # a registry down behind the plane (502) says so; a crash says nothing
            _die(f"server error at {path}: HTTP {r.status_code}" + (f": {said}" if said else ""), EXIT_UNAVAILABLE)
        if r.status_code >= 400:
            given = (where or {}).get(error_field(r) or "")
            _die(f"{given}: {error_message(r)}" if given else error_message(r), EXIT_BAD_INPUT)
        return r

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw)

    def put(self, path: str, **kw: Any) -> Any:
        return self.request("PUT", path, **kw)

    def patch(self, path: str, **kw: Any) -> Any:
        return self.request("PATCH", path, **kw)

    def delete(self, path: str, **kw: Any) -> Any:
        return self.request("DELETE", path, **kw)

    def stream(self, path: str, params: dict[str, Any]) -> Iterator[str]:
        try:
            with self.http.stream("GET", path, params=params, timeout=None) as r:
                if r.status_code >= 400:
                    r.read()
                    _die(error_message(r), EXIT_BAD_INPUT if r.status_code < 500 else EXIT_UNAVAILABLE)
                yield from r.iter_text()
        except TransportError as e:
            _die(f"lost the trainyard server at {self.url} ({type(e).__name__})", EXIT_UNAVAILABLE)


def data_dir_of(value: str | None) -> Path:
    return Path(value) if value else default_data_dir()


def local_job_dir(data_dir: Path, job: dict) -> JobDir:
    """A job's directory (`contracts.JobDir`) under a local data dir, by the name the API gives
    (`job_dir` of `GET /api/v1/jobs/{id}`: keyed, see there); a job shown without it (a reader
    who may not see it) by its id alone, the layout of jobs stored before keys."""
    name = Path(job["job_dir"]).name if job.get("job_dir") else str(job["id"])
    return JobDir(Path(data_dir) / "jobs" / name)
