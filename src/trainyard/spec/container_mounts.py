"""A job's bind mounts, read as pyxis reads `--container-mounts` (its image: `image_ref.py`).

Mounts are pyxis's `SRC[:DST[:FLAGS]],…` with FLAGS joined by `+` (`ro+rprivate`); trainyard
takes absolute host paths only (no `tmpfs`/`umount` sources, no paths relative to the workdir).

Standard library only: the CLI parses this option without the model stack (tests/test_architecture.py).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

# pyxis's mount flags (enroot passes them to mount(8)): read-only or not, propagation, and the
# three security ones; `+` joins them
READ_FLAGS = frozenset({"ro", "rw"})
PROPAGATION = frozenset({"private", "rprivate", "slave", "rslave", "shared", "rshared"})
MOUNT_FLAGS = READ_FLAGS | PROPAGATION | {"nosuid", "nodev", "noexec"}


@dataclass(frozen=True)
class Mount:
    """One bind mount: host path `src` at `dst` in the container; `flags` are the others than ro/rw,
    in the order given (at most one propagation flag)."""

    src: str
    dst: str
    read_only: bool = False
    flags: tuple[str, ...] = ()

    def pyxis(self) -> str:
        """This mount as one entry of pyxis's `--container-mounts` (flags joined by `+`)."""
        flags = ("ro",) * self.read_only + self.flags
        return f"{self.src}:{self.dst}" + (":" + "+".join(flags) if flags else "")


def _check_path(path: str, what: str, entry: str, option: str) -> None:
    if not path.startswith("/"):
        if path in ("tmpfs", "umount"):
            why = "pyxis's special sources 'tmpfs' and 'umount' are not supported"
        elif path in MOUNT_FLAGS:
            why = "an absolute path is needed (a mount's flags are joined by '+': /data:/data:ro+rprivate)"
        else:
            why = "an absolute path is needed"
        raise ValueError(f"{option}: {what} {path!r} of {entry!r}: {why}")
    if any(c.isspace() or not c.isprintable() for c in path):
        raise ValueError(f"{option}: {what} {path!r} of {entry!r} holds white space or control characters")


def parse_mounts(raw: str, option: str = "--container-mounts") -> tuple[Mount, ...]:
    """pyxis's `SRC[:DST[:FLAGS]][,…]` as mounts, in order (DST defaults to SRC, as in pyxis; the
    same entry twice counts once, as in pyxis).

    Raises:
        ValueError: an empty entry, a relative path, a DST of `/` or with `..`, an unknown or
            conflicting flag, or two different mounts on one DST; the message names the entry.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"{option}: expected SRC:DST[:FLAGS][,SRC:DST...], e.g. /data:/data:ro; got {raw!r}")
    mounts: list[Mount] = []
    for entry in raw.split(","):
        parts = entry.split(":")
        if not entry or len(parts) > 3 or not all(parts[:2]):
            raise ValueError(f"{option}: bad entry {entry!r}: expected SRC[:DST[:FLAGS]] (flags joined by '+', "
                             "e.g. /data:/data:ro+rprivate)")
        src, dst, flag_text = parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2] if len(parts) > 2 else ""
        _check_path(src, "source", entry, option)
        _check_path(dst, "target", entry, option)
        if ".." in dst.split("/"):
            raise ValueError(f"{option}: target {dst!r} of {entry!r} has a '..' component")
        dst = posixpath.normpath(dst).replace("//", "/")
        if dst == "/":
            raise ValueError(f"{option}: target of {entry!r} is '/': a mount cannot replace the image's root")
        flags: list[str] = []
        for flag in flag_text.split("+") if flag_text else []:
            if flag not in MOUNT_FLAGS:
                raise ValueError(f"{option}: unknown flag {flag!r} in {entry!r}; pyxis's are "
                                 f"{', '.join(sorted(MOUNT_FLAGS))}")
            if flag not in flags:
                flags.append(flag)
        if READ_FLAGS <= set(flags):
            raise ValueError(f"{option}: {entry!r} is both 'ro' and 'rw'")
        if len(PROPAGATION & set(flags)) > 1:
            raise ValueError(f"{option}: {entry!r} has more than one propagation flag "
                             f"({', '.join(f for f in flags if f in PROPAGATION)})")
        mount = Mount(src, dst, "ro" in flags, tuple(f for f in flags if f not in READ_FLAGS))
        clash = next((m for m in mounts if m.dst == dst), None)
        if clash == mount:
            continue
        if clash is not None:
            raise ValueError(f"{option}: two mounts on {dst!r}: {clash.pyxis()!r} and {entry!r}")
        mounts.append(mount)
    return tuple(mounts)
