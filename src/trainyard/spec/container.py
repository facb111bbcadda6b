"""A job's container, as pyxis's `--container-*` options ask for it (docs/control-plane.md,
"Environment images").

`ContainerOptions` is what the job stores (`jobs.container`, a JSON record) and what the loop
hands a backend (`backends.base.ContainerLaunch`). Defaults are pyxis's with enroot's stock
configuration, except the root file system: writable here (`--container-readonly` turns it
read-only), because a job's writes go to an upper layer of its own, never to the node's cache.

Standard library only: the CLI reads these options without the model stack (tests/test_architecture.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainyard.spec.container_mounts import Mount


@dataclass(frozen=True)
class ContainerOptions:
    """One job's container. `image` is the image as normalised (`ImageRef.canonical()`), with the
    user's `USER@` prefix kept out (credentials come from the configuration)."""

    image: str
    mounts: tuple[Mount, ...] = ()
    workdir: str | None = None  # --container-workdir; None: the job's workdir (mounted at the same path)
    env: tuple[str, ...] = ()  # --container-env: names whose host value wins over the image's
    mount_home: bool = False  # --[no-]container-mount-home (enroot's ENROOT_MOUNT_HOME=n)
    writable: bool = True  # --container-writable / --container-readonly
    entrypoint: bool = False  # --[no-]container-entrypoint: run the image's ENTRYPOINT before the command
    remap_root: bool = False  # --container-remap-root: uid 0 inside, the owner outside (a user namespace)

    def to_record(self) -> dict[str, Any]:
        """The JSON record stored on the job (and read back by `from_record`)."""
        return {"image": self.image,
                "mounts": [{"src": m.src, "dst": m.dst, "read_only": m.read_only, "flags": list(m.flags)}
                           for m in self.mounts],
                "workdir": self.workdir, "env": list(self.env), "mount_home": self.mount_home,
                "writable": self.writable, "entrypoint": self.entrypoint, "remap_root": self.remap_root}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> ContainerOptions:
        return cls(image=str(rec["image"]),
                   mounts=tuple(Mount(m["src"], m["dst"], bool(m.get("read_only")), tuple(m.get("flags") or ()))
                                for m in rec.get("mounts") or ()),
                   workdir=rec.get("workdir"), env=tuple(rec.get("env") or ()),
                   mount_home=bool(rec.get("mount_home", False)), writable=bool(rec.get("writable", True)),
                   entrypoint=bool(rec.get("entrypoint", False)), remap_root=bool(rec.get("remap_root", False)))
