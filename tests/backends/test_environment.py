"""A node's environment fingerprint (backends/environment.py): what the job's interpreter sees,
and the differences across a gang named node by node."""

from __future__ import annotations

import sys

from trainyard.backends.environment import FIELDS, differences, fingerprint


def test_the_fingerprint_of_this_interpreter_names_its_python_and_torch():
    fp = fingerprint(sys.executable)
    assert set(fp) == set(FIELDS), fp
    assert fp["python"] == ".".join(map(str, sys.version_info[:3]))
    import torch

    assert fp["torch"] == torch.__version__
    assert fp["driver"] == "none"  # no GPU here


def test_an_interpreter_that_cannot_run_says_so():
    assert "error" in fingerprint("/nonexistent/python3")
    assert "error" in fingerprint("/bin/false")


def test_differences_name_the_node_and_the_field():
    a = {"python": "3.11.7", "torch": "2.13.0+cpu", "cuda": "none", "nccl": "none", "driver": "none"}
    b = dict(a, torch="2.14.1")
    assert differences({"node-0": a, "node-1": a}) == []
    assert differences({"node-0": a, "node-1": b}) == ["node-1: torch 2.14.1 (node-0: 2.13.0+cpu)"]
    # a node that could not tell is left out, not taken for a difference
    assert differences({"node-0": a, "node-1": {"error": "timeout"}}) == []
