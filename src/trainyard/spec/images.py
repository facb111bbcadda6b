"""The `images:` section of the cluster configuration: which registries jobs may pull from, with
what credentials, each team's default image, and the nodes' caches (docs/control-plane.md,
"Environment images"; the rules applied at submit: services/images.py).

    images:
      allowed_registries: ["127.0.0.1:5000", "nvcr.io"]   # [] or absent: any registry
      insecure_registries: []          # plain HTTP besides loopback (which always is, as Docker has it)
      credentials:                     # per registry; the secret in a file only root reads
        - {registry: nvcr.io, username: "$oauthtoken", password_file: /etc/trainyard/nvcr.token}
      default_image: null              # for every team without its own
      teams:
        vision: {default_image: "nvcr.io#nvidia/pytorch:24.01-py3", allowed_registries: ["nvcr.io"]}
      cache_max_gib: 100               # each node's cache of unpacked images
      fingerprint: warn                # bare jobs' environment check across a gang: refuse | warn | off
      pull_timeout_s: 1800             # one node's pull of one image

Registries are written as in an image reference (`host[:port]`; Docker Hub as `docker.io` or any of
its aliases; in any case) and stored normalised, so that `docker.io` here matches `ubuntu:24.04` in a job. A
team's `allowed_registries` narrows the cluster's (each must be one of them when the cluster's list
is not empty); its `default_image` must come from a registry it may use. Images are read with
`spec.image_ref.parse_image`, as `--container-image` is.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from trainyard.spec import bounds as B
from trainyard.spec.image_ref import parse_image
from trainyard.spec.parsing import parse_duration

MAX_REGISTRIES = 100


def registry_name(raw: str, where: str) -> str:
    """A registry as an image reference names it (`host[:port]`), normalised (Docker Hub's aliases
    are `registry-1.docker.io`).

    Raises:
        ValueError: not a registry a reference could name (the message names `where`).
    """
    if not isinstance(raw, str) or not raw.strip() or any(c in raw for c in "/#@"):
        raise ValueError(f"{where}: {raw!r} is not a registry (host[:port], e.g. nvcr.io or 127.0.0.1:5000)")
    return parse_image(f"{raw.strip()}#library/probe", where).registry.lower()  # host names know no case


def image_name(raw: str, where: str) -> str:
    """An image of the configuration as `ImageRef.canonical()` writes it (no USER@: credentials are
    the configuration's).

    Raises:
        ValueError: a malformed reference (the message names `where`).
    """
    ref = parse_image(raw, where)
    return ref.canonical()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CredentialSpec(_Model):
    """A login for one registry. The password is read from `password_file` by the plane when the
    configuration is applied (services/images.py `registry_access`), never stored in the store."""

    registry: str = Field(min_length=1, max_length=300)
    username: str = Field(min_length=1, max_length=300)
    password_file: str = Field(min_length=2, max_length=4096, pattern=r"^/[^\x00\n]*$")

    @field_validator("registry")
    @classmethod
    def _registry(cls, v: str) -> str:
        return registry_name(v, "registry")


def _registries(v: object) -> object:
    if isinstance(v, list):
        return [registry_name(x, "registry") if isinstance(x, str) else x for x in v]
    return v


Registries = Annotated[list[str], BeforeValidator(_registries), Field(max_length=MAX_REGISTRIES)]


class TeamImagesSpec(_Model):
    """One team's own: its default image (over the cluster's) and the registries it may use
    (None: the cluster's)."""

    default_image: str | None = Field(None, max_length=1000)
    allowed_registries: Registries | None = None

    @field_validator("default_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return None if v is None else image_name(v, "default_image")


class ImagesSpec(_Model):
    """`images:` (the module docstring)."""

    allowed_registries: Registries = Field(default_factory=list)
    insecure_registries: Registries = Field(default_factory=list)
    credentials: list[CredentialSpec] = Field(default_factory=list, max_length=MAX_REGISTRIES)
    default_image: str | None = Field(None, max_length=1000)
    teams: dict[Annotated[str, Field(min_length=1, max_length=B.MAX_NAME)], TeamImagesSpec] = \
        Field(default_factory=dict)
    cache_max_gib: float = Field(100.0, gt=0, le=B.MAX_STORAGE_GB)
    fingerprint: Literal["refuse", "warn", "off"] = "warn"
    pull_timeout_s: Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=86400)] = 1800.0

    @field_validator("default_image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        return None if v is None else image_name(v, "default_image")

    @model_validator(mode="after")
    def _consistent(self) -> ImagesSpec:
        seen = [c.registry for c in self.credentials]
        dup = sorted({r for r in seen if seen.count(r) > 1})
        if dup:
            raise ValueError(f"credentials: registry {dup[0]!r} is given more than once")
        for name, team in self.teams.items():
            wider = [r for r in team.allowed_registries or () if self.allowed_registries
                     and r not in self.allowed_registries]
            if wider:
                raise ValueError(f"teams.{name}.allowed_registries: {wider[0]!r} is not in images.allowed_registries "
                                 f"{self.allowed_registries} (a team's list narrows the cluster's)")
        for where, image, allowed in self._defaults():
            if image is not None and allowed and parse_image(image).registry.lower() not in allowed:
                raise ValueError(f"{where}: {image!r} is from a registry not in its allowed_registries {allowed}")
        return self

    def _defaults(self) -> list[tuple[str, str | None, list[str]]]:
        out: list[tuple[str, str | None, list[str]]] = [("default_image", self.default_image, self.allowed_registries)]
        out += [(f"teams.{n}.default_image" if t.default_image else f"default_image (team {n}'s)", self.default_for(n),
                 self.allowed_for(n)) for n, t in self.teams.items()]
        return out

    def allowed_for(self, team: str) -> list[str]:
        """The registries `team`'s jobs may pull from ([]: any)."""
        own = self.teams.get(team)
        return own.allowed_registries if own is not None and own.allowed_registries is not None \
            else self.allowed_registries

    def allowed_rule(self, team: str) -> str:
        """Where `allowed_for(team)` comes from, as the configuration spells it (for a refusal)."""
        own = self.teams.get(team)
        if own is not None and own.allowed_registries is not None:
            return f"images.teams.{team}.allowed_registries"
        return "images.allowed_registries"

    def default_for(self, team: str) -> str | None:
        """`team`'s default image (its own, else the cluster's; None: its jobs run bare unless they name one)."""
        own = self.teams.get(team)
        return own.default_image if own is not None and own.default_image is not None else self.default_image
