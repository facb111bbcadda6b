"""The image tests' shared parts: the real registry (tests/image_registry.py) and the images
built once (tests/image_builds.py), pushed under names of each test's choosing."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.image_registry import Registry, auth_registry, image_registry  # noqa: F401  (fixtures)
from trainyard.images.types import RegistryAccess
from trainyard.spec.image_ref import ImageRef, parse_image

NEEDED = ("skopeo", "umoci", "docker-registry", "mmdebstrap")


@pytest.fixture(autouse=True)
def _tools_and_root() -> None:
    missing = [t for t in NEEDED if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (scripts/images-setup.sh)")
    if os.geteuid() != 0:
        pytest.skip("the node image cache runs as root (owners kept, whiteouts as devices, overlay xattrs)")


ACCESS = RegistryAccess()


def ref_at(registry: Registry, name: str) -> ImageRef:
    """`name` (repository:tag) at `registry`."""
    return parse_image(f"{registry.address}/{name}")
