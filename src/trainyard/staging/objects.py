"""Object-store sources (`s3://bucket/key`) through fsspec and s3fs, with the plane's settings of
the store that covers the URL (`staging.types.ObjectStore`).

A URL names one object (a file source) or a prefix (a directory source: every object under
`prefix/`, each key below it a relative path). Keys that are not clean relative paths (`a//b`,
`../x`, `./y`) are refused, since they would name something outside the copy; "directory marker"
objects (a key ending in `/`) are not files and are skipped.

A directory's objects are read PARALLEL at a time (`each`), each streamed in CHUNK pieces.

Time: one request waits at most `timeout_s` to connect and `timeout_s` for each read (botocore's
`connect_timeout`/`read_timeout`), so a stalled server fails the read rather than holding it;
s3fs retries what it deems transient first. Each call makes its own filesystem object
(`skip_instance_cache`, no listings cache): a dataset's listing is never stale, and a credential
changed in the configuration applies at the next read. They share one botocore session per
process (`session`): a new session parses botocore's S3 models again (megabytes of JSON, in one
hold of the GIL), which on a loaded plane starved its API for seconds each time; the credentials
are each client's own, never the session's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from trainyard.staging.local_tree import MAX_FILES

CHUNK = 8 << 20
PREFIX = "s3://"
PARALLEL = 8  # objects of a directory source read at once (each in CHUNK pieces: memory stays bounded)
T = TypeVar("T")


class BadKey(Exception):
    """An object key under a directory source that is not a clean relative path, or too many keys."""


def clean_rel(rel: str) -> bool:
    """Whether `rel` is a relative path with no empty, `.` or `..` part (stays below its base)."""
    return all(p not in ("", ".", "..") for p in rel.split("/"))


def is_url(source: str) -> bool:
    return source.startswith(PREFIX)


_session_lock = threading.Lock()
_session: Any = None


def session() -> Any:
    """The process's one botocore (aiobotocore) session: its models are parsed once."""
    global _session
    with _session_lock:
        if _session is None:
            import aiobotocore.session  # type: ignore[import-untyped]  # with s3fs: loaded when a store is used

            _session = aiobotocore.session.AioSession()
        return _session


def filesystem(options: dict[str, object], timeout_s: float) -> Any:
    """An s3fs filesystem with a store's options (`ObjectStore.fsspec_options()`), on the shared session."""
    import fsspec  # type: ignore[import-untyped]

    config = {"connect_timeout": min(timeout_s, 60.0), "read_timeout": timeout_s,
              "retries": {"max_attempts": 3, "mode": "standard"}}
    return fsspec.filesystem("s3", skip_instance_cache=True, use_listings_cache=False, config_kwargs=config,
                             session=session(), **options)


def _path(url: str) -> str:
    return url[len(PREFIX):].rstrip("/")


def listing(fs: Any, url: str) -> tuple[str, list[tuple[str, str, int]]]:
    """What `url` is: ("file", [("", path, size)]) or ("dir", [(rel, path, size), ...] sorted by rel).

    Raises:
        FileNotFoundError, PermissionError, OSError: as s3fs raises them.
        BadKey: a key below a directory that is no clean relative path, or more than MAX_FILES keys.
    """
    path = _path(url)
    info = fs.info(path)
    if info.get("type") == "file":
        return "file", [("", path, int(info.get("size") or 0))]
    found = fs.find(path, detail=True)
    out: list[tuple[str, str, int]] = []
    base = path + "/"
    for name, meta in found.items():
        if meta.get("type") != "file" or name.endswith("/") or not name.startswith(base):
            continue
        rel = name[len(base):]
        if not clean_rel(rel):
            raise BadKey(f"{PREFIX}{name}: an object key that is not a clean relative path below {url}")
        out.append((rel, name, int(meta.get("size") or 0)))
        if len(out) > MAX_FILES:
            raise BadKey(f"{url}: more than {MAX_FILES:,} objects")
    if not out:
        raise FileNotFoundError(url)
    out.sort(key=lambda x: x[0].encode())
    return "dir", out


def read_object(fs: Any, path: str, sink: Callable[[bytes], None]) -> int:
    """Stream object `path` into `sink` in CHUNK-sized ranged reads; the bytes read."""
    n = 0
    with fs.open(path, "rb", block_size=CHUNK, cache_type="none") as fh:
        while True:
            data = fh.read(CHUNK)
            if not data:
                return n
            n += len(data)
            sink(data)


def each(items: Iterable[T], fn: Callable[[T], None], parallel: int = PARALLEL) -> None:
    """`fn(item)` for every item, `parallel` at a time (a directory of many small objects is a
    round trip each); the first failure is raised once the reads in flight have ended, and the
    reads not yet started are dropped."""
    todo = list(items)
    if len(todo) <= 1 or parallel <= 1:
        for item in todo:
            fn(item)
        return
    with ThreadPoolExecutor(max_workers=min(parallel, len(todo)), thread_name_prefix="s3-read") as pool:
        futures = [pool.submit(fn, item) for item in todo]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((f for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:
            for f in futures:
                f.cancel()
            wait(futures)
            raise failed.exception()  # type: ignore[misc]
