"""How the property tests draw their examples.

`make test` (and so CI) runs the **repeatable** profile: hypothesis derives each test's examples
from the test itself (`derandomize=True`), so a run passes or fails on the code, never on the
seed it happened to draw. With random seeds, a change that breaks a property can pass its own CI
run and fail a later, unrelated one, and a stop whose CI fails does not land: that is how a
counterexample found by chance held back a whole session's work once.

Hunting for new counterexamples is a separate, deliberate run with fresh random examples, as
many times more as you like:

    HYPOTHESIS_PROFILE=explore HYPOTHESIS_SCALE=20 .venv/bin/pytest tests/sched/test_properties.py

A failure prints the `@reproduce_failure` line and the falsifying example; turn it into a plain
regression test next to the property.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repeatable"))


def examples(n: int) -> int:
    """A test's example count: `n` in `make test`, `n` × $HYPOTHESIS_SCALE when exploring."""
    scale = os.environ.get("HYPOTHESIS_SCALE", "1")
    try:
        return max(1, round(n * float(scale)))
    except ValueError:
        raise SystemExit(f"HYPOTHESIS_SCALE must be a number, not {scale!r}") from None
