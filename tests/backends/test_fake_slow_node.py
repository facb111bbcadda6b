"""The fake backend's `slow_node`: a node's ranks step `factor` times slower (running and launched
later) until `revive_node`, in fake time and in their metrics' step times, so control-loop tests
can script a slow node (the local backend does it with real CPU quotas: tests/backends/local/test_slow_node.py)."""

from __future__ import annotations

import pytest

from trainyard.backends.base import BackendError
from trainyard.control.rules.lost_work import last_steps
from trainyard.contracts import JobDir

from tests.backends.test_fake import T0, clock, fake, spec  # noqa: F401 (fixtures)


def steps(tmp_path, job: int) -> list[tuple[int, float, float]]:  # noqa: ANN001
    return [(r["step"], r["time"], r["step_time_s"]) for r in last_steps(JobDir.of(tmp_path, job).metrics_file, 1)]


def test_a_slowed_node_steps_factor_times_slower_until_revived(fake, clock, tmp_path):  # noqa: F811
    fake.launch(spec(tmp_path, 1, "step=2"))
    clock.advance(4)  # steps 1, 2 at full speed
    fake.slow_node("node0", 2.0)
    clock.advance(8)  # 4 active seconds: steps 3, 4, each taking 4 s
    assert steps(tmp_path, 1) == [(1, T0 + 2, 2.0), (2, T0 + 4, 2.0), (3, T0 + 8, 4.0), (4, T0 + 12, 4.0)]
    assert next(n for n in fake.inventory() if n.name == "node0").healthy  # slow, not down

    fake.launch(spec(tmp_path, 2, "step=1", ranks=((0, "node0", (1,)),)))  # launched on the slowed node
    fake.launch(spec(tmp_path, 3, "step=1", ranks=((0, "node1", (0,)),)))  # and on the other one
    clock.advance(4)
    assert [s[0] for s in steps(tmp_path, 2)] == [1, 2] and [s[0] for s in steps(tmp_path, 3)] == [1, 2, 3, 4]

    fake.revive_node("node0")
    clock.advance(2)
    assert [s[2] for s in steps(tmp_path, 1)][-1] == 2.0 and [s[0] for s in steps(tmp_path, 2)] == [1, 2, 3, 4]


def test_a_bad_factor_or_node_is_refused(fake):  # noqa: F811
    for bad in (1.0, 0.0, 500.0):
        with pytest.raises(BackendError, match="factor"):
            fake.slow_node("node0", bad)
    with pytest.raises(BackendError, match="unknown node"):
        fake.slow_node("node9", 2.0)
