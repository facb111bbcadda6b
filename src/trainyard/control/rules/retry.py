"""Automatic retries after failures: which causes, how many times, how long to wait.

Infrastructure failures (a lost node, a hung rank) and crashes after the job made progress are
retried from the newest complete checkpoint, up to the class's `max_retries`, with exponential
backoff (10 s, 20 s, 40 s … at most 5 min) so that a job that keeps crashing does not spin; a
lost node is retried at once (the node is out of service already, the job is not to blame).
A user error (a failure before the first step, a missing command) fails at once; out of memory
is reported as `oom` and not retried blindly — the same placement would fail the same way.
Preemptions and requeues are not failures and cost no retry.
"""

from __future__ import annotations

from trainyard.control.rules.outcome import RETRYABLE, Outcome

BACKOFF_FIRST_S = 10.0
BACKOFF_MAX_S = 300.0


def should_retry(out: Outcome, retries_so_far: int, max_retries: int) -> bool:
    return out.cause in RETRYABLE and retries_so_far < max_retries


def backoff_s(retry_number: int, first_s: float = BACKOFF_FIRST_S, cause: str = "crash") -> float:
    """Wait before retry number `retry_number` (1-based). A lost node is not the job's fault and the
    node is already out of service: retry at once (an elastic job goes on with the nodes left)."""
    if cause == "node_lost":
        return 0.0
    return min(BACKOFF_MAX_S, first_s * 2 ** max(0, retry_number - 1))
