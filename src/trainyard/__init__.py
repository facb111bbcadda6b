"""trainyard: a self-hosted manager for GPU training clusters shared by several teams.

The package is laid out as docs/design.md draws it: `spec` (validated configuration), `sched` (the pure
scheduling engine and the baseline policies), `sim` (the trace simulator that drives the very same
engine), `plan` (capacity planning by simulation) and `cli` (the `yard` command).
"""

__version__ = "0.1.0"
