import pytest

from tests.plane import Plane


@pytest.fixture
def plane(tmp_path):
    p = Plane(tmp_path / "yard")
    yield p
    p.stop()
