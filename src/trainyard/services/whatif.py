"""What a configuration change would do, replayed on the cluster's own history (issue 40).

`what_if` validates a proposed configuration exactly as `config.apply` does (`config.check`: the
same errors, field named) and stores nothing; it turns the store's jobs submitted in a window into
the trainyard trace (`history_records`, the records `yard trace export` writes) and replays them
through the configuration in force and through the proposal with the simulator (`sim.history.replay`,
the same engine and the same workload builder as `yard sim --format trainyard`), and returns both
sets of figures per team and per class with their deltas (proposed − in force).

The store is read in one short session; the replays run after it is closed, outside the plane's
lock, so weeks of history never hold the loop up; a long history's two replays run side by side
(`replay_both`).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services import config
from trainyard.services.accounting import Window, window
from trainyard.services.auth import Principal
from trainyard.services.errors import Forbidden
from trainyard.services.plane_facade import Plane
from trainyard.sim.history import replay, true_run_s
from trainyard.spec.models import parse_config
from trainyard.states import TERMINAL_STATES
from trainyard.store.models import AttemptRow, JobRow

DEFAULT_SINCE = "now-14days"
# Below this many jobs both replays run here, one after the other: a child process's start (about
# a second: Python and the engine imported afresh) would cost more than the replay it takes over.
PARALLEL_FROM_JOBS = 2000
_TERMINAL = {str(s) for s in TERMINAL_STATES}


def history_window(since: str | float | None, until: str | float | None, now: float) -> Window:
    """The window of submit times (default: the last 14 days to now); a bad time is a 400 naming
    `since` or `until`."""
    return window(DEFAULT_SINCE if since is None else since, until, now, default_start=now,
                  start_field="since", end_field="until")


def history_records(s: Session, win: Window, now: float) -> list[dict[str, Any]]:
    """The trainyard trace of the jobs submitted in `win` that ever started (`sim/history.py`
    defines each field); an attempt still running counts up to `now`."""
    j = JobRow
    jobs = s.execute(select(j.id, j.name, j.user, j.team, j.job_class, j.pool, j.submit_time, j.eligible_time, j.gpus,
                            j.gpus_per_node, j.nodes_min, j.nodes_max, j.gpu_mem_mib, j.time_limit_s,
                            j.checkpoint_interval_s, j.lost_gpu_s, j.state)
                     .where(j.submit_time >= win.start, j.submit_time < win.end).order_by(j.submit_time, j.id)).all()
    runs: dict[int, list[tuple[float, float, int, str]]] = {}
    for a in s.execute(select(AttemptRow.job_id, AttemptRow.started_at, AttemptRow.ended_at, AttemptRow.gpus,
                              AttemptRow.cause).join(JobRow, JobRow.id == AttemptRow.job_id)
                       .where(j.submit_time >= win.start, j.submit_time < win.end)):
        runs.setdefault(a.job_id, []).append((a.started_at, now if a.ended_at is None else a.ended_at, a.gpus, a.cause))
    out: list[dict[str, Any]] = []
    for r in jobs:
        attempts = runs.get(r.id)
        if not attempts:
            continue  # never started: its run time is unknown
        gpn = r.gpus_per_node
        max_gpus = r.gpus if gpn is None else gpn * r.nodes_max
        out.append({
            "id": r.id, "name": r.name, "user": r.user, "team": r.team, "class": r.job_class, "pool": r.pool,
            "submit_time": r.submit_time if r.eligible_time is None else r.eligible_time,
            "gpus": r.gpus, "gpus_per_node": gpn, "nodes_min": r.nodes_min, "nodes_max": r.nodes_max,
            "gpu_mem_mib": r.gpu_mem_mib, "time_limit_s": r.time_limit_s,
            "checkpoint_interval_s": r.checkpoint_interval_s,
            "run_time_s": true_run_s(((a, b, g or r.gpus) for a, b, g, _ in attempts), r.lost_gpu_s or 0.0, max_gpus),
            "run_time_known": r.state in _TERMINAL, "attempts": len(attempts),
            "preemptions": sum(1 for *_, cause in attempts if cause == "preempted"),
            "lost_gpu_s": r.lost_gpu_s or 0.0, "state": r.state,
        })
    return out


def export(plane: Plane, by: Principal, since: str | float | None, until: str | float | None) -> dict[str, Any]:
    """`yard trace export`: the window and its records (admin only: every user's jobs)."""
    if not by.is_admin:
        raise Forbidden("only an admin can export the cluster's history")
    now = plane.clock()
    win = history_window(since, until, now)
    with plane.store.session() as s:
        records = history_records(s, win, now)
    return {"since": win.start, "until": win.end, "jobs": len(records), "records": records}


def replay_text(records: list[dict[str, Any]], text: str, name: str) -> dict[str, Any]:
    """`sim.history.replay` of a configuration given as its (already validated) text: what a
    child process is handed, a string rather than the parsed model."""
    return replay(records, parse_config(text), name=name)


def replay_both(records: list[dict[str, Any]], a: tuple[str, str], b: tuple[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The replays of two configurations (text, name), side by side where the machine has a core
    to spare: `b` in a child process (spawned: the plane's threads are not forked), `a` here. Each
    replay is deterministic, so where it runs changes no figure; a 30-day history takes one
    replay's time rather than two (bench/whatif.py)."""
    if (os.cpu_count() or 1) < 2 or len(records) < PARALLEL_FROM_JOBS:
        return replay_text(records, *a), replay_text(records, *b)
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        later = pool.submit(replay_text, records, *b)
        first = replay_text(records, *a)
        return first, later.result()


def _delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """b − a for every number both have, per group (a team or class missing on one side: absent)."""
    out: dict[str, Any] = {}
    for name in sorted(set(a) & set(b)):
        out[name] = {k: round(b[name][k] - v, 4) for k, v in a[name].items()
                     if isinstance(v, (int, float)) and isinstance(b[name].get(k), (int, float))}
    return out


def what_if(plane: Plane, by: Principal, text: str, since: str | float | None = None,
            until: str | float | None = None) -> dict[str, Any]:
    """The proposal `text` against the configuration in force, both replayed on the history of
    the window (see the module notes). Nothing is stored.

    Raises:
        Forbidden: not an admin (as `apply`).
        ServiceError: `text` is not a configuration `apply` would take (the same error), or a bad time.
    """
    if not by.is_admin:
        raise Forbidden("only an admin can change the cluster configuration")
    config.check(text)  # the errors of apply; replayed below from the text, as the child process takes it
    now = plane.clock()
    win = history_window(since, until, now)
    with plane.store.session() as s:
        current = plane.configs.current(s)
        records = history_records(s, win, now)
    before, after = replay_both(records, (current.text, f"configuration version {current.version}"),
                                (text, "proposed configuration"))
    return {
        "since": win.start, "until": win.end, "jobs": len(records), "version": current.version,
        "in_force": before, "proposed": after,
        "delta": {"metrics": _delta({"all": before["metrics"]}, {"all": after["metrics"]})["all"],
                  "teams": _delta(before["teams"], after["teams"]),
                  "classes": _delta(before["classes"], after["classes"])},
    }
