"""The control plane as the API and its services see it: a `Protocol`, so neither imports `control/`.

`control/lifecycle/plane.py`'s `ControlPlane` is the one implementation; the API receives it from `yard up`
(or a test) and hands it to services (`services/units.py`), which take its lock, run its
transaction and wake its loop. What only the plane knows (the storage meter's figures, its own
health, the engine's order) comes through a method here, in plain values or services' models, so
that a router never reaches into the plane's parts.

    store, configs, data_dir, clock   the API's pool of store connections, the configuration in
                                      force, the data dir, the plane's time
    transaction()                     the plane's lock held, one committed store transaction
    wake()                            the control loop looks again now, not at its next tick
    containment                       how jobs are contained (`yard nodes`' column)
    job_disk(name), storage_report(), storage_dirs(), storage_refresh()  the storage meter's figures (`control/lifecycle/storage.py`)
    shutting_down, health(), ready()  the self-checks of /healthz and /readyz (`control/lifecycle/liveness.py`)
    share(), priority()               `yard share` and `yard prio` (`control/reports/priority.py`)
    pull_image(), image_entries(),    `yard image pull|ls|rm` on the nodes' image caches, without the
    remove_image()                    plane's lock (`control/lifecycle/image_admin.py`)
    stage_dataset()                   `yard dataset stage` on the nodes' dataset caches, without the
                                      plane's lock while they copy (`control/lifecycle/dataset_admin.py`)
    open_terminal()                   a command on a new pseudo-terminal in a running rank
                                      (`yard shell`: services/terminals.py, api/terminal.py)
    open_port()                       a connection to a port inside a running rank
                                      (`yard port-forward`: services/ports.py, api/port_pump.py)
    sessions                          who is attached to each job now, and their last input
                                      (`services/sessions.py`)
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Callable, Protocol

from sqlalchemy.orm import Session

from trainyard.backends.base import Terminal, Tunnel
from trainyard.images.types import EntryInfo
from trainyard.staging.types import DatasetRef
from trainyard.services.config import ConfigCache, ConfigVersion
from trainyard.services.sessions import Sessions
from trainyard.services.priority_report import PriorityReport, ShareReport
from trainyard.spec.models import ConfigSpec
from trainyard.store.db import Store

API_THREADS = 16  # the API's worker threads: more only contend for the interpreter on a few cores
REQUESTS_PER_THREAD = 4  # requests in flight per worker thread before the API answers 503


class Plane(Protocol):
    """What a service may ask of the running plane (see the module docstring)."""

    @property
    def store(self) -> Store: ...

    @property
    def configs(self) -> ConfigCache: ...

    @property
    def data_dir(self) -> Path: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def sessions(self) -> Sessions:
        """Terminals and forwarded ports attached to each job (services/sessions.py)."""

    @property
    def api_threads(self) -> int:
        """The API's worker threads (api/app.py sets them)."""

    @property
    def api_max_requests(self) -> int:
        """Requests in flight before the API answers 503 (api/admission.py)."""

    @property
    def containment(self) -> str: ...

    @property
    def shutting_down(self) -> bool: ...

    def transaction(self) -> AbstractContextManager[Session]:
        """The plane's lock, then a session whose transaction commits on a clean exit."""

    def wake(self) -> None: ...

    def job_disk(self, name: str) -> dict[str, Any] | None:
        """Job dir `name` (under `jobs/`) as the storage meter last measured it, or None."""

    def storage_report(self, spec: ConfigSpec, jobs: int = 0) -> dict[str, Any]:
        """The meter's part of what `GET /api/v1/storage` answers (services/storage_view.py adds the tiers)."""

    def storage_dirs(self) -> list[dict[str, Any]]:
        """Every job dir as last measured: {job_id, team, bytes, apparent_bytes, kinds}."""

    def storage_refresh(self) -> None:
        """Measure every job dir now, whole (an admin's `yard storage --refresh`)."""

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(all checks pass, what /healthz shows)."""

    def ready(self) -> tuple[bool, str]:
        """(send traffic here, why)."""

    def share(self, s: Session, cfg: ConfigVersion, now: float) -> ShareReport: ...

    def priority(self, s: Session, cfg: ConfigVersion, now: float, job_ids: tuple[int, ...] = ()) -> PriorityReport: ...

    def pull_image(self, image: str, nodes: list[str]) -> dict[str, Any]:
        """`image`'s digest resolved once, then pulled on `nodes` in parallel: `{image, digest,
        nodes: [{node, ok, error, kind, size_bytes}]}`. Raises `images.types.ImagePullError` when
        the digest cannot be resolved. May take minutes; holds no lock."""

    def image_entries(self, nodes: list[str]) -> list[EntryInfo]:
        """The images cached on `nodes`."""

    def remove_image(self, target: str, nodes: list[str]) -> list[dict[str, Any]]:
        """`target` (a digest, or an image) removed from `nodes`' caches: `[{node, name, digest, removed, why}]`."""

    def stage_dataset(self, ref: DatasetRef, nodes: list[str]) -> dict[str, Any]:
        """`ref` staged in `nodes`' dataset caches in parallel (`yard dataset stage`): `{dataset,
        checksum, nodes: [{node, ok, copied, seconds, bytes, error, kind}]}`; the nodes' `node_datasets`
        rows written after. May take minutes; holds no lock while the nodes copy."""

    def open_terminal(self, job_id: int, rank: int, argv: list[str], rows: int, cols: int, *,
                      session: bool = False) -> Terminal:
        """`argv` in rank `rank` of the job's current attempt, as its owner, on a new pseudo-terminal
        of `rows` x `cols` (the backend's `open_terminal`; `session`: the allocation's session, with
        the whole allocation's environment). Raises Conflict when the rank is not running there.
        The caller owns the result: it closes the fd and reaps the pid."""

    def open_port(self, job_id: int, rank: int, port: int) -> Tunnel:
        """A TCP connection to `port` on the loopback of rank `rank` of the job's current attempt,
        made as its owner in the rank's network (the backend's `open_port`). Raises Conflict when
        the rank is not running there or nothing listens on the port. The caller owns the result:
        it closes the fds and ends and reaps the helper's pid, if any."""
