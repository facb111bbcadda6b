"""The rank runner's side of a container (`rank_runner.py` loads this file by path in container mode).

Standard library only, like the runner: it runs with `python -I -S` as root.

The plan (attempt.json's `contain[<rank>].container`, made by the local backend):

    bundle   runc's bundle dir (root's, 0711): config.json (0600), rootfs/ (the overlay's mount
             point), rw/ (root's, 0700: upper/ and work/ of the overlay, so the job's writes to /
             never reach the node's cache and no one else reaches them), mnt/ (staging points)
    id       the container's name for runc; state: runc's --root (in the run dir); log: runc's log
    layers   the image's layer dirs, lowest first; lock: the cache entry's lock file
    binds    [{src, stage}]: sources the owner controls (workdir, home, --container-mounts),
             opened AS THE OWNER and bound on `stage`, which config.json names

In the forked child, after it joined the rank's cgroups, `enter` unshares a mount namespace,
makes / a slave (nothing mounted here reaches the host), mounts the overlay (nosuid, nodev) on
rootfs/ and binds each owner-controlled source on its staging point; the child then executes
`runc run --detach` (`runc_argv`), still root: runc takes the owner's identity from config.json.
Why as the owner: the kernel checks the owner's access on every step of the path when the source
is opened (seteuid), so a mount never shows what the owner could not reach on the host, and a link
swapped in after the submission changes nothing (what is bound is what was opened). A directory
needs read and search rights, a file read rights, as the owner; else the launch fails naming it.
"""

from __future__ import annotations

import ctypes
import fcntl
import os

CLONE_NEWNS = 0x20000
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_SLAVE = 0x2, 0x4, 0x1000, 0x4000, 0x80000
LOG_TAIL = 4096  # what of runc's log an error message quotes, at most


class StartError(Exception):
    """The container cannot be set up; the message names what and why (one line)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _call(libc: ctypes.CDLL, name: str, *args: object) -> None:
    if getattr(libc, name)(*args) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{name}: {os.strerror(e)}")


def hold_image(ctr: dict) -> int:
    """A shared flock on the image's cache entry, held by the runner while the container runs
    (eviction takes an exclusive one without waiting, and skips an entry in use); returns the fd.

    Raises:
        StartError: the entry is being removed, or a layer is gone.
    """
    try:
        fd = os.open(ctr["lock"], os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        raise StartError(f"image {ctr.get('image', '')}: its cache entry's lock {ctr['lock']}: {e.strerror}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        raise StartError(f"image {ctr.get('image', '')} is being removed from this node's cache") from e
    for layer in ctr["layers"]:
        if not os.path.isdir(layer):
            os.close(fd)
            raise StartError(f"image {ctr.get('image', '')}: layer {layer} is gone from this node's cache")
    return fd


def _open_as(owner: dict | None, path: str) -> int:
    """An fd of `path` opened with the owner's rights (seteuid and back), with read (and, for a
    directory, search) access checked as the owner too.

    Raises:
        StartError: the owner cannot reach or read it (or it is neither a file nor a directory).
    """
    groups, egid = os.getgroups(), os.getegid()
    if owner is not None:
        os.setgroups([int(g) for g in owner.get("groups") or [owner["gid"]]])
        os.setegid(int(owner["gid"]))
        os.seteuid(int(owner["uid"]))
    who = (owner or {}).get("user", "the plane's account")
    try:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError as e:
            raise StartError(f"cannot mount {path} as {who}: {e.strerror}") from e
        import stat

        mode = os.fstat(fd).st_mode
        need = os.R_OK | os.X_OK if stat.S_ISDIR(mode) else os.R_OK
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)) or not os.access(f"/proc/self/fd/{fd}", need,
                                                                               effective_ids=True):
            os.close(fd)
            what = "not a file or directory" if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)) else "Permission denied"
            raise StartError(f"cannot mount {path} as {who}: {what}")
        return fd
    finally:
        if owner is not None:
            os.seteuid(0)
            os.setegid(egid)
            os.setgroups(groups)


def enter(ctr: dict, owner: dict | None) -> None:
    """In the forked child (root, in the rank's cgroups): the mount namespace, the overlay and the
    owner's binds (see the module docstring).

    Raises:
        StartError: a source the owner cannot reach; OSError: a mount failed.
    """
    libc = _libc()
    _call(libc, "unshare", CLONE_NEWNS)
    _call(libc, "mount", None, b"/", None, MS_REC | MS_SLAVE, None)
    # Every source first, as the owner, before anything is mounted (a source may lie below a
    # path this namespace is about to cover).
    opened = [(_open_as(owner, b["src"]), b["stage"]) for b in ctr.get("binds") or []]
    layers = list(reversed(ctr["layers"]))  # overlay: the first lowerdir is the top
    common = os.path.commonpath(layers) if len(layers) > 1 else os.path.dirname(layers[0])
    os.chdir(common)  # relative lowerdirs: many layers still fit in one page of mount options
    rw = os.path.join(ctr["bundle"], "rw")
    opts = "lowerdir={},upperdir={},workdir={}".format(
        ":".join(os.path.relpath(p, common) for p in layers), os.path.join(rw, "upper"), os.path.join(rw, "work"))
    try:
        _call(libc, "mount", b"overlay", os.path.join(ctr["bundle"], "rootfs").encode(), b"overlay",
              MS_NOSUID | MS_NODEV, opts.encode())
    finally:
        os.chdir("/")
    for fd, stage in opened:
        import stat

        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(stage, 0o700)
        else:
            os.close(os.open(stage, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
        _call(libc, "mount", f"/proc/self/fd/{fd}".encode(), stage.encode(), None, MS_BIND | MS_REC, None)
        os.close(fd)


def make_targets(ctr: dict) -> None:
    """With --container-remap-root: make the mount points runc's init, root only in its user
    namespace (the owner outside), could not make in the image's root-owned directories. Each
    entry of the bundle's targets.json is [where, path, is_dir]: `where` "tmp" (the private /tmp) or "root" (the
    overlay); made by root here, walking with no link followed (an image's link on the way
    fails the start, it never leads out of the image).

    Raises:
        OSError: a mount point cannot be made (the message names it).
    """
    import json

    try:
        with open(os.path.join(ctr["bundle"], "targets.json"), "rb") as f:  # the plane's, root's 0600
            want = json.loads(f.read(1 << 20))
    except FileNotFoundError:
        return
    bases = {"root": os.path.join(ctr["bundle"], "rootfs"), "tmp": want.get("tmp") or ""}
    for where, path, is_dir in want.get("targets") or []:
        parts = [p for p in path.split("/") if p]
        fd = os.open(bases[where], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for i, part in enumerate(parts):
                last = i == len(parts) - 1
                try:
                    if last and not is_dir:
                        os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                                         0o644, dir_fd=fd))
                        break
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                if not last:
                    try:
                        nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                    except OSError as e:
                        raise OSError(e.errno, f"cannot make the mount point {path} in the image: "
                                               f"{'/'.join(parts[: i + 1])} is a link or not a directory") from e
                    os.close(fd)
                    fd = nxt
        finally:
            os.close(fd)


def runc_argv(ctr: dict) -> list[str]:
    return [ctr["runc"], "--root", ctr["state"], "--log", ctr["log"], "run", "--detach",
            "--pid-file", os.path.join(ctr["bundle"], "pid"), "--bundle", ctr["bundle"], ctr["id"]]


def runc_env() -> dict[str, str]:
    """runc's environment: nothing of the job's (the job's is in config.json) nor the plane's."""
    return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


def container_pid(ctr: dict) -> int:
    """The container's process, from runc's pid file (runc has exited 0)."""
    with open(os.path.join(ctr["bundle"], "pid")) as f:
        return int(f.read(64).strip())


def failure(ctr: dict, status: int) -> tuple[str, bool]:
    """(one line saying why runc could not start the container, whether the command was not found)."""
    how = f"runc exited {os.WEXITSTATUS(status)}" if os.WIFEXITED(status) else f"runc killed by signal {os.WTERMSIG(status)}"
    last = ""
    try:
        with open(ctr["log"], "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - LOG_TAIL))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
        for line in reversed(lines):
            if '"level":"error"' in line or "level=error" in line:
                last = _message(line)
                break
    except OSError:
        pass
    not_found = "executable file not found" in last or "no such file or directory" in last.lower() and "exec" in last
    return (f"the container did not start ({how}): {last}" if last else f"the container did not start ({how})"), not_found


def _message(line: str) -> str:
    import json

    try:
        return str(json.loads(line).get("msg", line))[:1000]
    except ValueError:
        return line[:1000]


def delete(ctr: dict) -> str:
    """`runc delete --force`: the container's state and nested cgroups go; "" or runc's complaint."""
    import subprocess

    try:
        done = subprocess.run([ctr["runc"], "--root", ctr["state"], "delete", "--force", ctr["id"]],
                              env=runc_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    err = done.stderr.decode(errors="replace").strip()
    return "" if done.returncode == 0 or "does not exist" in err else err[-1000:]
