"""Where the store's URL comes from, and which of the plane's variables are secret.

A PostgreSQL URL may carry the password of the plane's database account, which reads every job's
environment (their secrets) and may write an admin token. So the URL never goes where another
account can read it (`resolve` takes it from one of these, in this order):

- `--db URL` on the command line only without a password: `/proc/<pid>/cmdline` is readable by
  every account. One with a password is refused (`has_password`), saying where to put it;
- `--db-file PATH`: a regular file of the plane's own account, not a link, that no group or other
  account may read or write (0600 or less, as libpq asks of `~/.pgpass`): `read_url_file`;
- `YARD_DB_URL` in the plane's environment (systemd's `EnvironmentFile=`, itself 0600):
  `/proc/<pid>/environ` is its owner's only, and `yard up` takes it out of its own environment
  once read, so no process the plane starts inherits it.

A URL without a password may also leave the password to libpq: `PGPASSWORD`, `~/.pgpass`
(`PGPASSFILE`). `SECRET_VARS` names the plane's variables that hold credentials: none reaches a
job (jobs get an allow-list, backends/local/login_env.py) nor an operator's check or remediation
command (`control/health/checks.py`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit, urlunsplit

ENV_VAR = "YARD_DB_URL"
SCHEMES = ("postgresql://", "postgresql+psycopg://", "sqlite:///")
# The plane's variables that hold a credential: the store's (libpq's own included) and the CLI's token.
SECRET_VARS = frozenset({ENV_VAR, "DATABASE_URL", "PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE", "YARD_TOKEN"})
MAX_FILE_BYTES = 8192
WHERE_TO_PUT_IT = (f"put the URL in a file only the plane's account can read (chmod 600) and give --db-file FILE, "
                   f"or set {ENV_VAR} in the plane's environment, or keep the password out of the URL "
                   f"(libpq's ~/.pgpass or PGPASSWORD)")


class UrlError(ValueError):
    """A store URL, or the file holding one, that `yard up` refuses; the message names the option."""


def has_password(url: str) -> bool:
    """Whether `url` carries a password: `scheme://user:password@host/…` or libpq's `?password=`."""
    parts = urlsplit(url)
    try:
        in_netloc = bool(parts.password)
    except ValueError:  # a malformed netloc: look for "user:…@" by hand
        userinfo = parts.netloc.rpartition("@")[0]
        in_netloc = ":" in userinfo and bool(userinfo.split(":", 1)[1])
    return in_netloc or any(k.lower() == "password" for k in parse_qs(parts.query, keep_blank_values=True))


def redacted(url: str) -> str:
    """`url` with its password (in the user part or the query) shown as ***: safe to print."""
    parts = urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    if at and ":" in user:
        user = user.split(":", 1)[0] + ":***"
    query = "&".join("password=***" if q.split("=", 1)[0].lower() == "password" else q
                     for q in parts.query.split("&")) if parts.query else ""
    return urlunsplit((parts.scheme, f"{user}{at}{host}", parts.path, query, parts.fragment))


def read_url_file(path: str) -> str:
    """The URL in the file `path` (one line; blank lines and `#` comments are skipped).

    Raises:
        UrlError: the file is missing, a link, not a regular file, not the plane's account's, open
            to its group or others, over MAX_FILE_BYTES, or does not hold exactly one URL.
    """
    where = f"--db-file {path}"
    try:  # never through a link, never waiting on a FIFO
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as e:
        if os.path.islink(path):
            raise UrlError(f"{where}: is a symbolic link; give the file itself") from e
        raise UrlError(f"{where}: cannot open: {e.strerror}") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UrlError(f"{where}: not a regular file")
        if st.st_uid != os.geteuid():
            raise UrlError(f"{where}: belongs to uid {st.st_uid}, not to the account the plane runs as "
                           f"(uid {os.geteuid()}): whoever owns it chooses the plane's store")
        if st.st_mode & 0o077:
            raise UrlError(f"{where}: mode {stat.S_IMODE(st.st_mode):04o} lets its group or others at it; "
                           f"chmod 600 {path}")
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise UrlError(f"{where}: over {MAX_FILE_BYTES} bytes; it should hold one URL")
    lines = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines()]
    urls = [ln for ln in lines if ln and not ln.startswith("#")]
    if len(urls) != 1:
        raise UrlError(f"{where}: expected one URL (one line), found {len(urls)}")
    return urls[0]


def resolve(db: str | None, db_file: str | None, environ: Mapping[str, str]) -> str | None:
    """The store URL from `--db`, `--db-file` or YARD_DB_URL (module docstring); None: SQLite in
    the data dir.

    Raises:
        UrlError: both options given, a password in `--db`, a file `read_url_file` refuses, or a
            URL that is neither postgresql:// nor sqlite:///.
    """
    if db is not None and db_file is not None:
        raise UrlError("--db and --db-file: give one of them")
    if db is not None:
        source, url = "--db", db
        if has_password(db):
            raise UrlError(f"--db: the URL holds a password, which every account on this machine can read on "
                           f"the command line (/proc/<pid>/cmdline); {WHERE_TO_PUT_IT}")
    elif db_file is not None:
        source, url = f"--db-file {db_file}", read_url_file(db_file)
    elif environ.get(ENV_VAR):
        source, url = ENV_VAR, environ[ENV_VAR]
    else:
        return None
    if not url.startswith(SCHEMES):
        raise UrlError(f"{source}: expected a postgresql:// or sqlite:/// URL, got {redacted(url)!r}")
    return url
