"""Work done as the job's owner: a forked child that has taken the owner's groups, gid and uid
(`as_owner`), and what the plane asks it to do in the owner's working directory."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import stat
import time
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any, Protocol, TypeVar

from trainyard.jobfs.tree import Refused, _step

T = TypeVar("T")
OWNER_TIMEOUT_S = 10.0


class Account(Protocol):
    """Who a job runs as (`backends.base.Owner` is one). Read only, so that a frozen dataclass fits."""

    @property
    def uid(self) -> int: ...

    @property
    def gid(self) -> int: ...

    @property
    def groups(self) -> tuple[int, ...]: ...


# -- the owner's side ------------------------------------------------------------------------------


def plane_acts_for(owner: Account | None) -> bool:
    """Whether work for `owner` must be done in a child that becomes it: the plane is root and the
    owner is another account (a plane that is not root runs every job as itself)."""
    return owner is not None and os.geteuid() == 0 and owner.uid != 0


def as_owner(owner: Account | None, fn: Callable[..., T], *args: Any, timeout_s: float = OWNER_TIMEOUT_S) -> T:
    """`fn(*args)` with the owner's identity: in a forked child that has set the owner's groups,
    gid and uid before calling it, so the kernel checks every path as it would for the owner. Its
    result (JSON-able) comes back through a pipe; an OSError it raised is raised here with its
    errno and message, anything else as `OSError(EIO)`. Called directly when the plane does not act
    for someone else (`plane_acts_for`).

    The child only makes system calls through `os` (no lock of another thread can hold it), and is
    killed after `timeout_s`: a hung mount or a FIFO in the owner's path never holds the plane.

    Raises:
        TimeoutError: the child did not finish in time.
        OSError: what `fn` raised.
    """
    if not plane_acts_for(owner):
        return fn(*args)
    assert owner is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become the owner, do it, say how it went, exit without cleanup
        out: dict[str, Any]
        try:
            os.close(r)
            try:
                os.setgroups(list(owner.groups) or [owner.gid])
                os.setgid(owner.gid)
                os.setuid(owner.uid)
            except (OSError, ValueError, OverflowError) as e:  # no such ids, or the kernel refused them
                out = {"identity": getattr(e, "errno", None) or errno.EINVAL, "strerror": getattr(e, "strerror", None) or str(e)}
            else:
                out = {"ok": fn(*args)}
        except Refused as e:
            out = {"refused": [e.filename, e.strerror, e.errno]}
        except OSError as e:
            out = {"errno": e.errno, "strerror": e.strerror or str(e), "filename": e.filename}
        except BaseException as e:  # noqa: BLE001 - reported to the parent, never raised here
            out = {"error": f"{type(e).__name__}: {e}"}
        try:
            os.write(w, json.dumps(out).encode()[:1 << 16])
        finally:
            os._exit(0)
    os.close(w)
    body: bytes | None = None  # (bound before the read: a read that raises still ends the child)
    try:
        body = _read_until(r, time.monotonic() + timeout_s)
    finally:
        os.close(r)
        if body is None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.waitpid(pid, 0)
    if body is None:
        raise TimeoutError(errno.ETIMEDOUT, f"no answer in {timeout_s:g} s working as uid {owner.uid}")
    try:
        out = json.loads(body)
    except ValueError:
        raise OSError(errno.EIO, "the child working as the owner ended without an answer") from None
    if "ok" in out:
        return out["ok"]
    if "refused" in out:
        filename, why, code = out["refused"]
        raise Refused(filename, why, code)
    if "errno" in out:
        raise OSError(out["errno"], out["strerror"], out["filename"])
    if "identity" in out:
        who = getattr(owner, "user", None) or f"uid {owner.uid}"
        raise OSError(out["identity"], f"cannot run as {who} (uid {owner.uid}): {out['strerror']}")
    raise OSError(errno.EIO, out.get("error", "failed"))


def _read_until(fd: int, deadline: float) -> bytes | None:
    """Everything from `fd` until EOF, or None when `deadline` passes first."""
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def lstat_way(base: str | os.PathLike[str], rel: str | os.PathLike[str]) -> list[int | str | None]:
    """For each step of `base/rel` below `base`: its st_mode (lstat: a link is a link), the
    error's text, or None for the first missing one (the list ends there). Meant to run as the
    owner (`as_owner`), so it shows what the owner may see."""
    out: list[int | str | None] = []
    here = os.fspath(base)
    for part in PurePosixPath(os.fspath(rel)).parts:
        here = os.path.join(here, part)
        try:
            out.append(os.lstat(here).st_mode)
        except FileNotFoundError:
            out.append(None)
            break
        except OSError as e:
            out.append(e.strerror or str(e))
            break
    return out


def enter_problem(workdir: str | os.PathLike[str]) -> str | None:
    """Why the caller cannot work in directory `workdir` ("does not exist", "is not a directory",
    "Permission denied"), or None when it can enter it. Meant to run as the owner (`as_owner`):
    the kernel's own answer, whatever the modes and ACLs on the way."""
    try:
        st = os.stat(workdir)
    except FileNotFoundError:
        return "does not exist"
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if not os.access(workdir, os.X_OK):
        return "Permission denied"
    return None


def cannot_enter(owner: Account | None, workdir: str, timeout_s: float = OWNER_TIMEOUT_S) -> str | None:
    """Why `owner` (None: the plane's own account) cannot enter `workdir`, asked as the owner
    (`enter_problem` in `as_owner`), as a sentence for a launch's error; None when it can."""
    try:
        problem = as_owner(owner, enter_problem, workdir, timeout_s=timeout_s)
    except OSError as e:
        problem = e.strerror or str(e)
    if problem is None:
        return None
    who = getattr(owner, "user", None) or "the plane's account"
    return f"cannot enter the working directory {workdir!r} as {who}: {problem}"


def link_inside(workdir: str | os.PathLike[str], rel: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Make `workdir/rel` a symbolic link to `target`, making the directories of `rel` as needed;
    an older link there is replaced, anything else is left alone. Meant to run as the owner
    (`as_owner`): then the kernel decides what may be made where; the way below the working
    directory is still walked through no link, so the link lands inside it.

    Raises:
        Refused: a part of the way is a link or not a directory, or the name is taken.
        OSError: the file system refused (no space, no permission, ...).
    """
    parts = PurePosixPath(os.fspath(rel)).parts
    if not parts or parts[0] == "/" or any(p in ("", ".", "..") for p in parts):
        raise Refused(rel, "not a path inside the working directory")
    fd = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o777, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = _step(fd, part, None, rel)
            os.close(fd)
            fd = nxt
        name = parts[-1]
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISLNK(st.st_mode):
            raise Refused(rel, "exists and is not a link; not replaced")
        if st is not None:
            os.unlink(name, dir_fd=fd)
        os.symlink(os.fspath(target), name, dir_fd=fd)
    finally:
        os.close(fd)


def place_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a link could not be made at absolute `path` (`link_at`), or None: the name is taken by
    what is not a link, or the deepest directory of the way that exists is not one its caller may
    write in. Meant to run as the owner (`as_owner`): the owner's own view, links and all."""
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return f"cannot look at {p}: {e.strerror or e}"
    if st is not None:
        return None if stat.S_ISLNK(st.st_mode) else f"{p} exists and is not a link; only a link is replaced"
    here = os.path.dirname(p)
    while not os.path.lexists(here):
        if here == os.path.dirname(here):
            break
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        return f"{here} is not a directory"
    if not os.access(here, os.W_OK | os.X_OK):
        return f"{here}: Permission denied"
    return None


def link_at(path: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Make absolute `path` a symbolic link to `target`, making missing directories on the way
    (mode 0777 less the umask) and replacing an older link there, nothing else. Meant to run as the
    owner (`as_owner`): then the owner's rights alone decide where (as Slurm writes a job's output
    anywhere its user may), and links on the way are followed as the owner would follow them.

    Raises:
        Refused: the name is taken by what is not a link.
        OSError: no permission, no space, ...
    """
    p = os.fspath(path)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISLNK(st.st_mode):
        raise Refused(p, "exists and is not a link; not replaced")
    if st is not None:
        os.unlink(p)
    os.symlink(os.fspath(target), p)
