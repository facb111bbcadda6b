"""Suite-wide set-up: the hypothesis profile (see `tests/hypothesis_setup.py`) is loaded before
any test module, including those that only use `@given`.

pytest-xdist's workers start with COLUMNS=80 and LINES=24 in their environment, which every `yard`
process a test starts would inherit: `yard queue` and `yard events` then fit 80 columns, as a
user's terminal of that width asks, and cut names and messages the tests look for. Tests that
mean a width pass COLUMNS themselves (tests/cli/test_queue_layout.py); the rest see none, as a
pipe or a file would."""

import os

import tests.hypothesis_setup  # noqa: F401  (registers and loads the profile)

for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
