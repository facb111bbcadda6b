import pytest

# The runtime is the in-job library: its tests need torch, which the control plane does not.
pytest.importorskip("torch")
