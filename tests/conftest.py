"""Suite-wide set-up: the hypothesis profile (see `tests/hypothesis_setup.py`) is loaded before
any test module, including those that only use `@given`."""

import tests.hypothesis_setup  # noqa: F401  (registers and loads the profile)
