"""Step 1 of a pass: match every attempt the backend reports with the store (design rule 3).

- An attempt the store does not consider running is an orphan: killed and released (never an
  orphan process).
- An active job whose attempt the backend does not know never launched (the plane died between
  the commit and the launch): it goes back to the queue. One with fewer ranks than its placement
  was launched in part: killed and requeued.
- A finished attempt gets its outcome (`outcome.classify`), the work it lost since its last
  checkpoint, the nodes its failure points at (`avoid_nodes`), and either a retry or requeue
  (back to the queue) or the job's end.
- A running attempt with one failed rank is stopped (the others get SIGTERM in the stop step); that
  rank is recorded as the cause (`control/rules/blame.py`), whatever signal the others then die of.

Every attempt that ended is `release`d from the backend after the transaction commits.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard import jobfs
from trainyard.backends.base import AttemptState, RankState
from trainyard.contracts import JobDir
from trainyard.control.jobfiles import end_notes
from trainyard.control.rules import blame
from trainyard.control.loop.attempt_start import stderr_apart
from trainyard.control.loop.context import Facts, LoopContext
from trainyard.control.loop.frozen import FrozenRanks
from trainyard.control.rules.ledger import store_ledger
from trainyard.control.rules.lost_work import lost_work_s
from trainyard.control.rules.outcome import classify, first_failure
from trainyard.control.rules.retry import backoff_s, should_retry
from trainyard.services import auth, transitions
from trainyard.services.config import ConfigVersion
from trainyard.services.events import record
from trainyard.services.goodput_facts import idle_since
from trainyard.services.ranks import ranks_for
from trainyard.states import ACTIVE_STATES, AttemptOutcome, JobState, StopKind
from trainyard.store.models import AttemptRow, JobRow

log = logging.getLogger("trainyard.loop")

MAX_AVOIDED = 4  # suspect nodes remembered per job (the most recent)
NO_LOST_WORK = ("completed", "cancelled", "timeout", "user_error")  # causes whose lost work is not counted


class Reconciler:
    def __init__(self, ctx: LoopContext, frozen: FrozenRanks) -> None:
        self.ctx, self.frozen = ctx, frozen

    def run(self, facts: Facts, now: float) -> None:
        ctx = self.ctx
        reported = {(a.job_id, a.attempt): a for a in facts.attempts}
        ended: list[tuple[int, int]] = []
        with ctx.lock, ctx.store.session.begin() as s:
            active = {j.id: j for j in s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES)))}
            cfg = ctx.configs.current(s)
            for (jid, att), seen in reported.items():
                j = active.get(jid)
                if j is None or j.attempt != att:
                    self._kill_orphan(s, jid, att, seen, now)
                    ended.append((jid, att))
            for j in active.values():
                st = reported.get((j.id, j.attempt))
                if st is None and (j.id, j.attempt) in facts.launching:
                    continue  # being launched (control/loop/launch_threads.py): the backend does not know it yet
                if st is None:
                    self._never_launched(s, j, now)
                    ended.append((j.id, j.attempt))  # released: what its start took (a dataset's pins) is freed
                elif len(st.ranks) < (1 if not j.command else len(ranks_for(j.placement or [], j.tasks_per_node))):
                    # (a batch script is one rank to a backend that runs it as Slurm does: LaunchSpec.batch)
                    self._partial_launch(s, j, now)
                    ended.append((j.id, j.attempt))
                elif st.done:
                    self._finish(s, j, st, now, cfg)
                    ended.append((j.id, j.attempt))
                else:
                    self.note_checkpoint(j)
                    bad = first_failure([r for r in st.ranks if not r.running], sent=blame.sent_to(j))
                    if bad is not None and j.stop_kind is None:
                        why = f"rank {bad.rank} failed; stopping the others"
                        # The rank is recorded: it ended before the plane signalled anything, so it is
                        # the cause, whatever the others die of (control/rules/blame.py).
                        transitions.request_stop(s, j, StopKind.RANK_FAILED, now, actor="backend",
                                                 event=blame.RANK_FAILED_EVENT, message=why, reason=why,
                                                 completing=True, data={"rank": bad.rank, "attempt": j.attempt,
                                                                        "exit_code": bad.exit_code,
                                                                        "signal": bad.signal})
        if ended:
            auth.forget_cached_tokens()  # the ended attempts' job tokens were revoked above
        for jid, att in ended:
            ctx.backend.release(jid, att)

    def note_checkpoint(self, j: JobRow) -> tuple[int, float] | None:
        """The newest committed checkpoint of this attempt, as the engine's `last_checkpoint`;
        returns its (step, commit time), or None if this attempt made none."""
        jd = self.ctx.job_dir(j)  # the job writes checkpoints/: looked at through no link (`jobfs`)
        found = jobfs.newest_checkpoint(jobfs.Tree(jd.root), jd.checkpoints)
        if found is None or j.start_time is None or found[2] < j.start_time:
            return None
        if j.last_checkpoint is None or found[2] > j.last_checkpoint:
            j.last_checkpoint = found[2]
        return found[0], found[2]

    def _kill_orphan(self, s: Session, jid: int, att: int, st: AttemptState, now: float) -> None:
        if not st.done:
            self.ctx.backend.signal(jid, att, signal.SIGKILL)
            record(s, "scheduler", "job.orphan_killed",
                   f"attempt {att} had processes the store does not run; killed", job_id=jid, at=now)

    def _never_launched(self, s: Session, j: JobRow, now: float) -> None:
        transitions.end_attempt(s, j, AttemptOutcome.REQUEUED,
                                "never launched (control plane restarted before the launch)", now)
        transitions.back_to_queue(j, now, "LaunchInterrupted")
        record(s, "scheduler", "job.requeued", f"attempt {j.attempt} never launched; back in the queue",
               job_id=j.id, at=now)

    def _partial_launch(self, s: Session, j: JobRow, now: float) -> None:
        self.ctx.backend.signal(j.id, j.attempt, signal.SIGKILL)
        transitions.end_attempt(s, j, AttemptOutcome.REQUEUED,
                                "launch interrupted with some ranks started; killed them", now)
        transitions.back_to_queue(j, now, "LaunchInterrupted")
        record(s, "scheduler", "job.requeued", f"attempt {j.attempt} only partly launched; killed and requeued",
               job_id=j.id, at=now)

    def _finish(self, s: Session, j: JobRow, st: AttemptState, now: float, cfg: ConfigVersion) -> None:
        jd = self.ctx.job_dir(j)
        checkpoint = self.note_checkpoint(j)
        attempt = transitions.attempt_row(s, j)
        made_progress = (attempt is not None and attempt.first_step_at is not None) or \
            (j.last_checkpoint is not None and j.start_time is not None and j.last_checkpoint >= j.start_time)
        sent, first = blame.sent_to(j), blame.first_failed(s, j)  # what the plane did: not the cause
        cls = next((c for c in cfg.spec.classes if c.name == j.job_class), None)
        out = classify(st, j.stop_kind, jd, made_progress, sent=sent, first=first,
                       plain=not made_progress and not self._uses_runtime(s, j, jd),
                       requeue_exit=cls.requeue_exit if cls is not None else (),
                       session_exit=(j.interactive or {}).get("exit"))
        nodes = {r.rank: r.node for r in ranks_for(j.placement or [], j.tasks_per_node)}
        end_notes.append(jd, j.id, j.attempt, out, st.ranks, nodes, batch=not j.command,
                         stderr_apart=stderr_apart(j.output, j.error), when=now)
        gpus = sum(len(p["gpus"]) for p in j.placement or [])
        lost = 0.0
        if j.start_time is not None:
            j.attained_gpu_s += gpus * max(0.0, now - j.start_time)
            if out.cause not in NO_LOST_WORK:
                # work since the last checkpoint, thrown away (training time, not wall time); a job
                # its idle policy requeued worked, at most, until it went idle
                until = idle_since(s, j.id, j.attempt) if out.cause == "idle" else None
                lost = gpus * lost_work_s(jd, j.attempt, start_time=j.start_time, checkpoint=checkpoint,
                                          now=min(now, until) if until is not None else now)
                j.lost_gpu_s += lost
        transitions.end_attempt(s, j, out.attempt_state, out.reason, now, exit_code=out.exit_code,
                                signal=out.signal, cause=out.cause, lost_gpu_s=lost)
        if self.ctx.flush_telemetry is not None:  # its GPUs' last readings, before they are judged
            self.ctx.flush_telemetry(s, j.id, j.attempt, now)
        store_ledger(s, j, attempt, jd, cfg.spec, now)  # where its GPU-seconds went (before the stop is cleared)
        self._note_suspects(s, j, first_failure(st.ranks, sent=sent, first=first), out.cause, now)
        max_retries = cls.max_retries if cls is not None else 0
        retry = out.job_state not in (JobState.REQUEUED, JobState.COMPLETED) and \
            should_retry(out, j.retries, max_retries)
        reason = out.reason
        if out.job_state == JobState.REQUEUED or retry:
            if j.last_checkpoint is not None and j.start_time is not None:
                j.progress_s += max(0.0, j.last_checkpoint - j.start_time)  # work the next attempt resumes from
            if retry:
                j.retries += 1
                wait = backoff_s(j.retries, self.ctx.params.retry_backoff_s, out.cause)
                j.retry_after = now + wait
                reason = (f"Retry {j.retries}/{max_retries} " + (f"in {wait:.0f}s " if wait else "")
                          + f"after {out.attempt_state}: {out.reason}")
            transitions.back_to_queue(j, now, reason)
        else:
            transitions.finish(j, out.job_state, out.reason, now, exit_code=out.exit_code, signal=out.signal)
        record(s, "backend", f"job.{out.attempt_state.lower()}",
               f"attempt {j.attempt} ended {out.attempt_state} ({out.cause})"
               + (f": {out.reason}" if out.reason not in ("", "None") else "")
               + (f"; lost {lost:.0f} GPU-s since its last checkpoint" if lost else ""), job_id=j.id, at=now,
               data={"exit_code": out.exit_code, "signal": out.signal, "attempt": j.attempt, "cause": out.cause,
                     "lost_gpu_s": lost})
        if retry:
            record(s, "scheduler", "job.retry", reason, job_id=j.id, at=now,
                   data={"retry": j.retries, "max_retries": max_retries, "backoff_s": None if j.retry_after is None else j.retry_after - now})

    @staticmethod
    def _uses_runtime(s: Session, j: JobRow, jd: JobDir) -> bool:
        """Has the job shown it uses trainyard's runtime (a step reported in an attempt, or its
        metrics file)? A job that has not is told by its exit codes and signals, as Slurm does."""
        reported = s.scalar(select(AttemptRow.id).where(AttemptRow.job_id == j.id,
                                                        AttemptRow.first_step_at.is_not(None)).limit(1))
        return reported is not None or jobfs.Tree(jd.root).exists(jd.metrics_file)

    def _note_suspects(self, s: Session, j: JobRow, bad: RankState | None, cause: str, now: float) -> None:
        """Remember the nodes this attempt's failure points at, so the next attempt goes elsewhere
        when it can: the node of a rank seen frozen (a hang), else of the rank that failed first
        (`bad`: a crash, out of memory). A lost node needs none: it is drained until it passes its
        checks. A symmetric hang (every rank's watchdog fired, none seen frozen) names no node."""
        frozen = self.frozen.pop_seen(j.id, j.attempt)
        if cause not in ("hung", "crash", "oom"):
            return
        blamed = sorted(frozen)
        if not blamed and cause != "hung":
            blamed = [bad.rank] if bad is not None else []
        where = {r.rank: r.node for r in ranks_for(j.placement or [], j.tasks_per_node)}
        suspects = sorted({where[r] for r in blamed if r in where})
        if not suspects:
            return
        keep = [n for n in (j.avoid_nodes or []) if n not in suspects]
        j.avoid_nodes = (keep + suspects)[-MAX_AVOIDED:]
        data: dict[str, Any] = {"nodes": suspects, "ranks": blamed, "cause": cause}
        record(s, "scheduler", "job.avoid_node",
               f"attempt {j.attempt} {cause} with rank {', '.join(map(str, blamed))} on {', '.join(suspects)}; "
               f"the next attempts go elsewhere when they can", job_id=j.id, at=now, data=data)
