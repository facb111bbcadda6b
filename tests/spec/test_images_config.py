"""The `images:` section of the configuration (spec/images.py): registries normalised as image
references name them, a team's list narrowing the cluster's, default images that must be
allowed, and errors that name the file, the line and the field."""

from __future__ import annotations

import pytest

from tests.plane import TWO_TEAMS
from trainyard.spec.models import parse_config
from trainyard.spec.parsing import ConfigError

BASE = TWO_TEAMS.read_text()


def config(images: str):
    return parse_config(BASE + images, "cluster.yaml")


def test_absent_means_any_registry_no_default_and_the_cache_defaults() -> None:
    spec = parse_config(BASE)
    assert spec.images.allowed_for("vision") == [] and spec.images.default_for("vision") is None
    assert spec.images.cache_max_gib == 100 and spec.images.fingerprint == "warn"
    assert spec.images.pull_timeout_s == 1800


def test_registries_and_images_are_normalised_as_a_job_names_them() -> None:
    spec = config("""
images:
  allowed_registries: [docker.io, "127.0.0.1:5000", NVCR.IO]
  insecure_registries: ["registry.lab:5000"]
  default_image: ubuntu
  credentials:
    - {registry: index.docker.io, username: bot, password_file: /etc/trainyard/hub.token}
  teams:
    vision: {default_image: "alice@nvcr.io#nvidia/pytorch:24.01-py3", allowed_registries: [nvcr.io]}
  pull_timeout_s: 10m
  fingerprint: refuse
""")
    im = spec.images
    assert im.allowed_registries == ["registry-1.docker.io", "127.0.0.1:5000", "nvcr.io"]
    assert im.default_for("nlp") == "registry-1.docker.io/library/ubuntu:latest"
    assert im.default_for("vision") == "nvcr.io/nvidia/pytorch:24.01-py3"  # no USER@: credentials are ours
    assert im.allowed_for("vision") == ["nvcr.io"] and im.allowed_rule("vision") == "images.teams.vision.allowed_registries"
    assert im.allowed_for("nlp") == im.allowed_registries and im.allowed_rule("nlp") == "images.allowed_registries"
    assert im.credentials[0].registry == "registry-1.docker.io" and im.pull_timeout_s == 600


@pytest.mark.parametrize("images, field, words", [
    ("images: {allowed_registries: [nvcr.io/nvidia]}\n", "images.allowed_registries", ["not a registry"]),
    ("images: {allowed_registries: [nvidia]}\n", "images.allowed_registries", ["would read as a Docker Hub namespace"]),
    ("images: {default_image: 'Ubuntu:22'}\n", "images.default_image", ["lower case"]),
    ("images: {fingerprint: maybe}\n", "images.fingerprint", ["refuse", "warn", "off"]),
    ("images: {cache_max_gib: 0}\n", "images.cache_max_gib", ["greater than 0"]),
    ("images: {teams: {vision: {default_image: ubuntu}}, default_image: 'ubuntu@sha256:12'}\n", "images.default_image", ["bad digest"]),
    ("images: {credentials: [{registry: nvcr.io, username: u, password_file: token.txt}]}\n",
     "images.credentials.0.password_file", ["pattern"]),
    ("images: {credentials: [{registry: nvcr.io, username: u, password_file: /a},"
     " {registry: nvcr.io, username: v, password_file: /b}]}\n", "images", ["'nvcr.io' is given more than once"]),
    ("images:\n  allowed_registries: [nvcr.io]\n  teams: {vision: {allowed_registries: [ghcr.io]}}\n", "images",
     ["teams.vision.allowed_registries: 'ghcr.io' is not in images.allowed_registries"]),
    ("images:\n  allowed_registries: [nvcr.io]\n  default_image: ubuntu\n", "images",
     ["default_image: 'registry-1.docker.io/library/ubuntu:latest' is from a registry not in"]),
    ("images:\n  default_image: ubuntu\n  teams: {vision: {allowed_registries: [nvcr.io]}}\n", "images",
     ["team vision's"]),
    ("images:\n  teams: {robotics: {default_image: ubuntu}}\n", None, ["images.teams: no team 'robotics'"]),
    ("images: {registries: []}\n", "images.registries", ["Extra inputs"]),
])
def test_a_bad_section_is_an_error_naming_the_file_line_and_field(images, field, words) -> None:
    with pytest.raises(ConfigError) as e:
        config(images)
    assert e.value.field == field, str(e.value)
    assert e.value.file == "cluster.yaml"
    if field is not None and field.startswith("images"):
        assert e.value.line == BASE.count("\n") + 1, str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)
