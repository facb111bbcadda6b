"""Where `yard login` keeps a person's tokens: one file, theirs alone, one token per plane URL.

    $XDG_CONFIG_HOME/trainyard/token   (else ~/.config/trainyard/token)
    {"tokens": {"http://127.0.0.1:8642": "ty_…", "https://yard.example.org": "ty_…"}}

The directory is made 0700 and the file 0600, written whole to a temporary file beside it and
renamed over it (a crash leaves the old file or the new one, never half of one). Like ssh with a
private key, a file that others may read or that is not the caller's own is not used (a warning
says why): a token is a password.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

MAX_BYTES = 1 << 20


def path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or ""
    root = Path(base) if base and os.path.isabs(base) else Path.home() / ".config"
    return root / "trainyard" / "token"


def _key(url: str) -> str:
    return url.rstrip("/")


def _load(warn: bool = True) -> dict[str, str]:
    p = path()
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        why = ("not a regular file" if not stat.S_ISREG(st.st_mode) else
               f"owned by uid {st.st_uid}, not you" if st.st_uid != os.geteuid() else
               f"readable by others (mode {stat.S_IMODE(st.st_mode):o}; chmod 600 it)" if st.st_mode & 0o077 else None)
        if why is not None:
            if warn:
                print(f"warning: not using {p}: {why}", file=sys.stderr)
            return {}
        data = os.read(fd, MAX_BYTES)
    finally:
        os.close(fd)
    try:
        tokens = json.loads(data).get("tokens", {})
    except (ValueError, AttributeError):
        if warn:
            print(f"warning: not using {p}: not the JSON `yard login` writes", file=sys.stderr)
        return {}
    return {k: v for k, v in tokens.items() if isinstance(k, str) and isinstance(v, str)} \
        if isinstance(tokens, dict) else {}


def read(url: str) -> str | None:
    """The token `yard login` stored for the plane at `url`, or None."""
    return _load().get(_key(url))


def _write(tokens: dict[str, str]) -> None:
    p = path()
    p.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(p.parent, 0o700)
    if not tokens:
        p.unlink(missing_ok=True)
        return
    import tempfile  # here: the CLI reads the file on every command, and writes it only at login

    fd, tmp = tempfile.mkstemp(prefix=".token.", dir=p.parent)  # 0600, O_EXCL
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump({"tokens": tokens}, fh, indent=1, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(p.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def save(url: str, token: str) -> Path:
    """Store `token` for `url` (replacing the one before); returns the file."""
    tokens = _load(warn=False)
    tokens[_key(url)] = token
    _write(tokens)
    return path()


def remove(url: str) -> str | None:
    """Forget the token for `url`; returns it, or None when there was none."""
    tokens = _load(warn=False)
    old = tokens.pop(_key(url), None)
    if old is not None:
        _write(tokens)
    return old
