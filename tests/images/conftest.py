"""The image tests' shared parts: the real registry (tests/image_registry.py) and the images
built once (tests/image_builds.py), pushed under names of each test's choosing."""

from __future__ import annotations


import pytest

from tests import image_tools
from tests.image_registry import Registry, auth_registry, image_registry  # noqa: F401  (fixtures)
from trainyard.images.types import RegistryAccess
from trainyard.spec.image_ref import ImageRef, parse_image

@pytest.fixture(autouse=True)
def _tools_and_root() -> None:
    why = image_tools.unavailable()  # installs the tools first where it may (root, CI)
    if why:
        pytest.skip(why)


ACCESS = RegistryAccess()


def ref_at(registry: Registry, name: str) -> ImageRef:
    """`name` (repository:tag) at `registry`."""
    return parse_image(f"{registry.address}/{name}")
