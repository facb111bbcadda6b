"""The suite's `xdist_group` marks keep a group on one worker under `make test`'s
`-n 3 --dist loadgroup`, so a module-scoped cluster (Slurm, chaos, accounting figures) starts once.

Nothing else notices when they stop doing so: on pytest 9.2 with pytest-xdist 3.8 the grouping
silently stops (pytest-xdist#1386), every such fixture is set up once per worker, two Slurm test
clusters run side by side, and the suite is only slower and flakier. This runs a small suite the
way `make test` runs the real one and counts the setups of a grouped module fixture.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

GROUPED = '''
import os, time, pytest
pytestmark = pytest.mark.xdist_group("one-cluster")

@pytest.fixture(scope="module")
def cluster():
    with open(os.environ["SETUPS"], "a") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "?") + "\\n")
    time.sleep(0.5)

@pytest.mark.parametrize("i", range(6))
def test_uses_the_cluster(cluster, i):
    time.sleep(0.05)
'''
OTHERS = '''
import time, pytest

@pytest.mark.parametrize("i", range(12))
def test_other(i):
    time.sleep(0.02)
'''


def test_a_grouped_module_fixture_is_set_up_once_on_one_worker(tmp_path: Path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_others.py").write_text(OTHERS)
    setups = tmp_path / "setups"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup",
                        "-c", "/dev/null", "--rootdir", str(tmp_path), str(tmp_path)],
                       capture_output=True, text=True, timeout=120, env={**_env(), "SETUPS": str(setups)})
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert len(setups.read_text().split()) == 1, (
        "the grouped module fixture was set up once per worker: --dist loadgroup is not grouping "
        f"(pytest-xdist#1386 on pytest 9.2?): {setups.read_text().split()}")


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "HYPOTHESIS"))}
