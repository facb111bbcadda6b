"""Node health (issue 7): configured checks run on every node on a schedule and before a node
takes new work, each in threads of their own so that a slow check never stalls the control loop;
their newest results decide whether a node may take work.

A result is OK, WARN or CRITICAL with a message, as LBNL NHC and Meta's GCM report them. The loop
(`ControlLoop.watch_nodes`) makes a node with a WARN `suspect` (no new work, its jobs run on),
takes one with a CRITICAL down — nothing new lands there, its jobs checkpoint-stop and resume
elsewhere — remediates it when actions are configured, and returns it once a fresh round of its
checks passes. Before a node takes new work (`ControlLoop.schedule`) its newest round must be
younger than `health.before_work_max_age` and newer than an operator's resume; otherwise it gets a
before-work round in the background and no new work until that round passes.

The parts, one module each:

- `checks`: the result type, NHC exit codes, `run_check`, the `command` and `disk` kinds;
- `nvml`: GPU readings and XID events through NVML (pure judgement, thin NVML layer);
- `dcgm`: `dcgmi diag` and its JSON;
- `speed`: a timed matmul and an all-reduce, against a baseline per GPU model;
- `checker`: `HealthChecker`, the periodic and before-work rounds;
- `remediation`: `Remediator`, the actions run for a node that is down.
"""

from trainyard.control.health.checker import HealthChecker
from trainyard.control.health.checks import (
    BEFORE_WORK, CRITICAL, OK, PERIODIC, RANK, WARN, CheckResult, run_check, worst,
)
from trainyard.control.health.remediation import Remediator

__all__ = ["BEFORE_WORK", "CRITICAL", "OK", "PERIODIC", "RANK", "WARN", "CheckResult", "HealthChecker", "Remediator",
           "run_check", "worst"]
