"""What one API request does to the plane, one function each: the unit of work behind a route.

A write takes the plane's lock for exactly one store transaction (`Plane.transaction`), wakes the
loop when the change is news to the scheduler (a job to place, a node or quota that moved), and
returns what the API answers; a router is then its permission dependencies and one call here,
and the lock, the transaction and the wake are never a router's to forget. Reads that need only
the route's session call their service directly (`services/jobs.py`, `services/teams.py`…).
Errors are `services/errors.py`'s, turned into statuses in one place (`api/app.py`).
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from sqlalchemy.orm import Session

from trainyard.images.types import ImagePullError
from trainyard.services import auth, config, events, image_admin, jobs, login, nodes, pilot, progress, reservations, teams, tokens
from trainyard.services.auth import Principal
from trainyard.services.errors import Conflict, Forbidden, NotFound, ServiceError
from trainyard.services.login_codes import Issue
from trainyard.services.plane_facade import Plane
from trainyard.services.config import ConfigVersion
from trainyard.spec import pilot as pilot_spec
from trainyard.spec.models import ConfigSpec, parse_config
from trainyard.states import ACTIVE_STATES, PENDING_STATES
from trainyard.store.models import ConfigVersionRow, JobRow


class JobAction(Protocol):
    """`jobs.cancel`, `hold`, `release` or `requeue`."""

    def __call__(self, s: Session, job_id: int, by: Principal, now: float | None = None) -> JobRow: ...


# -- jobs ------------------------------------------------------------------------------------------

def submit_job(plane: Plane, by: Principal, body: jobs.JobSubmit) -> dict[str, Any]:
    """`POST /api/v1/jobs`: the job stored PENDING (or held), and the scheduler told."""
    with plane.store.session() as s:  # the paths are looked at as the owner, before the plane's lock
        jobs.check_paths(body, by, plane.configs.current(s), plane.data_dir)
    with plane.transaction() as s:
        cfg = plane.configs.current(s)
        row = jobs.submit(s, body, by, cfg, plane.data_dir, now=plane.clock(), paths_checked=True)
        out = jobs.job_dict(row, by)
        if row.mail_type and cfg.spec.notify is None:  # asked for, but nowhere to send it: said, not refused
            out["warnings"] = [f"--mail-type {row.mail_type}: this cluster has no webhook configured (notify: in "
                               "its configuration), so no notification will be sent"]
    if not body.hold:  # a held job is nothing for the scheduler until it is released (which wakes it)
        plane.wake()
    return out


def job_action(plane: Plane, act: JobAction, job_id: int, by: Principal) -> dict[str, Any]:
    """Cancel, hold, release or requeue a job, at the plane's time; the loop acts on it at once."""
    with plane.transaction() as s:
        out = jobs.job_dict(act(s, job_id, by, now=plane.clock()), by)
    plane.wake()
    return out


def job_view(plane: Plane, s: Session, job_id: int, by: Principal) -> dict[str, Any]:
    """The job, its attempts, (to who may manage it, as its workdir) its directory, and the bytes
    its directory held when last measured (`disk`: the plane's storage meter)."""
    row = jobs.get(s, job_id, by)
    jd = jobs.job_dir(plane.data_dir, row)
    return {**jobs.job_dict(row, by), "attempts": jobs.attempts(s, job_id),
            "job_dir": str(jd.root) if by.can_manage_team(row.team) else None, "disk": plane.job_disk(jd.root.name)}


def job_listing(s: Session, by: Principal, *, state: str | None, active: bool, team: str | None, user: str | None,
                job_class: str | None, limit: int, array: int | None, fields: str | None) -> dict[str, Any]:
    """`GET /api/v1/jobs`: `state` as states or squeue codes, `active` only what squeue shows,
    `fields` the keys to return (comma-separated)."""
    states = jobs.parse_states(state)
    keys = [x.strip() for x in fields.split(",") if x.strip()] if fields else None
    if active:
        states = [x for x in (states or PENDING_STATES + ACTIVE_STATES)
                  if x in PENDING_STATES + ACTIVE_STATES] or ["-"]
        if states == ["-"]:
            return {"jobs": []}
    return {"jobs": jobs.list_job_dicts(s, by, states=states, team=team, user=user, job_class=job_class, limit=limit,
                                        fields=keys, array=array)}


def report_progress(plane: Plane, job_id: int, body: progress.ProgressReport, by: Principal) -> dict[str, Any]:
    """The in-job runtime's report: step, newest checkpoint, metrics."""
    with plane.transaction() as s:
        return progress.report(s, job_id, body, by)


# -- the configuration: versions, teams, reservations, nodes -------------------------------------

def config_row(r: ConfigVersionRow) -> dict[str, Any]:
    return {"version": r.version, "text": r.text, "author": r.author, "created_at": r.created_at, "message": r.message}


def apply_config(plane: Plane, by: Principal, text: str, message: str) -> dict[str, Any]:
    """A whole configuration (YAML), validated, as the newest version."""
    return _change_config(plane, by, lambda s: config.apply(s, text, by, message))


def rollback_config(plane: Plane, by: Principal, version: int) -> dict[str, Any]:
    """An older version's text as the newest version (history is never rewritten)."""
    return _change_config(plane, by, lambda s: config.rollback(s, version, by))


def pilot_step(plane: Plane, by: Principal, step: str, message: str, text: str = "") -> dict[str, Any]:
    """The pilot's `apply` (a trial of `text`), `promote` or `rollback` (services/pilot.py): a version."""
    now = plane.clock()
    change: dict[str, Callable[[Session], int]] = {
        "apply": lambda s: pilot.apply_trial(s, text, by, message, now),
        "promote": lambda s: pilot.promote(s, by, message, now),
        "rollback": lambda s: pilot.rollback(s, by, message, now)}
    return _change_config(plane, by, change[step], ends_trials=True)


def _change_config(plane: Plane, by: Principal, change: Callable[[Session], int], *,
                   ends_trials: bool = False) -> dict[str, Any]:
    """A new version by `change`, refused (409) when it would drop nodes that run jobs; with a
    warning when it ends the pilot's trial in progress, unless ending trials is its job
    (`ends_trials`: the pilot's own steps)."""
    if not by.is_admin:
        raise Forbidden("only an admin can change the cluster configuration")
    with plane.transaction() as s:
        before = plane.configs.current(s)
        version = change(s)
        spec = parse_config(config.get_version(s, version).text)
        new = {n.name for n in spec.cluster.expand()}
        busy = sorted(set(nodes.gpus_in_use(s)) - new)
        if busy:
            raise Conflict(f"nodes {busy} run jobs and cannot leave the configuration; drain them and wait")
    plane.wake()
    with plane.store.session() as s:
        return {**config_row(config.get_version(s, version)),
                "warnings": teams.overcommitted(spec) + spec.scheduler.deprecations() + ([] if ends_trials else _trial_ended(before, spec))}


def _trial_ended(before: ConfigVersion, after: ConfigSpec) -> list[str]:
    """A warning when a whole new configuration ends the pilot's trial in progress: a file without
    `pilot.trial` replaces the trial like any other change, which an operator should hear of
    (`yard cluster pilot promote|rollback` are the ways to end one on purpose)."""
    if pilot_spec.trial(after) is not None or pilot_spec.trial(before.spec) is None:
        return []
    return [f"this version ends the pilot's trial that was in force in version {before.version} "
            "(the file has no pilot.trial): every node now runs the file's own settings"]


def update_team(plane: Plane, name: str, body: teams.TeamUpdate | teams.TeamPatch, by: Principal) -> dict[str, Any]:
    """A team's quotas changed (a new configuration version), with the teams' overcommitment."""
    with plane.transaction() as s:
        version = teams.update_team(s, plane.configs.current(s), name, body, by)
    plane.wake()
    with plane.store.session() as s:
        cfg = plane.configs.current(s)
        return {**teams.get_team(s, cfg, name), "config_version": version, "warnings": teams.overcommitted(cfg.spec)}


def create_reservation(plane: Plane, body: reservations.ReservationCreate, by: Principal) -> dict[str, Any]:
    with plane.transaction() as s:
        version, name = reservations.create(s, plane.configs.current(s), body, by, plane.clock())
    plane.wake()
    with plane.store.session() as s:
        got = next(r for r in reservations.list_reservations(plane.configs.current(s), plane.clock())
                   if r["name"] == name)
    return {**got, "config_version": version}


def delete_reservation(plane: Plane, name: str, by: Principal) -> dict[str, Any]:
    with plane.transaction() as s:
        version = reservations.delete(s, plane.configs.current(s), name, by)
    plane.wake()
    return {"name": name, "deleted": True, "config_version": version}


def set_node_state(plane: Plane, name: str, state: str, reason: str, by: Principal) -> dict[str, Any]:
    """Drain (`drain`) or resume (`up`) a node."""
    with plane.transaction() as s:
        out = nodes.set_state(s, plane.configs.current(s), name, state, reason, by)
    plane.wake()
    return out


# -- tokens and login ------------------------------------------------------------------------------

def create_token(plane: Plane, by: Principal, user: str, role: str, team: str | None) -> dict[str, Any]:
    """A personal token (admin only), shown once; only its hash is stored."""
    if role == "job" and by.is_admin:  # the loop makes one per started job; one made here is for no job and unaudited
        raise ServiceError("job tokens are made by the control plane for each running job; roles here are "
                           "admin, operator, member, viewer", field="role")
    with plane.transaction() as s:
        known = {t.name for t in plane.configs.current(s).spec.teams}
        token = auth.create_token(s, user=user, role=role, team=team, by=by, known_teams=known)
    return {"token": token, "user": user, "role": role, "team": team}


def revoke_tokens(plane: Plane, by: Principal, *, token_id: int | None = None, user: str | None = None) -> dict[str, Any]:
    """One token by id, or every personal token of `user`; effective at the next request."""
    with plane.transaction() as s:
        done = tokens.revoke(s, by, token_id=token_id, user=user)
    auth.forget_cached_tokens()  # after the commit: see auth.py's cache comment
    return {"revoked": done}


def log_out(plane: Plane, token: str) -> dict[str, Any]:
    """Revoke the caller's own token (`yard logout`)."""
    with plane.transaction() as s:
        done = tokens.revoke_own(s, token)
    auth.forget_cached_tokens()  # after the commit: see auth.py's cache comment
    return {"revoked": [done]}


def code_user(plane: Plane, user: str) -> str:
    """The token user a login code is for: `user`, or the one token user the configuration's
    `users:` maps to account `user` (`yard login --code` sends the local account's name)."""
    with plane.store.session() as s:
        spec = plane.configs.current(s).spec
    mapped = [u for u, a in spec.users.items() if a == user]
    return mapped[0] if user not in spec.users and len(mapped) == 1 else user


def token_issuer(plane: Plane) -> Issue:
    """How an approved login code gets its token: issued in one transaction of the plane's."""

    def issue(user: str, role: str, team: str | None, how: str) -> str:
        with plane.transaction() as s:
            known = {x.name for x in plane.configs.current(s).spec.teams}
            return login.issue(s, user, role, team, how, known_teams=known)

    return issue


# -- images on the nodes (yard image): no lock held while the nodes work ----------------------------

def pull_image(plane: Plane, by: Principal, image: str, node_list: str | None) -> dict[str, Any]:
    """`POST /api/v1/images/pull`: the image's digest resolved once and pulled on the nodes, in
    parallel, outside the plane's lock; one audit event with what each node did."""
    image_admin.may_change(by)
    with plane.store.session() as s:
        cfg = plane.configs.current(s)
    names = image_admin.node_names(cfg, node_list)
    ref = image_admin.image_of(image)
    image_admin.check_allowed(cfg, ref)
    try:
        out = plane.pull_image(ref, names)
    except ImagePullError as e:
        raise image_admin.error_of(e) from None
    failed = [r["node"] for r in out["nodes"] if not r["ok"]]
    with plane.transaction() as s:
        events.record(s, by.user, "image.pulled", f"{out['image']}@{out['digest']} pulled on {len(names) - len(failed)} "
                      f"of {len(names)} nodes" + (f"; failed on {', '.join(failed)}" if failed else ""),
                      data={"image": out["image"], "digest": out["digest"], "nodes": out["nodes"]})
    return out


def image_entries(plane: Plane, by: Principal, node_list: str | None) -> dict[str, Any]:
    """`GET /api/v1/images`: what each node's cache holds."""
    image_admin.may_list(by)
    with plane.store.session() as s:
        names = image_admin.node_names(plane.configs.current(s), node_list)
    return {"images": [image_admin.entry_dict(e) for e in plane.image_entries(names)]}


def remove_image(plane: Plane, by: Principal, target: str, node_list: str | None) -> dict[str, Any]:
    """`POST /api/v1/images/remove`: the image's (or digest's) entries removed where no job runs them."""
    image_admin.may_change(by)
    with plane.store.session() as s:
        names = image_admin.node_names(plane.configs.current(s), node_list)
    out = plane.remove_image(image_admin.target_of(target), names)
    if not out:
        raise NotFound(f"{target!r} is in no cache of {', '.join(names)}", field="image")
    with plane.transaction() as s:
        events.record(s, by.user, "image.removed", f"{target} removed from "
                      f"{', '.join(r['node'] for r in out if r['removed']) or 'no node'}", data={"entries": out})
    return {"removed": out}


def checkpoint_keep(plane: Plane, job_id: int, step: int, by: Principal, undo: bool) -> dict[str, Any]:
    """`POST /api/v1/jobs/{id}/checkpoints/{step}/keep`: the mark set (or removed), audited."""
    from trainyard.services import checkpoint_copies

    with plane.transaction() as s:
        return checkpoint_copies.mark_keep(s, job_id, step, by, plane.clock(), undo=undo)
