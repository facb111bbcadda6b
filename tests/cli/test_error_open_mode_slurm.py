"""The same `-e/--error` and `--open-mode` tests (tests/cli/test_error_open_mode.py) on the Slurm
backend, on the real 2-node test cluster (skipped with the reason where Slurm cannot run)."""

from __future__ import annotations

import pytest

from tests.cli.test_error_open_mode import (  # noqa: F401 - collected here against this module's yc
    test_error_apart_from_output_with_patterns, test_open_mode_across_attempts,
    test_sbatch_error_line_takes_the_scripts_and_its_tasks_stderr)
from tests.yard_cluster import YardCluster

pytestmark = [pytest.mark.slow, pytest.mark.slurm, pytest.mark.xdist_group("error-open-mode-slurm")]


@pytest.fixture(scope="module")
def yc(tmp_path_factory):
    c = YardCluster(tmp_path_factory.mktemp("errors-slurm"), "slurm")
    yield c
    c.stop()
