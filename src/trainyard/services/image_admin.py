"""`yard image pull|ls|rm`: who may, which nodes, and how a pull's failure becomes a status
(the work itself is the plane's: `Plane.pull_image`, `image_entries`, `remove_image`).

Pulling and removing change every node's cache: admins only. Listing is a node view, as `yard
nodes` is for operators: admins and operators. A pull that cannot resolve its image is the
caller's 422 (no such image, or one the cache refuses) or the registry's 502 (unreachable, its
login refused); nothing was cached then.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from trainyard.contracts import expand_hostlist
from trainyard.images.types import REGISTRY_FAULTS, EntryInfo, ImagePullError
from trainyard.services.auth import Principal
from trainyard.services.config import ConfigVersion
from trainyard.services.errors import BadGateway, Forbidden, NotFound, ServiceError, Unprocessable
from trainyard.spec.image_ref import parse_image


def may_change(by: Principal) -> None:
    if not by.is_admin:
        raise Forbidden(f"only an admin pulls or removes images on the nodes (a {by.role} token)")


def may_list(by: Principal) -> None:
    if by.role not in ("admin", "operator"):
        raise Forbidden(f"the nodes' image caches are for admins and operators (a {by.role} token)")


def node_names(cfg: ConfigVersion, nodes: str | None) -> list[str]:
    """The configuration's nodes named by the hostlist `nodes` (None or empty: all of them).

    Raises:
        ServiceError: a malformed hostlist (field `nodes`). NotFound: a node the configuration lacks.
    """
    known = [n.name for n in cfg.nodes]
    if not nodes or not nodes.strip():
        return known
    try:
        asked = list(dict.fromkeys(expand_hostlist(nodes.strip())))
    except ValueError as e:
        raise ServiceError(f"nodes: {e}", field="nodes") from None
    unknown = [n for n in asked if n not in known]
    if unknown:
        raise NotFound(f"no node {unknown[0]!r} in the configuration", field="nodes")
    return asked


def image_of(raw: str) -> str:
    """An image as `--container-image` takes it, normalised; a malformed one is a 422 naming `image`."""
    try:
        return parse_image(raw, "image").canonical()
    except ValueError as e:
        raise Unprocessable(str(e), field="image") from None


def check_allowed(cfg: ConfigVersion, image: str) -> None:
    """An image no team may run is not pre-staged either: its registry must be in
    `allowed_registries` of the `images:` section when that list is not empty (a team's own list
    narrows it, so this is every registry any team may use).

    Raises:
        Forbidden: naming the registry and the rule (field `image`).
    """
    allowed = cfg.spec.images.allowed_registries
    registry = parse_image(image, "image").registry.lower()
    if allowed and registry not in allowed:
        raise Forbidden(f"registry {registry!r} is not allowed on this cluster (images.allowed_registries: "
                        f"{', '.join(allowed)})", field="image")


def target_of(raw: str) -> str:
    """`yard image rm`'s target: a digest (`sha256:` and 64 hex digits) or an image."""
    text = raw.strip()
    if text.startswith("sha256:"):
        if len(text) != 71 or any(c not in "0123456789abcdef" for c in text[7:]):
            raise Unprocessable(f"image: bad digest {raw!r}: 'sha256:' and 64 lower-case hexadecimal digits",
                                field="image")
        return text
    return image_of(text)


def error_of(e: ImagePullError) -> ServiceError:
    """A pull's failure as a status: the registry's or the node's fault 502, the caller's 422."""
    cls = BadGateway if e.kind in REGISTRY_FAULTS else Unprocessable
    return cls(f"{e} ({e.kind})", field="image")


def entry_dict(e: EntryInfo) -> dict[str, Any]:
    return dataclasses.asdict(e)
