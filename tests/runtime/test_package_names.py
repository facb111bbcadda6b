"""`trainyard.runtime`'s names are what its docstring says whatever was loaded first: the package
loads its parts on first use (PEP 562), and a submodule imported by another part becomes an
attribute of the package, so no part may share a public name's spelling (`yr.init` was once the
module `init` (now `runtime/startup.py`) as soon as `yr.Run` had been touched: `yr.init(...)` then raised
"'module' object is not callable"). Each check runs in a fresh interpreter: the order matters."""

from __future__ import annotations

import subprocess
import sys

import pytest

import trainyard.runtime as yr


@pytest.mark.parametrize("first", ["Run", "CheckpointManager", "init", "JobEnv"])
def test_every_public_name_is_itself_after_any_other_was_loaded(first):
    code = ("import trainyard.runtime as yr\n"
            f"getattr(yr, {first!r})\n"
            "import importlib\n"
            "for part in sorted(set(yr._WHERE.values())):\n"
            "    importlib.import_module('trainyard.runtime.' + part)\n"
            "bad = [n for n in yr.__all__ if type(getattr(yr, n)).__name__ == 'module']\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_part_is_named_like_a_public_name():
    assert not set(yr._WHERE.values()) & set(yr.__all__)
