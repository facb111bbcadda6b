"""The image step of an attempt's start: pin the digest, pull on every node, then let it run.

A job with an image (`jobs.container`) is placed like any other, but its attempt starts
CONFIGURING with reason ImagePull (Slurm shows node boot the same way): the GPUs are held, the
ranks do not exist yet, and the time is not the job's (its start time is set when the ranks
start, as Slurm resets a job's start after its nodes are configured). On a launch thread
(`launch_threads.py`; the loop never waits for a pull):

1. the digest is resolved once, at the first attempt, and recorded on the job (`jobs.image_digest`);
   every later attempt and every node of the gang runs that digest, whatever the tag says since;
2. each node pulls it (`Backend.prepare_image`, all nodes at once): a node that has it answers at
   once, and a node's cache never pulls the same image twice;
3. the attempt turns RUNNING and is launched with the pinned image.

A pull that fails ends the attempt with a cause of its own, `ImagePullError`: the user's (no such
image, an image the cache refuses) fails the job; the registry's or the node's (registry down,
credentials refused, disk full) puts it back in the queue after a pause, not counted against its
retries, and fails it after `start_failure.OUTSIDE_FAULTS_MAX` such attempts in a row so that an
outage does not spin it for ever (`start_failure.py`, the same rule as a dataset's staging).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from trainyard.backends.base import ContainerLaunch, LaunchSpec
from trainyard.contracts import JobVar
from trainyard.control.loop import start_failure
from trainyard.control.loop.context import LoopContext
from trainyard.images.types import ImagePullError, RegistryAccess
from trainyard.services import images as image_rules
from trainyard.services import transitions
from trainyard.services.events import record
from trainyard.spec.image_ref import ImageRef, parse_image
from trainyard.staging.types import DATA_STAGING
from trainyard.states import JobState
from trainyard.store.models import JobRow

log = logging.getLogger("trainyard.loop")

IMAGE_PULL = "ImagePull"  # the reason a CONFIGURING job shows
PULL_ERROR = "ImagePullError"
# the user's and the outside's causes (`start_failure.py`: the rule after a failed pull)
STEP = start_failure.Step(PULL_ERROR, "image_pull", "image_pull_registry", "the registry's or the node's")


def prepare(ctx: LoopContext, spec: LaunchSpec) -> LaunchSpec | None:
    """The spec to launch, its image pinned and on every node; None when the attempt ended here
    (the pull failed: recorded) or is no longer the job's current one."""
    c = spec.container
    assert c is not None
    with ctx.store.session() as s:
        cfg = ctx.configs.current(s)
    access = image_rules.registry_access(cfg.spec)
    ref = parse_image(c.options.image)
    began = time.monotonic()
    node = ""
    try:
        digest = c.digest or _pin(ctx, spec, ref, ref.digest or _resolve(ref, access))
        pinned = ref.pinned(digest).canonical()
        nodes = list(dict.fromkeys(r.node for r in sorted(spec.ranks, key=lambda r: r.rank)))
        with ThreadPoolExecutor(max(1, len(nodes)), thread_name_prefix="trainyard-pull") as pool:
            futures = {n: pool.submit(ctx.backend.prepare_image, n, pinned, access) for n in nodes}
            for node, f in futures.items():
                f.result()
    except ImagePullError as e:
        _failed(ctx, spec, e, node)
        return None
    took = time.monotonic() - began
    if not _running(ctx, spec, digest, took, nodes):
        return None
    env = {**spec.env, JobVar.IMAGE: pinned, JobVar.IMAGE_DIGEST: digest}  # what an exported model's lineage records
    return replace(spec, env=env, container=ContainerLaunch(c.options, pinned, digest))


def _resolve(ref: ImageRef, access: RegistryAccess) -> str:
    """The digest the registry gives the image's tag now."""
    from trainyard.images.registry import resolve_digest  # the pull machinery, only where a job has an image

    return resolve_digest(ref, access)


def _pin(ctx: LoopContext, spec: LaunchSpec, ref: ImageRef, digest: str) -> str:
    """The first attempt's digest (the one the job named, or the registry's answer for its tag),
    recorded on the job before any node pulls it."""
    now = ctx.clock()
    with ctx.lock, ctx.store.session.begin() as s:
        j = s.get(JobRow, spec.job_id)
        if j is not None and j.image_digest is None:
            j.image_digest = digest
            record(s, "scheduler", "job.image_pinned", f"image {ref.canonical()} pinned to {digest}",
                   job_id=j.id, at=now, data={"image": ref.canonical(), "digest": digest})
        elif j is not None:
            digest = j.image_digest or digest  # pinned meanwhile (cannot happen with one attempt at a time; be safe)
    return digest


def _running(ctx: LoopContext, spec: LaunchSpec, digest: str, took: float, nodes: list[str]) -> bool:
    """CONFIGURING → RUNNING from now (the job's time starts with its ranks); False when the
    attempt is no longer the job's current one."""
    now = ctx.clock()
    with ctx.lock, ctx.store.session.begin() as s:
        j = s.get(JobRow, spec.job_id)
        if j is None or j.attempt != spec.attempt:
            return False
        if j.state == JobState.CONFIGURING and spec.datasets:  # its data next: its time from now (data_staging.py)
            j.reason, j.start_time = DATA_STAGING, now
        elif j.state == JobState.CONFIGURING:
            j.state, j.reason, j.start_time = JobState.RUNNING, "None", now
        row = transitions.attempt_row(s, j)
        if row is not None:
            row.started_at = now
            row.image_digest = digest
        record(s, "scheduler", "job.image_ready",
               f"attempt {spec.attempt}: image {digest[:19]}… ready on {', '.join(nodes)} in {took:.1f}s",
               job_id=j.id, at=now, data={"digest": digest, "nodes": nodes, "seconds": round(took, 3)})
    return True


def _failed(ctx: LoopContext, spec: LaunchSpec, e: ImagePullError, node: str) -> None:
    start_failure.failed(ctx, spec, STEP, str(e), node, e.registry_fault,
                         {"kind": e.kind, "registry_fault": e.registry_fault})
