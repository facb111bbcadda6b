"""srun's options and step layouts (pure parts of `backends/local/srun.py`), as Slurm lays a step out."""

from __future__ import annotations

import pytest

from trainyard.backends.local.srun import SrunError, _exit_code, gpu_split, parse_args, step_counts, step_nodes


@pytest.mark.parametrize("argv, opts, command", [
    (["python", "-c", "x"], {}, ["python", "-c", "x"]),
    (["-n", "4", "-N2", "--ntasks-per-node=2", "cmd", "-n", "9"], {"ntasks": 4, "nodes": 2, "per_node": 2},
     ["cmd", "-n", "9"]),
    (["--ntasks=3", "--nodes", "1", "--", "-weird"], {"ntasks": 3, "nodes": 1}, ["-weird"]),
    (["-u", "--mpi=pmi2", "--cpu-bind", "cores", "-K", "--tasks-per-node", "1", "cmd"], {"per_node": 1}, ["cmd"]),
    (["-l", "-w", "node1", "--gpus-per-task=2", "cmd"], {"label": True, "nodelist": "node1", "gpus_per_task": 2},
     ["cmd"]),
    (["--label", "--nodelist=n[0-1]", "-wn3", "cmd", "-l"], {"label": True, "nodelist": "n3"}, ["cmd", "-l"]),
])
def test_parse_args(argv, opts, command):
    assert parse_args(argv) == (opts, command)


@pytest.mark.parametrize("argv, words", [
    (["--bogus", "cmd"], "unrecognized option '--bogus'"), (["-w", "", "cmd"], "empty node list"),
    (["--gpus-per-task", "0", "cmd"], "at least 1"), (["-n", "x", "cmd"], "not a number"),
    (["-n", "0", "cmd"], "at least 1"), (["-n"], "needs a value"), (["-n", "2"], "no command"),
])
def test_parse_args_refuses_naming_the_option(argv, words):
    with pytest.raises(SrunError, match=words):
        parse_args(argv)


@pytest.mark.parametrize("alloc, kw, counts", [
    ([1, 1], {}, [1, 1]),                                 # the allocation's own layout
    ([4, 4, 4], {"nodes": 2}, [4, 4]),                    # -N 2: the first two nodes
    ([2, 2], {"ntasks": 3}, [2, 1]),                      # -n 3: block, as SLURM_TASKS_PER_NODE=2,1
    ([4, 4], {"ntasks": 1}, [1]),                         # -n 1: one node
    ([2, 2, 2], {"ntasks": 4, "nodes": 3}, [2, 1, 1]),
    ([1, 1], {"per_node": 2}, [2, 2]),                    # --ntasks-per-node 2 on every node
    ([1, 1, 1], {"per_node": 2, "ntasks": 3}, [2, 1]),
])
def test_step_counts(alloc, kw, counts):
    assert step_counts(alloc, **kw) == counts


@pytest.mark.parametrize("alloc, kw, words", [
    ([1, 1], {"nodes": 3}, "allocation has 2"), ([1, 1], {"ntasks": 1, "nodes": 2}, "cannot cover"),
    ([1, 1], {"per_node": 1, "ntasks": 3, "nodes": 2}, "do not fit"),
])
def test_step_counts_refuses(alloc, kw, words):
    with pytest.raises(SrunError, match=words):
        step_counts(alloc, **kw)


@pytest.mark.parametrize("codes, rc", [([0, 0], 0), ([0, 75], 75), ([75, 3, -15], 3), ([0, -9], 137), ([-15, 1], 1)])
def test_srun_exit_code(codes, rc):
    assert _exit_code(codes) == rc


@pytest.mark.parametrize("nodelist, nodes, order", [
    (None, None, ["a", "b", "c"]), (["b"], None, ["b", "a", "c"]), (["c", "a"], None, ["a", "c", "b"]),
    (["c"], 2, ["c", "a", "b"]),  # -N 2 -w c: c, then the allocation's next, as Slurm adds nodes
])
def test_step_nodes_put_the_named_ones_first(nodelist, nodes, order):
    assert step_nodes(["a", "b", "c"], nodelist, nodes) == order


@pytest.mark.parametrize("nodelist, nodes, words", [
    (["z"], None, "-w z: not in this job's allocation"), (["a", "b"], 1, "-N 1 is fewer than the 2"),
])
def test_step_nodes_refuse_what_is_not_the_jobs(nodelist, nodes, words):
    with pytest.raises(SrunError, match=words):
        step_nodes(["a", "b", "c"], nodelist, nodes)


def test_gpus_per_task_gives_each_task_its_own_slice():
    gpus = ["4", "5", "6", "7"]
    assert [gpu_split(gpus, i, 2, 2, "n") for i in range(2)] == [["4", "5"], ["6", "7"]]
    with pytest.raises(SrunError, match="3 task\\(s\\) on n need 6 GPU"):
        gpu_split(gpus, 0, 3, 2, "n")
