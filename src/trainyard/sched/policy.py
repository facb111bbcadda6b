"""The one interface every scheduling policy implements, and the registry of policies by name.

A policy is an object with a `name` and a `cycle(snapshot) -> CycleResult` method. It may hold
configuration (weights, thresholds) but no state between cycles: whatever history it weighs
(attained service, decayed usage, when a job last started) comes in through the snapshot.
"""

from __future__ import annotations

from typing import Callable, Protocol

from trainyard.sched.types import CycleResult, Snapshot


class Policy(Protocol):
    name: str

    def cycle(self, snap: Snapshot) -> CycleResult: ...


_REGISTRY: dict[str, Callable[[], Policy]] = {}


def register(name: str) -> Callable[[Callable[[], Policy]], Callable[[], Policy]]:
    def deco(factory: Callable[[], Policy]) -> Callable[[], Policy]:
        _REGISTRY[name] = factory
        return factory

    return deco


def policy_names() -> list[str]:
    _load_builtin()
    return list(_REGISTRY)


def get_policy(name: str) -> Policy:
    _load_builtin()
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(_REGISTRY)}") from None


def _load_builtin() -> None:
    # Imported for their @register side effect; the order is the order reports list them.
    import trainyard.sched.baselines  # noqa: F401
    import trainyard.sched.engine  # noqa: F401
