"""`parse_image`: `--container-image` read as pyxis and Docker read it, normalised to one name per
image, and what it refuses named."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainyard.spec.image_ref import DOCKER_HUB, ImageRef, parse_image
from tests.hypothesis_setup import examples

A = "sha256:" + "a" * 64
B = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize("text,want", [
    ("nvcr.io#nvidia/pytorch:24.01-py3", ImageRef("nvcr.io", "nvidia/pytorch", "24.01-py3")),
    ("ubuntu", ImageRef(DOCKER_HUB, "library/ubuntu", "latest")),
    ("ubuntu:24.04", ImageRef(DOCKER_HUB, "library/ubuntu", "24.04")),
    ("docker://ubuntu:24.04", ImageRef(DOCKER_HUB, "library/ubuntu", "24.04")),
    (f"localhost:5000/team/img@{A}", ImageRef("localhost:5000", "team/img", None, A)),
    (f"localhost/team/img:1.0@{A}", ImageRef("localhost", "team/img", "1.0", A)),
    ("alice@registry.example.com#team/image", ImageRef("registry.example.com", "team/image", "latest", user="alice")),
    ("alice@ubuntu:22.04", ImageRef(DOCKER_HUB, "library/ubuntu", "22.04", user="alice")),
    ("$oauthtoken@nvcr.io#nvidia/pytorch:24.01-py3", ImageRef("nvcr.io", "nvidia/pytorch", "24.01-py3",
                                                              user="$oauthtoken")),
    ("docker.io/library/python:3.11", ImageRef(DOCKER_HUB, "library/python", "3.11")),
    ("docker.io/python:3.11", ImageRef(DOCKER_HUB, "library/python", "3.11")),
    ("index.docker.io/pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime",
     ImageRef(DOCKER_HUB, "pytorch/pytorch", "2.3.0-cuda12.1-cudnn8-runtime")),
    ("docker.io#ubuntu", ImageRef(DOCKER_HUB, "library/ubuntu", "latest")),
    ("pytorch/pytorch", ImageRef(DOCKER_HUB, "pytorch/pytorch", "latest")),
    ("127.0.0.1:5000/x", ImageRef("127.0.0.1:5000", "x", "latest")),
    ("[::1]:5000/x:v1", ImageRef("[::1]:5000", "x", "v1")),
    ("ghcr.io/astral-sh/uv:0.4.0-python3.12-bookworm", ImageRef("ghcr.io", "astral-sh/uv", "0.4.0-python3.12-bookworm")),
    ("quay.io/jupyter/scipy-notebook:2024-05-27", ImageRef("quay.io", "jupyter/scipy-notebook", "2024-05-27")),
    ("gcr.io/google_containers/pause__x.y-z:3.1", ImageRef("gcr.io", "google_containers/pause__x.y-z", "3.1")),
    ("MyRegistry/team/img", ImageRef("MyRegistry", "team/img", "latest")),  # upper case: Docker reads a domain
    (f"python:3.11@{B}", ImageRef(DOCKER_HUB, "library/python", "3.11", B)),
    ("localhost:5000", ImageRef(DOCKER_HUB, "library/localhost", "5000")),  # as Docker reads it: no '/', a tag
])
def test_real_world_references(text, want):
    assert parse_image(text) == want


@pytest.mark.parametrize("text,canonical,uri", [
    ("ubuntu", f"{DOCKER_HUB}/library/ubuntu:latest", f"{DOCKER_HUB}#library/ubuntu:latest"),
    ("nvcr.io#nvidia/pytorch:24.01-py3", "nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
    (f"bob@localhost:5000#team/img@{A}", f"localhost:5000/team/img@{A}", f"bob@localhost:5000#team/img@{A}"),
])
def test_canonical_and_enroot_forms(text, canonical, uri):
    ref = parse_image(text)
    assert ref.canonical() == canonical and ref.enroot_uri() == uri


def test_pinned_keeps_the_tag_and_runs_the_digest():
    ref = parse_image("nvcr.io#nvidia/pytorch:24.01-py3")
    pinned = ref.pinned(A)
    assert pinned == dataclasses.replace(ref, digest=A) and ref.digest is None
    assert pinned.canonical() == f"nvcr.io/nvidia/pytorch:24.01-py3@{A}"
    assert (ref.reference, pinned.reference) == ("24.01-py3", A)
    assert pinned.name == "nvcr.io/nvidia/pytorch"
    with pytest.raises(ValueError, match="64 lower-case hexadecimal"):
        ref.pinned("sha256:" + "A" * 64)


@pytest.mark.parametrize("text,words", [
    ("", "an image is needed"),
    ("Ubuntu", "repository name must be lower case: 'Ubuntu' in 'Ubuntu'"),
    ("nvcr.io#NVIDIA/pytorch", "must be lower case: 'NVIDIA'"),
    ("ubuntu@sha256:abc", "bad digest 'sha256:abc': a digest is 'sha256:' and 64 lower-case hexadecimal digits"),
    ("ubuntu@SHA256:" + "a" * 64, "bad digest"),
    (f"ubuntu@sha512:{'a' * 128}", "unsupported digest algorithm 'sha512'"),
    ("ubuntu:", "bad tag ''"),
    ("ubuntu:-rc1", "bad tag '-rc1'"),
    ("ubuntu:" + "x" * 129, "bad tag"),
    ("ubuntu:a/b", "bad registry 'ubuntu:a'"),  # only a ':' after the last '/' starts a tag
    ("localhost:5000/team/img@latest", "'@' takes a digest"),
    ("alice:secret@nvcr.io#nvidia/pytorch", "a password does not belong"),
    ("@ubuntu", "bad user ''"),
    ("ubuntu@", "ends with '@'"),
    ("myhost#img", "registry 'myhost' would read as a Docker Hub namespace"),
    ("#img", "no registry before '#'"),
    ("a#b#c", "more than one '#'"),
    ("bad_host.io#img", "bad registry 'bad_host.io'"),
    ("-bad.io/img", "bad registry '-bad.io'"),
    ("nvcr.io#", "no image name"),
    ("a//b", "an empty component"),
    ("team/img/", "an empty component"),
    ("team/-img", "component '-img'"),
    ("team/img..x", "component 'img..x'"),
    ("a" * 64, "looks like an image ID"),
    ("/shared/images/pytorch.sqsh", "is a file path"),
    ("./pytorch.sqsh", "is a file path"),
    ("dockerd://ubuntu", "without a scheme"),
    ("ubuntu 22.04", "white space"),
    ("registry.example.com/" + "/".join(["abcdefghij"] * 22), "at most 255"),
])
def test_bad_references_say_what_is_wrong(text, words):
    with pytest.raises(ValueError) as e:
        parse_image(text)
    assert str(e.value).startswith("--container-image: ") and words in str(e.value), str(e.value)


def test_the_option_is_named():
    with pytest.raises(ValueError, match="^images: "):
        parse_image("Ubuntu", option="images")


@pytest.mark.parametrize("fields,words", [
    ({"registry": "docker.io", "repository": "library/x"}, "not 'docker.io'"),
    ({"registry": DOCKER_HUB, "repository": "x"}, "'library/x'"),
    ({"registry": "nvcr.io", "repository": "x", "tag": None}, "a tag or a digest"),
    ({"registry": "nvcr.io", "repository": "x", "user": "a:b"}, "bad user"),
])
def test_an_image_ref_is_always_normalised(fields, words):
    with pytest.raises(ValueError, match=words):
        ImageRef(**fields)


# -- the property: canonical() and enroot_uri() read back to the same image -------------------------

_component = st.from_regex(r"\A[a-z0-9]{1,4}(?:(?:[._]|__|-{1,2})[a-z0-9]{1,4}){0,2}\Z")
_label = st.from_regex(r"\A[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,4}[a-zA-Z0-9])?\Z")
_registry = st.one_of(
    st.just(DOCKER_HUB), st.just("localhost"),
    st.builds(lambda a, b, port: f"{a}.{b}" + (f":{port}" if port is not None else ""),
              _label, _label, st.none() | st.integers(1, 65535)),
    st.builds(lambda a, port: f"{a}:{port}", _label, st.integers(1, 65535)),
    st.builds(lambda a, b, c, d, port: f"{a}.{b}.{c}.{d}:{port}", *[st.integers(0, 255)] * 4, st.integers(1, 65535)),
)
_refs = st.builds(
    lambda registry, parts, tag, digest, user: (registry, "/".join(parts), tag, digest, user),
    _registry, st.lists(_component, min_size=1, max_size=3),
    st.none() | st.from_regex(r"\A[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}\Z"),
    st.none() | st.from_regex(r"\A[0-9a-f]{64}\Z").map(lambda h: f"sha256:{h}"),
    st.none() | st.from_regex(r"\A[A-Za-z0-9_$@-][A-Za-z0-9._~!$&'()*+,;=%@-]{0,7}\Z"),
)


def _build(fields: tuple[str, str, str | None, str | None, str | None]) -> ImageRef:
    registry, repository, tag, digest, user = fields
    if registry == DOCKER_HUB and "/" not in repository:
        repository = f"library/{repository}"
    if tag is None and digest is None:
        tag = "latest"
    return ImageRef(registry, repository, tag, digest, user)


@settings(max_examples=examples(300))
@given(_refs)
def test_canonical_reads_back_to_the_same_image(fields):
    ref = _build(fields)
    assert parse_image(ref.canonical()) == dataclasses.replace(ref, user=None)
    assert parse_image(ref.enroot_uri()) == ref
    if ref.user is None:
        assert parse_image(ref.canonical()) == ref
