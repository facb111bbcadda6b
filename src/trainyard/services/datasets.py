"""The dataset catalogue (issue 41): named, versioned datasets, each a team's, shared by grants.

The catalogue is the configuration's `datasets:` (the operator's, origin "config") and the versions
members added (`yard dataset add`, `DatasetRow`, origin "added"), read together. A dataset is
`name:version` (names `[a-z][a-z0-9_-]*`, versions as `staging/types.py` says) and belongs to a
team: every version of a name is the same team's. Another team's jobs use it only with a grant;
a grant is to a name (every version, and the ones added later), by an admin or a member of the
owning team (`yard dataset grant NAME TEAM`, `--revoke`). A configured dataset's grants are the
configuration's (`grants:`), changed there, not here.

Who may:
- add: an admin, or a member for their own team (`--team` defaults to the token's team);
- see (`yard dataset ls|show`): admins and operators all; others their team's and those granted to it;
- use (a job's `--dataset`): a job of the owning team or of a granted team.

Adding a version: the plane probes the source and computes its checksum (`staging/checksum.py`),
outside its lock; a path as the adding member's Unix account (`services/owners.py`: the kernel
decides what they may read; an admin's dataset is read as the plane, as the configuration's are),
an s3:// URL with the credentials of the configured object store that covers it (one the team may
use). A given `--checksum` must match what was read (422 naming `checksum`). Size, files and an
audit event (`dataset.added`) are recorded. `name:version` is immutable: adding it again, or one
the configuration lists, is a 409.

At submit (`pin`): each `NAME[:VERSION]` of `JobSubmit.datasets` is resolved (no version: the newest
the team may use, versions compared as `v2 < v10`) and pinned into `jobs.datasets` as
`{"name", "version", "checksum", "source", "bytes", "reader"}`: the job copies exactly that, even if
the catalogue changes later. `reader` is the adding member's `{"uid", "gid", "groups"}` for a path
source, None for an s3:// source and for a configured dataset (read as the plane). A configured
dataset's size is not known until a node stages it: pinned as 0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from trainyard.services import owners
from trainyard.services.auth import Principal
from trainyard.services.errors import Conflict, Forbidden, NotFound, ServiceError, Unprocessable
from trainyard.services.events import record
from trainyard.services.plane_facade import Plane
from trainyard.services.secret_files import read_secret_file
from trainyard.spec.datasets import SOURCE_RE
from trainyard.spec.models import ConfigSpec
from trainyard.staging.checksum import summary_of_source
from trainyard.staging.types import (CHECKSUM_RE, NAME_RE, VERSION_RE, DataStagingError, DatasetRef, ObjectStore, Reader,
                                     SourceAccess)
from trainyard.store.models import DatasetRow

MAX_PER_JOB = 32
MAX_CREDENTIALS_BYTES = 4096
ASK_RE = re.compile(rf"^(?P<name>{NAME_RE.pattern[1:-1]})(:(?P<version>{VERSION_RE.pattern[1:-1]}))?$")


@dataclass(frozen=True)
class Entry:
    """One dataset version of the catalogue, from either origin."""

    name: str
    version: str
    team: str
    source: str
    checksum: str
    bytes: int | None  # None: a configured one, not measured
    files: int | None
    grants: tuple[str, ...]
    description: str
    origin: str  # "config" | "added"
    added_by: str | None = None
    added_at: float | None = None
    reader: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.name}:{self.version}"

    def usable_by(self, team: str | None) -> bool:
        return team is not None and (team == self.team or team in self.grants)

    def ref(self) -> DatasetRef:
        """What a job pins (`staging.types.DatasetRef`): its pinned record (`pinned`) read back."""
        return refs_of([pinned(self)])[0]


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """Versions in a person's order: digit runs as numbers (`v2 < v10`, `1.9 < 1.10`)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.findall(r"\d+|\D+", version))


# -- the catalogue ----------------------------------------------------------------------------------


def _of_row(r: DatasetRow) -> Entry:
    return Entry(r.name, r.version, r.team, r.source, r.checksum, r.bytes, r.files, tuple(r.grants or ()),
                 r.description or "", "added", r.added_by, r.added_at, r.reader)


def catalogue(s: Session, spec: ConfigSpec, name: str | None = None) -> list[Entry]:
    """Every version (of `name`, when given): the configuration's, then the added ones, each name's
    versions newest first."""
    out = [Entry(d.name, d.version, d.team, d.source, d.checksum, None, None, tuple(d.grants), d.description, "config")
           for d in spec.datasets if name is None or d.name == name]
    q = select(DatasetRow) if name is None else select(DatasetRow).where(DatasetRow.name == name)
    out += [_of_row(r) for r in s.execute(q).scalars()]
    out.sort(key=lambda e: version_key(e.version), reverse=True)
    out.sort(key=lambda e: e.name)
    return out


def may_see(by: Principal, e: Entry) -> bool:
    return by.role in ("admin", "operator") or e.usable_by(by.team)


def entry_dict(e: Entry) -> dict[str, Any]:
    return {"name": e.name, "version": e.version, "team": e.team, "source": e.source, "checksum": e.checksum,
            "bytes": e.bytes, "files": e.files, "grants": list(e.grants), "description": e.description,
            "origin": e.origin, "added_by": e.added_by, "added_at": e.added_at}


def listing(s: Session, spec: ConfigSpec, by: Principal, name: str | None = None) -> dict[str, Any]:
    """`GET /api/v1/datasets`: the versions `by` may see (of `name`)."""
    if name is not None and not NAME_RE.match(name):
        raise Unprocessable(f"name: {name!r} is not a dataset name ([a-z][a-z0-9_-]*)", field="name")
    return {"datasets": [entry_dict(e) for e in catalogue(s, spec, name) if may_see(by, e)]}


def show(s: Session, spec: ConfigSpec, by: Principal, asked: str) -> dict[str, Any]:
    """`GET /api/v1/datasets/{NAME[:VERSION]}`: its versions (or that one); 404 when there is none
    `by` may see (another team's dataset without a grant looks like none)."""
    name, version = parse_ask(asked, "dataset")
    found = [e for e in catalogue(s, spec, name) if may_see(by, e) and (version is None or e.version == version)]
    if not found:
        raise NotFound(f"no dataset {asked!r}" + ("" if by.role in ("admin", "operator") else " that your team may use"),
                       field="dataset")
    return {"name": name, "team": found[0].team, "versions": [entry_dict(e) for e in found]}


def parse_ask(asked: str, where: str) -> tuple[str, str | None]:
    """`NAME[:VERSION]` → (name, version or None).

    Raises:
        Unprocessable: naming `where`.
    """
    m = ASK_RE.match(asked.strip()) if isinstance(asked, str) else None
    if m is None:
        raise Unprocessable(f"{where}: {asked!r} is not NAME[:VERSION] (a name [a-z][a-z0-9_-]*, a version of "
                            "letters, digits and ._-)", field=where)
    return m["name"], m["version"]


# -- at submit --------------------------------------------------------------------------------------


def resolve(s: Session, spec: ConfigSpec, asked: str, team: str, where: str) -> Entry:
    """The version `asked` names for a job of `team`: the one given, or the newest `team` may use.

    Raises:
        Unprocessable: malformed, or no such dataset or version (naming `where`).
        Forbidden: it is another team's and not granted to `team`.
    """
    name, version = parse_ask(asked, where)
    versions = catalogue(s, spec, name)
    if not versions:
        raise Unprocessable(f"{where}: no dataset {name!r} in the catalogue (yard dataset ls)", field=where)
    usable = [e for e in versions if e.usable_by(team)]
    if version is not None:
        exact = [e for e in versions if e.version == version]
        if not exact:
            shown = ", ".join(e.version for e in (usable or versions)[:10])
            raise Unprocessable(f"{where}: dataset {name!r} has no version {version!r} (versions: {shown})", field=where)
        if not exact[0].usable_by(team):
            raise Forbidden(f"{where}: dataset {name}:{version} is team {exact[0].team!r}'s and not granted to team "
                            f"{team!r} (yard dataset grant {name} {team}, by its team or an admin)", field=where)
        return exact[0]
    if not usable:
        raise Forbidden(f"{where}: dataset {name!r} is team {versions[0].team!r}'s and not granted to team {team!r} "
                        f"(yard dataset grant {name} {team}, by its team or an admin)", field=where)
    return usable[0]


def pin(s: Session, spec: ConfigSpec, asked: list[str] | None, team: str) -> list[dict[str, Any]] | None:
    """`jobs.datasets` for a job of `team` asking `asked` (None or []: None). Each is resolved
    (`resolve`); the same name twice is refused.

    Raises:
        Unprocessable, Forbidden: naming `datasets.<i>`.
    """
    if not asked:
        return None
    if len(asked) > MAX_PER_JOB:
        raise Unprocessable(f"datasets: at most {MAX_PER_JOB} datasets per job ({len(asked)} asked)", field="datasets")
    out: list[dict[str, Any]] = []
    for i, a in enumerate(asked):
        e = resolve(s, spec, a, team, f"datasets.{i}")
        if any(p["name"] == e.name for p in out):
            raise Unprocessable(f"datasets.{i}: dataset {e.name!r} is asked twice", field=f"datasets.{i}")
        out.append(pinned(e))
    return out


def pinned(e: Entry) -> dict[str, Any]:
    """An entry as `jobs.datasets` holds it."""
    return {"name": e.name, "version": e.version, "checksum": e.checksum, "source": e.source,
            "bytes": e.bytes or 0, "reader": e.reader}


def refs_of(pins: list[dict[str, Any]] | None) -> list[DatasetRef]:
    """A job's pinned datasets (`jobs.datasets`) as the staging step reads them."""
    out = []
    for p in pins or ():
        r = p.get("reader")
        reader = Reader(int(r["uid"]), int(r["gid"]), tuple(int(g) for g in r.get("groups") or ())) if r else None
        out.append(DatasetRef(p["name"], p["version"], p["source"], p["checksum"], int(p.get("bytes") or 0), reader))
    return out


def record_of(ref: DatasetRef) -> dict[str, Any]:
    """`ref` as `jobs.datasets` stores it."""
    reader = None if ref.reader is None else \
        {"uid": ref.reader.uid, "gid": ref.reader.gid, "groups": list(ref.reader.groups)}
    return {"name": ref.name, "version": ref.version, "source": ref.source, "checksum": ref.checksum,
            "bytes": ref.bytes, "reader": reader}


# -- the object stores ------------------------------------------------------------------------------


def _credentials(path: str, where: str) -> tuple[str, str]:
    """The two lines of a credentials file (access key id, secret): a regular file of the plane's
    own account that no one else may read, opened through no link.

    Raises:
        ServiceError: naming `where`.
    """
    data = read_secret_file(path, where, MAX_CREDENTIALS_BYTES)
    lines = [x.strip() for x in data.decode("utf-8", "replace").splitlines() if x.strip()]
    if len(data) > MAX_CREDENTIALS_BYTES or len(lines) != 2:
        raise ServiceError(f"{where}: {path} must hold two lines, the access key id and the secret", field=where)
    return lines[0], lines[1]


def source_access(spec: ConfigSpec) -> SourceAccess:
    """How the plane reads dataset sources under `spec`: its object stores (credentials read now)
    and each node cache's cap.

    Raises:
        ServiceError: a credentials file that cannot be used (naming its field).
    """
    stores = []
    for i, o in enumerate(spec.storage.object_stores):
        key = secret = None
        if o.credentials_file:
            key, secret = _credentials(o.credentials_file, f"storage.object_stores.{i}.credentials_file")
        stores.append(ObjectStore(o.url, o.endpoint_url, o.region, key, secret,
                                  None if o.teams is None else frozenset(o.teams)))
    return SourceAccess(stores=tuple(stores), cache_max_bytes=spec.storage.dataset_cache.max_bytes)


# -- adding, granting -------------------------------------------------------------------------------


class DatasetAdd(BaseModel):
    """`POST /api/v1/datasets`: a new version (`yard dataset add`)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=NAME_RE.pattern)
    version: str = Field(pattern=VERSION_RE.pattern)
    source: str = Field(max_length=4096, pattern=SOURCE_RE)
    checksum: str | None = Field(None, pattern=CHECKSUM_RE.pattern)
    team: str | None = Field(None, min_length=1, max_length=100)
    description: str = Field("", max_length=1000)


def _taken(s: Session, spec: ConfigSpec, body: DatasetAdd, team: str) -> tuple[str, ...]:
    """Refuse a version that exists, or a name another team has; the grants a new version inherits."""
    versions = catalogue(s, spec, body.name)
    same = next((e for e in versions if e.version == body.version), None)
    if same is not None:
        where = "the configuration's datasets:" if same.origin == "config" else f"added by {same.added_by}"
        raise Conflict(f"dataset {body.name}:{body.version} exists ({where}); a version never changes: add a new one",
                       field="version")
    if versions and versions[0].team != team:
        raise Forbidden(f"dataset {body.name!r} is team {versions[0].team!r}'s; a new version is theirs to add",
                        field="name")
    added = [e for e in versions if e.origin == "added"]
    return added[0].grants if added else ()


def _reader(spec: ConfigSpec, by: Principal, team: str, source: str) -> Reader | None:
    """Who a path source is read as: the adding member's account; an admin's is read as the plane."""
    if not source.startswith("/") or by.is_admin:
        return None
    o = owners.resolve(spec, by.user, team).owner
    return Reader(o.uid, o.gid, tuple(o.groups))


def _store_allows(access: SourceAccess, source: str, team: str) -> None:
    if not source.startswith("s3://"):
        return
    store = access.store_for(source)
    if store is None:
        raise Unprocessable(f"source: {source} is under no configured object store (storage.object_stores: "
                            f"{', '.join(s.url for s in access.stores) or 'none'})", field="source")
    if store.teams is not None and team not in store.teams:
        raise Forbidden(f"source: team {team!r} may not read object store {store.url} (its teams: "
                        f"{', '.join(sorted(store.teams))})", field="source")


def add(plane: Plane, by: Principal, body: DatasetAdd) -> dict[str, Any]:
    """`POST /api/v1/datasets`: probe and hash the source (outside the plane's lock, as the member),
    then record the version and an audit event in one transaction."""
    with plane.store.session() as s:
        spec = plane.configs.current(s).spec
        team = body.team or by.team
        if team is None:
            raise ServiceError("team: give the team the dataset belongs to (--team)", field="team")
        if team not in {t.name for t in spec.teams}:
            raise Unprocessable(f"team: no team {team!r}; teams are {sorted(t.name for t in spec.teams)}", field="team")
        if not by.can_submit_for(team):
            raise Forbidden(f"a {by.role} token{' of team ' + by.team if by.team else ''} cannot add datasets for "
                            f"team {team!r}", field="team")
        _taken(s, spec, body, team)
    access = source_access(spec)
    _store_allows(access, body.source, team)
    reader = _reader(spec, by, team, body.source)
    label = f"{body.name}:{body.version}"
    try:
        got = summary_of_source(body.source, access, reader, label=label)
    except DataStagingError as e:
        raise Unprocessable(f"source: {e} ({e.kind})", field="source") from None
    if body.checksum is not None and body.checksum != got["checksum"]:
        raise Unprocessable(f"checksum: {body.source} hashes to {got['checksum']}, not the {body.checksum} given",
                            field="checksum")
    now = plane.clock()
    with plane.transaction() as s:
        grants = _taken(s, spec, body, team)
        row = DatasetRow(name=body.name, version=body.version, team=team, source=body.source,
                         checksum=got["checksum"], bytes=int(got["bytes"]), files=int(got["files"]), grants=list(grants),
                         description=body.description, added_by=by.user, added_at=now,
                         reader=None if reader is None else {"uid": reader.uid, "gid": reader.gid,
                                                             "groups": list(reader.groups)})
        s.add(row)
        record(s, by.user, "dataset.added", f"dataset {label} of team {team} added: {body.source}, "
               f"{got['files']} files, {got['bytes']} bytes, {got['checksum']}", at=now,
               data={"name": body.name, "version": body.version, "team": team, "source": body.source,
                     "checksum": got["checksum"], "bytes": got["bytes"], "files": got["files"]})
        s.flush()
        return entry_dict(_of_row(row))


def grant(plane: Plane, by: Principal, name: str, team: str, *, revoke: bool = False) -> dict[str, Any]:
    """`POST /api/v1/datasets/{name}/grants` (or `/revoke`): `team` may (no longer) use every added
    version of `name`; by an admin or a member of the owning team.

    Raises:
        Unprocessable: a malformed name or an unknown team. NotFound: no such dataset (to `by`).
        Forbidden: not `by`'s to share. Conflict: a configured dataset (its grants are the configuration's).
    """
    if not NAME_RE.match(name):
        raise Unprocessable(f"name: {name!r} is not a dataset name ([a-z][a-z0-9_-]*)", field="name")
    with plane.transaction() as s:
        spec = plane.configs.current(s).spec
        if team not in {t.name for t in spec.teams}:
            raise Unprocessable(f"team: no team {team!r}; teams are {sorted(t.name for t in spec.teams)}", field="team")
        versions = catalogue(s, spec, name)
        if not any(may_see(by, e) for e in versions):
            raise NotFound(f"no dataset {name!r}", field="name")
        owner = versions[0].team
        if not (by.is_admin or (by.role == "member" and by.team == owner)):
            raise Forbidden(f"dataset {name!r} is team {owner!r}'s: only its members or an admin share it", field="name")
        rows = list(s.execute(select(DatasetRow).where(DatasetRow.name == name)).scalars())
        if not rows:
            raise Conflict(f"dataset {name!r} is the configuration's: its grants are changed there (datasets[].grants)",
                           field="name")
        changed = False
        for r in rows:
            now_grants = [g for g in r.grants if g != team] if revoke else sorted({*r.grants, team})
            if now_grants != list(r.grants):
                r.grants, changed = now_grants, True
        what = "revoked from" if revoke else "granted to"
        if changed:
            record(s, by.user, "dataset.revoked" if revoke else "dataset.granted",
                   f"dataset {name} (team {owner}) {what} team {team}", at=plane.clock(),
                   data={"name": name, "team": owner, "grantee": team})
        return {"name": name, "team": owner, "grants": sorted(set(rows[0].grants)), "changed": changed}

