"""srun's options and step layouts (pure parts of `backends/local_srun.py`), as Slurm lays a step out."""

from __future__ import annotations

import pytest

from trainyard.backends.local_srun import SrunError, _exit_code, parse_args, step_counts


@pytest.mark.parametrize("argv, opts, command", [
    (["python", "-c", "x"], {}, ["python", "-c", "x"]),
    (["-n", "4", "-N2", "--ntasks-per-node=2", "cmd", "-n", "9"], {"ntasks": 4, "nodes": 2, "per_node": 2},
     ["cmd", "-n", "9"]),
    (["--ntasks=3", "--nodes", "1", "--", "-weird"], {"ntasks": 3, "nodes": 1}, ["-weird"]),
    (["-u", "--mpi=pmi2", "--cpu-bind", "cores", "-K", "--tasks-per-node", "1", "cmd"], {"per_node": 1}, ["cmd"]),
])
def test_parse_args(argv, opts, command):
    assert parse_args(argv) == (opts, command)


@pytest.mark.parametrize("argv, words", [
    (["--label", "cmd"], "unrecognized option '--label'"), (["-n", "x", "cmd"], "not a number"),
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
