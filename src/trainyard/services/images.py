"""A job's image against the configuration's `images:` (spec/images.py): the team default, the
allowed registries, and how the plane reaches registries (docs/control-plane.md, "Environment images").

    container_for(spec, team, options)   the job's container: its own, else its team's default image
    check_allowed(spec, team, options)   a registry the team may not use is a 403 naming the rule
    registry_access(spec)                `images.types.RegistryAccess`: insecure registries, credentials
    ContainerSubmit                      the API's `container` field (a bad part: a 422 naming it)

A password file is the plane's own secret: it is read without following a link, only when it is a
regular file of at most `MAX_SECRET_BYTES` that no one but its owner may read (as ssh treats a
private key), and a problem is a configuration error naming `images.credentials[i].password_file`
when the configuration is applied, never a job that fails later on every node.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from trainyard.images.types import Credentials, RegistryAccess
from trainyard.services.errors import Forbidden, ServiceError
from trainyard.services.secret_files import read_secret_file
from trainyard.spec import container_flags
from trainyard.spec.container import ContainerOptions
from trainyard.spec.container_mounts import parse_mounts
from trainyard.spec.image_ref import parse_image
from trainyard.spec.models import ConfigSpec

MAX_SECRET_BYTES = 64 << 10


def container_for(spec: ConfigSpec, team: str, options: ContainerOptions | None) -> ContainerOptions | None:
    """The container a job of `team` runs in: `options` when it named an image, else its team's
    default image (its own `default_image` under `images: teams:`, else the cluster's) with pyxis's
    defaults, else None (a bare job)."""
    if options is not None:
        return options
    image = spec.images.default_for(team)
    return None if image is None else ContainerOptions(image=image)


def check_allowed(spec: ConfigSpec, team: str, options: ContainerOptions | None) -> None:
    """The job's image comes from a registry `team` may pull from.

    Raises:
        Forbidden: field `container.image`; the message names the registry, the team and the rule.
    """
    if options is None:
        return
    allowed = spec.images.allowed_for(team)
    registry = parse_image(options.image, "container.image").registry.lower()
    if allowed and registry not in allowed:
        raise Forbidden(f"registry {registry!r} is not allowed for team {team!r} ({spec.images.allowed_rule(team)}: "
                        f"{', '.join(allowed)})", field="container.image")


def read_secret(path: str, where: str) -> str:
    """The first line of a password file, read as the module docstring says.

    Raises:
        ServiceError: field `where`; the message says what is wrong with the file.
    """
    data = read_secret_file(path, where, MAX_SECRET_BYTES,
                            "; the registry's password goes in a regular file only root reads")
    if len(data) > MAX_SECRET_BYTES:
        raise ServiceError(f"{where}: {path} is over {MAX_SECRET_BYTES} bytes; it should hold one password",
                           field=where)
    try:
        secret = data.decode().splitlines()[0].strip() if data.strip() else ""
    except UnicodeDecodeError:
        raise ServiceError(f"{where}: {path} is not UTF-8 text", field=where) from None
    if not secret:
        raise ServiceError(f"{where}: {path} is empty", field=where)
    return secret


def registry_access(spec: ConfigSpec) -> RegistryAccess:
    """How the plane reaches registries under `spec`: its insecure registries, each registry's
    credentials (passwords read now: `read_secret`), a pull's time limit and the caches' size cap.

    Raises:
        ServiceError: a password file that cannot be used (the field named: the entry's `password_file`).
    """
    creds = {c.registry: Credentials(c.username, read_secret(c.password_file, f"images.credentials.{i}.password_file"))
             for i, c in enumerate(spec.images.credentials)}
    return RegistryAccess(insecure=frozenset(spec.images.insecure_registries), credentials=creds,
                          timeout_s=spec.images.pull_timeout_s,
                          cache_max_bytes=int(spec.images.cache_max_gib * (1 << 30)))


class ContainerSubmit(BaseModel):
    """A submission's `container` (`JobSubmit.container`): pyxis's `--container-*` options as the
    API takes them. Each part is checked as the CLI checks it (`spec.image_ref`, `spec.container_mounts`),
    so a bad one is a 422 naming `container.<part>` however the job was sent."""

    model_config = ConfigDict(extra="forbid")

    image: str | None = Field(None, min_length=1, max_length=1000, description="--container-image: enroot's "
                              "[USER@][REGISTRY#]IMAGE[:TAG][@sha256:…] or Docker's REGISTRY/IMAGE[:TAG]; "
                              "None: the team's default image, with these options")
    mounts: str | list[str] | None = Field(None, max_length=1000, description="--container-mounts: "
                                           "SRC[:DST[:FLAGS]], comma-separated (or a list of them)")
    workdir: str | None = Field(None, max_length=4096, description="--container-workdir (default: the job's)")
    env: list[str] = Field(default_factory=list, max_length=1000, description="--container-env: names whose "
                           "value from the job's environment wins over the image's")
    mount_home: bool = False
    writable: bool = True
    entrypoint: bool = False
    remap_root: bool = False

    @field_validator("image")
    @classmethod
    def _image(cls, v: str | None) -> str | None:
        # USER@ left out: credentials are the cluster's
        return None if v is None else parse_image(v, "container.image").canonical()

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: str | list[str] | None) -> str | None:
        if v is None or v == [] or v == "":
            return None
        text = ",".join(v) if isinstance(v, list) else v
        return ",".join(m.pyxis() for m in parse_mounts(text, "container.mounts"))

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, v: str | None) -> str | None:
        return None if v is None else container_flags.workdir(v, "container.workdir")

    @field_validator("env")
    @classmethod
    def _env(cls, v: list[str]) -> list[str]:
        return container_flags.env_names(v, "container.env")

    def options(self, default_image: str | None = None) -> ContainerOptions:
        """What the job stores (`jobs.container`: `ContainerOptions.to_record()`); `default_image`
        where the submission named none."""
        image = self.image or default_image
        assert image is not None
        return ContainerOptions(image=image, mounts=parse_mounts(self.mounts if isinstance(self.mounts, str) else ",".join(self.mounts))
                                if self.mounts else (),
                                workdir=self.workdir, env=tuple(self.env), mount_home=self.mount_home,
                                writable=self.writable, entrypoint=self.entrypoint, remap_root=self.remap_root)


def requested(spec: ConfigSpec, team: str, sub: ContainerSubmit | None) -> ContainerOptions | None:
    """A submission's container: as asked, or the team's default image with the options asked
    (`container_for`).

    Raises:
        ServiceError: container options without an image, for a team without a default image.
    """
    if sub is None or sub.image is not None:
        return container_for(spec, team, sub.options() if sub is not None else None)
    image = spec.images.default_for(team)
    if image is None:
        raise ServiceError(f"container options without an image, and team {team!r} has no default image "
                           f"(images.teams.{team}.default_image or images.default_image); give --container-image",
                           field="container.image")
    return sub.options(image)


def recipe_in_image(command: list[str]) -> list[str]:
    """A recipe job's command as it runs in an image: `yard submit --recipe` sends
    `<its own interpreter> -m trainyard.recipes …`, a path of the submitting machine that an image
    does not have; in an image (the job's own, or its team's default, which the CLI cannot know)
    the image's `python3` runs it. Any other command is the user's, kept as given."""
    if len(command) >= 3 and command[1:3] == ["-m", "trainyard.recipes"] and command[0].startswith("/") \
            and command[0].rsplit("/", 1)[-1].startswith("python"):
        return ["python3", *command[1:]]
    return command
