"""How an attempt ended, from the backend's facts about its ranks: the job's next state and reason.

Pure functions, so every rule of the exit-code contract (docs/design.md) has a test of its own:
0 everywhere → COMPLETED; 75 ("checkpointed, requeue me") → REQUEUED, also when a launcher
(torchrun) turned its workers' 75 into its own exit 1 and the runtime's record says the attempt
checkpointed on a notice (`runtime_checkpointed`); a stop the control plane
asked for (cancel, time limit, preemption, requeue, an idle policy's requeue or cancel: reason
`Idle`) ends as that stop says; anything else is a
failure, classified: FAILED with cause `pids` when a fork of a rank was refused at the job's pids
limit (`RankState.pids_max_hit`: the backend then ended the rank; not retried, a fork bomb would
only do it again), OUT_OF_MEMORY when the backend says the kernel OOM-killed a process of a rank
(`RankState.oom_killed`: the cgroup's memory.events / memory.oom_control) or a log says so, NODE_FAIL when the ranks vanished without
an exit (their processes died while nobody watched), `Hung` for the runtime's watchdog exit,
a user error when it failed before its first step (or its command is missing), else a crash
with the first bad rank's code or signal. A job that never showed it uses the runtime is told by
its exit code or signal alone, as Slurm tells it (`NonZeroExitCode`, `Signal`, not retried), and a
class's `requeue_exit` codes retry any job (Slurm's RequeueExit). Each outcome names a `cause`; the control loop
retries the `RETRYABLE` ones within the class's budget (`control/rules/retry.py`).
"""

from __future__ import annotations

import json
import signal as _signal
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from trainyard import jobfs
from trainyard.backends.base import AttemptState, RankState
from trainyard.contracts import CANNOT_EXECUTE_EXIT, NOT_FOUND_EXIT, REQUEUE_EXIT, WATCHDOG_EXIT, JobDir
from trainyard.states import AttemptOutcome, JobState, StopKind

IDLE_REASON = "Idle"  # a job its class's idle policy requeued or cancelled (spec/idle.py)
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "torch.OutOfMemoryError", "Killed process")


# Why an attempt ended, as the retry policy sees it (`RETRYABLE` ones are retried automatically).
CAUSES = ("completed", "cancelled", "timeout", "preempted", "requeued", "node_lost", "hung", "oom", "pids",
          "user_error", "crash", "exit_code", "signal", "requeue_exit",
          # the image step (control/loop/image_pull.py): the user's image, or the registry's/node's fault
          "image_pull", "image_pull_registry",
          # the data step (control/loop/data_staging.py): the user's dataset, or the source's/node's fault
          "data_staging", "data_staging_source",
          "env_mismatch",  # a bare gang whose nodes' environments differ (control/loop/fingerprints.py)
          "idle")  # requeued by its class's idle policy (control/loop/idle.py); counted to end a cycle
RETRYABLE = ("node_lost", "hung", "crash", "requeue_exit")


@dataclass(frozen=True)
class Outcome:
    job_state: JobState  # the job's state after this attempt (before any retry)
    attempt_state: AttemptOutcome  # how the attempt itself ended
    reason: str
    exit_code: int | None
    signal: int | None
    cause: str = "crash"


def _signame(sig: int) -> str:
    try:
        return _signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def first_failure(ranks: list[RankState], *, sent: Collection[int] | None = None,
                  first: int | None = None) -> RankState | None:
    """The rank to blame: one lost (its node or supervisor died); else `first`, the rank the plane
    saw fail before it signalled anything (it stopped the others because of it: `control/rules/blame.py`),
    when that one failed; else one its watchdog ended (exit 86), else one that exited with another
    bad code, else one killed by a signal the plane did not send (`sent`: another process's `kill`,
    the kernel's), else one the plane's own signal ended (lowest rank first in each).

    A lost rank comes first, even before the one the plane saw fail first, because its peers then
    fail on their own (a collective times out, a connection resets: exit 1), often before the plane
    learns that the node is gone (a Slurm node's loss is seen a pass or more after its peers' exit). So does a hung rank's watchdog exit: the peers waiting for it in
    a collective see the connection close and fail with exit 1 before their own watchdogs fire.
    The plane's own signals come last: when one rank fails the control loop stops the others with
    SIGTERM (then SIGKILL), and those deaths (or exits 128+n of a shell that took them) are the
    consequence, not the cause, while `kill -9` of one rank from outside is the cause.
    """
    def by_plane(r: RankState) -> bool:
        return (r.signal if r.signal is not None else (r.exit_code or 0) - 128) in (sent or ())

    def order(r: RankState) -> tuple[int, int, int]:
        kind = (0 if r.lost else 1 if r.exit_code == WATCHDOG_EXIT else 4 if by_plane(r)
                else 2 if r.exit_code is not None else 3)
        return (0 if r.lost else 1 if r.rank == first else 2, kind, r.rank)

    bad = [r for r in ranks if r.lost or r.signal is not None or r.exit_code not in (None, 0, REQUEUE_EXIT)]
    return min(bad, key=order) if bad else None


def _log_says_oom(job_dir: JobDir, rank: int) -> bool:
    """"out of memory" in the tail of the rank's log, or of its stderr file (-e/--error puts a
    traceback there): 64 KiB of each at most, never through a link or from a FIFO (`jobfs`)."""
    tree = jobfs.Tree(job_dir.root)
    for log in (job_dir.rank_log(rank), job_dir.rank_err(rank)):
        try:
            tail = tree.read_tail(log, 64 * 1024).decode("utf-8", "replace")
        except OSError:
            continue
        if any(m in tail for m in OOM_MARKERS):
            return True
    return False


def _denied_line(job_dir: JobDir, rank: int) -> str | None:
    """The last line of the rank log's tail that says a permission was refused (a shell's or our
    shims' "Permission denied" / "cannot execute"): a 126 that is EACCES, said as such."""
    try:
        lines = jobfs.Tree(job_dir.root).tail_lines(job_dir.rank_log(rank), 16 * 1024)
    except OSError:
        return None
    for raw in reversed(lines):
        line = raw.decode("utf-8", "replace").strip()
        if "Permission denied" in line or "cannot execute" in line:
            return line[-300:]
    return None


def runtime_checkpointed(job_dir: JobDir, attempt: int) -> int | None:
    """The step the in-job runtime says this attempt checkpointed on a preemption notice, when
    that checkpoint is committed; None otherwise.

    Why: a launcher between the rank and the training processes (torchrun's agent, `accelerate
    launch`) exits 1 when its workers exit 75, so the rank's exit code cannot say "checkpointed,
    requeue me". The runtime's own record can: before it exits 75 it appends
    `{"event": "preempted", "attempt": a, "checkpoint_step": N}` to the job's metrics.jsonl, and
    step-N/ counts once its commit marker exists (docs/design.md's checkpoint contract). The record
    must be the attempt's last line, so a job that carried on after it does not count."""
    tree = jobfs.Tree(job_dir.root)  # the job writes metrics/ and checkpoints/: no link, no FIFO, 256 KiB
    last = None
    for line in tree.tail_lines(job_dir.metrics_file, 256 * 1024):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and type(rec.get("attempt")) is int and rec["attempt"] == attempt:  # not true, not 1.0
            last = rec
    if last is None or last.get("event") != "preempted" or not isinstance(last.get("checkpoint_step"), int):
        return None
    step = last["checkpoint_step"]
    return step if jobfs.commit_time(tree, job_dir.checkpoints, step) is not None else None


def classify(st: AttemptState, stop_kind: StopKind | str | None, job_dir: JobDir | Path,
             made_progress: bool = False, *, sent: Collection[int] | None = None,
             first: int | None = None, plain: bool = False, requeue_exit: Collection[int] = (),
             session_exit: int | None = None) -> Outcome:
    """The attempt's outcome. `made_progress`: the job finished at least one step in this attempt
    (the runtime said so, or it committed a checkpoint); a failure before that is the user's.
    `sent`, `first`: the signals the plane sent the attempt (None: not known) and the rank it saw
    fail before it sent any (`first_failure`, control/rules/blame.py). `plain`: the job has never shown
    it uses the runtime (no step reported, no metrics): a failure is told by its exit code or
    signal, as Slurm tells it (`NonZeroExitCode`, `Signal`), never as "before its first step", and
    not retried. `requeue_exit`: the class's exit codes that retry the attempt (Slurm's
    RequeueExit), within the class's `max_retries`. `session_exit`: an interactive allocation's
    session exit code (`jobs.interactive`), which is the job's when its session ended it (as salloc's
    command's is)."""
    job_dir = JobDir(job_dir) if not isinstance(job_dir, JobDir) else job_dir
    ranks = st.ranks
    codes = [r.exit_code for r in ranks]
    all_ok = bool(ranks) and all(c == 0 for c in codes)
    bad = first_failure(ranks, sent=sent, first=first)
    code = bad.exit_code if bad else (REQUEUE_EXIT if REQUEUE_EXIT in codes else 0)
    sig = bad.signal if bad else None

    if stop_kind == StopKind.CANCEL:
        return Outcome(JobState.CANCELLED, AttemptOutcome.CANCELLED,
                       "Cancelled", code, sig, "cancelled")
    if stop_kind == StopKind.SESSION:
        if not session_exit:
            return Outcome(JobState.COMPLETED, AttemptOutcome.COMPLETED, "None", 0, None, "completed")
        return Outcome(JobState.FAILED, AttemptOutcome.FAILED, "NonZeroExitCode", session_exit, None, "exit_code")
    if stop_kind == StopKind.LOST:
        return Outcome(JobState.CANCELLED, AttemptOutcome.CANCELLED,
                       "ConnectionLost", code, sig, "cancelled")
    if stop_kind == StopKind.IDLE:
        return Outcome(JobState.TIMEOUT, AttemptOutcome.TIMEOUT, "IdleTimeout", code, sig, "timeout")
    if stop_kind == StopKind.IDLE_CANCEL:
        return Outcome(JobState.CANCELLED, AttemptOutcome.CANCELLED, IDLE_REASON, code, sig, "cancelled")
    if stop_kind == StopKind.TIMEOUT:
        return Outcome(JobState.TIMEOUT, AttemptOutcome.TIMEOUT,
                       "TimeLimit", code, sig, "timeout")
    if stop_kind == StopKind.NODE and not all_ok:
        where = f"rank {bad.rank}" if bad else "a rank"
        return Outcome(JobState.NODE_FAIL, AttemptOutcome.NODE_FAIL,
                       f"node failure: {where}'s node died or hung", code, sig, "node_lost")
    if stop_kind == StopKind.HUNG and not all_ok:
        return Outcome(JobState.FAILED, AttemptOutcome.FAILED,
                       "Hung: ranks stopped and made no progress", code, sig, "hung")
    by_runtime = runtime_checkpointed(job_dir, st.attempt) if not any(c == REQUEUE_EXIT for c in codes) else None
    if stop_kind == StopKind.IDLE_REQUEUE and not all_ok:  # as a requeue; the reason says why
        return Outcome(JobState.REQUEUED, AttemptOutcome.REQUEUED, IDLE_REASON, code, sig, "idle")
    if stop_kind in (StopKind.PREEMPT, StopKind.REQUEUE) and not all_ok:
        saved = ("checkpointed" if any(c == REQUEUE_EXIT for c in codes) else
                 f"checkpointed step {by_runtime}, as the runtime recorded" if by_runtime is not None else
                 "stopped without a checkpoint exit")
        if stop_kind == StopKind.PREEMPT:
            return Outcome(JobState.REQUEUED, AttemptOutcome.PREEMPTED,
                           f"Preempted ({saved})", code, sig, "preempted")
        return Outcome(JobState.REQUEUED, AttemptOutcome.REQUEUED,
                       f"Requeued ({saved})", code, sig, "requeued")
    if all_ok:
        return Outcome(JobState.COMPLETED, AttemptOutcome.COMPLETED,
                       "None", 0, None, "completed")
    if bad is None:  # every rank exited 0 or 75, at least one 75: it asks to be requeued
        return Outcome(JobState.REQUEUED, AttemptOutcome.REQUEUED,
                       "JobRequestedRequeue (exit 75)", REQUEUE_EXIT, None, "requeued")
    if by_runtime is not None and all(r.exit_code is not None for r in ranks):
        # a launcher's exit code over workers that checkpointed and exited 75
        return Outcome(JobState.REQUEUED, AttemptOutcome.REQUEUED,
                       f"JobRequestedRequeue (the runtime checkpointed step {by_runtime}; the launcher exited "
                       f"{bad.exit_code})", bad.exit_code, None, "requeued")
    forked = [r for r in ranks if r.pids_max_hit]
    if forked:  # the backend's fact: a fork of the rank was refused at the job's pids limit, which ended it
        r = forked[0]
        limit = f"the job's limit of {r.pids_max} processes" if r.pids_max else "the job's limit"
        return Outcome(JobState.FAILED, AttemptOutcome.FAILED, f"pids limit: rank {r.rank} hit {limit} (pids_max)",
                       r.exit_code, r.signal, "pids")
    oomed = [r for r in ranks if r.oom_killed]
    if oomed:  # the backend's fact: the kernel's OOM killer ended a process of the rank (its --mem)
        return Outcome(JobState.OUT_OF_MEMORY, AttemptOutcome.OUT_OF_MEMORY,
                       f"oom: the kernel killed a process of rank {oomed[0].rank} over the job's memory limit",
                       oomed[0].exit_code, oomed[0].signal, "oom")
    if any(_log_says_oom(job_dir, r.rank) for r in ranks):
        return Outcome(JobState.OUT_OF_MEMORY, AttemptOutcome.OUT_OF_MEMORY,
                       f"oom: out of memory on rank {bad.rank}", code, sig, "oom")
    if bad.lost:
        return Outcome(JobState.NODE_FAIL, AttemptOutcome.NODE_FAIL,
                       f"rank {bad.rank}'s processes ended with no exit recorded (the node or its supervisor died)",
                       None, None, "node_lost")
    if bad.exit_code == WATCHDOG_EXIT:
        return Outcome(JobState.FAILED, AttemptOutcome.FAILED,
                       f"Hung: no step finished within the watchdog's time (rank {bad.rank}, "
                       f"exit {WATCHDOG_EXIT})", bad.exit_code, None, "hung")
    if bad.exit_code is not None and bad.exit_code in requeue_exit:
        return Outcome(JobState.FAILED, AttemptOutcome.FAILED,
                       f"RequeueExit: exit {bad.exit_code} on rank {bad.rank} (the class's requeue_exit)",
                       bad.exit_code, None, "requeue_exit")
    if plain and bad.exit_code not in (CANNOT_EXECUTE_EXIT, NOT_FOUND_EXIT):  # told as Slurm tells it: no guess about steps, no retry
        if bad.signal is not None:
            return Outcome(JobState.FAILED, AttemptOutcome.FAILED,
                           f"Signal {_signame(bad.signal)} on rank {bad.rank}{_whose(bad, sent, first)}", None,
                           bad.signal, "signal")
        return Outcome(JobState.FAILED, AttemptOutcome.FAILED, f"NonZeroExitCode {bad.exit_code} on rank {bad.rank}",
                       bad.exit_code, None, "exit_code")
    if bad.exit_code == CANNOT_EXECUTE_EXIT and (denied := _denied_line(job_dir, bad.rank)) is not None:
        return Outcome(JobState.FAILED, AttemptOutcome.FAILED,
                       f"UserError: permission denied (exit {CANNOT_EXECUTE_EXIT} on rank {bad.rank}): {denied}",
                       CANNOT_EXECUTE_EXIT, None, "user_error")
    if bad.exit_code in (CANNOT_EXECUTE_EXIT, NOT_FOUND_EXIT) or (not made_progress and bad.signal != _signal.SIGKILL):
        what = {CANNOT_EXECUTE_EXIT: "command not executable", NOT_FOUND_EXIT: "command not found"}.get(bad.exit_code or 0, "failed before reporting its first step")
        how = f"exit {bad.exit_code}" if bad.signal is None else f"signal {_signame(bad.signal)}"
        return Outcome(JobState.FAILED, AttemptOutcome.FAILED,
                       f"UserError: {what} ({how} on rank {bad.rank})",
                       bad.exit_code, bad.signal, "user_error")
    if bad.signal is not None:
        return Outcome(JobState.FAILED, AttemptOutcome.FAILED,
                       f"Signal {_signame(bad.signal)} on rank {bad.rank}{_whose(bad, sent, first)}", None, bad.signal,
                       "crash")
    return Outcome(JobState.FAILED, AttemptOutcome.FAILED,
                       f"NonZeroExitCode {bad.exit_code} on rank {bad.rank}", bad.exit_code, None,
                   "crash")


def _whose(bad: RankState, sent: Collection[int] | None, first: int | None) -> str:
    """Whose signal ended `bad`: the plane's own only if it had sent it and this rank had not
    failed before it sent anything ("" when the plane's signals are not known)."""
    if sent is None and first is None:
        return ""
    return " (sent by the plane)" if bad.signal in (sent or ()) and bad.rank != first else " (not sent by trainyard)"
