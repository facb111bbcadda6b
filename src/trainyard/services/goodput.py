"""The goodput ledger of one attempt: where each of its allocated GPU-seconds went (issue 39).

A pure function (no I/O, no clock) from an attempt's facts to {bucket: GPU-seconds} over
`contracts.LEDGER_BUCKETS`, so that the loop (an ended attempt, `control/rules/ledger.py`), the
reports (a running one, split live when read) and the tests split alike. docs/accounting.md,
"Goodput ledger", defines each bucket; this is how each is measured:

- with the runtime's per-rank phase files (`contracts.PHASES_DIR`), per rank: `startup` from the
  attempt's start to `began`; between `began` and `last` the rank's `data_wait`,
  `checkpoint_stall` and `comm_wait` (its collective time beyond the fastest rank's), `compute` the
  rest; after `last` the save it waited for (`after_last.checkpoint_stall`), then `teardown` to the
  end. A running attempt's time since its newest step is a step in progress up to the stall limit
  (max(60 s, 10 × the median recent step)), `idle` beyond it; an ended one's is `idle` beyond the
  limit until the plane asked it to stop. The buckets are the ranks' mean, times the GPUs.
- without them (a bare job), coarsely: `startup` until its first output or first GPU activity,
  whichever came first (else its first telemetry sample, else nothing); `teardown` from the
  plane's stop request to the end; between them each GPU's telemetry sample below the threshold
  is `idle` for the period it covers, and time no sample covers is `compute` (unknown counts as used);
  when its class's idle policy requeued or cancelled it, at least the stretch from when the policy
  found it idle to the stop is `idle` (`idle_from`: the policy's own judgement, every GPU).
- `recompute`: the work after the last checkpoint that the next attempt redoes (`lost_gpu_s`),
  carved out of `compute`; lost work larger than that (measured as wall time since the checkpoint,
  for a job without step records: all of a bare job's attempt when it has none) comes out of the
  other buckets in `RECOMPUTE_FROM`'s order, so that `recompute` is the accounting's lost work.

The phase files are the job's own, so every figure in them is untrusted: a time that is no plain
number or lies outside the attempt is clamped into it, phases larger than the span are scaled to
fit it, NaN is nothing. Whatever the input, every bucket is ≥ 0 and they add up to
`gpus × (end − start)`: `compute` is computed last, as the remainder.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from trainyard import figures
from trainyard.contracts import LEDGER_BUCKETS

MAX_TIME = 1e11  # seconds since the epoch, as the progress reports' `time`
MAX_STEP_S = 1e7  # a step longer than about four months is not a figure
STALL_MIN_S = 60.0  # a running attempt's newest step older than this (and 10 × the median step) is idle
STALL_STEPS = 10.0
DEFAULT_IDLE_BELOW = 5.0  # percent utilization under which a telemetry sample is idle
# where the lost work comes out of: compute first; the rest only when the lost work (wall time since
# the checkpoint, for a job the runtime does not measure) is more than the attempt's compute
RECOMPUTE_FROM = ("compute", "idle", "data_wait", "comm_wait", "checkpoint_stall", "startup", "teardown")


def _num(v: object, limit: float = MAX_TIME) -> float | None:
    """A plain finite number of magnitude ≤ `limit` (not a bool), else None."""
    return figures.finite(v, limit=limit)


def _pos(v: object) -> float:
    """A non-negative duration from the job's file: anything else is 0."""
    x = _num(v)
    return x if x is not None and x > 0 else 0.0


@dataclass(frozen=True)
class RankPhases:
    """One rank's phase file (the format above `contracts.PHASES_DIR`), its figures made plain."""

    rank: int
    began: float | None
    last: float | None
    data_wait: float = 0.0
    checkpoint_stall: float = 0.0
    comm: float = 0.0
    after_checkpoint: float = 0.0
    recent: tuple[tuple[int, float, float], ...] = ()  # (step, step seconds, comm seconds), newest last

    @property
    def recent_steps(self) -> tuple[float, ...]:
        """The newest steps' times (those over zero)."""
        return tuple(step_s for _, step_s, _ in self.recent if step_s > 0)


def _recent(rows: object) -> tuple[tuple[int, float, float], ...]:
    """The phase file's `recent` rows that are plain figures: [step, step seconds, comm seconds]
    (a missing or null comm counts as 0); any other row is skipped."""
    out = []
    for r in rows[:1000] if isinstance(rows, list) else ():
        if not isinstance(r, list) or len(r) < 2:
            continue
        step, step_s = figures.step(r[0]), _num(r[1], MAX_STEP_S)
        comm = _num(r[2], MAX_STEP_S) if len(r) > 2 and r[2] is not None else 0.0
        if step is not None and step_s is not None and comm is not None and step_s >= 0 and comm >= 0:
            out.append((step, step_s, comm))
    return tuple(out)


def parse_phases(obj: object, attempt: int, rank: int) -> RankPhases | None:
    """The phase file's decoded JSON as `RankPhases`; None when it is not one for this attempt and
    rank (wrong version, attempt or rank, or no `began`)."""
    if not isinstance(obj, dict) or obj.get("v") != 1 or obj.get("attempt") != attempt or obj.get("rank") != rank:
        return None
    began = _num(obj.get("began"))
    if began is None:
        return None
    ph, after = obj.get("phases"), obj.get("after_last")
    ph = ph if isinstance(ph, dict) else {}
    after = after if isinstance(after, dict) else {}
    return RankPhases(rank=rank, began=began, last=_num(obj.get("last")), data_wait=_pos(ph.get("data_wait")),
                      checkpoint_stall=_pos(ph.get("checkpoint_stall")), comm=_pos(ph.get("comm")),
                      after_checkpoint=_pos(after.get("checkpoint_stall")), recent=_recent(obj.get("recent")))


@dataclass(frozen=True)
class Sample:
    """One GPU's telemetry over `period_s` before `time` (a `gpu_samples` row)."""

    time: float
    period_s: float
    util: float


@dataclass(frozen=True)
class AttemptFacts:
    """What the split reads of one attempt. `end` is now for a running one (`running`)."""

    start: float
    end: float
    gpus: int
    lost_gpu_s: float = 0.0
    stop_at: float | None = None  # when the plane asked it to stop
    running: bool = False
    ranks: tuple[RankPhases, ...] = ()
    first_output_at: float | None = None
    samples: tuple[Sample, ...] = field(default=())
    idle_below: float = DEFAULT_IDLE_BELOW  # percent
    idle_from: float | None = None  # its class's idle policy found it idle since then, until it stopped it


def empty() -> dict[str, float]:
    return {b: 0.0 for b in LEDGER_BUCKETS}


def allocated(f: AttemptFacts) -> float:
    """The attempt's GPU-seconds, what the buckets add up to: gpus × (end − start), 0 for nonsense."""
    start, end, gpus = _num(f.start), _num(f.end), f.gpus if isinstance(f.gpus, int) and f.gpus > 0 else 0
    if start is None or end is None or end <= start:
        return 0.0
    return gpus * (end - start)


def split(f: AttemptFacts) -> dict[str, float]:
    """{bucket: GPU-seconds} of the attempt, every bucket ≥ 0, adding up to `allocated(f)`."""
    total = allocated(f)
    if total <= 0:
        return empty()
    start, end = float(f.start), float(f.end)
    ranks = [r for r in f.ranks if r.began is not None]
    per_s = _phase_split(f, ranks, start, end) if ranks else _coarse_split(f, start, end)
    out = {b: per_s.get(b, 0.0) * (total / (end - start)) for b in LEDGER_BUCKETS}
    # recompute: the work since the last checkpoint, carved out of compute, then (lost work measured
    # as wall time: a job without step records or checkpoints) out of the rest, in RECOMPUTE_FROM's order
    owed = min(_pos(f.lost_gpu_s), total)
    for b in RECOMPUTE_FROM:
        take = min(owed, max(0.0, out[b]))
        out[b] -= take
        out["recompute"] += take
        owed -= take
    return _exact(out, total)


def _exact(out: dict[str, float], total: float) -> dict[str, float]:
    """Every bucket clamped ≥ 0, the others scaled down if they exceed `total`, compute the rest."""
    others = {b: max(0.0, v) if math.isfinite(v) else 0.0 for b, v in out.items() if b != "compute"}
    s = math.fsum(others.values())
    if s > total:
        others = {b: v * total / s for b, v in others.items()}
        s = math.fsum(others.values())
    res = {b: others.get(b, 0.0) for b in LEDGER_BUCKETS}
    res["compute"] = max(0.0, total - s)
    return res


def _clamp(t: float | None, lo: float, hi: float) -> float:
    return lo if t is None else min(max(t, lo), hi)


def _stall_limit(r: RankPhases) -> float:
    steps = r.recent_steps[-64:]
    med = statistics.median(steps) if steps else 0.0
    return max(STALL_MIN_S, STALL_STEPS * min(med, MAX_TIME))


def _phase_split(f: AttemptFacts, ranks: list[RankPhases], start: float, end: float) -> dict[str, float]:
    """Seconds per bucket, the ranks' mean (each rank's add up to end − start)."""
    comm_min = min(r.comm for r in ranks)
    sums: dict[str, float] = dict.fromkeys(LEDGER_BUCKETS, 0.0)
    stop = _num(f.stop_at)
    for r in ranks:
        for b, v in _rank_split(r, r.comm - comm_min, start, end, stop, f.running).items():
            sums[b] += v
    return {b: v / len(ranks) for b, v in sums.items()}


def _rank_split(r: RankPhases, comm_wait: float, start: float, end: float, stop: float | None,
                running: bool) -> dict[str, float]:
    out = dict.fromkeys(LEDGER_BUCKETS, 0.0)
    began = _clamp(r.began, start, end)
    stepped = r.last is not None
    last = _clamp(r.last, began, end) if stepped else began
    out["startup"] = began - start
    span = last - began
    waits = {"data_wait": r.data_wait, "checkpoint_stall": r.checkpoint_stall, "comm_wait": max(0.0, comm_wait)}
    w = math.fsum(waits.values())
    scale = span / w if w > span else 1.0
    for b, v in waits.items():
        out[b] = v * scale
    out["compute"] = max(0.0, span - w * scale)
    tail = end - last
    ck = min(r.after_checkpoint, tail)
    out["checkpoint_stall"] += ck
    rest = tail - ck
    busy = "compute" if stepped else "startup"  # time after the last step: a step in progress
    if running:
        held = rest if not stepped else min(rest, _stall_limit(r))
        out[busy] += held
        out["idle"] += rest - held
        return out
    before_stop = rest if stop is None else _clamp(stop - (last + ck), 0.0, rest)
    if not stepped:  # still starting up when the plane asked it to stop (or it ended)
        out["startup"] += before_stop
        out["teardown"] += rest - before_stop
        return out
    idle = max(0.0, before_stop - _stall_limit(r))
    out["idle"] += idle
    out["teardown"] += rest - idle
    return out


def _coarse_split(f: AttemptFacts, start: float, end: float) -> dict[str, float]:
    """Seconds per bucket of a job without phase files, per GPU (the samples are per GPU)."""
    out = dict.fromkeys(LEDGER_BUCKETS, 0.0)
    samples = [(t, p, u) for x in f.samples
               if (t := _num(x.time)) is not None and (p := _num(x.period_s)) is not None and p > 0
               and (u := _num(x.util)) is not None]
    below = _num(f.idle_below)
    below = DEFAULT_IDLE_BELOW if below is None else below
    active = [t - p for t, p, u in samples if u >= below]
    marks = [m for m in (_num(f.first_output_at), min(active) if active else None) if m is not None]
    if marks:
        begun = min(marks)
    else:
        begun = min((t - p for t, p, _ in samples), default=start)  # launch done: the first sample
    begun = _clamp(begun, start, end)
    stop = _num(f.stop_at)
    down = end if stop is None else _clamp(stop, begun, end)
    out["startup"] = begun - start
    out["teardown"] = end - down
    mid = down - begun
    gpus = max(1, f.gpus)
    idle_gpu_s = math.fsum(max(0.0, min(t, down) - max(t - p, begun)) for t, p, u in samples if u < below)
    out["idle"] = min(idle_gpu_s / gpus, mid)
    idle_from = _num(f.idle_from)
    if idle_from is not None:  # the policy's own judgement: every GPU idle from then to the stop
        out["idle"] = max(out["idle"], down - _clamp(idle_from, begun, down))
    out["compute"] = mid - out["idle"]
    return out


def share(buckets: dict[str, float]) -> float | None:
    """Goodput: the compute share of the allocated GPU-seconds (None when nothing was allocated)."""
    total = math.fsum(buckets.values())
    return buckets.get("compute", 0.0) / total if total > 0 else None


def scaled(buckets: dict[str, Any] | None, factor: float) -> dict[str, float]:
    """A stored ledger (JSON: anything may be in it) as plain buckets, times `factor`."""
    src = buckets if isinstance(buckets, dict) else {}
    return {b: _pos(src.get(b)) * factor for b in LEDGER_BUCKETS}
