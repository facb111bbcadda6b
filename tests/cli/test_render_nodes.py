"""cli/render.py: node lists in Slurm's hostlist form, GPU indices apart from node names (issue 17
item 1): `node-0[0,1]` read as Slurm's node-0 followed by nodes 0 and 1."""

from trainyard.cli.render import gpu_indices, index_ranges, nodelist
from trainyard.contracts import expand_hostlist

PLACEMENT = [{"node": "node-0", "gpus": [0, 1, 2], "mem_mib": 0}, {"node": "node-1", "gpus": [0, 2], "mem_mib": 0},
             {"node": "gpu-07", "gpus": [3], "mem_mib": 0}]


def test_the_nodes_are_a_hostlist_scontrol_expands_back():
    assert nodelist(PLACEMENT) == "node-[0-1],gpu-07"
    assert expand_hostlist(nodelist(PLACEMENT)) == ["node-0", "node-1", "gpu-07"]
    assert nodelist(None) == "" and nodelist([]) == ""


def test_gpus_are_listed_per_node_in_scontrols_idx_form():
    assert gpu_indices(PLACEMENT) == "node-0:0-2 node-1:0,2 gpu-07:3"
    assert index_ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and index_ranges([]) == ""
