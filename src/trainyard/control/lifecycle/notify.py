"""`--mail-type`'s messages, POSTed as JSON to the cluster's webhook (`notify:` in the configuration).

Slurm mails; trainyard posts to a webhook, which may mail, chat or page. The jobs' transitions
note what happened (`services/notices.py`) and, once their transaction commits, hand the notes
to `Notifier.put`, which only appends them to a queue: the control loop and the API never wait
for a receiver. One thread of its own sends them in the order they were committed (so a job's
BEGIN always comes before its END), each POST bounded by `timeout_s`; a POST that fails (no
answer, a connection refused, a status other than 2xx) is tried `retries` more times, 0.5 s, 1 s,
2 s … apart, then dropped with a line in the log. Sent, failed, retried and dropped messages are
counted (`stats`; `/metrics` has them as `trainyard_notifications_total{result}`). A queue over
`MAX_QUEUED` drops the newest note, counted too: a receiver that is down for hours must not grow
the plane's memory without end. Delivery is at most once: notes still queued when the plane is
killed are gone.

What is sent (spec/mail_types.py for the types):
- BEGIN at each attempt's start; REQUEUE when it goes back to the queue; TIME_LIMIT when the plane
  starts stopping it at its time limit; INVALID_DEPEND when its dependency can never be met.
- At its end one message: FAIL if it asked for FAIL and ended FAILED, TIMEOUT, NODE_FAIL or
  OUT_OF_MEMORY, else END if it asked for END (any final state, CANCELLED included).
- IDLE_WARNING when an idle job is about to be acted on by its class's idle policy
  (`idle_ends_at`: when, `idle_action`: notify, requeue, cancel or timeout, `idle_since` in the
  JSON), then IDLE when it is (`idle_since`, `idle_action`), whatever its mail types: `yard alloc`
  asks for none, and an owner about to lose the GPUs should hear of it (control/loop/idle.py;
  each once per idle stretch).
- TIME_LIMIT_50/80/90 when a running attempt has run that share of its limit (its own --time, or
  its class's max run time when shorter or alone): clocks kept here from each BEGIN and stopped
  by the attempt's end or requeue. A restarted plane sets them again for the jobs running then
  (a share already past is not sent late).

The JSON: `event` (the mail type), `job_id`, `array_job_id`, `array_task_id`, `name`, `user`,
`team`, `class`, `pool`, `state`, `reason`, `exit_code`, `signal`, `attempt`, `mail_type`,
`mail_user` (its --mail-user, else the user), `submit_time`, `start_time`, `end_time`,
`time_limit_s`, `time` (UNIX seconds) and `time_utc`, `cluster`, `message` (Slurm's mail subject,
"Slurm Job_id=12 Name=train Ended, Run time 00:01:02, COMPLETED, ExitCode 0") and `seq` (a
number that grows by one per message sent by this plane).
"""

from __future__ import annotations

import heapq
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from sqlalchemy import select

from trainyard.spec.mail_types import FAILED_STATES, TIME_FRACTIONS, wanted
from trainyard.services.notices import iso, payload
from trainyard.spec.models import NotifySpec
from trainyard.store.models import JobRow

log = logging.getLogger("trainyard.notify")
MAX_QUEUED = 10_000
BACKOFF_S = 0.5


@dataclass
class NotifyStats:
    sent: int = 0
    failed: int = 0  # dropped after every try failed
    retried: int = 0
    dropped: int = 0  # the queue was full


def _hms(secs: float | None) -> str:
    s = max(0, int(secs or 0))
    d, s = divmod(s, 86400)
    text = f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{d}-{text}" if d else text


def subject(event: str, p: dict[str, Any]) -> str:
    """Slurm's mail subject for `event` (its wording, so a mail filter written for Slurm works)."""
    head = f"Slurm Job_id={p['job_id']} Name={p['name']}"
    ran = (p.get("end_time") or p["time"]) - (p.get("start_time") or p["time"])
    if event == "BEGIN":
        return f"{head} Began, Queued time {_hms(p['time'] - p['submit_time'])}"
    if event in ("END", "FAIL"):
        what = "Failed" if event == "FAIL" else "Ended"
        code = p["exit_code"] if p["exit_code"] is not None else (128 + p["signal"] if p["signal"] else 0)
        return f"{head} {what}, Run time {_hms(ran if p.get('start_time') else 0)}, {p['state']}, ExitCode {code}"
    if event == "REQUEUE":
        return f"{head} Requeued, {p['reason']}"
    if event == "TIME_LIMIT":
        return f"{head} Reached time limit, Run time {_hms(ran)}"
    if event in TIME_FRACTIONS:
        return f"{head} Reached {int(TIME_FRACTIONS[event] * 100)}% of time limit, Run time {_hms(ran)}"
    if event == "INVALID_DEPEND":
        return f"{head} Invalid dependency"
    if event == "IDLE_WARNING":
        at, action = p.get("idle_ends_at") or p["time"], p.get("idle_action") or "timeout"
        what = IDLE_WARNING_WORDS.get(action, IDLE_WARNING_WORDS["timeout"])
        return f"{head} Idle, {what.format(at=iso(at))} unless used, in {_hms(at - p['time'])}"
    if event == "IDLE":
        since, action = p.get("idle_since") or p["time"], p.get("idle_action") or "timeout"
        return f"{head} Idle since {iso(since)}, {IDLE_WORDS.get(action, action)}"
    return f"{head} {event}"


# The idle step's notes (control/loop/idle_actions.py): what will happen, what happened
IDLE_WARNING_WORDS = {"timeout": "ends at {at} (IdleTimeout)", "cancel": "cancelled at {at} (Idle)",
                      "requeue": "requeued at {at} (Idle)", "notify": "reported at {at}"}
IDLE_WORDS = {"timeout": "ended (IdleTimeout)", "cancel": "cancelled (Idle)", "requeue": "requeued (Idle)",
              "notify": "still running (its class's idle action is notify)"}


class Notifier:
    """The queue and its sending thread (module docstring). `settings()` gives the configuration's
    `notify:` (None: nothing is sent), `limit_of(class)` a class's max run time, `cluster` the
    cluster's name; `post` sends one body (tests replace it)."""

    def __init__(self, settings: Callable[[], NotifySpec | None], limit_of: Callable[[str], float | None],
                 cluster: Callable[[], str], *, clock: Callable[[], float] = time.time) -> None:
        self.settings, self.limit_of, self.cluster, self.clock = settings, limit_of, cluster, clock
        self.stats = NotifyStats()
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._timers: list[tuple[float, int, int, str, dict[str, Any]]] = []  # (due, job, attempt, type, begin note)
        self._attempt: dict[int, int] = {}  # job → the attempt its clocks belong to (0: stopped)
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the committing side: never blocks --------------------------------------------------------
    def put(self, items: list[dict[str, Any]]) -> None:
        for item in items:
            if self._q.qsize() >= MAX_QUEUED:
                self.stats.dropped += 1
                log.warning("notification queue full (%d): dropped %s of job %s", MAX_QUEUED, item["kind"],
                            item["job_id"])
                continue
            self._q.put_nowait(item)

    def start(self, running: Sequence[dict[str, Any]] = ()) -> None:
        """Start the thread; `running`: begin notes of the attempts running now (their clocks)."""
        for p in running:
            self._clock_start(p, late=False)
        self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._q.put_nowait(None)
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the sending thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            wait = 1.0
            if self._timers:
                wait = max(0.0, min(wait, self._timers[0][0] - self.clock()))
            try:
                item = self._q.get(timeout=wait)
            except queue.Empty:
                item = None
            if item is None and self._stop.is_set():
                return
            try:
                self._due_clocks()
                if item is not None:
                    self._handle(item)
            except Exception:  # noqa: BLE001 - a bad note must not end the thread
                log.exception("notification of job %s failed", item and item.get("job_id"))

    def _handle(self, p: dict[str, Any]) -> None:
        want, kind = wanted(p["mail_type"]), p["kind"]
        if kind == "begin":
            self._clock_start(p, late=True)
            if "BEGIN" in want:
                self._send("BEGIN", p)
            return
        if kind in ("idle_warning", "idle"):  # noted for every idle job, whatever it asked (module docstring)
            self._send("IDLE_WARNING" if kind == "idle_warning" else "IDLE", p)
            return
        if kind in ("end", "requeue", "time_limit"):
            self._attempt[p["job_id"]] = 0  # this attempt's TIME_LIMIT_NN clocks stop
        if kind == "end":
            if "FAIL" in want and p["state"] in FAILED_STATES:
                self._send("FAIL", p)
            elif "END" in want:
                self._send("END", p)
            self._attempt.pop(p["job_id"], None)
            return
        event = {"requeue": "REQUEUE", "time_limit": "TIME_LIMIT", "invalid_depend": "INVALID_DEPEND"}.get(kind)
        if event is not None and event in want:
            self._send(event, p)

    def _clock_start(self, p: dict[str, Any], late: bool) -> None:
        fractions = {t: f for t, f in TIME_FRACTIONS.items() if t in wanted(p["mail_type"])}
        limits = [x for x in (p.get("time_limit_s"), self.limit_of(p["class"])) if x]
        if not fractions or not limits or p.get("start_time") is None:
            return
        self._attempt[p["job_id"]] = p["attempt"]
        now = self.clock()
        for t, f in fractions.items():
            due = p["start_time"] + f * min(limits)
            if late or due > now:
                heapq.heappush(self._timers, (due, p["job_id"], p["attempt"], t, p))

    def _due_clocks(self) -> None:
        now = self.clock()
        while self._timers and self._timers[0][0] <= now:
            due, job, attempt, t, p = heapq.heappop(self._timers)
            if self._attempt.get(job) == attempt:
                self._send(t, {**p, "time": now})

    def _send(self, event: str, p: dict[str, Any]) -> None:
        cfg = self.settings()
        if cfg is None:
            return  # no webhook: the submitter was warned
        self._seq += 1
        body = {k: v for k, v in p.items() if k != "kind"}
        body.update(event=event, time_utc=iso(body["time"]), cluster=self.cluster(), seq=self._seq,
                    message=subject(event, body))
        data = json.dumps(body).encode()
        for i in range(cfg.retries + 1):
            if i:
                self.stats.retried += 1
                if self._stop.wait(min(BACKOFF_S * 2 ** (i - 1), 5.0)):
                    return
            try:
                self.post(cfg, data)
                self.stats.sent += 1
                return
            except (OSError, ValueError, urllib.error.URLError) as e:
                why = e
        self.stats.failed += 1
        log.warning("webhook %s: %s of job %s not delivered after %d tries: %s", cfg.webhook, event, p["job_id"],
                    cfg.retries + 1, why)

    @staticmethod
    def post(cfg: NotifySpec, data: bytes) -> None:
        """One POST; raises on anything but a 2xx answer within the time-out."""
        req = urllib.request.Request(cfg.webhook, data=data, method="POST",
                                     headers={"Content-Type": "application/json", "User-Agent": "trainyard-notify",
                                              **cfg.headers})
        with urllib.request.urlopen(req, timeout=cfg.timeout_s) as r:  # noqa: S310 - the operator's URL
            r.read(65536)
            if not 200 <= r.status < 300:
                raise ValueError(f"HTTP {r.status}")


def running_notes(s: Any, now: float) -> list[dict[str, Any]]:
    """Begin notes of the running jobs that asked for a TIME_LIMIT_NN: their clocks, after a restart."""
    rows = s.scalars(select(JobRow).where(JobRow.state == "RUNNING", JobRow.mail_type.like("%TIME_LIMIT_%")))
    return [payload(j, "begin", now) for j in rows]
