"""The Pollux workload loader (`yard sim --format pollux`): the world it builds, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from trainyard.cli.main import app
from trainyard.sim.local_traces import MISSING, POLLUX_WORKLOADS, local_trace
from trainyard.sim.pollux import ALLOCATION_S, load_pollux
from trainyard.sim.pollux_runtimes import RUN_S
from trainyard.spec.models import ConfigError

SHARED = local_trace(POLLUX_WORKLOADS)
HEADER = "name,time,application,num_replicas,batch_size\n"


def write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    p = tmp_path / "workload-x.csv"
    p.write_text(header + body)
    return p


def test_a_small_workload(tmp_path):
    w = load_pollux(write(tmp_path, "ncf-0,10,ncf,1,32768\ncifar10-1,5,cifar10,6,2048\n"))
    assert len(w.nodes) == 16 and w.total_gpus == 64
    assert list(w.teams) == ["pollux"] and w.teams["pollux"].quota("default").nominal == 64
    assert w.teams["pollux"].las_for("training")
    assert [j.label for j in w.jobs] == ["cifar10-1", "ncf-0"]  # by submit time
    c = w.jobs[0]
    assert c.req.gpus == 6 and c.req.job_class == "training" and c.req.submit_time == 5.0
    assert c.duration_s == RUN_S[("cifar10", 6, 2048)] + ALLOCATION_S
    assert w.restart_overhead_s == ALLOCATION_S and w.measured(c.req.submit_time)


def test_the_cluster_and_las_can_be_changed(tmp_path):
    w = load_pollux(write(tmp_path, "ncf-0,10,ncf,1,32768\n"), cluster="4x8", las=False)
    assert w.total_gpus == 32 and not w.teams["pollux"].las


@pytest.mark.skipif(SHARED is None, reason=MISSING)
def test_every_published_workload_loads():
    for k in range(1, 9):
        w = load_pollux(SHARED / f"workload-{k}.csv")
        assert len(w.jobs) == 160


@pytest.mark.parametrize("body, header, line, field", [
    ("ncf-0,10,ncf,1\n", HEADER, 2, "row"),
    ("ncf-0,soon,ncf,1,32768\n", HEADER, 2, "time"),
    ("ncf-0,-1,ncf,1,32768\n", HEADER, 2, "time"),
    ("ncf-0,10,ncf,1,32768\nx-1,10,gpt5,1,32768\n", HEADER, 3, "application"),
    ("ncf-0,10,ncf,0,32768\n", HEADER, 2, "num_replicas"),
    ("ncf-0,10,ncf,1,big\n", HEADER, 2, "batch_size"),
    ("ncf-0,10,ncf,2,32768\n", HEADER, 2, "num_replicas"),  # no run time for that configuration
    ("imagenet-0,10,imagenet,48,6400\n", HEADER, 2, "num_replicas"),  # more than 16 x 2 GPUs (below)
    ("ncf-0,10,ncf,1,32768\n", "name,time,application,num_replicas\n", 1, "batch_size"),
])
def test_bad_input_names_file_line_and_field(tmp_path, body, header, line, field):
    cluster = "16x2" if "imagenet" in body else None
    with pytest.raises(ConfigError) as e:
        load_pollux(write(tmp_path, body, header), cluster=cluster)
    assert (e.value.line, e.value.field) == (line, field)
    assert str(write(tmp_path, body, header)) in str(e.value)


def test_yard_sim_format_pollux(tmp_path):
    trace = write(tmp_path, "ncf-0,10,ncf,1,32768\ncifar10-1,5,cifar10,6,2048\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["sim", "--format", "pollux", "--trace", str(trace), "--policies", "trainyard,tiresias",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert (out / "report.json").is_file()


def test_yard_sim_bad_pollux_file_exits_2_and_writes_nothing(tmp_path):
    trace = write(tmp_path, "ncf-0,10,ncf,1,32768\nx-1,later,ncf,1,32768\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["sim", "--format", "pollux", "--trace", str(trace), "--out", str(out)])
    assert r.exit_code == 2
    assert f"{trace}:3" in r.stderr and "time" in r.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == [trace]
