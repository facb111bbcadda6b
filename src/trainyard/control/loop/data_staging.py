"""The data step of an attempt's start: every node of the gang stages every dataset of the job,
then the ranks start (issue 41, Deliver 2; docs/control-plane.md, "Storage").

A job with datasets (`jobs.datasets`, pinned at submit) is placed like any other; its attempt
starts CONFIGURING with reason DataStaging (after ImagePull when it has an image too: the image
first, then the data, one after the other — the pull may fail fast, and a pull's time is not the
job's while staging's is). On a launch thread (`launch_threads.py`; the loop never waits):

1. each node stages each dataset (`Backend.stage_dataset`, all pairs at once): a node that holds
   it answers at once; the entry is pinned for the attempt until the backend's `release`;
2. the store's `node_datasets` rows of each node are made to match its cache (`services/dataset_nodes.py`):
   what it staged, what it evicted to make room;
3. an event `job.data_staged` says, per node and dataset, the seconds and whether it copied or
   found the data cached; the attempt turns RUNNING and is launched with each node's paths
   (`LaunchSpec.dataset_paths`: `$TRAINYARD_DATASET_<NAME>` names the copy on the rank's own node).

Unlike an image pull, the time is the job's: its start time and its attempt's `started_at` stay at
the placement, so the goodput ledger puts the staging in the attempt's `startup`.

A staging that fails ends the attempt with the cause `DataStagingError`: the user's kinds (checksum
mismatch, not found, forbidden) fail the job; the source's or the node's (unreachable, disk full)
put it back in the queue after a pause not counted against its retries, and fail it after
`start_failure.OUTSIDE_FAULTS_MAX` such attempts in a row, so that an outage does not spin it for
ever (one rule with ImagePull's: `start_failure.py`).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from trainyard.backends.base import BackendError, LaunchSpec
from trainyard.control.loop import start_failure
from trainyard.control.loop.context import LoopContext
from trainyard.services import dataset_nodes, datasets
from trainyard.services.errors import ServiceError
from trainyard.services.events import record
from trainyard.staging.types import (
    DATA_STAGING,
    STAGING_ERROR,
    UNREACHABLE,
    DatasetRef,
    DataStagingError,
    StagedDataset,
    dataset_var,
)
from trainyard.states import JobState
from trainyard.store.models import JobRow

log = logging.getLogger("trainyard.loop")

MAX_THREADS = 32
CAUSE_USER, CAUSE_SOURCE = "data_staging", "data_staging_source"
STEP = start_failure.Step(STAGING_ERROR, CAUSE_USER, CAUSE_SOURCE, "the source's or the node's")

__all__ = ["DATA_STAGING", "prepare"]


def prepare(ctx: LoopContext, spec: LaunchSpec) -> LaunchSpec | None:
    """The spec to launch, its datasets on every node (`dataset_paths` filled); None when the
    attempt ended here (a staging failed: recorded) or is no longer the job's current one."""
    nodes = list(dict.fromkeys(r.node for r in sorted(spec.ranks, key=lambda r: r.rank)))
    pairs = [(n, ref) for n in nodes for ref in spec.datasets]
    staged: dict[tuple[str, str], StagedDataset] = {}
    failure: tuple[DataStagingError, str] | None = None
    began = time.monotonic()
    try:
        with ctx.store.session() as s:
            access = datasets.source_access(ctx.configs.current(s).spec)
    except ServiceError as e:  # a credentials file the plane cannot use: the operator's fault
        access, failure = None, (DataStagingError(UNREACHABLE, spec.datasets[0].label, e.message), "")
    if access is not None:
        job = (spec.job_id, spec.attempt)
        with ThreadPoolExecutor(max(1, min(len(pairs), MAX_THREADS)), thread_name_prefix="trainyard-stage") as pool:
            futures = {(n, ref.label): (ref, pool.submit(ctx.backend.stage_dataset, n, ref, access, job))
                       for n, ref in pairs}
            for (node, label), (ref, f) in futures.items():
                try:
                    staged[(node, label)] = f.result()
                except DataStagingError as e:
                    failure = _worse(failure, (e, node))
                except BackendError as e:
                    failure = _worse(failure, (DataStagingError(UNREACHABLE, label, str(e)), node))
    if failure is not None:
        try:  # nothing of it runs: the entries it pinned (those that did stage) may be evicted again
            ctx.backend.release(spec.job_id, spec.attempt)
        except BackendError as e:
            log.warning("job %s attempt %s: release after a failed staging: %s", spec.job_id, spec.attempt, e)
    _record_nodes(ctx, nodes)
    if failure is not None:
        _failed(ctx, spec, *failure)
        return None
    if not _running(ctx, spec, staged, time.monotonic() - began, nodes):
        return None
    paths: dict[str, dict[str, str]] = {n: {} for n in nodes}
    for (node, label), got in staged.items():
        ref = next(r for r in spec.datasets if r.label == label)
        paths[node][dataset_var(ref.name)] = got.path
    return replace(spec, dataset_paths=paths)


def _worse(old: tuple[DataStagingError, str] | None,
           new: tuple[DataStagingError, str]) -> tuple[DataStagingError, str]:
    """The failure that decides: the user's (it fails the job) over the source's (a requeue)."""
    if old is None or (old[0].source_fault and not new[0].source_fault):
        return new
    return old


def _record_nodes(ctx: LoopContext, nodes: list[str]) -> None:
    """Each node's `node_datasets` rows as its cache now is (what it staged, what it evicted)."""
    found = {}
    for n in nodes:
        try:
            found[n] = ctx.backend.dataset_entries(n)
        except (BackendError, OSError) as e:
            log.warning("node %s: cannot list its dataset cache: %s", n, e)
    now = ctx.clock()
    with ctx.lock, ctx.store.session.begin() as s:
        for n, entries in found.items():
            dataset_nodes.record_entries(s, n, entries, now)


def _running(ctx: LoopContext, spec: LaunchSpec, staged: dict[tuple[str, str], StagedDataset], took: float,
             nodes: list[str]) -> bool:
    """CONFIGURING → RUNNING; the start time stays (the staging is the job's startup); False when
    the attempt is no longer the job's current one."""
    now = ctx.clock()
    per_node = {n: {label: {"seconds": round(got.seconds, 3), "copied": got.copied, "bytes": got.bytes}
                    for (node, label), got in sorted(staged.items()) if node == n} for n in nodes}
    copied = sum(1 for got in staged.values() if got.copied)
    with ctx.lock, ctx.store.session.begin() as s:
        j = s.get(JobRow, spec.job_id)
        if j is None or j.attempt != spec.attempt:
            return False
        if j.state == JobState.CONFIGURING:
            j.state, j.reason = JobState.RUNNING, "None"
        labels = ", ".join(r.label for r in spec.datasets)
        record(s, "scheduler", "job.data_staged",
               f"attempt {spec.attempt}: {labels} ready on {', '.join(nodes)} in {took:.1f}s "
               f"({copied} copied, {len(staged) - copied} cached)",
               job_id=j.id, at=now, data={"attempt": spec.attempt, "seconds": round(took, 3), "nodes": per_node})
    return True


def _failed(ctx: LoopContext, spec: LaunchSpec, e: DataStagingError, node: str) -> None:
    start_failure.failed(ctx, spec, STEP, str(e), node, e.source_fault,
                         {"kind": e.kind, "source_fault": e.source_fault, "dataset": e.dataset})


def refs_of(records: list[dict] | None) -> tuple[DatasetRef, ...]:
    """A job's `jobs.datasets` as the launch carries them."""
    return tuple(datasets.refs_of(records))
