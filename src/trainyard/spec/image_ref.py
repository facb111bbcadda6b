"""A job's container image, read as pyxis reads `--container-image` (its mounts: `container_mounts.py`).

An image is named in either of the two forms a Slurm user already writes:

    enroot's URI (pyxis):   [USER@][REGISTRY#]IMAGE[:TAG][@sha256:DIGEST]   nvcr.io#nvidia/pytorch:24.01-py3
    OCI / Docker:           [REGISTRY/]IMAGE[:TAG][@sha256:DIGEST]           localhost:5000/team/img:1.0

(an optional `docker://` in front, as `enroot import` takes it, is accepted). Without `#`, the first
path component is a registry only where Docker's reference grammar says so (it holds `.` or `:`, is
`localhost`, or has an upper-case letter); anything else is Docker Hub. The result is normalised the
way Docker normalises it, so that one image has one name however it was written: Docker Hub (none,
`docker.io`, `index.docker.io`) is `registry-1.docker.io`, a one-component name there is
`library/NAME`, and a reference with neither tag nor digest means `:latest`. USER is enroot's
credential hint (whose login to use at that registry): it is kept, but it is not part of the image's
name, so `ImageRef.canonical()` leaves it out and `ImageRef.enroot_uri()` keeps it.

Validation is strict and names what is wrong: a reference that a registry would refuse, or read
as another image, must fail at submit and not at launch on every node. Digests are sha256 only —
that is what a pin is recorded as (a rerun runs that digest, whatever its tag names by then).

Standard library only: the CLI parses this option without the model stack (tests/test_architecture.py).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

DOCKER_HUB = "registry-1.docker.io"
HUB_ALIASES = frozenset({"docker.io", "index.docker.io", DOCKER_HUB})
DEFAULT_TAG = "latest"
NAME_MAX = 255  # distribution's NameTotalLengthMax, checked on the normalised `registry/repository`

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_COMPONENT = re.compile(rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*", re.ASCII)
_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})*|\[[a-fA-F0-9:]+\])"
_DOMAIN = re.compile(rf"{_HOST}(?::[0-9]+)?", re.ASCII)
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}", re.ASCII)
_IMAGE_ID = re.compile(r"[0-9a-f]{64}", re.ASCII)
# what follows the last `@` is a digest when it starts with a digest algorithm's name; otherwise
# the `@` ends enroot's USER (`alice@ubuntu:22.04`)
_DIGEST_LIKE = re.compile(r"(?![^/#]*[/#])(?:sha|blake)[0-9]*(?::|\Z)", re.ASCII | re.IGNORECASE)
# RFC 3986's userinfo characters, less `:` (no password in a reference) and the delimiters `/` `#`;
# not starting with `.`, which starts a file path (`./image.sqsh`)
_USER = re.compile(r"[A-Za-z0-9_~!$&'()*+,;=%@-][A-Za-z0-9._~!$&'()*+,;=%@-]*", re.ASCII)


def looks_like_registry(component: str) -> bool:
    """Docker's rule for a reference's first component: a registry if it holds `.` or `:`, is
    `localhost`, or has an upper-case letter (a Docker Hub namespace has none of these)."""
    return "." in component or ":" in component or component == "localhost" or component.lower() != component


def _check_registry(registry: str, option: str) -> None:
    if not _DOMAIN.fullmatch(registry):
        raise ValueError(f"{option}: bad registry {registry!r}: a host name or address, with an optional :port")
    if not looks_like_registry(registry):
        raise ValueError(f"{option}: registry {registry!r} would read as a Docker Hub namespace in "
                         f"'{registry}/IMAGE'; name it by its full host name or with its port "
                         f"('{registry}.example.org', '{registry}:443'), or 'localhost'")


def _check_tag(tag: str, option: str) -> None:
    if not _TAG.fullmatch(tag):
        raise ValueError(f"{option}: bad tag {tag!r}: a tag is 1 to 128 of letters, digits, '_', '.' and '-', "
                         "not starting with '.' or '-'")


def _check_digest(digest: str, option: str) -> None:
    if not _DIGEST.fullmatch(digest):
        algorithm = digest.partition(":")[0]
        why = ("a digest is 'sha256:' and 64 lower-case hexadecimal digits" if algorithm.lower() == "sha256"
               else f"unsupported digest algorithm {algorithm!r}")
        raise ValueError(f"{option}: bad digest {digest!r}: {why} (images are pinned by sha256)")


def _check_repository(repository: str, option: str, raw: str | None = None) -> None:
    """Each `/`-separated component by distribution's grammar; `raw`, where given, is what the user wrote."""
    shown_in = repr(raw if raw is not None else repository)
    if not repository:
        raise ValueError(f"{option}: no image name")
    for part in repository.split("/"):
        if _COMPONENT.fullmatch(part):
            continue
        if part and _COMPONENT.fullmatch(part.lower()):
            raise ValueError(f"{option}: repository name must be lower case: {part!r} in {shown_in}")
        shown = "an empty component ('//', or '/' at an end)" if not part else f"component {part!r}"
        raise ValueError(f"{option}: bad image name {shown_in}: {shown}; each '/'-separated component is "
                         "lower-case letters and digits, joined by '.', '_', '__' or dashes")


@dataclass(frozen=True)
class ImageRef:
    """One container image, normalised (module docstring): constructing one checks every field, so
    an `ImageRef` that exists names an image a registry can be asked for.

    `tag` is None only when `digest` is set (a digest alone names the image); with both, the digest
    is what runs and the tag is what the owner called it.
    """

    registry: str
    repository: str
    tag: str | None = DEFAULT_TAG
    digest: str | None = None
    user: str | None = None

    def __post_init__(self) -> None:
        option = "image"
        _check_registry(self.registry, option)
        if self.registry in HUB_ALIASES - {DOCKER_HUB}:
            raise ValueError(f"{option}: Docker Hub is {DOCKER_HUB!r} in a normalised reference, not "
                             f"{self.registry!r}")
        _check_repository(self.repository, option)
        if self.registry == DOCKER_HUB and "/" not in self.repository:
            raise ValueError(f"{option}: a Docker Hub image of one component is 'library/{self.repository}'")
        if len(self.name) > NAME_MAX:
            raise ValueError(f"{option}: image name {self.name[:40]!r}… is {len(self.name)} characters long; "
                             f"at most {NAME_MAX}")
        if self.tag is None and self.digest is None:
            raise ValueError(f"{option}: a tag or a digest is needed (the default tag is {DEFAULT_TAG!r})")
        if self.tag is not None:
            _check_tag(self.tag, option)
        if self.digest is not None:
            _check_digest(self.digest, option)
        if self.user is not None and not _USER.fullmatch(self.user):
            raise ValueError(f"{option}: bad user {self.user!r} (no ':' — credentials belong in the cluster "
                             "configuration, not in the image reference)")

    @property
    def name(self) -> str:
        """`registry/repository`: the image without tag or digest (what credentials and allow-lists match)."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What the registry's manifest endpoint is asked for: the digest when pinned, else the tag."""
        return self.digest or self.tag or DEFAULT_TAG

    def canonical(self) -> str:
        """`registry/repository:tag`, `registry/repository@digest` or both: the image's one name
        (`parse_image` reads it back to this `ImageRef`, less `user`, which names no image)."""
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def enroot_uri(self) -> str:
        """The same image as enroot's URI, `[user@]registry#repository[:tag][@digest]` (what pyxis takes)."""
        user = f"{self.user}@" if self.user else ""
        return (f"{user}{self.registry}#{self.repository}" + (f":{self.tag}" if self.tag else "")
                + (f"@{self.digest}" if self.digest else ""))

    def pinned(self, digest: str) -> ImageRef:
        """This image pinned to `digest` (its tag kept, for display): what every later attempt runs.

        Raises:
            ValueError: `digest` is not `sha256:` and 64 lower-case hexadecimal digits.
        """
        return dataclasses.replace(self, digest=digest)


def parse_image(raw: str, option: str = "--container-image") -> ImageRef:
    """`raw`, in enroot's or Docker's form (module docstring), as a normalised `ImageRef`.

    Raises:
        ValueError: the reference is malformed; the message names `option` and the part that is wrong.
    """
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError(f"{option}: an image is needed, e.g. 'ubuntu:24.04' or 'nvcr.io#nvidia/pytorch:24.01-py3'")
    text = raw.strip()
    if text.startswith("docker://"):
        text = text[len("docker://"):]
    elif "://" in text:
        raise ValueError(f"{option}: {raw!r}: images come from a registry; write it without a scheme "
                         "(or with enroot's 'docker://')")
    if text.startswith(("/", ".")):
        raise ValueError(f"{option}: {raw!r} is a file path; trainyard pulls images from a registry "
                         "(squashfs files are not supported)")
    if any(c.isspace() for c in text):
        raise ValueError(f"{option}: {raw!r} holds white space")

    digest = None
    if "@" in text:
        before, after = text.rsplit("@", 1)
        if _DIGEST_LIKE.match(after):
            text, digest = before, after
            _check_digest(digest, option)
        elif not after:
            raise ValueError(f"{option}: {raw!r} ends with '@': a digest ('@sha256:…') or an image must follow")

    user = None
    explicit_registry = None
    if "#" in text:
        head, text = text.split("#", 1)
        if "#" in text:
            raise ValueError(f"{option}: {raw!r} has more than one '#' (enroot's form is USER@REGISTRY#IMAGE)")
        if "@" in head:
            user, head = head.rsplit("@", 1)
        if not head:
            raise ValueError(f"{option}: {raw!r}: no registry before '#'")
        explicit_registry = head
    elif "@" in text:
        user, text = text.rsplit("@", 1)
    if user is not None and not _USER.fullmatch(user):
        if not user:
            why = "empty"
        elif "/" in user:
            why = "after an image name, '@' takes a digest ('@sha256:…'); enroot's USER@ comes first"
        elif ":" in user:
            why = "a password does not belong in an image reference; credentials go in the cluster configuration"
        else:
            why = "unexpected characters"
        raise ValueError(f"{option}: bad user {user!r} before '@' in {raw!r}: {why}")

    name, tag = text, None
    last = text.rfind(":")
    if last > text.rfind("/"):
        name, tag = text[:last], text[last + 1:]
        _check_tag(tag, option)
    if _IMAGE_ID.fullmatch(name) and explicit_registry is None:
        raise ValueError(f"{option}: {raw!r} looks like an image ID (64 hexadecimal digits), not an image name")

    registry = explicit_registry
    if registry is None:
        first, slash, rest = name.partition("/")
        if slash and looks_like_registry(first):
            registry, name = first, rest
    if registry is not None:
        _check_registry(registry, option)
    if registry is None or registry in HUB_ALIASES:
        registry = DOCKER_HUB
        if name and "/" not in name:
            name = f"library/{name}"
    _check_repository(name, option, raw)
    if len(f"{registry}/{name}") > NAME_MAX:
        raise ValueError(f"{option}: image name {registry}/{name[:30]}… is {len(registry) + 1 + len(name)} "
                         f"characters long; at most {NAME_MAX}")
    return ImageRef(registry=registry, repository=name, tag=tag if tag or digest else DEFAULT_TAG,
                    digest=digest, user=user)
