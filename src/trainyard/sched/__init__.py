"""The scheduling engine: pure policies that turn a `Snapshot` into a `CycleResult`.

Rule 1 of docs/design.md: no I/O, no clock reads, deterministic. The control loop and the simulator
call the very same `Policy.cycle`.
"""
