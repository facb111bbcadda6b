"""sbatch's `--mail-type` and `--mail-user`, read as Slurm reads them.

Slurm mails a job's owner on the events `--mail-type` names; trainyard POSTs them as JSON to the
webhook of the cluster configuration's `notify:` section (`control/lifecycle/notify.py`). The values are
Slurm's, in any case, comma-separated:

    NONE            nothing (anywhere in the list: the whole list means nothing, as in Slurm)
    BEGIN           each attempt starts (a requeued job begins again)
    END             the job ended, in any final state (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...)
    FAIL            the job ended FAILED, TIMEOUT, NODE_FAIL or OUT_OF_MEMORY (one message: with
                    END and FAIL both asked, a failed job's message is FAIL)
    REQUEUE         the job went back to the queue (a preemption, a requeue, a retry)
    INVALID_DEPEND  its dependency can never be met (the job is cancelled; END follows)
    TIME_LIMIT      it reached its time limit (it is being stopped)
    TIME_LIMIT_90/80/50   it ran 90/80/50 % of its time limit (its own, or its class's max run time)
    ARRAY_TASKS     each task of an array reports for itself (what trainyard always does: a task is
                    a job of its own, see docs/control-plane.md)
    STAGE_OUT       burst-buffer stage-out ended: trainyard has no burst buffers, so never sent
    ALL             BEGIN, END, FAIL, INVALID_DEPEND, REQUEUE and STAGE_OUT (Slurm's ALL; the
                    TIME_LIMIT ones are asked for by name)

`--mail-user` names who the message is for (Slurm's default: the submitting user); the webhook
receives it as `mail_user` and decides what to do with it.
"""

from __future__ import annotations

MAIL_TYPES = ("NONE", "BEGIN", "END", "FAIL", "REQUEUE", "ALL", "TIME_LIMIT", "TIME_LIMIT_90", "TIME_LIMIT_80",
              "TIME_LIMIT_50", "ARRAY_TASKS", "INVALID_DEPEND", "STAGE_OUT")
ALL_MEANS = frozenset({"BEGIN", "END", "FAIL", "INVALID_DEPEND", "REQUEUE", "STAGE_OUT"})
# the fractions of the time limit the TIME_LIMIT_NN types report
TIME_FRACTIONS = {"TIME_LIMIT_50": 0.5, "TIME_LIMIT_80": 0.8, "TIME_LIMIT_90": 0.9}
FAILED_STATES = frozenset({"FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"})  # Slurm's IS_JOB_FAILED and timeout


def parse_mail_type(raw: str, option: str = "--mail-type") -> str | None:
    """`raw` as a canonical comma-separated list (upper case, Slurm's order), or None for NONE.

    Raises:
        ValueError: empty, an empty item, or a value that is none of Slurm's (named, with the list).
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"{option}: expected one or more of {', '.join(MAIL_TYPES)} (comma-separated); got {raw!r}")
    items = [x.strip() for x in raw.split(",")]
    seen: set[str] = set()
    for item in items:
        up = item.upper()
        if up not in MAIL_TYPES:
            what = "an empty item" if not item else f"unknown mail type {item!r}"
            raise ValueError(f"{option}: {what}; Slurm's mail types are {', '.join(MAIL_TYPES)}")
        seen.add(up)
    if "NONE" in seen:
        return None
    return ",".join(t for t in MAIL_TYPES if t in seen)


def wanted(mail_type: str | None) -> frozenset[str]:
    """The events a stored `mail_type` asks for, ALL expanded."""
    if not mail_type:
        return frozenset()
    types = set(mail_type.split(","))
    if "ALL" in types:
        types |= ALL_MEANS
    return frozenset(types)


def check_mail_user(raw: str, option: str = "--mail-user") -> str:
    """A `--mail-user` value: one or more addresses or user names, no control characters.

    Raises:
        ValueError: empty, longer than 200 characters or with a control character.
    """
    v = raw.strip() if isinstance(raw, str) else ""
    if not v or len(v) > 200 or any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError(f"{option}: expected a user or an address (at most 200 printable characters); got {raw!r}")
    return v
